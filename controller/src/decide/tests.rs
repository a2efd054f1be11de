//! The decision, phase by phase and step by step.

use common::conditions as c;
use common::crd::{DeletionPolicy, Phase};

use super::decide;
use super::model::*;
use crate::decide::model::Failure;
use crate::decide::model::Mode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn base() -> Observed {
    Observed {
        uid: "u-1".into(),
        deleting: false,
        suspended: false,
        has_finalizer: true,
        deletion_policy: DeletionPolicy::Retain,
        invalid_spec: None,
        host_namespace: "pi-team-a-one-12345678".into(),
        host: HostNamespace::Ours { current: true },
        release: Release::Deployed {
            chart_version: "0.37.3".into(),
        },
        chart_version: "0.37.3".into(),
        task: TaskState::Idle,
        helm_retry: Retry::default(),
        statefulset_ready: true,
        exported: Exported::Accepted { serves: Some(true) },
        kubeconfig: KubeconfigSecret::Current,
        protection: Protection::Protected,
        cleanup: Cleanup::Missing,
        storage_node: StorageNode::Recorded {
            node: "node-1".into(),
            gone: false,
        },
        pinned: true,
        claims_storage: true,
        recreates: true,
        storage_conflict: None,
        state_exists: true,
        policies_current: true,
        volumes: Vec::new(),
        owner_service: OwnerService::Matches,
        install: InstallObserved {
            requested: "6.0.22".into(),
            installed: Some("6.0.22".into()),
            desired_hash: Some("sha256:aaaa".into()),
            applied_hash: Some("sha256:aaaa".into()),
            outcome: InstallOutcome::Succeeded {
                version: "6.0.22".into(),
                message: "install of @di-framework/platform@6.0.22 applied".into(),
            },
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

/// The last install, at `version`, failed; `backoff`: its task failed in this controller.
fn failed(version: &str, failure: Failure, message: &str, backoff: bool) -> InstallOutcome {
    InstallOutcome::Failed {
        version: version.into(),
        error: TaskError::new(failure, message),
        timed_out: failure == Failure::InstallTimedOut,
        backoff,
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
    (w.status, w.reason.as_str())
}

/// The condition `type_` the plan wants (for its message and severity).
fn want<'a>(plan: &'a Plan, type_: &str) -> &'a super::status::Cond {
    plan.conditions
        .iter()
        .find(|w| w.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_}"))
}

#[test]
fn a_new_instance_gets_its_finalizer_first() {
    let o = Observed {
        has_finalizer: false,
        host: HostNamespace::Missing,
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
        host: HostNamespace::Missing,
        release: Release::Missing,
        statefulset_ready: false,
        exported: Exported::Missing,
        kubeconfig: KubeconfigSecret::Stale,
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
fn queue_places_are_exact_near_the_front_then_ranges() {
    use crate::decide::model::queue_place;
    assert_eq!(queue_place(1), "position 1");
    assert_eq!(queue_place(8), "position 8");
    assert_eq!(queue_place(9), "position 9 to 16");
    assert_eq!(queue_place(16), "position 9 to 16");
    assert_eq!(queue_place(17), "position 17 to 32");
    assert_eq!(queue_place(1000), "position 513 to 1024");
    // How often the message of one instance changes while it moves from 1000 to 1.
    let changes = (1..1000)
        .filter(|p| queue_place(*p) != queue_place(p + 1))
        .count();
    assert_eq!(changes, 7 + 7, "8 exact places and 7 ranges above them");
    // The task queue wakes an instance when this bound changes: it must change exactly when
    // the words do, or a status would keep a stale place (or be woken for nothing).
    for p in 1..2000 {
        assert_eq!(
            queue_place(p) == queue_place(p + 1),
            crate::decide::model::place_bound(p) == crate::decide::model::place_bound(p + 1),
            "positions {p} and {}",
            p + 1
        );
    }
}

#[test]
fn queued_installs_say_their_position() {
    let o = Observed {
        host: HostNamespace::Missing,
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
    assert_eq!(
        plan.requeue,
        Requeue::Queued,
        "a queued instance is woken by the queue, not polled"
    );
}

#[test]
fn waits_for_statefulset_kubeconfig_and_api_in_turn() {
    // The control plane and the exported kubeconfig are watched (their watches wake the
    // instance), so those waits are not polled; the vCluster API is seen by no watch: polled.
    let waiting = |o: Observed| {
        let plan = decide(&o);
        (cond(&plan, c::VCLUSTER_READY), plan.requeue)
    };
    assert_eq!(
        waiting(Observed {
            statefulset_ready: false,
            ..base()
        }),
        ((false, "WaitingForControlPlane"), Requeue::Watched)
    );
    assert_eq!(
        waiting(Observed {
            exported: Exported::Missing,
            ..base()
        }),
        ((false, "WaitingForKubeconfig"), Requeue::Watched)
    );
    assert_eq!(
        waiting(Observed {
            exported: Exported::Accepted {
                serves: Some(false)
            },
            ..base()
        }),
        ((false, "WaitingForAPI"), Requeue::Poll)
    );
}

#[test]
fn a_serving_vcluster_gets_its_kubeconfig_written_and_reaches_installing() {
    let plan = decide(&Observed {
        kubeconfig: KubeconfigSecret::Stale,
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
    queued.install.outcome = InstallOutcome::Queued(3);
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
    assert_eq!(plan.requeue, Requeue::Queued);
    let mut running = fresh();
    running.install.outcome = InstallOutcome::Running;
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
        i.outcome = failed(
            "6.0.23",
            Failure::InstallFailed,
            "pulumi up failed (exit 255): stand-in failure",
            true,
        );
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
fn an_upgrade_to_a_version_the_registry_lacks_is_failed_not_upgrading() {
    // spec.version 6.0.99 is not in the registry: kstatus computes the instance as Failed
    // (Stalled=True), and the phase says so too.
    let plan = decide(&with_install(|i| {
        i.requested = "6.0.99".into();
        i.outcome = failed(
            "6.0.99",
            Failure::VersionNotFound,
            "@di-framework/platform@6.0.99 is not in the npm registry",
            true,
        );
    }));
    assert_eq!(cond(&plan, c::STALLED), (true, "VersionNotFound"));
    assert_eq!(cond(&plan, c::READY), (false, "VersionNotFound"));
    assert_eq!(plan.phase, Phase::Failed);
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
        o.install.outcome = failed("6.0.22", failure, "why", true);
        let plan = decide(&o);
        assert_eq!(cond(&plan, c::INSTALLED), (false, <&str>::from(failure)));
        assert_eq!(cond(&plan, c::STALLED).0, stalled, "{failure:?}");
        assert_eq!(
            plan.phase,
            if stalled {
                Phase::Failed
            } else {
                Phase::Installing
            },
            "the phase agrees with Stalled ({failure:?})"
        );
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
        i.outcome = InstallOutcome::Interrupted {
            version: "6.0.22".into(),
        };
    }));
    assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
    assert_eq!(cond(&plan, c::RECONCILING), (true, "Resuming"));
    let mut o = fresh();
    o.install.outcome = InstallOutcome::Interrupted {
        version: "6.0.22".into(),
    };
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
fn changed_quotas_upgrade_the_vcluster_release() {
    let mut o = base();
    o.policies_current = false;
    let plan = decide(&o);
    assert_eq!(plan.actions, [Action::InstallVCluster { recover: false }]);
    assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "Upgrading"));
}

#[test]
fn warn_reports_drift_and_changes_nothing_and_off_previews_nothing() {
    use common::crd::RepairMode;
    let drift = "drift: putting it back would create 1 (create ConfigMap settings)";
    let plan = decide(&with_install(|i| {
        i.repair_mode = RepairMode::Warn;
        i.drift = Some(drift.into());
    }));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.phase, Phase::Ready);
    assert_eq!(cond(&plan, c::DRIFT_DETECTED), (true, "DriftDetected"));
    assert_eq!(cond(&plan, c::READY), (true, "Installed"));
    let warned = plan
        .conditions
        .iter()
        .find(|w| w.type_ == c::DRIFT_DETECTED);
    let message = &warned.expect("DriftDetected").message;
    assert!(
        message.contains("ConfigMap settings") && message.contains("Warn"),
        "{message}"
    );
    let plan = decide(&with_install(|i| {
        i.repair_mode = RepairMode::Warn;
        i.preview_failed = Some("pulumi preview failed".into());
    }));
    assert!(
        plan.actions.is_empty(),
        "a failed preview repairs nothing either"
    );
    let plan = decide(&with_install(|i| {
        i.repair_mode = RepairMode::Warn;
        i.drift = Some(drift.into());
        i.repair_due = true;
    }));
    assert_eq!(plan.actions, [Action::Preview], "the tick still previews");
    // Off: no DriftDetected, and an old finding repairs nothing.
    let plan = decide(&with_install(|i| {
        i.repair_mode = RepairMode::Off;
        i.drift = Some(drift.into());
    }));
    assert!(plan.actions.is_empty());
    assert!(!plan.conditions.iter().any(|w| w.type_ == c::DRIFT_DETECTED));
}

#[test]
fn a_manual_upgrade_is_previewed_then_waits_for_its_approval() {
    let manual = |i: &mut InstallObserved| {
        i.requested = "6.0.23".into();
        i.needs_approval = true;
    };
    // Not previewed yet: a preview, the installed version still Ready.
    let plan = decide(&with_install(manual));
    assert_eq!(plan.actions, [Action::PreviewUpgrade]);
    assert_eq!(cond(&plan, c::UPGRADE_PENDING), (true, "PreviewingUpgrade"));
    assert_eq!(cond(&plan, c::READY), (true, "Installed"));
    let plan = decide(&with_install(|i| {
        manual(i);
        i.preview_task = TaskState::Running;
    }));
    assert!(plan.actions.is_empty(), "one preview at a time");
    assert_eq!(cond(&plan, c::RECONCILING), (true, "PreviewingUpgrade"));
    // Previewed: nothing runs, the condition says what it found and how to approve.
    let found = "create 0, update 1 and delete 0 resources (update ConfigMap platform-settings)";
    let plan = decide(&with_install(|i| {
        manual(i);
        i.upgrade_preview = Some(found.into());
    }));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.phase, Phase::Ready);
    assert_eq!(cond(&plan, c::UPGRADE_PENDING), (true, "UpgradePending"));
    let pending = plan
        .conditions
        .iter()
        .find(|w| w.type_ == c::UPGRADE_PENDING);
    let message = &pending.expect("UpgradePending").message;
    assert!(
        message.contains(found) && message.contains("approve=6.0.23"),
        "{message}"
    );
    // Approved (or Automatic): the upgrade runs, and nothing is pending.
    let plan = decide(&with_install(|i| {
        manual(i);
        i.upgrade_preview = Some(found.into());
        i.needs_approval = false;
    }));
    assert_eq!(
        plan.actions,
        [Action::Install {
            mode: Mode::Upgrade
        }]
    );
    assert!(
        !plan
            .conditions
            .iter()
            .any(|w| w.type_ == c::UPGRADE_PENDING)
    );
    // At the installed version, approval is never needed.
    let plan = decide(&with_install(|i| i.needs_approval = true));
    assert!(plan.actions.is_empty());
    assert!(
        !plan
            .conditions
            .iter()
            .any(|w| w.type_ == c::UPGRADE_PENDING)
    );
}

#[test]
fn missing_membership_secrets_are_written_again_at_the_repair_tick() {
    let missing = || vec!["one.acme.dev.kubeconfig".to_string()];
    let plan = decide(&with_install(|i| i.missing_memberships = missing()));
    assert!(plan.actions.is_empty(), "not before the repair tick");
    let plan = decide(&with_install(|i| {
        i.repair_due = true;
        i.missing_memberships = missing();
    }));
    assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
    assert_eq!(cond(&plan, c::RECONCILING), (true, "Repairing"));
    assert!(
        plan.conditions
            .iter()
            .any(|c| c.message.contains("one.acme.dev.kubeconfig")),
        "{:?}",
        plan.conditions
    );
}

#[test]
fn a_failed_run_at_another_version_is_put_back_at_once() {
    // 6.0.22 installed; the upgrade to 6.0.24 timed out; spec.version is set back.
    let plan = decide(&with_install(|i| {
        i.outcome = failed("6.0.24", Failure::InstallTimedOut, "timed out", false);
    }));
    assert_eq!(plan.actions, [Action::Install { mode: Mode::Repair }]);
    assert_eq!(cond(&plan, c::RECONCILING), (true, "Repairing"));
    assert_eq!(cond(&plan, c::INSTALLED), (true, "Installed"));
    // A repair that failed at the installed version is retried (with backoff), not Ready.
    let plan = decide(&with_install(|i| {
        i.outcome = failed("6.0.22", Failure::InstallFailed, "boom", true);
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
    o.install.outcome = InstallOutcome::Running;
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
        task: TaskState::Failed("boom".to_string().into()),
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
    let plan = decide(&Observed {
        owner_service: OwnerService::Missing,
        ..base()
    });
    assert_eq!(plan.actions, [Action::RestoreOwnerService]);
    assert_eq!(
        cond(&plan, c::VCLUSTER_READY),
        (false, "OwnerServiceRestoring")
    );
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
        host: HostNamespace::Foreign("team-b/other".into()),
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

#[test]
fn an_unreadable_record_stalls_instead_of_starting_afresh() {
    let mut o = base();
    o.install.installed = None;
    o.install.record_error =
        Some("the install record /state/a/b/install.json cannot be read".into());
    let plan = decide(&o);
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::Install { .. } | Action::Preview)),
        "{:?}",
        plan.actions
    );
    assert_eq!(cond(&plan, c::STALLED), (true, "StateUnavailable"));
    assert_eq!(cond(&plan, c::INSTALLED), (false, "StateUnavailable"));
}

fn deleting(policy: DeletionPolicy) -> Observed {
    Observed {
        deleting: true,
        deletion_policy: policy,
        ..base()
    }
}

/// Issue 30, item 6: with `Retain`, the volumes bound in the host namespace are set to `Retain`
/// and recorded before the namespace is deleted (in that order, so a failed patch keeps it);
/// `Delete` and a namespace already going leave them.
#[test]
fn retain_keeps_the_volumes_before_the_namespace_goes() {
    let volumes = vec![("pv-a".to_string(), false), ("pv-b".to_string(), true)];
    let gone = |policy, host| Observed {
        release: Release::Missing,
        volumes: volumes.clone(),
        host,
        ..deleting(policy)
    };
    let ours = HostNamespace::Ours { current: true };
    let plan = decide(&gone(DeletionPolicy::Retain, ours.clone()));
    assert_eq!(
        plan.actions,
        [
            Action::RetainVolumes(volumes.clone()),
            Action::DeleteNamespace
        ]
    );
    let plan = decide(&gone(DeletionPolicy::Delete, ours));
    assert_eq!(plan.actions, [Action::DeleteNamespace]);
    let plan = decide(&gone(DeletionPolicy::Retain, HostNamespace::Terminating));
    assert!(plan.actions.is_empty());
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
        host: HostNamespace::Terminating,
        ..deleting(DeletionPolicy::Retain)
    });
    assert!(plan.actions.is_empty(), "wait for the namespace");
    let plan = decide(&Observed {
        task: TaskState::Running,
        ..deleting(DeletionPolicy::Delete)
    });
    assert!(plan.actions.is_empty(), "wait for helm");
    // A helm task still waiting for a slot has not started: it is cancelled at once rather
    // than waited for behind the whole queue.
    let plan = decide(&Observed {
        task: TaskState::Queued(7),
        release: Release::Missing,
        ..deleting(DeletionPolicy::Delete)
    });
    assert_eq!(plan.actions, [Action::CancelHelm]);
    assert_eq!(plan.requeue, Requeue::Poll);
}

#[test]
fn retain_keeps_storage_and_state() {
    let plan = decide(&Observed {
        release: Release::Missing,
        host: HostNamespace::Missing,
        ..deleting(DeletionPolicy::Retain)
    });
    assert_eq!(plan.actions, [Action::RemoveFinalizer]);
}

#[test]
fn delete_cleans_storage_then_state_then_lets_go() {
    let gone = Observed {
        release: Release::Missing,
        host: HostNamespace::Missing,
        ..deleting(DeletionPolicy::Delete)
    };
    assert_eq!(
        decide(&gone).actions,
        [Action::StartCleanup("node-1".into())]
    );
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
    assert_eq!(failed.requeue, Requeue::Poll);
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
        task: TaskState::Failed("timeout".to_string().into()),
        ..deleting(DeletionPolicy::Delete)
    });
    assert_eq!(plan.actions, [Action::UninstallVCluster]);
    assert_eq!(plan.requeue, Requeue::Backoff);
    assert!(!plan.actions.contains(&Action::RemoveFinalizer));
}

#[test]
fn a_failure_the_record_missed_is_reported_from_the_task() {
    // The install could not write its record: the record still shows the last success.
    let mut o = with_install(|i| i.requested = "6.0.23".into());
    let record = crate::decide::model::Record {
        installed_version: Some("6.0.22".into()),
        ..Default::default()
    };
    let error = TaskError::new(
        Failure::StateUnavailable,
        "writing the install record failed",
    );
    o.install.outcome = InstallOutcome::fold(TaskState::Failed(error), &record, "6.0.23");
    let plan = decide(&o);
    assert_eq!(cond(&plan, c::INSTALLED), (false, "StateUnavailable"));
    assert_eq!(cond(&plan, c::STALLED), (true, "StateUnavailable"));
    assert_eq!(plan.requeue, Requeue::Backoff);
}

// Issue 15: ownership and fault safety.

/// Deleting with `Delete`, the vCluster and the host namespace gone: the cleanup's turn.
fn cleaning() -> Observed {
    Observed {
        release: Release::Missing,
        host: HostNamespace::Missing,
        ..deleting(DeletionPolicy::Delete)
    }
}

/// Every action that removes, uninstalls or cleans something.
fn destructive(plan: &Plan) -> Vec<&Action> {
    plan.actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::UninstallVCluster
                    | Action::DeleteNamespace
                    | Action::StartCleanup(_)
                    | Action::ReplaceCleanup
                    | Action::RemoveState
                    | Action::DeleteKubeconfig
            )
        })
        .collect()
}

#[test]
fn deletion_leaves_a_host_namespace_of_another_instance_alone() {
    // Another instance maps to the same host namespace (its annotation names it): with either
    // policy, at any step, nothing of it is uninstalled, deleted or cleaned.
    for policy in [DeletionPolicy::Retain, DeletionPolicy::Delete] {
        for release in [
            Release::Missing,
            Release::Deployed {
                chart_version: "0.37.3".into(),
            },
        ] {
            for cleanup in [Cleanup::Missing, Cleanup::Complete, Cleanup::Stale] {
                let o = Observed {
                    host: HostNamespace::Foreign("team-b/other".into()),
                    kubeconfig: KubeconfigSecret::Stale,
                    release: release.clone(),
                    cleanup: cleanup.clone(),
                    ..deleting(policy)
                };
                let plan = decide(&o);
                assert_eq!(
                    plan.actions,
                    [Action::RemoveFinalizer],
                    "{policy:?} {release:?} {cleanup:?}"
                );
                let (status, reason) = cond(&plan, c::READY);
                assert_eq!((status, reason), (false, "LeftAlone"));
                let message = &want(&plan, c::READY).message;
                assert!(
                    message.contains("team-b/other") && message.contains("pi-team-a-one-12345678"),
                    "the Event says what was left alone: {message}"
                );
            }
        }
    }
    // Its own kubeconfig Secret still goes with Delete; never one that is not its own.
    let own = decide(&Observed {
        host: HostNamespace::Foreign("team-b/other".into()),
        ..deleting(DeletionPolicy::Delete)
    });
    assert_eq!(
        own.actions,
        [Action::DeleteKubeconfig, Action::RemoveFinalizer]
    );
    let foreign = decide(&Observed {
        host: HostNamespace::Foreign("team-b/other".into()),
        kubeconfig: KubeconfigSecret::Foreign("one-kubeconfig".into()),
        ..deleting(DeletionPolicy::Delete)
    });
    assert!(destructive(&foreign).is_empty(), "{:?}", foreign.actions);
}

#[test]
fn a_cleanup_job_of_another_uid_is_replaced_not_believed() {
    let gone = cleaning();
    let plan = decide(&Observed {
        cleanup: Cleanup::Stale,
        ..gone.clone()
    });
    assert_eq!(plan.actions, [Action::ReplaceCleanup]);
    assert_eq!(plan.requeue, Requeue::Poll);
    assert_eq!(cond(&plan, c::RECONCILING), (true, "CleaningStorage"));
}

#[test]
fn a_blocked_or_timed_out_cleanup_says_why_and_keeps_the_finalizer() {
    let gone = cleaning();
    let blocked = decide(&Observed {
        cleanup: Cleanup::Blocked("pods \"x\" is forbidden: exceeded quota".into()),
        ..gone.clone()
    });
    assert!(blocked.actions.is_empty());
    assert_eq!(blocked.requeue, Requeue::Poll);
    assert_eq!(cond(&blocked, c::READY), (false, "CleanupBlocked"));
    let ready = want(&blocked, c::READY);
    assert!(
        ready.message.contains("exceeded quota"),
        "{}",
        ready.message
    );
    assert_eq!(ready.severity(), kube::runtime::events::EventType::Warning);
    let late = decide(&Observed {
        cleanup: Cleanup::TimedOut("Job was active longer than specified deadline".into()),
        ..gone
    });
    assert!(
        late.actions.is_empty(),
        "a timed-out cleanup never drops the finalizer"
    );
    assert_eq!(cond(&late, c::STALLED), (true, "CleanupTimedOut"));
    assert_eq!(
        late.requeue,
        Requeue::Poll,
        "a stalled cleanup waits for a person on the poll cadence, not every second"
    );
}

#[test]
fn a_kubeconfig_secret_of_someone_else_is_never_written_or_deleted() {
    let conflict = Observed {
        kubeconfig: KubeconfigSecret::Foreign("one-kubeconfig".into()),
        ..fresh()
    };
    let plan = decide(&conflict);
    assert!(
        !plan.actions.contains(&Action::WriteKubeconfig),
        "{:?}",
        plan.actions
    );
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::Install { .. })),
        "{:?}",
        plan.actions
    );
    assert_eq!(
        cond(&plan, c::KUBECONFIG_READY),
        (false, "KubeconfigSecretConflict")
    );
    assert_eq!(cond(&plan, c::STALLED), (true, "KubeconfigSecretConflict"));
    let message = &want(&plan, c::KUBECONFIG_READY).message;
    assert!(
        message.contains("one-kubeconfig") && message.contains("u-1"),
        "{message}"
    );
    // Deleting with Delete: everything else goes, that Secret stays.
    let done = decide(&Observed {
        cleanup: Cleanup::Complete,
        kubeconfig: KubeconfigSecret::Foreign("one-kubeconfig".into()),
        ..cleaning()
    });
    assert_eq!(done.actions, [Action::RemoveState, Action::RemoveFinalizer]);
    assert_eq!(cond(&done, c::READY), (false, "LeftAlone"));
}

#[test]
fn an_installed_version_newer_than_the_requested_one_is_not_run_over() {
    // Deleted with Retain at 6.0.22 and created again at 6.0.10: the record says 6.0.22.
    let o = with_install(|i| i.requested = "6.0.10".into());
    let plan = decide(&o);
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::Install { .. })),
        "{:?}",
        plan.actions
    );
    assert_eq!(cond(&plan, c::INSTALLED), (false, "DowngradeRefused"));
    assert_eq!(cond(&plan, c::STALLED), (true, "DowngradeRefused"));
    assert_eq!(plan.phase, Phase::Failed);
    // Pre-releases order below their release.
    let pre = decide(&with_install(|i| i.requested = "6.0.22-rc.1".into()));
    assert_eq!(cond(&pre, c::STALLED), (true, "DowngradeRefused"));
    // The annotation allows it on purpose.
    let allowed = decide(&with_install(|i| {
        i.requested = "6.0.10".into();
        i.downgrade_allowed = true;
    }));
    assert_eq!(
        allowed.actions,
        [Action::Install {
            mode: Mode::Upgrade
        }]
    );
    // An upgrade is not a downgrade.
    let up = decide(&with_install(|i| i.requested = "6.1.0".into()));
    assert_eq!(
        up.actions,
        [Action::Install {
            mode: Mode::Upgrade
        }]
    );
}

#[test]
fn a_refused_exported_kubeconfig_stops_provisioning() {
    let o = Observed {
        exported: Exported::Refused("user \"x\" sets exec".into()),
        kubeconfig: KubeconfigSecret::Stale,
        ..fresh()
    };
    let plan = decide(&o);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "KubeconfigRefused"));
    assert_eq!(cond(&plan, c::STALLED), (true, "KubeconfigRefused"));
    assert_eq!(
        plan.requeue,
        Requeue::Watched,
        "only a new exported kubeconfig (watched) changes it"
    );
    let message = &want(&plan, c::STALLED).message;
    assert!(
        message.contains("sets exec") && message.contains("vc-vcluster"),
        "{message}"
    );
}

#[test]
fn a_helm_run_killed_at_its_limit_says_so() {
    let timed_out = TaskError::new(
        Failure::InstallTimedOut,
        "helm upgrade --install ran longer",
    );
    let plan = decide(&Observed {
        release: Release::Missing,
        task: TaskState::Failed(timed_out.clone()),
        ..fresh()
    });
    assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "HelmTimedOut"));
    assert_eq!(plan.requeue, Requeue::Backoff);
    let plan = decide(&Observed {
        task: TaskState::Failed(timed_out),
        ..deleting(DeletionPolicy::Delete)
    });
    assert_eq!(plan.actions, [Action::UninstallVCluster]);
    assert_eq!(cond(&plan, c::READY), (false, "HelmTimedOut"));
}

#[test]
fn a_failed_action_reaches_status() {
    let plan = super::status::act_failed(
        decide(&base()),
        "writing the kubeconfig Secret failed: forbidden",
    );
    assert_eq!(cond(&plan, c::READY), (false, "ReconcileFailed"));
    assert_eq!(cond(&plan, c::RECONCILING), (true, "ReconcileFailed"));
    assert_eq!(
        cond(&plan, c::INSTALLED),
        (true, "Installed"),
        "details stay"
    );
    let ready = want(&plan, c::READY);
    assert!(ready.message.contains("forbidden"), "{}", ready.message);
    assert_eq!(ready.severity(), kube::runtime::events::EventType::Warning);
}

#[test]
fn the_control_plane_is_recorded_pinned_and_stalls_when_its_node_is_gone() {
    let first = decide(&Observed {
        storage_node: StorageNode::Scheduled("node-2".into()),
        ..base()
    });
    assert!(
        first
            .actions
            .contains(&Action::RecordStorageNode("node-2".into()))
    );
    let unpinned = decide(&Observed {
        pinned: false,
        ..base()
    });
    assert!(
        unpinned
            .actions
            .contains(&Action::InstallVCluster { recover: false })
    );
    assert_eq!(cond(&unpinned, c::VCLUSTER_READY), (false, "Upgrading"));
    assert!(
        want(&unpinned, c::VCLUSTER_READY)
            .message
            .contains("node-1")
    );
    let gone = decide(&Observed {
        statefulset_ready: false,
        storage_node: StorageNode::Recorded {
            node: "node-1".into(),
            gone: true,
        },
        ..base()
    });
    assert!(gone.actions.is_empty(), "{:?}", gone.actions);
    assert_eq!(gone.phase, Phase::Failed);
    assert_eq!(cond(&gone, c::STALLED), (true, "StorageNodeGone"));
    assert_eq!(cond(&gone, c::VCLUSTER_READY), (false, "StorageNodeGone"));
    assert!(want(&gone, c::STALLED).message.contains("node-1"));
}

#[test]
fn a_storage_directory_of_another_instance_stops_the_instance_and_is_never_taken() {
    // The control plane's init container refused the directory: stalled, nothing acted on.
    let refused = decide(&Observed {
        statefulset_ready: false,
        storage_conflict: Some("it belongs to instance team-b/other (uid u-9)".into()),
        ..base()
    });
    assert!(refused.actions.is_empty(), "{:?}", refused.actions);
    assert_eq!(refused.phase, Phase::Failed);
    assert_eq!(cond(&refused, c::STALLED), (true, "StorageConflict"));
    assert_eq!(
        cond(&refused, c::VCLUSTER_READY),
        (false, "StorageConflict")
    );
    assert!(want(&refused, c::STALLED).message.contains("team-b/other"));
    // A control plane without the check (installed by an earlier release) is upgraded to it.
    let unchecked = decide(&Observed {
        claims_storage: false,
        ..base()
    });
    assert!(
        unchecked
            .actions
            .contains(&Action::InstallVCluster { recover: false })
    );
    assert!(
        want(&unchecked, c::VCLUSTER_READY)
            .message
            .contains("storage owner check")
    );
    // A control plane that rolls (installed by an earlier release, or patched) is upgraded.
    let rolls = decide(&Observed {
        recreates: false,
        ..base()
    });
    assert!(
        rolls
            .actions
            .contains(&Action::InstallVCluster { recover: false })
    );
    assert!(want(&rolls, c::VCLUSTER_READY).message.contains("Recreate"));
    // The cleanup Job refused it: stalled, the finalizer kept, no new Job.
    let cleanup = decide(&Observed {
        cleanup: Cleanup::Conflict("exit code 3 matching FailJob rule".into()),
        ..cleaning()
    });
    assert_eq!(cond(&cleanup, c::STALLED), (true, "StorageConflict"));
    assert!(
        !cleanup.actions.iter().any(|a| matches!(
            a,
            Action::RemoveFinalizer | Action::StartCleanup(_) | Action::ReplaceCleanup
        )),
        "{:?}",
        cleanup.actions
    );
}

#[test]
fn a_cleanup_runs_only_on_its_storage_node_and_waits_while_it_is_gone() {
    let gone = Observed {
        storage_node: StorageNode::Recorded {
            node: "node-1".into(),
            gone: true,
        },
        ..cleaning()
    };
    for cleanup in [Cleanup::Missing, Cleanup::Running] {
        let plan = decide(&Observed {
            cleanup: cleanup.clone(),
            ..gone.clone()
        });
        assert!(plan.actions.is_empty(), "{cleanup:?}: {:?}", plan.actions);
        assert_eq!(cond(&plan, c::READY), (false, "CleanupBlocked"));
        assert!(want(&plan, c::READY).message.contains("node-1"));
    }
    // Completed there before the node went: done.
    let done = decide(&Observed {
        cleanup: Cleanup::Complete,
        ..gone
    });
    assert!(done.actions.contains(&Action::RemoveFinalizer));
    // No control plane pod was ever scheduled: no node holds storage, no Job runs anywhere.
    let never = decide(&Observed {
        storage_node: StorageNode::Unknown,
        ..cleaning()
    });
    assert!(
        !never
            .actions
            .iter()
            .any(|a| matches!(a, Action::StartCleanup(_)))
    );
    assert!(never.actions.contains(&Action::RemoveFinalizer));
}

#[test]
fn a_suspended_instance_starts_nothing_but_is_still_deleted() {
    // Work an unsuspended instance would start: the first install.
    let working = decide(&fresh());
    assert!(working.actions.contains(&Action::Install {
        mode: Mode::Install
    }));
    let plan = decide(&Observed {
        suspended: true,
        ..fresh()
    });
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(cond(&plan, c::SUSPENDED), (true, "Suspended"));
    assert_eq!(cond(&plan, c::RECONCILING), (false, "Suspended"));
    assert_eq!(cond(&plan, c::READY), (false, "Suspended"));
    assert!(want(&plan, c::READY).message.contains("installing 6.0.22"));
    assert_eq!(plan.requeue, Requeue::Idle);
    // Queued work leaves the queue; the finalizer is still added; a serving instance stays Ready.
    let new = Observed {
        suspended: true,
        has_finalizer: false,
        ..fresh()
    };
    assert_eq!(decide(&new).actions, [Action::AddFinalizer]);
    let queued = Observed {
        suspended: true,
        task: TaskState::Queued(3),
        ..fresh()
    };
    assert_eq!(decide(&queued).actions, [Action::CancelHelm]);
    let ready = decide(&Observed {
        suspended: true,
        ..base()
    });
    assert_eq!(cond(&ready, c::READY), (true, "Installed"));
    let deleting = Observed {
        suspended: true,
        deleting: true,
        ..base()
    };
    assert_eq!(
        decide(&deleting),
        decide(&Observed {
            suspended: false,
            ..deleting.clone()
        })
    );
    assert!(!decide(&deleting).actions.is_empty());
}

#[test]
fn failures_retry_with_their_time_until_max_retries_then_stall() {
    let at = Time("2026-12-01T00:00:10Z".parse().expect("time"));
    let retry = |failures| Retry {
        failures,
        at: Some(at.clone()),
        max: 2,
    };
    // Helm: the first failure retries, saying when; the second stops it.
    let helm = |failures, task| Observed {
        release: Release::Failed("failed".into()),
        task,
        helm_retry: retry(failures),
        ..base()
    };
    let boom = || TaskState::Failed("boom".to_string().into());
    let plan = decide(&helm(1, boom()));
    assert_eq!(plan.actions, [Action::InstallVCluster { recover: false }]);
    assert_eq!(
        (plan.retry.failures, plan.retry.at.clone()),
        (1, Some(at.clone()))
    );
    let message = &want(&plan, c::VCLUSTER_READY).message;
    assert!(
        message.contains("failure 1 of --max-retries 2; the next try runs at 2026-12-01T00:00:10Z"),
        "{message}"
    );
    assert_eq!(cond(&plan, c::STALLED), (false, "Progressing"));
    for task in [boom(), TaskState::Idle] {
        // Idle: after a restart, with the status's count.
        let plan = decide(&helm(2, task));
        assert!(plan.actions.is_empty(), "{:?}", plan.actions);
        assert_eq!(cond(&plan, c::VCLUSTER_READY), (false, "InstallFailed"));
        assert_eq!(cond(&plan, c::STALLED), (true, "RetriesExhausted"));
        assert_eq!((plan.phase, plan.requeue), (Phase::Failed, Requeue::Idle));
        assert_eq!(plan.retry.failures, 2);
    }
    // Installs: the same, the failure's own reason kept on Installed.
    let install = |failures| {
        with_install(|i| {
            i.requested = "6.0.23".into();
            i.outcome = failed("6.0.23", Failure::InstallFailed, "boom", true);
            i.retry = retry(failures);
        })
    };
    let plan = decide(&install(1));
    assert_eq!(
        plan.actions,
        [Action::Install {
            mode: Mode::Upgrade
        }]
    );
    assert_eq!(plan.requeue, Requeue::Backoff);
    let plan = decide(&install(2));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(cond(&plan, c::INSTALLED), (false, "InstallFailed"));
    assert_eq!(cond(&plan, c::STALLED), (true, "RetriesExhausted"));
    let message = &want(&plan, c::STALLED).message;
    assert!(
        message.contains("6.0.22 stays installed; failure 2 of --max-retries 2"),
        "{message}"
    );
    assert_eq!(plan.phase, Phase::Failed);
    // 0 is no bound.
    let unbounded = Retry {
        max: 0,
        ..retry(50)
    };
    assert!(!unbounded.exhausted());
}
