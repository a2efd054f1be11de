//! Durations in flags, written the way Kubernetes users write them: `30m`, `10s`, `8760h`, `1h30m`.

use std::time::Duration;

/// Why a flag's duration could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a duration; write it like 30m, 10s, 8760h or 1h30m")]
pub struct DurationError {
    /// What was given.
    pub value: String,
}

/// Parses a positive duration such as `30m` or `1h30m` (jiff's friendly format).
pub fn parse(value: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        value: value.to_string(),
    };
    let signed: k8s_openapi::jiff::SignedDuration = value.trim().parse().map_err(|_| err())?;
    let duration = Duration::try_from(signed).map_err(|_| err())?;
    if duration.is_zero() {
        Err(err())
    } else {
        Ok(duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_durations() {
        assert_eq!(parse("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("8760h"), Ok(Duration::from_secs(8760 * 3600)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "0s", "-5m", "soon", "5"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
