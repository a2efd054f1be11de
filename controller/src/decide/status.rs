//! What the status says: the documented condition reasons ([`Reason`]) and their Event severity,
//! the conditions a plan wants ([`Cond`]), the kstatus triple `Ready`, `Reconciling`,
//! `Stalled` ([`Kstatus`]), and the `OwnerServiceProtected` condition.

use common::conditions::{self as c, Want};

use super::model::Protection;
use crate::decide::model::Failure;

/// Every documented condition reason the controller sets (see `docs/reference.md`), named in
/// status and Events by its variant's name (`strum`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
pub enum Reason {
    /// Adding the finalizer.
    AddingFinalizer,
    /// `spec` cannot be acted on.
    InvalidSpec,
    /// The host namespace belongs to another instance.
    HostNamespaceConflict,
    /// The host namespace is still being deleted.
    HostNamespaceTerminating,
    /// The host namespace and its NetworkPolicy are applied.
    HostNamespaceApplied,
    /// `service/vcluster` is being put back.
    OwnerServiceRestoring,
    /// Waiting for an install slot.
    Queued,
    /// Installing (the vCluster or the platform).
    Installing,
    /// Helm failed on the vCluster (the same word as [`Failure::InstallFailed`]).
    #[strum(serialize = "InstallFailed")]
    HelmFailed,
    /// Recovering a release an interrupted helm left pending.
    RecoveringRelease,
    /// Upgrading the vCluster chart.
    Upgrading,
    /// Waiting for the vCluster control plane (the Deployment `vcluster`).
    WaitingForControlPlane,
    /// Waiting for the vCluster to export its kubeconfig.
    WaitingForKubeconfig,
    /// Waiting for the vCluster API to answer.
    WaitingForAPI,
    /// The vCluster serves its API.
    VClusterServing,
    /// Waiting for the vCluster before writing the kubeconfig or installing.
    WaitingForVCluster,
    /// The admin kubeconfig is written.
    KubeconfigWritten,
    /// The vCluster is coming up.
    Provisioning,
    /// The installer is turned off.
    InstallerDisabled,
    /// A repair preview runs.
    CheckingDrift,
    /// The program's config cannot be put together.
    ConfigUnavailable,
    /// An interrupted install runs again.
    Resuming,
    /// The installed version is installed again.
    Repairing,
    /// The platform is installed.
    Installed,
    /// The repair preview found drift.
    DriftDetected,
    /// No drift found.
    NoDrift,
    /// An install or preview failed, for the reason given.
    Failed(Failure),
    /// The admission policy is active.
    PolicyActive,
    /// The API server serves no admission policies.
    AdmissionPoliciesUnavailable,
    /// Creating the admission policy failed.
    PolicyFailed,
    /// The admission policy was not checked yet.
    PolicyPending,
    /// Deletion: helm uninstalls the vCluster.
    UninstallingVCluster,
    /// Deletion: helm uninstall failed.
    UninstallFailed,
    /// Deletion: the host namespace goes.
    DeletingHostNamespace,
    /// Deletion: the storage cleanup Job runs.
    CleaningStorage,
    /// Deletion: the storage cleanup Job failed.
    CleanupFailed,
    /// Deletion: removing the finalizer.
    Finalizing,
    /// Deletion: the host namespace (or another object) carries another instance's marks; it
    /// was left untouched and the finalizer dropped.
    LeftAlone,
    /// A Secret named like the instance's kubeconfig Secret is not this instance's.
    KubeconfigSecretConflict,
    /// The kubeconfig the vCluster exported asks for more than inline credentials.
    KubeconfigRefused,
    /// The installed version is newer than `spec.version` and no downgrade was allowed.
    DowngradeRefused,
    /// Deletion: the cleanup Job's pod cannot be created.
    CleanupBlocked,
    /// Deletion: the cleanup Job ran past `--cleanup-deadline`.
    CleanupTimedOut,
    /// A helm run took longer than `--helm-timeout` and was killed.
    HelmTimedOut,
    /// An action of the reconcile failed (an API write); it is retried with backoff.
    ReconcileFailed,
    /// kstatus: nothing is reconciling.
    Idle,
    /// kstatus: working, or not stalled.
    Progressing,
}

/// The severity of the Event that reports a condition change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl Reason {
    /// The CamelCase word in status and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Failed(f) => f.reason(),
            reason => reason.into(),
        }
    }

    /// Whether a change to this reason is worth a `Warning` Event by itself: failures,
    /// conflicts, drift, and what stops an install until someone acts. (`ToolMissing` and
    /// `StateUnavailable` warn through `Stalled=True`.)
    pub fn warns(self) -> bool {
        use Reason::*;
        match self {
            HostNamespaceConflict
            | HelmFailed
            | PolicyFailed
            | UninstallFailed
            | CleanupFailed
            | LeftAlone
            | KubeconfigSecretConflict
            | KubeconfigRefused
            | DowngradeRefused
            | CleanupBlocked
            | CleanupTimedOut
            | HelmTimedOut
            | ReconcileFailed
            | DriftDetected
            | ConfigUnavailable => true,
            Failed(f) => !matches!(f, Failure::StateUnavailable | Failure::ToolMissing),
            _ => false,
        }
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A condition a plan wants: type, status, typed reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    /// The condition type (one of [`common::conditions`]).
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// The reason.
    pub reason: Reason,
    /// What happened and, for a failure, what to do.
    pub message: String,
}

impl Cond {
    /// A condition that holds.
    pub fn yes(type_: &'static str, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: true,
            reason,
            message: message.into(),
        }
    }

    /// A condition that does not hold.
    pub fn no(type_: &'static str, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: false,
            reason,
            message: message.into(),
        }
    }

    /// The condition as [`common::conditions::merge`] takes it.
    pub fn want(&self) -> Want {
        Want {
            type_: self.type_,
            status: self.status,
            reason: self.reason.as_str(),
            message: self.message.clone(),
        }
    }

    /// The severity of the Event that reports a change to this condition.
    pub fn severity(&self) -> Severity {
        if (self.type_ == c::STALLED && self.status) || self.reason.warns() {
            Severity::Warning
        } else {
            Severity::Normal
        }
    }
}

/// A reason with its message: one of the kstatus conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The reason.
    pub reason: Reason,
    /// The message.
    pub message: String,
}

impl Step {
    /// A step.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// The kstatus triple: `Ready` when ready is set, else `Ready=False` with the stalled or
/// reconciling reason; `Reconciling` and `Stalled` when set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kstatus {
    /// `Ready=True` with this.
    pub ready: Option<Step>,
    /// `Reconciling=True` with this.
    pub reconciling: Option<Step>,
    /// `Stalled=True` with this.
    pub stalled: Option<Step>,
}

impl Kstatus {
    /// Reconciling, not ready, not stalled.
    pub fn reconciling(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reconciling: Some(Step::new(reason, message)),
            ..Self::default()
        }
    }

    /// Stalled, not ready, not reconciling.
    pub fn stalled(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            stalled: Some(Step::new(reason, message)),
            ..Self::default()
        }
    }

    /// The three conditions.
    pub fn conditions(self) -> [Cond; 3] {
        let ready = match self.ready {
            Some(s) => Cond::yes(c::READY, s.reason, s.message),
            None => {
                let s = self.stalled.clone().or_else(|| self.reconciling.clone());
                let s = s.unwrap_or_else(|| {
                    Step::new(
                        Reason::Progressing,
                        "the controller is working on the instance",
                    )
                });
                Cond::no(c::READY, s.reason, s.message)
            }
        };
        let reconciling = match self.reconciling {
            Some(s) => Cond::yes(c::RECONCILING, s.reason, s.message),
            None => Cond::no(c::RECONCILING, Reason::Idle, "nothing to do"),
        };
        let stalled = match self.stalled {
            Some(s) => Cond::yes(c::STALLED, s.reason, s.message),
            None => Cond::no(c::STALLED, Reason::Progressing, "not stalled"),
        };
        [ready, reconciling, stalled]
    }
}

/// The plan as reported when one of its actions failed (`error`): `Ready=False` and
/// `Reconciling=True` with reason `ReconcileFailed` and the error, the detail conditions as
/// decided; the reconcile is retried with backoff.
pub fn act_failed(mut plan: super::Plan, error: &str) -> super::Plan {
    let message = format!("{error} (retrying with backoff)");
    for cond in &mut plan.conditions {
        if cond.type_ == c::READY || cond.type_ == c::RECONCILING {
            *cond = Cond {
                type_: cond.type_,
                status: cond.type_ == c::RECONCILING,
                reason: Reason::ReconcileFailed,
                message: message.clone(),
            };
        }
    }
    plan
}

/// The `OwnerServiceProtected` condition.
pub fn protection(p: &Protection) -> Cond {
    match p {
        Protection::Protected => Cond::yes(
            c::OWNER_SERVICE_PROTECTED,
            Reason::PolicyActive,
            "the ValidatingAdmissionPolicy platform-operator-protect-vcluster-service protects service/vcluster",
        ),
        Protection::Unsupported => Cond::no(
            c::OWNER_SERVICE_PROTECTED,
            Reason::AdmissionPoliciesUnavailable,
            "the API server serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy; service/vcluster is unprotected (Kubernetes 1.30 or later protects it); the controller repairs it if changed",
        ),
        Protection::Failed(e) => Cond::no(
            c::OWNER_SERVICE_PROTECTED,
            Reason::PolicyFailed,
            format!("creating the admission policy failed: {e}"),
        ),
        Protection::Unknown => Cond::no(
            c::OWNER_SERVICE_PROTECTED,
            Reason::PolicyPending,
            "the admission policy has not been checked yet",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason, each failure among them.
    fn all() -> Vec<Reason> {
        use Reason::*;
        let mut all = vec![
            AddingFinalizer,
            InvalidSpec,
            HostNamespaceConflict,
            HostNamespaceTerminating,
            HostNamespaceApplied,
            OwnerServiceRestoring,
            Queued,
            Installing,
            HelmFailed,
            RecoveringRelease,
            Upgrading,
            WaitingForControlPlane,
            WaitingForKubeconfig,
            WaitingForAPI,
            VClusterServing,
            WaitingForVCluster,
            KubeconfigWritten,
            Provisioning,
            InstallerDisabled,
            CheckingDrift,
            ConfigUnavailable,
            Resuming,
            Repairing,
            Installed,
            DriftDetected,
            NoDrift,
            PolicyActive,
            AdmissionPoliciesUnavailable,
            PolicyFailed,
            PolicyPending,
            UninstallingVCluster,
            UninstallFailed,
            DeletingHostNamespace,
            CleaningStorage,
            CleanupFailed,
            Finalizing,
            LeftAlone,
            KubeconfigSecretConflict,
            KubeconfigRefused,
            DowngradeRefused,
            CleanupBlocked,
            CleanupTimedOut,
            HelmTimedOut,
            ReconcileFailed,
            Idle,
            Progressing,
        ];
        all.extend(
            [
                Failure::InstallFailed,
                Failure::InstallTimedOut,
                Failure::VersionNotFound,
                Failure::RegistryUnreachable,
                Failure::PackageInstallFailed,
                Failure::PassphraseMismatch,
                Failure::PassphraseUnavailable,
                Failure::StateUnavailable,
                Failure::ToolMissing,
                Failure::OutputsFailed,
                Failure::PreviewFailed,
                Failure::ProgramOutOfMemory,
                Failure::PackageInstallOutOfMemory,
                Failure::StateVolumeFull,
            ]
            .map(Failed),
        );
        all
    }

    /// The rule Events followed when severity was read from reason strings.
    fn string_rule(type_: &str, status: bool, reason: &str) -> Severity {
        const WARNINGS: [&str; 16] = [
            "LeftAlone",
            "KubeconfigRefused",
            "DowngradeRefused",
            "CleanupBlocked",
            "CleanupTimedOut",
            "HelmTimedOut",
            "DriftDetected",
            "ProgramOutOfMemory",
            "PackageInstallOutOfMemory",
            "StateVolumeFull",
            "InstallTimedOut",
            "VersionNotFound",
            "RegistryUnreachable",
            "PassphraseMismatch",
            "PassphraseUnavailable",
            "ConfigUnavailable",
        ];
        if (type_ == c::STALLED && status)
            || reason.ends_with("Failed")
            || reason.ends_with("Conflict")
            || WARNINGS.contains(&reason)
        {
            Severity::Warning
        } else {
            Severity::Normal
        }
    }

    #[test]
    fn typed_severity_keeps_the_rule_of_the_reason_strings() {
        for reason in all() {
            for type_ in [c::READY, c::STALLED, c::INSTALLED, c::VCLUSTER_READY] {
                for status in [true, false] {
                    let cond = Cond {
                        type_,
                        status,
                        reason,
                        message: String::new(),
                    };
                    assert_eq!(
                        cond.severity(),
                        string_rule(type_, status, reason.as_str()),
                        "{type_}={status} {reason:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn reasons_are_camel_case_words() {
        for reason in all() {
            let word = reason.as_str();
            assert!(
                word.starts_with(|ch: char| ch.is_ascii_uppercase())
                    && word.chars().all(|ch| ch.is_ascii_alphanumeric()),
                "{word}"
            );
            assert_eq!(reason, word);
        }
    }

    #[test]
    fn ready_takes_the_stalled_reason_before_the_reconciling_one() {
        let [ready, reconciling, stalled] = Kstatus {
            ready: None,
            reconciling: Some(Step::new(Reason::Installing, "a")),
            stalled: Some(Step::new(Reason::ConfigUnavailable, "b")),
        }
        .conditions();
        assert_eq!(
            (ready.status, ready.reason),
            (false, Reason::ConfigUnavailable)
        );
        assert_eq!(
            (reconciling.status, reconciling.reason),
            (true, Reason::Installing)
        );
        assert_eq!(
            (stalled.status, stalled.reason),
            (true, Reason::ConfigUnavailable)
        );
        let [ready, reconciling, stalled] = Kstatus::default().conditions();
        assert_eq!((ready.status, ready.reason), (false, Reason::Progressing));
        assert_eq!(
            (reconciling.status, reconciling.reason),
            (false, Reason::Idle)
        );
        assert_eq!(
            (stalled.status, stalled.reason),
            (false, Reason::Progressing)
        );
    }
}
