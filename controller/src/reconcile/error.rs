//! The errors of one reconcile: one variant per step that can fail; its category (the variant's
//! name in snake case) labels `platform_operator_controller_reconciles_total{result="error"}`.

use std::path::PathBuf;

/// Errors of one reconcile; each names the failed action.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ReconcileError {
    /// Reading what belongs to the instance (`.0`) failed.
    #[error(
        "reading {0} failed: {1}; check that the API server is reachable and the controller's RBAC allows it"
    )]
    Observe(String, #[source] kube::Error),
    /// Adding the finalizer failed.
    #[error("adding the finalizer failed: {0}; the controller retries")]
    AddFinalizer(#[source] kube::Error),
    /// Applying the host namespace or its NetworkPolicy (`.0`) failed.
    #[error("applying the host {0} failed: {1}; the controller retries")]
    ApplyNamespace(&'static str, #[source] kube::Error),
    /// Writing the instance's kubeconfig Secret failed.
    #[error("writing the kubeconfig Secret failed: {0}; the controller retries")]
    WriteKubeconfig(#[source] kube::Error),
    /// Recording `service/vcluster` on the host namespace failed.
    #[error("recording service/vcluster on the host namespace failed: {0}")]
    RecordOwnerService(#[source] kube::Error),
    /// Pointing owner references of host objects (kind `.0`) at the recreated Service failed.
    #[error("relinking the owner references of host {0} failed: {1}")]
    RelinkOwnerService(&'static str, #[source] kube::Error),
    /// Setting a volume bound in the host namespace to `Retain`, or recording it, failed.
    #[error(
        "keeping the volumes of the host namespace failed: {0}; the namespace is not deleted until they are kept; check the controller's RBAC for PersistentVolumes and the state volume"
    )]
    RetainVolumes(String),
    /// Deleting the host namespace failed.
    #[error("deleting the host namespace failed: {0}; the controller retries")]
    DeleteNamespace(#[source] kube::Error),
    /// Creating the storage cleanup Job failed.
    #[error(
        "creating the storage cleanup Job failed: {0}; check --cleanup-namespace and the controller's RBAC for Jobs there"
    )]
    StartCleanup(#[source] kube::Error),
    /// Deleting a cleanup Job another instance left failed.
    #[error(
        "replacing the cleanup Job another instance left failed: {0}; check the controller's RBAC for Jobs in --cleanup-namespace"
    )]
    ReplaceCleanup(#[source] kube::Error),
    /// Reading or writing the record `.0` of the node that holds the storage failed.
    #[error("reading or writing {0} failed: {1}; check the state volume")]
    StorageNode(PathBuf, #[source] std::io::Error),
    /// Removing the state directory `.0` failed.
    #[error("removing the state directory {0} failed: {1}; check the state volume")]
    RemoveState(PathBuf, #[source] std::io::Error),
    /// Deleting the kubeconfig Secret failed.
    #[error("deleting the kubeconfig Secret failed: {0}; the controller retries")]
    DeleteKubeconfig(#[source] kube::Error),
    /// Removing the finalizer failed.
    #[error("removing the finalizer failed: {0}; the controller retries")]
    RemoveFinalizer(#[source] kube::Error),
    /// Writing the instance's status failed.
    #[error("writing the instance status failed: {0}; the controller retries")]
    WriteStatus(#[source] kube::Error),
}

/// Why the platform program's config cannot be put together; the message of `PlatformReady`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The exported kubeconfig's current context names no server.
    #[error("the vCluster's kubeconfig names no server in its current context")]
    KubeconfigWithoutServer,
    /// The tenant auth client secret's Secret does not exist.
    #[error(
        "the Secret {name} named by spec.platform.tenantAuth.clientSecretRef does not exist in namespace {namespace}; create it with the key {key}"
    )]
    SecretNotFound {
        name: String,
        namespace: String,
        key: String,
    },
    /// The Secret lacks the key.
    #[error(
        "the Secret {name} has no key {key} (spec.platform.tenantAuth.clientSecretRef.key); add the key or fix the reference"
    )]
    KeyNotFound { name: String, key: String },
}

impl ReconcileError {
    /// A static category for metric and event labels: the failed step.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// Maps a failed read of `what` to [`ReconcileError::Observe`].
pub fn observing(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    move |source| ReconcileError::Observe(what, source)
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
            ReconcileError::AddFinalizer(api(409)),
            ReconcileError::ApplyNamespace("namespace", api(500)),
            ReconcileError::WriteKubeconfig(api(500)),
            ReconcileError::RecordOwnerService(api(500)),
            ReconcileError::RelinkOwnerService("secret", api(500)),
            ReconcileError::DeleteNamespace(api(500)),
            ReconcileError::RetainVolumes("pv/a: denied".into()),
            ReconcileError::StartCleanup(api(403)),
            ReconcileError::ReplaceCleanup(api(409)),
            ReconcileError::RemoveState(
                "/state/a/b".into(),
                std::io::Error::other("read-only file system"),
            ),
            ReconcileError::DeleteKubeconfig(api(500)),
            ReconcileError::RemoveFinalizer(api(409)),
            ReconcileError::WriteStatus(api(422)),
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
        assert!(errors[8].to_string().contains("--cleanup-namespace"));
        assert!(errors[10].to_string().contains("/state/a/b"));
    }
}
