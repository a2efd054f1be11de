//! Deletion, honouring `deletionPolicy`: stop the installer's tasks, uninstall the vCluster,
//! delete the host namespace (with `Retain`, its bound volumes set to `Retain` first), then with `Delete` run the storage cleanup Job and remove the state
//! and the kubeconfig Secret, and only then let the finalizer go. A failed step never drops it.
//! Nothing whose ownership marks name someone else is ever uninstalled, deleted or cleaned: a
//! host namespace of another instance, a kubeconfig Secret that is not this instance's, a cleanup
//! Job of another UID (replaced, never believed).

use common::crd::{DeletionPolicy, Phase};
use common::names::FINALIZER;

use super::model::{
    Action, Cleanup, Exported, HostNamespace, KubeconfigSecret, Observed, Plan, PlanBuilder,
    Release, Requeue, StorageNode, TaskState,
};
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
            retry: Default::default(),
        };
    }
    if o.install.outcome.busy() || o.install.preview_task.busy() {
        plan.act(Action::CancelInstall);
    }
    if let HostNamespace::Foreign(other) = &o.host {
        return left_alone(o, plan, other);
    }
    if let StorageNode::Scheduled(node) = &o.storage_node {
        plan.act(Action::RecordStorageNode(node.clone()));
    }
    // 1. Stop what runs: the vCluster release, then the host namespace.
    let mut plan = match uninstall(o, plan) {
        Ok(plan) => plan,
        Err(waiting) => return waiting,
    };
    if o.host != HostNamespace::Missing {
        if o.host != HostNamespace::Terminating {
            // Retain keeps the volumes bound in it: set to Retain and recorded first.
            if o.deletion_policy == DeletionPolicy::Retain && !o.volumes.is_empty() {
                plan.act(Action::RetainVolumes(o.volumes.clone()));
            }
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
            return plan.finish(Phase::Deleting, Requeue::Poll, waiting);
        }
        if o.state_exists {
            plan.act(Action::RemoveState);
        }
        let written = match o.kubeconfig {
            KubeconfigSecret::Current => true,
            KubeconfigSecret::Stale => matches!(o.exported, Exported::Accepted { .. }),
            KubeconfigSecret::Foreign(_) => false,
        };
        if written {
            plan.act(Action::DeleteKubeconfig);
        }
    }
    plan.act(Action::RemoveFinalizer);
    let (reason, message) = match &o.kubeconfig {
        KubeconfigSecret::Foreign(secret) => (
            Reason::LeftAlone,
            format!(
                "everything of the instance is cleaned up; the Secret {secret} is not this instance's and was left untouched; removing the finalizer"
            ),
        ),
        KubeconfigSecret::Current | KubeconfigSecret::Stale => (
            Reason::Finalizing,
            "everything is cleaned up; removing the finalizer".into(),
        ),
    };
    step(plan, Requeue::Idle, reason, message)
}

/// The host namespace belongs to `other`: its vCluster, the namespace and its storage are left
/// untouched (as is the instance's state, which a `Retain` of the same name may have kept), the
/// instance's own kubeconfig Secret goes with `Delete`, and the finalizer is dropped with a
/// `LeftAlone` Event saying what was left.
fn left_alone(o: &Observed, mut plan: PlanBuilder, other: &str) -> Plan {
    if o.deletion_policy == DeletionPolicy::Delete && o.kubeconfig == KubeconfigSecret::Current {
        plan.act(Action::DeleteKubeconfig);
    }
    plan.act(Action::RemoveFinalizer);
    step(
        plan,
        Requeue::Idle,
        Reason::LeftAlone,
        format!(
            "host namespace {} belongs to {other}: it, its vCluster and its storage were left untouched; removing the finalizer",
            o.host_namespace
        ),
    )
}

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
    let (requeue, reason, message) = match &o.task {
        TaskState::Queued(_) => {
            // Not started: cancelled now, not waited for behind the whole queue.
            plan.act(Action::CancelHelm);
            let message = "cancelled the queued helm install of the vCluster";
            (Requeue::Poll, Reason::UninstallingVCluster, message.into())
        }
        TaskState::Running => {
            let message = "waiting for helm to finish with the vCluster";
            (Requeue::Poll, Reason::UninstallingVCluster, message.into())
        }
        TaskState::Failed(e) if !released => {
            plan.act(Action::UninstallVCluster);
            let reason = Reason::helm(e, Reason::UninstallFailed);
            let message = format!("helm uninstall failed: {e}; retrying");
            (Requeue::Backoff, reason, message)
        }
        _ if !released => {
            plan.act(Action::UninstallVCluster);
            let message = "uninstalling the vCluster";
            (Requeue::Poll, Reason::UninstallingVCluster, message.into())
        }
        _ => return Ok(plan),
    };
    Err(step(plan, requeue, reason, message))
}

/// The storage cleanup Job, pinned to the node that holds the storage, until it completes there:
/// what to report (looked at again on the poll cadence; a failed or timed-out Job waits for a
/// person, who deletes it). No Job runs while that node is gone, and none when no control plane
/// pod was ever scheduled (no node holds a storage directory of the instance).
fn cleanup(o: &Observed, plan: &mut PlanBuilder) -> Option<Kstatus> {
    if let StorageNode::Recorded { node, gone: true } = &o.storage_node
        && o.cleanup != Cleanup::Complete
    {
        return Some(Kstatus::reconciling(
            Reason::CleanupBlocked,
            format!(
                "node {node}, which holds the instance's storage directory {}, is gone: no cleanup Job can run there; the cleanup runs when the node is back; if it never will, its disk and the data went with it: remove the finalizer {FINALIZER} by hand",
                o.host_namespace
            ),
        ));
    }
    match &o.cleanup {
        Cleanup::Missing => {
            let StorageNode::Recorded { node, .. } = &o.storage_node else {
                return None;
            };
            plan.act(Action::StartCleanup(node.clone()));
            Some(Kstatus::reconciling(
                Reason::CleaningStorage,
                "running the storage cleanup Job",
            ))
        }
        Cleanup::Stale => {
            plan.act(Action::ReplaceCleanup);
            Some(Kstatus::reconciling(
                Reason::CleaningStorage,
                "a cleanup Job of that name was left by another instance (another UID); replacing it",
            ))
        }
        Cleanup::Blocked(e) => Some(Kstatus::reconciling(
            Reason::CleanupBlocked,
            format!(
                "the storage cleanup Job cannot create its pod ({e}); fix the cause (a quota, an admission policy in the cleanup namespace) or the Job fails after --cleanup-deadline"
            ),
        )),
        Cleanup::TimedOut(e) => Some(Kstatus::stalled(
            Reason::CleanupTimedOut,
            format!(
                "the storage cleanup Job ran past --cleanup-deadline ({e}); the instance's storage directory is left; look at the Job's pods and events, fix the cause and delete the Job to retry"
            ),
        )),
        Cleanup::Running => Some(Kstatus::reconciling(
            Reason::CleaningStorage,
            "waiting for the storage cleanup Job to complete",
        )),
        Cleanup::Failed(e) => Some(Kstatus::stalled(
            Reason::CleanupFailed,
            format!(
                "the storage cleanup Job failed ({e}); the instance's storage directory is left; read the Job's logs, fix it and delete the Job to retry"
            ),
        )),
        Cleanup::Conflict(e) => Some(Kstatus::stalled(
            Reason::StorageConflict,
            format!(
                "the storage cleanup Job removed nothing: the storage directory's owner marker names another instance ({e}); the Job's pod log says whose it is; the finalizer stays until it is resolved: move the directory aside (or remove its marker if it is this instance's) and delete the Job to retry"
            ),
        )),
        Cleanup::Complete => None,
    }
}
