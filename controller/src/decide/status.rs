//! What the status says: the documented condition reasons ([`Reason`]) and their Event severity,
//! the conditions a plan wants ([`Cond`]), the kstatus triple `Ready`, `Reconciling`,
//! `Stalled` ([`Kstatus`]), and the `OwnerServiceProtected` condition.

use common::conditions::{self as c, Want};
use kube::runtime::events::EventType;

use super::model::{Failure, Protection, TaskError};

/// Every condition reason the controller sets, named in status and Events by its variant's name
/// (`strum`); each is documented in `docs/controller.md`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
pub enum Reason {
    AddingFinalizer,
    InvalidSpec,
    HostNamespaceConflict,
    HostNamespaceTerminating,
    HostNamespaceApplied,
    OwnerServiceRestoring,
    Queued,
    Installing,
    #[strum(serialize = "InstallFailed")]
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
    #[strum(transparent)]
    Failed(Failure),
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
    StorageNodeGone,
    StorageConflict,
    HelmTimedOut,
    ReconcileFailed,
    Idle,
    Progressing,
    Suspended,
    RetriesExhausted,
    UpgradePending,
    PreviewingUpgrade,
}

impl Reason {
    /// The CamelCase word in status and Events.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// What a failed helm task says: `HelmTimedOut` when it ran past `--helm-timeout`, else
    /// `otherwise`.
    pub fn helm(e: &TaskError, otherwise: Reason) -> Reason {
        if e.failure == Some(Failure::InstallTimedOut) {
            Reason::HelmTimedOut
        } else {
            otherwise
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
            | StorageNodeGone
            | StorageConflict
            | HelmTimedOut
            | ReconcileFailed
            | DriftDetected
            | ConfigUnavailable => true,
            Failed(f) => !matches!(f, Failure::StateUnavailable | Failure::ToolMissing),
            _ => false,
        }
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
    fn new(type_: &'static str, status: bool, reason: Reason, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            type_,
            status,
            reason,
            message,
        }
    }

    /// A condition that holds.
    pub fn yes(type_: &'static str, reason: Reason, message: impl Into<String>) -> Self {
        Self::new(type_, true, reason, message)
    }

    /// A condition that does not hold.
    pub fn no(type_: &'static str, reason: Reason, message: impl Into<String>) -> Self {
        Self::new(type_, false, reason, message)
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
    pub fn severity(&self) -> EventType {
        if (self.type_ == c::STALLED && self.status) || self.reason.warns() {
            EventType::Warning
        } else {
            EventType::Normal
        }
    }
}

/// A reason with its message: one of the kstatus conditions.
pub type Step = (Reason, String);

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
            reconciling: Some((reason, message.into())),
            ..Self::default()
        }
    }

    /// Stalled, not ready, not reconciling.
    pub fn stalled(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            stalled: Some((reason, message.into())),
            ..Self::default()
        }
    }

    /// The three conditions.
    pub fn conditions(self) -> [Cond; 3] {
        let ready = match self.ready {
            Some((reason, message)) => Cond::yes(c::READY, reason, message),
            None => {
                let (reason, message) = (self.stalled.clone().or(self.reconciling.clone()))
                    .unwrap_or_else(|| {
                        let working = "the controller is working on the instance";
                        (Reason::Progressing, working.into())
                    });
                Cond::no(c::READY, reason, message)
            }
        };
        let reconciling = match self.reconciling {
            Some((reason, message)) => Cond::yes(c::RECONCILING, reason, message),
            None => Cond::no(c::RECONCILING, Reason::Idle, "nothing to do"),
        };
        let stalled = match self.stalled {
            Some((reason, message)) => Cond::yes(c::STALLED, reason, message),
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
            let status = cond.type_ == c::RECONCILING;
            *cond = Cond::new(cond.type_, status, Reason::ReconcileFailed, &message);
        }
    }
    plan
}

/// The `OwnerServiceProtected` condition.
pub fn protection(p: &Protection) -> Cond {
    let (status, reason, message) = match p {
        Protection::Protected => (
            true,
            Reason::PolicyActive,
            "the ValidatingAdmissionPolicy platform-operator-protect-vcluster-service protects service/vcluster".into(),
        ),
        Protection::Unsupported => (
            false,
            Reason::AdmissionPoliciesUnavailable,
            "the API server serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy; service/vcluster is unprotected (Kubernetes 1.30 or later protects it); the controller repairs it if changed".into(),
        ),
        Protection::Failed(e) => (
            false,
            Reason::PolicyFailed,
            format!("creating the admission policy failed: {e}"),
        ),
        Protection::Unknown => (
            false,
            Reason::PolicyPending,
            "the admission policy has not been checked yet".into(),
        ),
    };
    Cond::new(c::OWNER_SERVICE_PROTECTED, status, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests compare a reason with the word status shows.
    impl PartialEq<&str> for Reason {
        fn eq(&self, other: &&str) -> bool {
            self.as_str() == *other
        }
    }

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
            StorageNodeGone,
            StorageConflict,
            HelmTimedOut,
            ReconcileFailed,
            Idle,
            Progressing,
            Suspended,
            RetriesExhausted,
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
    fn string_rule(type_: &str, status: bool, reason: &str) -> EventType {
        const WARNINGS: [&str; 17] = [
            "LeftAlone",
            "KubeconfigRefused",
            "DowngradeRefused",
            "CleanupBlocked",
            "CleanupTimedOut",
            "StorageNodeGone",
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
            EventType::Warning
        } else {
            EventType::Normal
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
            reconciling: Some((Reason::Installing, "a".into())),
            stalled: Some((Reason::ConfigUnavailable, "b".into())),
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
