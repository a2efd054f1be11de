//! The operator's Helm chart (`charts/platform-operator`) from Rust tests: render it with the real
//! helm binary and read what rendered, run helm against a control plane, give a ServiceAccount
//! of the chart a kubeconfig (a token from the TokenRequest API), and find the operator's own
//! binaries so tests can run them under those accounts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::HarnessError;
use crate::cmd::{Outcome, run};
use crate::shared::Shared;

/// The chart's folder.
pub fn chart_dir() -> PathBuf {
    crate::repo_root().join("charts/platform-operator")
}

/// The real vCluster chart kept in `../shared/vendor/vcluster` (its README says what it is).
pub fn vendored_vcluster_chart() -> PathBuf {
    crate::repo_root().join("../shared/vendor/vcluster/vcluster-0.37.0-rc.1.tgz")
}

/// A digest for the operator image in tests that only render the chart or run no container
/// of it (on KWOK): no image has it, so a real node could never run it. Tests on a real node use
/// the digest of the image built from the `Dockerfile` ([`crate::images::operator`]).
pub const TEST_DIGEST: &str =
    "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// The chart's operator image (`image.repository`) at [`TEST_DIGEST`]: the controller's
/// `--cleanup-image` on a control plane without a real node, where no Job's container runs.
pub const TEST_IMAGE: &str = "ghcr.io/di-framework/platform-operator@sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// The helm binary built by `e2e/tools/build.sh`, optionally aimed at a control plane.
#[derive(Debug, Clone)]
pub struct Helm {
    bin: PathBuf,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    /// Helm for offline work (lint, template, package): its kubeconfig names no cluster.
    pub fn offline() -> Result<Self, HarnessError> {
        Ok(Helm {
            bin: crate::tools::Tools::locate()?.bin("helm"),
            kubeconfig: None,
        })
    }

    /// Helm with the admin kubeconfig of `cluster`.
    pub fn for_cluster(cluster: &Shared) -> Self {
        Helm {
            bin: cluster.helm.clone(),
            kubeconfig: Some(cluster.kubeconfig.clone()),
        }
    }

    /// Helm with the kubeconfig at `kubeconfig`, such as a [`crate::ControlPlane`]'s.
    pub fn with_kubeconfig(kubeconfig: &Path) -> Result<Self, HarnessError> {
        Ok(Helm {
            bin: crate::tools::Tools::locate()?.bin("helm"),
            kubeconfig: Some(kubeconfig.to_path_buf()),
        })
    }

    /// The helm executable.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// A helm command (offline: KUBECONFIG points at a file that does not exist).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        let kubeconfig = self.kubeconfig.clone().unwrap_or_else(|| {
            std::env::temp_dir().join("platform-operator-no-cluster.kubeconfig")
        });
        cmd.env("KUBECONFIG", kubeconfig);
        cmd
    }

    /// Runs helm with `args`.
    pub fn run(&self, args: &[&str]) -> Result<Outcome, HarnessError> {
        let mut cmd = self.command();
        cmd.args(args);
        run(cmd, None)
    }

    /// Runs helm with `args`, returning its standard output or failing with its standard error.
    pub fn ok(&self, args: &[&str]) -> Result<String, HarnessError> {
        self.run(args)?.ok(&format!("helm {}", args.join(" ")))
    }

    /// `helm template platform-operator <chart> -n <namespace>` with `--set` for each of `sets`
    /// (offline): what rendered, or helm's standard error.
    pub fn template(&self, namespace: &str, sets: &[&str]) -> Result<Rendered, String> {
        let chart = chart_dir();
        self.template_chart(&chart, namespace, sets)
    }

    /// As [`Helm::template`], for the chart in folder `chart`.
    pub fn template_chart(
        &self,
        chart: &Path,
        namespace: &str,
        sets: &[&str],
    ) -> Result<Rendered, String> {
        let chart = chart.display().to_string();
        let mut args = vec!["template", "platform-operator", &chart, "-n", namespace];
        for set in sets {
            args.push("--set");
            args.push(set);
        }
        let out = self.run(&args).map_err(|e| e.to_string())?;
        if !out.success {
            return Err(out.stderr);
        }
        Rendered::parse(&out.stdout)
    }
}

/// The objects a render produced.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// Every object, in render order.
    pub objects: Vec<Value>,
}

impl Rendered {
    /// Parses a multi-document manifest (helm's output).
    pub fn parse(manifest: &str) -> Result<Self, String> {
        let objects: Vec<Value> = serde_saphyr::from_multiple(manifest)
            .map_err(|e| format!("the manifest is not YAML: {e}\n{manifest}"))?;
        Ok(Rendered {
            objects: objects.into_iter().filter(|o| !o.is_null()).collect(),
        })
    }

    /// The object of `kind` named `name`, if it rendered.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    /// The object of `kind` named `name`; panics naming what did render when it did not.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("{kind}/{name} did not render; rendered: {:?}", self.names()))
    }

    /// `Kind/name` of every object.
    pub fn names(&self) -> Vec<String> {
        self.objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or("?"),
                    o["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect()
    }

    /// The first container of Deployment `name`.
    pub fn container(&self, deployment: &str) -> &Value {
        &self.get("Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    }

    /// The arguments of the first container of Deployment `name`.
    pub fn args(&self, deployment: &str) -> Vec<String> {
        strings(&self.container(deployment)["args"])
    }
}

/// `helm template vcluster <chart> -n <ns> --kube-version 1.35.0` of a vCluster chart (the real
/// one or the stand-in) with a values file (in `dir`) holding `values` (YAML): what rendered, or
/// helm's standard error.
pub fn render_vcluster(
    chart: &Path,
    ns: &str,
    values: &str,
    dir: &Path,
) -> Result<Rendered, String> {
    let file = dir.join(format!("values-{}.yaml", values.len()));
    std::fs::write(&file, values).map_err(|e| e.to_string())?;
    let (chart, file) = (chart.display().to_string(), file.display().to_string());
    let args = [
        "template",
        "vcluster",
        &chart,
        "-n",
        ns,
        "--kube-version",
        "1.35.0",
    ];
    let out = Helm::offline()
        .and_then(|h| h.run(&[&args[..], &["--values", &file]].concat()))
        .map_err(|e| e.to_string())?;
    if !out.success {
        return Err(out.stderr);
    }
    Rendered::parse(&out.stdout)
}

/// The vCluster values the controller binary prints for instance `team-a/one`, and its host
/// namespace.
pub fn controller_vcluster_values() -> (String, String) {
    let (controller, _) = operator_binaries().expect("operator binaries");
    let out = Command::new(controller)
        .args(["--print-vcluster-values", "team-a/one"])
        .args(["--storage-root-base", "/var/lib/kubesolo/instances"])
        .arg(format!("--cleanup-image={TEST_IMAGE}"))
        .output()
        .expect("controller");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let host = common::names::host_namespace("team-a", "one");
    (String::from_utf8(out.stdout).expect("utf-8"), host)
}

/// Every permission an RBAC `role` grants, one per `[apiGroup, resource, verb, resourceName]`
/// (resourceName empty: every name; a non-resource URL as group `:url`, resource the URL).
pub fn permissions(role: &Value) -> Vec<[String; 4]> {
    let mut out = Vec::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        let mut groups = strings(&rule["apiGroups"]);
        let mut resources = strings(&rule["resources"]);
        let urls = strings(&rule["nonResourceURLs"]);
        if !urls.is_empty() {
            (groups, resources) = (vec![":url".to_string()], urls);
        }
        let mut names = strings(&rule["resourceNames"]);
        if names.is_empty() {
            names.push(String::new());
        }
        for g in &groups {
            for r in &resources {
                for v in strings(&rule["verbs"]) {
                    for n in &names {
                        out.push([g.clone(), r.clone(), v.clone(), n.clone()]);
                    }
                }
            }
        }
    }
    out
}

/// Whether `held` covers `needed` as the API server's escalation check sees it: group, resource
/// and verb equal or `*`, and a held rule naming resources only covers those names.
pub fn covers(held: &[[String; 4]], needed: &[String; 4]) -> bool {
    held.iter().any(|h| {
        let url = (h[0] == ":url") == (needed[0] == ":url");
        let fits = |i: usize| h[i] == needed[i] || h[i] == "*";
        url && fits(0) && fits(1) && fits(2) && (h[3].is_empty() || h[3] == needed[3])
    })
}

/// A JSON array of strings as a vector (empty when it is not one).
pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Writes to `path` a kubeconfig for ServiceAccount `account` of `namespace` on `cluster`, with
/// a token from the TokenRequest API (`kubectl create token`), valid for two hours.
pub fn service_account_kubeconfig(
    cluster: &Shared,
    namespace: &str,
    account: &str,
    path: &Path,
) -> Result<(), HarnessError> {
    account_kubeconfig(cluster, (namespace, account), path, &cluster.kubeconfig)
}

/// As [`service_account_kubeconfig`], for a process started in the real node's network namespace
/// ([`Shared::node_netns`]): its server is the API server as the node reaches it, that of
/// [`Shared::node_kubeconfig`] (`https://127.0.0.1:6443`, the API server relay there).
pub fn service_account_node_kubeconfig(
    cluster: &Shared,
    namespace: &str,
    account: &str,
    path: &Path,
) -> Result<(), HarnessError> {
    let node = cluster
        .node_kubeconfig
        .as_deref()
        .ok_or_else(|| HarnessError::Node("the control plane has no real node".into()))?;
    account_kubeconfig(cluster, (namespace, account), path, node)
}

/// Writes to `path` a kubeconfig for `account` of `namespace` with a fresh token, its cluster
/// (server and CA) that of the admin kubeconfig `server_from`.
fn account_kubeconfig(
    cluster: &Shared,
    (namespace, account): (&str, &str),
    path: &Path,
    server_from: &Path,
) -> Result<(), HarnessError> {
    let token = cluster.kubectl_ok(
        &["create", "token", account, "-n", namespace, "--duration=2h"],
        None,
    )?;
    let admin =
        std::fs::read_to_string(server_from).map_err(|e| HarnessError::io(server_from, e))?;
    let admin: Value = serde_saphyr::from_str(&admin)
        .map_err(|e| HarnessError::Client(format!("admin kubeconfig: {e}")))?;
    let cluster_entry = admin["clusters"][0]["cluster"].clone();
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster_entry}],
        "users": [{"name": account, "user": {"token": token.trim()}}],
        "contexts": [{"name": account, "context": {"cluster": "e2e", "user": account, "namespace": namespace}}],
        "current-context": account
    });
    let yaml = serde_saphyr::to_string(&config)
        .map_err(|e| HarnessError::Client(format!("kubeconfig: {e}")))?;
    std::fs::write(path, yaml).map_err(|e| HarnessError::io(path, e))
}

/// The `controller` and `webhook` binaries of this workspace (the target folder this test runs
/// from), built with `cargo build` first when either is missing or older than the sources.
pub fn operator_binaries() -> Result<(PathBuf, PathBuf), String> {
    static BINARIES: OnceLock<Result<(PathBuf, PathBuf), String>> = OnceLock::new();
    BINARIES
        .get_or_init(|| {
            let dir = std::env::current_exe()
                .map_err(|e| e.to_string())?
                .parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf)
                .ok_or("the test executable has no target folder")?;
            let controller = dir.join("controller");
            let webhook = dir.join("webhook");
            let root = crate::repo_root();
            let newest_source = ["common", "controller", "webhook"]
                .iter()
                .filter_map(|c| newest(&root.join(c).join("src")))
                .chain(newest(&root.join("Cargo.lock")))
                .max();
            let stale = |bin: &Path| {
                let built = std::fs::metadata(bin).and_then(|m| m.modified()).ok();
                match (built, newest_source) {
                    (Some(b), Some(s)) => b < s,
                    (None, _) => true,
                    (Some(_), None) => false,
                }
            };
            if stale(&controller) || stale(&webhook) {
                let status = crate::cmd::cargo()
                    .args([
                        "build",
                        "--locked",
                        "-p",
                        "controller",
                        "-p",
                        "webhook",
                        "--bins",
                    ])
                    .status()
                    .map_err(|e| format!("running cargo build: {e}"))?;
                if !status.success() {
                    return Err(format!("cargo build of controller and webhook: {status}"));
                }
            }
            Ok((controller, webhook))
        })
        .clone()
}

/// The newest modification time of any file under `path`.
fn newest(path: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| newest(&e.path()))
        .max()
}

/// The operator chart's state claim on a real node: a folder under the control plane's own that
/// uid 1000 may write, and a hostPath PersistentVolume bound ahead to the claim
/// `platform-operator-state` of the release namespace `namespace`. Returns the folder.
pub fn state_volume(
    cluster: &crate::ControlPlane,
    namespace: &str,
) -> Result<PathBuf, HarnessError> {
    let volume = cluster.dir().join("state-volume");
    std::fs::create_dir_all(&volume).map_err(|e| HarnessError::io(&volume, e))?;
    std::os::unix::fs::chown(&volume, Some(1000), Some(1000))
        .map_err(|e| HarnessError::io(&volume, e))?;
    let pv = format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {{ name: platform-operator-state }}
spec:
  capacity: {{ storage: 10Gi }}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {{ namespace: {namespace}, name: platform-operator-state }}
  hostPath: {{ path: {path:?}, type: Directory }}
"#,
        path = volume.display().to_string()
    );
    let mut kubectl = cluster.kubectl();
    kubectl.args(["apply", "-f", "-"]);
    crate::cmd::run(kubectl, Some(&pv))?.ok("kubectl apply of the state volume")?;
    Ok(volume)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_image_is_the_charts_repository_at_the_test_digest() {
        let repository = crate::images::chart_repository().expect("image.repository");
        assert_eq!(TEST_IMAGE, format!("{repository}@{TEST_DIGEST}"));
    }
}
