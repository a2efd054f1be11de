//! The act step: carries out a plan's actions in order. Writes are server-side applies under the
//! operator's field manager; long work (helm, npm, pulumi) is submitted to the task registry and
//! never awaited here.

use std::future::Future;
use std::time::Instant;

use common::crd::PlatformInstance;
use common::names::{
    APPLIED_HASH_ANNOTATION, FINALIZER, OWNER_SERVICE_ANNOTATION, VCLUSTER,
    VCLUSTER_NETWORK_POLICY, kubeconfig_secret,
};
use futures::FutureExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::{Resource, ResourceExt};
use prometheus::HistogramVec;
use serde_json::json;

use super::error::{ReconcileError, observing};
use super::observe::Found;
use super::{Context, STORAGE_NODE_FILE, install_key, key, preview_key, state_path, task_keys};
use super::{control_plane, objects};
use crate::api::{apply, delete_if, gone_is_done, manager};
use crate::decide::Action;
use crate::decide::model::{Failure, Mode, Plan, Release, TaskError};
use crate::decide::ownership;
use crate::helm::{HelmError, RELEASE, release_from_records};
use crate::installer;

struct Target<'a> {
    ctx: &'a Context,
    pi: &'a PlatformInstance,
    found: &'a Found,
    ns: String,
    name: String,
    host_ns: String,
    uid: String,
}

/// Carries out the plan's actions, in order.
pub async fn act(
    ctx: &Context,
    pi: &PlatformInstance,
    plan: &Plan,
    found: &Found,
) -> Result<(), ReconcileError> {
    let (ns, name) = (pi.namespace().unwrap_or_default(), pi.name_any());
    let t = Target {
        ctx,
        pi,
        found,
        host_ns: found.host_ns.clone(),
        ns,
        name,
        uid: pi.uid().unwrap_or_default(),
    };
    for action in &plan.actions {
        match action {
            Action::AddFinalizer => add_finalizer(&t).await?,
            Action::ApplyNamespace => apply_namespace(&t).await?,
            Action::InstallVCluster { recover } => install_vcluster(&t, *recover),
            Action::WriteKubeconfig => write_kubeconfig(&t).await?,
            Action::RecordOwnerService => record_owner_service(ctx, &t.host_ns, None).await?,
            Action::RestoreOwnerService => restore_owner_service(&t),
            Action::RelinkOwnerService { old_uid } => {
                record_owner_service(ctx, &t.host_ns, Some(old_uid)).await?
            }
            Action::Install { mode } => install(&t, *mode),
            Action::Preview => preview(&t),
            Action::PreviewUpgrade => preview_upgrade(&t),
            Action::CancelInstall => cancel_install(&t),
            Action::CancelHelm => {
                for k in task_keys(pi).iter().filter(|k| ctx.tasks.dequeue(k)) {
                    tracing::info!(task = %k, "dropped a queued task: the instance is being deleted or is suspended");
                }
            }
            Action::RecordStorageNode(node) => record_storage_node(&t, node)?,
            Action::UninstallVCluster => uninstall_vcluster(&t),
            Action::RetainVolumes(volumes) => retain_volumes(&t, volumes).await?,
            Action::DeleteNamespace => delete_namespace(&t).await?,
            Action::StartCleanup(node) => start_cleanup(&t, node).await?,
            Action::ReplaceCleanup => replace_cleanup(&t).await?,
            Action::RemoveState => remove_state(&t)?,
            Action::DeleteKubeconfig => delete_kubeconfig(&t).await?,
            Action::RemoveFinalizer => remove_finalizer(&t).await?,
        }
    }
    Ok(())
}

fn wrote(ctx: &Context, kind: &str) {
    ctx.metrics.writes.with_label_values(&[kind]).inc();
}

/// Sets the instance's finalizers, guarded by the resourceVersion read.
async fn patch_finalizers(t: &Target<'_>, finalizers: Vec<String>) -> Result<(), kube::Error> {
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": t.pi.resource_version()}});
    Api::<PlatformInstance>::namespaced(t.ctx.client.clone(), &t.ns)
        .patch(&t.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

async fn add_finalizer(t: &Target<'_>) -> Result<(), ReconcileError> {
    let mut finalizers = t.pi.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    patch_finalizers(t, finalizers)
        .await
        .map_err(ReconcileError::AddFinalizer)?;
    wrote(t.ctx, "finalizer");
    Ok(())
}

async fn remove_finalizer(t: &Target<'_>) -> Result<(), ReconcileError> {
    let mut finalizers = t.pi.finalizers().to_vec();
    finalizers.retain(|f| f != FINALIZER);
    gone_is_done(patch_finalizers(t, finalizers).await).map_err(ReconcileError::RemoveFinalizer)?;
    for k in task_keys(t.pi) {
        t.ctx.tasks.forget(&k);
    }
    Ok(())
}

async fn apply_namespace(t: &Target<'_>) -> Result<(), ReconcileError> {
    let settings = &t.ctx.settings;
    let mut namespace = objects::namespace(&key(t.pi), &t.uid, &t.host_ns, settings.pod_security);
    let policy = objects::network_policy(&t.host_ns, &t.uid, &settings.operator_namespace);
    let applied = objects::namespace_hash(&namespace, &policy);
    namespace
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(APPLIED_HASH_ANNOTATION.to_string(), applied);
    let namespaces = Api::<Namespace>::all(t.ctx.client.clone());
    apply(&namespaces, &t.host_ns, &namespace)
        .await
        .map_err(|e| ReconcileError::ApplyNamespace("namespace", e))?;
    wrote(t.ctx, "namespace");
    let policies = Api::<NetworkPolicy>::namespaced(t.ctx.client.clone(), &t.host_ns);
    apply(&policies, VCLUSTER_NETWORK_POLICY, &policy)
        .await
        .map_err(|e| ReconcileError::ApplyNamespace("networkpolicy", e))?;
    wrote(t.ctx, "networkpolicy");
    Ok(())
}

fn install_vcluster(t: &Target<'_>, recover: bool) {
    let (helm, client, namespace) = (t.ctx.helm.clone(), t.ctx.client.clone(), t.host_ns.clone());
    let guard = owner_check(t);
    let install = chart_install(t);
    let work = async move {
        if recover {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
            let releases = secrets
                .list_metadata(&ListParams::default().labels(&format!("owner=helm,name={RELEASE}")))
                .await
                .map_err(task_error)?;
            let records = releases.items.iter().map(|s| &s.metadata);
            if let Release::Pending(status) = release_from_records(records) {
                tracing::info!(%namespace, %status, "recovering an interrupted helm release");
                guard.await?;
                // A rollback changes the pod template: stopped first, never two pods on one disk.
                let stopped = control_plane::stop(client, &namespace).await;
                stopped.map_err(task_error)?;
                helm.recover(&namespace, &status)
                    .await
                    .map_err(helm_error)?;
            }
        }
        install.await
    };
    let helm = &t.ctx.metrics.helm_duration;
    submit_timed(t, &key(t.pi), true, helm, "install", work);
}

async fn write_kubeconfig(t: &Target<'_>) -> Result<(), ReconcileError> {
    let Some(kubeconfig) = &t.found.exported else {
        return Ok(());
    };
    let owner = t.pi.controller_owner_ref(&());
    let secret = objects::kubeconfig_secret_object(&t.ns, &t.name, &t.uid, owner, kubeconfig);
    let secrets = Api::<Secret>::namespaced(t.ctx.client.clone(), &t.ns);
    apply(&secrets, &kubeconfig_secret(&t.name), &secret)
        .await
        .map_err(ReconcileError::WriteKubeconfig)?;
    wrote(t.ctx, "secret");
    Ok(())
}

fn restore_owner_service(t: &Target<'_>) {
    tracing::warn!(instance = %key(t.pi), "service/vcluster was deleted; recreating it from the chart");
    // Never deleted here: that would let the garbage collector take everything vCluster synced.
    // Helm creates it when absent, after the control plane is stopped (the syncer reads the new
    // UID when it starts again); what names the old UID is relinked once the new one is recorded.
    let helm = &t.ctx.metrics.helm_duration;
    submit_timed(t, &key(t.pi), false, helm, "restore", chart_install(t));
}

/// The installer's job at `spec.version`, once the program's config is put together.
fn job(t: &Target<'_>, mode: Mode) -> Option<installer::Job> {
    Some(installer::Job {
        namespace: t.ns.clone(),
        name: t.name.clone(),
        uid: t.pi.uid()?,
        version: t.pi.spec.version.clone().unwrap_or_default(),
        mode,
        config: t.found.config.clone()?,
        owner: t.pi.controller_owner_ref(&()),
    })
}

fn install(t: &Target<'_>, mode: Mode) {
    let Some(job) = job(t, mode) else {
        return;
    };
    // A failed install backs off; a new version or new settings try at once.
    let record = &t.found.record;
    if record
        .last_install
        .as_ref()
        .is_some_and(|l| l.version != job.version)
        || record.attempted_config_hash.as_ref() != Some(&job.config.hash)
    {
        t.ctx.tasks.start_over(&install_key(t.pi));
    }
    let (installer, client) = (t.ctx.installer.clone(), t.ctx.client.clone());
    let work = async move { installer.install(client, job).await };
    let histogram = &t.ctx.metrics.install_duration;
    submit_timed(t, &install_key(t.pi), true, histogram, mode.into(), work);
}

fn preview(t: &Target<'_>) {
    let installer = t.ctx.installer.clone();
    let (namespace, instance) = (t.ns.clone(), t.name.clone());
    let Some(uid) = t.pi.uid() else { return };
    let version = t.found.record.installed_version.clone().unwrap_or_default();
    let work = async move {
        installer
            .preview(&namespace, &instance, &uid, &version)
            .await
    };
    let histogram = &t.ctx.metrics.install_duration;
    submit_timed(t, &preview_key(t.pi), true, histogram, "preview", work);
}

fn preview_upgrade(t: &Target<'_>) {
    let Some(job) = job(t, Mode::Upgrade) else {
        return;
    };
    let installer = t.ctx.installer.clone();
    let work = async move { installer.preview_upgrade(job).await };
    let histogram = &t.ctx.metrics.install_duration;
    submit_timed(t, &preview_key(t.pi), true, histogram, "preview", work);
}

fn cancel_install(t: &Target<'_>) {
    for k in [install_key(t.pi), preview_key(t.pi)] {
        if t.ctx.tasks.cancel(&k) {
            tracing::info!(task = %k, "stopped an installer task: the instance is being deleted");
        }
    }
}

fn uninstall_vcluster(t: &Target<'_>) {
    let (helm, namespace) = (t.ctx.helm.clone(), t.host_ns.clone());
    let guard = owner_check(t);
    let work = async move {
        guard.await?;
        helm.uninstall(&namespace).await.map_err(helm_error)
    };
    let helm = &t.ctx.metrics.helm_duration;
    submit_timed(t, &key(t.pi), false, helm, "uninstall", work);
}

async fn delete_namespace(t: &Target<'_>) -> Result<(), ReconcileError> {
    let namespaces = Api::<Namespace>::all(t.ctx.client.clone());
    let marked = |meta: &ObjectMeta| ownership::marked(meta, &t.uid) == Some(true);
    let deleted = delete_if(&namespaces, &t.host_ns, DeleteParams::default(), marked)
        .await
        .map_err(ReconcileError::DeleteNamespace)?;
    if deleted {
        wrote(t.ctx, "namespace");
    } else {
        // Not marked with this instance's UID since it was observed: the next reconcile sees
        // the conflict and leaves it alone.
        tracing::warn!(namespace = %t.host_ns, instance = %key(t.pi), "not deleting a host namespace that does not carry this instance's UID mark");
    }
    Ok(())
}

/// The file in the instance's state directory naming (a JSON list) the volumes `Retain` kept.
const RETAINED_VOLUMES_FILE: &str = "retained-volumes.json";

/// Sets the volumes not yet `Retain` to `Retain` (a merge patch), then records them all, with
/// those an earlier instance of the same name recorded, durably.
async fn retain_volumes(t: &Target<'_>, volumes: &[(String, bool)]) -> Result<(), ReconcileError> {
    let pvs = Api::<PersistentVolume>::all(t.ctx.client.clone());
    let patch = json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
    for (name, _) in volumes.iter().filter(|(_, retained)| !retained) {
        (pvs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await)
            .map_err(|e| ReconcileError::RetainVolumes(format!("persistentvolume/{name}: {e}")))?;
        wrote(t.ctx, "persistentvolume");
        tracing::info!(volume = %name, instance = %key(t.pi), "set to Retain: deleting with Retain");
    }
    let dir = state_path(&t.ctx.settings, t.pi);
    let file = dir.join(RETAINED_VOLUMES_FILE);
    let mut names: std::collections::BTreeSet<String> = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    names.extend(volumes.iter().map(|(name, _)| name.clone()));
    let bytes = serde_json::to_vec_pretty(&names).unwrap_or_default();
    installer::record::write_durably(&dir, RETAINED_VOLUMES_FILE, &bytes)
        .map_err(|e| ReconcileError::RetainVolumes(format!("{}: {e}", file.display())))
}

/// Records, durably, the node the control plane was first scheduled on: it holds the storage.
fn record_storage_node(t: &Target<'_>, node: &str) -> Result<(), ReconcileError> {
    let dir = state_path(&t.ctx.settings, t.pi);
    installer::record::write_durably(&dir, STORAGE_NODE_FILE, node.as_bytes())
        .map_err(|e| ReconcileError::StorageNode(dir.join(STORAGE_NODE_FILE), e))?;
    tracing::info!(instance = %key(t.pi), %node, "recorded the node that holds the storage");
    Ok(())
}

async fn start_cleanup(t: &Target<'_>, node: &str) -> Result<(), ReconcileError> {
    let settings = &t.ctx.settings;
    let names = (t.host_ns.as_str(), t.found.storage_dir.as_str());
    let job = objects::cleanup_job(settings, names, &key(t.pi), &t.uid, node);
    let jobs: Api<Job> = Api::namespaced(t.ctx.client.clone(), &settings.cleanup_namespace);
    apply(&jobs, &t.host_ns, &job)
        .await
        .map_err(ReconcileError::StartCleanup)?;
    wrote(t.ctx, "job");
    Ok(())
}

/// Deletes the cleanup Job another instance left (checked again here, deleted with that Job's
/// UID as a precondition); the next reconcile creates this instance's own.
async fn replace_cleanup(t: &Target<'_>) -> Result<(), ReconcileError> {
    let jobs: Api<Job> = Api::namespaced(t.ctx.client.clone(), &t.ctx.settings.cleanup_namespace);
    let mut stale = false;
    let replace = |meta: &ObjectMeta| {
        stale = ownership::marked(meta, &t.uid) != Some(true);
        if stale {
            tracing::info!(job = %t.host_ns, instance = %key(t.pi), "replacing a cleanup Job another instance left");
        }
        stale
    };
    delete_if(&jobs, &t.host_ns, DeleteParams::background(), replace)
        .await
        .map_err(ReconcileError::ReplaceCleanup)?;
    if stale {
        wrote(t.ctx, "job");
    }
    Ok(())
}

fn remove_state(t: &Target<'_>) -> Result<(), ReconcileError> {
    let path = state_path(&t.ctx.settings, t.pi);
    match std::fs::remove_dir_all(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(ReconcileError::RemoveState(path, e))
        }
        _ => Ok(()),
    }
}

async fn delete_kubeconfig(t: &Target<'_>) -> Result<(), ReconcileError> {
    let secrets = Api::<Secret>::namespaced(t.ctx.client.clone(), &t.ns);
    let name = kubeconfig_secret(&t.name);
    let ours = |meta: &ObjectMeta| ownership::kubeconfig_secret(meta, &t.uid);
    let deleted = delete_if(&secrets, &name, DeleteParams::default(), ours)
        .await
        .map_err(ReconcileError::DeleteKubeconfig)?;
    if !deleted {
        tracing::warn!(secret = %name, instance = %key(t.pi), "not deleting a kubeconfig Secret that is not this instance's");
    }
    Ok(())
}

fn task_error(e: impl std::fmt::Display) -> TaskError {
    TaskError::from(e.to_string())
}

/// A helm error as a task's: a timeout keeps its reason ([`Failure::InstallTimedOut`]).
fn helm_error(e: HelmError) -> TaskError {
    match e {
        HelmError::TimedOut { .. } => TaskError::new(Failure::InstallTimedOut, e.to_string()),
        e => task_error(e),
    }
}

/// A check, when a helm task runs, that the host namespace is still the instance's.
fn owner_check(t: &Target<'_>) -> impl Future<Output = Result<(), TaskError>> + Send + 'static {
    let (client, namespace) = (t.ctx.client.clone(), t.host_ns.clone());
    let (instance, uid) = (key(t.pi), t.uid.clone());
    async move {
        control_plane::check_owner(client, &namespace, &instance, &uid)
            .await
            .map_err(task_error)
    }
}

/// Installs or upgrades the vCluster from the verified chart, after the owner check and
/// stopping its control plane ([`control_plane::stop`]).
fn chart_install(t: &Target<'_>) -> impl Future<Output = Result<(), TaskError>> + Send + 'static {
    let (helm, settings, namespace) = (
        t.ctx.helm.clone(),
        t.ctx.settings.clone(),
        t.host_ns.clone(),
    );
    let (client, node) = (t.ctx.client.clone(), t.found.storage_node.clone());
    let (storage_dir, uid, instance) = (t.found.storage_dir.clone(), t.uid.clone(), key(t.pi));
    let resources = super::quota::wanted(t.pi, &settings).cloned();
    let guard = owner_check(t);
    async move {
        guard.await?;
        control_plane::stop(client, &namespace)
            .await
            .map_err(task_error)?;
        let claim = objects::Claim {
            image: &settings.cleanup_image,
            uid: &uid,
            instance: &instance,
        };
        let values = objects::vcluster_values(
            &settings.storage_root_base,
            &namespace,
            &storage_dir,
            settings.pod_security,
            node.as_deref(),
            &claim,
            resources.as_ref(),
        );
        helm.upgrade_install(
            &namespace,
            &settings.chart,
            &settings.chart_version,
            &values,
            settings.extra_values.as_deref(),
        )
        .await
        .map_err(helm_error)
    }
}

/// Submits `work` as task `task`, its duration landing in `histogram` by operation and outcome.
fn submit_timed(
    t: &Target<'_>,
    task: &str,
    bounded: bool,
    histogram: &HistogramVec,
    operation: &'static str,
    work: impl Future<Output = Result<(), TaskError>> + Send + 'static,
) {
    let histogram = histogram.clone();
    let work = async move {
        let start = Instant::now();
        let result = work.await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        histogram
            .with_label_values(&[operation, outcome])
            .observe(start.elapsed().as_secs_f64());
        result
    };
    t.ctx.tasks.submit(task, bounded, work.boxed());
}

/// What vCluster syncs into the host namespace owned by `service/vcluster`, as
/// `(group, version, kind, plural)`: every kind its Role lets it write with the controller's values.
const SYNCED: [(&str, &str, &str, &str); 8] = [
    ("", "v1", "Pod", "pods"),
    ("", "v1", "Service", "services"),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    ("", "v1", "Secret", "secrets"),
    ("", "v1", "ConfigMap", "configmaps"),
    ("", "v1", "Endpoints", "endpoints"),
    ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
    (
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
    ),
];

/// Records `service/vcluster`'s UID and [`objects::service_hash`] on the host namespace; when it
/// was recreated, first points the owner references of every object of the host namespace that
/// vCluster syncs ([`SYNCED`]) and that name the old UID (`relink`) at it.
async fn record_owner_service(
    ctx: &Context,
    host_ns: &str,
    relink: Option<&str>,
) -> Result<(), ReconcileError> {
    let Some(svc) = Api::<Service>::namespaced(ctx.client.clone(), host_ns)
        .get_opt(VCLUSTER)
        .await
        .map_err(observing("service/vcluster"))?
    else {
        return Ok(());
    };
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    if let Some(old_uid) = relink {
        for kind in SYNCED {
            relink_kind(ctx, host_ns, (old_uid, &uid), kind).await?;
        }
    }
    let record = format!("{uid}/{}", objects::service_hash(&svc));
    let patch = json!({"metadata": {"annotations": {OWNER_SERVICE_ANNOTATION: record}}});
    Api::<Namespace>::all(ctx.client.clone())
        .patch(host_ns, &manager(), &Patch::Merge(&patch))
        .await
        .map_err(ReconcileError::RecordOwnerService)?;
    wrote(ctx, "namespace");
    Ok(())
}

/// Relinks every object of `kind` in `host_ns` with an owner reference to `uids.0` to `uids.1`.
async fn relink_kind(
    ctx: &Context,
    host_ns: &str,
    (old_uid, new_uid): (&str, &str),
    (group, version, kind, plural): (&str, &str, &str, &'static str),
) -> Result<(), ReconcileError> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), host_ns, &resource);
    let failed = |e| ReconcileError::RelinkOwnerService(plural, e);
    let listed = api.list_metadata(&ListParams::default()).await;
    for object in listed.map_err(failed)?.items {
        let mut refs = object.owner_references().to_vec();
        let stale: Vec<_> = refs.iter_mut().filter(|r| r.uid == old_uid).collect();
        if stale.is_empty() {
            continue;
        }
        for r in stale {
            r.uid = new_uid.to_string();
        }
        let patch = json!({"metadata": {"ownerReferences": refs}});
        api.patch(&object.name_any(), &manager(), &Patch::Merge(&patch))
            .await
            .map_err(failed)?;
        wrote(ctx, plural);
    }
    Ok(())
}
