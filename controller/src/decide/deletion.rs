//! Deletion, honouring `deletionPolicy`: stop the installer's tasks, uninstall the vCluster,
//! delete the host namespace, then with `Delete` run the storage cleanup Job and remove the state
//! and the kubeconfig Secret, and only then let the finalizer go. A failed step never drops it.

use common::crd::{DeletionPolicy, Phase};

use super::model::{Action, Cleanup, Observed, Plan, PlanBuilder, Release, Requeue, TaskState};
use super::status::{self, Kstatus, Reason};

/// Decides the next deletion step.
pub fn decide(o: &Observed) -> Plan {
    let mut plan = PlanBuilder::with([status::protection(&o.protection)]);
    if !o.has_finalizer {
        return Plan {
            actions: plan.actions,
            phase: Phase::Deleting,
            conditions: plan.conditions,
            requeue: Requeue::Idle,
        };
    }
    if o.install.outcome.busy() || o.install.preview_task.busy() {
        plan.act(Action::CancelInstall);
    }
    // 1. Stop what runs: the vCluster release, then the host namespace.
    let mut plan = match uninstall(o, plan) {
        Ok(plan) => plan,
        Err(waiting) => return waiting,
    };
    if o.namespace_exists {
        if !o.namespace_terminating {
            plan.act(Action::DeleteNamespace);
        }
        return step(
            plan,
            Requeue::Poll,
            Reason::DeletingHostNamespace,
            format!("waiting for host namespace {} to go", o.host_namespace),
        );
    }
    // 2. With Delete, remove the storage and the state; Retain keeps both.
    if o.deletion_policy == DeletionPolicy::Delete {
        if let Some(waiting) = cleanup(o, &mut plan) {
            return plan.finish(Phase::Deleting, waiting.0, waiting.1);
        }
        if o.state_exists {
            plan.act(Action::RemoveState);
        }
        if o.kubeconfig_current || o.exported_kubeconfig {
            plan.act(Action::DeleteKubeconfig);
        }
    }
    plan.act(Action::RemoveFinalizer);
    step(
        plan,
        Requeue::Idle,
        Reason::Finalizing,
        "everything is cleaned up; removing the finalizer".into(),
    )
}

/// A deletion step's plan.
fn step(plan: PlanBuilder, requeue: Requeue, reason: Reason, message: String) -> Plan {
    plan.finish(
        Phase::Deleting,
        requeue,
        Kstatus::reconciling(reason, message),
    )
}

/// The vCluster release: `Err` with the plan while helm works on it or must uninstall it,
/// `Ok` with the builder once it is gone.
fn uninstall(o: &Observed, mut plan: PlanBuilder) -> Result<PlanBuilder, Plan> {
    let released = o.release == Release::Missing;
    match &o.task {
        TaskState::Queued(_) | TaskState::Running => Err(step(
            plan,
            Requeue::Poll,
            Reason::UninstallingVCluster,
            "waiting for helm to finish with the vCluster".into(),
        )),
        TaskState::Failed(e) if !released => {
            plan.act(Action::UninstallVCluster);
            Err(step(
                plan,
                Requeue::Backoff,
                Reason::UninstallFailed,
                format!("helm uninstall failed: {e}; retrying"),
            ))
        }
        _ if !released => {
            plan.act(Action::UninstallVCluster);
            Err(step(
                plan,
                Requeue::Poll,
                Reason::UninstallingVCluster,
                "uninstalling the vCluster".into(),
            ))
        }
        _ => Ok(plan),
    }
}

/// The storage cleanup Job, until it completes: when to look again and what to report.
fn cleanup(o: &Observed, plan: &mut PlanBuilder) -> Option<(Requeue, Kstatus)> {
    match &o.cleanup {
        Cleanup::Missing => {
            plan.act(Action::StartCleanup);
            Some((
                Requeue::Poll,
                Kstatus::reconciling(Reason::CleaningStorage, "running the storage cleanup Job"),
            ))
        }
        Cleanup::Running => Some((
            Requeue::Poll,
            Kstatus::reconciling(
                Reason::CleaningStorage,
                "waiting for the storage cleanup Job to complete",
            ),
        )),
        Cleanup::Failed(e) => Some((
            Requeue::Backoff,
            Kstatus::stalled(
                Reason::CleanupFailed,
                format!(
                    "the storage cleanup Job failed ({e}); the instance's storage directory is left; read the Job's logs, fix it and delete the Job to retry"
                ),
            ),
        )),
        Cleanup::Complete => None,
    }
}
