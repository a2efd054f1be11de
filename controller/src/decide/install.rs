//! The installer's part of the plan, once the vCluster serves and the kubeconfig is written:
//! first install, upgrade, re-apply of changed settings, resuming an interrupted run, repair of
//! drift, failures with their backoff, and the repair preview when it is due.

use common::conditions as c;
use common::crd::{Phase, RepairMode};
use common::names::{ALLOW_DOWNGRADE_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION};

use super::model::{
    Action, Failure, InstallObserved, InstallOutcome, Mode, Plan, PlanBuilder, Requeue, TaskError,
    TaskState,
};
use super::status::{Cond, Kstatus, Reason, Step};

/// The `Installed` condition while the vCluster is not serving.
pub fn installed_while_waiting(i: &InstallObserved) -> Cond {
    match &i.installed {
        Some(v) => Cond::yes(
            c::INSTALLED,
            Reason::Installed,
            format!("{v} is installed; the installer waits for the vCluster to serve again"),
        ),
        None => Cond::no(
            c::INSTALLED,
            Reason::WaitingForVCluster,
            "the platform program runs once the vCluster serves",
        ),
    }
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

/// What the installer step decided besides actions and its detail conditions.
type Outcome = (Phase, Kstatus, Requeue);

struct Ctx<'a> {
    i: &'a InstallObserved,
    at_requested: bool,
    phase: Phase,
    /// The mode of an install that is not a repair.
    mode: Mode,
    /// What an install would do, in words.
    what: String,
}

impl<'a> Ctx<'a> {
    fn new(i: &'a InstallObserved) -> Self {
        let requested = i.requested.as_str();
        let installed = i.installed.as_deref();
        let (phase, mode, what) = match installed {
            None => (
                Phase::Installing,
                Mode::Install,
                format!("installing {requested}"),
            ),
            Some(v) if v != requested => (
                Phase::Upgrading,
                Mode::Upgrade,
                format!("upgrading from {v} to {requested}"),
            ),
            Some(_) => (
                Phase::Ready,
                Mode::Reapply,
                format!("re-applying {requested}"),
            ),
        };
        Self {
            i,
            at_requested: installed == Some(requested),
            phase,
            mode,
            what,
        }
    }

    fn serving(&self) -> Step {
        let message = format!("{} is installed and serving", self.i.requested);
        (Reason::Installed, message)
    }

    fn hash_differs(&self) -> bool {
        self.i.desired_hash.is_some() && self.i.desired_hash != self.i.applied_hash
    }
}

/// The installer's part of the plan; `vcluster` is when the vCluster part wanted to look again.
pub fn decide(i: &InstallObserved, mut plan: PlanBuilder, vcluster: Requeue) -> Plan {
    let (phase, kstatus, requeue) = outcome(i, &mut plan);
    // A failed install waits out its backoff (its retry is held back by the task registry
    // until then); other work is looked at on the next poll.
    let requeue = match requeue {
        Requeue::Idle if vcluster != Requeue::Idle || !plan.actions.is_empty() => Requeue::Poll,
        requeue => requeue,
    };
    plan.finish(phase, requeue, kstatus)
}

fn outcome(i: &InstallObserved, plan: &mut PlanBuilder) -> Outcome {
    if i.disabled {
        let message =
            "the platform program is not run: the controller runs with --install-platform=false";
        plan.condition(Cond::no(c::INSTALLED, Reason::InstallerDisabled, message));
        let kstatus = Kstatus::reconciling(Reason::InstallerDisabled, message);
        return (Phase::Installing, kstatus, Requeue::Idle);
    }
    if let Some(e) = &i.record_error {
        let reason = Reason::Failed(Failure::StateUnavailable);
        return stalled(plan, reason, e.clone(), Requeue::Poll);
    }
    let x = Ctx::new(i);
    if i.installed.is_some() && i.repair_mode != RepairMode::Off {
        plan.condition(drift_condition(&i.drift, i.repair_mode));
    }
    if gated(i) {
        plan.condition(upgrade_pending(i));
    }
    if let Some(outcome) = busy(&x, plan) {
        return outcome;
    }
    if let Some(installed) = downgrade_refused(i) {
        let message = format!(
            "{installed} is installed and spec.version asks for the older {}: the controller does not run an older program over newer state; set spec.version to {installed} or later, or set the annotation {ALLOW_DOWNGRADE_ANNOTATION}=true to downgrade on purpose",
            i.requested
        );
        return stalled(plan, Reason::DowngradeRefused, message, Requeue::Idle);
    }
    if let Some(e) = &i.config_error {
        let message = format!("{e}; the installer waits for it");
        return stalled(plan, Reason::ConfigUnavailable, message, Requeue::Poll);
    }
    if let Some(outcome) = awaiting_approval(&x, plan) {
        return outcome;
    }
    if let Some((reason, message)) = need(&x) {
        return run(&x, reason, message, plan);
    }
    settled(&x, plan)
}

/// `Installed=False` and `Stalled=True`, both with `reason` and `message` (and so `Failed`).
fn stalled(plan: &mut PlanBuilder, reason: Reason, message: String, requeue: Requeue) -> Outcome {
    plan.condition(Cond::no(c::INSTALLED, reason, message.clone()));
    (Phase::Failed, Kstatus::stalled(reason, message), requeue)
}

/// The installed version when it is newer than `spec.version` and no downgrade is allowed (the
/// webhook warns at admission, but an instance deleted with `Retain` and created again at an
/// older version is a CREATE it cannot compare: the record kept on the state volume can).
fn downgrade_refused(i: &InstallObserved) -> Option<&str> {
    let installed = i.installed.as_deref()?;
    let older = match (
        common::version::parse_exact(installed),
        common::version::parse_exact(&i.requested),
    ) {
        (Ok(installed), Ok(requested)) => requested < installed,
        _ => false,
    };
    (older && !i.downgrade_allowed).then_some(installed)
}

fn drift_condition(drift: &Option<String>, mode: RepairMode) -> Cond {
    let then = match mode {
        RepairMode::Warn => {
            "spec.repair.mode is Warn: nothing is changed (set it to Repair, or set the retry annotation, to put it back)"
        }
        _ => "an install at the installed version puts it back",
    };
    match drift {
        Some(message) => Cond::yes(
            c::DRIFT_DETECTED,
            Reason::DriftDetected,
            format!("the repair preview found {message}; {then}"),
        ),
        None => Cond::no(
            c::DRIFT_DETECTED,
            Reason::NoDrift,
            "the last install or repair preview found the platform as installed",
        ),
    }
}

/// Work in progress: an install or a preview queued or running.
fn busy(x: &Ctx, plan: &mut PlanBuilder) -> Option<Outcome> {
    let requested = &x.i.requested;
    let (step, queued) = match (&x.i.outcome, &x.i.preview_task) {
        (InstallOutcome::Queued(position), _) => {
            let message = format!(
                "{}: waiting for an install slot, {} in the queue (--max-concurrent-installs)",
                x.what,
                super::model::queue_place(*position)
            );
            ((Reason::Queued, message), true)
        }
        (InstallOutcome::Running, _) => {
            let message = format!("{}: npm and pulumi are running", x.what);
            ((Reason::Installing, message), false)
        }
        (_, preview) if preview.busy() => {
            let step = match gated(x.i) {
                true => previewing_upgrade(x.i),
                false => checking_drift(),
            };
            (step, matches!(preview, TaskState::Queued(_)))
        }
        _ => return None,
    };
    plan.condition(if x.i.outcome.busy() {
        let kept = x.at_requested && x.i.applied_hash.is_some();
        installed_during(x, kept, step.0, &step.1)
    } else {
        let installed = x.i.installed.as_deref().unwrap_or(requested);
        let message = format!("{installed} is installed");
        Cond::yes(c::INSTALLED, Reason::Installed, message)
    });
    let kstatus = Kstatus {
        ready: (x.phase == Phase::Ready).then(|| x.serving()),
        reconciling: Some(step),
        stalled: None,
    };
    // A queued install or preview is woken by the task queue when it starts or its place
    // changes.
    let requeue = if queued {
        Requeue::Queued
    } else {
        Requeue::Poll
    };
    Some((x.phase, kstatus, requeue))
}

/// `Installed` while an install goes on (`reason`, `message`): `True`, saying so too, when `kept`
/// (the requested version is installed and serves meanwhile), else `False` with its words.
fn installed_during(x: &Ctx, kept: bool, reason: Reason, message: &str) -> Cond {
    if kept {
        let message = format!("{} is installed; {message}", x.i.requested);
        Cond::yes(c::INSTALLED, Reason::Installed, message)
    } else {
        Cond::no(c::INSTALLED, reason, message)
    }
}

/// An upgrade waits for approval (`spec.upgrade.approval: Manual`, the approve annotation not
/// naming `spec.version`).
fn gated(i: &InstallObserved) -> bool {
    i.needs_approval && i.installed.as_ref().is_some_and(|v| *v != i.requested)
}

/// `UpgradePending=True`: previewing the upgrade, or waiting with what the preview found.
fn upgrade_pending(i: &InstallObserved) -> Cond {
    let (from, to) = (i.installed.as_deref().unwrap_or_default(), &i.requested);
    match &i.upgrade_preview {
        Some(found) => Cond::yes(
            c::UPGRADE_PENDING,
            Reason::UpgradePending,
            format!(
                "the upgrade from {from} to {to} waits for approval (spec.upgrade.approval is Manual); its preview found {found} (status.pendingUpgrade); approve it with the annotation {APPROVE_ANNOTATION}={to}"
            ),
        ),
        None => {
            let (reason, message) = previewing_upgrade(i);
            Cond::yes(c::UPGRADE_PENDING, reason, message)
        }
    }
}

fn previewing_upgrade(i: &InstallObserved) -> Step {
    let message = format!(
        "a preview of {} against the running instance, before the upgrade waits for approval",
        i.requested
    );
    (Reason::PreviewingUpgrade, message)
}

/// An upgrade waiting for approval: the installed version stays Ready; the new version is
/// previewed once.
fn awaiting_approval(x: &Ctx, plan: &mut PlanBuilder) -> Option<Outcome> {
    let (i, installed) = (x.i, x.i.installed.as_deref()?);
    if !gated(i) {
        return None;
    }
    let message = format!("{installed} is installed");
    plan.condition(Cond::yes(c::INSTALLED, Reason::Installed, message));
    let serving = format!(
        "{installed} is installed and serving; the upgrade to {} waits for approval",
        i.requested
    );
    let previewing = i.upgrade_preview.is_none();
    if previewing {
        plan.act(Action::PreviewUpgrade);
    }
    let kstatus = Kstatus {
        ready: Some((Reason::Installed, serving)),
        reconciling: previewing.then(|| previewing_upgrade(i)),
        stalled: None,
    };
    let requeue = if previewing {
        Requeue::Poll
    } else {
        Requeue::Idle
    };
    Some((Phase::Ready, kstatus, requeue))
}

fn checking_drift() -> Step {
    let message = "a refreshing preview looks for drift";
    (Reason::CheckingDrift, message.into())
}

/// Whether an install runs now: `Resuming` an interrupted run, `Installing` (not at
/// `spec.version`, or changed settings) or `Repairing` the installed version; and why in words.
fn need(x: &Ctx) -> Option<(Reason, String)> {
    let (i, requested) = (x.i, &x.i.requested);
    let repairs = i.repair_mode == RepairMode::Repair;
    // No task runs here: a last run that failed, timed out or was interrupted.
    let unsettled = match &i.outcome {
        InstallOutcome::Interrupted { version } => Some(("interrupted", version)),
        InstallOutcome::Failed {
            version, timed_out, ..
        } => Some((if *timed_out { "timed out" } else { "failed" }, version)),
        _ => None,
    };
    if interrupted(x) {
        return Some((
            Reason::Resuming,
            format!(
                "{}: the last run was interrupted (the controller stopped); running it again",
                x.what
            ),
        ));
    }
    if !x.at_requested || x.hash_differs() {
        return Some((Reason::Installing, x.what.clone()));
    }
    let why = if let Some((how, version)) = unsettled {
        // A run that failed, timed out or was interrupted (at any version: spec.version may
        // have been set back to the installed one) left the workspace, the stack's config and
        // perhaps the cluster part-way: put the installed version back at once.
        format!("the last run ({how} of {version}) did not succeed")
    } else if let Some(drift) = i.drift.as_ref().filter(|_| repairs) {
        format!("the repair preview found {drift}")
    } else if let Some(e) = i.preview_failed.as_ref().filter(|_| repairs) {
        format!("the repair preview failed ({e})")
    } else if i.repair_due && !i.missing_memberships.is_empty() {
        let gone = i.missing_memberships.join(", ");
        format!("the membership kubeconfig Secrets {gone} are gone")
    } else if i.retry_requested {
        format!("a retry was requested (annotation {RETRY_ANNOTATION})")
    } else {
        return None;
    };
    Some((
        Reason::Repairing,
        format!("{why}; installing {requested} again"),
    ))
}

/// The last install, at the version wanted now, was left `Running`.
fn interrupted(x: &Ctx) -> bool {
    matches!(&x.i.outcome, InstallOutcome::Interrupted { version } if *version == x.i.requested)
}

/// An install runs (or retries after its backoff).
fn run(x: &Ctx, reason: Reason, message: String, plan: &mut PlanBuilder) -> Outcome {
    let mode = if reason == Reason::Repairing || interrupted(x) && x.at_requested {
        Mode::Repair
    } else {
        x.mode
    };
    plan.act(Action::Install { mode });
    // How the last install failed, when it concerns the version wanted now.
    if let InstallOutcome::Failed {
        version,
        error:
            TaskError {
                failure: Some(failure),
                message,
                ..
            },
        backoff,
        ..
    } = &x.i.outcome
        && *version == x.i.requested
    {
        return failed_run(x, *failure, message, *backoff, plan);
    }
    let kept = x.at_requested && !x.hash_differs();
    plan.condition(installed_during(x, kept, reason, &message));
    (
        x.phase,
        Kstatus::reconciling(reason, message),
        Requeue::Poll,
    )
}

/// The last install failed: say why, stall when a person must act, and back off.
fn failed_run(
    x: &Ctx,
    failure: Failure,
    error: &str,
    backoff: bool,
    plan: &mut PlanBuilder,
) -> Outcome {
    let (what, retry) = (&x.what, &x.i.retry);
    plan.retry = retry.clone();
    let stays = match &x.i.installed {
        Some(v) if *v != x.i.requested => format!("; {v} stays installed"),
        _ => String::new(),
    };
    let reason = Reason::Failed(failure);
    if retry.exhausted() {
        plan.actions
            .retain(|a| !matches!(a, Action::Install { .. }));
        let text = format!(
            "{what} failed: {error}{stays}; {}: not retrying until the spec changes or the annotation {RETRY_ANNOTATION} is set to a new value",
            retry.words()
        );
        plan.condition(Cond::no(c::INSTALLED, reason, text.clone()));
        let kstatus = Kstatus::stalled(Reason::RetriesExhausted, text);
        return (Phase::Failed, kstatus, Requeue::Idle);
    }
    let text = format!(
        "{what} failed: {error}{stays}; retrying with backoff ({})",
        retry.words()
    );
    let requeue = if backoff {
        Requeue::Backoff
    } else {
        Requeue::Poll
    };
    if needs_a_person(failure) {
        return stalled(plan, reason, text, requeue);
    }
    plan.condition(Cond::no(c::INSTALLED, reason, text.clone()));
    (x.phase, Kstatus::reconciling(reason, text), requeue)
}

/// Installed as wanted: `Ready`, with a repair preview when one is due.
fn settled(x: &Ctx, plan: &mut PlanBuilder) -> Outcome {
    let message = match &x.i.outcome {
        InstallOutcome::Succeeded { message, .. } => message.clone(),
        _ => format!("{} is installed", x.i.requested),
    };
    plan.condition(Cond::yes(c::INSTALLED, Reason::Installed, message));
    let preview = x.i.repair_due;
    if preview {
        plan.act(Action::Preview);
    }
    let kstatus = Kstatus {
        ready: Some(x.serving()),
        reconciling: preview.then(checking_drift),
        stalled: None,
    };
    let requeue = if preview {
        Requeue::Poll
    } else {
        Requeue::Idle
    };
    (Phase::Ready, kstatus, requeue)
}
