//! The decide step: a pure function from what was observed about one instance to what to do and
//! what its status should say. No client, no clock, no I/O, so every phase and deletion path is
//! unit-tested.
//!
//! - [`model`]: the observed world, tasks, releases, and the [`Plan`] with its builder;
//! - [`provision`]: finalizer, host namespace, vCluster, `service/vcluster`, kubeconfig;
//! - [`install`]: the platform program (install, upgrade, repair, preview, failures);
//! - [`deletion`]: `deletionPolicy` step by step;
//! - [`ownership`]: the one rule of what is an instance's;
//! - [`status`]: reasons, their Event severity, and the kstatus conditions.

pub mod deletion;
pub mod install;
pub mod model;
pub mod ownership;
pub mod provision;
pub mod status;

pub use model::{Action, Plan, Requeue};

use model::Observed;

/// Decides what to do for an instance: its deletion when it is being deleted, else its
/// provisioning and install.
pub fn decide(o: &Observed) -> Plan {
    if o.deleting {
        deletion::decide(o)
    } else {
        provision::decide(o)
    }
}

#[cfg(test)]
mod tests;
