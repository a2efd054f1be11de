//! The decision's domain model: what was observed about one instance (its tasks, its Helm
//! release, the admission policy, the cleanup Job, the installer's record) and the plan the
//! decision returns. The drivers (`tasks`, `helm`, `policy`) import these types, not the
//! decisions.

use common::crd::{
    DeletionPolicy, Endpoints, HISTORY_LIMIT, HistoryEntry, InstallKind, InstallResult,
    InstallSummary, LastInstall, PendingUpgrade, Phase, RepairMode, StateBackup,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use super::status::{Cond, Kstatus};

/// Why an install runs (for messages and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Mode {
    /// The first install.
    Install,
    /// A new `spec.version`.
    Upgrade,
    /// Changed settings at the installed version.
    Reapply,
    /// Drift (or an interrupted install) put back at the installed version.
    Repair,
}

impl From<Mode> for common::crd::InstallKind {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Install => Self::Install,
            Mode::Upgrade => Self::Upgrade,
            Mode::Reapply => Self::Reapply,
            Mode::Repair => Self::Repair,
        }
    }
}

/// Why an install or preview failed: each a condition reason documented in `docs/controller.md`.
#[allow(missing_docs)]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
pub enum Failure {
    InstallFailed,
    InstallTimedOut,
    VersionNotFound,
    RegistryUnreachable,
    PackageInstallFailed,
    PassphraseMismatch,
    PassphraseUnavailable,
    StateUnavailable,
    ToolMissing,
    OutputsFailed,
    PreviewFailed,
    ProgramOutOfMemory,
    PackageInstallOutOfMemory,
    StateVolumeFull,
}

/// What a repair preview found.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// When it finished.
    pub finished_at: Time,
    /// The version previewed.
    pub version: String,
    /// Changes it would make (0: no drift).
    pub changes: i64,
    /// What it found, in words (with at most [`PREVIEW_NAMES`] resource names).
    pub message: String,
}

/// The most resource names a preview's words name.
pub const PREVIEW_NAMES: usize = 10;

/// The record.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The version of the last successful install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_version: Option<String>,
    /// The config hash the last successful install applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_config_hash: Option<String>,
    /// The last install (running, succeeded or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_install: Option<LastInstall>,
    /// Why the last install failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The config hash the last install (whatever its result) was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempted_config_hash: Option<String>,
    /// The program's outputs after the last successful install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// The last repair preview since the last install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<Preview>,
    /// Why the last repair preview failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_failure: Option<(Failure, String)>,
    /// The names of the per-membership kubeconfig Secrets the last install wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub membership_secrets: Vec<String>,
    /// The last finished runs, newest first (`status.history`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// What the last preview of an upgrade waiting for approval found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_upgrade: Option<PendingUpgrade>,
    /// The state copies taken before upgrades, newest first (`status.stateBackups`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_backups: Vec<StateBackup>,
    /// The UID of the instance whose key (`installer::state_key`) encrypts the Pulumi state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_key_uid: Option<String>,
    /// A `pulumi up` stopped part-way since the last install that succeeded (a timeout, or an
    /// install pod that ended without an outcome): the next install first drops the pending
    /// creates it may have left.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl Record {
    /// Adds the last install, finished, as a `kind` run to the history, keeping the newest
    /// [`HISTORY_LIMIT`].
    pub fn remember(&mut self, kind: InstallKind) {
        let Some(last) = &self.last_install else {
            return;
        };
        let entry = HistoryEntry {
            kind,
            version: last.version.clone(),
            result: last.result,
            started_at: last.started_at.clone(),
            finished_at: last.finished_at.clone(),
            config_hash: self.attempted_config_hash.clone(),
            summary: (last.summary.clone()).map(|s| InstallSummary {
                config_hash: None,
                ..s
            }),
        };
        self.history.insert(0, entry);
        self.history.truncate(HISTORY_LIMIT);
    }

    /// When the instance was last installed or previewed (what the repair interval counts from).
    pub fn last_checked(&self) -> Option<&Time> {
        let install = self
            .last_install
            .as_ref()
            .and_then(|l| l.finished_at.as_ref());
        install.max(self.preview.as_ref().map(|p| &p.finished_at))
    }
}

/// How a tracked task (helm, an install, a preview) ended badly: the one typed outcome the task
/// registry keeps and the decision reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TaskError {
    /// Why, when the task knows it in terms of a documented reason (installs and previews).
    pub failure: Option<Failure>,
    /// What it said, for status and logs.
    pub message: String,
    /// The run stopped part-way without an outcome of its own (its install pod killed, gone or
    /// past its deadline): a `pulumi up` in it may have left pending creates.
    pub interrupted: bool,
}

impl TaskError {
    /// A failure with a documented reason.
    pub fn new(failure: Failure, message: impl Into<String>) -> Self {
        Self {
            failure: Some(failure),
            message: message.into(),
            interrupted: false,
        }
    }

    /// This error, of a run that stopped part-way.
    pub fn interrupted(self) -> Self {
        Self {
            interrupted: true,
            ..self
        }
    }
}

impl From<String> for TaskError {
    fn from(message: String) -> Self {
        Self {
            failure: None,
            message,
            interrupted: false,
        }
    }
}

/// What a task of an instance is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TaskState {
    /// No task.
    #[default]
    Idle,
    /// Waiting for a slot: 1-based position in the queue.
    Queued(usize),
    /// Running now.
    Running,
    /// Finished with an error the task reported (cleared when a new task starts).
    Failed(TaskError),
}

/// A queue position as the status says it: exact up to 8, then the power-of-two range it is in
/// (`position 9 to 16`, `17 to 32`, ...). The status of every queued instance names its place, so
/// an exact number would change, and be written, for each of them every time the queue moved:
/// n queued instances would cost n² status writes. With ranges each changes about log2(n) times.
pub fn queue_place(position: usize) -> String {
    let high = place_bound(position);
    if high <= 8 {
        return format!("position {position}");
    }
    format!("position {} to {high}", high / 2 + 1)
}

/// The highest position [`queue_place`] names for `position` (the position itself up to 8): two
/// positions give the same words exactly when they have the same bound, so the task queue wakes
/// a queued instance only when this changes.
pub fn place_bound(position: usize) -> usize {
    if position <= 8 {
        position
    } else {
        position.next_power_of_two()
    }
}

impl TaskState {
    /// Queued or running.
    pub fn busy(&self) -> bool {
        matches!(self, TaskState::Queued(_) | TaskState::Running)
    }
}

/// The Helm release of the vCluster, as `helm status` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// No release.
    Missing,
    /// Deployed, from a chart of this version.
    Deployed {
        /// The chart version of the release.
        chart_version: String,
    },
    /// Left `pending-install`, `pending-upgrade` or `pending-rollback` by a process that died.
    Pending(String),
    /// `failed` or another status that needs a new install.
    Failed(String),
}

/// The host namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostNamespace {
    /// It does not exist.
    Missing,
    /// It belongs to someone else (named): left untouched.
    Foreign(String),
    /// It is this instance's and being deleted.
    Terminating,
    /// It is this instance's; `current`: it and its NetworkPolicy are as the controller would
    /// apply them.
    Ours {
        /// As the controller would apply it.
        current: bool,
    },
}

/// The kubeconfig the vCluster exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exported {
    /// None yet.
    Missing,
    /// Refused: it asks for more than inline server, CA, client certificate and key or token
    /// (why).
    Refused(String),
    /// Accepted; `serves`: it reached the vCluster's API (`None`: not tried).
    Accepted {
        /// It reached the vCluster's API.
        serves: Option<bool>,
    },
}

/// The instance's kubeconfig Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeconfigSecret {
    /// It holds what the vCluster exported (or, when nothing is exported, it exists).
    Current,
    /// It is missing or holds something else.
    Stale,
    /// A Secret of its name exists and is not this instance's (its UID mark and owner reference
    /// name nobody or someone else): its name. Left untouched.
    Foreign(String),
}

/// Where the cluster-wide admission policy stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Protection {
    /// Not checked yet.
    #[default]
    Unknown,
    /// The policy and its binding are in place.
    Protected,
    /// The API server serves no ValidatingAdmissionPolicy.
    Unsupported,
    /// Creating it failed.
    Failed(String),
}

/// The storage cleanup Job of a deleted instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Cleanup {
    /// Not created.
    #[default]
    Missing,
    /// A Job of that name marked with another instance's UID (or with none): left by an earlier
    /// instance of the same name. Its outcome says nothing about this instance's storage; it is
    /// replaced.
    Stale,
    /// Created, not finished.
    Running,
    /// Created, but the Job controller cannot create its pod (a `FailedCreate` Event: a quota,
    /// an admission policy); what it said.
    Blocked(String),
    /// Completed.
    Complete,
    /// Failed.
    Failed(String),
    /// Failed by running past `--cleanup-deadline` (`DeadlineExceeded`).
    TimedOut(String),
    /// Failed at once by its pod failure policy: the storage directory's owner marker names
    /// another instance.
    Conflict(String),
}

/// `service/vcluster` compared with what the controller recorded after the vCluster came up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerService {
    /// Nothing recorded yet.
    Unrecorded,
    /// As recorded.
    Matches,
    /// Deleted.
    Missing,
    /// Recreated with the recorded spec: objects owned by the old one must point at the new UID.
    Recreated {
        /// The UID the owner references still name.
        old_uid: String,
    },
}

/// The one outcome of an instance's install, folded by [`InstallOutcome::fold`] from the task
/// registry (what this controller's task is doing or how it just ended) and the record
/// `install.json` (how the last run ended, which survives a restart). The decision reads only
/// this.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum InstallOutcome {
    /// No install has run.
    #[default]
    None,
    /// An install waits for a slot: 1-based position in the queue.
    Queued(usize),
    /// An install runs now.
    Running,
    /// The last install succeeded.
    Succeeded {
        /// The version it installed.
        version: String,
        /// What it said.
        message: String,
    },
    /// The last install failed or timed out.
    Failed {
        /// The version it ran.
        version: String,
        /// Why (`failure` is `None` only for a record written before reasons were kept).
        error: TaskError,
        /// It ran past `--install-timeout`.
        timed_out: bool,
        /// The task registry holds its retry back until the backoff ends (after a restart
        /// nothing does: the retry runs at once).
        backoff: bool,
    },
    /// The record says an install runs, but no task runs it: the controller stopped mid-run.
    Interrupted {
        /// The version it ran.
        version: String,
    },
}

impl InstallOutcome {
    /// Folds the install task's state and the record into one outcome. Which channel wins:
    /// - a queued or running task wins over the record (which still shows the run before);
    /// - a failed task wins over the record, for this failure is the freshest word: its error
    ///   (reason and message) is the outcome's, the record only adds the version and whether it
    ///   timed out. The version is the record's when the record shows this run (`Running`, or
    ///   finished as failed); when the record missed the run (it could not be written), the run
    ///   was for `requested`, the version wanted now;
    /// - with no task (none ran since the controller started, or the last one succeeded), the
    ///   record speaks: its last install succeeded, failed (no backoff held: the retry runs at
    ///   once), or was left `Running`, which, with no task, means interrupted.
    ///
    /// `task` must be read before `record`: a task that finishes in between then shows as a
    /// running task over a finished record (harmless), never as an idle task over a `Running`
    /// record (which reads as an interrupted install).
    pub fn fold(task: TaskState, record: &Record, requested: &str) -> Self {
        let last = record.last_install.as_ref();
        match task {
            TaskState::Queued(position) => Self::Queued(position),
            TaskState::Running => Self::Running,
            TaskState::Failed(error) => {
                let this_run = last.filter(|l| {
                    matches!(
                        l.result,
                        InstallResult::Running | InstallResult::Failed | InstallResult::TimedOut
                    )
                });
                Self::Failed {
                    version: this_run.map_or_else(|| requested.to_string(), |l| l.version.clone()),
                    timed_out: error.failure == Some(Failure::InstallTimedOut)
                        || this_run.is_some_and(|l| l.result == InstallResult::TimedOut),
                    error,
                    backoff: true,
                }
            }
            TaskState::Idle => {
                let Some(l) = last else { return Self::None };
                let (version, message) = (l.version.clone(), l.message.clone());
                let message = message.unwrap_or_default();
                match l.result {
                    InstallResult::Running => Self::Interrupted { version },
                    InstallResult::Succeeded => Self::Succeeded { version, message },
                    InstallResult::Failed | InstallResult::TimedOut => Self::Failed {
                        version,
                        error: TaskError {
                            failure: record.failure,
                            message,
                            interrupted: false,
                        },
                        timed_out: l.result == InstallResult::TimedOut,
                        backoff: false,
                    },
                }
            }
        }
    }

    /// An install is queued or running.
    pub fn busy(&self) -> bool {
        matches!(self, Self::Queued(_) | Self::Running)
    }
}

/// A task's failed runs in a row at the instance's generation and when it retries, against
/// `--max-retries`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retry {
    /// Failed runs in a row.
    pub failures: u32,
    /// When the retry may run (`None`: now, or nothing failed).
    pub at: Option<Time>,
    /// `--max-retries` (0: no bound).
    pub max: u32,
}

impl Retry {
    /// `--max-retries` failures in a row: no retry until the spec changes or a person asks.
    pub fn exhausted(&self) -> bool {
        self.max > 0 && self.failures >= self.max
    }

    /// `failure n of m` (or `failure n` with no bound), and when the next try runs.
    pub fn words(&self) -> String {
        let (n, max) = (self.failures, self.max);
        let bound = if max > 0 {
            format!(" of --max-retries {max}")
        } else {
            String::new()
        };
        match &self.at {
            Some(at) => format!("failure {n}{bound}; the next try runs at {}", at.0),
            None => format!("failure {n}{bound}"),
        }
    }
}

/// What the installer knows about one instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstallObserved {
    /// `spec.version`.
    pub requested: String,
    /// The version the last successful install applied.
    pub installed: Option<String>,
    /// The hash of what the program would get now.
    pub desired_hash: Option<String>,
    /// The hash the last successful install applied.
    pub applied_hash: Option<String>,
    /// Why the program's config cannot be put together now (a missing client Secret).
    pub config_error: Option<String>,
    /// Why the installer's record, which exists, cannot be read (the instance stalls rather
    /// than start afresh).
    pub record_error: Option<String>,
    /// How the install stands: task and record folded into one.
    pub outcome: InstallOutcome,
    /// The repair preview task.
    pub preview_task: TaskState,
    /// What the last preview since the last install found, when it found drift.
    pub drift: Option<String>,
    /// Why the last preview failed.
    pub preview_failed: Option<String>,
    /// `--repair-interval` has passed since the last install or preview.
    pub repair_due: bool,
    /// `spec.repair.mode`: what drift the repair preview finds leads to.
    pub repair_mode: RepairMode,
    /// `spec.upgrade.approval` is `Manual` and the approve annotation does not name
    /// `spec.version`: an upgrade waits.
    pub needs_approval: bool,
    /// What the preview of `spec.version` as an upgrade found, in words, once it ran.
    pub upgrade_preview: Option<String>,
    /// The membership kubeconfig Secrets the last install wrote that are gone.
    pub missing_memberships: Vec<String>,
    /// The installer is turned off (`--install-platform=false`).
    pub disabled: bool,
    /// The instance carries `platform.di-framework.dev/allow-downgrade: "true"`.
    pub downgrade_allowed: bool,
    /// A person asked for a retry (a new value of the retry annotation): repair at once.
    pub retry_requested: bool,
    /// The install task's failures in a row.
    pub retry: Retry,
}

/// Everything observed about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// `metadata.uid`: the mark on everything the controller creates for the instance.
    pub uid: String,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `spec.suspend`: nothing but deletion runs.
    pub suspended: bool,
    /// The instance carries the operator's finalizer.
    pub has_finalizer: bool,
    /// `spec.deletionPolicy`.
    pub deletion_policy: DeletionPolicy,
    /// Why the spec cannot be acted on, if it cannot.
    pub invalid_spec: Option<String>,
    /// The host namespace's name.
    pub host_namespace: String,
    /// The host namespace.
    pub host: HostNamespace,
    /// The vCluster release.
    pub release: Release,
    /// The shipped chart's version.
    pub chart_version: String,
    /// The helm task.
    pub task: TaskState,
    /// The helm task's failures in a row.
    pub helm_retry: Retry,
    /// The vCluster control plane (the Deployment `vcluster`) has rolled out and is ready.
    pub statefulset_ready: bool,
    /// The kubeconfig the vCluster exported.
    pub exported: Exported,
    /// The instance's kubeconfig Secret.
    pub kubeconfig: KubeconfigSecret,
    /// The cluster-wide policy.
    pub protection: Protection,
    /// The cleanup Job (deletion with `Delete` only).
    pub cleanup: Cleanup,
    /// The node that holds the instance's hostPath storage.
    pub storage_node: StorageNode,
    /// The control plane's init container refused the storage directory: its owner marker
    /// names another instance (what it said).
    pub storage_conflict: Option<String>,
    /// The control plane's pod template requires the recorded storage node (true while none is
    /// recorded, or no Deployment is there).
    pub pinned: bool,
    /// The control plane's pod template runs the storage owner check (its init container;
    /// true while no Deployment is there).
    pub claims_storage: bool,
    /// The control plane's Deployment has the `Recreate` strategy the post-renderer gives it
    /// (true while no Deployment is there).
    pub recreates: bool,
    /// The control plane was deployed with the quotas wanted now (`spec.resources` or the
    /// fleet-wide default; true while no Deployment is there).
    pub policies_current: bool,
    /// The instance's state directory exists.
    pub state_exists: bool,
    /// The PersistentVolumes bound to claims in the host namespace (read while deleting with
    /// `Retain`): each name, and whether it is `Retain` already.
    pub volumes: Vec<(String, bool)>,
    /// `service/vcluster` against the record.
    pub owner_service: OwnerService,
    /// The installer's view.
    pub install: InstallObserved,
}

/// The node that holds the instance's hostPath storage, recorded (in its state directory) when
/// its control plane is first seen scheduled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StorageNode {
    /// None recorded and no control plane pod scheduled: no node holds storage of the instance.
    #[default]
    Unknown,
    /// None recorded yet; the control plane is scheduled on this node: record it.
    Scheduled(String),
    /// Recorded; `gone`: the node no longer exists (looked up only while it matters).
    Recorded {
        /// The node's name.
        node: String,
        /// The node object is gone.
        gone: bool,
    },
}

/// One thing to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Add the finalizer.
    AddFinalizer,
    /// Apply the host namespace and its NetworkPolicy.
    ApplyNamespace,
    /// Start (or queue) a helm task that recovers a pending release first when asked, then
    /// installs or upgrades the vCluster.
    InstallVCluster {
        /// Roll back or uninstall a pending release first.
        recover: bool,
    },
    /// Write the instance's kubeconfig Secret from the exported one.
    WriteKubeconfig,
    /// Record `service/vcluster`'s UID and spec hash on the host namespace.
    RecordOwnerService,
    /// Put `service/vcluster` back: run the chart again (an Event says so).
    RestoreOwnerService,
    /// Point owner references at the recreated `service/vcluster`, then record it.
    RelinkOwnerService {
        /// The UID to replace.
        old_uid: String,
    },
    /// Start (or queue) an install of the platform program at `spec.version`.
    Install {
        /// Why.
        mode: Mode,
    },
    /// Start (or queue) a refreshing preview that looks for drift.
    Preview,
    /// Start (or queue) a preview of `spec.version` as an upgrade waiting for approval.
    PreviewUpgrade,
    /// Stop the install or preview task (the instance is being deleted).
    CancelInstall,
    /// Drop the instance's tasks still waiting for a slot (it is being deleted or suspended).
    CancelHelm,
    /// Start (or queue) a helm task that uninstalls the vCluster.
    UninstallVCluster,
    /// Set these volumes (bound in the host namespace; `true`: `Retain` already) to `Retain`
    /// and record them all in the instance's state directory.
    RetainVolumes(Vec<(String, bool)>),
    /// Delete the host namespace.
    DeleteNamespace,
    /// Record the node that holds the instance's storage.
    RecordStorageNode(String),
    /// Create the storage cleanup Job, pinned to the node that holds the storage.
    StartCleanup(String),
    /// Delete a cleanup Job of that name left by another instance (checked by its UID first).
    ReplaceCleanup,
    /// Remove the instance's state directory.
    RemoveState,
    /// Delete the kubeconfig Secret.
    DeleteKubeconfig,
    /// Remove the finalizer: the instance goes away.
    RemoveFinalizer,
}

/// When to look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// At the next target poll (work is in progress elsewhere).
    Poll,
    /// After the capped backoff for a transient failure.
    Backoff,
    /// Only when something changes (plus the repair interval).
    Idle,
    /// Waiting in the task queue: woken by the queue when the task starts or its place in the
    /// status changes ([`crate::tasks::Tasks::woken`]), not polled (plus the repair interval).
    Queued,
    /// Waiting for something a watch sees (the Deployment's rollout, the exported kubeconfig):
    /// woken by that watch, not polled; looked at again after a long fallback otherwise.
    Watched,
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Actions, in order.
    pub actions: Vec<Action>,
    /// The phase to report.
    pub phase: Phase,
    /// The conditions to report.
    pub conditions: Vec<Cond>,
    /// When to look again.
    pub requeue: Requeue,
    /// The failed task the status reports (its failures and next try), if any.
    pub retry: Retry,
}

/// Builds a [`Plan`]: actions and detail conditions are added as the decision goes, and
/// [`PlanBuilder::finish`] adds the kstatus conditions with the phase and the requeue.
#[derive(Clone, Debug, Default)]
pub struct PlanBuilder {
    /// Actions so far, in order.
    pub actions: Vec<Action>,
    /// Conditions so far.
    pub conditions: Vec<Cond>,
    /// The failed task the status reports.
    pub retry: Retry,
}

impl PlanBuilder {
    /// A builder starting with `conditions`.
    pub fn with(conditions: impl IntoIterator<Item = Cond>) -> Self {
        Self {
            conditions: conditions.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Adds an action.
    pub fn act(&mut self, action: Action) -> &mut Self {
        self.actions.push(action);
        self
    }

    /// Adds a condition.
    pub fn condition(&mut self, condition: Cond) -> &mut Self {
        self.conditions.push(condition);
        self
    }

    /// The plan: the conditions so far, then `Ready`, `Reconciling` and `Stalled` from `kstatus`.
    /// The phase agrees with them: a stalled instance (it waits for a change, and kstatus
    /// computes it as Failed) is `Failed`, unless it is being deleted.
    pub fn finish(self, phase: Phase, requeue: Requeue, kstatus: Kstatus) -> Plan {
        let phase = if kstatus.stalled.is_some() && phase != Phase::Deleting {
            Phase::Failed
        } else {
            phase
        };
        let mut conditions = self.conditions;
        conditions.extend(kstatus.conditions());
        Plan {
            actions: self.actions,
            phase,
            conditions,
            requeue,
            retry: self.retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// A record whose last install ran `version` and ended with `result`.
    fn record(version: &str, result: InstallResult, failure: Option<Failure>) -> Record {
        Record {
            last_install: Some(LastInstall {
                version: version.into(),
                started_at: Time("2026-11-30T00:00:00Z".parse().expect("timestamp")),
                finished_at: None,
                result,
                message: Some(format!("recorded {result:?}")),
                summary: None,
            }),
            failure,
            ..Record::default()
        }
    }

    fn task_failed(failure: Failure, message: &str) -> TaskState {
        TaskState::Failed(TaskError::new(failure, message))
    }

    #[test]
    fn a_busy_task_wins_over_the_record() {
        let finished = record("6.0.22", InstallResult::Succeeded, None);
        assert_eq!(
            InstallOutcome::fold(TaskState::Queued(2), &finished, "6.0.23"),
            InstallOutcome::Queued(2)
        );
        assert_eq!(
            InstallOutcome::fold(TaskState::Running, &finished, "6.0.23"),
            InstallOutcome::Running,
            "a run that just started, over the record of the one before"
        );
        let failed = record(
            "6.0.22",
            InstallResult::Failed,
            Some(Failure::InstallFailed),
        );
        assert!(InstallOutcome::fold(TaskState::Running, &failed, "6.0.22").busy());
    }

    #[test]
    fn a_failed_task_wins_over_the_record_which_adds_the_version() {
        // The same run in both: the task's error, the record's version, held back.
        let rec = record(
            "6.0.21",
            InstallResult::TimedOut,
            Some(Failure::InstallTimedOut),
        );
        assert_eq!(
            InstallOutcome::fold(
                task_failed(Failure::InstallTimedOut, "from the task"),
                &rec,
                "6.0.22"
            ),
            InstallOutcome::Failed {
                version: "6.0.21".into(),
                error: TaskError::new(Failure::InstallTimedOut, "from the task"),
                timed_out: true,
                backoff: true,
            }
        );
        // The record's last write failed: it still says `Running`, which is not an interruption.
        let rec = record("6.0.21", InstallResult::Running, None);
        assert_eq!(
            InstallOutcome::fold(task_failed(Failure::InstallFailed, "boom"), &rec, "6.0.22"),
            InstallOutcome::Failed {
                version: "6.0.21".into(),
                error: TaskError::new(Failure::InstallFailed, "boom"),
                timed_out: false,
                backoff: true,
            }
        );
    }

    #[test]
    fn a_failed_run_the_record_missed_is_for_the_version_wanted_now() {
        let store = task_failed(
            Failure::StateUnavailable,
            "writing the install record failed",
        );
        let want = InstallOutcome::Failed {
            version: "6.0.23".into(),
            error: TaskError::new(
                Failure::StateUnavailable,
                "writing the install record failed",
            ),
            timed_out: false,
            backoff: true,
        };
        let before = record("6.0.22", InstallResult::Succeeded, None);
        assert_eq!(InstallOutcome::fold(store.clone(), &before, "6.0.23"), want);
        assert_eq!(
            InstallOutcome::fold(store, &Record::default(), "6.0.23"),
            want
        );
    }

    #[test]
    fn with_no_task_the_record_speaks() {
        assert_eq!(
            InstallOutcome::fold(TaskState::Idle, &Record::default(), "6.0.22"),
            InstallOutcome::None
        );
        assert_eq!(
            InstallOutcome::fold(
                TaskState::Idle,
                &record("6.0.22", InstallResult::Succeeded, None),
                "6.0.23"
            ),
            InstallOutcome::Succeeded {
                version: "6.0.22".into(),
                message: "recorded Succeeded".into(),
            }
        );
        assert_eq!(
            InstallOutcome::fold(
                TaskState::Idle,
                &record("6.0.22", InstallResult::Running, None),
                "6.0.22"
            ),
            InstallOutcome::Interrupted {
                version: "6.0.22".into()
            },
            "recorded as running with no task: the controller stopped mid-run"
        );
        // After a restart nothing holds the retry back.
        for (result, failure, timed_out) in [
            (InstallResult::Failed, Some(Failure::VersionNotFound), false),
            (
                InstallResult::TimedOut,
                Some(Failure::InstallTimedOut),
                true,
            ),
            (InstallResult::Failed, None, false),
        ] {
            assert_eq!(
                InstallOutcome::fold(
                    TaskState::Idle,
                    &record("6.0.24", result, failure),
                    "6.0.22"
                ),
                InstallOutcome::Failed {
                    version: "6.0.24".into(),
                    error: TaskError {
                        failure,
                        message: format!("recorded {result:?}"),
                        interrupted: false,
                    },
                    timed_out,
                    backoff: false,
                }
            );
        }
    }
}
