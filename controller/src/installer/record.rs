//! The installer's record of one instance, kept as `install.json` in the instance's state
//! directory beside its Pulumi state: what the last install applied, what is installed, the
//! outputs, and what the last repair preview found. Installer tasks write it; reconciles read it
//! and copy it into `status`. Being on the state volume, it survives a controller restart, so an
//! install a crash interrupted is found (`Running` with no task) and run again.

use std::path::Path;

pub use crate::decide::model::{Failure, Preview, Record};

/// The record's file name in the instance's state directory.
pub const FILE: &str = "install.json";

/// Reads the record in `dir` (none yet, or unreadable: the default, with a log line for the
/// latter; the record is rewritten by the next install).
pub fn load(dir: &Path) -> Record {
    let file = dir.join(FILE);
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
    let file = dir.join(FILE);
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::crd::{Endpoints, InstallResult, LastInstall};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
        std::fs::write(dir.join(FILE), b"{not json").expect("garbage");
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
