//! The decision's domain model: what was observed about one instance (its tasks, its Helm
//! release, the admission policy, the cleanup Job, the installer's record) and the plan the
//! decision returns. The drivers (`tasks`, `helm`, `policy`) import these types, not the
//! decisions.

use common::crd::{DeletionPolicy, InstallResult, Phase};

use super::status::{Cond, Kstatus};
use crate::installer::Mode;
use crate::installer::record::Failure;

/// How a tracked task (helm, an install, a preview) ended badly: the one typed outcome the task
/// registry keeps and the decision reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TaskError {
    /// Why, when the task knows it in terms of a documented reason (installs and previews).
    pub failure: Option<Failure>,
    /// What it said, for status and logs.
    pub message: String,
}

impl TaskError {
    /// A failure with a documented reason.
    pub fn new(failure: Failure, message: impl Into<String>) -> Self {
        Self {
            failure: Some(failure),
            message: message.into(),
        }
    }
}

impl From<String> for TaskError {
    fn from(message: String) -> Self {
        Self {
            failure: None,
            message,
        }
    }
}

impl From<&str> for TaskError {
    fn from(message: &str) -> Self {
        message.to_string().into()
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

/// Where the cluster-wide admission policy stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Protection {
    /// Not checked yet.
    Unknown,
    /// The policy and its binding are in place.
    Protected,
    /// The API server serves no ValidatingAdmissionPolicy.
    Unsupported,
    /// Creating it failed.
    Failed(String),
}

/// The storage cleanup Job of a deleted instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Not created.
    Missing,
    /// Created, not finished.
    Running,
    /// Completed.
    Complete,
    /// Failed.
    Failed(String),
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
    /// Its spec or labels changed.
    Changed,
    /// Recreated with the recorded spec: objects owned by the old one must point at the new UID.
    Recreated {
        /// The UID the owner references still name.
        old_uid: String,
    },
}

/// The last install the record holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastRun {
    /// The version it ran.
    pub version: String,
    /// How it ended (`Running`: not yet, or interrupted when no task runs).
    pub result: InstallResult,
    /// Why it failed.
    pub failure: Option<Failure>,
    /// What it said.
    pub message: String,
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
    /// The install task.
    pub task: TaskState,
    /// The repair preview task.
    pub preview_task: TaskState,
    /// The last install.
    pub last: Option<LastRun>,
    /// What the last preview since the last install found, when it found drift.
    pub drift: Option<String>,
    /// Why the last preview failed.
    pub preview_failed: Option<String>,
    /// `--repair-interval` has passed since the last install or preview.
    pub repair_due: bool,
    /// The installer is turned off (`--install-platform=false`).
    pub disabled: bool,
    /// A person asked for a retry (a new value of the retry annotation): repair at once.
    pub retry_requested: bool,
}

/// Everything observed about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The instance carries the operator's finalizer.
    pub has_finalizer: bool,
    /// `spec.deletionPolicy`.
    pub deletion_policy: DeletionPolicy,
    /// Why the spec cannot be acted on, if it cannot.
    pub invalid_spec: Option<String>,
    /// The host namespace's name.
    pub host_namespace: String,
    /// The host namespace exists.
    pub namespace_exists: bool,
    /// It exists but names another instance in its annotation.
    pub namespace_conflict: Option<String>,
    /// It is being deleted.
    pub namespace_terminating: bool,
    /// The namespace and NetworkPolicy are as the controller would apply them.
    pub namespace_current: bool,
    /// The vCluster release.
    pub release: Release,
    /// The shipped chart's version.
    pub chart_version: String,
    /// The helm task.
    pub task: TaskState,
    /// The vCluster control plane (the Deployment `vcluster`) has rolled out and is ready.
    pub statefulset_ready: bool,
    /// The kubeconfig the vCluster exported, if it has.
    pub exported_kubeconfig: bool,
    /// That kubeconfig reached the vCluster's API (`None`: not tried).
    pub api_serves: Option<bool>,
    /// The instance's kubeconfig Secret holds what the vCluster exported.
    pub kubeconfig_current: bool,
    /// The cluster-wide policy.
    pub protection: Protection,
    /// The cleanup Job (deletion with `Delete` only).
    pub cleanup: Cleanup,
    /// The instance's state directory exists.
    pub state_exists: bool,
    /// `service/vcluster` against the record.
    pub owner_service: OwnerService,
    /// The installer's view.
    pub install: InstallObserved,
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
    /// Stop the install or preview task (the instance is being deleted).
    CancelInstall,
    /// Start (or queue) a helm task that uninstalls the vCluster.
    UninstallVCluster,
    /// Delete the host namespace.
    DeleteNamespace,
    /// Create the storage cleanup Job.
    StartCleanup,
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
}

/// Builds a [`Plan`]: actions and detail conditions are added as the decision goes, and
/// [`PlanBuilder::finish`] adds the kstatus conditions with the phase and the requeue.
#[derive(Clone, Debug, Default)]
pub struct PlanBuilder {
    /// Actions so far, in order.
    pub actions: Vec<Action>,
    /// Conditions so far.
    pub conditions: Vec<Cond>,
}

impl PlanBuilder {
    /// A builder starting with `conditions`.
    pub fn with(conditions: impl IntoIterator<Item = Cond>) -> Self {
        Self {
            actions: Vec::new(),
            conditions: conditions.into_iter().collect(),
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
    pub fn finish(self, phase: Phase, requeue: Requeue, kstatus: Kstatus) -> Plan {
        let mut conditions = self.conditions;
        conditions.extend(kstatus.conditions());
        Plan {
            actions: self.actions,
            phase,
            conditions,
            requeue,
        }
    }
}
