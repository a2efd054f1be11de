//! The installer: runs the platform's existing-cluster program (`@di-framework/platform/existing`)
//! at an instance's exact version with the Pulumi CLI, against the instance's vCluster, in install
//! pods ([`launch`]): the controller prepares each run and reads its outcome. Each
//! instance's folder `<--state-dir>/<namespace>/<name>/` holds its project (`platform/`), its
//! stack `dev` on a file backend (`platform/state/`) and its install record; npm's cache, Pulumi's
//! plugins and the dependency trees are shared under `<--state-dir>/.cache/`. Installs and
//! previews are tracked tasks bounded by `--install-timeout`; their tools die with them.

pub(crate) mod config;
pub mod launch;
pub(crate) mod modules;
pub(crate) mod npm;
pub(crate) mod process;
pub(crate) mod pulumi;
pub(crate) mod record;
pub mod run;
pub mod state_key;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::crd::{
    Endpoints, InstallResult, InstallSummary, LastInstall, PendingUpgrade, STATE_BACKUP_LIMIT,
    StateBackup,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::Resource;
use kube::api::{Api, DeleteParams, ObjectMeta};
use serde_json::{Value, json};

use crate::api::{apply, delete_if};
use crate::decide::model::PREVIEW_NAMES;
use crate::decide::model::{Mode, TaskError};
use common::names::membership_kubeconfig_secret as membership_secret_name;
use common::names::{INSTANCE_UID_LABEL, KUBECONFIG_KEY, MANAGED_BY, MANAGED_BY_LABEL};
use config::ProgramConfig;
use modules::io;
use pulumi::ConfigValue;
use record::{Failure, Preview, Record};

/// The npm package of the platform.
pub(crate) const PACKAGE: &str = "@di-framework/platform";
/// The Pulumi Node.js SDK, required by the program and loaded by the language host.
pub(crate) const SDK_PACKAGE: &str = "@pulumi/pulumi";
/// The default `--pulumi-sdk-version`.
pub const DEFAULT_SDK_VERSION: &str = "3.248.0";
/// Packages whose default providers every stack disables, so a resource without an explicit
/// provider fails instead of picking up ambient credentials. Not `*`: that also disables
/// `pulumi-nodejs`, the provider of dynamic resources.
const DISABLED_DEFAULT_PROVIDERS: [&str; 11] = [
    "kubernetes",
    "kubernetes-cert-manager",
    "kubernetes-coredns",
    "kubernetes-ingress-nginx",
    "helm",
    "docker",
    "aws",
    "aws-native",
    "azure-native",
    "gcp",
    "google-native",
];
/// Label on the per-membership kubeconfig Secrets naming their instance.
const MEMBERSHIP_LABEL: &str = "platform.di-framework.dev/membership-of";

/// How the installer is configured: its flags, and the histogram of its tools' time.
#[derive(Clone, Debug, clap::Args)]
pub struct Installer {
    /// How long one install may run before it is stopped.
    #[arg(long, default_value = "30m", value_parser = common::duration::parse)]
    pub install_timeout: Duration,

    /// Root of the operator's state volume: one directory per instance.
    #[arg(long, default_value = "/var/lib/platform-operator/state")]
    pub state_dir: PathBuf,

    /// File holding the passphrase that encrypts the Pulumi state (the passphrase Secret's key
    /// `passphrase`, mounted).
    #[arg(long, default_value = "/etc/platform-operator/passphrase/passphrase")]
    pub passphrase_file: PathBuf,

    /// The npm registry the platform package is installed from (a mirror for air-gapped sites).
    #[arg(
        long,
        env = "NPM_REGISTRY",
        default_value = "https://registry.npmjs.org/"
    )]
    pub npm_registry: String,

    /// A file holding the npm registry URL (a mounted Secret), for a URL that carries
    /// credentials: it overrides --npm-registry and is read before each install.
    #[arg(long)]
    pub npm_registry_file: Option<PathBuf>,

    /// Let npm run the install scripts of the platform package and its dependencies (they run
    /// with the operator's state volume); by default npm runs with --ignore-scripts.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub npm_allow_scripts: bool,

    /// The @pulumi/pulumi version each instance's project declares (the program requires it and
    /// the Pulumi language host loads it); it must be the one the platform package uses.
    #[arg(long, default_value = DEFAULT_SDK_VERSION)]
    pub pulumi_sdk_version: String,

    /// The npm executable.
    #[arg(long, default_value = "npm")]
    pub npm_binary: String,

    /// The node heap limit, in MiB, of each Pulumi run of the platform program (its
    /// `NODE_OPTIONS=--max-old-space-size`): keep it well below the container's memory limit, so
    /// that a runaway program fails alone (`ProgramOutOfMemory`) instead of the whole container.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(64..))]
    pub program_heap_limit: u32,

    /// The node heap limit, in MiB, of each npm install of the platform package (npm's
    /// `NODE_OPTIONS=--max-old-space-size`): keep it well below the container's memory limit, so
    /// that a runaway npm fails alone (`PackageInstallOutOfMemory`) instead of the whole container.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(64..))]
    pub npm_heap_limit: u32,

    /// How many update records Pulumi's history and backups keep per stack; older ones are
    /// removed after each update.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub pulumi_history_keep: u16,

    /// How full, in percent, the state volume may be for an install to start; above it installs
    /// wait with `StateVolumeFull` (retrying with backoff) instead of failing halfway.
    #[arg(long, default_value_t = 95, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub state_volume_full_percent: u8,

    /// The Pulumi CLI executable (its language host `pulumi-language-nodejs` on PATH beside it).
    #[arg(long, default_value = "pulumi")]
    pub pulumi_binary: String,

    /// Run the platform program in a pod of its own for each install, repair preview and
    /// upgrade preview, from this image (the operator image, by digest; docs/controller.md#install-pods).
    /// Required with --install-platform=true: the program never runs in the controller's process.
    #[arg(long)]
    pub install_image: Option<String>,

    /// The install pods' ServiceAccount (it needs no permissions; its token is never mounted).
    #[arg(long, default_value = "platform-operator-install")]
    pub install_service_account: String,

    /// The claim of the state volume, which install pods mount (the chart sets it); unset, they
    /// mount --state-dir from the node (--install-node), for a controller run on the node.
    #[arg(long)]
    pub install_state_claim: Option<String>,

    /// The node install pods run on: the controller's own (the chart sets it from the pod's
    /// `spec.nodeName`), so that they share its state volume.
    #[arg(long, env = "NODE_NAME")]
    pub install_node: Option<String>,

    /// The install pods' resources (JSON, as a container's `resources`; a memory limit is
    /// required).
    #[arg(long, default_value = launch::DEFAULT_RESOURCES, value_parser = launch::parse_resources)]
    pub install_pod_resources: k8s_openapi::api::core::v1::ResourceRequirements,

    /// Starts the install pods (set from --install-image once the client exists).
    #[arg(skip)]
    pub launcher: Option<launch::Launcher>,

    /// Time spent inside npm and pulumi, by tool and result (the registered metric).
    #[arg(skip)]
    pub tool_seconds: Option<prometheus::HistogramVec>,
}

/// The failure an npm error is.
fn npm_failure(e: npm::NpmError) -> TaskError {
    let failure = match e {
        npm::NpmError::VersionNotFound { .. } => Failure::VersionNotFound,
        npm::NpmError::Unreachable { .. } => Failure::RegistryUnreachable,
        npm::NpmError::Spawn { .. } => Failure::ToolMissing,
        npm::NpmError::OutOfMemory { .. } => Failure::PackageInstallOutOfMemory,
        npm::NpmError::Failed { .. } | npm::NpmError::Contract(_) => Failure::PackageInstallFailed,
    };
    TaskError::new(failure, e.to_string())
}

/// The instance a run is for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub version: &'a str,
}

fn volume_full(used: u64, capacity: u64, percent: u8) -> bool {
    capacity > 0 && u128::from(used) * 100 >= u128::from(capacity) * u128::from(percent)
}

/// One install to run; `owner` (the instance) owns the Secrets it writes.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub namespace: String,
    pub name: String,
    /// The instance's UID: its state's key is derived from it ([`state_key`]).
    pub uid: String,
    pub version: String,
    pub mode: Mode,
    pub config: ProgramConfig,
    pub owner: Option<OwnerReference>,
}

/// An unreadable record as the task's error: the state volume needs a person.
fn unreadable(e: record::Unreadable) -> TaskError {
    TaskError::new(Failure::StateUnavailable, e.to_string())
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl Job {
    fn target(&self) -> Target<'_> {
        Target {
            namespace: &self.namespace,
            name: &self.name,
            uid: &self.uid,
            version: &self.version,
        }
    }
}

/// The lock file (`flock`) in an instance's state directory that a run of Pulumi holds.
pub const STATE_LOCK: &str = "install.lock";

/// Holds the instance's [`STATE_LOCK`] for a whole install or preview, so Pulumi's own lock
/// files are cleared only when no other process (a replica that lost the lease but still runs)
/// can be running Pulumi in that state. Released when dropped or when the process dies.
fn hold_state(dir: &Path) -> Result<std::fs::File, TaskError> {
    let path = dir.join(STATE_LOCK);
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io("opening", &path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(TaskError::new(
            Failure::StateUnavailable,
            format!(
                "{} is held by another run of Pulumi in this instance's state (a replica that lost the leader lease and has not stopped yet); it retries with backoff",
                path.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(io("locking", &path)(e).into()),
    }
}

impl Installer {
    /// The registry URL: `--npm-registry-file`'s content when set, else `--npm-registry`.
    fn registry(&self) -> Result<String, String> {
        let Some(file) = &self.npm_registry_file else {
            return Ok(self.npm_registry.clone());
        };
        let text = std::fs::read_to_string(file).map_err(|e| {
            format!(
                "reading the npm registry URL from {} failed: {e}; check the Secret the chart's npmRegistrySecret names",
                file.display()
            )
        })?;
        let url = text.trim();
        if url.is_empty() {
            return Err(format!(
                "{} holds no npm registry URL; put the URL in the Secret the chart's npmRegistrySecret names",
                file.display()
            ));
        }
        Ok(url.to_string())
    }

    fn instance_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.state_dir.join(namespace).join(name)
    }

    /// The record of instance `namespace/name`.
    pub(crate) fn record(&self, namespace: &str, name: &str) -> Result<Record, record::Unreadable> {
        record::load(&self.instance_dir(namespace, name))
    }

    /// Refuses an install on a volume at or above `--state-volume-full-percent`, which would
    /// fail it with the Pulumi state half written; an unmeasurable volume is left to the writes.
    fn check_state_volume(&self) -> Result<(), TaskError> {
        let percent = self.state_volume_full_percent;
        match crate::metrics::volume_usage(&self.state_dir) {
            Ok((used, capacity)) if volume_full(used, capacity, percent) => Err(TaskError::new(
                Failure::StateVolumeFull,
                format!(
                    "the state volume ({}) is {}% full ({} of {} MiB), at or above --state-volume-full-percent ({percent}%); the install waits and retries with backoff: free space on it or grow the claim (docs/operations.md#the-state-volume)",
                    self.state_dir.display(),
                    u128::from(used) * 100 / u128::from(capacity),
                    used >> 20,
                    capacity >> 20,
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Whether the passphrase file is readable and not empty; whether it is the right one is
    /// Pulumi's to say ([`pulumi::Stack::configure`]).
    fn passphrase_readable(&self) -> Result<(), TaskError> {
        let file = &self.passphrase_file;
        let message = match std::fs::read(file) {
            Ok(raw) if !raw.trim_ascii().is_empty() => return Ok(()),
            Ok(_) => format!(
                "the passphrase file {} is empty; the passphrase Secret needs a non-empty key passphrase",
                file.display()
            ),
            Err(e) => format!(
                "the passphrase file {} cannot be read ({e}); mount the passphrase Secret (key passphrase) there or set --passphrase-file",
                file.display()
            ),
        };
        Err(TaskError::new(Failure::PassphraseUnavailable, message))
    }

    fn stack(&self, dir: &Path) -> pulumi::Stack {
        let project = dir.join("platform");
        pulumi::Stack {
            binary: self.pulumi_binary.clone(),
            home: self.state_dir.join(".cache").join("pulumi"),
            passphrase_file: self.passphrase_file.clone(),
            backend: project.join("state"),
            project,
            state: dir.to_path_buf(),
            heap_limit_mib: self.program_heap_limit,
        }
    }

    /// The stack of the instance `uid` in `dir` under the instance's own key, its state
    /// re-encrypted first when another key opens it ([`state_key::instance_key`]); `rec` (the
    /// record as loaded) notes whose key it is. The key file lives as long as the returned one.
    ///
    /// With install pods the controller runs no Pulumi command: the install pod checks that its
    /// key opens the state, and a rekey pod re-encrypts it when the record names another UID's
    /// key or the install pod found it under another ([`Self::run_in_pod`]).
    async fn keyed_stack(
        &self,
        dir: &Path,
        target: Target<'_>,
        rec: &mut Record,
    ) -> Result<(pulumi::Stack, state_key::KeyFile), TaskError> {
        let (stack, uid) = (self.stack(dir), target.uid);
        let recorded = rec.state_key_uid.as_deref();
        let launcher = self.pods()?;
        // What a re-encryption the controller ran itself, before install pods, left.
        state_key::put_back_interrupted(&stack, dir)?;
        let file = &stack.passphrase_file;
        let operator = std::fs::read(file).map_err(io("reading the passphrase file", file))?;
        let own = state_key::derive(&operator, uid);
        if recorded.is_some_and(|r| r != uid) {
            let previous = state_key::previous(&operator, uid, recorded);
            (self.rekey_in_pod(launcher, own.as_bytes(), previous, target)).await?;
        }
        let key = state_key::KeyFile::new(own)?;
        if rec.state_key_uid.as_deref() != Some(uid) {
            rec.state_key_uid = Some(uid.to_string());
            record::store(dir, rec).map_err(io("writing the install record in", dir))?;
        }
        let passphrase_file = key.path.clone();
        Ok((
            pulumi::Stack {
                passphrase_file,
                ..stack
            },
            key,
        ))
    }

    fn observe_tool(&self, tool: &str, ok: bool, seconds: f64) {
        if let Some(h) = &self.tool_seconds {
            h.with_label_values(&[tool, if ok { "ok" } else { "error" }])
                .observe(seconds);
        }
    }

    /// Runs an install to its end (or its timeout) and records it; the error's reason is also
    /// the record's, which outlives the task across a restart.
    pub(crate) async fn install(&self, client: kube::Client, job: Job) -> Result<(), TaskError> {
        let dir = self.instance_dir(&job.namespace, &job.name);
        let _held = hold_state(&dir)?;
        let mut rec = record::load(&dir).map_err(unreadable)?;
        if job.mode == Mode::Upgrade {
            back_up(&dir, &mut rec, &job.version).map_err(|e| {
                let message = format!(
                    "copying the Pulumi state aside before the upgrade to {} failed ({e}); the upgrade waits and retries with backoff: check the state volume",
                    job.version
                );
                TaskError::new(Failure::StateUnavailable, message)
            })?;
        }
        // A run stopped by a timeout, a controller that died or an install pod that ended
        // without an outcome may have left pending creates.
        let interrupted = rec.interrupted
            || rec.last_install.as_ref().is_some_and(|l| {
                matches!(l.result, InstallResult::Running | InstallResult::TimedOut)
            });
        let (mode, version): (&str, _) = (job.mode.into(), &job.version);
        if interrupted {
            let (namespace, name) = (&job.namespace, &job.name);
            tracing::info!(%namespace, %name, "the last install stopped part-way: this one drops the pending creates it may have left before its pulumi up");
        }
        rec.last_install = Some(LastInstall {
            version: version.clone(),
            started_at: now(),
            finished_at: None,
            result: InstallResult::Running,
            message: Some(format!("{mode} of {PACKAGE}@{version} running")),
            summary: None,
        });
        rec.failure = None;
        rec.attempted_config_hash = Some(job.config.hash.clone());
        record::store(&dir, &rec).map_err(io("writing the install record in", &dir))?;
        let steps = self.install_steps(&client, &dir, &job, &mut rec, interrupted);
        let (result, outcome) = match tokio::time::timeout(self.install_timeout, steps).await {
            Ok(Ok(applied)) => (
                InstallResult::Succeeded,
                Ok(succeeded(&mut rec, &job, applied)),
            ),
            Ok(Err(e)) => (InstallResult::Failed, Err(e)),
            Err(_) => {
                // The steps' future is gone with every tool's process group (or its install pod,
                // stopped and waited for here): clear its lock now.
                self.pod_stopped(&job.uid).await;
                let _ = self.stack(&dir).clear_locks();
                let message = format!(
                    "{mode} of {PACKAGE}@{version} ran longer than --install-timeout ({}s) and was stopped with its processes; it retries with backoff (raise installTimeout if the program needs longer)",
                    self.install_timeout.as_secs()
                );
                let error = TaskError::new(Failure::InstallTimedOut, message);
                (InstallResult::TimedOut, Err(error))
            }
        };
        if let Some(last) = rec.last_install.as_mut() {
            last.finished_at = Some(now());
            last.result = result;
            last.message = Some(match &outcome {
                Ok(message) => message.clone(),
                Err(e) => e.message.clone(),
            });
        }
        rec.failure = outcome.as_ref().err().and_then(|e| e.failure);
        // Until an install succeeds: one that failed before its `pulumi up` cleared nothing.
        rec.interrupted = outcome
            .as_ref()
            .is_err_and(|e| interrupted || e.interrupted || result == InstallResult::TimedOut);
        rec.remember(job.mode.into());
        // Before the record, which is read as the task's end.
        self.collect_trees().await;
        if let Err(e) = record::store(&dir, &rec) {
            tracing::warn!(dir = %dir.display(), error = %e, "writing the install record failed");
        }
        outcome.map(|_| ())
    }

    async fn install_steps(
        &self,
        client: &kube::Client,
        dir: &Path,
        job: &Job,
        rec: &mut Record,
        interrupted: bool,
    ) -> Result<(pulumi::Counts, Endpoints, Vec<String>), TaskError> {
        process::reap(dir);
        self.passphrase_readable()?;
        self.check_state_volume()?;
        let (stack, _key) = self.keyed_stack(dir, job.target(), rec).await?;
        write_project(
            &stack.project,
            &stack.backend,
            &job.version,
            &self.pulumi_sdk_version,
        )?;
        self.dependencies(&stack.project, job).await?;
        let step = run::Step::Install { interrupted };
        let run::Done {
            counts, outputs, ..
        } = (self
            .run(&stack, step, &job.config, Some(job.target()))
            .await)
            .result?;
        let endpoints = endpoints(&outputs, &job.config.settings);
        let secrets = write_membership_secrets(client, job, &outputs, &rec.membership_secrets)
            .await
            .map_err(|e| TaskError::new(Failure::OutputsFailed, e))?;
        Ok((counts, endpoints, secrets))
    }

    /// Checks and reuses, or builds with npm, the job's shared dependency tree ([`modules`]),
    /// then links it into the project.
    async fn dependencies(&self, project: &Path, job: &Job) -> Result<(), TaskError> {
        let (key, files) = self.tree_key(project, &job.version);
        let trees = self.trees();
        let lock = trees.lock(&key).await?;
        let build = |build_dir: PathBuf| async move {
            write_files(&build_dir, &files)?;
            self.npm_in_pod(self.pods()?, &build_dir, job.target())
                .await
        };
        let outcome = trees.ensure(&key, &lock, build).await?;
        let version = &job.version;
        match &outcome {
            modules::Outcome::Reused => {
                tracing::info!(%version, %key, "reusing the shared dependency tree: no npm install")
            }
            modules::Outcome::Built => {
                tracing::info!(%version, %key, "built the shared dependency tree")
            }
            modules::Outcome::Rebuilt(reason) => {
                tracing::warn!(%version, %key, %reason, "rebuilt the shared dependency tree")
            }
        }
        // Blocking: an earlier layout's own `node_modules` is removed first, which takes seconds.
        let (project, state_dir) = (project.to_path_buf(), self.state_dir.clone());
        Ok(modules::blocking(move || trees.link(&project, &key, &state_dir)).await?)
    }

    fn trees(&self) -> modules::Trees {
        modules::Trees {
            root: self.state_dir.join(".cache").join("modules"),
        }
    }

    /// The tree key of `version`, with the files it is the key of (`package.json`, `.npmrc`).
    fn tree_key(&self, project: &Path, version: &str) -> (String, Vec<(&'static str, String)>) {
        let mut files = project_files(&project.join("state"), version, &self.pulumi_sdk_version);
        files.retain(|(name, _)| matches!(*name, "package.json" | ".npmrc"));
        let file = |name: &str| {
            files
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("", |(_, c)| c.as_str())
        };
        let key = modules::key(file("package.json"), file(".npmrc"), self.npm_allow_scripts);
        (key, files)
    }

    /// npm with this installer's settings and `registry`.
    fn npm(&self, registry: String) -> npm::Npm {
        npm::Npm {
            binary: self.npm_binary.clone(),
            registry,
            cache: self.state_dir.join(".cache").join("npm"),
            allow_scripts: self.npm_allow_scripts,
            heap_limit_mib: self.npm_heap_limit,
        }
    }

    async fn collect_trees(&self) {
        let (trees, state_dir) = (self.trees(), self.state_dir.clone());
        let removed = modules::blocking(move || Ok(trees.collect(&state_dir)))
            .await
            .unwrap_or_default();
        if !removed.is_empty() {
            tracing::info!(
                ?removed,
                "removed shared dependency trees no instance links to"
            );
        }
    }

    /// Runs `step` ([`run::run`]) and observes its Pulumi time: `pulumi up` as tool
    /// `pulumi-up`, the other commands as `pulumi`.
    async fn run(
        &self,
        stack: &pulumi::Stack,
        step: run::Step,
        config: &ProgramConfig,
        target: Option<Target<'_>>,
    ) -> run::Ran {
        if let Some(target) = target {
            let ran = match self.pods() {
                Ok(launcher) => (self.run_in_pod(launcher, stack, step, config, target)).await,
                Err(e) => run::Ran {
                    result: Err(e),
                    up: None,
                    other_seconds: 0.0,
                },
            };
            if let Some((seconds, ok)) = ran.up {
                self.observe_tool("pulumi-up", ok, seconds);
            }
            self.observe_tool("pulumi", ran.result.is_ok(), ran.other_seconds);
            return ran;
        }
        // Without tenant auth, no client secret is left in the stack's config.
        let absent: Vec<&str> = match step {
            run::Step::Install { .. } | run::Step::PreviewUpgrade => [config::CLIENT_SECRET_KEY]
                .into_iter()
                .filter(|key| config.secrets.iter().all(|(k, _)| k != key))
                .collect(),
            _ => Vec::new(),
        };
        let keep = self.pulumi_history_keep.into();
        let ran = run::run(stack, step, &config_values(config), &absent, keep).await;
        if let Some((seconds, ok)) = ran.up {
            self.observe_tool("pulumi-up", ok, seconds);
        }
        self.observe_tool("pulumi", ran.result.is_ok(), ran.other_seconds);
        ran
    }

    /// Runs `step` in an install pod ([`launch`]): the request and the instance's key (the
    /// keyed stack's passphrase file) in the pod's Secret, its outcome from the project folder.
    /// A pod that finds the state under another key (a backup of an earlier release put back)
    /// is followed by a rekey pod with the operator's passphrase, and runs once more.
    async fn run_in_pod(
        &self,
        launcher: &launch::Launcher,
        stack: &pulumi::Stack,
        step: run::Step,
        config: &ProgramConfig,
        target: Target<'_>,
    ) -> run::Ran {
        let failed = |e: TaskError| run::Ran {
            result: Err(e),
            up: None,
            other_seconds: 0.0,
        };
        let key = match std::fs::read(&stack.passphrase_file) {
            Ok(key) => key,
            Err(e) => {
                return failed(io("reading the instance's key", &stack.passphrase_file)(e).into());
            }
        };
        let files = || vec![("passphrase".to_string(), key.clone())];
        let ran = (self.pod_run(launcher, step, config, target, files(), None)).await;
        let mismatch = |ran: &run::Ran| {
            ran.result
                .as_ref()
                .is_err_and(|e| e.failure == Some(Failure::PassphraseMismatch))
        };
        if !mismatch(&ran) {
            return ran;
        }
        let operator = match std::fs::read(&self.passphrase_file) {
            Ok(operator) => operator,
            Err(e) => {
                return failed(io("reading the passphrase file", &self.passphrase_file)(e).into());
            }
        };
        let previous = state_key::previous(&operator, target.uid, None);
        match self.rekey_in_pod(launcher, &key, previous, target).await {
            Ok(()) => (self.pod_run(launcher, step, config, target, files(), None)).await,
            Err(e) => failed(e),
        }
    }

    /// Re-encrypts instance `target`'s state under its own `key` in a rekey pod, with the first
    /// of `previous` that opens it ([`state_key::settle`]).
    async fn rekey_in_pod(
        &self,
        launcher: &launch::Launcher,
        key: &[u8],
        previous: Vec<Vec<u8>>,
        target: Target<'_>,
    ) -> Result<(), TaskError> {
        let mut files = vec![("passphrase".to_string(), key.to_vec())];
        let previous = previous.into_iter().enumerate();
        files.extend(previous.map(|(n, k)| (format!("{}{n}", launch::PREVIOUS), k)));
        let none = ProgramConfig::default();
        let step = run::Step::Rekey;
        let ran = (self.pod_run(launcher, step, &none, target, files, None)).await;
        ran.result?;
        let (namespace, name) = (target.namespace, target.name);
        tracing::info!(%namespace, %name, "re-encrypted the Pulumi state under the instance's own key in a rekey pod");
        Ok(())
    }

    /// Builds a shared dependency tree in `folder` (its `package.json` and `.npmrc` written) with
    /// npm in an install pod that mounts only that folder, npm's cache and the instance's project.
    async fn npm_in_pod(
        &self,
        launcher: &launch::Launcher,
        folder: &Path,
        target: Target<'_>,
    ) -> Result<(), TaskError> {
        let registry = self
            .registry()
            .map_err(|e| TaskError::new(Failure::RegistryUnreachable, e))?;
        let cache = self.state_dir.join(".cache").join("npm");
        std::fs::create_dir_all(&cache).map_err(io("creating", &cache))?;
        launch::own_for_pod(&[folder.to_path_buf(), cache])?;
        let build = run::Build {
            folder: folder
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            version: target.version.to_string(),
        };
        let files = vec![(launch::REGISTRY.to_string(), registry.into_bytes())];
        let none = ProgramConfig::default();
        let step = run::Step::Dependencies;
        let started = Instant::now();
        let ran = (self.pod_run(launcher, step, &none, target, files, Some(build))).await;
        let seconds = started.elapsed().as_secs_f64();
        self.observe_tool("npm", ran.result.is_ok(), seconds);
        ran.result.map(|_| ())
    }

    /// One run of `step` in an install pod, its Secret holding `files` beside the request.
    async fn pod_run(
        &self,
        launcher: &launch::Launcher,
        step: run::Step,
        config: &ProgramConfig,
        target: Target<'_>,
        files: launch::Files,
        build: Option<run::Build>,
    ) -> run::Ran {
        let failed = |e: TaskError| run::Ran {
            result: Err(e),
            up: None,
            other_seconds: 0.0,
        };
        let dir = self.instance_dir(target.namespace, target.name);
        let projects = [dir.join("platform"), dir.join(UPGRADE_PREVIEW)];
        if let Err(e) = launch::own_for_pod(&projects) {
            return failed(e);
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // A tree's build is never adopted: a controller that starts over removes what a stopped
        // build left and builds in a folder of its own, so its run is named by when it started.
        let hash = match build {
            Some(_) => format!("{nanos:x}"),
            None => config.hash.clone(),
        };
        let run_key = launch::run_key(step, target.version, &hash);
        let request = run::Request {
            install_id: format!("{run_key}.{nanos:x}"),
            uid: target.uid.to_string(),
            namespace: target.namespace.to_string(),
            name: target.name.to_string(),
            step,
            settings: config.settings.clone(),
            secrets: config
                .secrets
                .iter()
                .map(|(k, v)| (k.to_string(), v.0.clone()))
                .collect(),
            build,
        };
        let project = dir.join("platform");
        (launcher.run(&request, &files, &run_key, self.install_timeout, &project)).await
    }

    /// The launcher of the install pods, which run every install and preview of the
    /// controller's (`--install-image` is required with `--install-platform=true`).
    fn pods(&self) -> Result<&launch::Launcher, TaskError> {
        self.launcher.as_ref().ok_or_else(|| {
            let message = "no --install-image: the platform program runs only in install pods";
            TaskError::new(Failure::ToolMissing, message)
        })
    }

    /// Stops instance `uid`'s install pod, if one runs, and waits until it has (a run whose
    /// future was dropped, as at the install timeout, stops it only in the background).
    async fn pod_stopped(&self, uid: &str) {
        if let Some(launcher) = &self.launcher {
            launcher.stop(uid).await;
        }
    }

    /// The flags `controller install` runs with in an install pod.
    pub(crate) fn pod_flags(&self) -> Vec<String> {
        vec![
            format!("--program-heap-limit={}", self.program_heap_limit),
            format!("--pulumi-history-keep={}", self.pulumi_history_keep),
            format!("--npm-heap-limit={}", self.npm_heap_limit),
            format!("--npm-allow-scripts={}", self.npm_allow_scripts),
        ]
    }

    /// Flags of the install pods that only make sense together.
    pub fn check_pods(&self) -> anyhow::Result<()> {
        let host_path = self.install_image.is_some() && self.install_state_claim.is_none();
        anyhow::ensure!(
            !host_path || self.install_node.is_some(),
            "--install-image without --install-state-claim mounts --state-dir from the node: set --install-node (or NODE_NAME) to the node the controller runs on"
        );
        Ok(())
    }

    /// The launcher of `--install-image`'s pods in the controller's `namespace`, if it is set.
    pub fn launcher(
        &self,
        client: &kube::Client,
        namespace: &str,
    ) -> anyhow::Result<Option<launch::Launcher>> {
        let Some(image) = &self.install_image else {
            return Ok(None);
        };
        let state = match &self.install_state_claim {
            Some(claim) => launch::StateVolume::Claim(claim.clone()),
            None => launch::StateVolume::HostPath,
        };
        self.check_pods()?;
        Ok(Some(launch::Launcher {
            client: client.clone(),
            settings: launch::PodSettings {
                namespace: namespace.to_string(),
                image: image.clone(),
                service_account: self.install_service_account.clone(),
                state,
                state_dir: self.state_dir.clone(),
                node: self.install_node.clone(),
                resources: self.install_pod_resources.clone(),
                flags: self.pod_flags(),
            },
        }))
    }

    /// Runs one [`run::Request`] (`controller install --request <file>`): its step in the
    /// instance's project, with the instance's key from the file `passphrase` beside the
    /// request, and writes its [`run::Outcome`] into the instance's project folder ([`run::OUTCOME`]).
    pub async fn run_request(&self, file: &Path) -> anyhow::Result<run::Outcome> {
        use anyhow::Context;
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading the request {}", file.display()))?;
        let request: run::Request = serde_json::from_str(&text)
            .with_context(|| format!("reading the request {}", file.display()))?;
        for name in [&request.namespace, &request.name] {
            anyhow::ensure!(
                common::names::is_dns_label(name),
                "the request {} names the instance folder {name:?}, which is no namespace or instance name",
                file.display()
            );
        }
        let mut secrets = Vec::new();
        for (key, value) in &request.secrets {
            let known = [config::KUBECONFIG_KEY, config::CLIENT_SECRET_KEY];
            let Some(key) = known.into_iter().find(|k| k == key) else {
                anyhow::bail!(
                    "the request {} sets the unknown secret config key {key:?}",
                    file.display()
                );
            };
            secrets.push((key, config::Redacted(value.clone())));
        }
        let config = ProgramConfig {
            settings: request.settings.clone(),
            secrets,
            hash: String::new(),
        };
        // An install pod sees only the project folders of the instance (launch::mounts): the
        // tools' pid file, HOME and logs live in the installed project, Pulumi's home where
        // PULUMI_HOME says (the pod's own), the outcome beside them.
        let dir = self.instance_dir(&request.namespace, &request.name);
        let installed = dir.join("platform");
        let mut stack = self.stack(&dir);
        stack.passphrase_file = file.with_file_name("passphrase");
        stack.state = installed.clone();
        if let Some(home) = std::env::var_os("PULUMI_HOME") {
            stack.home = home.into();
        }
        let ran = match (request.step, &request.build) {
            (run::Step::Dependencies, Some(build)) => {
                anyhow::ensure!(
                    build.folder.starts_with(".build-") && !build.folder.contains('/'),
                    "the request {} names the build folder {:?}, which is no dependency tree being built",
                    file.display(),
                    build.folder
                );
                let registry = std::fs::read_to_string(file.with_file_name(launch::REGISTRY))
                    .with_context(|| format!("reading the registry beside {}", file.display()))?;
                let folder = self.trees().root.join(&build.folder);
                let npm = self.npm(registry.trim().to_string());
                let built = npm
                    .install(&folder, PACKAGE, &build.version, &installed)
                    .await;
                run::Ran {
                    result: built.map(|()| run::Done::default()).map_err(npm_failure),
                    up: None,
                    other_seconds: 0.0,
                }
            }
            _ => self.settled_run(file, &request, &config, stack).await,
        };
        let outcome = run::Outcome::of(&request, ran);
        let bytes = serde_json::to_vec(&outcome)?;
        record::write_durably(&installed, run::OUTCOME, &bytes)
            .with_context(|| format!("writing {} in {}", run::OUTCOME, installed.display()))?;
        Ok(outcome)
    }

    /// A pod's run of `request` after its key check: a rekey pod re-encrypts the state with the
    /// previous keys beside the request `file`; any other run first checks that its key opens
    /// the state (the controller follows a refusal with a rekey pod).
    async fn settled_run(
        &self,
        file: &Path,
        request: &run::Request,
        config: &ProgramConfig,
        mut stack: pulumi::Stack,
    ) -> run::Ran {
        let mut previous = Vec::new();
        let previous_key = |n: usize| file.with_file_name(format!("{}{n}", launch::PREVIOUS));
        while let Ok(key) = std::fs::read(previous_key(previous.len())) {
            previous.push(key);
        }
        let installed = stack.state.clone();
        let settled = state_key::settle(&stack, &installed, &previous, &self.passphrase_file);
        let nothing = |result| run::Ran {
            result,
            up: None,
            other_seconds: 0.0,
        };
        match (settled.await, request.step) {
            (Err(e), _) => nothing(Err(e)),
            (Ok(()), run::Step::Rekey) => nothing(Ok(run::Done::default())),
            (Ok(()), step) => {
                if step == run::Step::PreviewUpgrade {
                    let dir = self.instance_dir(&request.namespace, &request.name);
                    stack.project = dir.join(UPGRADE_PREVIEW);
                }
                self.run(&stack, step, config, None).await
            }
        }
    }

    /// Runs a refreshing preview of the installed config and records what it found.
    pub(crate) async fn preview(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        version: &str,
    ) -> Result<(), TaskError> {
        let dir = self.instance_dir(namespace, name);
        let _held = hold_state(&dir)?;
        let stack = self.stack(&dir);
        let run = async {
            process::reap(&dir);
            self.passphrase_readable().map_err(|e| e.message)?;
            let mut rec = record::load(&dir).map_err(|e| e.to_string())?;
            let target = Target {
                namespace,
                name,
                uid,
                version,
            };
            let (stack, _key) =
                (self.keyed_stack(&dir, target, &mut rec).await).map_err(|e| e.message)?;
            let none = ProgramConfig::default();
            let done = (self
                .run(&stack, run::Step::Preview, &none, Some(target))
                .await)
                .result;
            done.map(|d| (d.counts, d.resources))
                .map_err(|e| e.to_string())
        };
        let outcome = match tokio::time::timeout(self.install_timeout, run).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.pod_stopped(uid).await;
                let _ = stack.clear_locks();
                Err(format!(
                    "the repair preview ran longer than --install-timeout ({}s) and was stopped",
                    self.install_timeout.as_secs()
                ))
            }
        };
        let mut rec = record::load(&dir).map_err(unreadable)?;
        let result = match outcome {
            Ok((counts, resources)) => {
                let total = resources.len();
                let message = if counts.changes() == 0 {
                    "no drift: the installed platform matches its state".to_string()
                } else {
                    format!(
                        "drift: putting it back would create {}, update {} and delete {} resources{}",
                        counts.created,
                        counts.updated,
                        counts.deleted,
                        named(&resources, total as i64)
                    )
                };
                rec.preview = Some(Preview {
                    finished_at: now(),
                    version: version.to_string(),
                    changes: counts.changes(),
                    message,
                });
                rec.preview_failure = None;
                Ok(())
            }
            Err(message) => {
                rec.preview_failure = Some((Failure::PreviewFailed, message.clone()));
                Err(TaskError::new(Failure::PreviewFailed, message))
            }
        };
        if let Err(e) = record::store(&dir, &rec) {
            tracing::warn!(dir = %dir.display(), error = %e, "writing the install record failed");
        }
        result
    }

    /// Previews `job`, an upgrade waiting for approval, against the running instance: in a
    /// project of its own beside the installed one ([`UPGRADE_PREVIEW`], the same backend, a copy
    /// of the stack config), so the installed project is never rewritten; records what it found
    /// (or why it failed) as the pending upgrade.
    pub(crate) async fn preview_upgrade(&self, job: Job) -> Result<(), TaskError> {
        let dir = self.instance_dir(&job.namespace, &job.name);
        let _held = hold_state(&dir)?;
        let mut stack = self.stack(&dir);
        let installed = std::mem::replace(&mut stack.project, dir.join(UPGRADE_PREVIEW));
        let mut key = None;
        let run = async {
            process::reap(&dir);
            self.passphrase_readable()?;
            let mut rec = record::load(&dir).map_err(unreadable)?;
            let (keyed, file) = self.keyed_stack(&dir, job.target(), &mut rec).await?;
            stack.passphrase_file = keyed.passphrase_file;
            key = Some(file);
            let _ = std::fs::remove_dir_all(&stack.project);
            let project = &stack.project;
            std::fs::create_dir_all(project).map_err(io("creating", project))?;
            let (version, sdk) = (&job.version, &self.pulumi_sdk_version);
            write_project(&stack.project, &stack.backend, version, sdk)?;
            let config = format!("Pulumi.{}.yaml", pulumi::STACK);
            let copied = std::fs::copy(installed.join(&config), stack.project.join(&config));
            copied.map_err(io("copying the stack config into", &stack.project))?;
            self.dependencies(&stack.project, &job).await?;
            let step = run::Step::PreviewUpgrade;
            let done = (self
                .run(&stack, step, &job.config, Some(job.target()))
                .await)
                .result;
            done.map(|d| (d.counts, d.resources))
                .map_err(|e| TaskError::new(Failure::PreviewFailed, e.to_string()))
        };
        let outcome = tokio::time::timeout(self.install_timeout, run).await;
        if outcome.is_err() {
            self.pod_stopped(&job.uid).await;
        }
        let _ = stack.clear_locks();
        let _ = std::fs::remove_dir_all(&stack.project);
        let (counts, resources, error) = match outcome {
            Ok(Ok((counts, resources))) => (counts, resources, None),
            Ok(Err(e)) => (Default::default(), vec![], Some(e.message)),
            Err(_) => {
                let error = "it ran longer than --install-timeout and was stopped";
                (Default::default(), vec![], Some(error.to_string()))
            }
        };
        let mut rec = record::load(&dir).map_err(unreadable)?;
        rec.pending_upgrade = Some(PendingUpgrade {
            version: job.version.clone(),
            create: counts.created,
            update: counts.updated,
            delete: counts.deleted,
            resources: resources.into_iter().take(PREVIEW_NAMES).collect(),
            error,
            previewed_at: now(),
        });
        record::store(&dir, &rec).map_err(|e| io("writing the install record in", &dir)(e).into())
    }
}

/// ` (<the first PREVIEW_NAMES resources>, and N more)` of `total`, or nothing when none is
/// named.
pub(crate) fn named(resources: &[String], total: i64) -> String {
    if resources.is_empty() {
        return String::new();
    }
    let shown = &resources[..resources.len().min(PREVIEW_NAMES)];
    match total - shown.len() as i64 {
        ..=0 => format!(" ({})", shown.join(", ")),
        more => format!(" ({}, and {more} more)", shown.join(", ")),
    }
}

/// The folder, beside the installed project, where an upgrade waiting for approval is previewed.
pub(crate) const UPGRADE_PREVIEW: &str = "upgrade-preview";
/// The folder of the state copies taken before upgrades.
pub const STATE_BACKUPS: &str = "state-backups";

/// Copies the stack's backend folder and its stack config (`Pulumi.dev.yaml`) to
/// `state-backups/<time>-<installed version>/` before an upgrade to `to`, as files (Pulumi's
/// format is never read), keeping the newest [`STATE_BACKUP_LIMIT`]. A retry of the same upgrade
/// keeps the copy its first attempt took.
fn back_up(dir: &Path, rec: &mut Record, to: &str) -> std::io::Result<()> {
    let from = rec.installed_version.clone().unwrap_or_default();
    let newest = rec.state_backups.first();
    if newest.is_some_and(|b| b.version == from && b.upgrade_to == to) {
        return Ok(());
    }
    let taken = k8s_openapi::jiff::Timestamp::now();
    let stamp = taken.strftime("%Y%m%dT%H%M%S%.9fZ");
    let path = dir.join(STATE_BACKUPS).join(format!("{stamp}-{from}"));
    let project = dir.join("platform");
    copy_folder(&project.join("state"), &path.join("state"))?;
    let config = format!("Pulumi.{}.yaml", pulumi::STACK);
    std::fs::copy(project.join(&config), path.join(&config))?;
    rec.state_backups.insert(
        0,
        StateBackup {
            path: path.display().to_string(),
            version: from,
            upgrade_to: to.to_string(),
            taken_at: Time(taken),
        },
    );
    let keep = rec.state_backups.len().min(STATE_BACKUP_LIMIT);
    for old in rec.state_backups.split_off(keep) {
        let _ = std::fs::remove_dir_all(&old.path);
    }
    record::store(dir, rec)
}

/// Copies folder `from` to `to`, file by file.
fn copy_folder(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let (entry, target) = entry.map(|e| (e.path(), to.join(e.file_name())))?;
        if entry.is_dir() {
            copy_folder(&entry, &target)?;
        } else {
            std::fs::copy(&entry, &target)?;
        }
    }
    Ok(())
}

/// The endpoints to report: the program's outputs `httpEndpoint` and `routeUrlPattern`, else
/// the settings it was given (the gateway's `httpEndpoint` is reported even if not echoed).
fn endpoints(outputs: &Value, settings: &Value) -> Endpoints {
    let pick = |key: &str| {
        [outputs, settings]
            .into_iter()
            .find_map(|v| v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty()))
            .map(String::from)
    };
    Endpoints {
        http: pick("httpEndpoint"),
        route_url_pattern: pick("routeUrlPattern"),
    }
}

fn config_values(config: &ProgramConfig) -> Vec<(&'static str, ConfigValue)> {
    let settings = ConfigValue::Plain(config.settings.to_string());
    let providers = ConfigValue::List(DISABLED_DEFAULT_PROVIDERS.map(String::from).into());
    let mut values = vec![
        (config::SETTINGS_KEY, settings),
        (config::DISABLE_DEFAULT_PROVIDERS_KEY, providers),
    ];
    for (key, value) in &config.secrets {
        values.push((key, ConfigValue::Secret(value.clone())));
    }
    values
}

/// Records a successful install in `rec`; returns its message.
fn succeeded(
    rec: &mut Record,
    job: &Job,
    (counts, endpoints, secrets): (pulumi::Counts, Endpoints, Vec<String>),
) -> String {
    rec.installed_version = Some(job.version.clone());
    rec.installed_config_hash = Some(job.config.hash.clone());
    rec.pending_upgrade = None;
    rec.endpoints = Some(endpoints);
    rec.membership_secrets = secrets;
    rec.preview = None;
    rec.preview_failure = None;
    let pulumi::Counts {
        created,
        updated,
        deleted,
        unchanged,
    } = counts;
    if let Some(last) = rec.last_install.as_mut() {
        last.summary = Some(InstallSummary {
            created,
            updated,
            deleted,
            unchanged,
            config_hash: Some(job.config.hash.clone()),
        });
    }
    format!(
        "{} of {PACKAGE}@{} applied: {created} created, {updated} updated, {deleted} deleted, {unchanged} unchanged",
        <&str>::from(job.mode),
        job.version,
    )
}

const PROGRAM: &str = include_str!("program.js");

/// The project's files (name, content) for `version` and `@pulumi/pulumi` at `sdk_version`.
fn project_files(backend: &Path, version: &str, sdk_version: &str) -> Vec<(&'static str, String)> {
    let pulumi_yaml = format!(
        "# Generated by platform-operator.\nname: {}\nruntime:\n  name: nodejs\n  options:\n    typescript: false\ndescription: the di-framework platform (existing-cluster program)\nbackend:\n  url: {}\n",
        pulumi::PROJECT,
        pulumi::backend_url(backend)
    );
    let package = json!({
        "name": "di-platform-instance",
        "version": "0.0.0",
        "private": true,
        "main": "index.js",
        "dependencies": { PACKAGE: version, SDK_PACKAGE: sdk_version },
    });
    // No registry URL in the lockfile, so a later mirror serves it too; the registry (maybe with
    // credentials) reaches npm in its environment at each run, never in a file.
    let npmrc = "# Generated by platform-operator. The registry comes from the operator at each install.\nsave-exact=true\nfund=false\naudit=false\nomit-lockfile-registry-resolved=true\n".to_string();
    vec![
        ("Pulumi.yaml", pulumi_yaml),
        ("package.json", format!("{package:#}\n")),
        ("index.js", PROGRAM.to_string()),
        (".npmrc", npmrc),
    ]
}

/// Writes `files` into `dir`, leaving those that are already as they should be.
fn write_files(dir: &Path, files: &[(&str, String)]) -> Result<(), TaskError> {
    for (name, content) in files {
        let path = dir.join(name);
        if std::fs::read(&path).ok().as_deref() != Some(content.as_bytes()) {
            std::fs::write(&path, content).map_err(io("writing", &path))?;
        }
    }
    Ok(())
}

fn write_project(
    project: &Path,
    backend: &Path,
    version: &str,
    sdk_version: &str,
) -> Result<(), TaskError> {
    std::fs::create_dir_all(backend).map_err(io("creating", backend))?;
    write_files(project, &project_files(backend, version, sdk_version))
}

/// Whether a Secret is the job's instance's membership kubeconfig (by its labels or, from an
/// earlier release, an owner reference); another's is never changed or deleted.
fn membership_of(meta: &ObjectMeta, job: &Job) -> bool {
    let uid = job.owner.as_ref().map(|o| o.uid.as_str());
    let labels = meta.labels.as_ref();
    let label = |key| labels.and_then(|l| l.get(key)).map(String::as_str);
    let owner = |o: &OwnerReference| Some(o.uid.as_str()) == uid;
    label(MEMBERSHIP_LABEL) == Some(job.name.as_str())
        && match label(INSTANCE_UID_LABEL) {
            Some(marked) => Some(marked) == uid,
            None => meta.owner_references.iter().flatten().any(owner),
        }
}

/// The kubeconfig Secret of one membership (`tenant`, `user`, `role`) of the job's instance.
fn membership_secret(
    job: &Job,
    name: &str,
    (tenant, user, role): (&str, &str, &str),
    kubeconfig: &str,
) -> Secret {
    let uid = job.owner.as_ref().map_or("", |o| o.uid.as_str());
    let labels = [
        (MANAGED_BY_LABEL, MANAGED_BY),
        (INSTANCE_UID_LABEL, uid),
        (MEMBERSHIP_LABEL, job.name.as_str()),
        ("platform.di-framework.dev/tenant", tenant),
        ("platform.di-framework.dev/user", user),
    ];
    let role = [("platform.di-framework.dev/role".into(), role.into())];
    let kubeconfig = ByteString(kubeconfig.as_bytes().to_vec());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(job.namespace.clone()),
            owner_references: Some(job.owner.iter().cloned().collect()),
            labels: Some(labels.map(|(k, v)| (k.to_string(), v.to_string())).into()),
            annotations: Some(role.into()),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some([(KUBECONFIG_KEY.to_string(), kubeconfig)].into()),
        ..Secret::default()
    }
}

/// Writes one Secret per membership kubeconfig the program returned, deletes the earlier ones
/// that are gone, and returns the names written.
async fn write_membership_secrets(
    client: &kube::Client,
    job: &Job,
    outputs: &Value,
    previous: &[String],
) -> Result<Vec<String>, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &job.namespace);
    let mut written = Vec::new();
    for entry in outputs["kubeconfigs"].as_array().into_iter().flatten() {
        let field = |k: &str| entry[k].as_str().unwrap_or_default();
        let (tenant, user, kubeconfig) = (field("tenant"), field("user"), field("kubeconfig"));
        if tenant.is_empty() || user.is_empty() || kubeconfig.is_empty() {
            return Err("the program's kubeconfigs output has an entry without tenant, user or kubeconfig; the platform version may not match this operator".into());
        }
        let name = membership_secret_name(&job.name, tenant, user);
        if written.contains(&name) {
            return Err(format!(
                "the program's kubeconfigs output names the membership {tenant}/{user} twice; the platform version may not match this operator"
            ));
        }
        let existing = secrets
            .get_opt(&name)
            .await
            .map_err(|e| format!("reading the Secret {name} failed: {e}"))?;
        if existing.is_some_and(|s| !membership_of(s.meta(), job)) {
            return Err(format!(
                "the Secret {name} exists and is not a membership kubeconfig of {}; rename it, or the tenant or user",
                job.name
            ));
        }
        let secret = membership_secret(job, &name, (tenant, user, field("role")), kubeconfig);
        apply(&secrets, &name, &secret)
            .await
            .map_err(|e| format!("writing the membership kubeconfig Secret {name} failed: {e}"))?;
        written.push(name);
    }
    for stale in previous.iter().filter(|p| !written.contains(p)) {
        let ours = |meta: &ObjectMeta| membership_of(meta, job);
        delete_if(&secrets, stale, DeleteParams::default(), ours)
            .await
            .map_err(|e| format!("deleting the stale membership Secret {stale} failed: {e}"))?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_is_full_at_its_percent() {
        assert!(!volume_full(94, 100, 95));
        assert!(volume_full(95, 100, 95));
        assert!(volume_full(u64::MAX, u64::MAX, 100), "no overflow");
        assert!(!volume_full(0, 0, 1), "an unsized volume is never full");
        assert!(!volume_full(10 << 30, 100 << 30, 11));
    }

    #[test]
    fn the_project_pins_one_exact_version_and_records_its_backend() {
        let files = project_files(
            Path::new("/state/ns/one/platform/state"),
            "6.0.22",
            DEFAULT_SDK_VERSION,
        );
        let get = |n: &str| {
            files
                .iter()
                .find(|(name, _)| *name == n)
                .map(|(_, c)| c.clone())
                .expect("file")
        };
        let package: Value = serde_json::from_str(&get("package.json")).expect("json");
        assert_eq!(
            package["dependencies"],
            json!({"@di-framework/platform": "6.0.22", "@pulumi/pulumi": "3.248.0"})
        );
        assert!(get("Pulumi.yaml").contains("name: nodejs"));
        assert!(get("Pulumi.yaml").contains("typescript: false"));
        assert!(get("Pulumi.yaml").contains("url: file:///state/ns/one/platform/state"));
        assert!(
            !get(".npmrc").contains("registry="),
            "the registry (and any credentials in it) never lands in the project"
        );
        assert!(get(".npmrc").contains("save-exact=true"));
        assert!(get("index.js").contains("require(\"@di-framework/platform/existing\")"));
        // Every package the program requires is declared.
        let program = get("index.js");
        let mut required = Vec::new();
        for part in program.split("require(\"").skip(1) {
            let name = part.split('"').next().unwrap_or_default();
            let package = match name.strip_prefix('@') {
                Some(scoped) => {
                    let mut it = scoped.splitn(3, '/');
                    format!("@{}/{}", it.next().unwrap_or(""), it.next().unwrap_or(""))
                }
                None => name.split('/').next().unwrap_or_default().to_string(),
            };
            required.push(package);
        }
        assert_eq!(required, ["@pulumi/pulumi", "@di-framework/platform"]);
        for name in &required {
            assert!(
                package["dependencies"].get(name.as_str()).is_some(),
                "{name} is required by the program but not declared"
            );
        }
    }

    /// An installer on the state folder `dir` (no tool is run by the tests using it).
    fn installer_in(dir: &Path) -> Installer {
        let tool_seconds = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("tool_seconds", "test"),
            &["tool", "result"],
        )
        .expect("histogram");
        Installer {
            state_dir: dir.to_path_buf(),
            passphrase_file: dir.join("passphrase"),
            npm_registry: "https://registry.npmjs.org/".into(),
            npm_registry_file: None,
            npm_allow_scripts: false,
            pulumi_sdk_version: DEFAULT_SDK_VERSION.into(),
            npm_binary: "npm".into(),
            pulumi_binary: "pulumi".into(),
            install_timeout: Duration::from_secs(1),
            program_heap_limit: 1024,
            npm_heap_limit: 1024,
            pulumi_history_keep: 10,
            state_volume_full_percent: 95,
            install_image: None,
            install_service_account: "platform-operator-install".into(),
            install_state_claim: None,
            install_node: None,
            install_pod_resources: launch::parse_resources(launch::DEFAULT_RESOURCES)
                .expect("the default parses"),
            launcher: None,
            tool_seconds: Some(tool_seconds),
        }
    }

    #[test]
    fn the_registry_comes_from_its_file_when_one_is_named() {
        let dir = std::env::temp_dir().join(format!("installer-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let mut installer = installer_in(&dir);
        assert_eq!(
            installer.registry().as_deref(),
            Ok("https://registry.npmjs.org/")
        );
        let file = dir.join("url");
        installer.npm_registry_file = Some(file.clone());
        let missing = installer.registry().expect_err("no file yet");
        assert!(missing.contains("npmRegistrySecret"), "{missing}");
        std::fs::write(&file, "  \n").expect("write");
        assert!(installer.registry().is_err(), "an empty file is refused");
        std::fs::write(&file, "https://ci:s3cret@npm.example/\n").expect("write");
        assert_eq!(
            installer.registry().as_deref(),
            Ok("https://ci:s3cret@npm.example/"),
            "read at each install, so a rotated Secret is used at the next one"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn state_copies_before_upgrades_keep_the_newest_three() {
        let dir = std::env::temp_dir().join(format!("installer-backup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = dir.join("platform/state/.pulumi/stacks/platform");
        std::fs::create_dir_all(&state).expect("dir");
        std::fs::write(state.join("dev.json"), "{}").expect("state");
        std::fs::write(dir.join("platform/Pulumi.dev.yaml"), "encryptionsalt: x").expect("config");
        let mut rec = Record {
            installed_version: Some("6.0.20".into()),
            ..Record::default()
        };
        for to in ["6.0.21", "6.0.21", "6.0.22", "6.0.23", "6.0.24"] {
            back_up(&dir, &mut rec, to).expect("copy");
        }
        let to: Vec<_> = rec
            .state_backups
            .iter()
            .map(|b| b.upgrade_to.as_str())
            .collect();
        assert_eq!(to, ["6.0.24", "6.0.23", "6.0.22"], "a retry keeps its copy");
        let copy = Path::new(&rec.state_backups[0].path);
        let copied = std::fs::read_to_string(copy.join("state/.pulumi/stacks/platform/dev.json"));
        assert_eq!(copied.expect("copied state"), "{}");
        assert!(copy.join("Pulumi.dev.yaml").is_file());
        let kept = std::fs::read_dir(dir.join(STATE_BACKUPS))
            .expect("copies")
            .count();
        assert_eq!(kept, 3, "older copies are removed");
        let stored = record::load(&dir).expect("record").state_backups;
        let paths = |b: &[StateBackup]| b.iter().map(|b| b.path.clone()).collect::<Vec<_>>();
        assert_eq!(paths(&stored), paths(&rec.state_backups), "in the record");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writing_the_project_twice_changes_nothing() {
        let dir = std::env::temp_dir().join(format!("installer-project-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (project, backend) = (dir.join("platform"), dir.join("platform/state"));
        write_project(&project, &backend, "6.0.21", "3.248.0").expect("write");
        let before = std::fs::metadata(project.join("package.json"))
            .and_then(|m| m.modified())
            .expect("mtime");
        std::thread::sleep(Duration::from_millis(20));
        write_project(&project, &backend, "6.0.21", "3.248.0").expect("write");
        let after = std::fs::metadata(project.join("package.json"))
            .and_then(|m| m.modified())
            .expect("mtime");
        assert_eq!(before, after);
        write_project(&project, &backend, "6.0.22", "3.248.0").expect("write");
        let package = std::fs::read_to_string(project.join("package.json")).expect("read");
        assert!(package.contains("\"6.0.22\""));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn endpoints_come_from_the_outputs_or_else_from_the_settings() {
        let settings = json!({
            "httpEndpoint": "http://apps.example:30080",
            "routeUrlPattern": "http://{route}.{tenant}.apps.example:30080/",
        });
        let none = endpoints(&json!({}), &settings);
        assert_eq!(none.http.as_deref(), Some("http://apps.example:30080"));
        assert_eq!(
            none.route_url_pattern.as_deref(),
            Some("http://{route}.{tenant}.apps.example:30080/")
        );
        let returned = endpoints(
            &json!({"httpEndpoint": "http://127.0.0.1:28080", "routeUrlPattern": "http://{route}.{tenant}.localhost:28080/"}),
            &settings,
        );
        assert_eq!(returned.http.as_deref(), Some("http://127.0.0.1:28080"));
        assert_eq!(
            returned.route_url_pattern.as_deref(),
            Some("http://{route}.{tenant}.localhost:28080/")
        );
        let empty = endpoints(&json!({"httpEndpoint": ""}), &json!({}));
        assert_eq!(empty.http, None);
        assert_eq!(empty.route_url_pattern, None);
    }

    #[test]
    fn membership_secret_names_never_collide_and_are_bounded() {
        let name = membership_secret_name;
        assert_eq!(name("one", "acme", "dev"), "one.acme.dev.kubeconfig");
        assert_ne!(name("x", "a-b", "c"), name("x", "a", "b-c"));
        assert_ne!(
            name("x", "y", "z"),
            common::names::kubeconfig_secret("x-y-z")
        );
        assert_ne!(name("x", "y", "z"), name("x.y", "z", "w"));
        // The longest names the CRD admits.
        let (instance, label) = ("i".repeat(160), "l".repeat(40));
        assert_eq!(name(&instance, &label, &label).len(), 253);
    }

    #[test]
    fn the_typed_membership_secret_serializes_as_the_literal_it_replaces() {
        let job = Job {
            namespace: "team-a".into(),
            name: "one".into(),
            uid: "u-1".into(),
            version: "6.0.22".into(),
            mode: Mode::Install,
            config: ProgramConfig {
                settings: json!({}),
                secrets: Vec::new(),
                hash: "sha256:0".into(),
            },
            owner: Some(OwnerReference {
                uid: "u-1".into(),
                ..OwnerReference::default()
            }),
        };
        let secret = membership_secret(
            &job,
            "one.acme.dev.kubeconfig",
            ("acme", "dev", "admin"),
            "kc",
        );
        assert_eq!(
            serde_json::to_value(secret).expect("json"),
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "one.acme.dev.kubeconfig",
                    "namespace": "team-a",
                    "ownerReferences": [{"apiVersion": "", "kind": "", "name": "", "uid": "u-1"}],
                    "labels": {
                        "app.kubernetes.io/managed-by": "platform-operator",
                        "platform.di-framework.dev/instance-uid": "u-1",
                        MEMBERSHIP_LABEL: "one",
                        "platform.di-framework.dev/tenant": "acme",
                        "platform.di-framework.dev/user": "dev",
                    },
                    "annotations": { "platform.di-framework.dev/role": "admin" },
                },
                "type": "Opaque",
                "data": { "kubeconfig": ByteString(b"kc".to_vec()) },
            })
        );
    }

    /// `controller install`: a request's secrets reach the stack's config (encrypted under the
    /// key beside the request), its outcome names the request's ids and is written into the
    /// instance's folder; a request naming a folder outside the state or an unknown secret key
    /// is refused before anything runs.
    #[tokio::test]
    async fn a_run_request_runs_pulumi_only_and_writes_its_outcome() {
        let dir = std::env::temp_dir().join(format!("run-request-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut installer = installer_in(&dir);
        let tools = e2e::tools::Tools::locate().expect("tools");
        installer.pulumi_binary = tools.bin("pulumi").display().to_string();
        let instance = dir.join("team-a").join("one");
        let project = instance.join("platform");
        write_project(
            &project,
            &project.join("state"),
            "6.0.21",
            DEFAULT_SDK_VERSION,
        )
        .expect("project");
        let requests = dir.join("request");
        std::fs::create_dir_all(&requests).expect("dir");
        std::fs::write(requests.join("passphrase"), "the instance's key").expect("key");
        let request = run::Request {
            install_id: "run-1".into(),
            uid: "uid-1".into(),
            namespace: "team-a".into(),
            name: "one".into(),
            step: run::Step::Install { interrupted: false },
            settings: json!({"gateway": {"httpNodePort": 30080}}),
            secrets: [(
                config::KUBECONFIG_KEY.to_string(),
                "apiVersion: v1".to_string(),
            )]
            .into(),
            build: None,
        };
        let file = requests.join("request.json");
        std::fs::write(&file, serde_json::to_vec(&request).expect("json")).expect("write");

        // No dependency tree is linked: the program cannot load, so `up` fails, after the
        // config was set.
        let outcome = installer.run_request(&file).await.expect("outcome");
        assert_eq!(
            (outcome.install_id.as_str(), outcome.uid.as_str()),
            ("run-1", "uid-1")
        );
        let (failure, message) = outcome.result.clone().expect_err("the program cannot load");
        assert_eq!(failure, Failure::InstallFailed, "{message}");
        assert!(outcome.up.is_some_and(|(_, ok)| !ok));
        let written: run::Outcome = serde_json::from_slice(
            &std::fs::read(project.join(run::OUTCOME)).expect("outcome file"),
        )
        .expect("json");
        assert_eq!(
            (written.install_id, written.uid, written.result),
            (outcome.install_id, outcome.uid, outcome.result)
        );
        let stack = pulumi::Stack {
            passphrase_file: requests.join("passphrase"),
            ..installer.stack(&instance)
        };
        let config = std::fs::read_to_string(project.join("Pulumi.dev.yaml")).expect("config");
        assert!(config.contains("platform:kubeconfig") && !config.contains("apiVersion: v1"));
        assert!(
            stack.opens().await.expect("probe"),
            "encrypted under the key beside the request"
        );

        // Refused before anything runs.
        for (bad, expected) in [
            (
                run::Request {
                    name: "../two".into(),
                    ..request.clone()
                },
                "no namespace or instance name",
            ),
            (
                run::Request {
                    secrets: [("platform:other".to_string(), "x".to_string())].into(),
                    ..request.clone()
                },
                "unknown secret config key",
            ),
        ] {
            std::fs::write(&file, serde_json::to_vec(&bad).expect("json")).expect("write");
            let refused = installer.run_request(&file).await.expect_err("refused");
            assert!(refused.to_string().contains(expected), "{refused}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
