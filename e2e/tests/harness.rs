//! End-to-end checks of the harness itself: Deployments progress on the KWOK node (Jobs run on
//! the real node: `real_node.rs`), and a second API server is independent of the first.

use std::time::{Duration, Instant};

use e2e::cmd::run;
use e2e::{ControlPlane, Options};

fn kubectl_ok(cmd: std::process::Command, what: &str) -> String {
    run(cmd, None)
        .expect("kubectl runs")
        .ok(what)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn deployments_progress_on_the_kwok_node() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let ns = format!("workloads-{}", std::process::id());
    let mut create = cluster.kubectl();
    create.args(["create", "namespace", &ns]);
    kubectl_ok(create, "create namespace");
    let manifest = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{ name: web, namespace: {ns} }}
spec:
  replicas: 2
  selector: {{ matchLabels: {{ app: web }} }}
  template:
    metadata: {{ labels: {{ app: web }} }}
    spec:
      containers: [{{ name: web, image: registry.example/web@sha256:{d} }}]
"#,
        d = "0".repeat(64)
    );
    // The default service account appears shortly after the namespace; retry until pods admit.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut apply = cluster.kubectl();
        apply.args(["apply", "--server-side", "-f", "-"]);
        let out = run(apply, Some(&manifest)).expect("kubectl runs");
        if out.success {
            break;
        }
        assert!(Instant::now() < deadline, "{}", out.stderr);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut wait = cluster.kubectl();
    wait.args([
        "-n",
        &ns,
        "rollout",
        "status",
        "deployment/web",
        "--timeout=120s",
    ]);
    kubectl_ok(wait, "deployment rollout");
    let mut pods = cluster.kubectl();
    pods.args([
        "-n",
        &ns,
        "get",
        "pods",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]);
    let nodes = kubectl_ok(pods, "list pods");
    assert!(
        !nodes.is_empty()
            && nodes
                .split_whitespace()
                .all(|n| n == e2e::control_plane::NODE_NAME),
        "{nodes}"
    );
}

#[tokio::test]
async fn a_user_kubeconfig_is_an_identity_of_its_own() {
    // The demo prints such a kubeconfig (user demo-admin, bound to cluster-admin), so that the
    // person trying the operator is not the operator: the protection policy and the webhook
    // treat them as they would on a cluster.
    let cp = ControlPlane::start(Options::new("users").api_only())
        .await
        .expect("API server starts");
    let kubeconfig = cp.user_kubeconfig("demo-admin", None).expect("kubeconfig");
    let as_user = |args: &[&str]| {
        let mut c = cp.kubectl();
        c.env("KUBECONFIG", &kubeconfig).args(args);
        run(c, None).expect("kubectl runs")
    };
    let who = as_user(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert!(who.success, "{}", who.stderr);
    assert_eq!(who.stdout.trim(), "demo-admin");
    assert_ne!(who.stdout.trim(), e2e::control_plane::ADMIN_USER);
    let denied = as_user(&["create", "namespace", "demo-before-binding"]);
    assert!(
        !denied.success && denied.stderr.contains("forbidden"),
        "a new identity has no rights until bound: {denied:?}"
    );
    let mut bind = cp.kubectl();
    bind.args([
        "create",
        "clusterrolebinding",
        "demo-admin",
        "--clusterrole=cluster-admin",
        "--user=demo-admin",
    ]);
    kubectl_ok(bind, "bind demo-admin");
    let created = as_user(&["create", "namespace", "demo-after-binding"]);
    assert!(created.success, "{}", created.stderr);
}

#[tokio::test]
async fn a_second_api_server_is_independent() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let inner = ControlPlane::start(Options::new("inner").api_only())
        .await
        .expect("second API server starts");
    let ns = format!("only-outside-{}", std::process::id());
    let mut create = cluster.kubectl();
    create.args(["create", "namespace", &ns]);
    kubectl_ok(create, "create namespace outside");

    let mut get = inner.kubectl();
    get.args(["get", "namespace", &ns]);
    let out = run(get, None).expect("kubectl runs");
    assert!(
        !out.success && out.stderr.contains("NotFound"),
        "inner API server must not see {ns}: {out:?}"
    );
    let mut version = inner.kubectl();
    version.args(["version", "-o", "json"]);
    let v: serde_json::Value =
        serde_json::from_str(&kubectl_ok(version, "kubectl version")).expect("json");
    assert!(
        v["serverVersion"]["gitVersion"]
            .as_str()
            .unwrap_or_default()
            .starts_with("v1.35."),
        "{v}"
    );
    assert!(
        v["clientVersion"]["gitVersion"]
            .as_str()
            .unwrap_or_default()
            .starts_with("v1.35."),
        "{v}"
    );
    assert_ne!(inner.server(), "");
    let dir = inner.dir().to_path_buf();
    drop(inner);
    assert!(
        !dir.exists(),
        "a passing test's control plane removes its folder"
    );
}
