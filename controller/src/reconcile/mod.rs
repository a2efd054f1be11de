//! The reconciler: [`observe`] one instance and what belongs to it, decide (pure, in
//! [`crate::decide`]), [`act`] with server-side apply under one field manager, then [`report`]
//! the status only when it changed, with an Event for every transition.
//!
//! Only [`reader`] reads, first from the reflector stores ([`stores`]): when that needs no action
//! and leaves the status as it is, the reconcile ends there. Otherwise the instance is read again
//! from the API server and the plan made from that fresh read is carried out, so no write is
//! ever decided from a cache.

mod act;
mod control_plane;
mod error;
mod kubeconfig;
pub mod objects;
mod observe;
pub mod quota;
pub mod reader;
mod report;
pub mod stores;

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use common::crd::PlatformInstance;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::Reporter;
use kube::{Resource, ResourceExt};

pub use error::ReconcileError;
pub use objects::{cleanup_job, service_hash, vcluster_values};

use crate::decide::{self, Action, model::Protection};
use crate::helm::Helm;
use crate::installer::Installer;
use crate::tasks::Tasks;

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
    /// Retries of a cleanup Job's pod before the Job fails (`--cleanup-backoff-limit`).
    pub cleanup_backoff_limit: i32,
    /// How long a finished cleanup Job is kept (`--cleanup-ttl`).
    pub cleanup_ttl: Duration,
    /// How long a cleanup Job may run before it fails (`--cleanup-deadline`).
    pub cleanup_deadline: Duration,
    /// How long the probe of a vCluster's API may take (`--vcluster-api-timeout`).
    pub api_probe_timeout: Duration,
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
    /// The vCluster syncer's ServiceAccount in each host namespace ([`crate::policy::syncer_account`]).
    pub syncer_account: String,
    /// Run the platform program (`--install-platform`).
    pub install_platform: bool,
    /// Failed runs in a row after which an instance stops retrying (`--max-retries`; 0: never).
    pub max_retries: u32,
    /// The Pod Security level enforced inside each vCluster (`--pod-security-standard`).
    pub pod_security: crate::pod_security::Level,
    /// `--default-instance-resources`: the quotas of an instance without `spec.resources`.
    pub default_resources: Option<common::crd::InstanceResources>,
    /// The platform versions this operator installs (`--min-platform-version` to
    /// `--max-platform-version`, by `MAJOR.MINOR`).
    pub supported_versions: (common::version::Minor, common::version::Minor),
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
    /// The admission policy's state, kept by [`crate::policy::keep`].
    pub protection: RwLock<Protection>,
    /// Metrics.
    pub metrics: crate::metrics::Metrics,
    /// Who reports Events.
    pub reporter: Reporter,
    /// Failed reconciles in a row, by instance: how long [`error_policy`] waits.
    pub backoff: crate::backoff::Backoff,
    /// The reflector stores the reader reads first.
    pub stores: stores::Stores,
    /// Whether each vCluster's API serves.
    pub probes: reader::Probes,
}

/// The instance's key, `<namespace>/<name>`: its helm task's key too.
pub(crate) fn key(pi: &PlatformInstance) -> String {
    format!("{}/{}", pi.namespace().unwrap_or_default(), pi.name_any())
}

fn install_key(pi: &PlatformInstance) -> String {
    format!("{}#install", key(pi))
}

fn preview_key(pi: &PlatformInstance) -> String {
    format!("{}#preview", key(pi))
}

/// The instance (`namespace`, `name`) a task key belongs to: the inverse of [`key`] and the like.
pub fn instance_of(task_key: &str) -> Option<(&str, &str)> {
    let (namespace, name) = task_key.split_once('/')?;
    Some((
        namespace,
        name.split_once('#').map_or(name, |(name, _)| name),
    ))
}

fn task_keys(pi: &PlatformInstance) -> [String; 3] {
    [key(pi), install_key(pi), preview_key(pi)]
}

/// The file in the instance's state directory naming the node that holds its storage.
const STORAGE_NODE_FILE: &str = "storage-node";

/// The instance's state directory under `--state-dir`.
fn state_path(settings: &Settings, pi: &PlatformInstance) -> PathBuf {
    settings
        .state_dir
        .join(pi.namespace().unwrap_or_default())
        .join(pi.name_any())
}

/// Reconciles one instance.
pub async fn reconcile(
    pi: Arc<PlatformInstance>,
    ctx: Arc<Context>,
) -> Result<Requeue, ReconcileError> {
    let timer = ctx.metrics.reconcile_duration.start_timer();
    let key = key(&pi);
    let retry_ack = observe::retry_request(&pi).cloned();
    if retry_ack.is_some() {
        tracing::info!(instance = %key, "retry requested by annotation");
    }
    // Retries start over at a new generation or on request; else a count this controller has
    // not kept yet (it restarted) is the status's.
    let status = pi.status.as_ref();
    let seen = status.and_then(|s| s.observed_generation) == pi.meta().generation;
    for k in task_keys(&pi) {
        match status.and_then(|s| s.failures) {
            Some(failures) if seen && retry_ack.is_none() => ctx.tasks.resume(&k, failures),
            _ if seen && retry_ack.is_none() => {}
            _ => ctx.tasks.start_over(&k),
        }
    }
    if ctx.stores.ready() {
        let (plan, found) = plan_from(&ctx, &pi, reader::Source::Stored(&ctx.stores)).await?;
        if plan.actions.is_empty() && report::unchanged(&pi, &plan, retry_ack.clone(), &found) {
            ctx.metrics.observed.with_label_values(&["cache"]).inc();
            return Ok(finish(&ctx, &pi, &key, &plan, timer));
        }
    }
    ctx.metrics.observed.with_label_values(&["api"]).inc();
    let (plan, found) = plan_from(&ctx, &pi, reader::Source::Live).await?;
    tracing::debug!(instance = %key, phase = ?plan.phase, actions = ?plan.actions, "decided");
    if let Err(e) = act::act(&ctx, &pi, &plan, &found).await {
        // The status and an Event say what failed, not only the log and the metric.
        let failed = decide::status::act_failed(plan, &e.to_string());
        if let Err(r) = report::report(&ctx, &pi, &failed, None, &found).await {
            tracing::warn!(instance = %key, error = %r, "reporting a failed action failed");
        }
        return Err(e);
    }
    if plan.actions.contains(&Action::RemoveFinalizer) {
        // The instance goes: its last word (what was left alone) is an Event.
        let old = pi.status.clone().unwrap_or_default();
        report::publish_events(&ctx, &pi, &plan, &old).await;
        report::forget(&ctx, &key);
    } else {
        report::report(&ctx, &pi, &plan, retry_ack, &found).await?;
    }
    Ok(finish(&ctx, &pi, &key, &plan, timer))
}

/// Reads the instance's world from `source`, observes it and decides.
async fn plan_from(
    ctx: &Context,
    pi: &PlatformInstance,
    source: reader::Source<'_>,
) -> Result<(decide::Plan, observe::Found), ReconcileError> {
    let read = reader::read(ctx, pi, source).await?;
    let (observed, found) = observe::observe(pi, &ctx.settings, read, Timestamp::now());
    Ok((decide::decide(&observed), found))
}

/// The end of a successful reconcile: its metrics, and when to look again.
fn finish(
    ctx: &Context,
    pi: &PlatformInstance,
    key: &str,
    plan: &decide::Plan,
    timer: prometheus::HistogramTimer,
) -> Requeue {
    // Reset only once the status is written too: a status write that keeps failing backs off.
    ctx.backoff.succeeded(key);
    ctx.metrics
        .reconciles
        .with_label_values(&["ok", "none"])
        .inc();
    timer.observe_duration();
    let (poll, idle) = (ctx.settings.target_poll, ctx.settings.repair_interval);
    Requeue::requeue(match plan.requeue {
        decide::Requeue::Poll => poll,
        decide::Requeue::Backoff => {
            let wait = task_keys(pi).iter().map(|k| ctx.tasks.retry_in(k)).max();
            wait.unwrap_or_default().max(Duration::from_secs(1))
        }
        // What was just done is looked at on the next poll. A queued task is left to the task
        // queue and a wait on a rollout or an exported kubeconfig to their watches: both wake
        // the instance (`Tasks::woken`, the watches in main), so polling them is not needed.
        decide::Requeue::Queued | decide::Requeue::Watched if !plan.actions.is_empty() => poll,
        decide::Requeue::Queued | decide::Requeue::Idle => idle,
        decide::Requeue::Watched => watch_fallback(poll, idle),
    })
}

/// How long an instance waiting on a watch waits at most, in case the wake-up never comes:
/// thirty `--target-poll`s, within `--repair-interval`.
fn watch_fallback(target_poll: Duration, repair_interval: Duration) -> Duration {
    target_poll.saturating_mul(30).min(repair_interval)
}

/// After a failed reconcile: count it by the failed step and retry after the instance's backoff
/// ([`crate::backoff`]). Invalid specs are not errors, they wait in `decide`.
pub fn error_policy(
    pi: Arc<PlatformInstance>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Requeue {
    tracing::warn!(instance = %key(&pi), error = %error, category = error.category(), "reconcile failed");
    ctx.metrics
        .reconciles
        .with_label_values(&["error", error.category()])
        .inc();
    Requeue::requeue(ctx.backoff.failed(&key(&pi)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{instance_of, watch_fallback};

    #[test]
    fn a_wait_on_a_watch_falls_back_to_thirty_polls_within_the_repair_interval() {
        let s = Duration::from_secs;
        // The defaults: --target-poll 10s, --repair-interval 30m.
        assert_eq!(watch_fallback(s(10), s(1800)), s(300));
        // The tests and benchmarks: --target-poll 1s.
        assert_eq!(watch_fallback(s(1), s(60)), s(30));
        // Never beyond the repair interval.
        assert_eq!(watch_fallback(s(10), s(60)), s(60));
    }

    #[test]
    fn every_task_key_maps_back_to_its_instance() {
        for key in ["team/web", "team/web#install", "team/web#preview"] {
            assert_eq!(instance_of(key), Some(("team", "web")), "{key}");
        }
        assert_eq!(instance_of("no-namespace"), None);
    }
}
