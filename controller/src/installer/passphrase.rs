//! Checks the passphrase before Pulumi touches an instance's state. The first install records a
//! salted PBKDF2 verifier of the passphrase beside the state; every later run compares the
//! current passphrase with it, so a changed passphrase is a typed `PassphraseMismatch` with the
//! fix, found without running Pulumi and without writing anything.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};

/// The verifier's file name in the instance's state directory.
pub const FILE: &str = "passphrase-check.json";
const ITERATIONS: u32 = 100_000;

/// Errors of the check.
#[derive(Debug, thiserror::Error)]
pub enum PassphraseError {
    /// The passphrase file cannot be read.
    #[error(
        "the passphrase file {path} cannot be read ({source}); mount the passphrase Secret (key passphrase) there or set --passphrase-file"
    )]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is empty.
    #[error(
        "the passphrase file {path} is empty; the passphrase Secret needs a non-empty key passphrase"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// It is not the passphrase the state was written with.
    #[error(
        "the passphrase in {path} is not the one this instance's Pulumi state was encrypted with; put the original passphrase back into the Secret platform-operator-passphrase (or the Secret passphrase.existingSecret names) and restart the operator; the state is left untouched"
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
    },
    /// The verifier cannot be written.
    #[error("writing {path} failed: {source}; check the state volume")]
    Store {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Verifier {
    salt: String,
    iterations: u32,
    hash: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A 32-byte PBKDF2-HMAC-SHA256 key of `passphrase` and `salt`.
pub(super) fn derive(passphrase: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut out = [0u8; 32];
    let iterations = NonZeroU32::new(iterations.max(1)).unwrap_or(NonZeroU32::MIN);
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        iterations,
        salt,
        passphrase,
        &mut out,
    );
    out
}

/// A passphrase no verifier was recorded for yet, with the salt of its verifier: the verifier
/// is derived by [`Unrecorded::seal`] (the slow part, so an install runs it beside its other
/// steps) and stored only once Pulumi has accepted that passphrase (an install succeeded), so a
/// wrong passphrase is never recorded.
pub struct Unrecorded {
    passphrase: Vec<u8>,
    salt: [u8; 16],
}

impl std::fmt::Debug for Unrecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the passphrase.
        f.debug_struct("Unrecorded").finish_non_exhaustive()
    }
}

impl Unrecorded {
    /// Derives the verifier (PBKDF2, deliberately slow: blocking).
    pub fn seal(self) -> Sealed {
        Sealed(Verifier {
            salt: hex(&self.salt),
            iterations: ITERATIONS,
            hash: hex(&derive(&self.passphrase, &self.salt, ITERATIONS)),
        })
    }

    /// Derives the verifier and writes it into `dir` (see [`Sealed::store`]).
    pub fn store(self, dir: &Path) -> Result<(), PassphraseError> {
        self.seal().store(dir)
    }
}

/// A verifier derived for an [`Unrecorded`] passphrase, not yet stored.
#[derive(Debug)]
pub struct Sealed(Verifier);

impl Sealed {
    /// Writes the verifier into `dir` (a temporary file renamed over, so never half written).
    pub fn store(&self, dir: &Path) -> Result<(), PassphraseError> {
        let file = dir.join(FILE);
        let tmp = dir.join(format!(".{FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            std::fs::write(
                &tmp,
                serde_json::to_vec(&self.0).map_err(std::io::Error::other)?,
            )?;
            std::fs::rename(&tmp, &file)
        };
        write().map_err(|source| PassphraseError::Store { path: file, source })
    }
}

/// Reads the passphrase file (surrounding white space trimmed, as Pulumi reads it) and checks it
/// against `dir`'s verifier. With no verifier yet, returns the passphrase to derive one from and
/// store after a successful install (nothing is derived here then).
pub fn check(passphrase_file: &Path, dir: &Path) -> Result<Option<Unrecorded>, PassphraseError> {
    let raw = std::fs::read(passphrase_file).map_err(|source| PassphraseError::Unreadable {
        path: passphrase_file.to_path_buf(),
        source,
    })?;
    let passphrase = raw.trim_ascii();
    if passphrase.is_empty() {
        return Err(PassphraseError::Empty {
            path: passphrase_file.to_path_buf(),
        });
    }
    let file = dir.join(FILE);
    if let Some(v) = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice::<Verifier>(&b).ok())
    {
        let salt = unhex(&v.salt).unwrap_or_default();
        let want = unhex(&v.hash).unwrap_or_default();
        let ok = ring::pbkdf2::verify(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            NonZeroU32::new(v.iterations.max(1)).unwrap_or(NonZeroU32::MIN),
            &salt,
            passphrase,
            &want,
        )
        .is_ok();
        return if ok {
            Ok(None)
        } else {
            Err(PassphraseError::Mismatch {
                path: passphrase_file.to_path_buf(),
            })
        };
    }
    let mut salt = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| PassphraseError::Store {
            path: file.clone(),
            source: std::io::Error::other("no system randomness"),
        })?;
    Ok(Some(Unrecorded {
        passphrase: passphrase.to_vec(),
        salt,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_then_checks_the_passphrase() {
        let dir = std::env::temp_dir().join(format!("passphrase-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let pass = dir.join("passphrase");
        assert!(matches!(
            check(&pass, &dir),
            Err(PassphraseError::Unreadable { .. })
        ));
        std::fs::write(&pass, " \n").expect("write");
        assert!(matches!(
            check(&pass, &dir),
            Err(PassphraseError::Empty { .. })
        ));
        std::fs::write(&pass, "correct horse").expect("write");
        let unrecorded = check(&pass, &dir)
            .expect("no verifier yet")
            .expect("one to record");
        assert!(
            !dir.join(FILE).exists(),
            "recorded only after Pulumi accepted it"
        );
        unrecorded.store(&dir).expect("store");
        let recorded = std::fs::read_to_string(dir.join(FILE)).expect("verifier");
        assert!(!recorded.contains("correct horse"));
        assert!(check(&pass, &dir).expect("same passphrase").is_none());
        std::fs::write(&pass, "correct horse\n").expect("write");
        assert!(
            check(&pass, &dir)
                .expect("a trailing newline is trimmed, as Pulumi does")
                .is_none()
        );
        std::fs::write(&pass, "battery staple").expect("write");
        let e = check(&pass, &dir).expect_err("changed passphrase");
        assert!(matches!(e, PassphraseError::Mismatch { .. }));
        assert!(e.to_string().contains("platform-operator-passphrase"));
        assert_eq!(
            std::fs::read_to_string(dir.join(FILE)).expect("verifier"),
            recorded,
            "a mismatch never rewrites the verifier"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
