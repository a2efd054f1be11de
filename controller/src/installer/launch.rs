//! Install pods (`--install-image`): each run of the platform program (an install, a repair
//! preview, an upgrade preview) in a Job of its own, `pi-install-<instance UID>` in the
//! controller's namespace, running `controller install --request` from the operator image. The
//! pod holds no token (`automountServiceAccountToken: false`, a ServiceAccount without
//! permissions), runs `restricted` on a read-only root, and sees of the state volume only its own
//! instance's project folder (read-write) and the shared dependency trees (read-only). Its request
//! and the instance's own key come in a Secret of the same name, owned by the Job. Its outcome is
//! believed only when it names the run's install id and the instance's UID.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, LogParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::run::{self, Ran, Request, Step};
use crate::api::{delete_if, not_found};
use crate::decide::model::{Failure, TaskError};
use common::names::{INSTANCE_UID_LABEL, MANAGED_BY, MANAGED_BY_LABEL};

/// The files of a run's Secret beside `request.json`: `passphrase` (the instance's own key;
/// none for a [`Step::Dependencies`]), for a [`Step::Rekey`] the previous keys that may open
/// its state (`previous-<n>`, in order), for a [`Step::Dependencies`] the npm registry's URL
/// ([`REGISTRY`]).
pub type Files = Vec<(String, Vec<u8>)>;

/// The name prefix of the previous keys in a run's Secret.
pub const PREVIOUS: &str = "previous-";
/// The npm registry's URL in a run's Secret.
pub const REGISTRY: &str = "registry";

/// The annotation on an install Job naming its run ([`run_key`]).
pub const RUN_KEY: &str = "platform.di-framework.dev/install-run";
/// Where the request Secret is mounted in the pod.
const REQUEST_DIR: &str = "/run/platform-operator/install";
/// How long past `activeDeadlineSeconds` the controller waits for a Job to say it ended.
const GRACE: Duration = Duration::from_secs(120);
/// The user the pod runs as (the image's).
pub const POD_UID: u32 = 1000;
/// How many lines of a failed pod's log the error keeps.
const LOG_LINES: i64 = 20;

/// Where the pod finds the state volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateVolume {
    /// The controller's claim (`--install-state-claim`), as the chart mounts it.
    Claim(String),
    /// The controller's `--state-dir` on the node (a controller run as a process on the node).
    HostPath,
}

/// How install pods are made.
#[derive(Clone, Debug)]
pub struct PodSettings {
    /// The controller's namespace, where the Jobs run.
    pub namespace: String,
    /// The operator image (by digest, as the chart pins it).
    pub image: String,
    /// The pods' ServiceAccount (no permissions; its token is never mounted).
    pub service_account: String,
    /// The state volume.
    pub state: StateVolume,
    /// The controller's `--state-dir`: the pod mounts the state volume's folders at the same
    /// paths, so the project's links into the shared trees resolve the same.
    pub state_dir: PathBuf,
    /// Binds the pods to this node (`--install-node`): a hostPath state volume is on it.
    pub node: Option<String>,
    /// The pods' requests and limits (`--install-pod-resources`).
    pub resources: ResourceRequirements,
    /// The Pulumi flags of the controller, passed on to `controller install`.
    pub flags: Vec<String>,
}

/// `--install-pod-resources`' default: today's container limits for one install.
pub const DEFAULT_RESOURCES: &str = r#"{"requests":{"cpu":"100m","memory":"256Mi","ephemeral-storage":"1Gi"},"limits":{"memory":"2Gi","ephemeral-storage":"6Gi"}}"#;

/// Parses `--install-pod-resources`: a container's `resources` as JSON, with a memory limit (an
/// install without one could take the node's memory).
pub fn parse_resources(text: &str) -> Result<ResourceRequirements, String> {
    let resources: ResourceRequirements = serde_json::from_str(text).map_err(|e| {
        format!("{e}: give a container's resources as JSON, such as {DEFAULT_RESOURCES}")
    })?;
    let limits = resources.limits.as_ref();
    if !limits.is_some_and(|l| l.contains_key("memory")) {
        return Err(format!(
            "limits.memory is missing: an install pod needs a memory limit, such as {DEFAULT_RESOURCES}"
        ));
    }
    Ok(resources)
}

/// Gives the project folders in `folders` that exist to the pods' user, when the controller
/// runs as root (a controller on the node; in the chart both run as [`POD_UID`] already).
pub fn own_for_pod(folders: &[PathBuf]) -> Result<(), TaskError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    fn chown_tree(path: &Path) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        std::os::unix::fs::lchown(path, Some(POD_UID), Some(POD_UID))?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path)? {
                chown_tree(&entry?.path())?;
            }
        }
        Ok(())
    }
    for folder in folders.iter().filter(|f| f.exists()) {
        chown_tree(folder).map_err(|e| {
            TaskError::new(
                Failure::StateUnavailable,
                format!(
                    "giving {} to the install pods' user failed: {e}; check the state volume",
                    folder.display()
                ),
            )
        })?;
    }
    Ok(())
}

/// Starts install pods and waits for them.
#[derive(Clone)]
pub struct Launcher {
    /// The controller's client (Jobs, Secrets and Pods in its namespace).
    pub client: kube::Client,
    /// How the pods are made.
    pub settings: PodSettings,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The Job's and the Secret's name for instance `uid`.
pub fn job_name(uid: &str) -> String {
    format!("pi-install-{uid}")
}

/// Names one run: its step, the version and a hash of what it applies, so that a Job left by a
/// controller that stopped is adopted only by the same run.
pub fn run_key(step: Step, version: &str, config_hash: &str) -> String {
    let step = match step {
        Step::Install { .. } => "install",
        Step::Preview => "preview",
        Step::PreviewUpgrade => "preview-upgrade",
        Step::Rekey => "rekey",
        Step::Dependencies => "dependencies",
    };
    let hash: String = config_hash
        .trim_start_matches("sha256:")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect();
    format!("{step}-{version}-{hash}")
}

/// The folders of the state volume a run of `request` mounts, and whether read-only: its
/// instance's project (and the upgrade preview's beside it) and the shared dependency trees
/// read-only; a [`Step::Dependencies`] instead the tree it builds and npm's cache, read-write.
pub fn mounts(request: &Request) -> Vec<(String, bool)> {
    let (namespace, name) = (&request.namespace, &request.name);
    let mut folders = vec![(format!("{namespace}/{name}/platform"), false)];
    match (request.step, &request.build) {
        (Step::PreviewUpgrade, _) => {
            folders.push((
                format!("{namespace}/{name}/{}", super::UPGRADE_PREVIEW),
                false,
            ));
        }
        (Step::Dependencies, Some(build)) => {
            folders.push((format!(".cache/modules/{}", build.folder), false));
            folders.push((".cache/npm".to_string(), false));
            return folders;
        }
        _ => {}
    }
    folders.push((".cache/modules".to_string(), true));
    folders
}

fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (INSTANCE_UID_LABEL.to_string(), uid.to_string()),
    ])
}

/// The label selector of instance `uid`'s install pods.
fn pod_selector(uid: &str) -> String {
    format!("{INSTANCE_UID_LABEL}={uid},{MANAGED_BY_LABEL}={MANAGED_BY}")
}

/// Whether `meta` is an install object of instance `uid`.
fn ours(meta: &ObjectMeta, uid: &str) -> bool {
    let labels = meta.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    label(MANAGED_BY_LABEL) == Some(MANAGED_BY) && label(INSTANCE_UID_LABEL) == Some(uid)
}

impl PodSettings {
    /// The Job of `request` (its run named `key`), bounded by `deadline`.
    pub fn job(&self, request: &Request, key: &str, deadline: Duration) -> Job {
        let name = job_name(&request.uid);
        let state_dir = self.state_dir.display().to_string();
        let state = match &self.state {
            StateVolume::Claim(claim) => json!({"persistentVolumeClaim": {"claimName": claim}}),
            StateVolume::HostPath => json!({"hostPath": {"path": state_dir, "type": "Directory"}}),
        };
        let mut mounts: Vec<_> = mounts(request)
            .into_iter()
            .map(|(sub, ro)| {
                json!({"name": "state", "subPath": sub, "readOnly": ro,
                "mountPath": format!("{state_dir}/{sub}")})
            })
            .collect();
        for (volume, path) in [
            ("request", REQUEST_DIR),
            ("home", "/home/platform-operator"),
            ("tmp", "/tmp"),
        ] {
            mounts
                .push(json!({"name": volume, "mountPath": path, "readOnly": volume == "request"}));
        }
        let mut args = vec![format!("--state-dir={state_dir}")];
        args.extend(self.flags.iter().cloned());
        args.extend(["install".into(), "--request".into()]);
        args.push(format!("{REQUEST_DIR}/request.json"));
        let job = json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels(&request.uid),
                "annotations": {RUN_KEY: key, INSTALL_ID: request.install_id},
            },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": deadline.as_secs().max(1),
                "template": {
                    "metadata": {"labels": labels(&request.uid)},
                    "spec": {
                        "restartPolicy": "Never",
                        // A stopped run is killed as one run in the controller is (a timeout, a
                        // cancel): its tools hold nothing a grace period would let them finish.
                        "terminationGracePeriodSeconds": 5,
                        "serviceAccountName": self.service_account,
                        "automountServiceAccountToken": false,
                        "enableServiceLinks": false,
                        "nodeName": self.node,
                        "securityContext": {
                            "runAsNonRoot": true,
                            "runAsUser": POD_UID,
                            "runAsGroup": POD_UID,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [{
                            "name": "install",
                            "image": self.image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": args,
                            "env": [
                                {"name": "HOME", "value": "/home/platform-operator"},
                                {"name": "TMPDIR", "value": "/tmp"},
                                {"name": "PULUMI_HOME", "value": "/home/platform-operator/.pulumi"},
                            ],
                            "resources": self.resources,
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": mounts,
                        }],
                        "volumes": [
                            {"name": "state", "hostPath": state["hostPath"], "persistentVolumeClaim": state["persistentVolumeClaim"]},
                            // Readable by the pod's user: the Secret is this one run's, the pod its only reader.
                            {"name": "request", "secret": {"secretName": name, "defaultMode": 0o444}},
                            {"name": "home", "emptyDir": {}},
                            {"name": "tmp", "emptyDir": {}},
                        ],
                    },
                },
            },
        });
        // A null field (the volume source not used, an unset node) reads as unset.
        serde_json::from_value(job).expect("an install Job is a Job")
    }
}

/// The outcome file of a run in `project` (the instance's `platform/` folder), if it is the one
/// of `request`; anything else (none, unreadable, another run's) is `None`.
pub fn outcome(project: &Path, request: &Request) -> Option<run::Outcome> {
    let text = std::fs::read(project.join(run::OUTCOME)).ok()?;
    let outcome: run::Outcome = serde_json::from_slice(&text).ok()?;
    (outcome.install_id == request.install_id && outcome.uid == request.uid).then_some(outcome)
}

/// How a finished Job ended, from its pod: `Some(failure, message)` for a deadline or an
/// out-of-memory kill.
fn ended(job: &Job, pod: Option<&Pod>) -> Option<(Failure, String)> {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let deadline = conditions.into_iter().flatten().any(|c| {
        c.type_ == "Failed" && c.status == "True" && c.reason.as_deref() == Some("DeadlineExceeded")
    });
    if deadline {
        return Some((Failure::InstallTimedOut, String::new()));
    }
    let statuses = pod
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.container_statuses.as_ref());
    let oom = statuses.into_iter().flatten().any(|s| {
        let terminated = s.state.as_ref().and_then(|st| st.terminated.as_ref());
        terminated.and_then(|t| t.reason.as_deref()) == Some("OOMKilled")
    });
    oom.then(|| (Failure::ProgramOutOfMemory, String::new()))
}

/// Why a pod cannot start and never will (a missing image, a bad volume): waiting for its
/// deadline would only hide it.
pub fn stuck(pod: &Pod) -> Option<String> {
    const NEVER: [&str; 5] = [
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
    ];
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|s| {
        let waiting = s.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        NEVER.contains(&reason).then(|| {
            let message = waiting.message.as_deref().unwrap_or_default();
            format!("{reason}: {message}")
        })
    })
}

fn api_error(what: &str, e: kube::Error) -> TaskError {
    TaskError::new(
        Failure::InstallFailed,
        format!("{what} failed: {e}; the install retries with backoff"),
    )
}

impl Launcher {
    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// Runs `request` in a pod, its Secret holding `files` beside it, within `timeout`: adopts
    /// the Job of the same run left by a controller that stopped, else starts one; waits for it;
    /// returns its outcome. The Job and its Secret are deleted when it ends or when this future
    /// is dropped.
    pub async fn run(
        &self,
        request: &Request,
        files: &Files,
        run_key: &str,
        timeout: Duration,
        project: &Path,
    ) -> Ran {
        let guard = StopGuard {
            launcher: self.clone(),
            uid: Some(request.uid.clone()),
        };
        let result = self
            .run_to_end(request, files, run_key, timeout, project)
            .await;
        guard.stop().await;
        match result {
            Ok(outcome) => Ran {
                result: outcome
                    .result
                    .map_err(|(failure, message)| TaskError::new(failure, message)),
                up: outcome.up,
                other_seconds: outcome.other_seconds,
            },
            Err(e) => Ran {
                result: Err(e),
                up: None,
                other_seconds: 0.0,
            },
        }
    }

    async fn run_to_end(
        &self,
        request: &Request,
        files: &Files,
        run_key: &str,
        timeout: Duration,
        project: &Path,
    ) -> Result<run::Outcome, TaskError> {
        let name = job_name(&request.uid);
        let adopted = self.adopt(&name, &request.uid, run_key).await?;
        if adopted {
            tracing::info!(job = %name, run = %run_key, "adopted the install pod a stopped controller left");
        } else {
            // A pod of a run stopped a moment ago (a timeout, a cancel) may still be ending:
            // never two on one state.
            self.stop(&request.uid).await;
            let _ = std::fs::remove_file(project.join(run::OUTCOME));
            self.start(request, files, run_key, timeout).await?;
        }
        let finished = self.wait(&name, &request.uid, timeout + GRACE).await?;
        let pod = self.pod(&request.uid).await;
        // An adopted Job ran another install id: its outcome is believed by the Job's own.
        let request = Request {
            install_id: finished
                .annotations()
                .get(INSTALL_ID)
                .cloned()
                .unwrap_or_default(),
            ..request.clone()
        };
        if let Some(outcome) = outcome(project, &request) {
            // It holds the stack's outputs (kubeconfigs among them): not left on the volume.
            let _ = std::fs::remove_file(project.join(run::OUTCOME));
            return Ok(outcome);
        }
        if let Some((failure, _)) = ended(&finished, pod.as_ref()) {
            let message = match failure {
                Failure::InstallTimedOut => format!(
                    "the install pod {name} ran longer than --install-timeout ({}s) and was stopped; it retries with backoff (raise installTimeout if the program needs longer)",
                    timeout.as_secs()
                ),
                _ => format!(
                    "the install pod {name} was killed for running out of memory; raise the memory limit in --install-pod-resources"
                ),
            };
            return Err(TaskError::new(failure, message).interrupted());
        }
        let tail = self.log_tail(pod.as_ref()).await;
        let message = format!(
            "the install pod {name} ended without an outcome of this run (killed, evicted or deleted?); the install retries with backoff; its log ends: {tail}"
        );
        Err(TaskError::new(Failure::InstallFailed, message).interrupted())
    }

    /// The Job of the same run, when a controller that stopped left one with its Secret (any
    /// other is stopped before a new one starts). A Job of that name not ours is an error.
    async fn adopt(&self, name: &str, uid: &str, run_key: &str) -> Result<bool, TaskError> {
        let found = self.jobs().get_opt(name).await;
        let Some(job) = found.map_err(|e| api_error("reading the install Job", e))? else {
            return Ok(false);
        };
        if !ours(job.meta(), uid) {
            return Err(TaskError::new(
                Failure::InstallFailed,
                format!(
                    "a Job {name} in {} is not the operator's install Job of this instance; it was left alone: delete or rename it",
                    self.settings.namespace
                ),
            ));
        }
        let same_run = job.annotations().get(RUN_KEY).map(String::as_str) == Some(run_key);
        let secret = self.secrets().get_opt(name).await;
        let has_secret = secret
            .map_err(|e| api_error("reading the install Secret", e))?
            .is_some();
        Ok(same_run && has_secret)
    }

    async fn start(
        &self,
        request: &Request,
        files: &Files,
        run_key: &str,
        timeout: Duration,
    ) -> Result<(), TaskError> {
        let name = job_name(&request.uid);
        let job = self.settings.job(request, run_key, timeout);
        let created = self.jobs().create(&PostParams::default(), &job).await;
        let created = created.map_err(|e| api_error("creating the install Job", e))?;
        let body = serde_json::to_vec(request).expect("a request serializes");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.settings.namespace.clone()),
                labels: Some(labels(&request.uid)),
                owner_references: Some(vec![OwnerReference {
                    api_version: "batch/v1".into(),
                    kind: "Job".into(),
                    name: name.clone(),
                    uid: created.uid().unwrap_or_default(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            data: Some(
                std::iter::once(("request.json".to_string(), body))
                    .chain(files.iter().cloned())
                    .map(|(name, bytes)| (name, ByteString(bytes)))
                    .collect(),
            ),
            ..Secret::default()
        };
        let made = self.secrets().create(&PostParams::default(), &secret).await;
        made.map_err(|e| api_error("creating the install Secret", e))?;
        Ok(())
    }

    /// Waits until Job `name` has ended (a `Complete` or `Failed` condition, seen by a watch),
    /// its pod cannot start, or `limit` passes.
    async fn wait(&self, name: &str, uid: &str, limit: Duration) -> Result<Job, TaskError> {
        let ended = |j: Option<&Job>| {
            let conditions = j.and_then(|j| j.status.as_ref()?.conditions.as_ref());
            j.is_none()
                || conditions.into_iter().flatten().any(|c| {
                    matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True"
                })
        };
        let watch = kube::runtime::wait::await_condition(self.jobs(), name, ended);
        let mut watch = std::pin::pin!(tokio::time::timeout(limit, watch));
        loop {
            tokio::select! {
                ended = &mut watch => {
                    return match ended {
                        Ok(Ok(Some(job))) => Ok(job),
                        Ok(Ok(None)) => Err(TaskError::new(
                            Failure::InstallFailed,
                            format!("the install Job {name} was deleted while it ran; the install retries with backoff"),
                        ).interrupted()),
                        Ok(Err(e)) => Err(TaskError::new(
                            Failure::InstallFailed,
                            format!("watching the install Job {name} failed: {e}; the install retries with backoff"),
                        )),
                        Err(_) => Err(TaskError::new(
                            Failure::InstallTimedOut,
                            format!("the install Job {name} did not end within {}s; it is stopped and retried with backoff", limit.as_secs()),
                        ).interrupted()),
                    };
                }
                () = tokio::time::sleep(Duration::from_secs(2)) => {
                    if let Some(reason) = self.pod(uid).await.as_ref().and_then(stuck) {
                        return Err(TaskError::new(
                            Failure::InstallFailed,
                            format!(
                                "the install pod of {name} cannot start ({reason}); check --install-image ({}) and the pod's volumes",
                                self.settings.image
                            ),
                        ));
                    }
                }
            }
        }
    }

    /// The newest pod of instance `uid`'s install Job.
    async fn pod(&self, uid: &str) -> Option<Pod> {
        let pods = self
            .pods()
            .list(&ListParams::default().labels(&pod_selector(uid)))
            .await;
        let mut pods = pods.ok()?.items;
        pods.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
        pods.pop()
    }

    async fn log_tail(&self, pod: Option<&Pod>) -> String {
        let Some(name) = pod.map(|p| p.name_any()) else {
            return "(no pod)".into();
        };
        let params = LogParams {
            tail_lines: Some(LOG_LINES),
            ..LogParams::default()
        };
        match self.pods().logs(&name, &params).await {
            Ok(log) if !log.trim().is_empty() => log.trim().lines().collect::<Vec<_>>().join(" | "),
            Ok(_) => "(empty)".into(),
            Err(e) => format!("(unreadable: {e})"),
        }
    }

    /// Stops instance `uid`'s install Job and Secret (only the operator's of that UID) and waits
    /// until no pod of it runs, so that Pulumi's lock in its state is no one's.
    pub async fn stop(&self, uid: &str) {
        let name = job_name(uid);
        let background = DeleteParams::background();
        if let Err(e) = delete_if(&self.jobs(), &name, background, |m| ours(m, uid)).await {
            tracing::warn!(job = %name, error = %e, "deleting the install Job failed");
        }
        let secrets = self.secrets();
        let secret = delete_if(&secrets, &name, DeleteParams::default(), |m| ours(m, uid));
        if let Err(e) = secret.await {
            tracing::warn!(secret = %name, error = %e, "deleting the install Secret failed");
        }
        let params = ListParams::default().labels(&pod_selector(uid));
        // A pod whose containers have all ended (Succeeded, Failed) runs nothing: it is deleted
        // without waiting for its object to go.
        let ended = |p: &Pod| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            matches!(phase, Some("Succeeded" | "Failed"))
        };
        for _ in 0..90 {
            match self.pods().list(&params).await {
                Ok(list) => {
                    let running = !list.items.iter().all(ended);
                    let deleting = |p: &&Pod| p.meta().deletion_timestamp.is_some();
                    for pod in list.items.iter().filter(|p| !deleting(p)) {
                        let name = pod.name_any();
                        let gone = self.pods().delete(&name, &DeleteParams::default()).await;
                        if let Err(e) = gone
                            && !not_found(&e)
                        {
                            tracing::warn!(pod = %name, error = %e, "deleting the install pod failed");
                        }
                    }
                    if !running {
                        return;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "listing the install pods failed"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        tracing::warn!(job = %name, "the install pod still runs after 180 s");
    }
}

/// The annotation on an install Job naming the install id of its request.
pub const INSTALL_ID: &str = "platform.di-framework.dev/install-id";

/// Stops the run's pod when the run's future is dropped (cancellation, the install timeout, a
/// controller shutting down); a run that ends stops it itself ([`StopGuard::stop`]).
struct StopGuard {
    launcher: Launcher,
    uid: Option<String>,
}

impl StopGuard {
    async fn stop(mut self) {
        if let Some(uid) = self.uid.take() {
            self.launcher.stop(&uid).await;
        }
    }
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        if let Some(uid) = self.uid.take() {
            let launcher = self.launcher.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { launcher.stop(&uid).await });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn request(step: Step) -> Request {
        Request {
            install_id: "install-6.0.22-abc.1".into(),
            uid: "0b6f7c1e-uid".into(),
            namespace: "team-a".into(),
            name: "one".into(),
            step,
            settings: json!({}),
            secrets: BTreeMap::new(),
            build: None,
        }
    }

    fn settings(state: StateVolume, node: Option<&str>) -> PodSettings {
        PodSettings {
            namespace: "platform-operator".into(),
            image: "ghcr.io/di-framework/platform-operator@sha256:00".into(),
            service_account: "platform-operator-install".into(),
            state,
            state_dir: "/var/lib/platform-operator/state".into(),
            node: node.map(str::to_string),
            resources: parse_resources(DEFAULT_RESOURCES).expect("the default parses"),
            flags: vec!["--program-heap-limit=512".into()],
        }
    }

    fn spec(job: &Job) -> Value {
        serde_json::to_value(job).expect("json")["spec"]["template"]["spec"].clone()
    }

    #[test]
    fn the_pod_holds_no_token_runs_restricted_and_sees_only_its_own_folders() {
        let s = settings(StateVolume::Claim("platform-operator-state".into()), None);
        let job = s.job(
            &request(Step::Install { interrupted: false }),
            "k",
            Duration::from_secs(1800),
        );
        assert_eq!(
            job.metadata.name.as_deref(),
            Some("pi-install-0b6f7c1e-uid")
        );
        assert_eq!(job.metadata.namespace.as_deref(), Some("platform-operator"));
        assert!(ours(&job.metadata, "0b6f7c1e-uid") && !ours(&job.metadata, "other"));
        let annotations = job.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations[RUN_KEY], "k");
        assert_eq!(annotations[INSTALL_ID], "install-6.0.22-abc.1");
        let job_spec = job.spec.clone().expect("spec");
        assert_eq!(
            (job_spec.backoff_limit, job_spec.active_deadline_seconds),
            (Some(0), Some(1800))
        );
        let pod = spec(&job);
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["serviceAccountName"], "platform-operator-install");
        assert_eq!(pod["restartPolicy"], "Never");
        assert!(pod.get("nodeName").is_none(), "{pod}");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["runAsUser"], 1000);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let container = &pod["containers"][0];
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(container["resources"]["limits"]["memory"], "2Gi");
        let args: Vec<&str> = container["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            args,
            [
                "--state-dir=/var/lib/platform-operator/state",
                "--program-heap-limit=512",
                "install",
                "--request",
                "/run/platform-operator/install/request.json"
            ]
        );
        let mounts: Vec<(String, bool)> = container["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter(|m| m["name"] == "state")
            .map(|m| {
                (
                    m["subPath"].as_str().unwrap_or_default().to_string(),
                    m["readOnly"] == true,
                )
            })
            .collect();
        assert_eq!(
            mounts,
            [
                ("team-a/one/platform".to_string(), false),
                (".cache/modules".to_string(), true)
            ]
        );
        let volumes = pod["volumes"].as_array().expect("volumes");
        assert_eq!(
            volumes[0],
            json!({"name": "state", "persistentVolumeClaim": {"claimName": "platform-operator-state"}})
        );
        assert_eq!(
            volumes[1]["secret"]["secretName"],
            "pi-install-0b6f7c1e-uid"
        );
        assert!(
            volumes.iter().all(|v| v.get("hostPath").is_none()),
            "{volumes:?}"
        );
    }

    #[test]
    fn an_upgrade_preview_also_writes_its_own_project_and_a_host_path_pod_is_bound_to_the_node() {
        let s = settings(StateVolume::HostPath, Some("node-1"));
        let job = s.job(&request(Step::PreviewUpgrade), "k", Duration::from_secs(60));
        let pod = spec(&job);
        assert_eq!(pod["nodeName"], "node-1");
        assert_eq!(
            pod["volumes"][0],
            json!({"name": "state", "hostPath": {"path": "/var/lib/platform-operator/state", "type": "Directory"}})
        );
        let subs: Vec<&str> = pod["containers"][0]["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| m["subPath"].as_str())
            .collect();
        assert_eq!(
            subs,
            [
                "team-a/one/platform",
                "team-a/one/upgrade-preview",
                ".cache/modules"
            ]
        );
    }

    #[test]
    fn a_dependency_build_writes_only_its_tree_and_npms_cache() {
        let s = settings(StateVolume::Claim("state".into()), None);
        let build = Request {
            build: Some(run::Build {
                folder: ".build-0123abcd-1".into(),
                version: "6.0.22".into(),
            }),
            ..request(Step::Dependencies)
        };
        let job = s.job(&build, "k", Duration::from_secs(60));
        let mounts: Vec<(String, bool)> = spec(&job)["containers"][0]["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| Some((m["subPath"].as_str()?.to_string(), m["readOnly"] == true)))
            .collect();
        let expected = [
            ("team-a/one/platform", false),
            (".cache/modules/.build-0123abcd-1", false),
            (".cache/npm", false),
        ];
        assert_eq!(mounts, expected.map(|(p, ro)| (p.to_string(), ro)));
        // Every other run sees the trees read-only and npm's cache not at all.
        let install = s.job(
            &request(Step::Install { interrupted: false }),
            "k",
            Duration::from_secs(60),
        );
        let mounts = spec(&install)["containers"][0]["volumeMounts"].clone();
        assert!(
            mounts
                .as_array()
                .expect("mounts")
                .iter()
                .any(|m| m["subPath"] == ".cache/modules" && m["readOnly"] == true),
            "{mounts}"
        );
        assert!(!mounts.to_string().contains(".cache/npm"), "{mounts}");
    }

    #[test]
    fn a_run_is_named_by_its_step_version_and_config_hash() {
        let install = Step::Install { interrupted: true };
        assert_eq!(
            run_key(install, "6.0.22", "sha256:ac8799bdba44a2ce99"),
            "install-6.0.22-ac8799bdba44a2ce"
        );
        assert_eq!(run_key(Step::Preview, "6.0.22", ""), "preview-6.0.22-");
        assert_ne!(
            run_key(install, "6.0.22", "sha256:1"),
            run_key(install, "6.0.23", "sha256:1")
        );
    }

    #[test]
    fn pod_resources_need_a_memory_limit() {
        assert!(parse_resources(DEFAULT_RESOURCES).is_ok());
        let e = parse_resources(r#"{"limits":{"cpu":"1"}}"#).expect_err("no memory limit");
        assert!(e.contains("limits.memory"), "{e}");
        let e = parse_resources("memory=1Gi").expect_err("not JSON");
        assert!(e.contains("JSON"), "{e}");
    }

    #[test]
    fn an_outcome_is_believed_only_for_its_install_id_and_uid() {
        let dir = std::env::temp_dir().join(format!("launch-outcome-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let r = request(Step::Preview);
        assert!(outcome(&dir, &r).is_none(), "no file");
        let write = |id: &str, uid: &str| {
            let o = run::Outcome {
                install_id: id.into(),
                uid: uid.into(),
                result: Ok(run::Done::default()),
                up: None,
                other_seconds: 1.0,
            };
            std::fs::write(
                dir.join(run::OUTCOME),
                serde_json::to_vec(&o).expect("json"),
            )
            .expect("write");
        };
        write("another-run", &r.uid);
        assert!(outcome(&dir, &r).is_none(), "another run's");
        write(&r.install_id, "another-instance");
        assert!(outcome(&dir, &r).is_none(), "another instance's");
        write(&r.install_id, &r.uid);
        assert!(outcome(&dir, &r).is_some_and(|o| o.result.is_ok()));
        std::fs::write(dir.join(run::OUTCOME), "{not json").expect("write");
        assert!(outcome(&dir, &r).is_none(), "unreadable");
        std::fs::remove_dir_all(&dir).expect("clean");
    }

    #[test]
    fn a_deadline_an_oom_kill_and_a_missing_image_are_told_apart() {
        let job: Job = serde_json::from_value(json!({"status": {"conditions": [
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}))
        .expect("job");
        assert_eq!(
            ended(&job, None).map(|e| e.0),
            Some(Failure::InstallTimedOut)
        );
        let failed: Job = serde_json::from_value(json!({"status": {"conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}))
        .expect("job");
        let oom: Pod =
            serde_json::from_value(json!({"status": {"containerStatuses": [{"name": "install",
            "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}))
            .expect("pod");
        assert_eq!(
            ended(&failed, Some(&oom)).map(|e| e.0),
            Some(Failure::ProgramOutOfMemory)
        );
        assert_eq!(ended(&failed, None), None);
        assert_eq!(stuck(&oom), None);
        let pull: Pod = serde_json::from_value(json!({"status": {"containerStatuses": [{"name": "install",
            "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image i is not present"}}}]}}))
        .expect("pod");
        assert_eq!(
            stuck(&pull).as_deref(),
            Some("ErrImageNeverPull: image i is not present")
        );
    }
}
