//! The vCluster control plane never runs twice on one data directory: its Deployment is
//! `Recreate` (Helm's post-renderer, the controller binary's `post-render`), checked here on the
//! real chart rendered offline, and the controller stops it before every helm run, which a pod
//! that only carries the control plane's labels does not hold up (on the local control plane with
//! the stand-in chart; KWOK makes its pods Ready). `e2e/tests/real_vcluster.rs` shows on the real
//! vCluster that the pod template patched as the certificate rotation does and the strategy
//! patched to `RollingUpdate` never run two control-plane pods, and that recovery stops the control
//! plane before it rolls a pending release back.

mod support;
use support::{LIMIT, fixture, get, serving, wait_for};

/// The newest Helm release record of `vcluster` in `host`: its revision and status.
fn newest_release(cluster: &e2e::shared::Shared, host: &str) -> Option<(u32, String)> {
    let args = [
        "-n",
        host,
        "get",
        "secrets",
        "-l",
        "owner=helm,name=vcluster",
    ];
    let records = get(cluster, &args)?;
    (records["items"].as_array()?.iter())
        .filter_map(|s| {
            let labels = &s["metadata"]["labels"];
            let revision = labels["version"].as_str()?.parse::<u32>().ok()?;
            Some((revision, labels["status"].as_str()?.to_string()))
        })
        .max()
}

/// `deployment/vcluster` in `host` has rolled out its current template to one ready pod.
fn rolled_out(cluster: &e2e::shared::Shared, host: &str) -> bool {
    get(cluster, &["-n", host, "get", "deployment", "vcluster"]).is_some_and(|d| {
        let s = &d["status"];
        d["metadata"]["generation"] == s["observedGeneration"]
            && s["replicas"] == 1
            && s["updatedReplicas"] == 1
            && s["readyReplicas"] == 1
    })
}

/// Issue 29, defect 2: the real chart rendered with the controller's values and its post-renderer
/// flags (as `helm upgrade` gets them) has a `Recreate` control plane, and nothing else changed.
#[test]
fn the_real_chart_post_rendered_runs_one_control_plane_at_a_time() {
    let (values, host) = e2e::chart::controller_vcluster_values();
    let dir = e2e::control_plane::base_dir().join(format!("post-render-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("values.yaml");
    std::fs::write(&file, &values).expect("values");
    let render = |post: &[&str]| {
        let mut helm = e2e::chart::Helm::offline().expect("helm").command();
        helm.args(["template", "vcluster"])
            .arg(e2e::chart::vendored_vcluster_chart())
            .args(["-n", &host, "--kube-version", "1.35.0", "--values"])
            .arg(&file)
            .args(post);
        let out = helm.output().expect("helm");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = e2e::chart::Rendered::parse(&stdout).expect("manifest");
        (
            rendered.get("Deployment", "vcluster").clone(),
            rendered.objects.len(),
        )
    };
    let controller = env!("CARGO_BIN_EXE_controller");
    let post = [
        "--post-renderer",
        controller,
        "--post-renderer-args=post-render",
    ];
    let (mut rendered, count) = render(&post);
    assert_eq!(
        rendered["spec"]["strategy"],
        serde_json::json!({"type": "Recreate"})
    );
    let (mut plain, plain_count) = render(&[]);
    assert_eq!(plain["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 1);
    rendered["spec"]["strategy"] = serde_json::Value::Null;
    plain["spec"]["strategy"] = serde_json::Value::Null;
    assert_eq!(
        (rendered, count),
        (plain, plain_count),
        "only the strategy changes"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A pod in the host namespace with the control plane's labels (`app=vcluster,release=vcluster`)
/// that no ReplicaSet of `deployment/vcluster` made, such as one made by hand, does not hold up
/// the stop before a helm upgrade (which waits for the control plane's pods to go, up to 300 s):
/// the controller's upgrade that puts back the `Recreate` strategy (patched to `RollingUpdate`)
/// runs within [`LIMIT`], and the pod is left alone. (The real syncer rewrites `release` on the
/// pods it syncs, so a tenant's pod never carries both labels on the host.)
#[tokio::test]
async fn a_pod_with_the_control_planes_labels_does_not_hold_up_its_stop() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let fx = fixture(&cluster, "decoy").await;
    let (_, controller, host) = serving(&cluster, &fx).await;
    let decoy = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: decoy\n  namespace: {host}\n  labels: {{ app: vcluster, release: vcluster }}\nspec:\n  containers: [{{ name: c, image: busybox }}]\n"
    );
    (cluster.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&decoy))).expect("decoy pod");
    let decoy_uid = || {
        get(&cluster, &["-n", &host, "get", "pod", "decoy"]).map(|p| p["metadata"]["uid"].clone())
    };
    let uid = decoy_uid().expect("the decoy pod");
    let (revision, _) = newest_release(&cluster, &host).expect("a release record");

    let rolling = r#"{"spec":{"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}}}"#;
    let args = [
        "-n",
        &host,
        "patch",
        "deployment",
        "vcluster",
        "--type=merge",
        "-p",
        rolling,
    ];
    cluster.kubectl_ok(&args, None).expect("patch");
    let upgraded = || {
        let d = get(&cluster, &["-n", &host, "get", "deployment", "vcluster"])?;
        let release = newest_release(&cluster, &host)?;
        (d["spec"]["strategy"]["type"] == "Recreate"
            && release.0 > revision
            && release.1 == "deployed"
            && rolled_out(&cluster, &host))
        .then_some(())
    };
    wait_for(
        "the upgrade that puts Recreate back, past the decoy",
        LIMIT,
        &controller,
        upgraded,
    )
    .await;
    assert_eq!(decoy_uid(), Some(uid), "the decoy pod is left alone");
}
