//! The vCluster control plane never runs twice on one data directory: the controller stops it
//! before a pending release is rolled back. On the local control plane with the stand-in chart
//! (KWOK makes its pods Ready); the same steps hold for the real vCluster on the real node.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

mod support;
use support::{Controller, fixture, get, reaches, wait_for};

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

/// Issue 29, defect 5: a helm upgrade killed mid-way leaves the release `pending-upgrade` with
/// the control plane running; the controller's recovery scales it to zero before its rollback
/// (which changes the pod template back and, with the chart's `maxSurge: 1`, would start a second
/// pod on the same hostPath data beside the running one).
#[tokio::test]
async fn recovery_stops_the_control_plane_before_it_rolls_back() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "recovery").await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let pi = format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: one, namespace: {team} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: Delete\n"
    );
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&pi))
        .expect("apply");
    let controller = Controller::start(&cluster, &fx, &["--watch-namespace", &team]);
    let ready = ("VClusterReady", "True", "VClusterServing");
    let limit = Duration::from_secs(120);
    let pi = reaches((&cluster, &controller), (&team, "one"), ready, limit).await;
    let host = pi["status"]["hostNamespace"]
        .as_str()
        .expect("host")
        .to_string();
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
    let rolled = |d: Option<serde_json::Value>| {
        let d = d?;
        let s = &d["status"];
        (d["metadata"]["generation"] == s["observedGeneration"]
            && s["replicas"] == 1
            && s["updatedReplicas"] == 1
            && s["readyReplicas"] == 1)
            .then_some(())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while rolled(get(
        &cluster,
        &["-n", &host, "get", "deployment", "vcluster"],
    ))
    .is_none()
    {
        assert!(Instant::now() < deadline, "the upgrade never rolled out");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let _ = helm.kill();
    let _ = helm.wait();

    let seen = record(cluster.client().await.expect("client"), &host).await;
    let controller = Controller::start(&cluster, &fx, &["--watch-namespace", &team]);
    let rolled_back = |seen: &[(i32, String)]| seen.iter().position(|(_, h)| *h != seen[0].1);
    let seen = wait_for("the rollback", limit, &controller, || {
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
