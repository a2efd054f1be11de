//! Version rules: a platform version is one exact semantic version, never a range or a tag.

/// Why a string is not an exact platform version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// It does not parse as `MAJOR.MINOR.PATCH[-PRERELEASE]`.
    #[error(
        "{value:?} is not an exact version MAJOR.MINOR.PATCH[-PRERELEASE] such as 6.0.22; ranges and tags (^6.0.0, ~6, 6.x, >=6, latest) are not allowed"
    )]
    NotExact {
        /// What was given.
        value: String,
    },
    /// It carries build metadata, which npm ignores when it picks a version.
    #[error("{value:?} has build metadata (+...), which npm ignores; name the version without it")]
    BuildMetadata {
        /// What was given.
        value: String,
    },
}

/// Parses an exact platform version, with the same rule as the CRD's CEL check
/// ([`crate::crd::EXACT_VERSION_PATTERN`]).
pub fn parse_exact(value: &str) -> Result<semver::Version, VersionError> {
    let version = semver::Version::parse(value).map_err(|_| VersionError::NotExact {
        value: value.to_string(),
    })?;
    if !version.build.is_empty() {
        return Err(VersionError::BuildMetadata {
            value: value.to_string(),
        });
    }
    Ok(version)
}

/// A `MAJOR.MINOR` bound of the supported platform versions (`--min-platform-version`,
/// `--max-platform-version` of both the webhook and the controller).
pub type Minor = (u64, u64);

/// Why a flag value is not `MAJOR.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not MAJOR.MINOR, such as 6.0")]
pub struct NotMinor(pub String);

/// Parses a `MAJOR.MINOR` bound.
pub fn parse_minor(value: &str) -> Result<Minor, NotMinor> {
    let err = || NotMinor(value.to_string());
    let (major, minor) = value.split_once('.').ok_or_else(err)?;
    Ok((
        major.parse().map_err(|_| err())?,
        minor.parse().map_err(|_| err())?,
    ))
}

/// Whether `version` lies in `min.x` to `max.x`; the refusal names `field` and the fix.
pub fn check_supported(
    field: &str,
    version: &semver::Version,
    (min, max): (Minor, Minor),
) -> Result<(), String> {
    let minor = (version.major, version.minor);
    if minor < min || minor > max {
        return Err(format!(
            "{field} {version} is outside the versions this operator supports ({}.{}.x to {}.{}.x); choose a version in that range or upgrade the operator",
            min.0, min.1, max.0, max.1
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::EXACT_VERSION_PATTERN;

    const CORPUS: &[&str] = &[
        "6.0.22",
        "0.0.0",
        "10.20.30",
        "6.1.0-rc.1",
        "6.1.0-alpha",
        "1.0.0-0.3.7",
        "1.0.0-x-y.7",
        "1.0.0-alpha.beta.1",
        "^6.0.0",
        "~6",
        "6.x",
        "latest",
        ">=6",
        "6",
        "6.0",
        "06.0.0",
        "6.00.1",
        "6.0.22+build",
        "6.0.22-",
        "6.0.22-01",
        " 6.0.22",
        "v6.0.22",
        "6.0.0 - 7.0.0",
        "6.0.*",
        "6.0.22-rc..1",
        "=6.0.22",
        "6.0.22 ",
        "",
    ];

    #[test]
    fn the_crd_pattern_and_semver_agree() {
        let re = regex::Regex::new(EXACT_VERSION_PATTERN).expect("valid regex");
        for value in CORPUS {
            assert_eq!(
                re.is_match(value),
                parse_exact(value).is_ok(),
                "{value:?}: the CEL pattern and semver disagree"
            );
        }
    }

    #[test]
    fn errors_name_the_fix() {
        let e = parse_exact("^6.0.0").expect_err("a range");
        assert!(e.to_string().contains("such as 6.0.22"), "{e}");
        let e = parse_exact("6.0.22+build.1").expect_err("build metadata");
        assert!(matches!(e, VersionError::BuildMetadata { .. }), "{e}");
        assert_eq!(
            parse_exact("6.1.0-rc.1").expect("exact").pre.as_str(),
            "rc.1"
        );
    }

    #[test]
    fn the_supported_range_is_by_major_and_minor() {
        assert_eq!(parse_minor("6.1"), Ok((6, 1)));
        for bad in ["6", "6.x", "6.1.0", ""] {
            assert_eq!(parse_minor(bad), Err(NotMinor(bad.to_string())));
        }
        let range = ((6, 0), (6, 1));
        let v = |s| parse_exact(s).expect("exact");
        assert!(check_supported("spec.version", &v("6.0.0"), range).is_ok());
        assert!(check_supported("spec.version", &v("6.1.99-rc.1"), range).is_ok());
        let refused = check_supported("spec.version", &v("6.2.0"), range).expect_err("above");
        assert!(
            refused.starts_with(
                "spec.version 6.2.0 is outside the versions this operator supports (6.0.x to 6.1.x)"
            ),
            "{refused}"
        );
        assert!(check_supported("spec.version", &v("5.9.9"), range).is_err());
    }
}
