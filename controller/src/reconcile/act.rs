//! The act step: carries out a plan's actions in order, one function per action. Writes are
//! server-side applies under the operator's field manager; long work (helm, npm, pulumi) is
//! submitted to the task registry and never awaited here.

use std::time::Instant;

use common::crd::PlatformInstance;
use common::names::{
    APPLIED_HASH_ANNOTATION, FINALIZER, OWNER_SERVICE_ANNOTATION, VCLUSTER, VCLUSTER_APP,
    VCLUSTER_NETWORK_POLICY, host_namespace, kubeconfig_secret,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::error::{ReconcileError, observing};
use super::observe::Found;
use super::{Context, install_key, key, preview_key, state_path, task_keys};
use super::{control_plane, objects};
use crate::api::{Deleted, apply, delete_if_not_foreign, delete_ignoring_404, manager, not_found};
use crate::decide::Action;
use crate::decide::model::Failure;
use crate::decide::model::Mode;
use crate::decide::model::{Plan, Release, TaskError};
use crate::helm::{Helm, HelmError, RELEASE, release_from_secrets};
use crate::installer;

/// One instance being acted on.
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
    let ns = pi.namespace().unwrap_or_default();
    let name = pi.name_any();
    let host_ns = host_namespace(&ns, &name);
    let t = Target {
        ctx,
        pi,
        found,
        ns,
        name,
        host_ns,
        uid: pi.uid().unwrap_or_default(),
    };
    for action in &plan.actions {
        match action {
            Action::AddFinalizer => add_finalizer(&t).await?,
            Action::ApplyNamespace => apply_namespace(&t).await?,
            Action::InstallVCluster { recover } => install_vcluster(&t, *recover),
            Action::WriteKubeconfig => write_kubeconfig(&t).await?,
            Action::RecordOwnerService => record_owner_service(ctx, &t.host_ns).await?,
            Action::RestoreOwnerService => restore_owner_service(&t),
            Action::RelinkOwnerService { old_uid } => {
                relink_owner_references(ctx, &t.host_ns, old_uid).await?;
                record_owner_service(ctx, &t.host_ns).await?;
            }
            Action::Install { mode } => install(&t, *mode),
            Action::Preview => preview(&t),
            Action::CancelInstall => cancel_install(&t),
            Action::UninstallVCluster => {
                record_storage_node(&t).await;
                uninstall_vcluster(&t)
            }
            Action::DeleteNamespace => delete_namespace(&t).await?,
            Action::StartCleanup => start_cleanup(&t).await?,
            Action::ReplaceCleanup => replace_cleanup(&t).await?,
            Action::RemoveState => remove_state(&t)?,
            Action::DeleteKubeconfig => delete_kubeconfig(&t).await?,
            Action::RemoveFinalizer => remove_finalizer(&t).await?,
        }
    }
    Ok(())
}

/// Counts one write of `kind`.
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
        .map_err(|source| ReconcileError::AddFinalizer { source })?;
    wrote(t.ctx, "finalizer");
    Ok(())
}

async fn remove_finalizer(t: &Target<'_>) -> Result<(), ReconcileError> {
    let finalizers: Vec<String> =
        t.pi.finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
    match patch_finalizers(t, finalizers).await {
        Ok(()) => {}
        Err(e) if not_found(&e) => {}
        Err(source) => return Err(ReconcileError::RemoveFinalizer { source }),
    }
    for k in task_keys(t.pi) {
        t.ctx.tasks.forget(&k);
    }
    Ok(())
}

async fn apply_namespace(t: &Target<'_>) -> Result<(), ReconcileError> {
    let client = &t.ctx.client;
    let mut namespace =
        objects::namespace(&key(t.pi), &t.uid, &t.host_ns, t.ctx.settings.pod_security);
    let policy = objects::network_policy(&t.host_ns, &t.uid, &t.ctx.settings.operator_namespace);
    let applied = objects::namespace_hash(&namespace, &policy);
    namespace
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(APPLIED_HASH_ANNOTATION.to_string(), applied);
    apply(
        &Api::<Namespace>::all(client.clone()),
        &t.host_ns,
        &namespace,
    )
    .await
    .map_err(|source| ReconcileError::ApplyNamespace {
        what: "namespace",
        source,
    })?;
    wrote(t.ctx, "namespace");
    let policies = Api::<NetworkPolicy>::namespaced(client.clone(), &t.host_ns);
    apply(&policies, VCLUSTER_NETWORK_POLICY, &policy)
        .await
        .map_err(|source| ReconcileError::ApplyNamespace {
            what: "networkpolicy",
            source,
        })?;
    wrote(t.ctx, "networkpolicy");
    Ok(())
}

fn install_vcluster(t: &Target<'_>, recover: bool) {
    let (client, namespace) = (t.ctx.client.clone(), t.host_ns.clone());
    let guard = owner_check(t);
    let (helm, install) = chart_install(t);
    let work = async move {
        if recover {
            let secrets: Api<Secret> = Api::namespaced(client, &namespace);
            let releases = secrets
                .list(&ListParams::default().labels(&format!("owner=helm,name={RELEASE}")))
                .await
                .map_err(|e| TaskError::from(e.to_string()))?;
            if let Release::Pending(status) = release_from_secrets(&releases.items) {
                tracing::info!(%namespace, %status, "recovering an interrupted helm release");
                guard.await?;
                helm.recover(&namespace, &status)
                    .await
                    .map_err(helm_error)?;
            }
        }
        install.await
    };
    let work = timed(&t.ctx.metrics.helm_duration, "install", work);
    t.ctx.tasks.submit(&key(t.pi), true, work);
}

async fn write_kubeconfig(t: &Target<'_>) -> Result<(), ReconcileError> {
    let Some(kubeconfig) = &t.found.exported else {
        return Ok(());
    };
    let owner: Option<OwnerReference> = t.pi.controller_owner_ref(&());
    let secret = objects::kubeconfig_secret_object(&t.ns, &t.name, &t.uid, owner, kubeconfig);
    let secrets = Api::<Secret>::namespaced(t.ctx.client.clone(), &t.ns);
    apply(&secrets, &kubeconfig_secret(&t.name), &secret)
        .await
        .map_err(|source| ReconcileError::WriteKubeconfig { source })?;
    wrote(t.ctx, "secret");
    Ok(())
}

fn restore_owner_service(t: &Target<'_>) {
    tracing::warn!(instance = %key(t.pi), "service/vcluster was changed or deleted; recreating it from the chart");
    let services: Api<Service> = Api::namespaced(t.ctx.client.clone(), &t.host_ns);
    let (_, install) = chart_install(t);
    let guard = owner_check(t);
    let work = async move {
        guard.await?;
        // A three-way merge cannot always undo an edit (a changed port duplicates its name), so
        // a changed Service is deleted and the chart creates it afresh; the owner references
        // that named the old UID are relinked afterwards.
        delete_ignoring_404(&services, VCLUSTER)
            .await
            .map_err(|e| {
                TaskError::from(format!("deleting the changed service/vcluster failed: {e}"))
            })?;
        install.await
    };
    let work = timed(&t.ctx.metrics.helm_duration, "restore", work);
    t.ctx.tasks.submit(&key(t.pi), false, work);
}

fn install(t: &Target<'_>, mode: Mode) {
    let Some(config) = t.found.config.clone() else {
        return;
    };
    let job = installer::Job {
        namespace: t.ns.clone(),
        name: t.name.clone(),
        version: t.pi.spec.version.clone().unwrap_or_default(),
        mode,
        config,
        owner: t.pi.controller_owner_ref(&()),
    };
    // A failed install backs off; a new version or new settings try at once.
    let record = &t.found.record;
    if record
        .last_install
        .as_ref()
        .is_some_and(|l| l.version != job.version)
        || record.attempted_config_hash.as_ref() != Some(&job.config.hash)
    {
        t.ctx.tasks.clear_backoff(&install_key(t.pi));
    }
    let (installer, client) = (t.ctx.installer.clone(), t.ctx.client.clone());
    let work = async move { installer.install(client, job).await };
    let work = timed(&t.ctx.metrics.install_duration, mode.as_str(), work);
    t.ctx.tasks.submit(&install_key(t.pi), true, work);
}

fn preview(t: &Target<'_>) {
    let installer = t.ctx.installer.clone();
    let (namespace, instance) = (t.ns.clone(), t.name.clone());
    let version = t.found.record.installed_version.clone().unwrap_or_default();
    let work = async move { installer.preview(&namespace, &instance, &version).await };
    let work = timed(&t.ctx.metrics.install_duration, "preview", work);
    t.ctx.tasks.submit(&preview_key(t.pi), true, work);
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
    let work = timed(&t.ctx.metrics.helm_duration, "uninstall", work);
    t.ctx.tasks.submit(&key(t.pi), false, work);
}

async fn delete_namespace(t: &Target<'_>) -> Result<(), ReconcileError> {
    let namespaces = Api::<Namespace>::all(t.ctx.client.clone());
    let deleted = delete_if_not_foreign(&namespaces, &t.host_ns, &t.uid)
        .await
        .map_err(|source| ReconcileError::DeleteNamespace { source })?;
    if deleted == Deleted::Foreign {
        // Marked for another instance since it was observed: the next reconcile sees the
        // conflict and leaves it alone.
        tracing::warn!(namespace = %t.host_ns, instance = %key(t.pi), "not deleting a host namespace marked with another instance's UID");
        return Ok(());
    }
    wrote(t.ctx, "namespace");
    Ok(())
}

/// The file in the instance's state directory that names the node its vCluster ran on: the node
/// that holds its node-local storage directory.
const STORAGE_NODE_FILE: &str = "storage-node";

/// Before the vCluster goes, records the node its control plane pod runs on, so that the
/// cleanup Job runs where the storage directory is. Best effort: without it the Job is not
/// pinned.
async fn record_storage_node(t: &Target<'_>) {
    let pods: Api<Pod> = Api::namespaced(t.ctx.client.clone(), &t.host_ns);
    let listed = pods
        .list(&ListParams::default().labels(&format!("app={VCLUSTER_APP}")))
        .await;
    let node = match listed {
        Ok(list) => list
            .items
            .into_iter()
            .find_map(|p| p.spec.and_then(|s| s.node_name)),
        Err(e) => {
            tracing::warn!(host = %t.host_ns, error = %e, "listing the vCluster's pods failed; the cleanup Job will not be pinned to their node");
            None
        }
    };
    let Some(node) = node else { return };
    let dir = state_path(&t.ctx.settings, t.pi);
    if let Err(e) = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(STORAGE_NODE_FILE), &node))
    {
        tracing::warn!(dir = %dir.display(), error = %e, "recording the storage node failed");
    }
}

/// The node recorded by [`record_storage_node`], if any.
fn storage_node(t: &Target<'_>) -> Option<String> {
    let text =
        std::fs::read_to_string(state_path(&t.ctx.settings, t.pi).join(STORAGE_NODE_FILE)).ok()?;
    let node = text.trim();
    (!node.is_empty()).then(|| node.to_string())
}

async fn start_cleanup(t: &Target<'_>) -> Result<(), ReconcileError> {
    let settings = &t.ctx.settings;
    // Pinned to the node the vCluster ran on, where its node-local storage is.
    let node = storage_node(t);
    let job = objects::cleanup_job(settings, &t.host_ns, &key(t.pi), &t.uid, node.as_deref());
    let jobs: Api<Job> = Api::namespaced(t.ctx.client.clone(), &settings.cleanup_namespace);
    apply(&jobs, &t.host_ns, &job)
        .await
        .map_err(|source| ReconcileError::StartCleanup { source })?;
    wrote(t.ctx, "job");
    Ok(())
}

/// Deletes the cleanup Job of this name that another instance left (checked again here, and
/// deleted only with that Job's UID as a precondition); the next reconcile creates this
/// instance's own.
async fn replace_cleanup(t: &Target<'_>) -> Result<(), ReconcileError> {
    let jobs: Api<Job> = Api::namespaced(t.ctx.client.clone(), &t.ctx.settings.cleanup_namespace);
    let replacing = |source| ReconcileError::ReplaceCleanup { source };
    let Some(job) = jobs.get_opt(&t.host_ns).await.map_err(replacing)? else {
        return Ok(());
    };
    if crate::decide::ownership::marked(&job.metadata, &t.uid) == Some(true) {
        return Ok(());
    }
    tracing::info!(job = %t.host_ns, instance = %key(t.pi), "replacing a cleanup Job another instance left");
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: job.uid(),
            resource_version: None,
        }),
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match jobs.delete(&t.host_ns, &params).await {
        Ok(_) => {}
        Err(e) if not_found(&e) => {}
        Err(source) => return Err(replacing(source)),
    }
    wrote(t.ctx, "job");
    Ok(())
}

fn remove_state(t: &Target<'_>) -> Result<(), ReconcileError> {
    let path = state_path(&t.ctx.settings, t.pi);
    match std::fs::remove_dir_all(&path) {
        Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
            Err(ReconcileError::RemoveState { path, source })
        }
        _ => Ok(()),
    }
}

async fn delete_kubeconfig(t: &Target<'_>) -> Result<(), ReconcileError> {
    let secrets = Api::<Secret>::namespaced(t.ctx.client.clone(), &t.ns);
    let name = kubeconfig_secret(&t.name);
    let deleted = delete_if_not_foreign(&secrets, &name, &t.uid)
        .await
        .map_err(|source| ReconcileError::DeleteKubeconfig { source })?;
    if deleted == Deleted::Foreign {
        tracing::warn!(secret = %name, instance = %key(t.pi), "not deleting a kubeconfig Secret marked with another instance's UID");
    }
    Ok(())
}

/// A future that checks, when a helm task runs, that the host namespace is still the instance's
/// ([`control_plane::check_owner`]).
fn owner_check(t: &Target<'_>) -> BoxFuture<'static, Result<(), TaskError>> {
    let (client, namespace, instance, uid) = (
        t.ctx.client.clone(),
        t.host_ns.clone(),
        key(t.pi),
        t.uid.clone(),
    );
    async move {
        control_plane::check_owner(client, &namespace, &instance, &uid)
            .await
            .map_err(|e| TaskError::from(e.to_string()))
    }
    .boxed()
}

/// A helm error as a task's: a timeout keeps its reason ([`Failure::InstallTimedOut`], reported
/// as `HelmTimedOut`).
fn helm_error(e: HelmError) -> TaskError {
    match e {
        HelmError::TimedOut { .. } => TaskError::new(Failure::InstallTimedOut, e.to_string()),
        e => TaskError::from(e.to_string()),
    }
}

/// The helm driver and a future that installs or upgrades the vCluster of the target's host
/// namespace from the verified chart with the controller's values, after checking the namespace
/// is the instance's and stopping its control plane ([`control_plane::stop`]).
fn chart_install(t: &Target<'_>) -> (Helm, BoxFuture<'static, Result<(), TaskError>>) {
    let ctx = t.ctx;
    let (helm, settings, namespace) = (ctx.helm.clone(), ctx.settings.clone(), t.host_ns.clone());
    let (driver, client) = (helm.clone(), ctx.client.clone());
    let guard = owner_check(t);
    let work = async move {
        guard.await?;
        control_plane::stop(client, &namespace)
            .await
            .map_err(|e| TaskError::from(e.to_string()))?;
        let values = objects::vcluster_values(
            &settings.storage_root_base,
            &namespace,
            settings.pod_security,
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
    };
    (driver, work.boxed())
}

/// Wraps a task so its duration lands in `histogram` (Helm's or the installer's), by operation
/// and outcome.
fn timed(
    histogram: &prometheus::HistogramVec,
    operation: &'static str,
    work: impl std::future::Future<Output = Result<(), TaskError>> + Send + 'static,
) -> BoxFuture<'static, Result<(), TaskError>> {
    let histogram = histogram.clone();
    async move {
        let start = Instant::now();
        let result = work.await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        histogram
            .with_label_values(&[operation, outcome])
            .observe(start.elapsed().as_secs_f64());
        result
    }
    .boxed()
}

/// `service/vcluster` of `host_ns`, if it exists.
async fn vcluster_service(ctx: &Context, host_ns: &str) -> Result<Option<Service>, ReconcileError> {
    Api::<Service>::namespaced(ctx.client.clone(), host_ns)
        .get_opt(VCLUSTER)
        .await
        .map_err(observing("service/vcluster"))
}

/// Records `service/vcluster`'s UID and [`objects::service_hash`] on the host namespace.
async fn record_owner_service(ctx: &Context, host_ns: &str) -> Result<(), ReconcileError> {
    let Some(svc) = vcluster_service(ctx, host_ns).await? else {
        return Ok(());
    };
    let record = format!(
        "{}/{}",
        svc.metadata.uid.clone().unwrap_or_default(),
        objects::service_hash(&svc)
    );
    let patch = json!({"metadata": {"annotations": {OWNER_SERVICE_ANNOTATION: record}}});
    Api::<Namespace>::all(ctx.client.clone())
        .patch(host_ns, &manager(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ReconcileError::RecordOwnerService { source })?;
    wrote(ctx, "namespace");
    Ok(())
}

/// Points owner references that name the old `service/vcluster` UID (Secrets and ConfigMaps in
/// the host namespace) at the recreated Service.
async fn relink_owner_references(
    ctx: &Context,
    host_ns: &str,
    old_uid: &str,
) -> Result<(), ReconcileError> {
    let Some(svc) = vcluster_service(ctx, host_ns).await? else {
        return Ok(());
    };
    let new_uid = svc.metadata.uid.clone().unwrap_or_default();
    let relink = |refs: &[OwnerReference]| -> Option<serde_json::Value> {
        if !refs.iter().any(|r| r.uid == old_uid) {
            return None;
        }
        let updated: Vec<_> = refs
            .iter()
            .cloned()
            .map(|mut r| {
                if r.uid == old_uid {
                    r.uid = new_uid.clone();
                }
                r
            })
            .collect();
        Some(json!({"metadata": {"ownerReferences": updated}}))
    };
    relink_kind::<Secret>(ctx, host_ns, &relink, "secret").await?;
    relink_kind::<ConfigMap>(ctx, host_ns, &relink, "configmap").await?;
    Ok(())
}

/// Applies `relink` to every object of kind `K` in `host_ns` whose owner references need it.
async fn relink_kind<K>(
    ctx: &Context,
    host_ns: &str,
    relink: &impl Fn(&[OwnerReference]) -> Option<serde_json::Value>,
    kind: &'static str,
) -> Result<(), ReconcileError>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), host_ns);
    let failed = |source| ReconcileError::RelinkOwnerService { what: kind, source };
    for object in api
        .list(&ListParams::default())
        .await
        .map_err(failed)?
        .items
    {
        if let Some(patch) = relink(object.owner_references()) {
            api.patch(&object.name_any(), &manager(), &Patch::Merge(&patch))
                .await
                .map_err(failed)?;
            wrote(ctx, kind);
        }
    }
    Ok(())
}
