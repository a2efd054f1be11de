//! Drives the Pulumi CLI for one instance's stack: create and configure it (secrets on standard
//! input, never in argv), clear what a killed run left, `up`, `preview` for drift, read outputs.
//! Results come from the CLI's structured output only (event log, `--json`) and exit codes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::Value;
use tokio::process::Command;

use super::config::Redacted;
use super::modules::{StateError, entries, io};
use super::process::{self, Output};
use crate::decide::model::{Failure, TaskError};

/// The one stack every instance project has; every command names it.
pub const STACK: &str = "dev";

/// What a non-zero exit code of the Pulumi CLI means (`sdk/go/common/util/cmdutil/exit.go`),
/// in words for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::FromRepr, strum::Display)]
#[repr(i32)]
pub enum Exit {
    #[strum(to_string = "error")]
    Error = 1,
    #[strum(to_string = "configuration error")]
    Configuration = 2,
    #[strum(to_string = "authentication error")]
    Authentication = 3,
    #[strum(to_string = "resource error")]
    Resource = 4,
    #[strum(to_string = "policy violation")]
    Policy = 5,
    #[strum(to_string = "stack not found")]
    StackNotFound = 6,
    #[strum(to_string = "unexpected changes")]
    UnexpectedChanges = 7,
    #[strum(to_string = "cancelled")]
    Cancelled = 8,
    #[strum(to_string = "timed out")]
    Timeout = 9,
    /// Any other code (Pulumi's own is 255).
    #[strum(to_string = "internal error")]
    Internal = 255,
    #[strum(to_string = "killed")]
    Killed = -1,
}

impl Exit {
    /// The meaning of exit code `code` (`None`: killed).
    pub fn from_code(code: Option<i32>) -> Self {
        code.map_or(Exit::Killed, |c| {
            Exit::from_repr(c).unwrap_or(Exit::Internal)
        })
    }
}

/// Errors of a Pulumi operation (`action`: the subcommand).
#[derive(Debug, thiserror::Error)]
pub enum PulumiError {
    #[error("running {binary} failed: {source}; install the Pulumi CLI or set --pulumi-binary")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    /// A Pulumi command exited non-zero (`code` -1: killed); `message` is from the event log
    /// when there is one.
    #[error("pulumi {action} failed ({exit}, exit {code}): {message}")]
    Failed {
        action: &'static str,
        exit: Exit,
        code: i32,
        message: String,
    },
    #[error("pulumi stack output printed output the operator cannot read: {0}")]
    Output(String),
    /// Re-encrypting the state under another key went wrong.
    #[error("{0}")]
    Rekey(String),
    #[error(
        "pulumi {action} failed: the platform program's node process reached its heap limit of {limit_mib} MiB (--program-heap-limit) and was stopped; the controller and other instances are unaffected. Fix the program or its input, or raise the limit with the container's memory"
    )]
    OutOfMemory {
        action: &'static str,
        limit_mib: u32,
    },
    #[error(
        "pulumi {action} refused the passphrase in {path}: it is not the one this instance's Pulumi state was encrypted with; put the original passphrase back into the Secret platform-operator-passphrase (or the Secret passphrase.existingSecret names) and restart the operator; the state is left untouched"
    )]
    IncorrectPassphrase { action: &'static str, path: PathBuf },
    #[error(transparent)]
    Io(#[from] StateError),
}

impl From<PulumiError> for TaskError {
    fn from(e: PulumiError) -> Self {
        let failure = match e {
            PulumiError::Spawn { .. } => Failure::ToolMissing,
            PulumiError::Io(_) | PulumiError::Rekey(_) => Failure::StateUnavailable,
            PulumiError::OutOfMemory { .. } => Failure::ProgramOutOfMemory,
            PulumiError::IncorrectPassphrase { .. } => Failure::PassphraseMismatch,
            PulumiError::Failed { .. } | PulumiError::Output(_) => Failure::InstallFailed,
        };
        TaskError::new(failure, e.to_string())
    }
}

/// Resource counts of an update, from the event log's summary event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Created (and replaced-by-create).
    pub created: i64,
    pub updated: i64,
    pub deleted: i64,
    pub unchanged: i64,
}

impl Counts {
    /// Counts from a `resourceChanges` / `changeSummary` map.
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

/// The trimmed message of diagnostic `d` when its severity is error.
fn error_message(d: &Value) -> Option<&str> {
    Some(d["message"].as_str()?.trim()).filter(|_| d["severity"] == "error")
}

/// The error messages joined into one, shortened for a status message (`None`: no error).
fn joined(errors: &[String]) -> Option<String> {
    (!errors.is_empty()).then(|| errors.join("; ").chars().take(600).collect())
}

/// Reads an event log (JSON engine events, one a line): the summary's counts and the errors.
pub fn read_event_log(text: &str) -> (Option<Counts>, Vec<String>) {
    let mut summary = None;
    let mut errors = Vec::new();
    for event in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if let Some(changes) = event.pointer("/summaryEvent/resourceChanges") {
            summary = Some(Counts::from_changes(changes));
        }
        if let Some(message) = event.get("diagnosticEvent").and_then(error_message)
            && !message.is_empty()
        {
            errors.push(message.to_string());
        }
    }
    (summary, errors)
}

/// One instance's stack.
#[derive(Clone, Debug)]
pub struct Stack {
    pub binary: String,
    /// `PULUMI_HOME`: plugins live here, shared by every instance.
    pub home: PathBuf,
    pub passphrase_file: PathBuf,
    pub project: PathBuf,
    /// The local file backend's folder.
    pub backend: PathBuf,
    /// The instance's state folder (pid file, event logs).
    pub state: PathBuf,
    /// The program's node heap limit, in MiB.
    pub heap_limit_mib: u32,
}

/// The update record a history or backup file belongs to: its name without its suffixes.
fn record_key(name: &str) -> &str {
    let name = name.strip_suffix(".attrs").unwrap_or(name);
    [".history.json", ".checkpoint.json", ".json"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// The project name the generated `Pulumi.yaml` declares.
pub const PROJECT: &str = "di-platform";

/// One value of the stack's config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigValue {
    Plain(String),
    /// Written as `config set --path key[i]`.
    List(Vec<String>),
    /// Written with `pulumi config set --secret`, the value on standard input.
    Secret(Redacted),
}

/// The backend URL of a backend folder. `metadata=skip`: no `<file>.attrs` sidecars, which the
/// file backend writes in place, so a run killed while writing one broke every later run.
pub fn backend_url(backend: &Path) -> String {
    format!("file://{}?metadata=skip", backend.display())
}

impl Stack {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = process::command(&self.binary);
        cmd.current_dir(&self.project)
            .args(args)
            .args(["--stack", STACK, "--non-interactive", "--color", "never"])
            .env("PULUMI_BACKEND_URL", backend_url(&self.backend))
            .env("PULUMI_CONFIG_PASSPHRASE_FILE", &self.passphrase_file)
            .env_remove("PULUMI_CONFIG_PASSPHRASE")
            .env("PULUMI_HOME", &self.home)
            // The instance's own home: no `~/.kube/config` of the operator's user is found.
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
        if process::heap_exhausted(said.clone()) {
            return PulumiError::OutOfMemory {
                action,
                limit_mib: self.heap_limit_mib,
            };
        }
        if said.into_iter().any(|t| t.contains("incorrect passphrase")) {
            return PulumiError::IncorrectPassphrase {
                action,
                path: self.passphrase_file.clone(),
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

    /// Removes the backend's lock files and returns how many. Called only under `install.lock`,
    /// which every run of Pulumi in that state holds, so their processes are gone.
    pub fn clear_locks(&self) -> Result<usize, PulumiError> {
        let mut removed = 0;
        let mut stack = vec![self.backend.join(".pulumi").join("locks")];
        while let Some(dir) = stack.pop() {
            for path in entries(&dir).map(|e| e.path()) {
                if path.is_dir() {
                    stack.push(path);
                } else {
                    std::fs::remove_file(&path).map_err(io("removing the stale lock", &path))?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Keeps the newest `keep` update records in the backend's `history` and `backups` folders
    /// (Pulumi adds one to each per update and never removes any); returns the files removed.
    pub fn prune_history(&self, keep: usize) -> Result<usize, PulumiError> {
        let pulumi = self.backend.join(".pulumi");
        let mut removed = 0;
        // <kind>/<project>/<stack>/ (older layouts: <kind>/<stack>/): every folder of files.
        let mut folders = vec![pulumi.join("history"), pulumi.join("backups")];
        while let Some(dir) = folders.pop() {
            let mut records: BTreeMap<String, (Option<SystemTime>, Vec<PathBuf>)> = BTreeMap::new();
            for entry in entries(&dir) {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    folders.push(entry.path());
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                let slot = records.entry(record_key(&name).to_string()).or_default();
                slot.0 = slot.0.max(meta.modified().ok());
                slot.1.push(entry.path());
            }
            let mut records: Vec<_> = records.into_iter().collect();
            // Newest first: by time, then by name (Pulumi's names carry the time).
            records.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| b.0.cmp(&a.0)));
            for file in records.into_iter().skip(keep).flat_map(|(_, (_, f))| f) {
                std::fs::remove_file(&file).map_err(io("pruning the stack history", &file))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Selects the stack, creating it on first use.
    pub async fn select_or_create(&self) -> Result<(), PulumiError> {
        std::fs::create_dir_all(&self.backend)
            .map_err(io("creating the backend folder", &self.backend))?;
        let args = ["stack", "select", "--create"];
        self.ok("stack select", &args, None).await.map(|_| ())
    }

    /// Sets the stack's config to exactly `values` (`absent` and every list removed first). The
    /// secrets go first: Pulumi checks the passphrase against the stack's salt before it
    /// encrypts, so a wrong passphrase fails with nothing written.
    pub async fn configure(
        &self,
        values: &[(&str, ConfigValue)],
        absent: &[&str],
    ) -> Result<(), PulumiError> {
        let mut remove = vec!["config", "rm-all", "--path"];
        remove.extend(absent);
        let mut pairs = Vec::new();
        for (key, value) in values {
            match value {
                ConfigValue::Secret(secret) => {
                    let args = ["config", "set", "--secret", "--raw", key];
                    self.ok("config set", &args, Some(secret.0.as_bytes()))
                        .await?;
                }
                ConfigValue::Plain(v) => pairs.push(format!("{key}={v}")),
                ConfigValue::List(items) => {
                    remove.push(key);
                    pairs.extend(
                        items
                            .iter()
                            .enumerate()
                            .map(|(i, v)| format!("{key}[{i}]={v}")),
                    );
                }
            }
        }
        self.ok("config rm-all", &remove, None).await?;
        let mut set = vec!["config", "set-all", "--path"];
        for pair in &pairs {
            set.extend(["--plaintext", pair.as_str()]);
        }
        self.ok("config set-all", &set, None).await.map(|_| ())
    }

    /// Drops the pending creates a killed run left (an `up` drops other pending operations).
    pub async fn clear_pending_creates(&self) -> Result<(), PulumiError> {
        let args = [
            "refresh",
            "--yes",
            "--skip-preview",
            "--clear-pending-creates",
            "--suppress-progress",
        ];
        self.ok("refresh", &args, None).await.map(|_| ())
    }

    /// `pulumi up` with refresh (objects deleted behind Pulumi's back are created again).
    pub async fn up(&self) -> Result<Counts, PulumiError> {
        let log = self.state.join("up-events.jsonl");
        let _ = std::fs::remove_file(&log);
        let log_arg = log.display().to_string();
        let args = [
            "up",
            "--yes",
            "--skip-preview",
            "--refresh",
            "--suppress-progress",
            "--event-log",
            &log_arg,
        ];
        let out = self.run(&args, None).await?;
        let (summary, errors) = read_event_log(&std::fs::read_to_string(&log).unwrap_or_default());
        if !out.success() {
            return Err(self.failed("up", &out, joined(&errors)));
        }
        Ok(summary.unwrap_or_default())
    }

    /// The changes an `up` would make now, from a refreshing preview, with the changing
    /// resources ([`changed_resources`]). Drift is the CLI's verdict (exit 7,
    /// [`Exit::UnexpectedChanges`]); the report's `changeSummary` only details it.
    pub async fn preview(&self) -> Result<(Counts, Vec<String>), PulumiError> {
        let args = ["preview", "--refresh", "--expect-no-changes", "--json"];
        let out = self.run(&args, None).await?;
        let report: Value = serde_json::from_str(&out.stdout).unwrap_or_default();
        let summary = Counts::from_changes(&report["changeSummary"]);
        if Exit::from_code(out.code) == Exit::UnexpectedChanges {
            // Changes the summary does not itemise (a refresh that found an object gone).
            let updated = if summary.changes() == 0 {
                1
            } else {
                summary.updated
            };
            return Ok((Counts { updated, ..summary }, changed_resources(&report)));
        }
        if !out.success() {
            let diagnostics = report["diagnostics"].as_array().into_iter().flatten();
            let errors: Vec<_> = diagnostics
                .filter_map(error_message)
                .map(String::from)
                .collect();
            return Err(self.failed("preview", &out, joined(&errors)));
        }
        // Exit 0 with --expect-no-changes: no drift, whatever the summary itemises.
        let counts = Counts {
            created: 0,
            updated: 0,
            deleted: 0,
            ..summary
        };
        Ok((counts, Vec::new()))
    }

    /// Whether this stack's passphrase opens its state: Pulumi checks it against the stack's salt
    /// before it sets a secret, here in a copy of the stack config (the state is not written).
    pub async fn opens(&self) -> Result<bool, PulumiError> {
        let config = self.project.join(format!("Pulumi.{STACK}.yaml"));
        let probe = self.state.join("passphrase-probe.yaml");
        std::fs::copy(&config, &probe).map_err(io("copying the stack config to", &probe))?;
        let probe_arg = probe.display().to_string();
        let args = [
            "config",
            "set",
            "--secret",
            "--raw",
            "--config-file",
            &probe_arg,
        ];
        let args = [&args[..], &["platform-operator:probe"]].concat();
        let out = self.run(&args, Some(b"probe")).await;
        let _ = std::fs::remove_file(&probe);
        let out = out?;
        match self.failed("config set", &out, None) {
            _ if out.success() => Ok(true),
            PulumiError::IncorrectPassphrase { .. } => Ok(false),
            e => Err(e),
        }
    }

    /// Re-encrypts the stack's config and checkpoint under `passphrase` (the stack's own
    /// passphrase opens them): `pulumi stack change-secrets-provider`, which reads the new one
    /// from standard input and runs no program.
    pub async fn rotate(&self, passphrase: &str) -> Result<(), PulumiError> {
        // Empty input would set an empty passphrase without a word.
        if passphrase.trim().is_empty() {
            return Err(PulumiError::Rekey("refusing an empty passphrase".into()));
        }
        let args = ["stack", "change-secrets-provider", "passphrase"];
        let input = format!("{passphrase}\n");
        let action = "stack change-secrets-provider";
        self.ok(action, &args, Some(input.as_bytes()))
            .await
            .map(|_| ())
    }

    /// Decrypts every secret of the checkpoint (`pulumi stack export --show-secrets`, its output
    /// dropped): whether this stack's passphrase opens all of the state.
    pub async fn export(&self) -> Result<(), PulumiError> {
        let args = ["stack", "export", "--show-secrets"];
        self.ok("stack export", &args, None).await.map(|_| ())
    }

    /// The stack outputs, secrets shown (they go into Secrets, never into logs or status).
    pub async fn outputs(&self) -> Result<Value, PulumiError> {
        let args = ["stack", "output", "--json", "--show-secrets"];
        let out = self.ok("stack output", &args, None).await?;
        serde_json::from_str(&out.stdout).map_err(|e| PulumiError::Output(e.to_string()))
    }
}

/// The resources a preview report (`--json`) would change, as `<op> <type> <name>` from each
/// step's URN (`urn:pulumi:<stack>::<project>::<type>::<name>`), steps that change nothing left
/// out.
pub fn changed_resources(report: &Value) -> Vec<String> {
    let steps = report["steps"].as_array().into_iter().flatten();
    let unchanged = ["same", "read", "refresh"];
    steps
        .filter_map(|step| {
            let op = step["op"].as_str()?;
            let urn = step["urn"].as_str()?;
            let mut parts = urn.rsplitn(2, "::");
            let name = parts.next()?;
            let kind = parts.next()?.rsplit("::").next()?.rsplit('$').next()?;
            (!unchanged.contains(&op)).then(|| format!("{op} {kind} {name}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names_the_resources_a_preview_would_change() {
        let report = serde_json::json!({"steps": [
            {"op": "same", "urn": "urn:pulumi:dev::platform::pulumi:providers:kubernetes::k8s"},
            {"op": "create", "urn": "urn:pulumi:dev::platform::di:Platform$kubernetes:core/v1:ConfigMap::platform-settings"},
            {"op": "update", "urn": "urn:pulumi:dev::platform::kubernetes:core/v1:Namespace::di-platform"},
            {"op": "delete"},
        ]});
        assert_eq!(
            changed_resources(&report),
            [
                "create kubernetes:core/v1:ConfigMap platform-settings",
                "update kubernetes:core/v1:Namespace di-platform"
            ]
        );
        assert!(changed_resources(&serde_json::json!({})).is_empty());
    }

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
        let refused = Output {
            stderr: "error: incorrect passphrase".into(),
            ..other
        };
        let error = stack.failed("config set", &refused, None);
        assert!(
            matches!(error, PulumiError::IncorrectPassphrase { .. }),
            "{error}"
        );
        assert!(
            error.to_string().contains("passphrase.existingSecret"),
            "{error}"
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
    fn counts_changes_of_any_kind() {
        let c = Counts::from_changes(&serde_json::json!({"same": 5}));
        assert_eq!(c.changes(), 0);
        let c = Counts::from_changes(&serde_json::json!({"same": 4, "create": 1}));
        assert_eq!(c.changes(), 1);
        let c = Counts::from_changes(&serde_json::json!({"replace": 1, "delete": 2}));
        assert_eq!((c.created, c.deleted, c.changes()), (1, 2, 3));
    }
}
