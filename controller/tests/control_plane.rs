//! The vCluster control plane never runs twice on one data directory: its Deployment is
//! `Recreate` (Helm's post-renderer, the controller binary's `post-render`) whoever changes its
//! pod template, and the controller stops it before a pending release is rolled back. On the
//! local control plane with the stand-in chart (KWOK makes its pods Ready), and the real chart
//! rendered offline; `e2e/tests/real_vcluster.rs` takes the same steps with the real vCluster on
//! the real node.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

mod support;
use e2e::shared::Shared;
use support::{Controller, LIMIT, fixture, get, serving, wait_for};

/// What the test saw of `deployment/vcluster`: its replicas and its pod template's
/// `vClusterConfigHash` (which differs between two revisions of different values).
type Seen = Arc<Mutex<Vec<(i32, String)>>>;

/// Records every version of `deployment/vcluster` in `host` from now on.
async fn record(client: kube::Client, host: &str) -> Seen {
    let seen: Seen = Arc::default();
    let into = seen.clone();
    let api: Api<Deployment> = Api::namespaced(client, host);
    let config = watcher::Config::default().fields("metadata.name=vcluster");
    let mut stream = watcher(api, config).applied_objects().boxed();
    // The first version is there before the controller starts.
    let first = stream.next().await.expect("watch").expect("deployment");
    let entry = |d: &Deployment| {
        let spec = d.spec.clone().unwrap_or_default();
        let hash = (spec.template.metadata.and_then(|m| m.annotations))
            .and_then(|a| a.get("vClusterConfigHash").cloned())
            .unwrap_or_default();
        (spec.replicas.unwrap_or(1), hash)
    };
    into.lock().expect("lock").push(entry(&first));
    tokio::spawn(async move {
        while let Some(Ok(d)) = stream.next().await {
            into.lock().expect("lock").push(entry(&d));
        }
    });
    seen
}

/// Waits until Helm's newest release record in `host` has `status`.
async fn release_status(cluster: &e2e::shared::Shared, host: &str, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let args = [
        "-n",
        host,
        "get",
        "secrets",
        "-l",
        "owner=helm,name=vcluster",
    ];
    loop {
        let records = get(cluster, &args).map(|s| s["items"].clone());
        let newest = (records
            .iter()
            .flat_map(|i| i.as_array().into_iter().flatten()))
        .max_by_key(|s| {
            s["metadata"]["labels"]["version"]
                .as_str()?
                .parse::<u32>()
                .ok()
        })
        .map(|s| s["metadata"]["labels"]["status"].clone());
        if newest.is_some_and(|s| s == status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the release never became {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `deployment/vcluster` in `host` has rolled out its current template to one ready pod.
fn rolled_out(cluster: &Shared, host: &str) -> Option<()> {
    let d = get(cluster, &["-n", host, "get", "deployment", "vcluster"])?;
    let s = &d["status"];
    (d["metadata"]["generation"] == s["observedGeneration"]
        && s["replicas"] == 1
        && s["updatedReplicas"] == 1
        && s["readyReplicas"] == 1)
        .then_some(())
}

/// Issue 29, defect 5: a helm upgrade killed mid-way leaves the release `pending-upgrade` with
/// the control plane running; the controller's recovery scales it to zero before its rollback
/// (which changes the pod template back and, with the chart's `maxSurge: 1`, would start a second
/// pod on the same hostPath data beside the running one).
#[tokio::test]
async fn recovery_stops_the_control_plane_before_it_rolls_back() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let fx = fixture(&cluster, "recovery").await;
    let (team, controller, host) = serving(&cluster, &fx).await;
    drop(controller);

    // An upgrade with other values, killed while it waits: pending-upgrade, the control plane
    // rolled to the new template and running.
    let mut helm = Command::new(&cluster.helm);
    helm.env("KUBECONFIG", &cluster.kubeconfig)
        .args(["upgrade", "vcluster"])
        .arg(&fx.chart)
        .args(["-n", &host, "--reuse-values", "--set", "standIn.block=true"])
        .args(["--wait", "--timeout", "5m"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut helm = helm.spawn().expect("helm");
    release_status(&cluster, &host, "pending-upgrade").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while rolled_out(&cluster, &host).is_none() {
        assert!(Instant::now() < deadline, "the upgrade never rolled out");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let _ = helm.kill();
    let _ = helm.wait();

    let seen = record(cluster.client().await.expect("client"), &host).await;
    let controller = Controller::start(&cluster, &fx, &["--watch-namespace", &team]);
    let rolled_back = |seen: &[(i32, String)]| seen.iter().position(|(_, h)| *h != seen[0].1);
    let seen = wait_for("the rollback", LIMIT, &controller, || {
        let seen = seen.lock().expect("lock").clone();
        rolled_back(&seen).map(|_| seen)
    })
    .await;
    assert!(
        seen[..rolled_back(&seen).unwrap_or_default()]
            .iter()
            .any(|(replicas, _)| *replicas == 0),
        "the pod template was rolled back before the control plane was stopped: {seen:?}"
    );
    assert!(
        controller
            .log()
            .contains("recovering an interrupted helm release")
    );
    release_status(&cluster, &host, "deployed").await;
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

/// Issue 29, defect 2: the syncer patches its own pod template to rotate its certificates (an
/// annotation, `vcluster.loft.sh/cert-rotation-at`); the control plane's pods never overlap. A
/// strategy changed back to `RollingUpdate` is put back by an upgrade.
#[tokio::test]
async fn a_patched_pod_template_never_runs_two_control_planes() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let fx = fixture(&cluster, "rotation").await;
    let (_, controller, host) = serving(&cluster, &fx).await;
    let deployment = || get(&cluster, &["-n", &host, "get", "deployment", "vcluster"]);
    let strategy = || deployment().map(|d| d["spec"]["strategy"]["type"].clone());
    assert_eq!(strategy(), Some("Recreate".into()));

    // Every control-plane pod the API server holds at once (terminating ones too).
    let most = Arc::new(Mutex::new(0usize));
    let into = most.clone();
    let pods: Api<Pod> = Api::namespaced(cluster.client().await.expect("client"), &host);
    let config = watcher::Config::default().labels("app=vcluster,release=vcluster");
    tokio::spawn(async move {
        let mut live = std::collections::BTreeSet::new();
        let mut events = watcher(pods, config).boxed();
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => panic!("watching the control plane's pods: {e}"),
            };
            match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    live.insert(p.metadata.uid.unwrap_or_default())
                }
                watcher::Event::Delete(p) => live.remove(&p.metadata.uid.unwrap_or_default()),
                _ => continue,
            };
            let mut most = into.lock().expect("lock");
            *most = (*most).max(live.len());
        }
    });
    let watching = || (*most.lock().expect("lock") == 1).then_some(());
    wait_for("the watch to see the pod", LIMIT, &controller, watching).await;
    let template = r#"{"spec":{"template":{"metadata":{"annotations":{"vcluster.loft.sh/cert-rotation-at":"now"}}}}}"#;
    let patch = |p: &str| {
        let args = [
            "-n",
            &host,
            "patch",
            "deployment",
            "vcluster",
            "--type=merge",
            "-p",
            p,
        ];
        cluster.kubectl_ok(&args, None).expect("patch")
    };
    patch(template);
    wait_for("the new pod to be ready", LIMIT, &controller, || {
        rolled_out(&cluster, &host)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        *most.lock().expect("lock"),
        1,
        "two control-plane pods at once"
    );

    let rolling = r#"{"spec":{"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}}}"#;
    patch(rolling);
    wait_for("Recreate to be put back", LIMIT, &controller, || {
        (strategy()? == "Recreate").then_some(())
    })
    .await;
}
