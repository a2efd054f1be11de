//! The installer's record of one instance, kept as `install.json` in the instance's state
//! directory beside its Pulumi state: what the last install applied, what is installed, the
//! outputs, and what the last repair preview found. Installer tasks write it; reconciles read it
//! and copy it into `status`. Being on the state volume, it survives a controller restart, so an
//! install a crash interrupted is found (`Running` with no task) and run again.

use std::path::{Path, PathBuf};

use common::crd::{Endpoints, LastInstall};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// The record's file name in the instance's state directory.
pub const FILE: &str = "install.json";

/// Why an install or preview failed: each a documented condition reason.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The program (or Pulumi) failed.
    InstallFailed,
    /// It ran past `--install-timeout` and was stopped.
    InstallTimedOut,
    /// The registry has no such version of the package.
    VersionNotFound,
    /// The npm registry could not be reached.
    RegistryUnreachable,
    /// npm failed for another reason.
    PackageInstallFailed,
    /// The passphrase does not open the instance's state.
    PassphraseMismatch,
    /// The passphrase file cannot be read.
    PassphraseUnavailable,
    /// The state directory cannot be written.
    StateUnavailable,
    /// A needed executable (npm, pulumi) could not be run.
    ToolMissing,
    /// The outputs could not be read or passed on.
    OutputsFailed,
    /// The repair preview failed.
    PreviewFailed,
    /// The program's node process reached its heap limit (`--program-heap-limit`) and was stopped.
    ProgramOutOfMemory,
    /// npm's node process reached its heap limit (`--npm-heap-limit`) while installing the
    /// package, and was stopped.
    PackageInstallOutOfMemory,
    /// The state volume is fuller than `--state-volume-full-percent`; the install did not start.
    StateVolumeFull,
}

impl Failure {
    /// The condition reason.
    pub fn reason(self) -> &'static str {
        match self {
            Failure::InstallFailed => "InstallFailed",
            Failure::InstallTimedOut => "InstallTimedOut",
            Failure::VersionNotFound => "VersionNotFound",
            Failure::RegistryUnreachable => "RegistryUnreachable",
            Failure::PackageInstallFailed => "PackageInstallFailed",
            Failure::PassphraseMismatch => "PassphraseMismatch",
            Failure::PassphraseUnavailable => "PassphraseUnavailable",
            Failure::StateUnavailable => "StateUnavailable",
            Failure::ToolMissing => "ToolMissing",
            Failure::OutputsFailed => "OutputsFailed",
            Failure::PreviewFailed => "PreviewFailed",
            Failure::ProgramOutOfMemory => "ProgramOutOfMemory",
            Failure::PackageInstallOutOfMemory => "PackageInstallOutOfMemory",
            Failure::StateVolumeFull => "StateVolumeFull",
        }
    }
}

/// What a repair preview found.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// When it finished.
    pub finished_at: Time,
    /// The version previewed.
    pub version: String,
    /// Changes it would make (0: no drift).
    pub changes: i64,
    /// What it found, in words.
    pub message: String,
}

/// The record.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The version of the last successful install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_version: Option<String>,
    /// The config hash the last successful install applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_config_hash: Option<String>,
    /// The last install (running, succeeded or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_install: Option<LastInstall>,
    /// Why the last install failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The config hash the last install (whatever its result) was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempted_config_hash: Option<String>,
    /// The program's outputs after the last successful install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// The last repair preview since the last install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<Preview>,
    /// Why the last repair preview failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_failure: Option<(Failure, String)>,
    /// The names of the per-membership kubeconfig Secrets the last install wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub membership_secrets: Vec<String>,
}

impl Record {
    /// When the instance was last installed or previewed (what the repair interval counts from).
    pub fn last_checked(&self) -> Option<&Time> {
        let install = self
            .last_install
            .as_ref()
            .and_then(|l| l.finished_at.as_ref());
        let preview = self.preview.as_ref().map(|p| &p.finished_at);
        match (install, preview) {
            (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

/// The record's path for the instance directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Reads the record in `dir` (none yet, or unreadable: the default, with a log line for the
/// latter; the record is rewritten by the next install).
pub fn load(dir: &Path) -> Record {
    let file = path(dir);
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(file = %file.display(), error = %e, "the install record is unreadable; starting afresh");
            Record::default()
        }),
        Err(_) => Record::default(),
    }
}

/// Writes the record into `dir` atomically (a temporary file renamed over the old one).
pub fn store(dir: &Path, record: &Record) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let file = path(dir);
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::crd::InstallResult;

    fn at(s: &str) -> Time {
        Time(s.parse().expect("timestamp"))
    }

    #[test]
    fn round_trips_and_tolerates_garbage() {
        let dir = std::env::temp_dir().join(format!("record-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(load(&dir), Record::default(), "no record yet");
        let record = Record {
            installed_version: Some("6.0.22".into()),
            installed_config_hash: Some("sha256:0123456789abcdef".into()),
            last_install: Some(LastInstall {
                version: "6.0.22".into(),
                started_at: at("2026-11-30T00:00:00Z"),
                finished_at: Some(at("2026-11-30T00:01:00Z")),
                result: InstallResult::Succeeded,
                message: Some("applied".into()),
                summary: None,
            }),
            failure: None,
            attempted_config_hash: Some("sha256:0123456789abcdef".into()),
            endpoints: Some(Endpoints {
                http: Some("http://x".into()),
                route_url_pattern: None,
            }),
            preview: None,
            preview_failure: Some((Failure::PreviewFailed, "why".into())),
            membership_secrets: vec!["one-acme-dev-kubeconfig".into()],
        };
        store(&dir, &record).expect("store");
        assert_eq!(load(&dir), record);
        std::fs::write(path(&dir), b"{not json").expect("garbage");
        assert_eq!(load(&dir), Record::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn last_checked_is_the_later_of_install_and_preview() {
        let mut record = Record {
            last_install: Some(LastInstall {
                version: "6.0.22".into(),
                started_at: at("2026-11-30T00:00:00Z"),
                finished_at: Some(at("2026-11-30T00:01:00Z")),
                result: InstallResult::Succeeded,
                message: None,
                summary: None,
            }),
            ..Record::default()
        };
        assert_eq!(record.last_checked(), Some(&at("2026-11-30T00:01:00Z")));
        record.preview = Some(Preview {
            finished_at: at("2026-11-30T01:00:00Z"),
            version: "6.0.22".into(),
            changes: 0,
            message: String::new(),
        });
        assert_eq!(record.last_checked(), Some(&at("2026-11-30T01:00:00Z")));
    }
}
