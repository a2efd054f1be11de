//! The stand-in vCluster chart (`e2e/standin-vcluster`) rendered offline with `helm template`:
//! it takes the controller's own values (printed by `controller --print-vcluster-values`) and
//! renders what the real chart 0.37.3 renders for them (the Deployment `vcluster`, the Service
//! with the chart label, the Role), its schema refuses what the real schema refuses, the kind
//! follows the real chart's rule, and the operator's ClusterRole holds every rule of the Role
//! (Helm can create the Role only then, with `rbac.clusterAdmin=false`).

use std::path::{Path, PathBuf};

use e2e::chart::{Helm, Rendered, operator_binaries, strings};
use e2e::standin_vcluster::{CHART_VERSION, NEXT_CHART_VERSION};
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let dir =
        e2e::control_plane::base_dir().join(format!("standin-chart-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn chart_dir() -> PathBuf {
    e2e::repo_root().join("e2e/standin-vcluster")
}

/// `helm template vcluster <chart> -n <ns> --kube-version 1.35.0` with a values file holding
/// `values` (YAML): what rendered, or helm's standard error.
fn render(chart: &Path, ns: &str, values: &str, dir: &Path) -> Result<Rendered, String> {
    let helm = Helm::offline().expect("helm");
    let file = dir.join(format!("values-{}.yaml", values.len()));
    std::fs::write(&file, values).expect("values file");
    let out = helm
        .run(&[
            "template",
            "vcluster",
            &chart.display().to_string(),
            "-n",
            ns,
            "--kube-version",
            "1.35.0",
            "--values",
            &file.display().to_string(),
        ])
        .expect("helm");
    if !out.success {
        return Err(out.stderr);
    }
    Rendered::parse(&out.stdout)
}

/// What the controller binary prints for instance `team-a/one`.
fn controller_values() -> (String, String) {
    let (controller, _) = operator_binaries().expect("operator binaries");
    let out = std::process::Command::new(controller)
        .args([
            "--print-vcluster-values",
            "team-a/one",
            "--storage-root-base",
            "/var/lib/kubesolo/instances",
        ])
        .output()
        .expect("controller");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).expect("utf-8"),
        common::names::host_namespace("team-a", "one"),
    )
}

/// `(group, resource, verb)` of every rule of `role`.
fn rules(role: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    out.push((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

#[test]
fn the_controllers_values_render_what_the_controller_waits_for() {
    let dir = scratch("values");
    let (values, host) = controller_values();
    let rendered = render(&chart_dir(), &host, &values, &dir)
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
    let role = rendered.get("Role", "vc-vcluster");
    assert!(
        rules(role).contains(&(
            "networking.k8s.io".into(),
            "networkpolicies".into(),
            "create".into()
        )),
        "the Role lets vCluster sync NetworkPolicies to the host"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_operators_cluster_role_holds_every_rule_of_the_vcluster_role() {
    let dir = scratch("rbac");
    let (values, host) = controller_values();
    let rendered = render(&chart_dir(), &host, &values, &dir).expect("render");
    let needed = rules(rendered.get("Role", "vc-vcluster"));
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
    let held = rules(operator.get("ClusterRole", "platform-operator"));
    let missing: Vec<_> = needed
        .iter()
        .filter(|(g, r, v)| {
            !held.iter().any(|(hg, hr, hv)| {
                (hg == g || hg == "*") && (hr == r || hr == "*") && (hv == v || hv == "*")
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "Helm cannot create the vCluster Role without: {missing:?}"
    );
    // pods/resize is granted on Kubernetes 1.35, as the real chart does.
    assert!(needed.iter().any(|(_, r, _)| r == "pods/resize"));
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
        let refused = render(&chart_dir(), "ns", values, &dir).expect_err(what);
        assert!(
            refused.contains("additional properties")
                || refused.contains("additionalProperties")
                || refused.contains("want string")
                || refused.contains("expected string")
                || refused.contains("schema"),
            "{what}: {refused}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_kind_follows_the_real_charts_rule() {
    let dir = scratch("kind");
    let kind = |values: &str| {
        let rendered = render(&chart_dir(), "ns", values, &dir).expect("render");
        if rendered.find("StatefulSet", "vcluster").is_some() {
            "StatefulSet"
        } else if rendered.find("Deployment", "vcluster").is_some() {
            "Deployment"
        } else {
            panic!("no control plane rendered: {:?}", rendered.names())
        }
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

#[test]
fn the_next_chart_version_changes_the_service_labels_and_the_image() {
    let dir = scratch("next");
    let helm = Helm::offline().expect("helm");
    let archive = e2e::standin_vcluster::package_chart(helm.bin(), &dir, NEXT_CHART_VERSION)
        .expect("package");
    let (values, host) = controller_values();
    let rendered = render(&archive, &host, &values, &dir).expect("render");
    assert_eq!(
        rendered.get("Service", "vcluster")["metadata"]["labels"]["chart"],
        format!("vcluster-{NEXT_CHART_VERSION}")
    );
    assert_eq!(
        rendered.get("Deployment", "vcluster")["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("ghcr.io/loft-sh/vcluster-pro:{NEXT_CHART_VERSION}")
    );
    let _ = std::fs::remove_dir_all(dir);
}
