//! The controller's Helm flags against the real Helm and API server: `--disable-openapi-validation`
//! (which the controller passes to save Helm's download and parse of the OpenAPI documents) checks
//! nothing less than Helm's default does with this API server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use controller::helm::{CHART_VERSION_LABEL, Helm};

fn scratch(name: &str) -> PathBuf {
    let dir = e2e::control_plane::base_dir().join(format!("helm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("chart/templates")).expect("dir");
    dir
}

/// A chart whose ConfigMap carries a field no ConfigMap has (`spec`) beside its data.
fn chart_with_unknown_field(dir: &Path) -> PathBuf {
    let chart = dir.join("chart");
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: vcluster\nversion: 0.1.0\n",
    )
    .expect("Chart.yaml");
    std::fs::write(
        chart.join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\ndata:\n  key: value\nspec:\n  unknown: true\n",
    )
    .expect("template");
    chart
}

/// Runs helm with `args` against the shared control plane; (success, stderr).
fn helm(cluster: &e2e::shared::Shared, home: &Path, args: &[String]) -> (bool, String) {
    let out = std::process::Command::new(&cluster.helm)
        .args(args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("HOME", home)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("helm runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Helm's default ("OpenAPI validation") and the controller's `--disable-openapi-validation`
/// install the same chart with the same outcome: the API server, not Helm, decides about a field
/// no schema has (it drops it and warns), and the release is deployed with the chart-version
/// label either way. Were Helm to start validating on the client or asking the server for strict
/// validation, the default run would fail here and the controller's flag would need a new look.
#[test]
fn the_controllers_helm_flags_check_what_helms_default_checks() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let dir = scratch("validation");
    let chart = chart_with_unknown_field(&dir);
    let values = dir.join("values.yaml");
    std::fs::write(&values, "{}\n").expect("values");
    let driver = Helm {
        binary: cluster.helm.display().to_string(),
        timeout: Duration::from_secs(120),
        work_dir: dir.clone(),
        post_renderer: Some(env!("CARGO_BIN_EXE_controller").into()),
    };
    let mut outcomes = Vec::new();
    for controllers in [false, true] {
        let ns = cluster
            .create_namespace("helm-flags", &[])
            .expect("namespace");
        let mut args = driver.upgrade_args(&ns, &chart, "0.1.0", &values, None);
        assert!(args.iter().any(|a| a == "--disable-openapi-validation"));
        if !controllers {
            args.retain(|a| a != "--disable-openapi-validation");
        }
        let (ok, stderr) = helm(&cluster, &dir, &args);
        assert!(ok, "helm {args:?} failed: {stderr}");
        let cm = cluster
            .kubectl_ok(
                &["-n", &ns, "get", "configmap", "probe", "-o", "json"],
                None,
            )
            .expect("the ConfigMap");
        let cm: serde_json::Value = serde_json::from_str(&cm).expect("json");
        let release = cluster
            .kubectl_ok(
                &[
                    "-n",
                    &ns,
                    "get",
                    "secret",
                    "-l",
                    "owner=helm,name=vcluster",
                    "-o",
                    &format!(
                        "jsonpath={{.items[0].metadata.labels.status}} {{.items[0].metadata.labels.{}}}",
                        CHART_VERSION_LABEL.replace('.', "\\.")
                    ),
                ],
                None,
            )
            .expect("the release Secret");
        outcomes.push((
            cm["data"].clone(),
            cm.get("spec").cloned(),
            release,
            // The API server's warning, as Helm logs it (klog quotes the message).
            stderr.contains(r#"Warning: unknown field \"spec\""#),
        ));
    }
    let expected = (
        serde_json::json!({"key": "value"}),
        None,
        "deployed 0.1.0".to_string(),
        true,
    );
    assert_eq!(outcomes[0], expected, "Helm's default");
    assert_eq!(outcomes[1], expected, "the controller's flags");
    let _ = std::fs::remove_dir_all(&dir);
}
