//! The operator as it ships, on the real node ([`crate::real_node`]) with the real vCluster
//! ([`crate::real_vcluster`]): the operator image built from the `Dockerfile` with the real
//! vCluster chart at its shipped path, `helm install` of `charts/platform-operator` pinned to
//! that image's digest, and the stand-in `@di-framework/platform` served by a local npm registry
//! relayed into the node's network namespace. Used by the demo (`local-cluster up`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::chart::Helm;
use crate::images::{BuiltImage, OperatorInputs};
use crate::{ControlPlane, HarnessError};

/// The operator chart's release name.
pub const RELEASE: &str = "platform-operator";
/// The operator's namespace (Pod Security `restricted`).
pub const NAMESPACE: &str = "platform-operator";
/// The cleanup Jobs' namespace (Pod Security `privileged`: hostPath volumes).
pub const CLEANUP_NAMESPACE: &str = "platform-operator-cleanup";
/// The npm registry's port on the node's addresses (relayed to the registry on loopback).
pub const REGISTRY_PORT: u16 = 4873;

/// The images the operator and the real vCluster run, built (or taken from the cache) before
/// any cluster starts.
pub struct Built {
    /// The real vCluster chart archive.
    pub chart: PathBuf,
    /// Its SHA-256 (hex), checked against the vendored `SHA256SUMS`.
    pub chart_sha256: String,
    /// The syncer, distro and CoreDNS images.
    pub vcluster_images: Vec<BuiltImage>,
    /// The operator image, with the real chart at its shipped path.
    pub operator: BuiltImage,
    /// What the operator image was built from (its release binaries among them).
    pub inputs: OperatorInputs,
}

/// Builds every image: the real vCluster's tools must have been built
/// (`e2e/tools/build.sh vcluster`), and the release binaries (`cargo build --release -p
/// controller -p webhook`).
pub fn build() -> Result<Built, HarnessError> {
    let (chart, chart_sha256) = crate::real_vcluster::chart()?;
    let tools = crate::real_vcluster::Tools::locate()?;
    let vcluster_images = crate::real_vcluster::images(&tools)?;
    let mut inputs = OperatorInputs::for_tests()?;
    inputs.vcluster_chart = chart.clone();
    let operator = crate::images::operator(&inputs)?;
    Ok(Built {
        chart,
        chart_sha256,
        vcluster_images,
        operator,
        inputs,
    })
}

/// Imports every image into the cluster's real node and relays the npm registry listening on
/// loopback at `registry_url` into the node's namespace at [`REGISTRY_PORT`].
pub fn prepare_node(
    cluster: &mut ControlPlane,
    built: &Built,
    registry_url: &str,
) -> Result<(), HarnessError> {
    let no_node = || HarnessError::Node("the control plane has no real node".into());
    let node = cluster.real_node().ok_or_else(no_node)?;
    node.import_by_digest(&built.operator)?;
    for image in &built.vcluster_images {
        node.import(&image.archive)?;
    }
    let upstream: u16 = registry_url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| HarnessError::Node(format!("no port in {registry_url}")))?;
    cluster
        .real_node_mut()
        .ok_or_else(no_node)?
        .relay("npm-relay", REGISTRY_PORT, upstream)
}

/// What [`install`] set up.
pub struct Installed {
    /// The state volume's folder on this machine (the claim `platform-operator-state`).
    pub state: PathBuf,
    /// The instances' storage root on the node.
    pub storage_root: PathBuf,
    /// The `--set` values `helm install` was given (the same serve a `helm upgrade`).
    pub sets: Vec<String>,
    /// How long from `helm install` to both Deployments' pods Ready.
    pub ready_after: Duration,
}

/// Creates the operator's namespaces and state volume, then `helm install`s the operator chart
/// with the built image and the real chart's digest, `extra_sets` last, and waits until every
/// pod of the release is Ready. Files the controller should read from the state volume (such as
/// a `--vcluster-extra-values` file) are written by `before_install` into the state folder.
pub fn install(
    cluster: &ControlPlane,
    built: &Built,
    extra_sets: &[String],
    before_install: impl FnOnce(&std::path::Path) -> Result<(), HarnessError>,
) -> Result<Installed, HarnessError> {
    for manifest in [
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n"
        ),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {CLEANUP_NAMESPACE}\n  \
             labels:\n    pod-security.kubernetes.io/enforce: privileged\n"
        ),
    ] {
        cluster.kubectl_ok(&["apply", "-f", "-"], Some(&manifest))?;
    }
    let storage_root = cluster.dir().join("instances");
    std::fs::create_dir_all(&storage_root).map_err(|e| HarnessError::io(&storage_root, e))?;
    let state = crate::chart::state_volume(cluster, NAMESPACE)?;
    before_install(&state)?;

    let mut sets = vec![
        format!("image.digest={}", built.operator.digest),
        "image.pullPolicy=Never".into(),
        format!(
            "npmRegistry=http://{}:{REGISTRY_PORT}/",
            crate::node_net::NODE_IP
        ),
        format!("storageRootBase={}", storage_root.display()),
        format!("cleanupNamespace={CLEANUP_NAMESPACE}"),
    ];
    sets.extend(extra_sets.iter().cloned());
    let chart = crate::chart::chart_dir().display().to_string();
    let mut args = vec!["install", RELEASE, chart.as_str(), "-n", NAMESPACE];
    for set in &sets {
        args.extend(["--set", set.as_str()]);
    }
    let started = Instant::now();
    Helm::with_kubeconfig(cluster.kubeconfig())?.ok(&args)?;
    wait_pods_ready(cluster, Duration::from_secs(180))?;
    Ok(Installed {
        state,
        storage_root,
        sets,
        ready_after: started.elapsed(),
    })
}

/// The `--set` that gives the controller the real chart's digest as its `extraArgs[index]`.
pub fn chart_digest_arg(built: &Built, index: usize) -> String {
    format!(
        "extraArgs[{index}]=--vcluster-chart-sha256=sha256:{}",
        built.chart_sha256
    )
}

/// Waits until the release's namespace has pods and every one is Ready.
pub fn wait_pods_ready(cluster: &ControlPlane, limit: Duration) -> Result<(), HarnessError> {
    let start = Instant::now();
    loop {
        let out = cluster.kubectl_ok(&["-n", NAMESPACE, "get", "pods", "-o", "json"], None)?;
        let pods: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        if items.len() >= 2 && items.iter().all(pod_ready) {
            return Ok(());
        }
        if start.elapsed() > limit {
            let wide = cluster
                .kubectl_ok(&["-n", NAMESPACE, "get", "pods", "-o", "wide"], None)
                .unwrap_or_default();
            return Err(HarnessError::Timeout {
                what: format!("the operator's pods Ready in {NAMESPACE}:\n{wide}"),
                after: limit,
            });
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether a pod (as `kubectl -o json` prints it) has condition Ready True.
pub fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}
