//! The decide step: a pure function from what was observed about one instance to what to do and
//! what its status should say. No client, no clock, no I/O, so every phase and deletion path is
//! unit-tested.

pub mod deletion;
pub mod install;
pub mod model;
pub mod ownership;
pub mod provision;
pub mod status;
pub mod suspend;

pub use model::{Action, Plan, Requeue};

use model::Observed;

/// Decides what to do for an instance: its deletion when it is being deleted, else its
/// provisioning and install, held while it is suspended.
pub fn decide(o: &Observed) -> Plan {
    if o.deleting {
        deletion::decide(o)
    } else if o.suspended {
        suspend::hold(o, provision::decide(o))
    } else {
        provision::decide(o)
    }
}

#[cfg(test)]
mod tests;
