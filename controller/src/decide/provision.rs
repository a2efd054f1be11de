//! Provisioning: the finalizer, what stops an instance before anything is created (an invalid
//! spec, a host namespace of another instance or one still going), the host namespace, the
//! vCluster release and `service/vcluster`, and the kubeconfig. Once the kubeconfig is written,
//! [`super::install`] takes over.

use common::conditions as c;
use common::crd::Phase;

use super::install;
use super::model::{
    Action, Exported, HostNamespace, KubeconfigSecret, Observed, OwnerService, Plan, PlanBuilder,
    Release, Requeue, StorageNode, TaskState,
};
use super::status::{self, Cond, Kstatus, Reason};

/// Decides what to do for an instance that is not being deleted.
pub fn decide(o: &Observed) -> Plan {
    let mut plan = PlanBuilder::with([status::protection(&o.protection)]);
    // Nothing may be created yet: no finalizer, an invalid spec, or a host namespace that
    // belongs to another instance.
    if !o.has_finalizer {
        plan.act(Action::AddFinalizer);
        let adding = Kstatus::reconciling(Reason::AddingFinalizer, "adding the finalizer");
        return plan.finish(Phase::Pending, Requeue::Poll, adding);
    }
    if let Some(reason) = &o.invalid_spec {
        let message = format!("{reason}; the controller waits for a change");
        let invalid = Kstatus::stalled(Reason::InvalidSpec, message);
        return plan.finish(Phase::Failed, Requeue::Idle, invalid);
    }
    if let HostNamespace::Foreign(other) = &o.host {
        let message = format!(
            "host namespace {} belongs to {other}; delete it or rename this instance",
            o.host_namespace
        );
        let reason = Reason::HostNamespaceConflict;
        plan.condition(Cond::no(c::HOST_NAMESPACE_READY, reason, message.clone()));
        let conflict = Kstatus::stalled(reason, message);
        return plan.finish(Phase::Failed, Requeue::Idle, conflict);
    }
    if o.host == HostNamespace::Terminating {
        let message = format!(
            "host namespace {} is still being deleted; waiting for it to go",
            o.host_namespace
        );
        let reason = Reason::HostNamespaceTerminating;
        plan.condition(Cond::no(c::HOST_NAMESPACE_READY, reason, message.clone()));
        let waiting = Kstatus::reconciling(reason, message);
        return plan.finish(Phase::Provisioning, Requeue::Poll, waiting);
    }
    if o.host != (HostNamespace::Ours { current: true }) {
        plan.act(Action::ApplyNamespace);
    }
    if let StorageNode::Scheduled(node) = &o.storage_node {
        plan.act(Action::RecordStorageNode(node.clone()));
    }
    plan.condition(Cond::yes(
        c::HOST_NAMESPACE_READY,
        Reason::HostNamespaceApplied,
        format!("host namespace {} with its NetworkPolicy", o.host_namespace),
    ));
    if let Some(restoring) = owner_service(o, &mut plan) {
        return restoring;
    }
    let (vcluster, requeue) = vcluster(o, &mut plan);
    let vcluster_ready = vcluster.status;
    let stops = [Reason::StorageNodeGone, Reason::StorageConflict];
    let stop = if helm_exhausted(o) {
        Some((Reason::RetriesExhausted, vcluster.message.clone()))
    } else {
        (stops.contains(&vcluster.reason)).then(|| (vcluster.reason, vcluster.message.clone()))
    };
    plan.condition(vcluster);
    if vcluster_ready {
        if let KubeconfigSecret::Foreign(secret) = &o.kubeconfig {
            return kubeconfig_conflict(o, plan, secret);
        }
        kubeconfig_written(o, &mut plan);
        return install::decide(&o.install, plan, requeue);
    }
    waiting_for_vcluster(o, &mut plan);
    if let Some((reason, message)) = stop {
        return plan.finish(Phase::Failed, requeue, Kstatus::stalled(reason, message));
    }
    let (phase, reconciling) = match &o.task {
        TaskState::Idle if matches!(o.exported, Exported::Refused(_)) && release_current(o) => (
            Phase::Failed,
            Kstatus::stalled(Reason::KubeconfigRefused, refused(o)),
        ),
        TaskState::Queued(_) if o.host == HostNamespace::Missing => (
            Phase::Pending,
            Kstatus::reconciling(Reason::Queued, "waiting for an install slot"),
        ),
        _ => (
            Phase::Provisioning,
            Kstatus::reconciling(Reason::Provisioning, "the vCluster is coming up"),
        ),
    };
    plan.finish(phase, requeue, reconciling)
}

/// `KubeconfigReady` and `Installed` while the vCluster does not serve.
fn waiting_for_vcluster(o: &Observed, plan: &mut PlanBuilder) {
    plan.condition(Cond::no(
        c::KUBECONFIG_READY,
        Reason::WaitingForVCluster,
        "the kubeconfig is written once the vCluster serves",
    ));
    plan.condition(install::installed_while_waiting(&o.install));
}

/// The chart's release is deployed from the shipped chart, pinned to the storage node and
/// checking its owner.
fn release_current(o: &Observed) -> bool {
    o.pinned
        && o.claims_storage
        && o.recreates
        && o.policies_current
        && matches!(&o.release, Release::Deployed { chart_version } if *chart_version == o.chart_version)
}

/// `service/vcluster` against the record, once the release is current and no helm task runs:
/// a deleted Service is put back (the plan is returned then), a recreated one relinked.
fn owner_service(o: &Observed, plan: &mut PlanBuilder) -> Option<Plan> {
    if !release_current(o) || o.task != TaskState::Idle {
        return None;
    }
    match &o.owner_service {
        OwnerService::Missing => {
            let mut plan = std::mem::take(plan);
            plan.act(Action::RestoreOwnerService);
            plan.condition(Cond::no(
                c::VCLUSTER_READY,
                Reason::OwnerServiceRestoring,
                "service/vcluster was deleted; the controller is putting it back",
            ));
            waiting_for_vcluster(o, &mut plan);
            Some(plan.finish(
                Phase::Provisioning,
                Requeue::Poll,
                Kstatus::reconciling(
                    Reason::OwnerServiceRestoring,
                    "putting service/vcluster back",
                ),
            ))
        }
        OwnerService::Recreated { old_uid } => {
            plan.act(Action::RelinkOwnerService {
                old_uid: old_uid.clone(),
            });
            None
        }
        OwnerService::Unrecorded | OwnerService::Matches => None,
    }
}

/// Helm failed `--max-retries` times in a row at this generation and the release still needs it:
/// it is not run again until the spec changes or a person asks.
fn helm_exhausted(o: &Observed) -> bool {
    o.helm_retry.exhausted() && !release_current(o) && !o.task.busy()
}

/// The `VClusterReady` condition, the helm action it needs, and when to look again.
fn vcluster(o: &Observed, plan: &mut PlanBuilder) -> (Cond, Requeue) {
    let current = release_current(o);
    let install = Action::InstallVCluster {
        recover: matches!(o.release, Release::Pending(_)),
    };
    if matches!(o.task, TaskState::Failed(_)) || helm_exhausted(o) {
        plan.retry = o.helm_retry.clone();
    }
    if helm_exhausted(o) {
        let (reason, error) = match &o.task {
            TaskState::Failed(e) => (Reason::helm(e, Reason::HelmFailed), e.message.as_str()),
            _ => (
                Reason::HelmFailed,
                "its error was before the controller restarted",
            ),
        };
        let message = format!(
            "helm failed: {error}; {}: not retrying until the spec changes or the annotation {} is set to a new value",
            o.helm_retry.words(),
            common::names::RETRY_ANNOTATION
        );
        return (Cond::no(c::VCLUSTER_READY, reason, message), Requeue::Idle);
    }
    let (reason, message, requeue) = match (&o.task, &o.release) {
        (TaskState::Queued(position), _) => {
            let place = super::model::queue_place(*position);
            let message = format!(
                "waiting for an install slot: {place} in the queue (--max-concurrent-installs)"
            );
            (Reason::Queued, message, Requeue::Queued)
        }
        (TaskState::Running, _) => {
            let message = "helm is installing the vCluster";
            (Reason::Installing, message.into(), Requeue::Poll)
        }
        (TaskState::Failed(e), _) if !current => {
            plan.act(install);
            let retry = o.helm_retry.words();
            let message = format!("helm failed: {e}; retrying with backoff ({retry})");
            let reason = Reason::helm(e, Reason::HelmFailed);
            (reason, message, Requeue::Backoff)
        }
        (_, Release::Pending(status)) => {
            plan.act(install);
            let message = format!(
                "the vCluster release was left {status} by an interrupted helm; recovering it"
            );
            (Reason::RecoveringRelease, message, Requeue::Poll)
        }
        (_, Release::Missing | Release::Failed(_)) => {
            plan.act(install);
            let message = "installing the vCluster";
            (Reason::Installing, message.into(), Requeue::Poll)
        }
        (_, Release::Deployed { .. }) if !current => {
            plan.act(install);
            let message = match &o.storage_node {
                StorageNode::Recorded { node, .. } if !o.pinned => format!(
                    "pinning the vCluster's control plane to node {node}, which holds its storage"
                ),
                _ if !o.claims_storage => {
                    "adding the storage owner check to the vCluster's control plane".into()
                }
                _ if !o.recreates => {
                    "giving the vCluster's control plane the Recreate strategy".into()
                }
                _ if !o.policies_current => {
                    "applying the quotas (spec.resources) to the vCluster".into()
                }
                _ => format!("upgrading the vCluster to chart {}", o.chart_version),
            };
            (Reason::Upgrading, message, Requeue::Poll)
        }
        (_, Release::Deployed { .. }) => return serving(o),
    };
    (Cond::no(c::VCLUSTER_READY, reason, message), requeue)
}

/// A current release: waiting for the control plane, the exported kubeconfig and the API in turn.
/// The Deployment's and the exported kubeconfig's watches wake the instance when either changes
/// (main.rs): polling the ~50 instances that wait for them at a time while a thousand provision
/// made most of the reconciles. No watch sees the vCluster's API: it is probed at each poll.
fn serving(o: &Observed) -> (Cond, Requeue) {
    let (reason, message, requeue) = if let (false, StorageNode::Recorded { node, gone: true }) =
        (o.statefulset_ready, &o.storage_node)
    {
        let message = format!(
            "the control plane is pinned to node {node}, which holds its storage (the directory {}) and is gone: bring the node back and the instance resumes; if its disk is lost, so is the vCluster's data: delete the instance",
            o.host_namespace
        );
        (Reason::StorageNodeGone, message, Requeue::Poll)
    } else if let (false, Some(refused)) = (o.statefulset_ready, &o.storage_conflict) {
        let message = format!("the control plane does not start: {refused}");
        (Reason::StorageConflict, message, Requeue::Poll)
    } else if !o.statefulset_ready {
        let message = "waiting for the vCluster control plane (deployment/vcluster) to be ready";
        (
            Reason::WaitingForControlPlane,
            message.into(),
            Requeue::Watched,
        )
    } else if matches!(o.exported, Exported::Refused(_)) {
        (Reason::KubeconfigRefused, refused(o), Requeue::Watched)
    } else if o.exported == Exported::Missing {
        let message = "waiting for the vCluster to export its kubeconfig";
        (
            Reason::WaitingForKubeconfig,
            message.into(),
            Requeue::Watched,
        )
    } else if o.exported != (Exported::Accepted { serves: Some(true) }) {
        let message = "waiting for the vCluster API to answer";
        (Reason::WaitingForAPI, message.into(), Requeue::Poll)
    } else {
        let serving = "the vCluster serves its API";
        let ready = Cond::yes(c::VCLUSTER_READY, Reason::VClusterServing, serving);
        return (ready, Requeue::Idle);
    };
    (Cond::no(c::VCLUSTER_READY, reason, message), requeue)
}

fn refused(o: &Observed) -> String {
    format!(
        "the kubeconfig the vCluster exported (Secret {} in {}) was refused: {}; the controller accepts only an inline server, CA, client certificate and key, and token; find who wrote that Secret and delete it so vCluster exports it again",
        common::names::EXPORTED_KUBECONFIG_SECRET,
        o.host_namespace,
        match &o.exported {
            Exported::Refused(why) => why.as_str(),
            _ => "",
        }
    )
}

/// A Secret of the kubeconfig Secret's name is someone else's: it is left untouched and the
/// instance waits, stalled, for it to go.
fn kubeconfig_conflict(o: &Observed, mut plan: PlanBuilder, secret: &str) -> Plan {
    let message = format!(
        "the Secret {secret} exists and is not this instance's (it carries no {}={} mark and no owner reference to it); the controller leaves it untouched: delete or rename it to get the instance's kubeconfig",
        common::names::INSTANCE_UID_LABEL,
        o.uid
    );
    plan.condition(Cond::no(
        c::KUBECONFIG_READY,
        Reason::KubeconfigSecretConflict,
        message.clone(),
    ));
    plan.condition(install::installed_while_waiting(&o.install));
    plan.finish(
        Phase::Failed,
        Requeue::Poll,
        Kstatus::stalled(Reason::KubeconfigSecretConflict, message),
    )
}

/// The vCluster serves: write the kubeconfig when it differs, and record `service/vcluster`.
fn kubeconfig_written(o: &Observed, plan: &mut PlanBuilder) {
    if o.kubeconfig != KubeconfigSecret::Current {
        plan.act(Action::WriteKubeconfig);
    }
    if o.owner_service == OwnerService::Unrecorded {
        plan.act(Action::RecordOwnerService);
    }
    plan.condition(Cond::yes(
        c::KUBECONFIG_READY,
        Reason::KubeconfigWritten,
        "the admin kubeconfig is in the instance's kubeconfig Secret",
    ));
}
