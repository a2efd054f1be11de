//! Per-instance exponential backoff with jitter for failed reconciles, in the manner of
//! controller-runtime's per-item rate limiter: each failure in a row doubles the wait from
//! [`BASE`] up to [`CAP`], a random share of up to half of it is taken off (so instances that
//! failed together do not retry together), and a successful reconcile resets it.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

/// The wait after the first failure.
pub const BASE: Duration = Duration::from_secs(2);
/// The longest wait.
pub const CAP: Duration = Duration::from_secs(300);

/// The wait after `failures` failures in a row (at least 1), before jitter: `BASE * 2^(n-1)`,
/// at most `CAP`.
pub fn ceiling(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    BASE.saturating_mul(1 << doublings).min(CAP)
}

/// The wait after `failures` failures with jitter `unit` (in `[0, 1)`): between half the
/// ceiling and the ceiling.
pub fn delay(failures: u32, unit: f64) -> Duration {
    let ceiling = ceiling(failures);
    ceiling.mul_f64(1.0 - unit.clamp(0.0, 1.0) / 2.0)
}

/// A uniform number in `[0, 1)` from the standard library's randomly keyed hasher.
fn unit() -> f64 {
    let bits = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Failures in a row, by instance key.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// Counts one more failure of `key` and returns how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        let failures = match self.failures.lock() {
            Ok(mut map) => {
                let n = map.entry(key.to_string()).or_default();
                *n = n.saturating_add(1);
                *n
            }
            Err(_) => 1,
        };
        delay(failures, unit())
    }

    /// A reconcile of `key` succeeded: the next failure waits [`BASE`] again.
    pub fn succeeded(&self, key: &str) {
        if let Ok(mut map) = self.failures.lock() {
            map.remove(key);
        }
    }

    /// How many failures in a row `key` has had.
    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .ok()
            .and_then(|m| m.get(key).copied())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_the_cap() {
        let waits: Vec<u64> = (1..=10).map(|n| ceiling(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(ceiling(0), BASE);
        assert_eq!(ceiling(u32::MAX), CAP);
    }

    #[test]
    fn jitter_takes_off_at_most_half() {
        assert_eq!(delay(3, 0.0), Duration::from_secs(8));
        assert_eq!(
            delay(3, 0.999_999),
            Duration::from_secs(8).mul_f64(0.500_000_5)
        );
        for _ in 0..1000 {
            let u = unit();
            assert!((0.0..1.0).contains(&u), "{u}");
            let d = delay(4, u);
            assert!(
                d > Duration::from_secs(8) && d <= Duration::from_secs(16),
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
        assert!(fifth > Duration::from_secs(16), "{fifth:?}");
        assert_eq!(b.failures("team/a"), 5);
        assert!(
            b.failed("team/b") <= BASE,
            "another instance starts from the base"
        );
        b.succeeded("team/a");
        assert_eq!(b.failures("team/a"), 0);
        assert!(b.failed("team/a") <= BASE);
    }
}
