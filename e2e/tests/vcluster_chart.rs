//! The real vCluster chart (`../shared/vendor/vcluster`, 0.37.0-rc.1) rendered offline with the
//! controller's own values (`controller --print-vcluster-values`): what the operator must hold to
//! install it, and what the stand-in chart must match of it.

use std::path::PathBuf;

use e2e::chart::{
    Helm, Rendered, controller_vcluster_values, covers, permissions, render_vcluster,
    vendored_vcluster_chart,
};

fn scratch(name: &str) -> PathBuf {
    let dir =
        e2e::control_plane::base_dir().join(format!("real-chart-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The real chart rendered with the controller's values.
fn real(dir: &std::path::Path) -> Rendered {
    let (values, host) = controller_vcluster_values();
    render_vcluster(&vendored_vcluster_chart(), &host, &values, dir)
        .unwrap_or_else(|e| panic!("the real chart refused the controller's values: {e}"))
}

/// Every Role and ClusterRole a render holds, by kind and name.
fn roles(rendered: &Rendered) -> Vec<(String, &serde_json::Value)> {
    let kinds = ["Role", "ClusterRole"];
    (rendered.objects.iter())
        .filter(|o| kinds.iter().any(|k| o["kind"] == *k))
        .map(|o| (format!("{}/{}", o["kind"], o["metadata"]["name"]), o))
        .collect()
}

/// Helm, acting as the operator with `rbac.clusterAdmin=false`, creates the chart's Role (and any
/// ClusterRole) only if the operator's ClusterRole `platform-operator` holds every permission in
/// it: the API server's escalation check (group, resource, verb, resource name). Rendered with
/// every value the controller passes, so the rules its values turn on (NetworkPolicy sync) are in.
#[test]
fn the_operators_cluster_role_holds_every_rule_of_the_real_vcluster_roles() {
    let dir = scratch("rbac");
    let rendered = real(&dir);
    let operator = Helm::offline()
        .expect("helm")
        .template(
            "platform-operator",
            &[
                "rbac.clusterAdmin=false",
                "passphrase.existingSecret=platform-operator-passphrase",
            ],
        )
        .expect("the operator chart renders");
    let held = permissions(operator.get("ClusterRole", "platform-operator"));
    let roles = roles(&rendered);
    assert!(!roles.is_empty(), "the real chart rendered no Role");
    for (role, object) in roles {
        let needed = permissions(object);
        let missing: Vec<_> = needed.iter().filter(|n| !covers(&held, n)).collect();
        assert!(
            missing.is_empty(),
            "Helm cannot create {role} without: {missing:?}"
        );
        if role.starts_with("\"Role\"") {
            let syncs =
                |p: &[String; 4]| p[..3] == ["networking.k8s.io", "networkpolicies", "create"];
            assert!(
                needed.iter().any(syncs),
                "{role} lacks the NetworkPolicy sync the values turn on"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The stand-in chart's Role, with the controller's values, grants exactly what the real chart's
/// does: the stand-in can never again hide a rule the operator lacks.
#[test]
fn the_standin_role_is_the_real_charts() {
    let dir = scratch("standin-role");
    let (values, host) = controller_vcluster_values();
    let sorted = |rendered: &Rendered| {
        let mut p = permissions(rendered.get("Role", "vc-vcluster"));
        p.sort();
        p.dedup();
        p
    };
    let standin = e2e::repo_root().join("e2e/standin-vcluster");
    let standin = render_vcluster(&standin, &host, &values, &dir).expect("stand-in renders");
    assert_eq!(sorted(&standin), sorted(&real(&dir)));
    let _ = std::fs::remove_dir_all(dir);
}
