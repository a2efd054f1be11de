//! The Pulumi part of one run (an install, a repair preview, an upgrade preview) in a project the
//! controller prepared: the stack, its config values and the instance's own key, nothing else.
//! It reads and writes no Kubernetes object and needs no credential but that key. It runs only in
//! install pods: `controller install --request <file>` runs one [`Request`] ([`run`]) and writes
//! its [`Outcome`] into the instance's project folder ([`OUTCOME`]), where the controller reads it.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::pulumi::{ConfigValue, Counts, PulumiError, Stack};
use crate::decide::model::{Failure, TaskError};

/// The file in the instance's project folder (`platform/`) that a `controller install` run writes
/// its outcome to.
pub const OUTCOME: &str = "run-outcome.json";

/// One run, as `controller install` reads it (`request.json`; the instance's key is the file
/// `passphrase` beside it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// Names this run: the outcome is believed only with the same id.
    pub install_id: String,
    /// The instance's UID: the outcome is believed only with the same UID.
    pub uid: String,
    /// The instance's namespace and name: its folder is `<--state-dir>/<namespace>/<name>`.
    pub namespace: String,
    /// See `namespace`.
    pub name: String,
    /// What to run.
    pub step: Step,
    /// `platform:settings`.
    pub settings: Value,
    /// The secret config values by key (`platform:kubeconfig`, `platform:tenantAuthClientSecret`).
    pub secrets: std::collections::BTreeMap<String, String>,
    /// The dependency tree a [`Step::Dependencies`] builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<Build>,
}

/// A dependency tree being built: npm installs the platform package at `version` into the folder
/// `folder` of the shared trees (`<--state-dir>/.cache/modules/`), which holds the tree's
/// `package.json` and `.npmrc`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Build {
    /// The folder's name.
    pub folder: String,
    /// The platform package's version.
    pub version: String,
}

/// What a `controller install` run found, for the run its ids name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The request's id.
    pub install_id: String,
    /// The request's instance UID.
    pub uid: String,
    /// What the run found, or why it failed and what it said.
    pub result: Result<Done, (Failure, String)>,
    /// As [`Ran::up`].
    pub up: Option<(f64, bool)>,
    /// As [`Ran::other_seconds`].
    pub other_seconds: f64,
}

impl Outcome {
    /// The outcome of `ran` for `request`.
    pub fn of(request: &Request, ran: Ran) -> Self {
        Self {
            install_id: request.install_id.clone(),
            uid: request.uid.clone(),
            result: ran
                .result
                .map_err(|e| (e.failure.unwrap_or(Failure::InstallFailed), e.message)),
            up: ran.up,
            other_seconds: ran.other_seconds,
        }
    }
}

/// What a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Step {
    /// Configure the stack and `pulumi up` (after dropping the pending creates an `interrupted`
    /// run left), then read the outputs.
    Install {
        /// The last run was stopped half-way.
        interrupted: bool,
    },
    /// A refreshing preview of the installed config (drift).
    Preview,
    /// Configure the upgrade's project (a copy of the installed stack config) and preview it.
    PreviewUpgrade,
    /// Re-encrypt the state under the instance's own key with the first of the previous keys
    /// (the Secret's `previous-<n>`) that opens it ([`super::state_key::settle`]); the Pulumi CLI
    /// only, no program.
    Rekey,
    /// Build a shared dependency tree ([`Request::build`]) with npm (the registry URL is the
    /// Secret's `registry`); npm only, no program, and install scripts only with
    /// `--npm-allow-scripts`.
    Dependencies,
}

/// What a run found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Done {
    /// The resources created, updated, deleted and unchanged (or a preview would change).
    pub counts: Counts,
    /// The stack outputs (installs only; `Null` for previews).
    pub outputs: Value,
    /// The resources a preview would change.
    pub resources: Vec<String>,
}

/// A run's result and how long its Pulumi commands took.
#[derive(Debug)]
pub struct Ran {
    /// What the run found.
    pub result: Result<Done, TaskError>,
    /// The time inside `pulumi up` and whether it succeeded (installs that got that far).
    pub up: Option<(f64, bool)>,
    /// The time of the run's other Pulumi commands.
    pub other_seconds: f64,
}

/// Runs `step` in `stack` with the config `values` (`absent`: keys to remove first); keeps the
/// newest `history_keep` update records.
pub async fn run(
    stack: &Stack,
    step: Step,
    values: &[(&str, ConfigValue)],
    absent: &[&str],
    history_keep: usize,
) -> Ran {
    let started = Instant::now();
    let mut up_ran = None;
    let result = async {
        let cleared = stack.clear_locks()?;
        if cleared > 0 {
            tracing::info!(project = %stack.project.display(), cleared, "cleared a stale state lock");
        }
        let interrupted = match step {
            Step::Preview | Step::PreviewUpgrade => {
                if step == Step::PreviewUpgrade {
                    stack.configure(values, absent).await?;
                }
                let (counts, resources) = stack.preview().await?;
                return Ok(Done {
                    counts,
                    resources,
                    ..Done::default()
                });
            }
            Step::Install { interrupted } => interrupted,
            Step::Rekey | Step::Dependencies => {
                let wrong = format!("{step:?} is no run of the program");
                return Err(PulumiError::Rekey(wrong));
            }
        };
        stack.select_or_create().await?;
        stack.configure(values, absent).await?;
        if interrupted {
            stack.clear_pending_creates().await?;
        }
        let up_started = Instant::now();
        let up = stack.up().await;
        up_ran = Some((up_started.elapsed().as_secs_f64(), up.is_ok()));
        // Every update, a failed one too, leaves a history record and a backup: keep a few.
        match stack.prune_history(history_keep) {
            Ok(0) => {}
            Ok(pruned) => {
                tracing::debug!(project = %stack.project.display(), pruned, "pruned the stack's history")
            }
            Err(e) => tracing::warn!(error = %e, "pruning the stack's history failed"),
        }
        let counts = up?;
        let outputs = stack.outputs().await?;
        Ok(Done {
            counts,
            outputs,
            resources: Vec::new(),
        })
    }
    .await;
    let up_seconds = up_ran.map_or(0.0, |(seconds, _)| seconds);
    Ran {
        result: result.map_err(|e: PulumiError| TaskError::from(e)),
        up: up_ran,
        other_seconds: (started.elapsed().as_secs_f64() - up_seconds).max(0.0),
    }
}
