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
