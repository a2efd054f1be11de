//! Per-instance exponential backoff with jitter for failed reconciles, in the manner of
//! controller-runtime's per-item rate limiter: each failure in a row doubles the wait from
//! [`BASE`] up to [`CAP`], a random share of up to half of it is taken off (so instances that
//! failed together do not retry together), and a successful reconcile resets it. The waits are
//! `backon`'s.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::lock;

/// The wait after the first failure.
pub const BASE: Duration = Duration::from_secs(2);
/// The longest wait.
pub const CAP: Duration = Duration::from_secs(300);

/// One instance's waits: `backon` adds a random share of up to the whole delay, so its delays
/// run from half of [`BASE`] to half of [`CAP`] and each wait lies between half of
/// `BASE * 2^(n-1)` (at most `CAP`) and that.
fn waits() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(BASE / 2)
        .with_max_delay(CAP / 2)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Failures in a row and the waits still to come, by instance key.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, (u32, ExponentialBackoff)>>,
}

impl Backoff {
    /// Counts one more failure of `key` and returns how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        let mut map = lock(&self.failures);
        let (failures, waits) = map.entry(key.to_string()).or_insert_with(|| (0, waits()));
        *failures = failures.saturating_add(1);
        waits.next().unwrap_or(CAP)
    }

    /// A reconcile of `key` succeeded: the next failure waits about [`BASE`] again.
    pub fn succeeded(&self, key: &str) {
        lock(&self.failures).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many failures in a row `key` has had.
    fn failures(b: &Backoff, key: &str) -> u32 {
        b.failures.lock().expect("lock").get(key).map_or(0, |f| f.0)
    }

    #[test]
    fn the_wait_doubles_up_to_the_cap() {
        let b = Backoff::default();
        let ceilings = [2, 4, 8, 16, 32, 64, 128, 256, 300, 300];
        for ceiling in ceilings.map(Duration::from_secs) {
            let wait = b.failed("team/a");
            assert!(
                wait >= ceiling / 2 && wait <= ceiling,
                "{wait:?} {ceiling:?}"
            );
        }
        for _ in 0..100 {
            assert!(b.failed("team/a") <= CAP);
        }
    }

    #[test]
    fn jitter_takes_off_at_most_half() {
        for i in 0..1000 {
            let b = Backoff::default();
            let key = format!("team/i{i}");
            let d = (0..4).map(|_| b.failed(&key)).last().expect("a wait");
            assert!(
                d >= Duration::from_secs(8) && d <= Duration::from_secs(16),
                "{d:?}"
            );
        }
    }

    #[test]
    fn jitter_spreads_instances_that_failed_together() {
        let b = Backoff::default();
        let waits: std::collections::BTreeSet<Duration> =
            (0..50).map(|i| b.failed(&format!("team/i{i}"))).collect();
        assert!(waits.len() > 40, "{} distinct waits of 50", waits.len());
    }

    #[test]
    fn failures_grow_per_instance_and_success_resets() {
        let b = Backoff::default();
        for _ in 0..4 {
            b.failed("team/a");
        }
        let fifth = b.failed("team/a");
        assert!(fifth >= Duration::from_secs(16), "{fifth:?}");
        assert_eq!(failures(&b, "team/a"), 5);
        assert!(
            b.failed("team/b") <= BASE,
            "another instance starts from the base"
        );
        b.succeeded("team/a");
        assert_eq!(failures(&b, "team/a"), 0);
        assert!(b.failed("team/a") <= BASE);
    }
}
