//! Pulumi's passphrase secrets provider, in process: the same keys and value format as the CLI
//! (`v1` state: a key derived from the passphrase and a salt with 1,000,000 rounds of
//! PBKDF2-HMAC-SHA256; values sealed with AES-256-GCM under a random 12-byte nonce, written
//! `v1:<nonce, base64>:<ciphertext and tag, base64>`). With it the installer writes the stack's
//! config file, secrets included, and reads the stack's outputs from its checkpoint without a
//! Pulumi CLI start for each (see [`super::pulumi::Stack::write_config`]).
//!
//! A stack's salt state is `v1:<salt, base64>:<the word "pulumi" sealed with the key>`, so a
//! wrong passphrase is found before anything is written. Derived keys are kept in memory for the
//! life of the process, by (passphrase digest, salt): the derivation is deliberately slow, and a
//! new stack reuses the salt of a key already derived for the current passphrase (each value
//! still gets its own random nonce), so only the first stack of a process pays for it.

use std::sync::Mutex;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// PBKDF2 rounds of Pulumi's passphrase provider (`sdk/go/common/resource/config/crypt.go`).
pub const ITERATIONS: u32 = 1_000_000;
/// The word a salt state seals, to check the passphrase.
const CHECK_WORD: &str = "pulumi";
/// Salt length of the stacks this operator creates (the CLI's length).
const SALT_LEN: usize = 8;
/// At most this many derived keys are kept; the oldest goes first.
const CACHE_LIMIT: usize = 1024;

/// Errors of the passphrase crypter.
#[derive(Debug, thiserror::Error)]
pub enum CrypterError {
    /// The passphrase does not open the stack's salt state or a value.
    #[error(
        "the passphrase does not open {what}; put back the passphrase this instance's Pulumi state was written with"
    )]
    IncorrectPassphrase {
        /// What could not be opened.
        what: &'static str,
    },
    /// Not a value of Pulumi's passphrase provider (another provider, or a format this operator
    /// does not know).
    #[error(
        "{what} is not a value of Pulumi's v1 passphrase secrets provider ({detail}); the operator only writes and reads passphrase-encrypted stacks"
    )]
    Malformed {
        /// What was read.
        what: &'static str,
        /// Why.
        detail: &'static str,
    },
    /// The system's random source failed.
    #[error("the system's random source failed; the install retries")]
    Random,
}

/// A key derived from the passphrase and one salt, and the salt state that names it.
pub struct Crypter {
    key: LessSafeKey,
    state: String,
}

impl std::fmt::Debug for Crypter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crypter")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

struct Cached {
    passphrase: [u8; 32],
    salt: Vec<u8>,
    key: [u8; 32],
}

static KEYS: Mutex<Vec<Cached>> = Mutex::new(Vec::new());

fn digest(passphrase: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, passphrase).as_ref());
    out
}

fn derive(passphrase: &[u8], salt: &[u8]) -> [u8; 32] {
    let id = digest(passphrase);
    if let Ok(keys) = KEYS.lock()
        && let Some(c) = keys.iter().find(|c| c.passphrase == id && c.salt == salt)
    {
        return c.key;
    }
    let key = super::passphrase::derive(passphrase, salt, ITERATIONS);
    if let Ok(mut keys) = KEYS.lock() {
        if keys.len() >= CACHE_LIMIT {
            keys.remove(0);
        }
        keys.push(Cached {
            passphrase: id,
            salt: salt.to_vec(),
            key,
        });
    }
    key
}

/// A salt of a key already derived for `passphrase`, if any.
fn cached_salt(passphrase: &[u8]) -> Option<Vec<u8>> {
    let id = digest(passphrase);
    let keys = KEYS.lock().ok()?;
    keys.iter()
        .rev()
        .find(|c| c.passphrase == id && c.salt.len() == SALT_LEN)
        .map(|c| c.salt.clone())
}

fn sealing_key(key: &[u8; 32]) -> Result<LessSafeKey, CrypterError> {
    UnboundKey::new(&AES_256_GCM, key)
        .map(LessSafeKey::new)
        .map_err(|_| CrypterError::Malformed {
            what: "the derived key",
            detail: "not an AES-256 key",
        })
}

impl Crypter {
    /// The crypter of salt state `state` (`v1:<salt>:<sealed check word>`), with the passphrase
    /// checked against it.
    pub fn from_state(passphrase: &[u8], state: &str) -> Result<Self, CrypterError> {
        let malformed = |detail| CrypterError::Malformed {
            what: "the stack's encryption salt",
            detail,
        };
        let mut parts = state.splitn(3, ':');
        if parts.next() != Some("v1") {
            return Err(malformed("not a v1 state"));
        }
        let salt = parts
            .next()
            .and_then(|s| STANDARD.decode(s).ok())
            .ok_or_else(|| malformed("no base64 salt"))?;
        let sealed = parts.next().ok_or_else(|| malformed("no check value"))?;
        let crypter = Crypter {
            key: sealing_key(&derive(passphrase, &salt))?,
            state: state.to_string(),
        };
        match crypter.decrypt(sealed) {
            Ok(word) if word == CHECK_WORD => Ok(crypter),
            Err(e @ CrypterError::Malformed { .. }) => Err(e),
            _ => Err(CrypterError::IncorrectPassphrase {
                what: "the stack's encryption salt",
            }),
        }
    }

    /// A crypter with a new salt state for a new stack: the salt of a key already derived for
    /// this passphrase, else a random one.
    pub fn new_state(passphrase: &[u8]) -> Result<Self, CrypterError> {
        let salt = match cached_salt(passphrase) {
            Some(salt) => salt,
            None => {
                let mut salt = vec![0u8; SALT_LEN];
                SystemRandom::new()
                    .fill(&mut salt)
                    .map_err(|_| CrypterError::Random)?;
                salt
            }
        };
        let mut crypter = Crypter {
            key: sealing_key(&derive(passphrase, &salt))?,
            state: String::new(),
        };
        let check = crypter.encrypt(CHECK_WORD)?;
        crypter.state = format!("v1:{}:{check}", STANDARD.encode(&salt));
        Ok(crypter)
    }

    /// The salt state (the config file's `encryptionsalt`).
    pub fn state(&self) -> &str {
        &self.state
    }

    /// Seals `plaintext`: `v1:<nonce>:<ciphertext>`.
    pub fn encrypt(&self, plaintext: &str) -> Result<String, CrypterError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| CrypterError::Random)?;
        let mut sealed = plaintext.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut sealed,
            )
            .map_err(|_| CrypterError::Malformed {
                what: "a value to seal",
                detail: "too long for AES-256-GCM",
            })?;
        Ok(format!(
            "v1:{}:{}",
            STANDARD.encode(nonce),
            STANDARD.encode(&sealed)
        ))
    }

    /// Opens a `v1:<nonce>:<ciphertext>` value.
    pub fn decrypt(&self, value: &str) -> Result<String, CrypterError> {
        let malformed = |detail| CrypterError::Malformed {
            what: "a secret value",
            detail,
        };
        let parts: Vec<&str> = value.split(':').collect();
        let [version, nonce, sealed] = parts.as_slice() else {
            return Err(malformed("not three fields"));
        };
        if *version != "v1" {
            return Err(malformed("not a v1 value"));
        }
        let nonce: [u8; NONCE_LEN] = STANDARD
            .decode(nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or_else(|| malformed("no 12-byte base64 nonce"))?;
        let mut sealed = STANDARD
            .decode(sealed)
            .map_err(|_| malformed("no base64 ciphertext"))?;
        let opened = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut sealed,
            )
            .map_err(|_| CrypterError::IncorrectPassphrase {
                what: "a secret value",
            })?;
        String::from_utf8(opened.to_vec()).map_err(|_| malformed("not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A salt state and a secret written by the real Pulumi CLI v3.274.1
    /// (`pulumi stack select --create`, then `pulumi config set --secret pt:tok` with `xyz` on
    /// standard input) with the passphrase `hunter2-passphrase`.
    const CLI_STATE: &str = "v1:CFXWRjd/y4Q=:v1:8CVOPJsLWfXV4nmH:fGv5nPP7ljzWhTEQXTd5ojVcXWgIeg==";
    const CLI_SECRET: &str = "v1:da7PfVR0yZpbyrin:tpJpipS4WjfTFlMRagV5xDaZUQ==";

    #[test]
    fn opens_what_the_cli_wrote_and_refuses_a_wrong_passphrase() {
        let crypter = Crypter::from_state(b"hunter2-passphrase", CLI_STATE).expect("state");
        assert_eq!(crypter.decrypt(CLI_SECRET).expect("secret"), "xyz");
        assert!(matches!(
            Crypter::from_state(b"another", CLI_STATE),
            Err(CrypterError::IncorrectPassphrase { .. })
        ));
        assert!(matches!(
            Crypter::from_state(b"hunter2-passphrase", "v2:abc:def"),
            Err(CrypterError::Malformed { .. })
        ));
        let sealed = crypter.encrypt("a: b\n\"quoted\" ünïcode").expect("seal");
        assert!(sealed.starts_with("v1:"), "{sealed}");
        assert_ne!(
            sealed,
            crypter.encrypt("a: b\n\"quoted\" ünïcode").expect("seal"),
            "a fresh nonce per value"
        );
        assert_eq!(
            crypter.decrypt(&sealed).expect("open"),
            "a: b\n\"quoted\" ünïcode"
        );
        let mut tampered = sealed.clone();
        tampered.pop();
        tampered.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert!(crypter.decrypt(&tampered).is_err(), "the tag is checked");
        assert!(crypter.decrypt("v1:short:AAAA").is_err());
    }

    #[test]
    fn a_new_state_reuses_a_derived_salt_and_opens_again() {
        let fresh = Crypter::new_state(b"new-state-test").expect("new");
        let again = Crypter::from_state(b"new-state-test", fresh.state()).expect("reopen");
        assert_eq!(
            again
                .decrypt(&fresh.encrypt("value").expect("seal"))
                .expect("open"),
            "value"
        );
        let second = Crypter::new_state(b"new-state-test").expect("second");
        let salt = |s: &str| s.split(':').nth(1).map(str::to_string);
        assert_eq!(salt(second.state()), salt(fresh.state()));
        assert!(matches!(
            Crypter::from_state(b"not-it", second.state()),
            Err(CrypterError::IncorrectPassphrase { .. })
        ));
    }
}
