//! The platform-operator controller: takes each `PlatformInstance` from `Pending` through
//! `Provisioning` (host namespace, vCluster) to `Installing` (admin kubeconfig written), keeps the
//! admission policy that protects `service/vcluster`, and carries deletion through
//! `deletionPolicy`.

pub mod api;
pub mod backoff;
pub mod chart;
pub mod cleanup;
pub mod decide;
pub mod helm;
pub mod installer;
pub mod leader;
pub mod marker;
pub mod metrics;
pub mod pod_security;
pub mod policy;
pub mod reaper;
pub mod reconcile;
pub mod tasks;

/// Locks `mutex`; a panic while it was held left nothing half-done worth refusing.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
