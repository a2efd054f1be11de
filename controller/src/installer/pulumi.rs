//! Drives the Pulumi CLI for one instance's stack: write the stack's config file the way the CLI
//! writes it (secrets sealed with the passphrase in process, never in argv), create the stack
//! on first use, clear a stale lock and pending operations a killed run left, `up` with an
//! event log, a `preview` for drift, and the outputs, read from the checkpoint the `up` wrote
//! (the CLI's `stack output` where the checkpoint is not in a form this operator reads).
//! Results come from structured output only (the event log's summary and diagnostics,
//! `--json`, the checkpoint); exit codes map onto typed errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use super::crypter::{Crypter, CrypterError};
use super::process::{self, Output};

/// The one stack every instance project has.
pub const STACK: &str = "dev";

/// What a non-zero exit code of the Pulumi CLI means (its documented contract,
/// `sdk/go/common/util/cmdutil/exit.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 1: a general error (a failed resource or program exception included).
    Error,
    /// 2: bad configuration or flags.
    Configuration,
    /// 3: authentication.
    Authentication,
    /// 4: a resource error.
    Resource,
    /// 5: a policy violation.
    Policy,
    /// 6: no such stack.
    StackNotFound,
    /// 7: changes where none were expected.
    UnexpectedChanges,
    /// 8: cancelled.
    Cancelled,
    /// 9: timed out.
    Timeout,
    /// 255 or anything else: an internal error.
    Internal,
    /// No code: killed by a signal.
    Killed,
}

impl Exit {
    /// The meaning of exit code `code` (`None`: killed).
    pub fn from_code(code: Option<i32>) -> Self {
        match code {
            None => Exit::Killed,
            Some(1) => Exit::Error,
            Some(2) => Exit::Configuration,
            Some(3) => Exit::Authentication,
            Some(4) => Exit::Resource,
            Some(5) => Exit::Policy,
            Some(6) => Exit::StackNotFound,
            Some(7) => Exit::UnexpectedChanges,
            Some(8) => Exit::Cancelled,
            Some(9) => Exit::Timeout,
            Some(_) => Exit::Internal,
        }
    }

    /// A word for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Exit::Error => "error",
            Exit::Configuration => "configuration error",
            Exit::Authentication => "authentication error",
            Exit::Resource => "resource error",
            Exit::Policy => "policy violation",
            Exit::StackNotFound => "stack not found",
            Exit::UnexpectedChanges => "unexpected changes",
            Exit::Cancelled => "cancelled",
            Exit::Timeout => "timed out",
            Exit::Internal => "internal error",
            Exit::Killed => "killed",
        }
    }
}

/// Errors of a Pulumi operation.
#[derive(Debug, thiserror::Error)]
pub enum PulumiError {
    /// pulumi could not be run.
    #[error("running {binary} failed: {source}; install the Pulumi CLI or set --pulumi-binary")]
    Spawn {
        /// The binary.
        binary: String,
        /// Why.
        source: std::io::Error,
    },
    /// A Pulumi command exited non-zero.
    #[error("pulumi {action} failed ({}, exit {code}): {message}", .exit.as_str())]
    Failed {
        /// The subcommand.
        action: &'static str,
        /// What the exit code means.
        exit: Exit,
        /// Its exit code (-1: killed).
        code: i32,
        /// The program's or engine's error, from the event log when there is one.
        message: String,
    },
    /// Its structured output could not be read.
    #[error("pulumi {action} printed output the operator cannot read: {detail}")]
    Output {
        /// The subcommand.
        action: &'static str,
        /// Why.
        detail: String,
    },
    /// The program's node process reached its heap limit and was stopped.
    #[error(
        "pulumi {action} failed: the platform program's node process reached its heap limit of {limit_mib} MiB (--program-heap-limit) and was stopped; the controller and other instances are unaffected. Fix the program or its input, or raise the limit with the container's memory"
    )]
    OutOfMemory {
        /// The subcommand.
        action: &'static str,
        /// The heap limit.
        limit_mib: u32,
    },
    /// The stack's config could not be sealed, or its outputs opened, with the passphrase.
    #[error("{what} failed: {source}")]
    Secrets {
        /// What was done.
        what: &'static str,
        /// Why.
        source: CrypterError,
    },
    /// A file of the workspace could not be written or removed.
    #[error("{what} {path} failed: {source}; check the state volume")]
    Io {
        /// What was done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Resource counts of an update, from the event log's summary event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Created (and replaced-by-create).
    pub created: i64,
    /// Updated.
    pub updated: i64,
    /// Deleted.
    pub deleted: i64,
    /// Unchanged.
    pub unchanged: i64,
}

impl Counts {
    /// Counts from a `resourceChanges` / `changeSummary` map (`create`, `update`, `delete`,
    /// `same`, `replace`, ...).
    pub fn from_changes(changes: &Value) -> Self {
        let get = |k: &str| changes.get(k).and_then(Value::as_i64).unwrap_or(0);
        Counts {
            created: get("create") + get("create-replacement") + get("replace"),
            updated: get("update"),
            deleted: get("delete") + get("delete-replaced"),
            unchanged: get("same"),
        }
    }

    /// Changes of any kind.
    pub fn changes(&self) -> i64 {
        self.created + self.updated + self.deleted
    }
}

/// What an `up` did.
#[derive(Clone, Debug, Default)]
pub struct UpResult {
    /// The resource counts.
    pub counts: Counts,
    /// How long pulumi ran.
    pub elapsed: Duration,
}

/// Reads an event log (one JSON engine event per line): the summary's resource changes and
/// the error diagnostics, in order.
pub fn read_event_log(text: &str) -> (Option<Counts>, Vec<String>) {
    let mut summary = None;
    let mut errors = Vec::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if let Some(changes) = event
            .get("summaryEvent")
            .and_then(|s| s.get("resourceChanges"))
        {
            summary = Some(Counts::from_changes(changes));
        }
        if let Some(d) = event.get("diagnosticEvent")
            && d.get("severity").and_then(Value::as_str) == Some("error")
            && let Some(message) = d.get("message").and_then(Value::as_str)
        {
            let message = message.trim();
            if !message.is_empty() {
                errors.push(message.to_string());
            }
        }
    }
    (summary, errors)
}

/// One instance's stack: its project folder, its local file backend, its state folder.
#[derive(Clone, Debug)]
pub struct Stack {
    /// The pulumi executable.
    pub binary: String,
    /// `PULUMI_HOME`: plugins live here, shared by every instance.
    pub home: PathBuf,
    /// The passphrase file (`PULUMI_CONFIG_PASSPHRASE_FILE`).
    pub passphrase_file: PathBuf,
    /// The project folder.
    pub project: PathBuf,
    /// The local backend folder.
    pub backend: PathBuf,
    /// The instance's state folder (pid file, event logs).
    pub state: PathBuf,
    /// The node heap limit of the program's processes, in MiB (`NODE_OPTIONS`).
    pub heap_limit_mib: u32,
}

/// The update record a history or backup file belongs to: its name without `.attrs` and
/// without `.history.json`, `.checkpoint.json` or `.json`.
fn record_key(name: &str) -> &str {
    let name = name.strip_suffix(".attrs").unwrap_or(name);
    [".history.json", ".checkpoint.json", ".json"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// The project name the generated `Pulumi.yaml` declares.
pub const PROJECT: &str = "di-platform";

/// Whether a file backend checkpoint (`{"version":3,"checkpoint":{"latest":{...}}}`) is one
/// this operator reads and records no pending operations.
pub fn no_pending_operations(checkpoint: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(checkpoint) else {
        return false;
    };
    let Some(checkpoint) = value
        .get("checkpoint")
        .filter(|_| value.get("version").and_then(Value::as_u64) == Some(3))
    else {
        return false;
    };
    match checkpoint.get("latest") {
        None | Some(Value::Null) => true,
        Some(latest) => latest
            .get("pending_operations")
            .is_none_or(|p| p.as_array().is_some_and(Vec::is_empty)),
    }
}

/// One value of the stack's config file.
#[derive(Clone, PartialEq, Eq)]
pub enum ConfigValue {
    /// A plaintext string.
    Plain(String),
    /// A plaintext list of strings (the way `config set --path key[i]` writes one).
    List(Vec<String>),
    /// A secret, sealed with the passphrase (`secure: v1:...`).
    Secret(String),
}

impl std::fmt::Debug for ConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigValue::Plain(v) => f.debug_tuple("Plain").field(v).finish(),
            ConfigValue::List(v) => f.debug_tuple("List").field(v).finish(),
            ConfigValue::Secret(_) => f.write_str("Secret(..)"),
        }
    }
}

/// The signature key and value Pulumi marks a secret with in state
/// (`sdk/go/common/resource/sig`).
const SIG_KEY: &str = "4dabf18193072939515e22adb298388d";
const SECRET_SIG: &str = "1b47061264138c4ac30d75fd1eb44270";

/// `value` with every secret of the checkpoint opened: the JSON `pulumi stack output --json
/// --show-secrets` prints. Any other special value (asset, archive, resource reference) is not
/// read here.
fn reveal(value: &Value, crypter: &Crypter) -> Result<Value, String> {
    match value {
        Value::Array(items) => items.iter().map(|v| reveal(v, crypter)).collect(),
        Value::Object(map) => match map.get(SIG_KEY) {
            None => map
                .iter()
                .map(|(k, v)| Ok((k.clone(), reveal(v, crypter)?)))
                .collect::<Result<serde_json::Map<_, _>, String>>()
                .map(Value::Object),
            Some(sig) if sig == SECRET_SIG => {
                let text = match (map.get("ciphertext"), map.get("plaintext")) {
                    (Some(Value::String(c)), _) => crypter.decrypt(c).map_err(|e| e.to_string())?,
                    (None, Some(Value::String(p))) => p.clone(),
                    _ => return Err("a secret without ciphertext".into()),
                };
                let inner: Value = serde_json::from_str(&text)
                    .map_err(|e| format!("a secret that is not JSON: {e}"))?;
                reveal(&inner, crypter)
            }
            Some(_) => Err("an output that is not plain data or a secret".into()),
        },
        other => Ok(other.clone()),
    }
}

/// The root stack's outputs in a file backend checkpoint (`{"version":3,"checkpoint":{"latest":
/// {"secrets_providers":{"type":"passphrase",...},"resources":[...]}}}`), secrets opened with
/// `passphrase`. `Err` says why the checkpoint is not one this operator reads (the caller then
/// asks the CLI).
pub fn checkpoint_outputs(checkpoint: &[u8], passphrase: &[u8]) -> Result<Value, String> {
    let value: Value =
        serde_json::from_slice(checkpoint).map_err(|e| format!("not plain JSON: {e}"))?;
    if value.get("version").and_then(Value::as_u64) != Some(3) {
        return Err("not a version 3 checkpoint".into());
    }
    let latest = value
        .get("checkpoint")
        .and_then(|c| c.get("latest"))
        .ok_or("no deployment")?;
    let root = latest
        .get("resources")
        .and_then(Value::as_array)
        .and_then(|r| {
            r.iter().find(|r| {
                r.get("type").and_then(Value::as_str) == Some("pulumi:pulumi:Stack")
                    && r.get("parent").is_none_or(Value::is_null)
            })
        })
        .ok_or("no root stack resource")?;
    let outputs = root
        .get("outputs")
        .cloned()
        .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
    let crypter = match latest.get("secrets_providers") {
        Some(p) if p.get("type").and_then(Value::as_str) == Some("passphrase") => {
            let state = p
                .get("state")
                .and_then(|s| s.get("salt"))
                .and_then(Value::as_str)
                .ok_or("a passphrase provider without salt")?;
            Some(Crypter::from_state(passphrase, state).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    match crypter {
        Some(crypter) => reveal(&outputs, &crypter),
        None if !outputs.to_string().contains(SIG_KEY) => Ok(outputs),
        None => Err("secrets of a provider other than the passphrase".into()),
    }
}

/// The backend URL of a backend folder.
pub fn backend_url(backend: &Path) -> String {
    format!("file://{}", backend.display())
}

impl Stack {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = process::command(&self.binary);
        cmd.current_dir(&self.project)
            .args(args)
            .args(["--non-interactive", "--color", "never"])
            .env("PULUMI_BACKEND_URL", backend_url(&self.backend))
            .env("PULUMI_CONFIG_PASSPHRASE_FILE", &self.passphrase_file)
            .env_remove("PULUMI_CONFIG_PASSPHRASE")
            .env("PULUMI_HOME", &self.home)
            // The program's home is the instance's own folder: no `~/.kube/config` of the
            // operator's user is found there.
            .env("HOME", &self.state)
            .env("PULUMI_SKIP_UPDATE_CHECK", "true")
            // `--event-log` exists only with debug commands on (as the Automation API runs it).
            .env("PULUMI_DEBUG_COMMANDS", "true")
            .env("PULUMI_SKIP_CONFIRMATIONS", "true")
            .env("PULUMI_DIY_BACKEND_NO_LEGACY_WARNING", "true")
            .env("NO_COLOR", "1");
        // The program's node is started by the language host, which passes its environment on.
        process::cap_node_heap(&mut cmd, self.heap_limit_mib);
        cmd
    }

    async fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Output, PulumiError> {
        process::run(self.command(args), stdin, &self.state)
            .await
            .map_err(|source| PulumiError::Spawn {
                binary: self.binary.clone(),
                source,
            })
    }

    fn failed(&self, action: &'static str, out: &Output, message: Option<String>) -> PulumiError {
        let said = [out.stdout.as_str(), out.stderr.as_str()]
            .into_iter()
            .chain(message.as_deref());
        if process::heap_exhausted(said) {
            return PulumiError::OutOfMemory {
                action,
                limit_mib: self.heap_limit_mib,
            };
        }
        PulumiError::Failed {
            action,
            exit: Exit::from_code(out.code),
            code: out.code.unwrap_or(-1),
            message: message.unwrap_or_else(|| out.last_error_line()),
        }
    }

    async fn ok(
        &self,
        action: &'static str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<Output, PulumiError> {
        let out = self.run(args, stdin).await?;
        if out.success() {
            Ok(out)
        } else {
            Err(self.failed(action, &out, None))
        }
    }

    /// Removes the backend's lock files. Only the leader runs Pulumi and it runs one operation
    /// per instance at a time, so a lock found before an operation was left by a process that
    /// is gone. Returns how many were removed.
    pub fn clear_locks(&self) -> Result<usize, PulumiError> {
        let locks = self.backend.join(".pulumi").join("locks");
        let mut removed = 0;
        let mut stack = vec![locks];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    std::fs::remove_file(&path).map_err(|source| PulumiError::Io {
                        what: "removing the stale lock",
                        path: path.clone(),
                        source,
                    })?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Keeps the newest `keep` update records of the stack in the backend's `history` and
    /// `backups` folders and removes the older ones (each with its `.attrs` twin). Pulumi adds
    /// a record to each on every update, failed ones included, and never removes any. Returns
    /// how many files were removed.
    pub fn prune_history(&self, keep: usize) -> Result<usize, PulumiError> {
        let pulumi = self.backend.join(".pulumi");
        let mut removed = 0;
        for kind in ["history", "backups"] {
            // <kind>/<project>/<stack>/ (older layouts: <kind>/<stack>/): every folder of files.
            let mut folders = vec![pulumi.join(kind)];
            while let Some(dir) = folders.pop() {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                let mut records: std::collections::BTreeMap<
                    String,
                    (std::time::SystemTime, Vec<PathBuf>),
                > = std::collections::BTreeMap::new();
                for entry in entries.flatten() {
                    let path = entry.path();
                    let Ok(meta) = entry.metadata() else { continue };
                    if meta.is_dir() {
                        folders.push(path);
                        continue;
                    }
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let record = record_key(&name).to_string();
                    let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    let slot = records
                        .entry(record)
                        .or_insert((std::time::UNIX_EPOCH, Vec::new()));
                    slot.0 = slot.0.max(modified);
                    slot.1.push(path);
                }
                let mut records: Vec<_> = records.into_iter().collect();
                // Newest first: by time, then by name (Pulumi's names carry the time).
                records.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| b.0.cmp(&a.0)));
                for (_, (_, files)) in records.into_iter().skip(keep) {
                    for file in files {
                        std::fs::remove_file(&file).map_err(|source| PulumiError::Io {
                            what: "pruning the stack history",
                            path: file.clone(),
                            source,
                        })?;
                        removed += 1;
                    }
                }
            }
        }
        Ok(removed)
    }

    /// Creates the stack in a backend that holds nothing yet by writing what the file backend
    /// reads as a new, empty stack: `.pulumi/meta.yaml` (`version: 1`, the project-scoped
    /// layout the CLI picks for an empty backend) and the checkpoint
    /// `{"version":3,"checkpoint":{"stack":"organization/<project>/dev","latest":null}}`
    /// (renamed into place last). Returns false, writing nothing, when the backend already has
    /// a `.pulumi` folder: what is there is left to the CLI ([`Self::select_or_create`]).
    pub fn create_in_empty_backend(&self) -> Result<bool, PulumiError> {
        let pulumi = self.backend.join(".pulumi");
        if pulumi.exists() {
            return Ok(false);
        }
        let checkpoint = self.checkpoint();
        let stacks = checkpoint.parent().unwrap_or(&pulumi).to_path_buf();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PulumiError::Io {
                what: "creating the stack in its backend",
                path,
                source,
            }
        };
        std::fs::create_dir_all(&stacks).map_err(io(&stacks))?;
        let meta = pulumi.join("meta.yaml");
        std::fs::write(&meta, "version: 1\n").map_err(io(&meta))?;
        let empty = serde_json::json!({
            "version": 3,
            "checkpoint": {"stack": format!("organization/{PROJECT}/{STACK}"), "latest": null},
        });
        let tmp = stacks.join(format!(".{STACK}.json.tmp"));
        std::fs::write(&tmp, format!("{empty}\n"))
            .and_then(|()| std::fs::rename(&tmp, &checkpoint))
            .map_err(io(&checkpoint))?;
        Ok(true)
    }

    /// Selects the stack, creating it on first use.
    pub async fn select_or_create(&self) -> Result<(), PulumiError> {
        std::fs::create_dir_all(&self.backend).map_err(|source| PulumiError::Io {
            what: "creating the backend folder",
            path: self.backend.clone(),
            source,
        })?;
        self.ok(
            "stack select",
            &["stack", "select", "--create", STACK],
            None,
        )
        .await
        .map(|_| ())
    }

    /// The stack's checkpoint file in the file backend (`.pulumi/stacks/<project>/dev.json`).
    pub fn checkpoint(&self) -> PathBuf {
        self.backend
            .join(".pulumi")
            .join("stacks")
            .join(PROJECT)
            .join(format!("{STACK}.json"))
    }

    /// The stack's config file (`Pulumi.dev.yaml` beside `Pulumi.yaml`).
    pub fn config_file(&self) -> PathBuf {
        self.project.join(format!("Pulumi.{STACK}.yaml"))
    }

    fn passphrase(&self) -> Result<Vec<u8>, PulumiError> {
        std::fs::read(&self.passphrase_file)
            .map(|raw| raw.trim_ascii().to_vec())
            .map_err(|source| PulumiError::Io {
                what: "reading the passphrase file",
                path: self.passphrase_file.clone(),
                source,
            })
    }

    /// Writes the stack's config file with exactly `values` (a key this operator no longer sets
    /// is gone, a secret included), in the CLI's own format: `encryptionsalt` (the one already
    /// there, checked against the passphrase; else a new one) and `config`, secrets as
    /// `secure: v1:...` sealed with the passphrase. Written to a temporary file and renamed, so
    /// never half written. Blocking: the first key of a salt takes a deliberately slow
    /// derivation.
    pub fn write_config(&self, values: &[(&str, ConfigValue)]) -> Result<(), PulumiError> {
        let passphrase = self.passphrase()?;
        let file = self.config_file();
        let existing = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| serde_saphyr::from_str::<Value>(&text).ok())
            .and_then(|v| Some(v.get("encryptionsalt")?.as_str()?.to_string()));
        let secrets = |source| PulumiError::Secrets {
            what: "sealing the stack's config",
            source,
        };
        let crypter = match existing {
            Some(state) => Crypter::from_state(&passphrase, &state),
            None => Crypter::new_state(&passphrase),
        }
        .map_err(secrets)?;
        let mut config = serde_json::Map::new();
        for (key, value) in values {
            let value = match value {
                ConfigValue::Plain(v) => Value::String(v.clone()),
                ConfigValue::List(v) => v.iter().cloned().map(Value::String).collect(),
                ConfigValue::Secret(v) => {
                    serde_json::json!({ "secure": crypter.encrypt(v).map_err(secrets)? })
                }
            };
            config.insert((*key).to_string(), value);
        }
        let document = serde_json::json!({
            "encryptionsalt": crypter.state(),
            "config": config,
        });
        let write_error = |source| PulumiError::Io {
            what: "writing the stack config",
            path: file.clone(),
            source,
        };
        let text = serde_saphyr::to_string(&document)
            .map_err(|e| write_error(std::io::Error::other(e.to_string())))?;
        let tmp = self.project.join(format!(".Pulumi.{STACK}.yaml.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(write_error)
    }

    /// Whether the file backend already holds the stack (its checkpoint file is there).
    pub fn exists(&self) -> bool {
        self.checkpoint().is_file()
    }

    /// Whether the stack's checkpoint file (`<backend>/.pulumi/stacks/<project>/dev.json`, the
    /// file backend's plain JSON) says there are no pending operations, so that `clear_pending`
    /// need not run `pulumi stack export`. Anything else (no such file, another layout, a
    /// compressed or unreadable file) is not an answer: the export runs.
    fn checkpoint_has_no_pending(&self) -> bool {
        let Ok(text) = std::fs::read(self.checkpoint()) else {
            return false;
        };
        no_pending_operations(&text)
    }

    /// Resolves pending operations a killed run left in the checkpoint: the stack is exported,
    /// its `pending_operations` dropped and the result imported (the next `up --refresh` reads
    /// the real state of anything they touched). Returns how many were dropped.
    pub async fn clear_pending(&self) -> Result<usize, PulumiError> {
        if self.checkpoint_has_no_pending() {
            return Ok(0);
        }
        let out = self
            .ok("stack export", &["stack", "export", "--stack", STACK], None)
            .await?;
        let mut state: Value =
            serde_json::from_str(&out.stdout).map_err(|e| PulumiError::Output {
                action: "stack export",
                detail: e.to_string(),
            })?;
        let pending = state
            .get("deployment")
            .and_then(|d| d.get("pending_operations"))
            .and_then(Value::as_array)
            .map(Vec::len)
            .unwrap_or(0);
        if pending == 0 {
            return Ok(0);
        }
        if let Some(d) = state.get_mut("deployment").and_then(Value::as_object_mut) {
            d.remove("pending_operations");
        }
        let file = self.state.join("stack-export.json");
        std::fs::write(&file, state.to_string()).map_err(|source| PulumiError::Io {
            what: "writing the stack export",
            path: file.clone(),
            source,
        })?;
        let file_arg = file.display().to_string();
        let result = self
            .ok(
                "stack import",
                &["stack", "import", "--file", &file_arg, "--stack", STACK],
                None,
            )
            .await;
        let _ = std::fs::remove_file(&file);
        result.map(|_| pending)
    }

    /// `pulumi up` with refresh (so objects deleted behind Pulumi's back are created again),
    /// reading the result from its event log.
    pub async fn up(&self) -> Result<UpResult, PulumiError> {
        let log = self.state.join("up-events.jsonl");
        let _ = std::fs::remove_file(&log);
        let log_arg = log.display().to_string();
        let out = self
            .run(
                &[
                    "up",
                    "--yes",
                    "--skip-preview",
                    "--refresh",
                    "--suppress-progress",
                    "--event-log",
                    &log_arg,
                    "--stack",
                    STACK,
                ],
                None,
            )
            .await?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let (summary, errors) = read_event_log(&text);
        if !out.success() {
            return Err(self.failed(
                "up",
                &out,
                (!errors.is_empty()).then(|| errors.join("; ").chars().take(600).collect()),
            ));
        }
        Ok(UpResult {
            counts: summary.unwrap_or_default(),
            elapsed: out.elapsed,
        })
    }

    /// A refreshing preview that expects no changes: the changes an `up` would make now (0: no
    /// drift). Drift is the CLI's own verdict, exit code 7 ([`Exit::UnexpectedChanges`]); the
    /// JSON report's `changeSummary` only details it.
    pub async fn preview(&self) -> Result<Counts, PulumiError> {
        let out = self
            .run(
                &[
                    "preview",
                    "--refresh",
                    "--expect-no-changes",
                    "--json",
                    "--stack",
                    STACK,
                ],
                None,
            )
            .await?;
        let report: Option<Value> = serde_json::from_str(&out.stdout).ok();
        let summary = || {
            Counts::from_changes(
                report
                    .as_ref()
                    .and_then(|r| r.get("changeSummary"))
                    .unwrap_or(&Value::Null),
            )
        };
        if Exit::from_code(out.code) == Exit::UnexpectedChanges {
            let mut counts = summary();
            if counts.changes() == 0 {
                // Changes the summary does not itemise (a refresh that found an object gone).
                counts.updated = 1;
            }
            return Ok(counts);
        }
        if !out.success() {
            let message = report.as_ref().and_then(|r| {
                let errors: Vec<String> = r
                    .get("diagnostics")?
                    .as_array()?
                    .iter()
                    .filter(|d| d.get("severity").and_then(Value::as_str) == Some("error"))
                    .filter_map(|d| d.get("message")?.as_str().map(|m| m.trim().to_string()))
                    .collect();
                (!errors.is_empty()).then(|| errors.join("; ").chars().take(600).collect())
            });
            return Err(self.failed("preview", &out, message));
        }
        // Exit 0 with --expect-no-changes: no drift, whatever the summary itemises.
        Ok(Counts {
            created: 0,
            updated: 0,
            deleted: 0,
            ..summary()
        })
    }

    /// The stack outputs, secrets shown (they go into Secrets, never into logs or status): read
    /// from the checkpoint the last `up` wrote, or, where that is not in a form this operator
    /// reads, from `pulumi stack output --json --show-secrets`.
    pub async fn outputs(&self) -> Result<Value, PulumiError> {
        let read = std::fs::read(self.checkpoint())
            .map_err(|e| e.to_string())
            .and_then(|text| {
                let passphrase = self.passphrase().map_err(|e| e.to_string())?;
                checkpoint_outputs(&text, &passphrase)
            });
        match read {
            Ok(outputs) => return Ok(outputs),
            Err(reason) => {
                tracing::debug!(project = %self.project.display(), %reason, "the checkpoint's outputs are not readable here; asking the CLI")
            }
        }
        let out = self
            .ok(
                "stack output",
                &[
                    "stack",
                    "output",
                    "--json",
                    "--show-secrets",
                    "--stack",
                    STACK,
                ],
                None,
            )
            .await?;
        serde_json::from_str(&out.stdout).map_err(|e| PulumiError::Output {
            action: "stack output",
            detail: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_counts_and_errors_from_an_event_log() {
        let log = r#"{"sequence":0,"timestamp":1,"cancelEvent":null,"stdoutEvent":{"message":"x"}}
{"sequence":1,"timestamp":1,"diagnosticEvent":{"urn":"u","message":"warned\n","severity":"warning"}}
{"sequence":2,"timestamp":1,"diagnosticEvent":{"urn":"u","message":"stand-in failure: boom\n","severity":"error"}}
not json
{"sequence":3,"timestamp":2,"summaryEvent":{"maybeCorrupt":false,"durationSeconds":3,"resourceChanges":{"create":4,"same":2,"update":1,"delete":1},"policyPacks":{}}}"#;
        let (summary, errors) = read_event_log(log);
        assert_eq!(
            summary,
            Some(Counts {
                created: 4,
                updated: 1,
                deleted: 1,
                unchanged: 2
            })
        );
        assert_eq!(errors, ["stand-in failure: boom"]);
        assert_eq!(read_event_log(""), (None, vec![]));
    }

    #[test]
    fn pruning_keeps_the_newest_records_of_each_stack() {
        let dir = std::env::temp_dir().join(format!("prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let history = dir.join(".pulumi/history/platform/dev");
        let backups = dir.join(".pulumi/backups/platform/dev");
        std::fs::create_dir_all(&history).expect("history");
        std::fs::create_dir_all(&backups).expect("backups");
        for t in 1..=5u64 {
            let stamp = 1_700_000_000_000_000_000 + t;
            for f in [
                history.join(format!("dev-{stamp}.history.json")),
                history.join(format!("dev-{stamp}.history.json.attrs")),
                history.join(format!("dev-{stamp}.checkpoint.json")),
                history.join(format!("dev-{stamp}.checkpoint.json.attrs")),
                backups.join(format!("dev.{stamp}.json")),
                backups.join(format!("dev.{stamp}.json.attrs")),
            ] {
                std::fs::write(&f, "{}").expect("file");
                let when = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + t);
                std::fs::File::options()
                    .write(true)
                    .open(&f)
                    .and_then(|h| h.set_modified(when))
                    .expect("mtime");
            }
        }
        let stack = Stack {
            binary: "pulumi".into(),
            home: dir.join("home"),
            passphrase_file: dir.join("p"),
            project: dir.clone(),
            backend: dir.clone(),
            state: dir.clone(),
            heap_limit_mib: 1024,
        };
        assert_eq!(stack.prune_history(2).expect("pruned"), 3 * 4 + 3 * 2);
        let mut left: Vec<String> = std::fs::read_dir(&history)
            .expect("dir")
            .chain(std::fs::read_dir(&backups).expect("dir"))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left.len(), 2 * 4 + 2 * 2, "{left:?}");
        assert!(
            left.iter()
                .all(|n| n.contains("0004") || n.contains("0005")),
            "{left:?}"
        );
        assert_eq!(stack.prune_history(2).expect("again"), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_program_at_its_heap_limit_is_told_apart() {
        let stack = Stack {
            binary: "pulumi".into(),
            home: "/h".into(),
            passphrase_file: "/p".into(),
            project: "/x".into(),
            backend: "/x".into(),
            state: "/x".into(),
            heap_limit_mib: 768,
        };
        let out = Output {
            code: Some(1),
            stdout: String::new(),
            stderr:
                "FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory"
                    .into(),
            elapsed: Duration::from_secs(3),
        };
        let error = stack.failed("up", &out, None);
        assert!(
            matches!(error, PulumiError::OutOfMemory { limit_mib: 768, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("--program-heap-limit"));
        let other = Output {
            stderr: "error: boom".into(),
            ..out
        };
        assert!(matches!(
            stack.failed("up", &other, None),
            PulumiError::Failed { .. }
        ));
        assert_eq!(
            process::env_of(&stack.command(&["up"]), "NODE_OPTIONS").as_deref(),
            Some("--max-old-space-size=768")
        );
    }

    #[test]
    fn exit_codes_have_their_documented_meaning() {
        assert_eq!(Exit::from_code(Some(1)), Exit::Error);
        assert_eq!(Exit::from_code(Some(6)), Exit::StackNotFound);
        assert_eq!(Exit::from_code(Some(7)), Exit::UnexpectedChanges);
        assert_eq!(Exit::from_code(Some(255)), Exit::Internal);
        assert_eq!(Exit::from_code(None), Exit::Killed);
        let e = PulumiError::Failed {
            action: "up",
            exit: Exit::from_code(Some(8)),
            code: 8,
            message: "x".into(),
        };
        assert_eq!(e.to_string(), "pulumi up failed (cancelled, exit 8): x");
    }

    #[test]
    fn a_checkpoint_without_pending_operations_needs_no_export() {
        assert!(no_pending_operations(
            br#"{"version":3,"checkpoint":{"stack":"dev","latest":{"manifest":{},"resources":[]}}}"#
        ));
        assert!(no_pending_operations(
            br#"{"version":3,"checkpoint":{"stack":"dev","latest":null}}"#
        ));
        assert!(no_pending_operations(
            br#"{"version":3,"checkpoint":{"stack":"dev","latest":{"pending_operations":[]}}}"#
        ));
        assert!(!no_pending_operations(
            br#"{"version":3,"checkpoint":{"latest":{"pending_operations":[{"type":"creating"}]}}}"#
        ));
        assert!(
            !no_pending_operations(br#"{"version":4,"checkpoint":{"latest":{}}}"#),
            "a format this operator does not know: export"
        );
        assert!(!no_pending_operations(b"\x1f\x8b compressed"));
        assert!(!no_pending_operations(
            br#"{"checkpoint":{"latest":{"pending_operations":{}}}}"#
        ));
    }

    fn scratch_stack(name: &str, passphrase: &str) -> (PathBuf, Stack) {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("passphrase"), format!("{passphrase}\n")).expect("passphrase");
        let stack = Stack {
            binary: "pulumi".into(),
            home: dir.join("home"),
            passphrase_file: dir.join("passphrase"),
            project: dir.clone(),
            backend: dir.join("state"),
            state: dir.clone(),
            heap_limit_mib: 1024,
        };
        (dir, stack)
    }

    #[test]
    fn the_config_file_holds_exactly_the_values_given_with_sealed_secrets() {
        let (dir, stack) = scratch_stack("write-config", "config-test-passphrase");
        let values = [
            (
                "platform:settings",
                ConfigValue::Plain(r#"{"tenants":[{"name":"a: b"}]}"#.into()),
            ),
            (
                "pulumi:disable-default-providers",
                ConfigValue::List(vec!["kubernetes".into(), "helm".into()]),
            ),
            (
                "platform:kubeconfig",
                ConfigValue::Secret("apiVersion: v1\nkind: Config\n".into()),
            ),
            (
                "platform:tenantAuthClientSecret",
                ConfigValue::Secret("s3cret".into()),
            ),
        ];
        stack.write_config(&values).expect("write");
        let text = std::fs::read_to_string(stack.config_file()).expect("read");
        assert!(
            !text.contains("s3cret") && !text.contains("kind: Config"),
            "{text}"
        );
        assert!(
            text.contains("- kubernetes"),
            "a YAML list, as the CLI writes it: {text}"
        );
        let doc: Value = serde_saphyr::from_str(&text).expect("YAML");
        let salt = doc["encryptionsalt"].as_str().expect("salt").to_string();
        let crypter = Crypter::from_state(b"config-test-passphrase", &salt).expect("salt opens");
        let config = &doc["config"];
        assert_eq!(
            config["platform:settings"],
            r#"{"tenants":[{"name":"a: b"}]}"#
        );
        assert_eq!(
            config["pulumi:disable-default-providers"],
            serde_json::json!(["kubernetes", "helm"])
        );
        let open = |key: &str| {
            crypter
                .decrypt(config[key]["secure"].as_str().expect("secure"))
                .expect("opens")
        };
        assert_eq!(
            open("platform:kubeconfig"),
            "apiVersion: v1\nkind: Config\n"
        );
        assert_eq!(open("platform:tenantAuthClientSecret"), "s3cret");
        // Again without the client secret: the salt stays, the dropped key is gone.
        stack.write_config(&values[..3]).expect("rewrite");
        let doc: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(stack.config_file()).expect("read"))
                .expect("YAML");
        assert_eq!(doc["encryptionsalt"], salt.as_str());
        assert!(
            doc["config"]
                .get("platform:tenantAuthClientSecret")
                .is_none()
        );
        // Another passphrase does not open the salt: nothing is written.
        std::fs::write(&stack.passphrase_file, "another").expect("passphrase");
        let before = std::fs::read(stack.config_file()).expect("read");
        let error = stack.write_config(&values).expect_err("wrong passphrase");
        assert!(
            matches!(
                error,
                PulumiError::Secrets {
                    source: CrypterError::IncorrectPassphrase { .. },
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(std::fs::read(stack.config_file()).expect("read"), before);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stack_is_created_only_in_an_empty_backend() {
        let (dir, stack) = scratch_stack("create-stack", "p");
        assert!(!stack.exists());
        assert!(stack.create_in_empty_backend().expect("create"));
        assert!(stack.exists());
        let checkpoint = std::fs::read(stack.checkpoint()).expect("checkpoint");
        assert!(no_pending_operations(&checkpoint));
        let value: Value = serde_json::from_slice(&checkpoint).expect("json");
        assert_eq!(value["checkpoint"]["stack"], "organization/di-platform/dev");
        assert_eq!(
            std::fs::read_to_string(stack.backend.join(".pulumi/meta.yaml")).expect("meta"),
            "version: 1\n"
        );
        assert!(
            !stack.create_in_empty_backend().expect("again"),
            "a backend with anything in it is left to the CLI"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn outputs_come_from_the_checkpoint_with_their_secrets_opened() {
        let crypter = Crypter::new_state(b"outputs-test").expect("crypter");
        let sealed = crypter
            .encrypt(r#"[{"tenant":"acme","user":"dev","role":"admin","kubeconfig":"kc"}]"#)
            .expect("seal");
        let checkpoint = serde_json::json!({
            "version": 3,
            "checkpoint": {
                "stack": "organization/di-platform/dev",
                "latest": {
                    "secrets_providers": {"type": "passphrase", "state": {"salt": crypter.state()}},
                    "resources": [
                        {"urn": "urn:pulumi:dev::di-platform::pulumi:providers:kubernetes::k", "type": "pulumi:providers:kubernetes", "outputs": {"x": 1}},
                        {"urn": "urn:pulumi:dev::di-platform::pulumi:pulumi:Stack::di-platform-dev", "type": "pulumi:pulumi:Stack",
                         "outputs": {
                            "httpEndpoint": "http://127.0.0.1:28080",
                            "kubeconfigs": {SIG_KEY: SECRET_SIG, "ciphertext": sealed},
                         }},
                    ],
                },
            },
        })
        .to_string();
        let outputs = checkpoint_outputs(checkpoint.as_bytes(), b"outputs-test").expect("read");
        assert_eq!(
            outputs,
            serde_json::json!({
                "httpEndpoint": "http://127.0.0.1:28080",
                "kubeconfigs": [{"tenant": "acme", "user": "dev", "role": "admin", "kubeconfig": "kc"}],
            })
        );
        assert!(checkpoint_outputs(checkpoint.as_bytes(), b"wrong").is_err());
        let asset = checkpoint.replace(SECRET_SIG, "c44067f5952c0a294b673a41bacd8c17");
        assert!(
            checkpoint_outputs(asset.as_bytes(), b"outputs-test").is_err(),
            "an asset is left to the CLI"
        );
        assert!(checkpoint_outputs(b"\x1f\x8b gzip", b"outputs-test").is_err());
        assert!(checkpoint_outputs(br#"{"version":4,"checkpoint":{}}"#, b"outputs-test").is_err());
        let empty = br#"{"version":3,"checkpoint":{"latest":{"resources":[{"type":"pulumi:pulumi:Stack"}]}}}"#;
        assert_eq!(
            checkpoint_outputs(empty, b"x").expect("no outputs"),
            serde_json::json!({})
        );
    }

    #[test]
    fn counts_changes_of_any_kind() {
        let c = Counts::from_changes(&serde_json::json!({"same": 5}));
        assert_eq!(c.changes(), 0);
        let c = Counts::from_changes(&serde_json::json!({"same": 4, "create": 1}));
        assert_eq!(c.changes(), 1);
        let c = Counts::from_changes(&serde_json::json!({"replace": 1, "delete": 2}));
        assert_eq!((c.created, c.deleted, c.changes()), (1, 2, 3));
    }
}
