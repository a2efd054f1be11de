//! The decide step: a pure function from what was observed about one instance to what to do and
//! what its status should say. No client, no clock, no I/O, so every phase and deletion path is
//! unit-tested.

use common::conditions::{self as c, Want};
use common::crd::{DeletionPolicy, InstallResult, Phase};

use crate::installer::Mode;
use crate::installer::record::Failure;

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
    Failed(String),
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
    /// The vCluster StatefulSet reports all replicas ready.
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
    pub conditions: Vec<Want>,
    /// When to look again.
    pub requeue: Requeue,
}

fn protection_condition(p: &Protection) -> Want {
    match p {
        Protection::Protected => Want::yes(
            c::OWNER_SERVICE_PROTECTED,
            "PolicyActive",
            "the ValidatingAdmissionPolicy platform-operator-protect-vcluster-service protects service/vcluster",
        ),
        Protection::Unsupported => Want::no(
            c::OWNER_SERVICE_PROTECTED,
            "AdmissionPoliciesUnavailable",
            "the API server serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy; service/vcluster is unprotected (Kubernetes 1.30 or later protects it); the controller repairs it if changed",
        ),
        Protection::Failed(e) => Want::no(
            c::OWNER_SERVICE_PROTECTED,
            "PolicyFailed",
            format!("creating the admission policy failed: {e}"),
        ),
        Protection::Unknown => Want::no(
            c::OWNER_SERVICE_PROTECTED,
            "PolicyPending",
            "the admission policy has not been checked yet",
        ),
    }
}

fn kstatus(
    ready: Option<(&'static str, String)>,
    reconciling: Option<(&'static str, String)>,
    stalled: Option<(&'static str, String)>,
) -> Vec<Want> {
    let mut out = Vec::new();
    match ready {
        Some((reason, message)) => out.push(Want::yes(c::READY, reason, message)),
        None => {
            let (reason, message) = stalled.clone().or_else(|| reconciling.clone()).unwrap_or((
                "Progressing",
                "the controller is working on the instance".into(),
            ));
            out.push(Want::no(c::READY, reason, message));
        }
    }
    match reconciling {
        Some((reason, message)) => out.push(Want::yes(c::RECONCILING, reason, message)),
        None => out.push(Want::no(c::RECONCILING, "Idle", "nothing to do")),
    }
    match stalled {
        Some((reason, message)) => out.push(Want::yes(c::STALLED, reason, message)),
        None => out.push(Want::no(c::STALLED, "Progressing", "not stalled")),
    }
    out
}

/// Decides what to do for an instance that is not being deleted.
pub fn decide(o: &Observed) -> Plan {
    if o.deleting {
        return decide_deletion(o);
    }
    let protection = protection_condition(&o.protection);
    if !o.has_finalizer {
        let mut conditions = kstatus(
            None,
            Some(("AddingFinalizer", "adding the finalizer".into())),
            None,
        );
        conditions.push(protection);
        return Plan {
            actions: vec![Action::AddFinalizer],
            phase: Phase::Pending,
            conditions,
            requeue: Requeue::Poll,
        };
    }
    if let Some(reason) = &o.invalid_spec {
        let mut conditions = kstatus(
            None,
            None,
            Some((
                "InvalidSpec",
                format!("{reason}; the controller waits for a change"),
            )),
        );
        conditions.push(protection);
        return Plan {
            actions: vec![],
            phase: Phase::Failed,
            conditions,
            requeue: Requeue::Idle,
        };
    }
    if let Some(other) = &o.namespace_conflict {
        let message = format!(
            "host namespace {} belongs to {other}; delete it or rename this instance",
            o.host_namespace
        );
        let mut conditions = kstatus(None, None, Some(("HostNamespaceConflict", message.clone())));
        conditions.push(Want::no(
            c::HOST_NAMESPACE_READY,
            "HostNamespaceConflict",
            message,
        ));
        conditions.push(protection);
        return Plan {
            actions: vec![],
            phase: Phase::Failed,
            conditions,
            requeue: Requeue::Idle,
        };
    }

    let mut actions = Vec::new();
    let mut conditions = vec![protection];
    if o.namespace_terminating {
        let message = format!(
            "host namespace {} is still being deleted; waiting for it to go",
            o.host_namespace
        );
        conditions.push(Want::no(
            c::HOST_NAMESPACE_READY,
            "HostNamespaceTerminating",
            message.clone(),
        ));
        conditions.extend(kstatus(
            None,
            Some(("HostNamespaceTerminating", message)),
            None,
        ));
        return Plan {
            actions,
            phase: Phase::Provisioning,
            conditions,
            requeue: Requeue::Poll,
        };
    }
    if !o.namespace_exists || !o.namespace_current {
        actions.push(Action::ApplyNamespace);
    }
    conditions.push(Want::yes(
        c::HOST_NAMESPACE_READY,
        "HostNamespaceApplied",
        format!("host namespace {} with its NetworkPolicy", o.host_namespace),
    ));

    // The vCluster release.
    let release_current = matches!(&o.release, Release::Deployed { chart_version } if *chart_version == o.chart_version);
    let idle = matches!(o.task, TaskState::Idle);
    if release_current && idle {
        match &o.owner_service {
            OwnerService::Missing | OwnerService::Changed => {
                actions.push(Action::RestoreOwnerService);
                conditions.push(Want::no(
                    c::VCLUSTER_READY,
                    "OwnerServiceRestoring",
                    "service/vcluster was changed or deleted; the controller is putting it back",
                ));
                conditions.push(Want::no(
                    c::KUBECONFIG_READY,
                    "WaitingForVCluster",
                    "the kubeconfig is written once the vCluster serves",
                ));
                conditions.push(installed_while_waiting(o));
                conditions.extend(kstatus(
                    None,
                    Some((
                        "OwnerServiceRestoring",
                        "putting service/vcluster back".to_string(),
                    )),
                    None,
                ));
                return Plan {
                    actions,
                    phase: Phase::Provisioning,
                    conditions,
                    requeue: Requeue::Poll,
                };
            }
            OwnerService::Recreated { old_uid } => actions.push(Action::RelinkOwnerService {
                old_uid: old_uid.clone(),
            }),
            OwnerService::Unrecorded | OwnerService::Matches => {}
        }
    }
    let (vcluster, requeue) = match (&o.task, &o.release) {
        (TaskState::Queued(position), _) => (
            Want::no(
                c::VCLUSTER_READY,
                "Queued",
                format!(
                    "waiting for an install slot: position {position} in the queue (--max-concurrent-installs)"
                ),
            ),
            Requeue::Poll,
        ),
        (TaskState::Running, _) => (
            Want::no(
                c::VCLUSTER_READY,
                "Installing",
                "helm is installing the vCluster".to_string(),
            ),
            Requeue::Poll,
        ),
        (TaskState::Failed(e), _) if !release_current => {
            actions.push(Action::InstallVCluster {
                recover: matches!(o.release, Release::Pending(_)),
            });
            (
                Want::no(
                    c::VCLUSTER_READY,
                    "InstallFailed",
                    format!("helm failed: {e}; retrying with backoff"),
                ),
                Requeue::Backoff,
            )
        }
        (_, Release::Pending(status)) => {
            actions.push(Action::InstallVCluster { recover: true });
            (
                Want::no(
                    c::VCLUSTER_READY,
                    "RecoveringRelease",
                    format!(
                        "the vCluster release was left {status} by an interrupted helm; recovering it"
                    ),
                ),
                Requeue::Poll,
            )
        }
        (_, Release::Missing) | (_, Release::Failed(_)) => {
            actions.push(Action::InstallVCluster { recover: false });
            (
                Want::no(
                    c::VCLUSTER_READY,
                    "Installing",
                    "installing the vCluster".to_string(),
                ),
                Requeue::Poll,
            )
        }
        (_, Release::Deployed { .. }) if !release_current => {
            actions.push(Action::InstallVCluster { recover: false });
            (
                Want::no(
                    c::VCLUSTER_READY,
                    "Upgrading",
                    format!("upgrading the vCluster to chart {}", o.chart_version),
                ),
                Requeue::Poll,
            )
        }
        (_, Release::Deployed { .. }) if !o.statefulset_ready => (
            Want::no(
                c::VCLUSTER_READY,
                "WaitingForStatefulSet",
                "waiting for the vCluster StatefulSet to be ready".to_string(),
            ),
            Requeue::Poll,
        ),
        (_, Release::Deployed { .. }) if !o.exported_kubeconfig => (
            Want::no(
                c::VCLUSTER_READY,
                "WaitingForKubeconfig",
                "waiting for the vCluster to export its kubeconfig".to_string(),
            ),
            Requeue::Poll,
        ),
        (_, Release::Deployed { .. }) if o.api_serves != Some(true) => (
            Want::no(
                c::VCLUSTER_READY,
                "WaitingForAPI",
                "waiting for the vCluster API to answer".to_string(),
            ),
            Requeue::Poll,
        ),
        (_, Release::Deployed { .. }) => (
            Want::yes(
                c::VCLUSTER_READY,
                "VClusterServing",
                "the vCluster serves its API".to_string(),
            ),
            Requeue::Idle,
        ),
    };
    let vcluster_ready = vcluster.status;
    conditions.push(vcluster);

    let kubeconfig = if !vcluster_ready {
        Want::no(
            c::KUBECONFIG_READY,
            "WaitingForVCluster",
            "the kubeconfig is written once the vCluster serves",
        )
    } else {
        if !o.kubeconfig_current {
            actions.push(Action::WriteKubeconfig);
        }
        if o.owner_service == OwnerService::Unrecorded {
            actions.push(Action::RecordOwnerService);
        }
        Want::yes(
            c::KUBECONFIG_READY,
            "KubeconfigWritten",
            "the admin kubeconfig is in the instance's kubeconfig Secret",
        )
    };
    let kubeconfig_ready = kubeconfig.status;
    conditions.push(kubeconfig);
    if kubeconfig_ready {
        let step = decide_install(&o.install, &mut actions, &mut conditions);
        // A failed install waits out its backoff (its retry is held back by the task registry
        // until then); other work is looked at on the next poll.
        let requeue = match step.requeue {
            Requeue::Backoff => Requeue::Backoff,
            Requeue::Poll => Requeue::Poll,
            Requeue::Idle if requeue != Requeue::Idle || !actions.is_empty() => Requeue::Poll,
            Requeue::Idle => Requeue::Idle,
        };
        conditions.extend(kstatus(step.ready, step.reconciling, step.stalled));
        return Plan {
            actions,
            phase: step.phase,
            conditions,
            requeue,
        };
    }
    conditions.push(installed_while_waiting(o));

    let phase = match (&o.task, o.install.installed.as_deref()) {
        (TaskState::Queued(_), _) if !o.namespace_exists => Phase::Pending,
        _ => Phase::Provisioning,
    };
    let reconciling = match phase {
        Phase::Pending => Some(("Queued", "waiting for an install slot".to_string())),
        _ => Some(("Provisioning", "the vCluster is coming up".to_string())),
    };
    conditions.extend(kstatus(None, reconciling, None));
    Plan {
        actions,
        phase,
        conditions,
        requeue,
    }
}

/// The `Installed` condition while the vCluster is not serving.
fn installed_while_waiting(o: &Observed) -> Want {
    match &o.install.installed {
        Some(v) => Want::yes(
            c::INSTALLED,
            "Installed",
            format!("{v} is installed; the installer waits for the vCluster to serve again"),
        ),
        None => Want::no(
            c::INSTALLED,
            "WaitingForVCluster",
            "the platform program runs once the vCluster serves",
        ),
    }
}

/// What the installer step decided.
struct InstallStep {
    phase: Phase,
    ready: Option<(&'static str, String)>,
    reconciling: Option<(&'static str, String)>,
    stalled: Option<(&'static str, String)>,
    requeue: Requeue,
}

/// Failures that need a person (a new version, the old passphrase, a tool): the instance is
/// stalled, though it keeps retrying with backoff.
fn needs_a_person(f: Failure) -> bool {
    matches!(
        f,
        Failure::VersionNotFound
            | Failure::PassphraseMismatch
            | Failure::PassphraseUnavailable
            | Failure::ToolMissing
            | Failure::StateUnavailable
    )
}

/// The installer's part of the plan, once the vCluster serves and the kubeconfig is written.
fn decide_install(
    i: &InstallObserved,
    actions: &mut Vec<Action>,
    conditions: &mut Vec<Want>,
) -> InstallStep {
    if i.disabled {
        let message =
            "the platform program is not run: the controller runs with --install-platform=false";
        conditions.push(Want::no(c::INSTALLED, "InstallerDisabled", message));
        return InstallStep {
            phase: Phase::Installing,
            ready: None,
            reconciling: Some(("InstallerDisabled", message.to_string())),
            stalled: None,
            requeue: Requeue::Idle,
        };
    }
    let requested = i.requested.as_str();
    let installed = i.installed.as_deref();
    let at_requested = installed == Some(requested);
    let phase = match installed {
        None => Phase::Installing,
        Some(v) if v != requested => Phase::Upgrading,
        Some(_) => Phase::Ready,
    };
    let mode = match installed {
        None => Mode::Install,
        Some(v) if v != requested => Mode::Upgrade,
        Some(_) => Mode::Reapply,
    };
    let what = match phase {
        Phase::Upgrading => format!(
            "upgrading from {} to {requested}",
            installed.unwrap_or("none")
        ),
        Phase::Installing => format!("installing {requested}"),
        _ => format!("re-applying {requested}"),
    };
    let drift_condition = |drift: &Option<String>| match drift {
        Some(message) => Want::yes(
            c::DRIFT_DETECTED,
            "DriftDetected",
            format!(
                "the repair preview found {message}; an install at the installed version puts it back"
            ),
        ),
        None => Want::no(
            c::DRIFT_DETECTED,
            "NoDrift",
            "the last install or repair preview found the platform as installed",
        ),
    };
    if installed.is_some() {
        conditions.push(drift_condition(&i.drift));
    }
    let busy = |state: &TaskState| matches!(state, TaskState::Queued(_) | TaskState::Running);

    // Work in progress.
    if busy(&i.task) {
        let (reason, message) = match &i.task {
            TaskState::Queued(position) => (
                "Queued",
                format!(
                    "{what}: waiting for an install slot, position {position} in the queue (--max-concurrent-installs)"
                ),
            ),
            _ => ("Installing", format!("{what}: npm and pulumi are running")),
        };
        conditions.push(if at_requested && i.applied_hash.is_some() {
            Want::yes(
                c::INSTALLED,
                "Installed",
                format!("{requested} is installed; {message}"),
            )
        } else {
            Want::no(c::INSTALLED, reason, message.clone())
        });
        let ready = (phase == Phase::Ready)
            .then(|| ("Installed", format!("{requested} is installed and serving")));
        return InstallStep {
            phase,
            ready,
            reconciling: Some((reason, message)),
            stalled: None,
            requeue: Requeue::Poll,
        };
    }
    if busy(&i.preview_task) {
        conditions.push(Want::yes(
            c::INSTALLED,
            "Installed",
            format!("{requested} is installed"),
        ));
        return InstallStep {
            phase,
            ready: (phase == Phase::Ready)
                .then(|| ("Installed", format!("{requested} is installed and serving"))),
            reconciling: Some((
                "CheckingDrift",
                "a refreshing preview looks for drift".into(),
            )),
            stalled: None,
            requeue: Requeue::Poll,
        };
    }
    if let Some(e) = &i.config_error {
        let message = format!("{e}; the installer waits for it");
        conditions.push(Want::no(c::INSTALLED, "ConfigUnavailable", message.clone()));
        return InstallStep {
            phase,
            ready: None,
            reconciling: None,
            stalled: Some(("ConfigUnavailable", message)),
            requeue: Requeue::Poll,
        };
    }

    // What the last install says, when it concerns the version wanted now.
    let last = i.last.as_ref().filter(|l| l.version == requested);
    let interrupted = last.is_some_and(|l| l.result == InstallResult::Running);
    let failed = last.and_then(|l| l.failure.map(|f| (f, l.message.clone())));
    let backing_off = matches!(i.task, TaskState::Failed(_));
    // No task runs here, so a last run that is not `Succeeded` did not finish well.
    let unsettled = i
        .last
        .as_ref()
        .filter(|l| l.result != InstallResult::Succeeded);
    let hash_differs = i.desired_hash.is_some() && i.desired_hash != i.applied_hash;

    let need = if interrupted {
        Some((
            "Resuming",
            format!(
                "{what}: the last run was interrupted (the controller stopped); running it again"
            ),
        ))
    } else if !at_requested || hash_differs {
        Some(("Installing", what.clone()))
    } else if let Some(l) = unsettled {
        // A run that failed, timed out or was interrupted (at any version: spec.version may
        // have been set back to the installed one) left the workspace, the stack's config and
        // perhaps the cluster part-way: put the installed version back at once.
        Some((
            "Repairing",
            format!(
                "the last run ({} of {}) did not succeed; installing {requested} again",
                match l.result {
                    InstallResult::Running => "interrupted",
                    InstallResult::TimedOut => "timed out",
                    _ => "failed",
                },
                l.version
            ),
        ))
    } else if let Some(drift) = &i.drift {
        Some((
            "Repairing",
            format!("the repair preview found {drift}; installing {requested} again"),
        ))
    } else if let Some(e) = &i.preview_failed {
        Some((
            "Repairing",
            format!("the repair preview failed ({e}); installing {requested} again"),
        ))
    } else if i.retry_requested {
        Some((
            "Repairing",
            format!(
                "a retry was requested (annotation platform.di-framework.dev/retry); installing {requested} again"
            ),
        ))
    } else {
        None
    };
    if let Some((reason, message)) = need {
        let mode = if reason == "Repairing" || interrupted && at_requested {
            Mode::Repair
        } else {
            mode
        };
        actions.push(Action::Install { mode });
        if let Some((failure, error)) = failed.filter(|_| !interrupted) {
            let text = match installed {
                Some(v) if v != requested => {
                    format!("{what} failed: {error}; {v} stays installed; retrying with backoff")
                }
                _ => format!("{what} failed: {error}; retrying with backoff"),
            };
            conditions.push(Want::no(c::INSTALLED, failure.reason(), text.clone()));
            let stalled = needs_a_person(failure).then(|| (failure.reason(), text.clone()));
            let reconciling = (!needs_a_person(failure)).then(|| (failure.reason(), text));
            return InstallStep {
                phase,
                ready: None,
                reconciling,
                stalled,
                requeue: if backing_off {
                    Requeue::Backoff
                } else {
                    Requeue::Poll
                },
            };
        }
        if at_requested && !hash_differs {
            conditions.push(Want::yes(
                c::INSTALLED,
                "Installed",
                format!("{requested} is installed; {message}"),
            ));
        } else {
            conditions.push(Want::no(c::INSTALLED, reason, message.clone()));
        }
        return InstallStep {
            phase,
            ready: None,
            reconciling: Some((reason, message)),
            stalled: None,
            requeue: Requeue::Poll,
        };
    }

    // Installed as wanted.
    let message = i
        .last
        .as_ref()
        .filter(|l| l.result == InstallResult::Succeeded)
        .map(|l| l.message.clone())
        .unwrap_or_else(|| format!("{requested} is installed"));
    conditions.push(Want::yes(c::INSTALLED, "Installed", message));
    if i.repair_due {
        actions.push(Action::Preview);
        return InstallStep {
            phase: Phase::Ready,
            ready: Some(("Installed", format!("{requested} is installed and serving"))),
            reconciling: Some((
                "CheckingDrift",
                "a refreshing preview looks for drift".into(),
            )),
            stalled: None,
            requeue: Requeue::Poll,
        };
    }
    InstallStep {
        phase: Phase::Ready,
        ready: Some(("Installed", format!("{requested} is installed and serving"))),
        reconciling: None,
        stalled: None,
        requeue: Requeue::Idle,
    }
}

/// Decides the next deletion step, honouring `deletionPolicy`.
pub fn decide_deletion(o: &Observed) -> Plan {
    let protection = protection_condition(&o.protection);
    if !o.has_finalizer {
        return Plan {
            actions: vec![],
            phase: Phase::Deleting,
            conditions: vec![protection],
            requeue: Requeue::Idle,
        };
    }
    let mut actions = Vec::new();
    let mut conditions = vec![protection];
    let step = |reason: &'static str, message: String| kstatus(None, Some((reason, message)), None);
    if [&o.install.task, &o.install.preview_task]
        .iter()
        .any(|t| matches!(t, TaskState::Queued(_) | TaskState::Running))
    {
        actions.push(Action::CancelInstall);
    }

    // 1. Stop what runs: the vCluster release, then the host namespace.
    match (&o.task, &o.release) {
        (TaskState::Queued(_) | TaskState::Running, _) => {
            conditions.extend(step(
                "UninstallingVCluster",
                "waiting for helm to finish with the vCluster".into(),
            ));
            return Plan {
                actions,
                phase: Phase::Deleting,
                conditions,
                requeue: Requeue::Poll,
            };
        }
        (
            TaskState::Failed(e),
            Release::Deployed { .. } | Release::Pending(_) | Release::Failed(_),
        ) => {
            actions.push(Action::UninstallVCluster);
            conditions.extend(kstatus(
                None,
                Some((
                    "UninstallFailed",
                    format!("helm uninstall failed: {e}; retrying"),
                )),
                None,
            ));
            return Plan {
                actions,
                phase: Phase::Deleting,
                conditions,
                requeue: Requeue::Backoff,
            };
        }
        (_, Release::Deployed { .. } | Release::Pending(_) | Release::Failed(_)) => {
            actions.push(Action::UninstallVCluster);
            conditions.extend(step(
                "UninstallingVCluster",
                "uninstalling the vCluster".into(),
            ));
            return Plan {
                actions,
                phase: Phase::Deleting,
                conditions,
                requeue: Requeue::Poll,
            };
        }
        (_, Release::Missing) => {}
    }
    if o.namespace_exists {
        if !o.namespace_terminating {
            actions.push(Action::DeleteNamespace);
        }
        conditions.extend(step(
            "DeletingHostNamespace",
            format!("waiting for host namespace {} to go", o.host_namespace),
        ));
        return Plan {
            actions,
            phase: Phase::Deleting,
            conditions,
            requeue: Requeue::Poll,
        };
    }

    // 2. With Delete, remove the storage and the state; Retain keeps both.
    if o.deletion_policy == DeletionPolicy::Delete {
        match &o.cleanup {
            Cleanup::Missing => {
                actions.push(Action::StartCleanup);
                conditions.extend(step(
                    "CleaningStorage",
                    "running the storage cleanup Job".into(),
                ));
                return Plan {
                    actions,
                    phase: Phase::Deleting,
                    conditions,
                    requeue: Requeue::Poll,
                };
            }
            Cleanup::Running => {
                conditions.extend(step(
                    "CleaningStorage",
                    "waiting for the storage cleanup Job to complete".into(),
                ));
                return Plan {
                    actions,
                    phase: Phase::Deleting,
                    conditions,
                    requeue: Requeue::Poll,
                };
            }
            Cleanup::Failed(e) => {
                let message = format!(
                    "the storage cleanup Job failed ({e}); the instance's storage directory is left; read the Job's logs, fix it and delete the Job to retry"
                );
                conditions.extend(kstatus(None, None, Some(("CleanupFailed", message))));
                return Plan {
                    actions,
                    phase: Phase::Deleting,
                    conditions,
                    requeue: Requeue::Backoff,
                };
            }
            Cleanup::Complete => {}
        }
        if o.state_exists {
            actions.push(Action::RemoveState);
        }
        if o.kubeconfig_current || o.exported_kubeconfig {
            actions.push(Action::DeleteKubeconfig);
        }
    }
    actions.push(Action::RemoveFinalizer);
    conditions.extend(step(
        "Finalizing",
        "everything is cleaned up; removing the finalizer".into(),
    ));
    Plan {
        actions,
        phase: Phase::Deleting,
        conditions,
        requeue: Requeue::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Observed {
        Observed {
            generation: 1,
            deleting: false,
            has_finalizer: true,
            deletion_policy: DeletionPolicy::Retain,
            invalid_spec: None,
            host_namespace: "pi-team-a-one-12345678".into(),
            namespace_exists: true,
            namespace_conflict: None,
            namespace_terminating: false,
            namespace_current: true,
            release: Release::Deployed {
                chart_version: "0.37.3".into(),
            },
            chart_version: "0.37.3".into(),
            task: TaskState::Idle,
            statefulset_ready: true,
            exported_kubeconfig: true,
            api_serves: Some(true),
            kubeconfig_current: true,
            protection: Protection::Protected,
            cleanup: Cleanup::Missing,
            state_exists: true,
            owner_service: OwnerService::Matches,
            install: InstallObserved {
                requested: "6.0.22".into(),
                installed: Some("6.0.22".into()),
                desired_hash: Some("sha256:aaaa".into()),
                applied_hash: Some("sha256:aaaa".into()),
                last: Some(LastRun {
                    version: "6.0.22".into(),
                    result: InstallResult::Succeeded,
                    failure: None,
                    message: "install of @di-framework/platform@6.0.22 applied".into(),
                }),
                ..InstallObserved::default()
            },
        }
    }

    /// A serving vCluster whose platform is not installed yet.
    fn fresh() -> Observed {
        Observed {
            install: InstallObserved {
                requested: "6.0.22".into(),
                desired_hash: Some("sha256:aaaa".into()),
                ..InstallObserved::default()
            },
            ..base()
        }
    }

    fn with_install(f: impl FnOnce(&mut InstallObserved)) -> Observed {
        let mut o = base();
        f(&mut o.install);
        o
    }

    fn cond(plan: &Plan, type_: &str) -> (bool, &'static str) {
        let w = plan
            .conditions
            .iter()
            .find(|w| w.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_}"));
        (w.status, w.reason)
    }

    #[test]
    fn a_new_instance_gets_its_finalizer_first() {
        let o = Observed {
            has_finalizer: false,
            namespace_exists: false,
            release: Release::Missing,
            ..base()
        };
        let plan = decide(&o);
        assert_eq!(plan.actions, [Action::AddFinalizer]);
        assert_eq!(plan.phase, Phase::Pending);
    }

    #[test]
    fn provisioning_applies_the_namespace_and_installs() {
        let o = Observed {
            namespace_exists: false,
            release: Release::Missing,
            statefulset_ready: false,
            exported_kubeconfig: false,
            api_serves: None,
            kubeconfig_current: false,
            ..base()
        };
        let plan = decide(&o);
        assert_eq!(
            plan.actions,
            [
                Action::ApplyNamespace,
                Action::InstallVCluster { recover: false }
            ]
        );
        assert_eq!(plan.phase, Phase::Provisioning);
        assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "Installing"));
        assert_eq!(cond(&plan, c::RECONCILING), (true, "Provisioning"));
        assert!(!cond(&plan, c::READY).0);
    }

    #[test]
    fn queued_installs_say_their_position() {
        let o = Observed {
            namespace_exists: false,
            release: Release::Missing,
            task: TaskState::Queued(3),
            ..base()
        };
        let plan = decide(&o);
        assert_eq!(plan.phase, Phase::Pending);
        let w = plan
            .conditions
            .iter()
            .find(|w| w.type_ == c::VCLUSTER_READY)
            .expect("condition");
        assert_eq!(w.reason, "Queued");
        assert!(w.message.contains("position 3"), "{}", w.message);
        assert!(
            !plan
                .actions
                .contains(&Action::InstallVCluster { recover: false }),
            "no second task while queued"
        );
    }

    #[test]
    fn waits_for_statefulset_kubeconfig_and_api_in_turn() {
        let waiting = |o: Observed| cond(&decide(&o), c::VCLUSTER_READY);
        assert_eq!(
            waiting(Observed {
                statefulset_ready: false,
                ..base()
            }),
            (false, "WaitingForStatefulSet")
        );
        assert_eq!(
            waiting(Observed {
                exported_kubeconfig: false,
                ..base()
            }),
            (false, "WaitingForKubeconfig")
        );
        assert_eq!(
            waiting(Observed {
                api_serves: Some(false),
                ..base()
            }),
            (false, "WaitingForAPI")
        );
    }

    #[test]
    fn a_serving_vcluster_gets_its_kubeconfig_written_and_reaches_installing() {
        let plan = decide(&Observed {
            kubeconfig_current: false,
            ..fresh()
        });
        assert_eq!(
            plan.actions,
            [
                Action::WriteKubeconfig,
                Action::Install {
                    mode: Mode::Install
                }
            ]
        );
        assert_eq!(plan.phase, Phase::Installing);
        assert_eq!(
            cond(&plan, c::KUBECONFIG_READY),
            (true, "KubeconfigWritten")
        );
    }

    #[test]
    fn nothing_changed_means_no_action() {
        let plan = decide(&base());
        assert!(plan.actions.is_empty(), "{:?}", plan.actions);
        assert_eq!(plan.requeue, Requeue::Idle);
        assert_eq!(plan.phase, Phase::Ready);
        assert_eq!(cond(&plan, c::READY), (true, "Installed"));
        assert_eq!(cond(&plan, c::INSTALLED), (true, "Installed"));
        assert_eq!(cond(&plan, c::DRIFT_DETECTED), (false, "NoDrift"));
        assert_eq!(cond(&plan, c::RECONCILING), (false, "Idle"));
        assert_eq!(decide(&base()), plan, "deciding is deterministic");
    }

    #[test]
    fn a_first_install_runs_queues_and_reports() {
        let plan = decide(&fresh());
        assert_eq!(
            plan.actions,
            [Action::Install {
                mode: Mode::Install
            }]
        );
        assert_eq!(plan.phase, Phase::Installing);
        assert_eq!(cond(&plan, c::INSTALLED), (false, "Installing"));
        assert!(
            !plan.conditions.iter().any(|w| w.type_ == c::DRIFT_DETECTED),
            "no drift condition before the first install"
        );
        let mut queued = fresh();
        queued.install.task = TaskState::Queued(3);
        let plan = decide(&queued);
        assert!(plan.actions.is_empty());
        assert_eq!(plan.phase, Phase::Installing);
        let (_, reason) = cond(&plan, c::INSTALLED);
        assert_eq!(reason, "Queued");
        assert!(
            plan.conditions
                .iter()
                .any(|w| w.message.contains("position 3"))
        );
        let mut running = fresh();
        running.install.task = TaskState::Running;
        let plan = decide(&running);
        assert!(plan.actions.is_empty());
        assert_eq!(plan.requeue, Requeue::Poll);
        assert_eq!(cond(&plan, c::RECONCILING), (true, "Installing"));
    }

    #[test]
    fn a_new_version_upgrades_and_a_failed_upgrade_keeps_the_old_one() {
        let plan = decide(&with_install(|i| i.requested = "6.0.23".into()));
        assert_eq!(
            plan.actions,
            [Action::Install {
                mode: Mode::Upgrade
            }]
        );
        assert_eq!(plan.phase, Phase::Upgrading);
        let plan = decide(&with_install(|i| {
            i.requested = "6.0.23".into();
            i.task = TaskState::Failed("boom".into());
            i.last = Some(LastRun {
                version: "6.0.23".into(),
                result: InstallResult::Failed,
                failure: Some(Failure::InstallFailed),
                message: "pulumi up failed (exit 255): stand-in failure".into(),
            });
        }));
        assert_eq!(plan.phase, Phase::Upgrading);
        assert_eq!(plan.requeue, Requeue::Backoff);
        assert_eq!(cond(&plan, c::INSTALLED), (false, "InstallFailed"));
        assert_eq!(cond(&plan, c::READY), (false, "InstallFailed"));
        assert_eq!(cond(&plan, c::STALLED), (false, "Progressing"));
        let message = &plan
            .conditions
            .iter()
            .find(|w| w.type_ == c::INSTALLED)
            .expect("installed")
            .message;
        assert!(message.contains("6.0.22 stays installed"), "{message}");
        assert!(message.contains("stand-in failure"), "{message}");
    }

    #[test]
    fn failures_that_need_a_person_stall_and_timeouts_retry() {
        for (failure, stalled) in [
            (Failure::VersionNotFound, true),
            (Failure::PassphraseMismatch, true),
            (Failure::InstallTimedOut, false),
            (Failure::RegistryUnreachable, false),
        ] {
            let mut o = fresh();
            o.install.task = TaskState::Failed("x".into());
            o.install.last = Some(LastRun {
                version: "6.0.22".into(),
                result: if failure == Failure::InstallTimedOut {
                    InstallResult::TimedOut
                } else {
                    InstallResult::Failed
                },
                failure: Some(failure),
                message: "why".into(),
            });
            let plan = decide(&o);
            assert_eq!(cond(&plan, c::INSTALLED), (false, failure.reason()));
            assert_eq!(cond(&plan, c::STALLED).0, stalled, "{failure:?}");
            assert_eq!(plan.requeue, Requeue::Backoff);
            assert_eq!(
                plan.actions,
                [Action::Install {
                    mode: Mode::Install
                }],
                "the retry is submitted; the task registry holds it back until the backoff ends"
            );
        }
    }

    #[test]
    fn an_interrupted_install_runs_again() {
        let plan = decide(&with_install(|i| {
            i.last = Some(LastRun {
                version: "6.0.22".into(),
                result: InstallResult::Running,
                failure: None,
                message: "install running".into(),
            });
        }));
        assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
        assert_eq!(cond(&plan, c::RECONCILING), (true, "Resuming"));
        let mut o = fresh();
        o.install.last = Some(LastRun {
            version: "6.0.22".into(),
            result: InstallResult::Running,
            failure: None,
            message: "install running".into(),
        });
        let plan = decide(&o);
        assert_eq!(
            plan.actions,
            [Action::Install {
                mode: Mode::Install
            }]
        );
        assert_eq!(plan.phase, Phase::Installing);
    }

    #[test]
    fn changed_settings_are_reapplied() {
        let plan = decide(&with_install(|i| {
            i.desired_hash = Some("sha256:bbbb".into())
        }));
        assert_eq!(
            plan.actions,
            [Action::Install {
                mode: Mode::Reapply
            }]
        );
        assert_eq!(plan.phase, Phase::Ready);
        assert_eq!(cond(&plan, c::INSTALLED), (false, "Installing"));
        let plan = decide(&with_install(|i| {
            i.config_error = Some("the Secret oauth does not exist".into());
        }));
        assert!(plan.actions.is_empty());
        assert_eq!(cond(&plan, c::INSTALLED), (false, "ConfigUnavailable"));
        assert_eq!(cond(&plan, c::STALLED), (true, "ConfigUnavailable"));
    }

    #[test]
    fn repair_previews_when_due_and_installs_on_drift() {
        let plan = decide(&with_install(|i| i.repair_due = true));
        assert_eq!(plan.actions, [Action::Preview]);
        assert_eq!(plan.phase, Phase::Ready);
        assert_eq!(cond(&plan, c::READY), (true, "Installed"));
        let plan = decide(&with_install(|i| {
            i.repair_due = true;
            i.preview_task = TaskState::Running;
        }));
        assert!(plan.actions.is_empty(), "one preview at a time");
        let plan = decide(&with_install(|i| {
            i.drift = Some("drift: putting it back would create 1".into());
        }));
        assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
        assert_eq!(cond(&plan, c::DRIFT_DETECTED), (true, "DriftDetected"));
        assert_eq!(cond(&plan, c::RECONCILING), (true, "Repairing"));
        assert_eq!(cond(&plan, c::INSTALLED), (true, "Installed"));
        let plan = decide(&with_install(|i| {
            i.preview_failed = Some("pulumi preview failed".into());
        }));
        assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
    }

    #[test]
    fn a_failed_run_at_another_version_is_put_back_at_once() {
        // 6.0.22 installed; the upgrade to 6.0.24 timed out; spec.version is set back.
        let plan = decide(&with_install(|i| {
            i.last = Some(LastRun {
                version: "6.0.24".into(),
                result: InstallResult::TimedOut,
                failure: Some(Failure::InstallTimedOut),
                message: "timed out".into(),
            });
        }));
        assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
        assert_eq!(cond(&plan, c::RECONCILING), (true, "Repairing"));
        assert_eq!(cond(&plan, c::INSTALLED), (true, "Installed"));
        // A repair that failed at the installed version is retried (with backoff), not Ready.
        let plan = decide(&with_install(|i| {
            i.task = TaskState::Failed("boom".into());
            i.last = Some(LastRun {
                version: "6.0.22".into(),
                result: InstallResult::Failed,
                failure: Some(Failure::InstallFailed),
                message: "boom".into(),
            });
        }));
        assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
        assert_eq!(plan.requeue, Requeue::Backoff);
        assert_eq!(cond(&plan, c::INSTALLED), (false, "InstallFailed"));
        assert!(!cond(&plan, c::READY).0);
    }

    #[test]
    fn a_retry_request_repairs_an_installed_instance_at_once() {
        let plan = decide(&with_install(|i| i.retry_requested = true));
        assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
        assert_eq!(cond(&plan, c::RECONCILING), (true, "Repairing"));
    }

    #[test]
    fn a_disabled_installer_stops_at_installing() {
        let mut o = fresh();
        o.install.disabled = true;
        let plan = decide(&o);
        assert!(plan.actions.is_empty());
        assert_eq!(plan.phase, Phase::Installing);
        assert_eq!(plan.requeue, Requeue::Idle);
        assert_eq!(cond(&plan, c::INSTALLED), (false, "InstallerDisabled"));
    }

    #[test]
    fn deletion_stops_installer_tasks_first() {
        let mut o = base();
        o.deleting = true;
        o.install.task = TaskState::Running;
        let plan = decide(&o);
        assert_eq!(plan.actions.first(), Some(&Action::CancelInstall));
        let mut o = base();
        o.deleting = true;
        o.install.preview_task = TaskState::Queued(1);
        assert_eq!(decide(&o).actions.first(), Some(&Action::CancelInstall));
    }

    #[test]
    fn a_pending_release_is_recovered_and_a_failure_backs_off() {
        let plan = decide(&Observed {
            release: Release::Pending("pending-install".into()),
            ..base()
        });
        assert_eq!(plan.actions, [Action::InstallVCluster { recover: true }]);
        assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "RecoveringRelease"));
        let plan = decide(&Observed {
            release: Release::Failed("failed".into()),
            task: TaskState::Failed("boom".into()),
            ..base()
        });
        assert_eq!(plan.requeue, Requeue::Backoff);
        assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "InstallFailed"));
        let plan = decide(&Observed {
            release: Release::Deployed {
                chart_version: "0.37.2".into(),
            },
            ..base()
        });
        assert_eq!(plan.actions, [Action::InstallVCluster { recover: false }]);
        assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "Upgrading"));
    }

    #[test]
    fn a_tampered_owner_service_is_put_back_and_relinked() {
        let plan = decide(&Observed {
            owner_service: OwnerService::Unrecorded,
            ..base()
        });
        assert_eq!(plan.actions, [Action::RecordOwnerService]);
        for drift in [OwnerService::Missing, OwnerService::Changed] {
            let plan = decide(&Observed {
                owner_service: drift,
                ..base()
            });
            assert_eq!(plan.actions, [Action::RestoreOwnerService]);
            assert_eq!(
                cond(&plan, c::VCLUSTER_READY),
                (false, "OwnerServiceRestoring")
            );
        }
        let plan = decide(&Observed {
            owner_service: OwnerService::Recreated {
                old_uid: "u1".into(),
            },
            ..base()
        });
        assert_eq!(
            plan.actions,
            [Action::RelinkOwnerService {
                old_uid: "u1".into()
            }]
        );
        let busy = decide(&Observed {
            owner_service: OwnerService::Missing,
            task: TaskState::Running,
            ..base()
        });
        assert!(
            !busy.actions.contains(&Action::RestoreOwnerService),
            "not while helm runs"
        );
    }

    #[test]
    fn invalid_specs_and_conflicts_wait_for_a_change() {
        let plan = decide(&Observed {
            invalid_spec: Some("spec.version is not set".into()),
            ..base()
        });
        assert!(plan.actions.is_empty());
        assert_eq!(plan.phase, Phase::Failed);
        assert_eq!(cond(&plan, c::STALLED), (true, "InvalidSpec"));
        assert_eq!(plan.requeue, Requeue::Idle);
        let plan = decide(&Observed {
            namespace_conflict: Some("team-b/other".into()),
            ..base()
        });
        assert_eq!(
            cond(&plan, c::HOST_NAMESPACE_READY),
            (false, "HostNamespaceConflict")
        );
        assert!(plan.actions.is_empty());
    }

    #[test]
    fn protection_is_reported_either_way() {
        assert_eq!(
            cond(&decide(&base()), c::OWNER_SERVICE_PROTECTED),
            (true, "PolicyActive")
        );
        let plan = decide(&Observed {
            protection: Protection::Unsupported,
            ..base()
        });
        assert_eq!(
            cond(&plan, c::OWNER_SERVICE_PROTECTED),
            (false, "AdmissionPoliciesUnavailable")
        );
        assert_eq!(
            plan.phase,
            Phase::Ready,
            "the controller carries on without admission policies"
        );
    }

    fn deleting(policy: DeletionPolicy) -> Observed {
        Observed {
            deleting: true,
            deletion_policy: policy,
            ..base()
        }
    }

    #[test]
    fn deletion_uninstalls_then_deletes_the_namespace() {
        let plan = decide(&deleting(DeletionPolicy::Retain));
        assert_eq!(plan.actions, [Action::UninstallVCluster]);
        assert_eq!(plan.phase, Phase::Deleting);
        let plan = decide(&Observed {
            release: Release::Missing,
            ..deleting(DeletionPolicy::Retain)
        });
        assert_eq!(plan.actions, [Action::DeleteNamespace]);
        let plan = decide(&Observed {
            release: Release::Missing,
            namespace_terminating: true,
            ..deleting(DeletionPolicy::Retain)
        });
        assert!(plan.actions.is_empty(), "wait for the namespace");
        let plan = decide(&Observed {
            task: TaskState::Running,
            ..deleting(DeletionPolicy::Delete)
        });
        assert!(plan.actions.is_empty(), "wait for helm");
    }

    #[test]
    fn retain_keeps_storage_and_state() {
        let plan = decide(&Observed {
            release: Release::Missing,
            namespace_exists: false,
            ..deleting(DeletionPolicy::Retain)
        });
        assert_eq!(plan.actions, [Action::RemoveFinalizer]);
    }

    #[test]
    fn delete_cleans_storage_then_state_then_lets_go() {
        let gone = Observed {
            release: Release::Missing,
            namespace_exists: false,
            ..deleting(DeletionPolicy::Delete)
        };
        assert_eq!(decide(&gone).actions, [Action::StartCleanup]);
        assert!(
            decide(&Observed {
                cleanup: Cleanup::Running,
                ..gone.clone()
            })
            .actions
            .is_empty()
        );
        let failed = decide(&Observed {
            cleanup: Cleanup::Failed("exit 1".into()),
            ..gone.clone()
        });
        assert!(
            failed.actions.is_empty(),
            "a failed step never drops the finalizer"
        );
        assert_eq!(cond(&failed, c::STALLED), (true, "CleanupFailed"));
        let done = decide(&Observed {
            cleanup: Cleanup::Complete,
            ..gone
        });
        assert_eq!(
            done.actions,
            [
                Action::RemoveState,
                Action::DeleteKubeconfig,
                Action::RemoveFinalizer
            ]
        );
    }

    #[test]
    fn a_failed_uninstall_keeps_the_finalizer() {
        let plan = decide(&Observed {
            task: TaskState::Failed("timeout".into()),
            ..deleting(DeletionPolicy::Delete)
        });
        assert_eq!(plan.actions, [Action::UninstallVCluster]);
        assert_eq!(plan.requeue, Requeue::Backoff);
        assert!(!plan.actions.contains(&Action::RemoveFinalizer));
    }
}
