//! The reader: the only code of the reconciler that reads. It gathers one instance's world into
//! [`Read`], from the reflector stores ([`Source::Stored`]) or from the API server
//! ([`Source::Live`], before anything is written). [`super::observe`] turns that into the
//! decision's input without reading anything more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::crd::{DeletionPolicy, PlatformInstance};
use common::names::{
    EXPORTED_KUBECONFIG_KEY, EXPORTED_KUBECONFIG_SECRET, VCLUSTER, VCLUSTER_NETWORK_POLICY,
    host_namespace, kubeconfig_secret, legacy_host_namespace,
};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, PersistentVolume, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::error::{ConfigError, ReconcileError, observing};
use super::stores::Stores;
use super::{Context, STORAGE_NODE_FILE, key, state_path, task_keys};
use crate::decide::model::{Cleanup, Protection, Release, TaskState};
use crate::decide::ownership;
use crate::helm::{RELEASE, release_from_records};
use crate::installer::record::Record;

/// Where the reader reads the objects of the API server.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// The API server, now.
    Live,
    /// The reflector stores (possibly stale: see [`super::stores`]).
    Stored(&'a Stores),
}

/// Everything one reconcile of an instance read.
#[derive(Default)]
pub(crate) struct Read {
    /// The instance's host namespace name: the one an earlier release gave it when a namespace
    /// of that name carries its UID, else this release's.
    pub host_ns: String,
    pub namespace: Option<Arc<Namespace>>,
    /// `networkpolicy/vcluster-api` in it exists.
    pub network_policy: bool,
    /// The vCluster's Helm release, from its records' labels.
    pub release: Option<Release>,
    /// `service/vcluster`'s metadata.
    pub service: Option<ObjectMeta>,
    pub deployment: Option<Arc<Deployment>>,
    /// The kubeconfig the vCluster exported (its `config` key).
    pub exported: Option<String>,
    /// Whether that kubeconfig reached the vCluster's API (`None`: not tried).
    pub serves: Option<bool>,
    pub kubeconfig: Option<Arc<Secret>>,
    /// The cleanup Job (deleting with `Delete` only).
    pub cleanup: Cleanup,
    /// The node recorded as holding the storage.
    pub storage_node: Option<String>,
    /// With none recorded, the node the control plane's pod is scheduled on.
    pub scheduled_on: Option<String>,
    /// While the control plane is not ready: what its init container said refusing the storage
    /// directory (another instance's owner marker).
    pub storage_conflict: Option<String>,
    /// The recorded node is gone (looked up only while the control plane is not ready, or the
    /// storage is to be cleaned).
    pub storage_node_gone: bool,
    /// Tenant auth's client secret, when the program's config is put together.
    pub client_secret: Option<Result<String, ConfigError>>,
    /// The helm, install and preview tasks (read before the record).
    pub tasks: [TaskState; 3],
    /// Their failures in a row and when each may retry.
    pub retries: [(u32, Option<std::time::SystemTime>); 3],
    pub record: Record,
    /// Why the installer's record, which exists, cannot be read.
    pub record_error: Option<String>,
    /// The membership kubeconfig Secrets the record names that are gone.
    pub missing_memberships: Vec<String>,
    pub protection: Protection,
    /// The instance's state directory exists.
    pub state_exists: bool,
    /// The PersistentVolumes bound in the host namespace (see [`volumes`]).
    pub volumes: Vec<(String, bool)>,
}

/// Reads one instance's world from `source`.
pub(crate) async fn read(
    ctx: &Context,
    pi: &PlatformInstance,
    source: Source<'_>,
) -> Result<Read, ReconcileError> {
    let ns = pi.namespace().unwrap_or_default();
    let uid = pi.uid().unwrap_or_default();
    let namespace = |host_ns: String| async move {
        let found = match source {
            Source::Stored(stores) => stores.namespaces.get(&ObjectRef::new(&host_ns)),
            Source::Live => Api::<Namespace>::all(ctx.client.clone())
                .get_opt(&host_ns)
                .await
                .map_err(observing(format!("namespace {host_ns}")))?
                .map(Arc::new),
        };
        Ok::<_, ReconcileError>((host_ns, found))
    };
    // An instance whose status names this release's host namespace has no other: the one of
    // the earlier releases' name is looked up only for the others (one read less per reconcile).
    let current = host_namespace(&ns, &pi.name_any());
    let recorded = pi.status.as_ref().and_then(|s| s.host_namespace.as_deref());
    let legacy = match recorded == Some(current.as_str()) {
        true => (String::new(), None),
        false => namespace(legacy_host_namespace(&ns, &pi.name_any())).await?,
    };
    // Kept while that namespace is there, and once it was deleted (its status says so), so that
    // the storage directory of the old name is cleaned.
    let (host_ns, namespace) = match &legacy.1 {
        Some(n) if ownership::marked(&n.metadata, &uid) == Some(true) => legacy,
        None if recorded == Some(legacy.0.as_str()) => legacy,
        _ => namespace(current).await?,
    };
    let record = state_path(&ctx.settings, pi).join(STORAGE_NODE_FILE);
    let storage_node = match std::fs::read_to_string(&record) {
        Ok(node) => Some(node.trim().to_string()).filter(|n| !n.is_empty()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(ReconcileError::StorageNode(record, e)),
    };
    let mut read = Read {
        host_ns: host_ns.clone(),
        namespace,
        storage_node,
        ..Read::default()
    };
    let deleting = pi.meta().deletion_timestamp.is_some();
    let cleaning = deleting && pi.spec.deletion_policy == DeletionPolicy::Delete;
    let mut look_at_node = cleaning;
    let ours = read
        .namespace
        .as_deref()
        .is_some_and(|n| ownership::host_namespace(n, &key(pi), &uid).is_none());
    let host = In::new(ctx, source, &host_ns);
    if ours {
        read.network_policy = host
            .get(
                |s| &s.network_policies,
                VCLUSTER_NETWORK_POLICY,
                "the host NetworkPolicy",
            )
            .await?
            .is_some();
        read.release = Some(release(ctx, source, &host_ns).await?);
        read.service = host
            .get(|s| &s.services, VCLUSTER, "service/vcluster")
            .await?
            .map(|s| s.metadata.clone());
        read.deployment = host
            .get(|s| &s.deployments, VCLUSTER, "the vCluster Deployment")
            .await?;
        read.exported = host
            .get(
                |s| &s.exported,
                EXPORTED_KUBECONFIG_SECRET,
                "the exported kubeconfig",
            )
            .await?
            .and_then(|s| secret_text(&s, EXPORTED_KUBECONFIG_KEY));
        let ready = matches!(read.release, Some(Release::Deployed { .. }))
            && (read.deployment.as_deref()).is_some_and(super::control_plane::ready);
        if let Some(d) = read.deployment.as_deref()
            && (read.storage_node.is_none() || !ready)
        {
            let uid = d.uid().unwrap_or_default();
            let pods = super::control_plane::pods(&ctx.client, &host_ns, &uid).await;
            let pods = pods.map_err(observing("the control plane's pods"))?;
            read.storage_conflict = pods.iter().find_map(storage_refusal);
            read.scheduled_on = pods.into_iter().find_map(|p| p.spec?.node_name);
        }
        look_at_node |= !ready;
        if !ready {
            ctx.probes.forget(&host_ns);
        } else if let Some(kubeconfig) = &read.exported
            && super::kubeconfig::vet(kubeconfig).is_ok()
        {
            read.serves = Some(ctx.probes.serves(&host_ns, kubeconfig, &ctx.settings).await);
        }
    }
    let own = In::new(ctx, source, &ns);
    read.kubeconfig = own
        .get(
            |s| &s.kubeconfigs,
            &kubeconfig_secret(&pi.name_any()),
            "the kubeconfig Secret",
        )
        .await?;
    if let Some(node) = read.storage_node.as_deref().filter(|_| look_at_node) {
        let nodes = Api::<Node>::all(ctx.client.clone());
        let found = nodes.get_metadata_opt(node).await;
        read.storage_node_gone = found.map_err(observing(format!("node {node}")))?.is_none();
    }
    if cleaning {
        read.cleanup = cleanup(ctx, &uid, &host_ns).await?;
    }
    if ours && deleting && pi.spec.deletion_policy == DeletionPolicy::Retain {
        read.volumes = volumes(ctx, &host_ns).await?;
    }
    if read.serves == Some(true)
        && !deleting
        && ctx.settings.install_platform
        && let Some(auth) = pi
            .spec
            .platform
            .as_ref()
            .and_then(|p| p.tenant_auth.as_ref())
    {
        read.client_secret = Some(client_secret(ctx, pi, &auth.client_secret_ref).await?);
    }
    // The tasks' states before the record (see `InstallOutcome::fold`).
    read.tasks = task_keys(pi).map(|k| ctx.tasks.state(&k));
    read.retries = task_keys(pi).map(|k| ctx.tasks.retry(&k));
    match ctx.installer.record(&ns, &pi.name_any()) {
        Ok(record) => read.record = record,
        Err(e) => read.record_error = Some(e.to_string()),
    }
    for name in &read.record.membership_secrets {
        let what = "a membership kubeconfig Secret";
        if own.get(|s| &s.kubeconfigs, name, what).await?.is_none() {
            read.missing_memberships.push(name.clone());
        }
    }
    read.protection = ctx.protection.read().map(|p| p.clone()).unwrap_or_default();
    read.state_exists = state_path(&ctx.settings, pi).exists();
    Ok(read)
}

/// What the control plane pod's init container `storage-owner` said when it refused the storage
/// directory (exit [`crate::marker::CONFLICT_EXIT`]): at its current run, or, while it waits to
/// run again, at its last; a run that passed or is running clears it.
pub(crate) fn storage_refusal(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.init_container_statuses.as_ref()?;
    let status = statuses
        .iter()
        .find(|s| s.name == super::objects::STORAGE_OWNER_CONTAINER)?;
    let now = status.state.as_ref()?;
    let last = || status.last_state.as_ref()?.terminated.as_ref();
    now.terminated
        .as_ref()
        .or_else(|| now.waiting.as_ref().and(last()))
        .filter(|t| t.exit_code == i32::from(crate::marker::CONFLICT_EXIT))
        .map(|t| {
            let said = t.message.as_deref().unwrap_or("").trim();
            format!(
                "its init container {} refused the storage directory: {said}",
                super::objects::STORAGE_OWNER_CONTAINER
            )
        })
}

/// The objects of one namespace, as `source` has them.
struct In<'a> {
    client: &'a kube::Client,
    source: Source<'a>,
    namespace: &'a str,
}

impl<'a> In<'a> {
    fn new(ctx: &'a Context, source: Source<'a>, namespace: &'a str) -> Self {
        Self {
            client: &ctx.client,
            source,
            namespace,
        }
    }

    /// `name` from the store `pick` names when reading the stores, else from the API server.
    async fn get<K>(
        &self,
        pick: impl FnOnce(&'a Stores) -> &'a Store<K>,
        name: &str,
        what: &str,
    ) -> Result<Option<Arc<K>>, ReconcileError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + kube::runtime::reflector::Lookup<DynamicType = ()>,
        K: Clone + DeserializeOwned + std::fmt::Debug + 'static,
    {
        match self.source {
            Source::Stored(stores) => {
                Ok(pick(stores).get(&ObjectRef::new(name).within(self.namespace)))
            }
            Source::Live => Ok(Api::<K>::namespaced(self.client.clone(), self.namespace)
                .get_opt(name)
                .await
                .map_err(observing(what))?
                .map(Arc::new)),
        }
    }
}

/// The vCluster's release from its records' labels (metadata only: never Helm's payload).
async fn release(
    ctx: &Context,
    source: Source<'_>,
    host_ns: &str,
) -> Result<Release, ReconcileError> {
    let records: Vec<ObjectMeta> = match source {
        Source::Stored(stores) => (stores.releases.state().iter())
            .filter(|s| s.metadata.namespace.as_deref() == Some(host_ns))
            .map(|s| s.metadata.clone())
            .collect(),
        Source::Live => Api::<Secret>::namespaced(ctx.client.clone(), host_ns)
            .list_metadata(&ListParams::default().labels(&format!("owner=helm,name={RELEASE}")))
            .await
            .map_err(observing("the vCluster release"))?
            .items
            .into_iter()
            .map(|s| s.metadata)
            .collect(),
    };
    Ok(release_from_records(&records))
}

/// The PersistentVolumes whose claim is in `host_ns`, from the API server: each name, and whether
/// it is `Retain` already. No other volume is ever named.
async fn volumes(ctx: &Context, host_ns: &str) -> Result<Vec<(String, bool)>, ReconcileError> {
    let list = Api::<PersistentVolume>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(observing("the PersistentVolumes"))?;
    Ok((list.items.into_iter())
        .filter_map(|pv| {
            let spec = pv.spec?;
            (spec.claim_ref?.namespace.as_deref() == Some(host_ns)).then(|| {
                let retained = spec.persistent_volume_reclaim_policy.as_deref() == Some("Retain");
                (pv.metadata.name.unwrap_or_default(), retained)
            })
        })
        .collect())
}

/// The text under `key` of `secret`, if it has that key.
fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    let value = secret.data.as_ref()?.get(key)?;
    Some(String::from_utf8_lossy(&value.0).into_owned())
}

/// The storage cleanup Job (only looked at while deleting with `Delete`): another instance's
/// (`Stale`), or what its conditions say, and while it runs no pod, why not.
async fn cleanup(ctx: &Context, uid: &str, host_ns: &str) -> Result<Cleanup, ReconcileError> {
    let namespace = &ctx.settings.cleanup_namespace;
    let Some(job) = Api::<Job>::namespaced(ctx.client.clone(), namespace)
        .get_opt(host_ns)
        .await
        .map_err(observing("the cleanup Job"))?
    else {
        return Ok(Cleanup::Missing);
    };
    if ownership::marked(&job.metadata, uid) != Some(true) {
        return Ok(Cleanup::Stale);
    }
    let outcome = super::observe::job_outcome(&job);
    if outcome != Cleanup::Running || job.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0 {
        return Ok(outcome);
    }
    // No pod runs: say why when the Job controller could not create one.
    let selector = format!(
        "involvedObject.kind=Job,involvedObject.name={host_ns},involvedObject.uid={},reason=FailedCreate",
        job.uid().unwrap_or_default()
    );
    let events = Api::<Event>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(observing("the cleanup Job's events"))?;
    let blocked = events
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .next_back();
    Ok(blocked.map_or(Cleanup::Running, Cleanup::Blocked))
}

/// Tenant auth's client secret from the Secret `r` names; `Err` says what is missing.
async fn client_secret(
    ctx: &Context,
    pi: &PlatformInstance,
    r: &common::crd::SecretKeyRef,
) -> Result<Result<String, ConfigError>, ReconcileError> {
    let ns = pi.namespace().unwrap_or_default();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&r.name)
        .await
        .map_err(observing(format!("the tenant auth Secret {}", r.name)))?;
    let value = secret.as_ref().and_then(|s| secret_text(s, &r.key));
    Ok(match (secret.is_some(), value) {
        (_, Some(v)) => Ok(v),
        (false, None) => Err(ConfigError::SecretNotFound {
            name: r.name.clone(),
            namespace: ns,
            key: r.key.clone(),
        }),
        (true, None) => Err(ConfigError::KeyNotFound {
            name: r.name.clone(),
            key: r.key.clone(),
        }),
    })
}

/// Whether each vCluster's API serves (`GET /version` through the kubeconfig it exported). A
/// vCluster that answered is believed while its control plane stays ready and its kubeconfig
/// stays the same (its own readiness probe, on its API, keeps watch from then on); one that did
/// not is asked again at most once per `--target-poll`. No client is kept between probes.
pub struct Probes {
    entries: Mutex<HashMap<String, Probe>>,
    /// Probes by outcome (`served`, `failed`).
    outcomes: prometheus::IntCounterVec,
}

struct Probe {
    /// The SHA-256 of the kubeconfig it was asked through.
    kubeconfig: [u8; 32],
    asked: Instant,
    serves: bool,
}

impl Probes {
    /// Probes counted in `outcomes`.
    pub fn counted(outcomes: prometheus::IntCounterVec) -> Self {
        Self {
            entries: Mutex::default(),
            outcomes,
        }
    }

    /// Whether the vCluster in `host_ns`, its control plane ready, serves its API through
    /// `kubeconfig`.
    pub async fn serves(
        &self,
        host_ns: &str,
        kubeconfig: &str,
        settings: &super::Settings,
    ) -> bool {
        let digest = sha256(kubeconfig);
        let known = self.entries.lock().ok().and_then(|e| {
            let p = e.get(host_ns).filter(|p| p.kubeconfig == digest)?;
            (p.serves || p.asked.elapsed() < settings.target_poll).then_some(p.serves)
        });
        if let Some(serves) = known {
            return serves;
        }
        let asked = Instant::now();
        let serves = match client_for(kubeconfig).await {
            Some(client) => matches!(
                tokio::time::timeout(settings.api_probe_timeout, client.apiserver_version()).await,
                Ok(Ok(_))
            ),
            None => false,
        };
        (self.outcomes)
            .with_label_values(&[if serves { "served" } else { "failed" }])
            .inc();
        if let Ok(mut entries) = self.entries.lock() {
            let probe = Probe {
                kubeconfig: digest,
                asked,
                serves,
            };
            entries.insert(host_ns.to_string(), probe);
        }
        serves
    }

    /// Drops what is known of the vCluster in `host_ns` (its instance is gone, or its control
    /// plane is not ready): it is asked again once it is.
    pub fn forget(&self, host_ns: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(host_ns);
        }
    }
}

fn sha256(text: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().try_into().unwrap_or_default()
}

async fn client_for(kubeconfig: &str) -> Option<kube::Client> {
    let parsed = Kubeconfig::from_yaml(kubeconfig).ok()?;
    let config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .ok()?;
    kube::Client::try_from(config).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_counts_until_the_check_runs_again_and_passes() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(
                serde_json::json!({"status": {"initContainerStatuses": [status]}}),
            )
            .expect("pod")
        };
        let refused = serde_json::json!({"terminated": {"exitCode": 3, "message": "team-b/x's"}});
        let base = serde_json::json!({"name": "storage-owner", "image": "i", "imageID": "", "ready": false, "restartCount": 1});
        let with = |state: serde_json::Value, last: serde_json::Value| {
            let mut s = base.clone();
            s["state"] = state;
            s["lastState"] = last;
            storage_refusal(&pod(s))
        };
        let waiting = serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let passed = serde_json::json!({"terminated": {"exitCode": 0}});
        assert!(
            with(refused.clone(), serde_json::json!({})).is_some_and(|m| m.contains("team-b/x's"))
        );
        assert!(
            with(waiting, refused.clone()).is_some(),
            "backing off after a refusal"
        );
        assert_eq!(
            with(passed, refused.clone()),
            None,
            "the marker was moved aside"
        );
        assert_eq!(with(serde_json::json!({"running": {}}), refused), None);
    }
}
