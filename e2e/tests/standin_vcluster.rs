//! The stand-in vCluster chart (`e2e/standin-vcluster`) rendered offline with `helm template`:
//! it takes the controller's own values (printed by `controller --print-vcluster-values`) and
//! renders what the real chart 0.37.3 renders for them (the Deployment `vcluster`, the Service
//! with the chart label, the Role), its schema refuses what the real schema refuses, the kind
//! follows the real chart's rule. The schema and the kind are checked by rendering the vendored
//! real chart (0.37.0-rc.1, [`e2e::real_vcluster::chart`]) with the same inputs. Its Role is
//! checked against the real chart's in `tests/vcluster_chart.rs`.

use std::path::PathBuf;

use e2e::chart::{controller_vcluster_values, permissions, render_vcluster};
use e2e::standin_vcluster::CHART_VERSION;

fn scratch(name: &str) -> PathBuf {
    let dir =
        e2e::control_plane::base_dir().join(format!("standin-chart-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn chart_dir() -> PathBuf {
    e2e::repo_root().join("e2e/standin-vcluster")
}

/// The stand-in chart and the vendored real chart (checked against its `SHA256SUMS`), each with
/// its name for the messages.
fn both_charts() -> [(PathBuf, &'static str); 2] {
    let (real, _) = e2e::real_vcluster::chart().unwrap_or_else(|e| panic!("the real chart: {e}"));
    [
        (chart_dir(), "the stand-in chart"),
        (real, "the real chart"),
    ]
}

#[test]
fn the_controllers_values_render_what_the_controller_waits_for() {
    let dir = scratch("values");
    let (values, host) = controller_vcluster_values();
    let rendered = render_vcluster(&chart_dir(), &host, &values, &dir)
        .unwrap_or_else(|e| panic!("the stand-in chart refused the controller's values: {e}"));
    // No volume claim and the embedded database: a Deployment, never a StatefulSet.
    assert!(rendered.find("StatefulSet", "vcluster").is_none());
    let control_plane = rendered.get("Deployment", "vcluster");
    assert_eq!(
        control_plane["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 1,
        "the chart's Deployment surges a pod: the controller stops it before an upgrade"
    );
    let volumes = control_plane["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains(&format!("/var/lib/kubesolo/instances/{host}")),
        "{volumes}"
    );
    let service = rendered.get("Service", "vcluster");
    assert_eq!(
        service["metadata"]["labels"]["chart"],
        format!("vcluster-{CHART_VERSION}")
    );
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    // The whole configuration, for the syncer (and the stand-in syncer).
    let config = rendered.get("Secret", "vc-config-vcluster");
    assert!(config["data"]["config.yaml"].is_string());
    let role = permissions(rendered.get("Role", "vc-vcluster"));
    assert!(
        role.iter()
            .any(|p| p[..3] == ["networking.k8s.io", "networkpolicies", "create"]),
        "the Role lets vCluster sync NetworkPolicies to the host"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_schema_refuses_what_the_real_schema_refuses() {
    let dir = scratch("schema");
    for (values, what) in [
        (
            "platformOperator:\n  hostNamespace: x\n",
            "an unknown root key",
        ),
        (
            "controlPlane:\n  proxy:\n    extraSAN: [x]\n",
            "an unknown key in controlPlane.proxy",
        ),
        (
            "sync:\n  toHost:\n    networkPolicy:\n      enabled: true\n",
            "an unknown key in sync.toHost",
        ),
        (
            "exportKubeConfig:\n  server: 443\n",
            "a number for a string",
        ),
        (
            "controlPlane:\n  statefulSet:\n    persistence:\n      volumeClaim:\n        enabled: false\n        size: 5Gi\n        wrong: 1\n",
            "an unknown key in volumeClaim",
        ),
    ] {
        for (chart, name) in both_charts() {
            let refused = render_vcluster(&chart, "ns", values, &dir)
                .expect_err(&format!("{name} refuses {what}"));
            assert!(
                refused.contains("additional properties")
                    || refused.contains("additionalProperties")
                    || refused.contains("want string")
                    || refused.contains("expected string")
                    || refused.contains("schema"),
                "{name}, {what}: {refused}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_kind_follows_the_real_charts_rule() {
    let dir = scratch("kind");
    let charts = both_charts();
    // The kind each chart renders for `values`; both must render the same.
    let kind = |values: &str| {
        let kinds = charts.clone().map(|(chart, name)| {
            let rendered = render_vcluster(&chart, "ns", values, &dir)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            if rendered.find("StatefulSet", "vcluster").is_some() {
                "StatefulSet"
            } else if rendered.find("Deployment", "vcluster").is_some() {
                "Deployment"
            } else {
                panic!("{name}: no control plane rendered: {:?}", rendered.names())
            }
        });
        assert_eq!(
            kinds[0], kinds[1],
            "the stand-in and the real chart for {values}"
        );
        kinds[0]
    };
    // The defaults: volumeClaim "auto" with the embedded database is a volume claim.
    assert_eq!(kind("{}\n"), "StatefulSet");
    let vc = "controlPlane:\n  statefulSet:\n    persistence:\n      volumeClaim:\n        enabled: false\n";
    assert_eq!(kind(vc), "Deployment");
    assert_eq!(
        kind(&format!(
            "{vc}  backingStore:\n    etcd:\n      embedded:\n        enabled: true\n"
        )),
        "StatefulSet"
    );
    assert_eq!(
        kind("controlPlane:\n  backingStore:\n    etcd:\n      deploy:\n        enabled: true\n"),
        "Deployment",
        "auto without the embedded database: no claim"
    );
    let _ = std::fs::remove_dir_all(dir);
}
