//! One control plane shared by every test of a test binary, started on first use: [`shared`]
//! with the KWOK node only, or [`shared_with_real_node`] with a real node beside it for the test
//! binaries whose tests run Jobs.
//!
//! It is started and owned by a keeper thread that lives until the test process exits, so its
//! processes (spawned with a parent-death signal) end with the process, whatever the tests did.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::{ControlPlane, HarnessError, Options};

/// What tests need from the shared control plane.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Its admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// Its folder (logs in `logs/`).
    pub dir: PathBuf,
    /// The kubectl binary.
    pub kubectl: PathBuf,
    /// The helm binary.
    pub helm: PathBuf,
    /// The operator image on its real node by digest, what the controller's `--cleanup-image`
    /// names there ([`ControlPlane::operator_image`]); `None` without a real node, where no
    /// Job's container runs.
    pub operator_image: Option<String>,
    /// The name of its real node's network namespace (under `/run/netns`; open it with
    /// [`crate::node_net::NetnsHandle::open`]), where the node's address
    /// ([`crate::node_net::NODE_IP`]) is and the pods' traffic ends; `None` without a real node.
    pub node_netns: Option<String>,
    /// Its admin kubeconfig for processes started in [`Shared::node_netns`]: the server is
    /// `https://127.0.0.1:6443`, the API server relay inside that namespace; `None` without a
    /// real node.
    pub node_kubeconfig: Option<PathBuf>,
}

impl ControlPlane {
    /// A cloneable handle with what tests use (kubeconfig, kubectl, helm, the real node's
    /// namespace), as [`shared`] gives.
    pub fn handle(&self) -> Shared {
        Shared {
            kubeconfig: self.kubeconfig().to_path_buf(),
            dir: self.dir().to_path_buf(),
            kubectl: self.tools().bin("kubectl"),
            helm: self.tools().bin("helm"),
            operator_image: self.operator_image().map(str::to_string),
            node_netns: self.node_netns().map(str::to_string),
            node_kubeconfig: self.node_kubeconfig().map(Path::to_path_buf),
        }
    }
}

impl Shared {
    /// A new admin client (create one per test: clients belong to the test's runtime).
    pub async fn client(&self) -> Result<kube::Client, HarnessError> {
        crate::control_plane::client_for(&self.kubeconfig).await
    }

    /// A `kubectl` command with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    /// Runs kubectl with `args` (and `stdin`), returning its standard output or its error.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String, HarnessError> {
        let mut cmd = self.kubectl();
        cmd.args(args);
        crate::cmd::run(cmd, stdin)?.ok(&format!("kubectl {}", args.join(" ")))
    }

    /// Applies the chart's PlatformInstance CRD and waits until it is Established (once per
    /// control plane and process).
    pub fn install_crd(&self) -> Result<(), HarnessError> {
        static DONE: std::sync::Mutex<Vec<(PathBuf, Result<(), String>)>> =
            std::sync::Mutex::new(Vec::new());
        let mut done = DONE.lock().map_err(|_| HarnessError::Command {
            what: "installing the CRD".into(),
            stderr: "poisoned".into(),
        })?;
        if let Some((_, result)) = done.iter().find(|(k, _)| *k == self.kubeconfig) {
            return result.clone().map_err(|message| HarnessError::Command {
                what: "installing the CRD".into(),
                stderr: message,
            });
        }
        let result = (|| {
            let dir = crate::repo_root().join("charts/platform-operator/crds");
            let dir = dir.to_string_lossy();
            self.kubectl_ok(&["apply", "--server-side", "-f", &dir], None)
                .map_err(|e| e.to_string())?;
            self.kubectl_ok(
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd/platforminstances.platform.di-framework.dev",
                ],
                None,
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
        })();
        done.push((self.kubeconfig.clone(), result.clone()));
        result.map_err(|message| HarnessError::Command {
            what: "installing the CRD".into(),
            stderr: message,
        })
    }

    /// Creates a namespace named `<prefix>-<pid>-<n>` with `labels`, and returns its name.
    pub fn create_namespace(
        &self,
        prefix: &str,
        labels: &[(&str, &str)],
    ) -> Result<String, HarnessError> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("      {k}: {v:?}"))
            .collect();
        let manifest = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n      e2e: \"true\"\n{}\n",
            labels.join("\n")
        );
        self.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&manifest))?;
        Ok(name)
    }
}

static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();
static SHARED_WITH_REAL_NODE: OnceLock<Result<Shared, String>> = OnceLock::new();

/// Starts a control plane with `options` on the calling thread and keeps its files; says where
/// it is as `what`.
fn start_kept(options: Options, what: &str) -> Result<ControlPlane, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut cp = runtime
        .block_on(ControlPlane::start(options))
        .map_err(|e| e.to_string())?;
    cp.keep_files();
    eprintln!(
        "{what} at {} (files in {})",
        cp.server(),
        cp.dir().display()
    );
    Ok(cp)
}

/// The shared control plane, started on first call. Blocks while it starts.
pub fn shared() -> Result<Shared, String> {
    SHARED
        .get_or_init(|| {
            crate::process::sweep_ended(&crate::control_plane::base_dir(), "shared-");
            crate::process::keep_for_process(
                "control-plane-keeper",
                || start_kept(Options::new("shared"), "shared control plane"),
                ControlPlane::handle,
            )
        })
        .clone()
}

/// The shared control plane with a real node beside the KWOK node
/// ([`Options::real_node_for_jobs`]), started on first call (blocks while it starts): every Job,
/// and every pod that does not tolerate the KWOK node, runs there in real containers, hostPath
/// volumes are this machine's folders, and the operator image is imported by digest
/// ([`Shared::operator_image`]). It is stopped when the test process exits (its node's
/// containers, mounts, cgroups and network namespace removed), its folder kept for the logs.
pub fn shared_with_real_node() -> Result<Shared, String> {
    SHARED_WITH_REAL_NODE
        .get_or_init(|| {
            let base = crate::control_plane::base_dir();
            // What killed test processes' nodes left first, so that their folders can go.
            crate::real_node::sweep_ended(&base);
            crate::process::sweep_ended(&base, "shared-node-");
            crate::process::keep_until_exit(
                "control-plane-keeper",
                || {
                    let options = Options::new("shared-node").real_node_for_jobs();
                    start_kept(options, "shared control plane with a real node")
                },
                ControlPlane::handle,
            )
        })
        .clone()
}
