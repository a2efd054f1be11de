//! End-to-end, issue 30 items 8 and 9: the node that holds an instance's hostPath storage. The
//! controller binary on the local control plane (real kube-apiserver, scheduler, controller-manager
//! with its pod garbage collector, KWOK nodes), the stand-in vCluster chart and syncer of
//! `support`. Each test adds a KWOK node of its own, makes it the only schedulable one while the
//! instance comes up (the shared node `kwok-node-0` cordoned), then deletes it, as a node that
//! died with its disk:
//!
//! - the control plane is pinned to the node it was first scheduled on, and when that node is
//!   gone the instance stalls with `StorageNodeGone` instead of starting an empty vCluster on
//!   another node and calling it serving;
//! - a `Delete` whose storage node is gone reports `CleanupBlocked` naming the node, and neither
//!   runs a cleanup Job elsewhere and calls it done nor waits on a Job that cannot run.
//!
//! The two tests cordon the shared node, so they run one at a time (`ONE_AT_A_TIME`).

use std::time::Duration;

use common::names::host_namespace;
use e2e::control_plane::NODE_NAME;
use serde_json::Value;

mod support;
use support::{Controller, condition, fixture, get, reaches, wait_for};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn apply(cluster: &e2e::shared::Shared, yaml: &str) {
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(yaml))
        .expect("apply");
}

/// Adds KWOK node `name` and waits for it to be Ready.
async fn add_node(cluster: &e2e::shared::Shared, controller: &Controller, name: &str) {
    apply(
        cluster,
        &format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  annotations: {{ kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: \"0\" }}\n  labels: {{ kubernetes.io/hostname: {name}, kubernetes.io/os: linux, type: kwok }}\nstatus:\n  allocatable: {{ cpu: \"32\", memory: 256Gi, pods: \"110\" }}\n  capacity: {{ cpu: \"32\", memory: 256Gi, pods: \"110\" }}\n"
        ),
    );
    wait_for(
        &format!("node {name} to be Ready"),
        Duration::from_secs(60),
        controller,
        || {
            let node = get(cluster, &["get", "node", name])?;
            let ready = node["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let tainted = node["spec"]["taints"]
                .as_array()
                .is_some_and(|t| !t.is_empty());
            (ready && !tainted).then_some(())
        },
    )
    .await;
}

/// Cordons every node but `keep` (nodes an earlier test left too), or uncordons the shared one.
fn cordon(cluster: &e2e::shared::Shared, keep: Option<&str>) {
    let Some(keep) = keep else {
        cluster
            .kubectl_ok(&["uncordon", NODE_NAME], None)
            .expect("uncordon");
        return;
    };
    let nodes = get(cluster, &["get", "nodes"]).expect("nodes");
    for node in nodes["items"].as_array().into_iter().flatten() {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        if name != keep {
            cluster.kubectl_ok(&["cordon", name], None).expect("cordon");
        }
    }
}

/// The control plane pods of `host`: (node, phase).
fn control_plane_pods(cluster: &e2e::shared::Shared, host: &str) -> Vec<(String, String)> {
    let pods = get(cluster, &["-n", host, "get", "pods", "-l", "app=vcluster"]);
    pods.as_ref()
        .and_then(|p| p["items"].as_array())
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["status"]["phase"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

fn message(pi: &Value, type_: &str) -> String {
    pi["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Starts a controller for a fresh namespace, brings instance `name` up on a new node of its
/// own and returns with the shared node schedulable again and the new node's name.
async fn up_on_a_node_of_its_own(
    cluster: &e2e::shared::Shared,
    test: &str,
    name: &str,
    policy: &str,
) -> (support::Fixture, String, Controller, String) {
    cluster.install_crd().expect("CRD");
    let fx = fixture(cluster, test).await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let controller = Controller::start(
        cluster,
        &fx,
        &["--leader-elect=false", "--watch-namespace", &team],
    );
    let node = format!("{test}-{}", std::process::id());
    add_node(cluster, &controller, &node).await;
    cordon(cluster, Some(&node));
    apply(
        cluster,
        &format!(
            "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {name}, namespace: {team} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: {policy}\n"
        ),
    );
    let host = host_namespace(&team, name);
    wait_for(
        &format!("{name} to serve from {node}"),
        Duration::from_secs(120),
        &controller,
        || {
            let pi = get(cluster, &["-n", &team, "get", "pi", name])?;
            let serving = condition(&pi, "KubeconfigReady").is_some_and(|c| c.0 == "True");
            let pods = control_plane_pods(cluster, &host);
            (serving && pods.iter().any(|(n, p)| *n == node && p == "Running")).then_some(())
        },
    )
    .await;
    (fx, team, controller, node)
}

#[tokio::test]
async fn the_control_plane_stays_on_its_storage_node_and_stalls_when_it_is_gone() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let (_fx, team, controller, node) =
        up_on_a_node_of_its_own(&cluster, "pinned", "pinned", "Retain").await;
    let host = host_namespace(&team, "pinned");
    // The control plane's pod template requires the node its storage is on (the chart's
    // `controlPlane.statefulSet.scheduling.affinity`).
    wait_for(
        &format!("deployment/vcluster to be pinned to {node}"),
        Duration::from_secs(120),
        &controller,
        || {
            let d = get(&cluster, &["-n", &host, "get", "deployment", "vcluster"])?;
            let affinity = d["spec"]["template"]["spec"]["affinity"].to_string();
            let ready = d["status"]["readyReplicas"].as_i64() == Some(1)
                && d["status"]["updatedReplicas"].as_i64() == Some(1);
            (affinity.contains(&format!("\"{node}\"")) && ready).then_some(())
        },
    )
    .await;
    cordon(&cluster, None);
    cluster
        .kubectl_ok(&["delete", "node", &node, "--wait=false"], None)
        .expect("delete node");
    // The pod garbage collector removes the pod of the gone node (after 40 s); the replacement
    // must not run anywhere else, and the instance says why it waits.
    let pi = reaches(
        (&cluster, &controller),
        (&team, "pinned"),
        ("Stalled", "True", "StorageNodeGone"),
        Duration::from_secs(240),
    )
    .await;
    let said = message(&pi, "VClusterReady");
    assert!(said.contains(&node), "names the node: {said}");
    assert_eq!(
        condition(&pi, "VClusterReady"),
        Some(("False".into(), "StorageNodeGone".into()))
    );
    let pods = control_plane_pods(&cluster, &host);
    assert!(
        pods.iter().all(|(n, _)| n.is_empty() || *n == node),
        "no control plane pod runs on another node: {pods:?}"
    );
}

#[tokio::test]
async fn a_delete_whose_storage_node_is_gone_is_blocked_naming_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let (fx, team, controller, node) =
        up_on_a_node_of_its_own(&cluster, "doomed", "doomed", "Delete").await;
    let host = host_namespace(&team, "doomed");
    cordon(&cluster, None);
    cluster
        .kubectl_ok(&["delete", "node", &node, "--wait=false"], None)
        .expect("delete node");
    wait_for(
        &format!("the control plane pod on {node} to be collected"),
        Duration::from_secs(180),
        &controller,
        || {
            let pods = control_plane_pods(&cluster, &host);
            pods.iter().all(|(n, _)| *n != node).then_some(())
        },
    )
    .await;
    cluster
        .kubectl_ok(
            &["-n", &team, "delete", "pi", "doomed", "--wait=false"],
            None,
        )
        .expect("delete instance");
    let pi = reaches(
        (&cluster, &controller),
        (&team, "doomed"),
        ("Ready", "False", "CleanupBlocked"),
        Duration::from_secs(180),
    )
    .await;
    let said = message(&pi, "Ready");
    assert!(said.contains(&node), "names the node: {said}");
    // No cleanup Job ran (or waits) anywhere: the storage is on the gone node.
    let job = get(&cluster, &["-n", &fx.operator_ns, "get", "job", &host]);
    assert!(job.is_none(), "no cleanup Job: {job:?}");
    // The way out the message names once the node will not return: the finalizer, by hand.
    support::release_finalizer(&cluster, &team, "doomed");
}
