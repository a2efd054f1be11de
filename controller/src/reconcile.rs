//! The reconciler: observe one instance and what belongs to it, decide (pure, in
//! [`crate::decide`]), act with server-side apply under one field manager, then write the status
//! only when it changed, with an Event for every transition.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use common::conditions::{self as c, merge};
use common::crd::{PlatformInstance, PlatformInstanceStatus, SecretKeyRef};
use common::names::{
    APPLIED_HASH_ANNOTATION, FIELD_MANAGER, FINALIZER, HOST_NAMESPACE_LABEL, INSTANCE_ANNOTATION,
    RETRY_ANNOTATION, host_namespace, kubeconfig_secret,
};
use futures::FutureExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::decide::{
    self, Action, Cleanup, InstallObserved, LastRun, Observed, OwnerService, Plan, Protection,
    TaskState,
};
use crate::helm::{Helm, RELEASE, release_from_secrets};
use crate::installer::config::{self as program, ProgramConfig};
use crate::installer::record::Record;
use crate::installer::{self, Installer};
use crate::tasks::Tasks;

/// Errors of one reconcile; each names the failed action.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Reading something from the API failed.
    #[error("reading {what} failed: {source}")]
    Read {
        /// What was read.
        what: String,
        /// Why.
        source: kube::Error,
    },
    /// Writing something to the API failed.
    #[error("writing {what} failed: {source}")]
    Write {
        /// What was written.
        what: String,
        /// Why.
        source: kube::Error,
    },
    /// Removing the state directory failed.
    #[error("removing the state directory {path} failed: {source}; check the state volume")]
    State {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl ReconcileError {
    /// A static category for metric and event labels.
    pub fn category(&self) -> &'static str {
        match self {
            ReconcileError::Read { .. } => "read",
            ReconcileError::Write { .. } => "write",
            ReconcileError::State { .. } => "state",
        }
    }
}

fn read(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    move |source| ReconcileError::Read { what, source }
}

fn write(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    move |source| ReconcileError::Write { what, source }
}

/// What the reconciler is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Node-local root of every instance's storage (`--storage-root-base`).
    pub storage_root_base: String,
    /// How often to look at work in progress (`--target-poll`).
    pub target_poll: Duration,
    /// How often to look at an idle instance (`--repair-interval`).
    pub repair_interval: Duration,
    /// Where cleanup Jobs run (`--cleanup-namespace`).
    pub cleanup_namespace: String,
    /// The image of cleanup Jobs (`--cleanup-image`).
    pub cleanup_image: String,
    /// The operator's state root (`--state-dir`); each instance has `<namespace>/<name>` under it.
    pub state_dir: PathBuf,
    /// The namespace the operator runs in (admitted to each vCluster's API).
    pub operator_namespace: String,
    /// The verified vCluster chart.
    pub chart: PathBuf,
    /// Its version.
    pub chart_version: String,
    /// Extra values for the vCluster chart, appended after the controller's own.
    pub extra_values: Option<PathBuf>,
    /// The user the operator acts as (exempt from the service/vcluster policy).
    pub operator_user: String,
    /// Run the platform program (`--install-platform`).
    pub install_platform: bool,
}

/// Shared by every reconcile.
pub struct Context {
    /// Cluster access.
    pub client: kube::Client,
    /// Configuration.
    pub settings: Settings,
    /// The helm driver.
    pub helm: Helm,
    /// The installer (npm and pulumi).
    pub installer: Installer,
    /// Long-running work.
    pub tasks: Arc<Tasks>,
    /// The admission policy's state, kept by [`crate::policy`].
    pub protection: RwLock<Protection>,
    /// Metrics.
    pub metrics: crate::metrics::Metrics,
    /// Who reports Events.
    pub reporter: Reporter,
    /// Each instance's last reported phase, for the instances-by-phase gauge.
    pub phases: Mutex<BTreeMap<String, String>>,
    /// Host namespace → instance (`namespace`, `name`), so a change to `service/vcluster` wakes
    /// the instance that owns it.
    pub hosts: Arc<Mutex<BTreeMap<String, (String, String)>>>,
}

fn key(pi: &PlatformInstance) -> String {
    format!("{}/{}", pi.namespace().unwrap_or_default(), pi.name_any())
}

/// The task key of an instance's installs.
fn install_key(pi: &PlatformInstance) -> String {
    format!("{}#install", key(pi))
}

/// The task key of an instance's repair previews.
fn preview_key(pi: &PlatformInstance) -> String {
    format!("{}#preview", key(pi))
}

/// What observe found besides [`Observed`]: what the actions need.
struct Found {
    /// The kubeconfig the vCluster exported.
    exported: Option<String>,
    /// What the program would get now.
    config: Option<ProgramConfig>,
    /// The installer's record.
    record: Record,
}

/// Puts together what the program gets: settings, the vCluster's kubeconfig and endpoint, and
/// tenant auth's client secret read from its Secret. `Err` says what is missing.
async fn program_config(
    ctx: &Context,
    pi: &PlatformInstance,
    host_ns: &str,
    kubeconfig: &str,
) -> Result<Result<ProgramConfig, String>, ReconcileError> {
    let ns = pi.namespace().unwrap_or_default();
    let Some(endpoint) = program::kubeconfig_server(kubeconfig) else {
        return Ok(Err(
            "the vCluster's kubeconfig names no server in its current context".into(),
        ));
    };
    let platform = pi.spec.platform.as_ref();
    let mut client_secret = None;
    if let Some(auth) = platform.and_then(|p| p.tenant_auth.as_ref()) {
        let r = &auth.client_secret_ref;
        let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&r.name)
            .await
            .map_err(read(format!("the tenant auth Secret {}", r.name)))?;
        let value = secret
            .as_ref()
            .and_then(|s| s.data.as_ref()?.get(&r.key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        match (secret.is_some(), value) {
            (_, Some(v)) => client_secret = Some(v),
            (false, None) => {
                return Ok(Err(format!(
                    "the Secret {} named by spec.platform.tenantAuth.clientSecretRef does not exist in namespace {ns}; create it with the key {}",
                    r.name, r.key
                )));
            }
            (true, None) => {
                return Ok(Err(format!(
                    "the Secret {} has no key {} (spec.platform.tenantAuth.clientSecretRef.key); add the key or fix the reference",
                    r.name, r.key
                )));
            }
        }
    }
    Ok(Ok(program::program_config(&program::Inputs {
        platform,
        storage_root: format!(
            "{}/{host_ns}",
            ctx.settings.storage_root_base.trim_end_matches('/')
        ),
        kubernetes_endpoint: endpoint,
        kubeconfig: kubeconfig.to_string(),
        client_secret,
        uid: pi.uid().unwrap_or_default(),
    })))
}

/// The installer's view of one instance from its record and tasks.
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
    InstallObserved {
        requested: pi.spec.version.clone().unwrap_or_default(),
        installed: record.installed_version.clone(),
        desired_hash: config.and_then(|c| c.as_ref().ok()).map(|c| c.hash.clone()),
        applied_hash: record.installed_config_hash.clone(),
        config_error: config.and_then(|c| c.as_ref().err()).cloned(),
        task: tasks.0,
        preview_task: tasks.1,
        last: record.last_install.as_ref().map(|l| LastRun {
            version: l.version.clone(),
            result: l.result,
            failure: record.failure,
            message: l.message.clone().unwrap_or_default(),
        }),
        drift: record
            .preview
            .as_ref()
            .filter(|p| p.changes > 0)
            .map(|p| p.message.clone()),
        preview_failed: record.preview_failure.as_ref().map(|(_, m)| m.clone()),
        repair_due,
        disabled: !ctx.settings.install_platform,
        retry_requested: retry_requested(pi),
    }
}

/// The retry annotation has a value the status has not acknowledged yet.
fn retry_requested(pi: &PlatformInstance) -> bool {
    let retry = pi.annotations().get(RETRY_ANNOTATION);
    retry.is_some()
        && retry
            != pi
                .status
                .as_ref()
                .and_then(|s| s.acknowledged_retry.as_ref())
}

/// The vCluster chart's values for one instance: the exported kubeconfig names the in-cluster
/// Service, storage lives under `--storage-root-base/<host namespace>`, and the host's own
/// NetworkPolicy engine is used (`networkPolicyEngine: existing`).
pub fn vcluster_values(settings: &Settings, host_ns: &str) -> String {
    let values = json!({
        "exportKubeConfig": {"server": format!("https://vcluster.{host_ns}.svc:443")},
        "controlPlane": {"statefulSet": {"persistence": {
            "volumeClaim": {"enabled": false},
            "dataVolume": [{"name": "data", "hostPath": {"path": format!("{}/{host_ns}", settings.storage_root_base.trim_end_matches('/')), "type": "DirectoryOrCreate"}}]
        }}},
        "policies": {"networkPolicy": {"enabled": false}},
        "platformOperator": {"hostNamespace": host_ns}
    });
    serde_saphyr::to_string(&values).unwrap_or_default()
}

fn namespace_object(pi: &PlatformInstance, host_ns: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": host_ns,
            "labels": {HOST_NAMESPACE_LABEL: "true", "app.kubernetes.io/managed-by": "platform-operator"},
            "annotations": {INSTANCE_ANNOTATION: key(pi)}
        }
    })
}

fn network_policy_object(host_ns: &str, operator_ns: &str) -> serde_json::Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "vcluster-api", "namespace": host_ns, "labels": {"app.kubernetes.io/managed-by": "platform-operator"}},
        "spec": {
            "podSelector": {"matchLabels": {"app": "vcluster"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_ns}}}]},
                {"from": [{"podSelector": {}}]}
            ]
        }
    })
}

/// Annotation on the host namespace recording `service/vcluster` as `<uid>/<spec hash>`.
pub const OWNER_SERVICE_ANNOTATION: &str = "platform.di-framework.dev/vcluster-service";

/// A hash of what the chart sets on `service/vcluster`: type, ports, selector and labels.
pub fn service_hash(svc: &Service) -> String {
    let spec = svc.spec.clone().unwrap_or_default();
    hash(
        &json!({"type": spec.type_, "ports": spec.ports, "selector": spec.selector, "labels": svc.metadata.labels}),
    )
}

fn owner_service(recorded: Option<&String>, svc: Option<&Service>) -> OwnerService {
    let Some((uid, recorded_hash)) = recorded.and_then(|r| r.split_once('/')) else {
        return OwnerService::Unrecorded;
    };
    match svc {
        None => OwnerService::Missing,
        Some(s) if service_hash(s) != recorded_hash => OwnerService::Changed,
        Some(s) if s.metadata.uid.as_deref() != Some(uid) => OwnerService::Recreated {
            old_uid: uid.to_string(),
        },
        Some(_) => OwnerService::Matches,
    }
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn hash(value: &serde_json::Value) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, value.to_string().as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn state_path(settings: &Settings, pi: &PlatformInstance) -> PathBuf {
    settings
        .state_dir
        .join(pi.namespace().unwrap_or_default())
        .join(pi.name_any())
}

async fn api_serves(kubeconfig: &str) -> bool {
    let Ok(config) = kube::config::Kubeconfig::from_yaml(kubeconfig) else {
        return false;
    };
    let Ok(config) =
        kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
            .await
    else {
        return false;
    };
    let Ok(client) = kube::Client::try_from(config) else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), client.apiserver_version()).await,
        Ok(Ok(_))
    )
}

/// Observes one instance.
async fn observe(
    ctx: &Context,
    pi: &PlatformInstance,
) -> Result<(Observed, Found), ReconcileError> {
    let ns = pi.namespace().unwrap_or_default();
    let host_ns = host_namespace(&ns, &pi.name_any());
    let client = &ctx.client;

    let invalid_spec = match pi.spec.version.as_deref() {
        None => Some("spec.version is not set (the admission webhook sets it when it runs); set spec.version".to_string()),
        Some(v) => common::version::parse_exact(v).err().map(|e| format!("spec.version: {e}")),
    };

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = namespaces
        .get_opt(&host_ns)
        .await
        .map_err(read(format!("namespace {host_ns}")))?;
    let desired_hash = hash(&json!([
        namespace_object(pi, &host_ns),
        network_policy_object(&host_ns, &ctx.settings.operator_namespace)
    ]));
    let (namespace_exists, namespace_conflict, namespace_terminating, mut namespace_current) =
        match &namespace {
            None => (false, None, false, false),
            Some(n) => {
                let owner = n.annotations().get(INSTANCE_ANNOTATION).cloned();
                let conflict = owner.filter(|o| *o != key(pi));
                let terminating = n.metadata.deletion_timestamp.is_some();
                let current = n.annotations().get(APPLIED_HASH_ANNOTATION) == Some(&desired_hash);
                (true, conflict, terminating, current)
            }
        };
    let mut release = decide::Release::Missing;
    let mut owner = OwnerService::Unrecorded;
    let mut statefulset_ready = false;
    let mut exported = None;
    if namespace_exists && namespace_conflict.is_none() {
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &host_ns);
        namespace_current &= policies
            .get_opt("vcluster-api")
            .await
            .map_err(read("the host NetworkPolicy"))?
            .is_some();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &host_ns);
        let releases = secrets
            .list(&ListParams::default().labels(&format!("owner=helm,name={RELEASE}")))
            .await
            .map_err(read("the vCluster release"))?;
        release = release_from_secrets(&releases.items);
        let services: Api<Service> = Api::namespaced(client.clone(), &host_ns);
        let svc = services
            .get_opt("vcluster")
            .await
            .map_err(read("service/vcluster"))?;
        owner = owner_service(
            namespace
                .as_ref()
                .and_then(|n| n.annotations().get(OWNER_SERVICE_ANNOTATION)),
            svc.as_ref(),
        );
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &host_ns);
        statefulset_ready = sets
            .get_opt("vcluster")
            .await
            .map_err(read("the vCluster StatefulSet"))?
            .is_some_and(|s| {
                let want = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(1);
                s.status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0)
                    >= want
            });
        exported = secrets
            .get_opt(&format!("vc-{RELEASE}"))
            .await
            .map_err(read("the exported kubeconfig"))?
            .and_then(|s| {
                s.data?
                    .get("config")
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            });
    }
    let deployed = matches!(release, decide::Release::Deployed { .. });
    let api = match (&exported, deployed && statefulset_ready) {
        (Some(k), true) => Some(api_serves(k).await),
        _ => None,
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let current = secrets
        .get_opt(&kubeconfig_secret(&pi.name_any()))
        .await
        .map_err(read("the kubeconfig Secret"))?;
    let current_data = current
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get("kubeconfig").map(|b| b.0.clone()));
    let kubeconfig_current = match &exported {
        Some(k) => current_data.as_deref() == Some(k.as_bytes()),
        None => current.is_some(),
    };
    let cleanup = if pi.meta().deletion_timestamp.is_some()
        && pi.spec.deletion_policy == common::crd::DeletionPolicy::Delete
    {
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ctx.settings.cleanup_namespace);
        match jobs
            .get_opt(&host_ns)
            .await
            .map_err(read("the cleanup Job"))?
        {
            None => Cleanup::Missing,
            Some(job) => {
                let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
                if conditions
                    .iter()
                    .any(|c| c.type_ == "Complete" && c.status == "True")
                {
                    Cleanup::Complete
                } else if let Some(f) = conditions
                    .iter()
                    .find(|c| c.type_ == "Failed" && c.status == "True")
                {
                    Cleanup::Failed(f.message.clone().unwrap_or_else(|| "the Job failed".into()))
                } else {
                    Cleanup::Running
                }
            }
        }
    } else {
        Cleanup::Missing
    };
    // The tasks' states before the record: a task that finishes in between then shows as a
    // running task over a finished record (harmless), never as an idle task over a `Running`
    // record (which reads as an interrupted install).
    let tasks = (
        ctx.tasks.state(&install_key(pi)),
        ctx.tasks.state(&preview_key(pi)),
    );
    let record = ctx.installer.record(&ns, &pi.name_any());
    let config = match (&exported, api) {
        (Some(k), Some(true)) if pi.meta().deletion_timestamp.is_none() => {
            Some(program_config(ctx, pi, &host_ns, k).await?)
        }
        _ => None,
    };
    let install = install_observed(ctx, pi, tasks, &record, config.as_ref());
    let observed = Observed {
        generation: pi.meta().generation.unwrap_or(0),
        deleting: pi.meta().deletion_timestamp.is_some(),
        has_finalizer: pi.finalizers().iter().any(|f| f == FINALIZER),
        deletion_policy: pi.spec.deletion_policy,
        invalid_spec,
        host_namespace: host_ns,
        namespace_exists,
        namespace_conflict,
        namespace_terminating,
        namespace_current,
        release,
        chart_version: ctx.settings.chart_version.clone(),
        task: ctx.tasks.state(&key(pi)),
        statefulset_ready,
        exported_kubeconfig: exported.is_some(),
        api_serves: api,
        kubeconfig_current,
        protection: ctx
            .protection
            .read()
            .map(|p| p.clone())
            .unwrap_or(Protection::Unknown),
        cleanup,
        state_exists: state_path(&ctx.settings, pi).exists(),
        owner_service: owner,
        install,
    };
    Ok((
        observed,
        Found {
            exported,
            config: config.and_then(Result::ok),
            record,
        },
    ))
}

async fn apply<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    object: &serde_json::Value,
    what: &str,
) -> Result<(), ReconcileError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(write(what))?;
    ctx.metrics.writes.with_label_values(&[what]).inc();
    Ok(())
}

/// Carries out the plan's actions, in order.
async fn act(
    ctx: &Context,
    pi: &PlatformInstance,
    plan: &Plan,
    found: &Found,
) -> Result<(), ReconcileError> {
    let exported = &found.exported;
    let ns = pi.namespace().unwrap_or_default();
    let name = pi.name_any();
    let host_ns = host_namespace(&ns, &name);
    let client = &ctx.client;
    let instances: Api<PlatformInstance> = Api::namespaced(client.clone(), &ns);
    for action in &plan.actions {
        match action {
            Action::AddFinalizer => {
                let mut finalizers = pi.finalizers().to_vec();
                finalizers.push(FINALIZER.to_string());
                let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": pi.resource_version()}});
                instances
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(write("the finalizer"))?;
                ctx.metrics.writes.with_label_values(&["finalizer"]).inc();
            }
            Action::ApplyNamespace => {
                let mut namespace = namespace_object(pi, &host_ns);
                let policy = network_policy_object(&host_ns, &ctx.settings.operator_namespace);
                namespace["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] =
                    json!(hash(&json!([namespace_object(pi, &host_ns), policy])));
                apply(
                    ctx,
                    &Api::<Namespace>::all(client.clone()),
                    &host_ns,
                    &namespace,
                    "namespace",
                )
                .await?;
                apply(
                    ctx,
                    &Api::<NetworkPolicy>::namespaced(client.clone(), &host_ns),
                    "vcluster-api",
                    &policy,
                    "networkpolicy",
                )
                .await?;
            }
            Action::InstallVCluster { recover } => {
                let (client, namespace, recover) = (client.clone(), host_ns.clone(), *recover);
                let install = chart_install(ctx, &host_ns);
                let work = async move {
                    if recover {
                        let secrets: Api<Secret> = Api::namespaced(client, &namespace);
                        let releases = secrets
                            .list(
                                &ListParams::default()
                                    .labels(&format!("owner=helm,name={RELEASE}")),
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                        if let decide::Release::Pending(status) =
                            release_from_secrets(&releases.items)
                        {
                            tracing::info!(%namespace, %status, "recovering an interrupted helm release");
                            install
                                .0
                                .recover(&namespace, &status)
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                    }
                    install.1.await
                };
                ctx.tasks.submit(
                    &key(pi),
                    true,
                    timed(&ctx.metrics.helm_duration, "install", work),
                );
            }
            Action::WriteKubeconfig => {
                let Some(kubeconfig) = &exported else {
                    continue;
                };
                let owner = pi
                    .controller_owner_ref(&())
                    .map(|o| vec![o])
                    .unwrap_or_default();
                let secret = json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": kubeconfig_secret(&name), "namespace": ns, "ownerReferences": owner,
                                 "labels": {"app.kubernetes.io/managed-by": "platform-operator"}},
                    "type": "Opaque",
                    "data": {"kubeconfig": ByteString(kubeconfig.as_bytes().to_vec())}
                });
                apply(
                    ctx,
                    &Api::<Secret>::namespaced(client.clone(), &ns),
                    &kubeconfig_secret(&name),
                    &secret,
                    "secret",
                )
                .await?;
            }
            Action::RecordOwnerService => record_owner_service(ctx, &host_ns).await?,
            Action::RestoreOwnerService => {
                tracing::warn!(instance = %key(pi), "service/vcluster was changed or deleted; recreating it from the chart");
                let services: Api<Service> = Api::namespaced(client.clone(), &host_ns);
                let (_, install) = chart_install(ctx, &host_ns);
                let work = async move {
                    // A three-way merge cannot always undo an edit (a changed port duplicates its
                    // name), so a changed Service is deleted and the chart creates it afresh; the
                    // owner references that named the old UID are relinked afterwards.
                    match services.delete("vcluster", &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if not_found(&e) => {}
                        Err(e) => {
                            return Err(format!(
                                "deleting the changed service/vcluster failed: {e}"
                            ));
                        }
                    }
                    install.await
                };
                ctx.tasks.submit(
                    &key(pi),
                    false,
                    timed(&ctx.metrics.helm_duration, "restore", work),
                );
            }
            Action::RelinkOwnerService { old_uid } => {
                relink_owner_references(ctx, &host_ns, old_uid).await?;
                record_owner_service(ctx, &host_ns).await?;
            }
            Action::Install { mode } => {
                let Some(config) = found.config.clone() else {
                    continue;
                };
                let job = installer::Job {
                    namespace: ns.clone(),
                    name: name.clone(),
                    version: pi.spec.version.clone().unwrap_or_default(),
                    mode: *mode,
                    config,
                    owner: pi.controller_owner_ref(&()),
                };
                // A failed install backs off; a new version or new settings try at once.
                let last = found.record.last_install.as_ref();
                if last.is_some_and(|l| l.version != job.version)
                    || found.record.attempted_config_hash.as_ref() != Some(&job.config.hash)
                {
                    ctx.tasks.clear_backoff(&install_key(pi));
                }
                let (installer, client) = (ctx.installer.clone(), client.clone());
                let work = async move { installer.install(client, job).await };
                ctx.tasks.submit(
                    &install_key(pi),
                    true,
                    timed(&ctx.metrics.install_duration, mode.as_str(), work),
                );
            }
            Action::Preview => {
                let installer = ctx.installer.clone();
                let (namespace, instance) = (ns.clone(), name.clone());
                let version = found.record.installed_version.clone().unwrap_or_default();
                let work = async move { installer.preview(&namespace, &instance, &version).await };
                ctx.tasks.submit(
                    &preview_key(pi),
                    true,
                    timed(&ctx.metrics.install_duration, "preview", work),
                );
            }
            Action::CancelInstall => {
                for k in [install_key(pi), preview_key(pi)] {
                    if ctx.tasks.cancel(&k) {
                        tracing::info!(task = %k, "stopped an installer task: the instance is being deleted");
                    }
                }
            }
            Action::UninstallVCluster => {
                let (helm, namespace) = (ctx.helm.clone(), host_ns.clone());
                let work =
                    async move { helm.uninstall(&namespace).await.map_err(|e| e.to_string()) };
                ctx.tasks.submit(
                    &key(pi),
                    false,
                    timed(&ctx.metrics.helm_duration, "uninstall", work),
                );
            }
            Action::DeleteNamespace => {
                match Api::<Namespace>::all(client.clone())
                    .delete(&host_ns, &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(write("the host namespace deletion")(e)),
                }
                ctx.metrics.writes.with_label_values(&["namespace"]).inc();
            }
            Action::StartCleanup => {
                let job = cleanup_job(&ctx.settings, &host_ns, &key(pi));
                let jobs: Api<Job> =
                    Api::namespaced(client.clone(), &ctx.settings.cleanup_namespace);
                apply(ctx, &jobs, &host_ns, &job, "job").await?;
            }
            Action::RemoveState => {
                let path = state_path(&ctx.settings, pi);
                if let Err(source) = std::fs::remove_dir_all(&path)
                    && source.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(ReconcileError::State { path, source });
                }
            }
            Action::DeleteKubeconfig => {
                match Api::<Secret>::namespaced(client.clone(), &ns)
                    .delete(&kubeconfig_secret(&name), &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(write("the kubeconfig Secret deletion")(e)),
                }
            }
            Action::RemoveFinalizer => {
                let finalizers: Vec<String> = pi
                    .finalizers()
                    .iter()
                    .filter(|f| *f != FINALIZER)
                    .cloned()
                    .collect();
                let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": pi.resource_version()}});
                match instances
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(write("the finalizer removal")(e)),
                }
                for k in [key(pi), install_key(pi), preview_key(pi)] {
                    ctx.tasks.forget(&k);
                }
            }
        }
    }
    Ok(())
}

/// The helm driver and a future that installs or upgrades the vCluster of `host_ns` from the
/// verified chart with the controller's values.
fn chart_install(
    ctx: &Context,
    host_ns: &str,
) -> (
    Helm,
    futures::future::BoxFuture<'static, Result<(), String>>,
) {
    let (helm, settings, namespace) = (ctx.helm.clone(), ctx.settings.clone(), host_ns.to_string());
    let driver = helm.clone();
    let work = async move {
        let values = vcluster_values(&settings, &namespace);
        helm.upgrade_install(
            &namespace,
            &settings.chart,
            &settings.chart_version,
            &values,
            settings.extra_values.as_deref(),
        )
        .await
        .map_err(|e| e.to_string())
    };
    (driver, work.boxed())
}

/// Wraps a task so its duration lands in `histogram` (Helm's or the installer's), by operation
/// and outcome.
fn timed(
    histogram: &prometheus::HistogramVec,
    operation: &'static str,
    work: impl std::future::Future<Output = Result<(), String>> + Send + 'static,
) -> futures::future::BoxFuture<'static, Result<(), String>> {
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

/// Records `service/vcluster`'s UID and spec hash on the host namespace.
async fn record_owner_service(ctx: &Context, host_ns: &str) -> Result<(), ReconcileError> {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), host_ns);
    let Some(svc) = services
        .get_opt("vcluster")
        .await
        .map_err(read("service/vcluster"))?
    else {
        return Ok(());
    };
    let record = format!(
        "{}/{}",
        svc.metadata.uid.clone().unwrap_or_default(),
        service_hash(&svc)
    );
    let patch = json!({"metadata": {"annotations": {OWNER_SERVICE_ANNOTATION: record}}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    Api::<Namespace>::all(ctx.client.clone())
        .patch(host_ns, &params, &Patch::Merge(&patch))
        .await
        .map_err(write("the service record"))?;
    ctx.metrics.writes.with_label_values(&["namespace"]).inc();
    Ok(())
}

/// Points owner references that name the old `service/vcluster` UID (Secrets and ConfigMaps in
/// the host namespace) at the recreated Service.
async fn relink_owner_references(
    ctx: &Context,
    host_ns: &str,
    old_uid: &str,
) -> Result<(), ReconcileError> {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), host_ns);
    let Some(svc) = services
        .get_opt("vcluster")
        .await
        .map_err(read("service/vcluster"))?
    else {
        return Ok(());
    };
    let new_uid = svc.metadata.uid.clone().unwrap_or_default();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let relink = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| -> Option<serde_json::Value> {
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
    relink_kind::<Secret>(ctx, host_ns, &params, &relink, "secret").await?;
    relink_kind::<ConfigMap>(ctx, host_ns, &params, &relink, "configmap").await?;
    Ok(())
}

/// Applies `relink` to every object of kind `K` in `host_ns` whose owner references need it.
async fn relink_kind<K>(
    ctx: &Context,
    host_ns: &str,
    params: &PatchParams,
    relink: &impl Fn(
        &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    ) -> Option<serde_json::Value>,
    kind: &str,
) -> Result<(), ReconcileError>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), host_ns);
    for object in api
        .list(&ListParams::default())
        .await
        .map_err(read(format!("host {kind}s")))?
        .items
    {
        if let Some(patch) = relink(object.owner_references()) {
            api.patch(&object.name_any(), params, &Patch::Merge(&patch))
                .await
                .map_err(write("an owner reference"))?;
            ctx.metrics.writes.with_label_values(&[kind]).inc();
        }
    }
    Ok(())
}

/// The storage cleanup Job: mounts `--storage-root-base` and removes only this instance's
/// directory under it (a DNS label, so it cannot name anything outside).
pub fn cleanup_job(settings: &Settings, host_ns: &str, instance: &str) -> serde_json::Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": host_ns, "namespace": settings.cleanup_namespace,
                     "labels": {"app.kubernetes.io/managed-by": "platform-operator"},
                     "annotations": {INSTANCE_ANNOTATION: instance}},
        "spec": {
            "backoffLimit": 3,
            "ttlSecondsAfterFinished": 86400,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "cleanup",
                    "image": settings.cleanup_image,
                    "command": ["rm", "-rf", "--one-file-system", format!("/storage/{host_ns}")],
                    "securityContext": {"privileged": true, "runAsUser": 0},
                    "volumeMounts": [{"name": "storage", "mountPath": "/storage"}]
                }],
                "volumes": [{"name": "storage", "hostPath": {"path": settings.storage_root_base, "type": "DirectoryOrCreate"}}]
            }}
        }
    })
}

fn event_type(condition: &str, status: bool, reason: &str) -> EventType {
    const WARNINGS: [&str; 7] = [
        "DriftDetected",
        "InstallTimedOut",
        "VersionNotFound",
        "RegistryUnreachable",
        "PassphraseMismatch",
        "PassphraseUnavailable",
        "ConfigUnavailable",
    ];
    if (condition == c::STALLED && status)
        || reason.ends_with("Failed")
        || reason.ends_with("Conflict")
        || WARNINGS.contains(&reason)
    {
        EventType::Warning
    } else {
        EventType::Normal
    }
}

/// Writes the status when it differs, and an Event for every condition that changed.
async fn report(
    ctx: &Context,
    pi: &PlatformInstance,
    plan: &Plan,
    retry: Option<String>,
    record: &Record,
) -> Result<(), ReconcileError> {
    let ns = pi.namespace().unwrap_or_default();
    let name = pi.name_any();
    let old = pi.status.clone().unwrap_or_default();
    let generation = pi.meta().generation.unwrap_or(0);
    let conditions = merge(
        &old.conditions,
        &plan.conditions,
        generation,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let kubeconfig_ready = conditions
        .iter()
        .any(|c| c.type_ == c::KUBECONFIG_READY && c.status == "True");
    let status = PlatformInstanceStatus {
        phase: Some(plan.phase),
        observed_generation: Some(generation),
        version: pi.spec.version.clone(),
        host_namespace: Some(host_namespace(&ns, &name)),
        kubeconfig_secret_ref: kubeconfig_ready.then(|| SecretKeyRef {
            name: kubeconfig_secret(&name),
            key: "kubeconfig".into(),
        }),
        conditions,
        acknowledged_retry: retry.or(old.acknowledged_retry.clone()),
        installed_version: record
            .installed_version
            .clone()
            .or(old.installed_version.clone()),
        endpoints: record.endpoints.clone().or(old.endpoints.clone()),
        last_install: record.last_install.clone().or(old.last_install.clone()),
    };
    if let Ok(mut phases) = ctx.phases.lock() {
        phases.insert(key(pi), format!("{:?}", plan.phase));
    }
    if status == old {
        return Ok(());
    }
    let instances: Api<PlatformInstance> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = json!({"apiVersion": "platform.di-framework.dev/v1alpha1", "kind": "PlatformInstance", "status": status});
    instances
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(write("the instance status"))?;
    ctx.metrics.writes.with_label_values(&["status"]).inc();

    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let reference = pi.object_ref(&());
    for want in &plan.conditions {
        let before = old.conditions.iter().find(|c| c.type_ == want.type_);
        let status_str = if want.status { "True" } else { "False" };
        let changed = before.is_none_or(|b| b.status != status_str || b.reason != want.reason);
        if !changed || want.type_ == c::RECONCILING {
            continue;
        }
        let event = Event {
            type_: event_type(want.type_, want.status, want.reason),
            reason: want.reason.to_string(),
            note: Some(
                format!("{}={status_str}: {}", want.type_, want.message)
                    .chars()
                    .take(1000)
                    .collect(),
            ),
            action: want.type_.to_string(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "publishing an event failed");
        }
    }
    Ok(())
}

/// Reconciles one instance.
pub async fn reconcile(
    pi: Arc<PlatformInstance>,
    ctx: Arc<Context>,
) -> Result<Requeue, ReconcileError> {
    let timer = ctx.metrics.reconcile_duration.start_timer();
    let key = key(&pi);
    let retry = pi.annotations().get(RETRY_ANNOTATION).cloned();
    let retry_requested = retry_requested(&pi);
    if retry_requested {
        tracing::info!(instance = %key, "retry requested by annotation");
        for k in [key.clone(), install_key(&pi), preview_key(&pi)] {
            ctx.tasks.clear_backoff(&k);
        }
    }
    if let Ok(mut hosts) = ctx.hosts.lock() {
        hosts.insert(
            host_namespace(&pi.namespace().unwrap_or_default(), &pi.name_any()),
            (pi.namespace().unwrap_or_default(), pi.name_any()),
        );
    }
    let (observed, found) = observe(&ctx, &pi).await?;
    let plan = decide::decide(&observed);
    tracing::debug!(instance = %key, phase = ?plan.phase, actions = ?plan.actions, "decided");
    act(&ctx, &pi, &plan, &found).await?;
    let removed = plan.actions.contains(&Action::RemoveFinalizer);
    if !removed {
        report(
            &ctx,
            &pi,
            &plan,
            if retry_requested { retry } else { None },
            &found.record,
        )
        .await?;
    } else {
        if let Ok(mut phases) = ctx.phases.lock() {
            phases.remove(&key);
        }
        if let Ok(mut hosts) = ctx.hosts.lock() {
            hosts.retain(|_, (namespace, name)| format!("{namespace}/{name}") != key);
        }
    }
    refresh_phase_gauge(&ctx);
    ctx.metrics
        .reconciles
        .with_label_values(&["ok", "none"])
        .inc();
    timer.observe_duration();
    Ok(match plan.requeue {
        decide::Requeue::Poll => Requeue::requeue(ctx.settings.target_poll),
        decide::Requeue::Backoff => {
            let wait = [key.clone(), install_key(&pi), preview_key(&pi)]
                .iter()
                .map(|k| ctx.tasks.retry_in(k))
                .max()
                .unwrap_or_default();
            Requeue::requeue(wait.max(Duration::from_secs(1)))
        }
        decide::Requeue::Idle => Requeue::requeue(ctx.settings.repair_interval),
    })
}

fn refresh_phase_gauge(ctx: &Context) {
    let Ok(phases) = ctx.phases.lock() else {
        return;
    };
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for phase in phases.values() {
        *counts.entry(phase.as_str()).or_default() += 1;
    }
    for phase in [
        "Pending",
        "Provisioning",
        "Installing",
        "Ready",
        "Upgrading",
        "Failed",
        "Deleting",
    ] {
        ctx.metrics
            .instances
            .with_label_values(&[phase])
            .set(counts.get(phase).copied().unwrap_or(0));
    }
}

/// What to do after a failed reconcile: count it and retry after a short, fixed delay (the API
/// server or a transient error; invalid specs are not errors, they wait in `decide`).
pub fn error_policy(
    pi: Arc<PlatformInstance>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Requeue {
    tracing::warn!(instance = %key(&pi), error = %error, "reconcile failed");
    ctx.metrics
        .reconciles
        .with_label_values(&["error", error.category()])
        .inc();
    Requeue::requeue(
        Duration::from_secs(5).min(ctx.settings.target_poll.max(Duration::from_secs(1))),
    )
}

/// Keeps the admission policy in place, checking every `interval`.
pub async fn keep_policy(ctx: Arc<Context>, interval: Duration) {
    loop {
        let state = crate::policy::ensure(&ctx.client, &ctx.settings.operator_user).await;
        if let Protection::Failed(e) = &state {
            tracing::warn!(error = %e, "keeping the admission policy failed");
        }
        if let Ok(mut p) = ctx.protection.write() {
            *p = state;
        }
        tokio::time::sleep(interval).await;
    }
}
