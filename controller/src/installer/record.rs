//! The installer's record of one instance (`install.json` beside its Pulumi state), written by
//! tasks and copied into `status` by reconciles; it survives a restart, so an install a crash
//! cut short (`Running` with no task) is found and run again.

use std::path::Path;

pub use crate::decide::model::{Failure, Preview, Record};

/// The record's file name in the instance's state directory.
pub const FILE: &str = "install.json";

/// An install record that exists but cannot be read: never taken for "no record", which would
/// drop the downgrade guard and the list of membership Secrets to remove.
#[derive(Debug, thiserror::Error)]
#[error(
    "the install record {0} cannot be read ({1}); the installer will not start afresh over it: restore it from a backup, or move it aside to have the next install treat the instance as never installed"
)]
pub struct Unreadable(String, String);

/// Reads the record in `dir`: the default when there is none yet.
pub fn load(dir: &Path) -> Result<Record, Unreadable> {
    let file = dir.join(FILE);
    let unreadable =
        |e: &dyn std::fmt::Display| Unreadable(file.display().to_string(), e.to_string());
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| unreadable(&e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
        Err(e) => Err(unreadable(&e)),
    }
}

/// Writes the record into `dir` durably ([`write_durably`]).
pub fn store(dir: &Path, record: &Record) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    write_durably(dir, FILE, &bytes)
}

/// Writes `bytes` to `dir/name` durably: a temporary file, synced, renamed over the old one, and
/// the folder synced, so a crash leaves the old content or the new one, never neither.
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (file, tmp) = (dir.join(name), dir.join(format!(".{name}.tmp")));
    let mut out = std::fs::File::create(&tmp)?;
    std::io::Write::write_all(&mut out, bytes)?;
    out.sync_all()?;
    std::fs::rename(&tmp, &file)?;
    std::fs::File::open(dir)?.sync_all()
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
    fn round_trips_and_refuses_garbage() {
        let dir = std::env::temp_dir().join(format!("record-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            load(&dir).expect("load"),
            Record::default(),
            "no record yet"
        );
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
            history: Vec::new(),
            pending_upgrade: None,
            state_backups: Vec::new(),
            state_key_uid: Some("u-1".into()),
            interrupted: true,
        };
        store(&dir, &record).expect("store");
        assert_eq!(load(&dir).expect("load"), record);
        // An existing record that cannot be read is never taken for "none": starting afresh
        // would drop the downgrade guard and the stale-membership list.
        std::fs::write(dir.join(FILE), b"{not json").expect("garbage");
        let unreadable = load(&dir).expect_err("garbage is not a record").to_string();
        assert!(
            unreadable.contains(&dir.join(FILE).display().to_string())
                && unreadable.contains("move it aside"),
            "{unreadable}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_history_keeps_the_last_five_runs_newest_first() {
        use common::crd::{InstallKind, InstallSummary};
        let mut record = Record::default();
        record.remember(InstallKind::Install);
        assert!(record.history.is_empty(), "no run, nothing remembered");
        for i in 0..7 {
            let ok = i % 2 == 0;
            record.attempted_config_hash = Some(format!("sha256:{i}"));
            record.last_install = Some(LastInstall {
                version: format!("6.0.{i}"),
                started_at: at("2026-11-30T00:00:00Z"),
                finished_at: Some(at("2026-11-30T00:01:00Z")),
                result: if ok {
                    InstallResult::Succeeded
                } else {
                    InstallResult::Failed
                },
                message: Some("a long message the history leaves out".into()),
                summary: ok.then(|| InstallSummary {
                    created: i,
                    config_hash: Some(format!("sha256:{i}")),
                    ..InstallSummary::default()
                }),
            });
            record.remember(if i == 0 {
                InstallKind::Install
            } else {
                InstallKind::Repair
            });
        }
        let versions: Vec<&str> = record.history.iter().map(|h| h.version.as_str()).collect();
        assert_eq!(versions, ["6.0.6", "6.0.5", "6.0.4", "6.0.3", "6.0.2"]);
        let newest = &record.history[0];
        assert_eq!(newest.kind, InstallKind::Repair);
        assert_eq!(newest.config_hash.as_deref(), Some("sha256:6"));
        let summary = newest.summary.as_ref().expect("a summary");
        assert_eq!((summary.created, summary.config_hash.as_deref()), (6, None));
        assert_eq!(record.history[1].result, InstallResult::Failed);
        assert!(record.history[1].summary.is_none());
        // It survives the record's round trip.
        let json = serde_json::to_vec(&record).expect("json");
        assert_eq!(
            serde_json::from_slice::<Record>(&json).expect("record"),
            record
        );
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
