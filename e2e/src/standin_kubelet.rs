//! STAND-IN kubelet (Jobs), for the end-to-end tests and the demo: KWOK runs no containers, so
//! the commands of Jobs would never run and every Job would "complete" whatever it did. This
//! stand-in serves the KWOK node [`crate::control_plane::NODE_NAME`] beside KWOK (which still
//! moves pods from `Pending` to `Running`; its stage that completes Job pods is not loaded):
//!
//! - **hostPath volumes** of every pod on the node live under a node root folder
//!   ([`StandInKubelet::host_path`]): `DirectoryOrCreate` creates the directory as the kubelet
//!   does, so a vCluster's storage directory exists on this "node" as it would on a real one.
//! - **Job pods**: once a pod owned by a Job is `Running`, each of its containers' commands is
//!   run as a local process, one after another, and the pod's true outcome is written to its
//!   status as a kubelet writes it (`Succeeded`, or `Failed` with the container's exit code,
//!   reason and, with `terminationMessagePolicy: FallbackToLogsOnError`, the end of its log as
//!   the message). The real Job controller in kube-controller-manager then writes the Job's
//!   `Complete` or `Failed` condition from it, retries within `backoffLimit` and all.
//!
//! It is at least as strict as a kubelet with a real image: it runs only images it knows
//! ([`KNOWN_IMAGE`] pinned by the harness's digest `crate::chart::TEST_DIGEST`, the operator
//! image; a tag, another digest or the chart's all-zero placeholder is refused as a registry
//! would, since nothing here serves them), whose `/usr/local/bin/controller` is the controller
//! binary of this workspace, used when built after its sources, else built first) and only the
//! binaries it knows in them; any other image, binary or an environment it cannot provide fails
//! the container with `StartError` (exit code 128), never a success. Its one liberty: the process sees the host folder of each hostPath mount, so an
//! argument naming a mount path (or a path under it) is rewritten to the mapped host folder.
//! Its log is `logs/standin-kubelet.log` in the control plane's folder, each container's output
//! `logs/standin-kubelet/<namespace>_<pod>_<container>.log`.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::HarnessError;
use crate::control_plane::NODE_NAME;

/// The image repository the stand-in runs: the operator's own image, by any digest or tag.
pub const KNOWN_IMAGE: &str = "ghcr.io/di-framework/platform-operator";

/// The operator image's binaries (its Dockerfile) and the workspace binary standing for each.
const IMAGE_BINARIES: [&str; 2] = ["controller", "webhook"];

/// The directory of those binaries in the image (its `PATH` starts there).
const IMAGE_BIN_DIR: &str = "/usr/local/bin";

/// How long one container may run when its pod sets no `activeDeadlineSeconds`.
const DEFAULT_LIMIT: Duration = Duration::from_secs(300);

/// The stand-in kubelet (Jobs); stopped on drop.
pub struct StandInKubelet {
    node_root: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for StandInKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInKubelet")
            .field("node_root", &self.node_root)
            .finish()
    }
}

/// Where a hostPath `path` of the node lives on this machine, under `node_root`.
pub fn map_host_path(node_root: &Path, path: &str) -> PathBuf {
    node_root.join(path.trim_start_matches('/'))
}

impl StandInKubelet {
    /// Starts serving the node of the control plane at `kubeconfig`, with the node's files under
    /// `dir/node-root`, logs under `dir/logs`, and the operator image's binaries from `bin_dir`
    /// (default: this workspace's, built when stale, [`crate::chart::operator_binaries`]).
    pub fn start(
        kubeconfig: &Path,
        dir: &Path,
        bin_dir: Option<PathBuf>,
    ) -> Result<Self, HarnessError> {
        let node_root = dir.join("node-root");
        let logs = dir.join("logs").join("standin-kubelet");
        for d in [&node_root, &logs] {
            std::fs::create_dir_all(d).map_err(|e| HarnessError::io(d, e))?;
        }
        let log_path = dir.join("logs").join("standin-kubelet.log");
        let log = std::fs::File::create(&log_path).map_err(|e| HarnessError::io(&log_path, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let node = Node {
            root: node_root.clone(),
            logs,
            bin_dir,
        };
        let (kubeconfig, stop2) = (kubeconfig.to_path_buf(), stop.clone());
        let thread = crate::process::spawn_on_own_runtime("standin-kubelet", move || {
            serve(kubeconfig, node, stop2, log)
        })
        .map_err(|e| HarnessError::io(&log_path, e))?;
        Ok(StandInKubelet {
            node_root,
            stop,
            thread: Some(thread),
        })
    }

    /// The node root: the node's `/` for hostPath volumes.
    pub fn node_root(&self) -> &Path {
        &self.node_root
    }

    /// Where the node's hostPath `path` lives on this machine.
    pub fn host_path(&self, path: &str) -> PathBuf {
        map_host_path(&self.node_root, path)
    }
}

impl Drop for StandInKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The node's folders and the image's binaries.
#[derive(Clone)]
struct Node {
    root: PathBuf,
    logs: PathBuf,
    bin_dir: Option<PathBuf>,
}

/// How a container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Termination {
    /// Its exit code (128 when it could not start).
    pub exit_code: i32,
    /// `Completed`, `Error`, `StartError` or `DeadlineExceeded`.
    pub reason: String,
    /// What the kubelet reports as the termination message.
    pub message: String,
}

impl Termination {
    fn start_error(message: String) -> Self {
        Termination {
            exit_code: 128,
            reason: "StartError".into(),
            message,
        }
    }
}

async fn serve(kubeconfig: PathBuf, node: Node, stop: Arc<AtomicBool>, mut log: std::fs::File) {
    let client = loop {
        match crate::control_plane::client_for(&kubeconfig).await {
            Ok(c) => break c,
            Err(e) => {
                let _ = writeln!(log, "client: {e}");
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let pods: Api<Pod> = Api::all(client.clone());
    let list = ListParams::default().fields(&format!("spec.nodeName={NODE_NAME}"));
    let mut started: BTreeSet<String> = BTreeSet::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    while !stop.load(Ordering::SeqCst) {
        while let Ok(line) = rx.try_recv() {
            let _ = writeln!(log, "{line}");
        }
        match pods.list(&list).await {
            Ok(listed) => {
                for pod in listed {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    if pod.metadata.deletion_timestamp.is_some() || started.contains(&uid) {
                        continue;
                    }
                    let spec = pod.spec.clone().unwrap_or_default();
                    if let Err(e) = make_volumes(&node.root, spec.volumes.as_deref().unwrap_or(&[]))
                    {
                        let _ = writeln!(log, "{}: {e}", name(&pod));
                        continue;
                    }
                    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                    if owned_by_job(&pod) && phase.as_deref() == Some("Running") {
                        started.insert(uid);
                        let _ = writeln!(log, "{}: running its containers", name(&pod));
                        let (node, client, tx) = (node.clone(), client.clone(), tx.clone());
                        tokio::spawn(async move {
                            let line = match run_pod(&node, client, &pod).await {
                                Ok(outcome) => format!("{}: {outcome}", name(&pod)),
                                Err(e) => format!("{}: writing its status failed: {e}", name(&pod)),
                            };
                            let _ = tx.send(line);
                        });
                    }
                }
            }
            Err(e) => {
                let _ = writeln!(log, "listing pods: {e}");
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Now, as the API server writes times.
fn now() -> serde_json::Value {
    json!(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now()
    ))
}

fn name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn owned_by_job(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Job" && o.controller == Some(true))
}

/// Creates the `DirectoryOrCreate` hostPath volumes under the node root, as the kubelet does.
fn make_volumes(root: &Path, volumes: &[Volume]) -> Result<(), HarnessError> {
    for v in volumes {
        if let Some(hp) = &v.host_path
            && hp.type_.as_deref() == Some("DirectoryOrCreate")
        {
            let dir = map_host_path(root, &hp.path);
            std::fs::create_dir_all(&dir).map_err(|e| HarnessError::io(&dir, e))?;
        }
    }
    Ok(())
}

/// Runs the pod's containers in order and writes the outcome to its status.
async fn run_pod(node: &Node, client: kube::Client, pod: &Pod) -> Result<String, kube::Error> {
    let spec = pod.spec.clone().unwrap_or_default();
    let limit = spec
        .active_deadline_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_LIMIT, Duration::from_secs);
    let started = now();
    let mut statuses = Vec::new();
    let mut failed = None;
    for c in &spec.containers {
        let outcome = if failed.is_some() {
            None
        } else {
            let t =
                run_container(node, pod, c, spec.volumes.as_deref().unwrap_or(&[]), limit).await;
            if t.exit_code != 0 {
                failed = Some(format!("{} exited {} ({})", c.name, t.exit_code, t.reason));
            }
            Some(t)
        };
        let state = match outcome {
            Some(t) => json!({"terminated": {
                "exitCode": t.exit_code,
                "reason": t.reason,
                "message": (!t.message.is_empty()).then_some(t.message),
                "startedAt": started,
                "finishedAt": now(),
            }}),
            None => json!({"waiting": {"reason": "PodInitializing"}}),
        };
        statuses.push(json!({
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "ready": false,
            "restartCount": 0,
            "started": false,
            "state": state,
        }));
    }
    let phase = if failed.is_some() {
        "Failed"
    } else {
        "Succeeded"
    };
    let now = now();
    let reason = if failed.is_some() {
        "PodFailed"
    } else {
        "PodCompleted"
    };
    let patch = json!({"status": {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "False", "reason": reason, "lastTransitionTime": now},
        ],
        "containerStatuses": statuses,
    }});
    let pods: Api<Pod> = Api::namespaced(
        client,
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    pods.patch_status(
        pod.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(match failed {
        Some(f) => format!("Failed: {f}"),
        None => "Succeeded".into(),
    })
}

/// The workspace binary standing for `program` of image `image`, or why it cannot run.
fn resolve(node: &Node, image: &str, program: &str) -> Result<PathBuf, String> {
    // As strict as a real node, which can run only what a registry serves: the one image this
    // workspace's binaries stand for, pinned by the harness's digest. A tag, another digest or
    // the chart's all-zero placeholder is an image no registry here has (ErrImagePull).
    let pinned = format!("{KNOWN_IMAGE}@{}", crate::chart::TEST_DIGEST);
    if image != pinned {
        return Err(format!(
            "the stand-in kubelet (Jobs) cannot run image {image:?}: it runs only {pinned} (the operator image the harness stands for), so a Job in any other image fails here rather than pass unrun"
        ));
    }
    let bin = program
        .strip_prefix(IMAGE_BIN_DIR)
        .and_then(|b| b.strip_prefix('/'))
        .or((!program.contains('/')).then_some(program))
        .filter(|b| IMAGE_BINARIES.contains(b))
        .ok_or_else(|| {
            format!(
                "exec: {program:?}: the stand-in kubelet (Jobs) runs only {} of image {KNOWN_IMAGE}",
                IMAGE_BINARIES.map(|b| format!("{IMAGE_BIN_DIR}/{b}")).join(", ")
            )
        })?;
    if let Some(dir) = &node.bin_dir {
        return Ok(dir.join(bin));
    }
    if let Some(fresh) = crate::chart::fresh_operator_binary(bin) {
        return Ok(fresh);
    }
    let dir = crate::chart::operator_binaries()?
        .0
        .parent()
        .map(Path::to_path_buf)
        .ok_or("the controller binary has no folder")?;
    Ok(dir.join(bin))
}

/// Runs one container's command as a local process, with hostPath mounts mapped.
async fn run_container(
    node: &Node,
    pod: &Pod,
    c: &Container,
    volumes: &[Volume],
    limit: Duration,
) -> Termination {
    let image = c.image.clone().unwrap_or_default();
    let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
    if argv.is_empty() {
        // The image's ENTRYPOINT.
        argv.push(format!("{IMAGE_BIN_DIR}/controller"));
    }
    argv.extend(c.args.clone().unwrap_or_default());
    let program = match resolve(node, &image, &argv[0]) {
        Ok(p) => p,
        Err(e) => return Termination::start_error(e),
    };
    // Mount path → host folder, for hostPath volumes only.
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(v) = volumes.iter().find(|v| v.name == m.name) else {
            return Termination::start_error(format!("volume {:?} is not in the pod", m.name));
        };
        if let Some(hp) = &v.host_path {
            let mut host = map_host_path(&node.root, &hp.path);
            if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                host = host.join(sub);
            }
            mounts.push((m.mount_path.trim_end_matches('/').to_string(), host));
        }
    }
    let map_arg = |arg: &str| -> String {
        for (mount, host) in &mounts {
            if arg == mount {
                return host.display().to_string();
            }
            if let Some(rest) = arg.strip_prefix(mount.as_str())
                && rest.starts_with('/')
            {
                return format!("{}{rest}", host.display());
            }
        }
        arg.to_string()
    };
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(argv[1..].iter().map(|a| map_arg(a)))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for e in c.env.iter().flatten() {
        match &e.value {
            Some(v) => {
                cmd.env(&e.name, v);
            }
            None if e.value_from.is_some() => {
                return Termination::start_error(format!(
                    "env {:?}: the stand-in kubelet (Jobs) does not resolve valueFrom",
                    e.name
                ));
            }
            None => {
                cmd.env(&e.name, "");
            }
        }
    }
    let log_path = node.logs.join(format!(
        "{}_{}_{}.log",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
        c.name
    ));
    let file = match std::fs::File::create(&log_path) {
        Ok(f) => f,
        Err(e) => return Termination::start_error(format!("{}: {e}", log_path.display())),
    };
    match file.try_clone() {
        Ok(f2) => {
            cmd.stdout(file).stderr(f2);
        }
        Err(e) => return Termination::start_error(format!("{}: {e}", log_path.display())),
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return Termination::start_error(format!("{}: {e}", program.display())),
    };
    let status = match tokio::time::timeout(limit, child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Termination::start_error(format!("waiting: {e}")),
        Err(_) => {
            let _ = child.kill().await;
            return Termination {
                exit_code: 137,
                reason: "DeadlineExceeded".into(),
                message: format!("stopped after {limit:?}"),
            };
        }
    };
    let exit_code = status.code().unwrap_or_else(|| {
        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
    });
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let fallback = c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
    let message = if exit_code != 0 && fallback {
        // The kubelet's fallback: the last 80 lines, at most 2048 bytes.
        let lines: Vec<&str> = output.lines().collect();
        let tail = lines[lines.len().saturating_sub(80)..].join("\n");
        let cut = tail.len().saturating_sub(2048);
        tail.get(cut..).unwrap_or_default().to_string()
    } else {
        String::new()
    };
    Termination {
        exit_code,
        reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_operator_image_and_its_binaries_run() {
        let node = Node {
            root: PathBuf::from("/n"),
            logs: PathBuf::from("/l"),
            bin_dir: Some(PathBuf::from("/ws/target/debug")),
        };
        let image = format!("{KNOWN_IMAGE}@sha256:{}", "1".repeat(64));
        assert_eq!(
            resolve(&node, &image, "/usr/local/bin/controller"),
            Ok(PathBuf::from("/ws/target/debug/controller"))
        );
        assert_eq!(
            resolve(&node, &image, "controller"),
            Ok(PathBuf::from("/ws/target/debug/controller"))
        );
        for (image, program) in [
            ("busybox:1.37", "rm"),
            ("docker.io/library/busybox:1.37", "/bin/rm"),
            (&format!("{KNOWN_IMAGE}-evil:1"), "controller"),
            (KNOWN_IMAGE, "controller"),
            (&format!("{KNOWN_IMAGE}:1.0.0"), "controller"),
            (
                &format!("{KNOWN_IMAGE}@sha256:{}", "0".repeat(64)),
                "controller",
            ),
            (image.as_str(), "rm"),
            (image.as_str(), "/bin/controller"),
            (image.as_str(), "/usr/local/bin/../bin/controller"),
        ] {
            assert!(resolve(&node, image, program).is_err(), "{image} {program}");
        }
        assert_eq!(
            map_host_path(Path::new("/n"), "/var/lib/x"),
            PathBuf::from("/n/var/lib/x")
        );
    }
}
