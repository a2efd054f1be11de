//! The vCluster control plane, the chart's Deployment `vcluster`: whether it has rolled out
//! ([`ready`]), stopping it before helm changes the release ([`stop`]) so that no two pods share
//! its hostPath database, and the ownership check before helm touches it ([`check_owner`]).

use std::time::{Duration, Instant};

use common::names::{HELM_RELEASE_ANNOTATION, VCLUSTER_APP};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch};
use serde_json::json;

use crate::api::manager;
use crate::helm::RELEASE;

/// How long [`stop`] waits for the old pods to go.
pub const STOP_LIMIT: Duration = Duration::from_secs(300);

/// Errors of stopping the control plane; each says what to look at.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    /// Reading the Deployment or listing its pods failed.
    #[error("reading {0} failed: {1}; check the controller's RBAC in the host namespace")]
    Read(&'static str, #[source] kube::Error),
    /// The host namespace is not the instance's (its marks name someone else, or it is gone).
    #[error(
        "host namespace {namespace} belongs to {owner}, not this instance; the controller leaves it and its vCluster untouched"
    )]
    NotOwned { namespace: String, owner: String },
    /// `deployment/vcluster` is not the Helm release's.
    #[error(
        "deployment/{RELEASE} in {namespace} does not belong to the Helm release {RELEASE}; remove it or move it away"
    )]
    Foreign { namespace: String },
    /// Scaling the Deployment to zero failed.
    #[error("scaling the vCluster Deployment to zero failed: {0}; the controller retries")]
    Scale(#[source] kube::Error),
    /// Pods were still there after [`STOP_LIMIT`].
    #[error(
        "{left} vCluster pod(s) in {namespace} did not stop within {}s; look at `kubectl -n {namespace} get pods` and their events",
        STOP_LIMIT.as_secs()
    )]
    TimedOut { namespace: String, left: usize },
}

/// The Deployment has rolled out: its current spec, every pod updated, ready and available.
pub fn ready(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(1);
    let Some(status) = d.status.as_ref() else {
        return false;
    };
    status.observed_generation >= d.metadata.generation
        && status.updated_replicas.unwrap_or(0) >= want
        && status.ready_replicas.unwrap_or(0) >= want
        && status.available_replicas.unwrap_or(0) >= want
        && status.replicas.unwrap_or(0) == want
}

/// Helm's annotation naming the namespace of the release an object belongs to.
const HELM_RELEASE_NAMESPACE_ANNOTATION: &str = "meta.helm.sh/release-namespace";

/// Checks that `host_ns` is still instance `key`'s (UID `uid`), right before helm changes it.
pub async fn check_owner(
    client: kube::Client,
    host_ns: &str,
    key: &str,
    uid: &str,
) -> Result<(), StopError> {
    let namespace = Api::<Namespace>::all(client)
        .get_opt(host_ns)
        .await
        .map_err(|e| StopError::Read("the host namespace", e))?;
    let owner = match &namespace {
        None => Some("nobody: it does not exist".to_string()),
        Some(n) => crate::decide::ownership::host_namespace(n, key, uid),
    };
    owner.map_or(Ok(()), |owner| {
        let namespace = host_ns.to_string();
        Err(StopError::NotOwned { namespace, owner })
    })
}

/// Stops the control plane of `host_ns` before helm changes its release: the chart's rollout
/// (`maxSurge: 1`) would run a second pod on the same hostPath database, so the release's own
/// Deployment is scaled to zero and its pods awaited; helm then sets the replicas again.
pub async fn stop(client: kube::Client, host_ns: &str) -> Result<(), StopError> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), host_ns);
    let Some(d) = deployments
        .get_opt(RELEASE)
        .await
        .map_err(|e| StopError::Read("the vCluster Deployment", e))?
    else {
        return Ok(());
    };
    let annotation = |name: &str| d.annotations().get(name).map(String::as_str);
    if annotation(HELM_RELEASE_ANNOTATION) != Some(RELEASE)
        || annotation(HELM_RELEASE_NAMESPACE_ANNOTATION) != Some(host_ns)
    {
        return Err(StopError::Foreign {
            namespace: host_ns.to_string(),
        });
    }
    if d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) > 0 {
        deployments
            .patch(
                RELEASE,
                &manager(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .map_err(StopError::Scale)?;
    }
    let uid = d.uid().unwrap_or_default();
    let deadline = Instant::now() + STOP_LIMIT;
    loop {
        let left = pods(&client, host_ns, &uid)
            .await
            .map_err(|e| StopError::Read("the vCluster pods", e))?
            .len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(StopError::TimedOut {
                namespace: host_ns.to_string(),
                left,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The control plane's pods in `host_ns`: those of a ReplicaSet the Deployment with UID
/// `deployment_uid` controls. Labels alone prove nothing: a tenant pod synced into the host
/// namespace may carry the control plane's.
pub async fn pods(
    client: &kube::Client,
    host_ns: &str,
    deployment_uid: &str,
) -> Result<Vec<Pod>, kube::Error> {
    // The chart's ReplicaSets carry its pod labels too: the selector only narrows the lists,
    // the owner references decide.
    let selector = ListParams::default().labels(&format!("app={VCLUSTER_APP}"));
    let sets = Api::<ReplicaSet>::namespaced(client.clone(), host_ns)
        .list(&selector)
        .await?;
    let pods = Api::<Pod>::namespaced(client.clone(), host_ns)
        .list(&selector)
        .await?;
    Ok(of_deployment(deployment_uid, &sets.items, pods.items))
}

fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    (meta.owner_references.iter().flatten()).any(|r| r.controller == Some(true) && r.uid == uid)
}

/// The `pods` whose controller is one of `sets` that the Deployment `deployment_uid` controls.
fn of_deployment(deployment_uid: &str, sets: &[ReplicaSet], pods: Vec<Pod>) -> Vec<Pod> {
    let ours: Vec<&str> = sets
        .iter()
        .filter(|rs| controlled_by(&rs.metadata, deployment_uid))
        .filter_map(|rs| rs.metadata.uid.as_deref())
        .collect();
    pods.into_iter()
        .filter(|p| ours.iter().any(|uid| controlled_by(&p.metadata, uid)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64, status: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "vcluster", "generation": generation},
            "spec": {"replicas": 1, "selector": {}, "template": {}},
            "status": status
        }))
        .expect("deployment")
    }

    #[test]
    fn ready_only_once_the_current_template_has_rolled_out() {
        let done = json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                          "readyReplicas": 1, "availableReplicas": 1});
        assert!(ready(&deployment(2, done.clone())));
        // The Deployment controller has not seen the new spec yet.
        assert!(!ready(&deployment(3, done)));
        // A surge pod of the new template beside the old one.
        assert!(!ready(&deployment(
            2,
            json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1,
                   "readyReplicas": 2, "availableReplicas": 2})
        )));
        // Updated but not ready yet.
        assert!(!ready(&deployment(
            2,
            json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                   "readyReplicas": 0, "availableReplicas": 0})
        )));
        let mut no_status = deployment(1, json!({}));
        no_status.status = None;
        assert!(!ready(&no_status));
    }

    #[test]
    fn only_pods_of_the_deployments_replica_sets_are_the_control_plane() {
        let owned = |uid: &str, by: &str| {
            json!({"metadata": {"uid": uid, "labels": {"app": "vcluster", "release": "vcluster"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x",
                                     "uid": by, "controller": true}]}})
        };
        let sets: Vec<ReplicaSet> = vec![
            serde_json::from_value(json!({"metadata": {"uid": "rs-1", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vcluster",
                 "uid": "d-1", "controller": true}]}}))
            .expect("rs"),
            serde_json::from_value(json!({"metadata": {"uid": "rs-other"}})).expect("rs"),
        ];
        let pods: Vec<Pod> = [
            owned("p-1", "rs-1"),
            // A tenant pod synced with the control plane's labels, and one of another set.
            json!({"metadata": {"uid": "decoy", "labels": {"app": "vcluster", "release": "vcluster"}}}),
            owned("p-2", "rs-other"),
        ]
        .into_iter()
        .map(|p| serde_json::from_value(p).expect("pod"))
        .collect();
        let found: Vec<_> = of_deployment("d-1", &sets, pods)
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect();
        assert_eq!(found, ["p-1"]);
    }

    #[test]
    fn the_errors_say_what_to_look_at() {
        let foreign = StopError::Foreign {
            namespace: "pi-a-b-1".into(),
        };
        assert!(foreign.to_string().contains("remove it or move it away"));
        let late = StopError::TimedOut {
            namespace: "pi-a-b-1".into(),
            left: 2,
        }
        .to_string();
        assert!(
            late.contains("within 300s") && late.contains("kubectl -n pi-a-b-1 get pods"),
            "{late}"
        );
    }
}
