//! The errors of one reconcile: one variant per step that can fail, each with a static category
//! that labels `platform_operator_controller_reconciles_total{result="error"}`.

use std::path::PathBuf;

/// Errors of one reconcile; each names the failed action.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Reading what belongs to the instance failed.
    #[error(
        "reading {what} failed: {source}; check that the API server is reachable and the controller's RBAC allows it"
    )]
    Observe {
        /// What was read.
        what: String,
        /// Why.
        source: kube::Error,
    },
    /// Adding the finalizer failed.
    #[error("adding the finalizer failed: {source}; the controller retries")]
    AddFinalizer {
        /// Why.
        source: kube::Error,
    },
    /// Applying the host namespace or its NetworkPolicy failed.
    #[error("applying the host {what} failed: {source}; the controller retries")]
    ApplyNamespace {
        /// `namespace` or `networkpolicy`.
        what: &'static str,
        /// Why.
        source: kube::Error,
    },
    /// Writing the instance's kubeconfig Secret failed.
    #[error("writing the kubeconfig Secret failed: {source}; the controller retries")]
    WriteKubeconfig {
        /// Why.
        source: kube::Error,
    },
    /// Recording `service/vcluster` on the host namespace failed.
    #[error("recording service/vcluster on the host namespace failed: {source}")]
    RecordOwnerService {
        /// Why.
        source: kube::Error,
    },
    /// Pointing owner references at the recreated `service/vcluster` failed.
    #[error("relinking the owner references of host {what} failed: {source}")]
    RelinkOwnerService {
        /// The kind of object.
        what: &'static str,
        /// Why.
        source: kube::Error,
    },
    /// Deleting the host namespace failed.
    #[error("deleting the host namespace failed: {source}; the controller retries")]
    DeleteNamespace {
        /// Why.
        source: kube::Error,
    },
    /// Creating the storage cleanup Job failed.
    #[error(
        "creating the storage cleanup Job failed: {source}; check --cleanup-namespace and the controller's RBAC for Jobs there"
    )]
    StartCleanup {
        /// Why.
        source: kube::Error,
    },
    /// Deleting a cleanup Job another instance left failed.
    #[error(
        "replacing the cleanup Job another instance left failed: {source}; check the controller's RBAC for Jobs in --cleanup-namespace"
    )]
    ReplaceCleanup {
        /// Why.
        source: kube::Error,
    },
    /// Removing the state directory failed.
    #[error("removing the state directory {path} failed: {source}; check the state volume")]
    RemoveState {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Deleting the kubeconfig Secret failed.
    #[error("deleting the kubeconfig Secret failed: {source}; the controller retries")]
    DeleteKubeconfig {
        /// Why.
        source: kube::Error,
    },
    /// Removing the finalizer failed.
    #[error("removing the finalizer failed: {source}; the controller retries")]
    RemoveFinalizer {
        /// Why.
        source: kube::Error,
    },
    /// Writing the instance's status failed.
    #[error("writing the instance status failed: {source}; the controller retries")]
    WriteStatus {
        /// Why.
        source: kube::Error,
    },
}

impl ReconcileError {
    /// A static category for metric and event labels: the failed step.
    pub fn category(&self) -> &'static str {
        match self {
            ReconcileError::Observe { .. } => "observe",
            ReconcileError::AddFinalizer { .. } => "add_finalizer",
            ReconcileError::ApplyNamespace { .. } => "apply_namespace",
            ReconcileError::WriteKubeconfig { .. } => "write_kubeconfig",
            ReconcileError::RecordOwnerService { .. } => "record_owner_service",
            ReconcileError::RelinkOwnerService { .. } => "relink_owner_service",
            ReconcileError::DeleteNamespace { .. } => "delete_namespace",
            ReconcileError::StartCleanup { .. } => "start_cleanup",
            ReconcileError::ReplaceCleanup { .. } => "replace_cleanup",
            ReconcileError::RemoveState { .. } => "remove_state",
            ReconcileError::DeleteKubeconfig { .. } => "delete_kubeconfig",
            ReconcileError::RemoveFinalizer { .. } => "remove_finalizer",
            ReconcileError::WriteStatus { .. } => "write_status",
        }
    }
}

/// Maps a failed read of `what` to [`ReconcileError::Observe`].
pub fn observing(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    move |source| ReconcileError::Observe { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code,
                message: "denied".into(),
                ..Default::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn each_failed_step_has_its_own_category() {
        let errors = [
            observing("the cleanup Job")(api(403)),
            ReconcileError::AddFinalizer { source: api(409) },
            ReconcileError::ApplyNamespace {
                what: "namespace",
                source: api(500),
            },
            ReconcileError::WriteKubeconfig { source: api(500) },
            ReconcileError::RecordOwnerService { source: api(500) },
            ReconcileError::RelinkOwnerService {
                what: "secret",
                source: api(500),
            },
            ReconcileError::DeleteNamespace { source: api(500) },
            ReconcileError::StartCleanup { source: api(403) },
            ReconcileError::ReplaceCleanup { source: api(409) },
            ReconcileError::RemoveState {
                path: "/state/a/b".into(),
                source: std::io::Error::other("read-only file system"),
            },
            ReconcileError::DeleteKubeconfig { source: api(500) },
            ReconcileError::RemoveFinalizer { source: api(409) },
            ReconcileError::WriteStatus { source: api(422) },
        ];
        let mut seen = std::collections::BTreeSet::new();
        for e in &errors {
            let category = e.category();
            assert!(
                category.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{category}"
            );
            assert!(seen.insert(category), "{category} twice");
        }
        let message = errors[0].to_string();
        assert!(
            message.starts_with("reading the cleanup Job failed: ")
                && message.ends_with(
                    "check that the API server is reachable and the controller's RBAC allows it"
                ),
            "{message}"
        );
        assert!(errors[7].to_string().contains("--cleanup-namespace"));
        assert!(errors[9].to_string().contains("/state/a/b"));
    }
}
