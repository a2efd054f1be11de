//! Suspend: `spec.suspend` holds an instance as it is. The plan an unsuspended instance would
//! get is made as usual, then held: no action but the finalizer runs (no install, upgrade,
//! repair or Helm run starts; one already running finishes), tasks waiting for a slot leave the
//! queue, and the status says what would have run.

use common::conditions as c;

use super::model::{Action, InstallOutcome, Observed, Plan, Requeue, TaskState};
use super::status::{Cond, Reason};

/// `plan`, held because `o` is suspended.
pub fn hold(o: &Observed, mut plan: Plan) -> Plan {
    let queued = |t: &TaskState| matches!(t, TaskState::Queued(_));
    let dequeue = queued(&o.task)
        || matches!(o.install.outcome, InstallOutcome::Queued(_))
        || queued(&o.install.preview_task);
    plan.actions.retain(|a| *a == Action::AddFinalizer);
    if dequeue {
        plan.actions.push(Action::CancelHelm);
    }
    let message = "spec.suspend is true: no install, upgrade, repair or Helm run starts (one already running finishes); set it to false to resume";
    for cond in &mut plan.conditions {
        let working = cond.type_ == c::RECONCILING || (cond.type_ == c::READY && !cond.status);
        if working && cond.reason != Reason::Suspended && cond.type_ != c::STALLED {
            let held = format!("{message} (held: {})", cond.message);
            *cond = Cond::no(cond.type_, Reason::Suspended, held);
        }
    }
    plan.conditions
        .push(Cond::yes(c::SUSPENDED, Reason::Suspended, message));
    plan.requeue = Requeue::Idle;
    plan
}
