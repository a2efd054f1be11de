//! Each instance's Pulumi state is encrypted under a passphrase of its own: HKDF-SHA256 of the
//! operator's passphrase (salt [`SALT`]) with the instance's UID as its info, so whatever runs one
//! instance's program can decrypt only that instance's state. Before each run the key that opens
//! the state is found by asking the Pulumi CLI (a secret set in a copy of the stack config: only
//! the right passphrase passes Pulumi's check): the instance's own, else the key of the UID the
//! record names (an instance created again over retained state), else the operator's passphrase
//! (state of an earlier release). A state under another key is re-encrypted under the instance's
//! own by the CLI (`pulumi stack change-secrets-provider`), on a copy kept until the new key is
//! checked and put back when anything fails, also after a crash.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::modules::{StateError, io};
use super::pulumi::{PulumiError, STACK, Stack};
use super::record::write_durably;
use crate::decide::model::{Failure, TaskError};

/// HKDF's salt: names what the derived keys are for.
pub const SALT: &[u8] = b"platform-operator/v1/pulumi-state-passphrase";
/// The folder beside the project where the state is copied while it is re-encrypted.
pub const MIGRATION: &str = "state-key-migration";
/// The file in [`MIGRATION`] that says the copy is whole.
const WHOLE: &str = "whole";

/// The passphrase of the instance with `uid` under the operator's `passphrase` (its surrounding
/// whitespace ignored, as Pulumi ignores it in a passphrase file): 64 hex digits.
pub fn derive(passphrase: &[u8], uid: &str) -> String {
    use ring::hkdf;
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(passphrase.trim_ascii());
    let info = [uid.as_bytes()];
    let okm = prk.expand(&info, hkdf::HKDF_SHA256).expect("32 bytes");
    let mut key = [0u8; 32];
    okm.fill(&mut key).expect("32 bytes");
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// A passphrase in a file only its owner reads (under `$TMPDIR`, never on the state volume),
/// removed when dropped: what `PULUMI_CONFIG_PASSPHRASE_FILE` names for one run.
#[derive(Debug)]
pub struct KeyFile {
    /// Where the passphrase is.
    pub path: PathBuf,
}

impl KeyFile {
    /// Writes `passphrase` into a new such file.
    pub fn new(passphrase: impl AsRef<[u8]>) -> Result<Self, StateError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join("platform-operator-keys");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io("creating", &dir))?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{}-{n}", std::process::id()));
        let mut file = std::fs::File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io("creating", &path))?;
        file.write_all(passphrase.as_ref())
            .map_err(io("writing", &path))?;
        Ok(Self { path })
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The keys other than instance `uid`'s own that may open its state, most likely first: the key
/// of the UID the record names (an instance created again over retained state), then the
/// operator's passphrase (state of an earlier release).
pub fn previous(operator: &[u8], uid: &str, recorded: Option<&str>) -> Vec<Vec<u8>> {
    let earlier = recorded.filter(|r| *r != uid);
    let earlier = earlier.map(|r| derive(operator, r).into_bytes());
    earlier.into_iter().chain([operator.to_vec()]).collect()
}

/// Makes sure `stack`'s state opens with its `passphrase_file` (the instance's own key): puts
/// back what an interrupted re-encryption left, and re-encrypts the state under that key when
/// one of `previous` opens it instead. Runs the Pulumi CLI only, never the program. `dir` holds
/// the migration copy; `operator` is the passphrase file an error names.
pub async fn settle(
    stack: &Stack,
    dir: &Path,
    previous: &[Vec<u8>],
    operator: &Path,
) -> Result<(), TaskError> {
    put_back_interrupted(stack, dir)?;
    if !stack.project.join(config_file()).exists() || stack.opens().await? {
        return Ok(());
    }
    for key in previous {
        let key = KeyFile::new(key)?;
        let from = Stack {
            passphrase_file: key.path.clone(),
            ..stack.clone()
        };
        if from.opens().await? {
            migrate(&from, stack, dir).await?;
            tracing::info!(project = %stack.project.display(), "re-encrypted the Pulumi state under the instance's own key");
            return Ok(());
        }
    }
    Err(TaskError::new(
        Failure::PassphraseMismatch,
        PulumiError::IncorrectPassphrase {
            action: "config set",
            path: operator.to_path_buf(),
        }
        .to_string(),
    ))
}

fn config_file() -> String {
    format!("Pulumi.{STACK}.yaml")
}

/// Copies the state aside, has `from` (the key that opens it) re-encrypt it under `to`'s key,
/// checks that `to`'s key opens all of it, and puts the copy back when anything failed.
async fn migrate(from: &Stack, to: &Stack, dir: &Path) -> Result<(), TaskError> {
    let copy = dir.join(MIGRATION);
    let project = &from.project;
    let _ = std::fs::remove_dir_all(&copy);
    super::copy_folder(&from.backend, &copy.join("state")).map_err(io("copying", &copy))?;
    let config = config_file();
    std::fs::copy(project.join(&config), copy.join(&config)).map_err(io("copying", &copy))?;
    // The copy reaches the disk before it is marked whole: after a crash a whole copy is put
    // back over the state.
    rustix::fs::sync();
    write_durably(&copy, WHOLE, b"").map_err(io("writing", &copy))?;
    let key =
        std::fs::read_to_string(&to.passphrase_file).map_err(io("reading", &to.passphrase_file))?;
    let rotated = async {
        from.rotate(&key).await?;
        match to.opens().await? {
            true => to.export().await,
            false => Err(PulumiError::Rekey(
                "the state does not open with its new key after re-encryption".into(),
            )),
        }
    };
    match rotated.await {
        Ok(()) => {
            // What Pulumi wrote reaches the disk before the copy goes.
            rustix::fs::sync();
            let _ = std::fs::remove_dir_all(&copy);
            Ok(())
        }
        Err(e) => {
            put_back_interrupted(from, dir)?;
            Err(TaskError::new(
                Failure::StateUnavailable,
                format!(
                    "re-encrypting the Pulumi state under the instance's own key failed ({e}); the state was put back as it was and the install retries with backoff"
                ),
            ))
        }
    }
}

/// Puts back a whole copy that an interrupted [`migrate`] left (a copy that is not whole is
/// dropped: the state was not touched yet).
pub fn put_back_interrupted(stack: &Stack, dir: &Path) -> Result<(), StateError> {
    let copy = dir.join(MIGRATION);
    if copy.join(WHOLE).exists() {
        tracing::warn!(copy = %copy.display(), "putting back the Pulumi state copied before an interrupted re-encryption");
        let backend = &stack.backend;
        if backend.exists() {
            std::fs::remove_dir_all(backend).map_err(io("removing", backend))?;
        }
        super::copy_folder(&copy.join("state"), backend).map_err(io("restoring", backend))?;
        let config = config_file();
        let target = stack.project.join(&config);
        std::fs::copy(copy.join(&config), &target).map_err(io("restoring", &target))?;
        rustix::fs::sync();
    }
    if copy.exists() {
        std::fs::remove_dir_all(&copy).map_err(io("removing", &copy))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_uid_has_its_own_key_and_whitespace_around_the_passphrase_is_ignored() {
        let a = derive(b"operator passphrase", "uid-a");
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(a, derive(b"  operator passphrase\n", "uid-a"));
        assert_ne!(a, derive(b"operator passphrase", "uid-b"));
        assert_ne!(a, derive(b"another passphrase", "uid-a"));
        // RFC 5869's HKDF-SHA256 (computed apart with Python's hmac), pinned: a change of the
        // derivation would lock every instance out of its state.
        assert_eq!(
            derive(b"operator passphrase", "uid-a"),
            "a5643402ba791d8706bd8ec2d7cd0d278feeebd7d17df7ddaf9c643d47d9f3b1"
        );
    }

    #[test]
    fn the_previous_keys_are_the_recorded_uids_then_the_operators() {
        let operator = b"operator passphrase\n";
        let recorded = derive(operator, "uid-old").into_bytes();
        assert_eq!(
            previous(operator, "uid-new", Some("uid-old")),
            [recorded, operator.to_vec()]
        );
        // The instance's own key is never among them.
        assert_eq!(
            previous(operator, "uid-a", Some("uid-a")),
            [operator.to_vec()]
        );
        assert_eq!(previous(operator, "uid-a", None), [operator.to_vec()]);
    }

    #[test]
    fn a_key_file_is_private_and_goes_when_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let key = KeyFile::new("secret").expect("key file");
        let path = key.path.clone();
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "secret");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(key);
        assert!(!path.exists());
    }

    /// A project in a folder of its own whose stack `dev` has a secret under `passphrase` (the
    /// real Pulumi CLI); its stack (passphrase file: the operator's).
    async fn stack_under(dir: &Path, passphrase: &str, operator: &str) -> Stack {
        let _ = std::fs::remove_dir_all(dir);
        let tools = e2e::tools::Tools::locate().expect("tools");
        let project = dir.join("platform");
        super::super::write_project(&project, &project.join("state"), "6.0.21", "3.248.0")
            .expect("project");
        let first = dir.join("first-passphrase");
        std::fs::write(&first, passphrase).expect("write");
        let operator_file = dir.join("operator-passphrase");
        std::fs::write(&operator_file, operator).expect("write");
        let stack = Stack {
            binary: tools.bin("pulumi").display().to_string(),
            home: dir.join("pulumi-home"),
            passphrase_file: first,
            backend: project.join("state"),
            project,
            state: dir.to_path_buf(),
            heap_limit_mib: 256,
        };
        stack.select_or_create().await.expect("stack");
        let secret = super::super::pulumi::ConfigValue::Secret(super::super::config::Redacted(
            "s3cret".into(),
        ));
        let list = super::super::pulumi::ConfigValue::List(vec!["kubernetes".into()]);
        let values = [("platform:token", secret), ("platform:list", list)];
        stack.configure(&values, &[]).await.expect("config");
        Stack {
            passphrase_file: operator_file,
            ..stack
        }
    }

    /// As a rekey pod and the controller do it together: finds the key that opens `stack`'s state (its `passphrase_file` the operator's), re-encrypts
    /// the state under the instance's own key when another opens it, and returns the instance's key.
    /// `recorded` is the UID whose key the record says encrypts the state. `dir` is the instance's
    /// folder (the migration copy lives there).
    async fn instance_key(
        stack: &Stack,
        dir: &Path,
        uid: &str,
        recorded: Option<&str>,
    ) -> Result<KeyFile, TaskError> {
        let file = &stack.passphrase_file;
        let operator = std::fs::read(file).map_err(io("reading the passphrase file", file))?;
        let own = KeyFile::new(derive(&operator, uid))?;
        let with_own = Stack {
            passphrase_file: own.path.clone(),
            ..stack.clone()
        };
        settle(&with_own, dir, &previous(&operator, uid, recorded), file).await?;
        Ok(own)
    }

    /// Whether `passphrase` opens `stack`'s state.
    async fn opens_with(stack: &Stack, passphrase: &str) -> bool {
        let key = KeyFile::new(passphrase).expect("key");
        let keyed = Stack {
            passphrase_file: key.path.clone(),
            ..stack.clone()
        };
        keyed.opens().await.expect("probe")
    }

    #[tokio::test]
    async fn the_state_moves_to_its_instance_key_once_even_when_interrupted() {
        let base = std::env::temp_dir().join(format!("state-key-{}", std::process::id()));
        let operator = "operator passphrase\n";
        let own = derive(operator.as_bytes(), "uid-a");

        // State of an earlier release, under the operator's passphrase: re-encrypted once.
        let dir = base.join("earlier");
        let stack = stack_under(&dir, operator, operator).await;
        let key = instance_key(&stack, &dir, "uid-a", None)
            .await
            .expect("key");
        assert_eq!(std::fs::read_to_string(&key.path).expect("key"), own);
        assert!(opens_with(&stack, &own).await, "its own key opens it now");
        assert!(
            !opens_with(&stack, operator).await,
            "the operator's no longer does"
        );
        let keyed = Stack {
            passphrase_file: key.path.clone(),
            ..stack.clone()
        };
        keyed
            .export()
            .await
            .expect("the checkpoint opens with its own key");
        assert!(!dir.join(MIGRATION).exists(), "no copy is left");
        drop(key);
        // Already under its own key: nothing to do.
        instance_key(&stack, &dir, "uid-a", Some("uid-a"))
            .await
            .expect("key");
        assert!(opens_with(&stack, &own).await);

        // Created again over retained state: the earlier UID's key opens it, the new UID's takes
        // over.
        let again = derive(operator.as_bytes(), "uid-b");
        instance_key(&stack, &dir, "uid-b", Some("uid-a"))
            .await
            .expect("key");
        assert!(opens_with(&stack, &again).await);
        assert!(!opens_with(&stack, &own).await);

        // A passphrase that opens nothing: PassphraseMismatch, the state untouched.
        let wrong = Stack {
            passphrase_file: dir.join("wrong"),
            ..stack.clone()
        };
        std::fs::write(&wrong.passphrase_file, "wrong").expect("write");
        let refused = instance_key(&wrong, &dir, "uid-b", Some("uid-b"))
            .await
            .expect_err("no key opens it");
        assert_eq!(refused.failure, Some(Failure::PassphraseMismatch));
        assert!(opens_with(&stack, &again).await);

        // Interrupted after the copy was whole, the live state left under a key nobody has:
        // the copy is put back, then the state is re-encrypted.
        let dir = base.join("interrupted");
        let stack = stack_under(&dir, operator, operator).await;
        let copy = dir.join(MIGRATION);
        super::super::copy_folder(&stack.backend, &copy.join("state")).expect("copy");
        std::fs::copy(stack.project.join(config_file()), copy.join(config_file())).expect("copy");
        std::fs::write(copy.join(WHOLE), "").expect("whole");
        let from = KeyFile::new(operator).expect("key");
        let half = Stack {
            passphrase_file: from.path.clone(),
            ..stack.clone()
        };
        half.rotate("a key nobody has").await.expect("rotate");
        assert!(!opens_with(&stack, operator).await);
        instance_key(&stack, &dir, "uid-a", None)
            .await
            .expect("key");
        assert!(opens_with(&stack, &own).await);
        assert!(!copy.exists());
        // A copy that is not whole is dropped: the state was not touched yet.
        std::fs::create_dir_all(copy.join("state")).expect("partial");
        instance_key(&stack, &dir, "uid-a", Some("uid-a"))
            .await
            .expect("key");
        assert!(!copy.exists() && opens_with(&stack, &own).await);

        // An empty new passphrase is refused before Pulumi sees it.
        assert!(half.rotate(" ").await.is_err());
        let _ = std::fs::remove_dir_all(&base);
    }
}
