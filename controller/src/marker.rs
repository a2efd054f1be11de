//! The owner marker of an instance's storage directory: `.platform-instance`, holding the UID
//! and `<namespace>/<name>` of the instance whose control plane first started on it. The control
//! plane's init container (`controller claim-storage`, from `--cleanup-image`) writes it when
//! there is none and stops the control plane when it names another instance; the cleanup Job
//! removes nothing it names another. A directory without one (made by an earlier release, or
//! never started) is claimed by the instance whose directory it is by name.

use std::path::{Path, PathBuf};

/// The marker's file name at the top of the storage directory.
pub const MARKER: &str = ".platform-instance";
/// The exit status of `claim-storage` and `cleanup` when the marker names another instance.
pub const CONFLICT_EXIT: u8 = 3;

/// What can go wrong with the marker.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    /// The marker names another instance (the message says whose).
    #[error("{0}")]
    Conflict(String),
    /// Reading or writing (`.0`) the marker (`.1`) failed.
    #[error("{0} the owner marker {1} failed: {2}; check the storage volume")]
    Io(&'static str, PathBuf, #[source] std::io::Error),
}

/// The marker's content: the owner's UID and `<namespace>/<name>`, one per line.
fn content(uid: &str, instance: &str) -> String {
    format!("{uid}\n{instance}\n")
}

/// Checks `dir` against the instance of `uid`: `Ok(true)` when its marker names it, `Ok(false)`
/// when there is none.
pub fn check(dir: &Path, uid: &str) -> Result<bool, MarkerError> {
    let path = dir.join(MARKER);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(MarkerError::Io("reading", path, e)),
    };
    let mut lines = text.lines();
    let (owner_uid, owner) = (
        lines.next().unwrap_or(""),
        lines.next().unwrap_or("unknown"),
    );
    if owner_uid == uid {
        return Ok(true);
    }
    Err(MarkerError::Conflict(format!(
        "the storage directory {} belongs to instance {owner} (uid {owner_uid}), not to this one (uid {uid}); it is left as it is: move it aside, or remove its marker {MARKER} if its data is this instance's to take",
        dir.display()
    )))
}

/// Claims `dir` for instance `instance` of `uid`: writes the marker (durably) when there is
/// none; fails with [`MarkerError::Conflict`] when it names another instance.
pub fn claim(dir: &Path, uid: &str, instance: &str) -> Result<(), MarkerError> {
    if !check(dir, uid)? {
        let bytes = content(uid, instance);
        crate::installer::record::write_durably(dir, MARKER, bytes.as_bytes())
            .map_err(|e| MarkerError::Io("writing", dir.join(MARKER), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("marker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        dir
    }

    #[test]
    fn the_first_claim_marks_the_directory_and_only_its_owner_passes_again() {
        let dir = scratch("claim");
        assert!(!check(&dir, "uid-a").expect("no marker"));
        claim(&dir, "uid-a", "team-a/one").expect("claimed");
        assert_eq!(
            std::fs::read_to_string(dir.join(MARKER)).expect("marker"),
            "uid-a\nteam-a/one\n"
        );
        claim(&dir, "uid-a", "team-a/one").expect("claimed again by its owner");
        assert!(check(&dir, "uid-a").expect("ours"));
        let e = claim(&dir, "uid-b", "team-a/one").expect_err("another uid");
        assert!(matches!(e, MarkerError::Conflict(_)), "{e}");
        let message = e.to_string();
        assert!(
            message.contains("team-a/one")
                && message.contains("uid-a")
                && message.contains("uid-b"),
            "{message}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join(MARKER)).expect("marker"),
            "uid-a\nteam-a/one\n",
            "a refused claim changes nothing"
        );
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
