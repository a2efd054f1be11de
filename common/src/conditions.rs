//! Status conditions (`metav1.Condition`): kstatus `Ready`, `Reconciling`, `Stalled` and the
//! detail conditions, set so that `lastTransitionTime` moves only when the status changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// kstatus: the instance is installed and serving.
pub const READY: &str = "Ready";
/// kstatus: the controller is working towards the spec.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: progress stopped on an error that needs a change or a person.
pub const STALLED: &str = "Stalled";
/// The host namespace and its NetworkPolicy exist.
pub const HOST_NAMESPACE_READY: &str = "HostNamespaceReady";
/// The vCluster is installed and serves its API.
pub const VCLUSTER_READY: &str = "VClusterReady";
/// The admin kubeconfig Secret is written.
pub const KUBECONFIG_READY: &str = "KubeconfigReady";
/// The admission policy protects `service/vcluster`.
pub const OWNER_SERVICE_PROTECTED: &str = "OwnerServiceProtected";
/// The platform program is installed (set by the installer).
pub const INSTALLED: &str = "Installed";
/// `spec.suspend` holds every install, upgrade, repair and Helm run of the instance.
pub const SUSPENDED: &str = "Suspended";
/// The last repair preview found the platform changed behind Pulumi's back.
pub const DRIFT_DETECTED: &str = "DriftDetected";
/// A new `spec.version` waits for approval (`spec.upgrade.approval: Manual`).
pub const UPGRADE_PENDING: &str = "UpgradePending";

/// A condition to set: type, status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// The condition type.
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: bool,
    /// A documented CamelCase reason.
    pub reason: &'static str,
    /// What happened and, for a failure, what to do.
    pub message: String,
}

impl Want {
    /// A condition that holds.
    pub fn yes(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: true,
            reason,
            message: message.into(),
        }
    }

    /// A condition that does not hold.
    pub fn no(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: false,
            reason,
            message: message.into(),
        }
    }
}

/// Merges `wanted` into `existing` for `generation`: a condition whose status is unchanged keeps
/// its `lastTransitionTime`; conditions not wanted are dropped. The result is sorted by type so
/// that an unchanged status compares equal.
pub fn merge(
    existing: &[Condition],
    wanted: &[Want],
    generation: i64,
    now: Time,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = wanted
        .iter()
        .map(|w| {
            let status = if w.status { "True" } else { "False" }.to_string();
            let previous = existing.iter().find(|c| c.type_ == w.type_);
            let last_transition_time = match previous {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                type_: w.type_.to_string(),
                status,
                reason: w.reason.to_string(),
                message: w.message.clone(),
                observed_generation: Some(generation),
                last_transition_time,
            }
        })
        .collect();
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
    }

    #[test]
    fn transition_time_moves_only_on_a_status_change() {
        let first = merge(
            &[],
            &[Want::no(READY, "Provisioning", "coming up")],
            1,
            t(100),
        );
        assert_eq!(first[0].last_transition_time, t(100));
        let same = merge(
            &first,
            &[Want::no(READY, "Installing", "installing")],
            2,
            t(200),
        );
        assert_eq!(
            same[0].last_transition_time,
            t(100),
            "same status keeps the time"
        );
        assert_eq!(same[0].reason, "Installing");
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = merge(&same, &[Want::yes(READY, "Installed", "ok")], 2, t(300));
        assert_eq!(flipped[0].last_transition_time, t(300));
        let dropped = merge(&flipped, &[Want::yes(STALLED, "X", "y")], 2, t(400));
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].type_, STALLED);
    }
}
