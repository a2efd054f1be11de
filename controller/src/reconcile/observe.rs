//! The observe step: reads one instance's world (host namespace, NetworkPolicy, Helm release,
//! `service/vcluster`, the control plane Deployment, exported and written kubeconfigs, cleanup
//! Job, tasks, the installer's record, the program's config) into [`Observed`] for the decision,
//! plus what the actions need ([`Found`]).

use std::sync::Arc;

use common::crd::{DeletionPolicy, PlatformInstance};
use common::names::{
    ALLOW_DOWNGRADE_ANNOTATION, APPLIED_HASH_ANNOTATION, EXPORTED_KUBECONFIG_KEY,
    EXPORTED_KUBECONFIG_SECRET, FINALIZER, INSTANCE_UID_LABEL, KUBECONFIG_KEY,
    OWNER_SERVICE_ANNOTATION, RETRY_ANNOTATION, VCLUSTER, VCLUSTER_NETWORK_POLICY, host_namespace,
    kubeconfig_secret,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use super::cache::{Caches, FromKept, Kept};
use super::control_plane;
use super::error::{ReconcileError, observing};
use super::objects;
use super::vclusters::Exported;
use super::{Context, install_key, key, preview_key, state_path};
use crate::decide::model::{
    Cleanup, InstallObserved, InstallOutcome, Observed, OwnerService, Protection, Release,
    TaskState,
};
use crate::helm::{RELEASE, release_from_secrets};
use crate::installer::config::{self as program, ProgramConfig};
use crate::installer::record::Record;

/// What observe found besides [`Observed`]: what the actions need.
pub struct Found {
    /// The kubeconfig the vCluster exported.
    pub exported: Option<Arc<Exported>>,
    /// What the program would get now.
    pub config: Option<ProgramConfig>,
    /// The installer's record.
    pub record: Record,
}

/// What is in the host namespace.
#[derive(Default)]
struct Host {
    exists: bool,
    conflict: Option<String>,
    terminating: bool,
    current: bool,
    release: Option<Release>,
    owner: Option<OwnerService>,
    statefulset_ready: bool,
    exported: Option<Arc<Exported>>,
    refused: Option<String>,
}

/// Whether `meta` carries the UID mark of instance `uid`: `Some(true)` marked with it,
/// `Some(false)` marked with another, `None` unmarked.
fn marked(meta: &ObjectMeta, uid: &str) -> Option<bool> {
    meta.labels
        .as_ref()?
        .get(INSTANCE_UID_LABEL)
        .map(|mark| mark == uid)
}

/// Where observe reads the objects in the host namespace and the instance's kubeconfig Secret.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// The API server, now.
    Live,
    /// The watch caches (possibly stale: see [`super::cache`]).
    Cached(&'a Caches),
}

impl Source<'_> {
    /// Reads `name` in `namespace` (`""` for a cluster-scoped kind) from the API server or
    /// from `index` of the caches.
    async fn get<K>(
        self,
        api: impl FnOnce() -> Api<K>,
        namespace: &str,
        name: &str,
        index: fn(&Caches) -> &super::cache::Index<Kept>,
        what: &str,
    ) -> Result<Option<Arc<K>>, ReconcileError>
    where
        K: Resource<DynamicType = ()>
            + FromKept
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        match self {
            Source::Cached(caches) => Ok(index(caches)
                .get(namespace, name)
                .map(|kept| Arc::new(K::from_kept(&kept, namespace, name)))),
            Source::Live => Ok(api()
                .get_opt(name)
                .await
                .map_err(observing(what.to_string()))?
                .map(Arc::new)),
        }
    }

    /// Whether metadata-only object `name` of kind `K` exists in `namespace`.
    async fn exists<K>(
        self,
        ctx: &Context,
        namespace: &str,
        name: &str,
        index: fn(&Caches) -> &super::cache::Index<Kept>,
        what: &str,
    ) -> Result<Option<K>, ReconcileError>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + FromKept
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        match self {
            Source::Cached(caches) => Ok(index(caches)
                .get(namespace, name)
                .map(|kept| K::from_kept(&kept, namespace, name))),
            Source::Live => Api::<K>::namespaced(ctx.client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(observing(what.to_string())),
        }
    }
}

/// Observes one instance, reading from `source`.
pub async fn observe(
    ctx: &Context,
    pi: &PlatformInstance,
    source: Source<'_>,
) -> Result<(Observed, Found), ReconcileError> {
    let ns = pi.namespace().unwrap_or_default();
    let host_ns = host_namespace(&ns, &pi.name_any());
    let deleting = pi.meta().deletion_timestamp.is_some();
    let host = host(ctx, pi, &host_ns, source).await?;
    let release = host.release.clone().unwrap_or(Release::Missing);
    let api = match (
        &host.exported,
        matches!(release, Release::Deployed { .. }) && host.statefulset_ready,
    ) {
        (Some(k), true) => Some(
            ctx.vclusters
                .serves(
                    &host_ns,
                    k,
                    ctx.settings.api_probe_timeout,
                    ctx.settings.target_poll,
                )
                .await,
        ),
        _ => None,
    };
    let (kubeconfig_current, kubeconfig_conflict) =
        kubeconfig_secret_state(ctx, pi, host.exported.as_deref(), source).await?;
    let cleanup = cleanup(ctx, pi, &host_ns).await?;
    // The tasks' states before the record (see `InstallOutcome::fold`).
    let tasks = (
        ctx.tasks.state(&install_key(pi)),
        ctx.tasks.state(&preview_key(pi)),
    );
    let record = ctx.installer.record(&ns, &pi.name_any());
    // The program's config (a tenant auth Secret read, settings serialised and hashed) only
    // when the installer runs: with `--install-platform=false` the decision does not read it.
    let config = match (&host.exported, api) {
        (Some(k), Some(true)) if !deleting && ctx.settings.install_platform => {
            Some(program_config(ctx, pi, &host_ns, k).await?)
        }
        _ => None,
    };
    let observed = Observed {
        generation: pi.meta().generation.unwrap_or(0),
        uid: pi.uid().unwrap_or_default(),
        deleting,
        has_finalizer: pi.finalizers().iter().any(|f| f == FINALIZER),
        deletion_policy: pi.spec.deletion_policy,
        invalid_spec: invalid_spec(pi),
        host_namespace: host_ns,
        namespace_exists: host.exists,
        namespace_conflict: host.conflict,
        namespace_terminating: host.terminating,
        namespace_current: host.current,
        release,
        chart_version: ctx.settings.chart_version.clone(),
        task: ctx.tasks.state(&key(pi)),
        statefulset_ready: host.statefulset_ready,
        exported_kubeconfig: host.exported.is_some(),
        api_serves: api,
        kubeconfig_refused: host.refused,
        kubeconfig_current,
        kubeconfig_conflict,
        protection: ctx
            .protection
            .read()
            .map(|p| p.clone())
            .unwrap_or(Protection::Unknown),
        cleanup,
        state_exists: state_path(&ctx.settings, pi).exists(),
        owner_service: host.owner.unwrap_or(OwnerService::Unrecorded),
        install: install_observed(ctx, pi, tasks, &record, config.as_ref()),
    };
    let config = config.and_then(Result::ok);
    let exported = host.exported;
    Ok((
        observed,
        Found {
            exported,
            config,
            record,
        },
    ))
}

/// Why the spec cannot be acted on, if it cannot.
fn invalid_spec(pi: &PlatformInstance) -> Option<String> {
    match pi.spec.version.as_deref() {
        None => Some("spec.version is not set (the admission webhook sets it when it runs); set spec.version".to_string()),
        Some(v) => common::version::parse_exact(v).err().map(|e| format!("spec.version: {e}")),
    }
}

/// The host namespace and, when it is this instance's, what is in it.
async fn host(
    ctx: &Context,
    pi: &PlatformInstance,
    host_ns: &str,
    source: Source<'_>,
) -> Result<Host, ReconcileError> {
    let client = &ctx.client;
    let Some(namespace) = source
        .get(
            || Api::<Namespace>::all(client.clone()),
            "",
            host_ns,
            |c| &c.namespaces,
            &format!("namespace {host_ns}"),
        )
        .await?
    else {
        return Ok(Host::default());
    };
    let uid = pi.uid().unwrap_or_default();
    let desired = ctx.vclusters.namespace_hash(host_ns, &uid, || {
        objects::namespace_hash(
            &objects::namespace(&key(pi), &uid, host_ns, ctx.settings.pod_security),
            &objects::network_policy(host_ns, &uid, &ctx.settings.operator_namespace),
        )
    });
    let mut host = Host {
        exists: true,
        conflict: control_plane::foreign_owner(&namespace, &key(pi), &uid),
        terminating: namespace.metadata.deletion_timestamp.is_some(),
        current: namespace.annotations().get(APPLIED_HASH_ANNOTATION) == Some(&desired),
        ..Host::default()
    };
    if host.conflict.is_some() {
        return Ok(host);
    }
    host.current &= source
        .exists::<NetworkPolicy>(
            ctx,
            host_ns,
            VCLUSTER_NETWORK_POLICY,
            |c| &c.network_policies,
            "the host NetworkPolicy",
        )
        .await?
        .is_some();
    let releases = match source {
        Source::Cached(caches) => caches
            .releases
            .in_namespace(host_ns)
            .iter()
            .map(|kept| Secret::from_kept(kept, host_ns, ""))
            .collect(),
        Source::Live => {
            Api::<Secret>::namespaced(client.clone(), host_ns)
                .list(&ListParams::default().labels(&format!("owner=helm,name={RELEASE}")))
                .await
                .map_err(observing("the vCluster release"))?
                .items
        }
    };
    host.release = Some(release_from_secrets(&releases));
    let svc = source
        .exists::<Service>(ctx, host_ns, VCLUSTER, |c| &c.services, "service/vcluster")
        .await?;
    host.owner = Some(owner_service(
        namespace.annotations().get(OWNER_SERVICE_ANNOTATION),
        svc.as_ref(),
    ));
    // The caches keep of these two only what is read here (see `super::cache`).
    (host.statefulset_ready, host.exported) = match source {
        Source::Cached(caches) => (
            caches
                .deployments
                .get(host_ns, VCLUSTER)
                .is_some_and(|r| r.ready),
            caches
                .exported
                .get(host_ns, EXPORTED_KUBECONFIG_SECRET)
                .and_then(|k| k.as_ref().clone()),
        ),
        Source::Live => (
            Api::<Deployment>::namespaced(client.clone(), host_ns)
                .get_opt(VCLUSTER)
                .await
                .map_err(observing("the vCluster Deployment"))?
                .is_some_and(|d| control_plane::ready(&d)),
            Api::<Secret>::namespaced(client.clone(), host_ns)
                .get_opt(EXPORTED_KUBECONFIG_SECRET)
                .await
                .map_err(observing("the exported kubeconfig"))?
                .and_then(|s| exported_kubeconfig(&s)),
        ),
    };
    // Vetted once per exported kubeconfig (by its digest), not at every reconcile.
    if let Some(Err(refused)) = host
        .exported
        .as_deref()
        .map(|k| ctx.vclusters.vet(host_ns, k))
    {
        tracing::warn!(namespace = %host_ns, reason = %refused, "refusing the exported kubeconfig");
        host.refused = Some(refused.to_string());
        host.exported = None;
    }
    Ok(host)
}

/// The kubeconfig an exported kubeconfig Secret holds (its `config` key), if any, with its
/// digest.
pub fn exported_kubeconfig(secret: &Secret) -> Option<Arc<Exported>> {
    secret
        .data
        .as_ref()?
        .get(EXPORTED_KUBECONFIG_KEY)
        .map(|b| Arc::new(Exported::new(String::from_utf8_lossy(&b.0).into_owned())))
}

/// `service/vcluster` against the record `<uid>/<hash>` on the host namespace, by UID only
/// (records written by earlier releases hashed labels and spec; they still match while the UID
/// does), so a Service is `Missing` or `Recreated`, never `Changed` by what a chart upgrade
/// rewrites.
fn owner_service(recorded: Option<&String>, svc: Option<&Service>) -> OwnerService {
    let Some((uid, _)) = recorded.and_then(|r| r.split_once('/')) else {
        return OwnerService::Unrecorded;
    };
    match svc {
        None => OwnerService::Missing,
        Some(s) if s.metadata.uid.as_deref() != Some(uid) => OwnerService::Recreated {
            old_uid: uid.to_string(),
        },
        Some(_) => OwnerService::Matches,
    }
}

/// The instance's kubeconfig Secret: whether it holds what the vCluster exported (or, when
/// nothing is exported, exists at all), and its name when it is not this instance's.
async fn kubeconfig_secret_state(
    ctx: &Context,
    pi: &PlatformInstance,
    exported: Option<&Exported>,
    source: Source<'_>,
) -> Result<(bool, Option<String>), ReconcileError> {
    let name = kubeconfig_secret(&pi.name_any());
    let ns = pi.namespace().unwrap_or_default();
    let current = source
        .get(
            || Api::<Secret>::namespaced(ctx.client.clone(), &ns),
            &ns,
            &name,
            |c| &c.kubeconfigs,
            "the kubeconfig Secret",
        )
        .await?;
    let uid = pi.uid().unwrap_or_default();
    if current
        .as_ref()
        .is_some_and(|s| !secret_is_instances(&s.metadata, &uid))
    {
        return Ok((false, Some(name)));
    }
    let holds = |k: &Exported| {
        current.as_ref().is_some_and(|s| match source {
            // The cache keeps the kubeconfig's digest.
            Source::Cached(_) => super::cache::kubeconfig_matches(s, k),
            Source::Live => s
                .data
                .as_ref()
                .and_then(|d| d.get(KUBECONFIG_KEY))
                .is_some_and(|b| b.0 == k.text().as_bytes()),
        })
    };
    Ok((
        match exported {
            Some(k) => holds(k),
            None => current.is_some(),
        },
        None,
    ))
}

/// A kubeconfig Secret is the instance's (UID `uid`) when it carries its UID mark, or, unmarked
/// (written by an earlier release), when it has an owner reference to it.
fn secret_is_instances(meta: &ObjectMeta, uid: &str) -> bool {
    marked(meta, uid)
        .unwrap_or_else(|| meta.owner_references.iter().flatten().any(|r| r.uid == uid))
}

/// The storage cleanup Job (only looked at while deleting with `Delete`).
async fn cleanup(
    ctx: &Context,
    pi: &PlatformInstance,
    host_ns: &str,
) -> Result<Cleanup, ReconcileError> {
    if pi.meta().deletion_timestamp.is_none() || pi.spec.deletion_policy != DeletionPolicy::Delete {
        return Ok(Cleanup::Missing);
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ctx.settings.cleanup_namespace);
    let Some(job) = jobs
        .get_opt(host_ns)
        .await
        .map_err(observing("the cleanup Job"))?
    else {
        return Ok(Cleanup::Missing);
    };
    if marked(&job.metadata, &pi.uid().unwrap_or_default()) != Some(true) {
        return Ok(Cleanup::Stale);
    }
    let outcome = job_outcome(&job);
    if outcome != Cleanup::Running || job.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0 {
        return Ok(outcome);
    }
    // No pod runs: say why when the Job controller could not create one.
    let selector = format!(
        "involvedObject.kind=Job,involvedObject.name={host_ns},involvedObject.uid={},reason=FailedCreate",
        job.uid().unwrap_or_default()
    );
    let events = Api::<Event>::namespaced(ctx.client.clone(), &ctx.settings.cleanup_namespace)
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(observing("the cleanup Job's events"))?;
    Ok(events
        .items
        .iter()
        .filter_map(|e| e.message.clone())
        .next_back()
        .map_or(Cleanup::Running, Cleanup::Blocked))
}

/// What a cleanup Job's conditions say: complete, failed (past its deadline or not), or running.
fn job_outcome(job: &Job) -> Cleanup {
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let holds = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if holds("Complete").is_some() {
        Cleanup::Complete
    } else if let Some(f) = holds("Failed") {
        let message = f.message.clone().unwrap_or_else(|| "the Job failed".into());
        if f.reason.as_deref() == Some("DeadlineExceeded") {
            Cleanup::TimedOut(message)
        } else {
            Cleanup::Failed(message)
        }
    } else {
        Cleanup::Running
    }
}

/// Puts together what the program gets: settings, the vCluster's kubeconfig and endpoint, and
/// tenant auth's client secret read from its Secret. `Err` says what is missing.
async fn program_config(
    ctx: &Context,
    pi: &PlatformInstance,
    host_ns: &str,
    kubeconfig: &Exported,
) -> Result<Result<ProgramConfig, String>, ReconcileError> {
    let Some(endpoint) = ctx.vclusters.server(host_ns, kubeconfig) else {
        return Ok(Err(
            "the vCluster's kubeconfig names no server in its current context".into(),
        ));
    };
    let platform = pi.spec.platform.as_ref();
    let client_secret = match platform.and_then(|p| p.tenant_auth.as_ref()) {
        Some(auth) => match client_secret(ctx, pi, &auth.client_secret_ref).await? {
            Ok(v) => Some(v),
            Err(missing) => return Ok(Err(missing)),
        },
        None => None,
    };
    Ok(Ok(program::program_config(&program::Inputs {
        platform,
        storage_root: format!(
            "{}/{host_ns}",
            ctx.settings.storage_root_base.trim_end_matches('/')
        ),
        kubernetes_endpoint: endpoint,
        kubeconfig: kubeconfig.text().to_string(),
        client_secret,
        uid: pi.uid().unwrap_or_default(),
    })))
}

/// Tenant auth's client secret from the Secret `r` names; `Err` says what is missing.
async fn client_secret(
    ctx: &Context,
    pi: &PlatformInstance,
    r: &common::crd::SecretKeyRef,
) -> Result<Result<String, String>, ReconcileError> {
    let ns = pi.namespace().unwrap_or_default();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&r.name)
        .await
        .map_err(observing(format!("the tenant auth Secret {}", r.name)))?;
    let value = secret
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get(&r.key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    Ok(match (secret.is_some(), value) {
        (_, Some(v)) => Ok(v),
        (false, None) => Err(format!(
            "the Secret {} named by spec.platform.tenantAuth.clientSecretRef does not exist in namespace {ns}; create it with the key {}",
            r.name, r.key
        )),
        (true, None) => Err(format!(
            "the Secret {} has no key {} (spec.platform.tenantAuth.clientSecretRef.key); add the key or fix the reference",
            r.name, r.key
        )),
    })
}

/// The installer's view of one instance from its record and tasks (`tasks`: install, preview;
/// read before `record`).
fn install_observed(
    ctx: &Context,
    pi: &PlatformInstance,
    tasks: (TaskState, TaskState),
    record: &Record,
    config: Option<&Result<ProgramConfig, String>>,
) -> InstallObserved {
    let repair_due = record.installed_version.is_some()
        && record.last_checked().is_none_or(|t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t.0)
                .as_secs()
                >= ctx.settings.repair_interval.as_secs() as i64
        });
    let requested = pi.spec.version.clone().unwrap_or_default();
    InstallObserved {
        outcome: InstallOutcome::fold(tasks.0, record, &requested),
        requested,
        installed: record.installed_version.clone(),
        desired_hash: config.and_then(|c| c.as_ref().ok()).map(|c| c.hash.clone()),
        applied_hash: record.installed_config_hash.clone(),
        config_error: config.and_then(|c| c.as_ref().err()).cloned(),
        preview_task: tasks.1,
        drift: record
            .preview
            .as_ref()
            .filter(|p| p.changes > 0)
            .map(|p| p.message.clone()),
        preview_failed: record.preview_failure.as_ref().map(|(_, m)| m.clone()),
        repair_due,
        disabled: !ctx.settings.install_platform,
        downgrade_allowed: pi
            .annotations()
            .get(ALLOW_DOWNGRADE_ANNOTATION)
            .is_some_and(|v| v == "true"),
        retry_requested: retry_requested(pi),
    }
}

/// The retry annotation has a value the status has not acknowledged yet.
pub fn retry_requested(pi: &PlatformInstance) -> bool {
    let retry = pi.annotations().get(RETRY_ANNOTATION);
    retry.is_some()
        && retry
            != pi
                .status
                .as_ref()
                .and_then(|s| s.acknowledged_retry.as_ref())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::reconcile::service_hash;

    fn service(uid: &str, chart: &str, port: i32) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "vcluster", "uid": uid,
                         "labels": {"app": "vcluster", "chart": chart, "release": "vcluster", "heritage": "Helm"}},
            "spec": {"type": "ClusterIP", "selector": {"app": "vcluster", "release": "vcluster"},
                     "ports": [{"name": "https", "port": port, "targetPort": 8443, "protocol": "TCP"}]}
        }))
        .expect("service")
    }

    #[test]
    fn a_chart_upgrade_is_not_a_changed_owner_service() {
        let before = service("u-1", "vcluster-0.37.3", 443);
        // What a newer chart rewrites: the chart label, even the ports.
        let after = service("u-1", "vcluster-0.37.4", 8443);
        assert_eq!(service_hash(&before), service_hash(&after));
        let record = format!("u-1/{}", service_hash(&before));
        assert_eq!(
            owner_service(Some(&record), Some(&after)),
            OwnerService::Matches
        );
        // A record written by an earlier release (its hash covered labels and spec) still
        // matches while the UID does.
        let legacy = "u-1/0123456789abcdef".to_string();
        assert_eq!(
            owner_service(Some(&legacy), Some(&after)),
            OwnerService::Matches
        );
    }

    #[test]
    fn only_a_new_uid_or_no_service_is_drift() {
        let record = format!("u-1/{}", service_hash(&service("u-1", "c", 443)));
        assert_eq!(
            owner_service(Some(&record), Some(&service("u-2", "c", 443))),
            OwnerService::Recreated {
                old_uid: "u-1".into()
            }
        );
        assert_eq!(owner_service(Some(&record), None), OwnerService::Missing);
        assert_eq!(
            owner_service(None, Some(&service("u-1", "c", 443))),
            OwnerService::Unrecorded
        );
        assert_ne!(
            service_hash(&service("u-1", "c", 443)),
            service_hash(&service("u-2", "c", 443))
        );
    }
}
