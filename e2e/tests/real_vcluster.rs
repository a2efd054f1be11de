//! The REAL vCluster on the real node (issue 29): the operator chart installed with the operator
//! image built from the `Dockerfile`, whose shipped chart path holds the **real** vCluster chart
//! (`../shared/vendor/vcluster`, 0.37.0-rc.1, the nearest release to the 0.37.3 the operator
//! pins that could be had) and whose controller is given that archive's digest
//! (`--vcluster-chart-sha256`, from `SHA256SUMS`). The syncer, its distro binaries and CoreDNS
//! run from images built here from source ([`e2e::real_vcluster`]); the node has a cluster DNS
//! that forwards nowhere ([`e2e::cluster_dns`]).
//!
//! One instance: the controller installs the real chart into its host namespace, the real syncer
//! starts the virtual control plane (kine, kube-apiserver, controller-manager) and exports its
//! kubeconfig Secret, the controller copies it to `<name>-kubeconfig` and runs the platform program
//! (the STAND-IN `@di-framework/platform`, from a local npm registry relayed into the node's
//! namespace) in an install pod of its own (as the chart runs every install), through the
//! in-cluster address that kubeconfig names; `pulumi` never runs in a controller's container. The test
//! then asks the vCluster's API itself (from the node's namespace, through `service/vcluster`)
//! for the objects the program applied. Prints the seconds from apply to `VClusterReady` and to
//! `Ready`, and the vCluster pod's memory as the kubelet reads it from its cgroups.
//!
//! The operator runs two controller replicas (issue 28). With the instance `Ready`, a `helm
//! upgrade` of the operator chart that rolls every operator pod, and then the deletion of the
//! Lease holder's pod, change nothing of the instance: the same control-plane pod with no restart,
//! the same kubeconfig Secret, no new Helm revision of its vCluster, no new `status.history`
//! entry and no new run of the platform program (Pulumi's update records on the state volume).
//!
//! The same install then proves issue 29's defects fixed on the real vCluster: the operator chart
//! is installed with `rbac.clusterAdmin=false` (Helm acts with the narrow ClusterRole, which must
//! hold every rule of the real chart's Role: defect 1) and a `--vcluster-extra-values` file (on
//! the state volume) renaming the syncer's ServiceAccount, under which the real syncer writes
//! `service/vcluster` at its first start through the admission policy, which refuses the chart's
//! default name for that account, `vc-vcluster` (defect 4). Then: the Deployment's pod template
//! patched as the syncer's certificate rotation does, and its strategy patched back to the chart's
//! `RollingUpdate` (which the controller puts back to `Recreate`), a watch counting the
//! control-plane pods (never two: defect 2); a NetworkPolicy made inside synced to the host
//! namespace, confined to the vCluster's pods and owned by nothing; `service/vcluster` deleted
//! under the operator's identity (an admin is refused), a Pod and a ConfigMap made inside keeping
//! their host copies, the same objects, while the controller restores the Service and restarts the
//! syncer (defect 3);
//! a helm upgrade of the vCluster killed while it waits, with the controller scaled to zero,
//! leaving the release `pending-upgrade`: the controller, back, stops the control plane before
//! it rolls back (defect 5).
//!
//! A second instance comes up meanwhile, and both are upgraded to a second chart version (the same
//! archive packaged again with `helm package --version`, given to the controller by a `helm
//! upgrade` of the operator chart): every object inside and every synced host object is kept, and
//! so are `service/vcluster` and the exported kubeconfig Secret `vc-vcluster` (owned by nothing),
//! the same UIDs, never two control-plane pods. Then the two are deleted with `deletionPolicy:
//! Delete` and `Retain` (the real vCluster's `state.db` and `pki/` removed, kept), and the second
//! is created again under its name: its control plane refuses the retained directory of the old
//! UID (`StorageConflict`) until the owner marker is removed as docs/operations.md says, and then
//! comes back on the retained sqlite database with the ConfigMap made inside before the deletion.
//!
//! Needs root, the Debian packages `e2e/run-tests.sh` installs for its real-node lane, and the
//! real vCluster's tools (`e2e/tools/build.sh vcluster`, which the test runs: cold, ~15 min).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e::chart::{Helm, chart_dir};
use e2e::cmd::run;
use e2e::images::OperatorInputs;
use e2e::real_vcluster::{
    COREDNS_IMAGE, DISTRO_IMAGE, NEXT_CHART_VERSION, NEXT_VCLUSTER_IMAGE, VCLUSTER_IMAGE,
};
use e2e::{ControlPlane, Options};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;

const RELEASE: &str = "platform-operator";
const NS: &str = "platform-operator";
const CLEANUP_NS: &str = "platform-operator-cleanup";
const TEAM: &str = "team-a";
const NAME: &str = "one";
/// The second instance (deletionPolicy Retain; the first is deleted with Delete).
const SECOND: &str = "two";
const VERSION: &str = "6.0.22";
/// The operator chart's controller Deployment, and the leader Lease its replicas share.
const CONTROLLER: &str = "platform-operator-controller";
/// Where the controller's pod mounts the state volume (`--state-dir`).
const STATE_MOUNT: &str = "/var/lib/platform-operator/state";
/// The npm registry's port on the node's addresses (relayed to the registry on loopback).
const REGISTRY_PORT: u16 = 4873;
/// The syncer's ServiceAccount as the test's `--vcluster-extra-values` renames it (no `vc-`
/// prefix: the policy before issue 29's fix let the syncer through by that prefix alone).
const SYNCER_ACCOUNT: &str = "syncer-renamed";
/// The operator's ServiceAccount (the chart's `platform-operator.controllerServiceAccount`).
const OPERATOR_USER: &str = "system:serviceaccount:platform-operator:platform-operator";
/// The annotation the syncer sets on `service/vcluster` at its first start (under its own
/// ServiceAccount; `pkg/util/servicecidr`).
const SERVICE_CIDR_ANNOTATION: &str = "vcluster.loft.sh/service-cidr";
/// The annotation the syncer's certificate rotation sets on its pod template
/// (`pkg/certs/watcher.go`).
const CERT_ROTATION_ANNOTATION: &str = "vcluster.loft.sh/cert-rotation-at";
/// The kinds the syncer writes into the host namespace (and stamps with the Service's UID).
const SYNCED_KINDS: &str = "pods,services,configmaps,secrets,endpoints,endpointslices,persistentvolumeclaims,networkpolicies";
/// The kinds compared inside a vCluster across an upgrade (what the program, the test and
/// vCluster itself made; not Events, Leases or Endpoints, which change by themselves).
const INSIDE_KINDS: &str =
    "namespaces,configmaps,secrets,serviceaccounts,services,deployments,pods,roles,rolebindings";
/// The labels of the control plane's pods (the chart's).
const CONTROL_PLANE_PODS: &str = "app=vcluster,release=vcluster";
/// The labels of the vCluster release's Helm records.
const RELEASE_RECORDS: &str = "owner=helm,name=vcluster";
/// The Helm record label the controller sets to the chart version it installed.
const CHART_VERSION_LABEL: &str = "platform.di-framework.dev/chart-version";
/// The ConfigMap the test makes inside the second instance before it is deleted with `Retain`.
const KEPT: &str = "made-before-retain";

fn kubectl(cluster: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    cluster
        .kubectl_ok(args, stdin)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn json(cluster: &ControlPlane, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(cluster, &all, None)).expect("kubectl prints JSON")
}

/// `kubectl args -o json`, or None when kubectl fails (such as a NotFound).
fn json_opt(cluster: &ControlPlane, args: &[&str]) -> Option<Value> {
    let mut cmd = cluster.kubectl();
    cmd.args(args).args(["-o", "json"]);
    let out = run(cmd, None).ok()?;
    out.success
        .then(|| serde_json::from_str(&out.stdout).ok())
        .flatten()
}

/// Whether `kubectl get` says the object is not there (NotFound; any other failure is no answer).
fn absent(cluster: &ControlPlane, args: &[&str]) -> bool {
    let mut cmd = cluster.kubectl();
    cmd.args(args);
    run(cmd, None).is_ok_and(|o| !o.success && o.stderr.contains("NotFound"))
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Every object of [`SYNCED_KINDS`] the syncer wrote into `namespace` (its marker label
/// `vcluster.loft.sh/managed-by`): kind/name -> (UID, the UIDs of its owners).
fn synced(cluster: &ControlPlane, namespace: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let list = json(
        cluster,
        &[
            "-n",
            namespace,
            "get",
            SYNCED_KINDS,
            "-l",
            "vcluster.loft.sh/managed-by=vcluster",
        ],
    );
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .map(|o| {
            let owners = o["metadata"]["ownerReferences"]
                .as_array()
                .map(|r| r.iter().map(|r| text(&r["uid"])).collect())
                .unwrap_or_default();
            (
                format!("{}/{}", text(&o["kind"]), text(&o["metadata"]["name"])),
                (text(&o["metadata"]["uid"]), owners),
            )
        })
        .collect()
}

/// `kubectl args`, its output or its error, for diagnostics.
fn show(cluster: &ControlPlane, args: &[&str]) -> String {
    let mut cmd = cluster.kubectl();
    cmd.args(args);
    match run(cmd, None) {
        Ok(o) => format!("$ kubectl {}\n{}{}\n", args.join(" "), o.stdout, o.stderr),
        Err(e) => format!("$ kubectl {}: {e}\n", args.join(" ")),
    }
}

/// Instance `name`, the pods and the logs that say why it is not there yet.
fn diagnostics(cluster: &ControlPlane, name: &str, host_ns: &str) -> String {
    let mut out = String::new();
    for args in [
        vec!["-n", TEAM, "get", "platforminstance", name, "-o", "yaml"],
        vec!["get", "pods", "-A", "-o", "wide"],
        vec!["-n", host_ns, "get", "events"],
        vec![
            "-n",
            host_ns,
            "logs",
            "deploy/vcluster",
            "-c",
            "syncer",
            "--tail=80",
        ],
        vec![
            "-n",
            NS,
            "logs",
            "-l",
            "app.kubernetes.io/component=controller",
            "--tail=60",
        ],
    ] {
        out.push_str(&show(cluster, &args));
    }
    out
}

fn wait_for(
    what: &str,
    limit: Duration,
    show: impl Fn() -> String,
    mut check: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}\n{}",
            show()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Condition `kind` of the instance, if it has one.
fn condition_of<'a>(pi: &'a Value, kind: &str) -> Option<&'a Value> {
    pi["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// The status of condition `kind` of the instance, if it has one.
fn condition(pi: &Value, kind: &str) -> Option<String> {
    condition_of(pi, kind).and_then(|c| c["status"].as_str().map(str::to_string))
}

/// The reason of condition `kind` of the instance, if it has one.
fn reason(pi: &Value, kind: &str) -> Option<String> {
    condition_of(pi, kind).and_then(|c| c["reason"].as_str().map(str::to_string))
}

/// Base64 `v`, decoded as UTF-8.
fn decode(v: &Value) -> String {
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64 data"))
            .expect("base64"),
    )
    .expect("UTF-8")
}

/// Every `image:` the real chart renders with the controller's values.
fn rendered_images(helm: &Helm, archive: &str, values: &str, host_ns: &str) -> BTreeSet<String> {
    let dir = std::env::temp_dir().join(format!("real-vcluster-values-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("values folder");
    let file = dir.join("values.yaml");
    std::fs::write(&file, values).expect("values");
    let file = file.display().to_string();
    let out = helm
        .run(&[
            "template",
            "vcluster",
            archive,
            "-n",
            host_ns,
            "--kube-version",
            "1.35.4",
            "--values",
            &file,
        ])
        .expect("helm runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.success,
        "helm template of the real chart: {}",
        out.stderr
    );
    out.stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image:"))
        .map(|i| i.trim().trim_matches('"').to_string())
        .collect()
}

/// The operator chart's pods of `component` (controller or webhook).
fn operator_pods(cluster: &ControlPlane, component: &str) -> Vec<Value> {
    let selector = format!("app.kubernetes.io/component={component}");
    json(cluster, &["-n", NS, "get", "pods", "-l", &selector])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The UIDs of `pods`.
fn uids(pods: &[Value]) -> BTreeSet<String> {
    pods.iter().map(|p| text(&p["metadata"]["uid"])).collect()
}

/// Who holds the controller's leader Lease (empty when nobody, or no answer).
fn holder(cluster: &ControlPlane) -> String {
    let mut cmd = cluster.kubectl();
    cmd.args([
        "-n",
        NS,
        "get",
        "lease",
        CONTROLLER,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    run(cmd, None)
        .ok()
        .and_then(|o| o.ok("lease").ok())
        .unwrap_or_default()
}

/// The vCluster release's Helm records in `host_ns`, oldest first: (revision, status, the chart
/// version the controller labelled it with, the record's name).
fn releases(cluster: &ControlPlane, host_ns: &str) -> Vec<(u32, String, String, String)> {
    let list = json(
        cluster,
        &["-n", host_ns, "get", "secrets", "-l", RELEASE_RECORDS],
    );
    let mut records: Vec<_> = list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let labels = &s["metadata"]["labels"];
            (
                text(&labels["version"]).parse().unwrap_or(0),
                text(&labels["status"]),
                text(&labels[CHART_VERSION_LABEL]),
                text(&s["metadata"]["name"]),
            )
        })
        .collect();
    records.sort();
    records
}

/// The pod template's `vClusterConfigHash` of `deployment/vcluster` (the chart's hash of its
/// values: two revisions of different values differ in it).
fn config_hash(deployment: &Value) -> String {
    text(&deployment["spec"]["template"]["metadata"]["annotations"]["vClusterConfigHash"])
}

/// `deployment/vcluster` in `host` has rolled out its current template to one ready pod.
fn rolled_out(cluster: &ControlPlane, host: &str) -> bool {
    json_opt(cluster, &["-n", host, "get", "deployment", "vcluster"]).is_some_and(|d| {
        let s = &d["status"];
        d["metadata"]["generation"] == s["observedGeneration"]
            && s["replicas"] == 1
            && s["updatedReplicas"] == 1
            && s["readyReplicas"] == 1
    })
}

/// `kubectl apply` of `manifest` (an instance), retried while the API server cannot call the
/// webhook yet (its Service has no ready endpoint in kube-proxy until a moment after the pod is
/// Ready, such as after the operator's pods were replaced); when it was admitted.
fn apply_admitted(cluster: &ControlPlane, manifest: &str) -> Instant {
    let mut applied = Instant::now();
    let refusal = std::cell::RefCell::new(String::new());
    wait_for(
        "the webhook to admit the instance",
        Duration::from_secs(60),
        || refusal.borrow().clone(),
        || {
            applied = Instant::now();
            let mut cmd = cluster.kubectl();
            cmd.args(["apply", "-f", "-"]);
            let out = run(cmd, Some(manifest)).expect("kubectl runs");
            assert!(
                out.success || out.stderr.contains("failed calling webhook"),
                "the instance was refused: {}",
                out.stderr
            );
            *refusal.borrow_mut() = out.stderr;
            out.success
        },
    );
    applied
}

/// One instance of the test: its name, its host namespace, and a file for the kubeconfig its
/// Secret holds.
struct Instance {
    name: &'static str,
    host_ns: String,
    kubeconfig: PathBuf,
}

impl Instance {
    fn new(cluster: &ControlPlane, name: &'static str) -> Self {
        Instance {
            name,
            host_ns: common::names::host_namespace(TEAM, name),
            kubeconfig: cluster.dir().join(format!("{name}.kubeconfig")),
        }
    }

    /// The manifest of the instance, with `deletionPolicy`.
    fn manifest(&self, deletion_policy: &str) -> String {
        format!(
            "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ \
             name: {}, namespace: {TEAM} }}\nspec:\n  version: {VERSION}\n  target: {{ type: \
             vcluster }}\n  deletionPolicy: {deletion_policy}\n",
            self.name
        )
    }

    fn get(&self, cluster: &ControlPlane) -> Value {
        json(cluster, &["-n", TEAM, "get", "platforminstance", self.name])
    }

    fn diagnostics(&self, cluster: &ControlPlane) -> String {
        diagnostics(cluster, self.name, &self.host_ns)
    }

    fn ready(&self, cluster: &ControlPlane) -> bool {
        condition(&self.get(cluster), "Ready").as_deref() == Some("True")
    }

    fn wait_ready(&self, cluster: &ControlPlane, what: &str, limit: Duration) {
        wait_for(
            what,
            limit,
            || self.diagnostics(cluster),
            || self.ready(cluster),
        );
    }

    /// The instance's storage directory on the node (the control plane's hostPath).
    fn storage(&self, storage_root: &Path) -> PathBuf {
        storage_root.join(common::names::storage_dir(TEAM, self.name, &self.host_ns))
    }

    /// Writes the kubeconfig the instance's Secret `<name>-kubeconfig` holds (the syncer's, as
    /// the controller copied it) to [`Instance::kubeconfig`]; returns it.
    fn save_kubeconfig(&self, cluster: &ControlPlane) -> String {
        let secret = common::names::kubeconfig_secret(self.name);
        let copied = json(cluster, &["-n", TEAM, "get", "secret", &secret]);
        let kubeconfig = decode(&copied["data"]["kubeconfig"]);
        std::fs::write(&self.kubeconfig, &kubeconfig).expect("kubeconfig file");
        kubeconfig
    }

    /// kubectl inside the vCluster with the saved kubeconfig, through `service/vcluster` from
    /// the node's namespace (the Service's address is read at each call: a restored Service has
    /// a new one).
    fn inside_run(&self, cluster: &ControlPlane, args: &[&str]) -> Result<String, String> {
        let service = json_opt(
            cluster,
            &["-n", &self.host_ns, "get", "service", "vcluster"],
        )
        .ok_or("no service/vcluster")?;
        let cluster_ip = text(&service["spec"]["clusterIP"]);
        let node = cluster.real_node().expect("the real node");
        let netns = node.netns().expect("the node's namespace");
        let kubectl = cluster.tools().bin("kubectl").display().to_string();
        let kc = format!("--kubeconfig={}", self.kubeconfig.display());
        let server = format!("--server=https://{cluster_ip}:443");
        let name = format!("--tls-server-name=vcluster.{}.svc", self.host_ns);
        let mut all = vec![kc.as_str(), server.as_str(), name.as_str()];
        all.extend_from_slice(args);
        netns.exec(&kubectl, &all).map_err(|e| e.to_string())
    }

    /// As [`Instance::inside_run`], its output as JSON; panics when kubectl fails.
    fn inside(&self, cluster: &ControlPlane, args: &[&str]) -> Value {
        let out = self
            .inside_run(cluster, args)
            .unwrap_or_else(|e| panic!("kubectl inside the vCluster of {}: {e}", self.name));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// Every object of [`INSIDE_KINDS`] inside the vCluster: kind/namespace/name -> UID.
    fn inside_objects(&self, cluster: &ControlPlane) -> Result<BTreeMap<String, String>, String> {
        let out = self.inside_run(cluster, &["get", INSIDE_KINDS, "-A", "-o", "json"])?;
        let list: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        Ok(items
            .iter()
            .map(|o| {
                let m = &o["metadata"];
                (
                    format!(
                        "{}/{}/{}",
                        text(&o["kind"]),
                        text(&m["namespace"]),
                        text(&m["name"])
                    ),
                    text(&m["uid"]),
                )
            })
            .collect())
    }

    /// The control plane's pods (objects, a terminating one too).
    fn control_planes(&self, cluster: &ControlPlane) -> Vec<Value> {
        let args = ["-n", &self.host_ns, "get", "pods", "-l", CONTROL_PLANE_PODS];
        json(cluster, &args)["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// What a restart or upgrade of the operator must leave as it is.
    fn untouched(&self, cluster: &ControlPlane, state: &Path) -> Untouched {
        let restarts = |p: &Value, key: &str| -> i64 {
            p["status"][key]
                .as_array()
                .map(|s| s.iter().filter_map(|c| c["restartCount"].as_i64()).sum())
                .unwrap_or(0)
        };
        let control_plane = self
            .control_planes(cluster)
            .iter()
            .map(|p| {
                let count = restarts(p, "containerStatuses") + restarts(p, "initContainerStatuses");
                (text(&p["metadata"]["uid"]), count)
            })
            .collect();
        let secret = common::names::kubeconfig_secret(self.name);
        let kubeconfig = json(cluster, &["-n", TEAM, "get", "secret", &secret]);
        let revisions = releases(cluster, &self.host_ns)
            .into_iter()
            .map(|r| r.3)
            .collect();
        // Pulumi's own record of each update it ran (install, upgrade, repair) in the instance's
        // backend on the state volume (`history/<project>/<stack>/`); a preview writes none.
        let history = state
            .join(TEAM)
            .join(self.name)
            .join("platform/state/.pulumi/history");
        let updates = files_under(&history, 2)
            .into_iter()
            .filter(|n| n.ends_with(".history.json"))
            .collect();
        Untouched {
            control_plane,
            kubeconfig_version: text(&kubeconfig["metadata"]["resourceVersion"]),
            revisions,
            history: self.get(cluster)["status"]["history"].clone(),
            updates,
        }
    }
}

/// The names of the files `depth` folders below `dir` (none when it is missing).
fn files_under(dir: &Path, depth: usize) -> Vec<String> {
    let entries = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok);
    entries
        .flat_map(|e| match depth {
            0 => vec![e.file_name().to_string_lossy().into_owned()],
            _ => files_under(&e.path(), depth - 1),
        })
        .collect()
}

/// What of an instance a restart or an upgrade of the operator must leave as it is.
#[derive(Debug, PartialEq)]
struct Untouched {
    /// The control-plane pods: UID and restarts of all their containers.
    control_plane: Vec<(String, i64)>,
    /// The resourceVersion of the Secret `<name>-kubeconfig`.
    kubeconfig_version: String,
    /// The Helm records of the vCluster release (one per revision).
    revisions: BTreeSet<String>,
    /// `status.history`.
    history: Value,
    /// The update records Pulumi wrote for the platform program's runs.
    updates: BTreeSet<String>,
}

/// Counts the control-plane pods of a host namespace from its start: the most pod objects at once
/// and the most not in a terminal phase. A pod that ended (Succeeded or Failed: its containers
/// have stopped) stays an object until the kubelet has released it, and the Deployment
/// controller's Recreate waits for the end, not the object: the first real run counted 2 objects
/// at once, the old one ended.
struct PodCount {
    seen: Arc<Mutex<Counted>>,
    task: tokio::task::JoinHandle<()>,
}

/// What a [`PodCount`] has seen.
#[derive(Debug, Default, Clone, Copy)]
struct Counted {
    /// Whether the watch has listed the pods there were at its start.
    listed: bool,
    /// The most pod objects at once.
    objects: usize,
    /// The most pods not in a terminal phase at once.
    running: usize,
}

impl PodCount {
    fn start(client: kube::Client, host_ns: &str) -> Self {
        let seen = Arc::new(Mutex::new(Counted::default()));
        let into = seen.clone();
        let pods: Api<Pod> = Api::namespaced(client, host_ns);
        let config = watcher::Config::default().labels(CONTROL_PLANE_PODS);
        let task = tokio::spawn(async move {
            let mut objects = BTreeMap::new();
            let mut events = watcher(pods, config).boxed();
            while let Some(event) = events.next().await {
                match event.expect("watching the control plane's pods") {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let ended = p
                            .status
                            .as_ref()
                            .and_then(|s| s.phase.as_deref())
                            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
                        objects.insert(p.metadata.uid.unwrap_or_default(), ended);
                    }
                    watcher::Event::Delete(p) => {
                        objects.remove(&p.metadata.uid.unwrap_or_default());
                    }
                    watcher::Event::InitDone => into.lock().expect("lock").listed = true,
                    // A restarted watch lists the pods again.
                    watcher::Event::Init => {
                        objects.clear();
                        continue;
                    }
                };
                let running = objects.values().filter(|ended| !**ended).count();
                let mut seen = into.lock().expect("lock");
                seen.objects = seen.objects.max(objects.len());
                seen.running = seen.running.max(running);
            }
        });
        PodCount { seen, task }
    }

    /// (the most pod objects at once, the most running at once).
    fn most(&self) -> (usize, usize) {
        let seen = *self.seen.lock().expect("lock");
        (seen.objects, seen.running)
    }

    /// Waits until the watch has listed the control plane's running pod.
    fn wait_listed(&self) {
        wait_for(
            "the watch to list the control plane's pod",
            Duration::from_secs(30),
            String::new,
            || {
                let seen = *self.seen.lock().expect("lock");
                seen.listed && seen.running == 1
            },
        );
    }
}

impl Drop for PodCount {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every version of `deployment/vcluster` of a host namespace from its start: its replicas and
/// its pod template's [`config_hash`].
struct Versions {
    seen: Arc<Mutex<Vec<(i32, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Versions {
    fn start(client: kube::Client, host_ns: &str) -> Self {
        let seen: Arc<Mutex<Vec<(i32, String)>>> = Arc::default();
        let into = seen.clone();
        let api: Api<Deployment> = Api::namespaced(client, host_ns);
        let config = watcher::Config::default().fields("metadata.name=vcluster");
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config).applied_objects().boxed();
            while let Some(d) = stream.next().await {
                let d = d.expect("watching deployment/vcluster");
                let spec = d.spec.unwrap_or_default();
                let hash = (spec.template.metadata.and_then(|m| m.annotations))
                    .and_then(|a| a.get("vClusterConfigHash").cloned())
                    .unwrap_or_default();
                into.lock()
                    .expect("lock")
                    .push((spec.replicas.unwrap_or(1), hash));
            }
        });
        Versions { seen, task }
    }

    fn seen(&self) -> Vec<(i32, String)> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for Versions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Pod UID → (a program run seen, the other Pulumi commands and `npm` seen).
type ToolsIn = BTreeMap<String, (bool, BTreeSet<String>)>;

/// The Pulumi commands that run the platform program.
const PROGRAM_RUNS: [&str; 4] = ["up", "preview", "destroy", "refresh"];

/// Where the platform program ran: every install pod in the operator's namespace (a watch on
/// the operator's pods there, by the label it puts on its install pods) and, for each pod in
/// whose cgroup a `pulumi` or `npm` process was seen (`/proc`, every 200 ms), whether one of
/// them ran the program ([`PROGRAM_RUNS`]) and what else they were.
struct ProgramRuns {
    install_pods: Arc<Mutex<BTreeMap<String, Pod>>>,
    /// Pod UID → (a program run seen, the other Pulumi commands and `npm` seen).
    pulumi_in: Arc<Mutex<ToolsIn>>,
    task: tokio::task::JoinHandle<()>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// The pod UID of a process's cgroup path on the node whose kubelet's cgroup root is `root`
/// (the cgroupfs layout: `/<root>/kubepods/<class>/pod<uid>/<container>`); processes of
/// other nodes (another test's) are not this node's.
fn pod_of(pid: &str, root: &str) -> Option<String> {
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let root = format!("/{root}/");
    groups
        .lines()
        .filter(|l| l.contains(&root))
        .find_map(|line| {
            line.split('/')
                .find_map(|part| part.strip_prefix("pod").filter(|uid| uid.len() == 36))
                .map(str::to_string)
        })
}

impl ProgramRuns {
    /// Watches the pods of the node whose kubelet's cgroup root is `cgroup_root`.
    fn start(client: kube::Client, cgroup_root: String) -> Self {
        let install_pods: Arc<Mutex<BTreeMap<String, Pod>>> = Arc::default();
        let into = install_pods.clone();
        let api: Api<Pod> = Api::namespaced(client, NS);
        let config = watcher::Config::default().labels(common::names::MANAGED_BY_SELECTOR);
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config).applied_objects().boxed();
            while let Some(p) = stream.next().await {
                let p = p.expect("watching the install pods");
                let uid = p.metadata.uid.clone().unwrap_or_default();
                into.lock().expect("lock").insert(uid, p);
            }
        });
        let pulumi_in: Arc<Mutex<ToolsIn>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (into, stopped) = (pulumi_in.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let entries = std::fs::read_dir("/proc").expect("/proc");
                for pid in entries.filter_map(Result::ok).map(|e| e.file_name()) {
                    let pid = pid.to_string_lossy();
                    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let args: Vec<String> = cmdline
                        .split(|b| *b == 0)
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect();
                    let name = args[0].rsplit('/').next().unwrap_or_default();
                    let npm = args
                        .iter()
                        .take(2)
                        .any(|a| a == "npm" || a.ends_with("/npm") || a.ends_with("npm-cli.js"));
                    if npm && let Some(pod) = pod_of(&pid, &cgroup_root) {
                        let mut seen = into.lock().expect("lock");
                        seen.entry(pod).or_default().1.insert("npm".into());
                    }
                    if name == "pulumi"
                        && let Some(pod) = pod_of(&pid, &cgroup_root)
                    {
                        let words: Vec<&str> = args[1..]
                            .iter()
                            .map(String::as_str)
                            .filter(|a| !a.starts_with('-') && !a.contains(['/', '=', '.']))
                            .take(2)
                            .collect();
                        let mut seen = into.lock().expect("lock");
                        let entry = seen.entry(pod).or_default();
                        if args.iter().any(|a| PROGRAM_RUNS.contains(&a.as_str())) {
                            entry.0 = true;
                        } else {
                            entry.1.insert(words.join(" "));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        ProgramRuns {
            install_pods,
            pulumi_in,
            task,
            stop,
        }
    }

    /// The program ran, only in install pods (none of `controllers`), each made as it ships
    /// with `image`; returns how many install pods there were, and the other Pulumi commands
    /// and `npm` seen outside them.
    fn check(&self, controllers: &BTreeSet<String>, image: &str) -> (usize, BTreeSet<String>) {
        let pods = self.install_pods.lock().expect("lock").clone();
        let pulumi_in = self.pulumi_in.lock().expect("lock").clone();
        let ran: BTreeSet<&String> = pulumi_in
            .iter()
            .filter(|(_, s)| s.0)
            .map(|(p, _)| p)
            .collect();
        assert!(
            !ran.is_empty(),
            "no run of the program was seen on the node: {pulumi_in:?}"
        );
        let stray: Vec<_> = ran.iter().filter(|p| !pods.contains_key(**p)).collect();
        assert!(
            stray.is_empty(),
            "the program ran in pods that are no install pod: {stray:?} (controllers: {controllers:?})"
        );
        let outside = pulumi_in
            .iter()
            .filter(|(p, _)| !pods.contains_key(*p))
            .flat_map(|(_, s)| s.1.iter().cloned())
            .collect();
        for pod in pods.values() {
            let spec = serde_json::to_value(pod.spec.clone()).expect("spec");
            assert_eq!(
                spec["serviceAccountName"], "platform-operator-install",
                "{spec}"
            );
            assert_eq!(spec["automountServiceAccountToken"], false, "{spec}");
            assert_eq!(spec["nodeName"], e2e::real_node::NODE_NAME, "{spec}");
            assert_eq!(spec["containers"][0]["image"], image, "{spec}");
            let claims: Vec<_> = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
                .collect();
            assert_eq!(claims, ["platform-operator-state"], "{spec}");
        }
        (pods.len(), outside)
    }
}

impl Drop for ProgramRuns {
    fn drop(&mut self) {
        self.task.abort();
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_live_on_the_real_vcluster_through_operator_restarts_upgrades_and_deletion() {
    // The real chart, checked against SHA256SUMS, and the images, built first (no cluster
    // needed): the syncer, the distro binaries and CoreDNS from source, the operator image with
    // the real chart at its shipped path.
    let built = Instant::now();
    let (chart, chart_sha) =
        e2e::real_vcluster::chart().unwrap_or_else(|e| panic!("the real chart: {e}"));
    let tools = e2e::real_vcluster::Tools::locate()
        .unwrap_or_else(|e| panic!("the real vCluster's tools: {e}"));
    let images =
        e2e::real_vcluster::images(&tools).unwrap_or_else(|e| panic!("the vCluster images: {e}"));
    let mut inputs = OperatorInputs::for_tests().unwrap_or_else(|e| panic!("image inputs: {e}"));
    inputs.vcluster_chart = chart.clone();
    let operator = e2e::images::operator(&inputs).unwrap_or_else(|e| panic!("operator image: {e}"));
    println!(
        "figure: vCluster, distro, CoreDNS and operator images built or taken from the cache in \
         {:.1} s",
        built.elapsed().as_secs_f64()
    );

    // The real chart, rendered with the values the controller installs it with, runs exactly
    // the images built here: the syncer, the distro image and the operator image (the storage
    // owner check).
    let host_ns = common::names::host_namespace(TEAM, NAME);
    let helm = Helm::offline().expect("helm for templates");
    // The test's --vcluster-extra-values: the syncer's ServiceAccount renamed (defect 4).
    let extra_values =
        format!("controlPlane:\n  advanced:\n    serviceAccount:\n      name: {SYNCER_ACCOUNT}\n");
    let extra_file = std::env::temp_dir().join(format!(
        "real-vcluster-extra-values-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&extra_file, &extra_values).expect("extra values");
    let mut print = std::process::Command::new(&inputs.controller);
    print.args([
        "--print-vcluster-values",
        &format!("{TEAM}/{NAME}"),
        "--cleanup-image",
        &operator.by_digest(),
        "--vcluster-extra-values",
        &extra_file.display().to_string(),
    ]);
    let values = run(print, None)
        .expect("controller runs")
        .ok("controller --print-vcluster-values")
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_file(&extra_file);
    let chart_path = chart.display().to_string();
    let wanted: BTreeSet<String> = [VCLUSTER_IMAGE, DISTRO_IMAGE, operator.by_digest().as_str()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        rendered_images(&helm, &chart_path, &values, &host_ns),
        wanted,
        "the images the real chart selects are the ones built here"
    );

    let started = Instant::now();
    let mut cluster = ControlPlane::start(Options::new("real-vcluster").real_node_with_dns())
        .await
        .unwrap_or_else(|e| panic!("control plane with a real node and its DNS: {e}"));
    println!(
        "figure: control plane, real node and cluster DNS up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    {
        let node = cluster.real_node().expect("the real node");
        node.import_by_digest(&operator)
            .unwrap_or_else(|e| panic!("importing the operator image: {e}"));
        for image in &images {
            node.import(&image.archive)
                .unwrap_or_else(|e| panic!("importing {}: {e}", image.name));
        }
    }
    // The stand-in platform package from the local registry, relayed into the node's namespace.
    let registry = e2e::npm::shared().unwrap_or_else(|e| panic!("npm registry: {e}"));
    let upstream = registry.port().expect("the registry's port");
    cluster
        .real_node_mut()
        .expect("the real node")
        .relay("npm-relay", REGISTRY_PORT, upstream)
        .unwrap_or_else(|e| panic!("npm relay: {e}"));
    let node_ip = e2e::node_net::NODE_IP;

    for manifest in [
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n"
        ),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {CLEANUP_NS}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: privileged\n"
        ),
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {TEAM}\n"),
    ] {
        kubectl(&cluster, &["apply", "-f", "-"], Some(&manifest));
    }
    let storage_root = cluster.dir().join("instances");
    std::fs::create_dir_all(&storage_root).expect("storage root");
    let state =
        e2e::chart::state_volume(&cluster, NS).unwrap_or_else(|e| panic!("state volume: {e}"));
    // The operator image carries no extra values and the chart has no value for them (they come
    // with the image): the file is put on the state volume, which the controller mounts.
    std::fs::write(state.join("vcluster-extra-values.yaml"), &extra_values)
        .expect("extra values on the state volume");

    // The operator chart, its controller given the real chart's digest, Helm acting with the
    // narrow ClusterRole platform-operator (rbac.clusterAdmin=false: defect 1, the API server
    // refuses a Role granting what its creator lacks) and the syncer's account renamed.
    // Two controller replicas (leader election), as issue 28 asks of the upgrade and failover.
    let chart_dir = chart_dir().display().to_string();
    let sets = [
        "replicaCount=2".to_string(),
        format!("image.digest={}", operator.digest),
        "image.pullPolicy=Never".into(),
        format!("npmRegistry=http://{node_ip}:{REGISTRY_PORT}/"),
        format!("storageRootBase={}", storage_root.display()),
        format!("cleanupNamespace={CLEANUP_NS}"),
        "rbac.clusterAdmin=false".into(),
        format!("extraArgs[0]=--vcluster-chart-sha256=sha256:{chart_sha}"),
        format!("extraArgs[1]=--vcluster-extra-values={STATE_MOUNT}/vcluster-extra-values.yaml"),
    ];
    let operator_helm = Helm::with_kubeconfig(cluster.kubeconfig()).expect("helm");
    // The operator release `verb` (install, upgrade) with the sets above and then `more`.
    let operator_release = |verb: &str, more: &[String]| {
        let mut args = vec![verb, RELEASE, chart_dir.as_str(), "-n", NS];
        for set in sets.iter().chain(more) {
            args.extend(["--set", set.as_str()]);
        }
        let out = operator_helm.run(&args).expect("helm runs");
        assert!(out.success, "helm {verb}: {}", out.stderr);
    };
    // Where the platform program runs, from before the operator starts.
    let node = cluster.real_node().expect("the real node");
    let cgroup_root = node
        .netns()
        .expect("the node's namespace")
        .name()
        .to_string();
    let runs = ProgramRuns::start(cluster.client().await.expect("client"), cgroup_root);
    operator_release("install", &[]);
    wait_for(
        "the controller and webhook pods Ready",
        Duration::from_secs(180),
        || diagnostics(&cluster, NAME, &host_ns),
        || {
            let (controllers, webhooks) = (
                operator_pods(&cluster, "controller"),
                operator_pods(&cluster, "webhook"),
            );
            controllers.len() == 2
                && !webhooks.is_empty()
                && controllers.iter().chain(&webhooks).all(ready)
        },
    );

    // One instance: apply, then time VClusterReady and Ready.
    let one = Instance::new(&cluster, NAME);
    let applied = apply_admitted(&cluster, &one.manifest("Retain"));
    let (mut vcluster_ready, mut all_ready) = (None, None);
    wait_for(
        "the instance Ready on the real vCluster",
        Duration::from_secs(900),
        || one.diagnostics(&cluster),
        || {
            let pi = one.get(&cluster);
            if vcluster_ready.is_none()
                && condition(&pi, "VClusterReady").as_deref() == Some("True")
            {
                vcluster_ready = Some(applied.elapsed());
            }
            if condition(&pi, "Ready").as_deref() == Some("True") {
                all_ready = Some(applied.elapsed());
            }
            all_ready.is_some()
        },
    );
    let vcluster_ready = vcluster_ready.expect("VClusterReady came before Ready");
    let all_ready = all_ready.expect("Ready");
    // The platform program ran in an install pod of its own (the chart's default), never in a
    // controller's container, and the pod and its request Secret are gone with the run.
    let controllers = uids(&operator_pods(&cluster, "controller"));
    let (installs, _) = runs.check(&controllers, &operator.by_digest());
    println!("install pods of the first install: {installs}");
    for kind in ["jobs", "secrets", "pods"] {
        let left = json(
            &cluster,
            &[
                "-n",
                NS,
                "get",
                kind,
                "-l",
                common::names::MANAGED_BY_SELECTOR,
            ],
        );
        assert_eq!(left["items"], serde_json::json!([]), "{kind} left: {left}");
    }
    assert_eq!(
        reason(&one.get(&cluster), "VClusterReady").as_deref(),
        Some("VClusterServing"),
        "{}",
        one.diagnostics(&cluster)
    );

    // The real syncer runs from the built image, its binaries copied from the distro image, on
    // the real node.
    let pods = json(
        &cluster,
        &["-n", &host_ns, "get", "pods", "-l", "app=vcluster"],
    );
    let pod = pods["items"][0].clone();
    assert_eq!(pod["spec"]["nodeName"], e2e::real_node::NODE_NAME);
    assert_eq!(pod["spec"]["containers"][0]["image"], VCLUSTER_IMAGE);
    assert_eq!(pod["spec"]["initContainers"][0]["image"], DISTRO_IMAGE);
    assert!(ready(&pod), "{pod}");
    let pod_name = pod["metadata"]["name"]
        .as_str()
        .expect("pod name")
        .to_string();
    let pod_uid = pod["metadata"]["uid"]
        .as_str()
        .expect("pod uid")
        .to_string();

    // Defect 1: Helm installed the real chart as the operator's ServiceAccount holding the
    // ClusterRole platform-operator only (no cluster-admin binding: it may not do everything).
    let mut can = cluster.kubectl();
    can.args([
        "auth",
        "can-i",
        "*",
        "*",
        "--all-namespaces",
        "--as",
        OPERATOR_USER,
    ]);
    let can = run(can, None).expect("kubectl runs");
    assert_eq!(can.stdout.trim(), "no", "the operator is no cluster admin");
    // Defect 4: the real syncer runs under the renamed ServiceAccount and wrote service/vcluster
    // at its first start (the service CIDR it detected), through the admission policy.
    assert_eq!(pod["spec"]["serviceAccountName"], SYNCER_ACCOUNT, "{pod}");
    let service = json(&cluster, &["-n", &host_ns, "get", "service", "vcluster"]);
    assert!(
        service["metadata"]["annotations"][SERVICE_CIDR_ANNOTATION]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "the syncer wrote its service CIDR on service/vcluster: {service}"
    );
    // The chart's default name for that account, `vc-vcluster` (which the policy before the fix
    // let through by its `vc-` prefix), is refused with these values: given the right to patch
    // Services in the host namespace, the policy alone decides (a server-side dry run).
    let default_account = format!("system:serviceaccount:{host_ns}:vc-vcluster");
    let grant = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{ name: e2e-services, \
         namespace: {host_ns} }}\nrules: [{{ apiGroups: [\"\"], resources: [services], verbs: [get, \
         patch] }}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{ \
         name: e2e-services, namespace: {host_ns} }}\nroleRef: {{ apiGroup: \
         rbac.authorization.k8s.io, kind: Role, name: e2e-services }}\nsubjects: [{{ kind: \
         ServiceAccount, name: vc-vcluster, namespace: {host_ns} }}]\n"
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&grant));
    let annotate = || {
        let mut annotate = cluster.kubectl();
        annotate.args([
            "-n",
            &host_ns,
            "annotate",
            "service",
            "vcluster",
            "--overwrite",
        ]);
        annotate.args(["probe=1", "--dry-run=server", "--as", &default_account]);
        run(annotate, None).expect("kubectl runs")
    };
    // RBAC refuses until the authorizer has seen the binding ("cannot get/patch resource").
    let annotated = std::cell::RefCell::new(annotate());
    wait_for(
        "the RoleBinding for vc-vcluster in force",
        Duration::from_secs(30),
        || annotated.borrow().stderr.clone(),
        || {
            *annotated.borrow_mut() = annotate();
            !annotated.borrow().stderr.contains("cannot ")
        },
    );
    let annotated = annotated.into_inner();
    assert!(
        !annotated.success
            && annotated
                .stderr
                .contains("managed by the platform operator"),
        "vc-vcluster may not change service/vcluster: {}{}",
        annotated.stdout,
        annotated.stderr
    );
    kubectl(&cluster, &["delete", "-f", "-"], Some(&grant));

    // The kubeconfig the syncer exported, as the controller copied it: the in-cluster address.
    let exported = json(&cluster, &["-n", &host_ns, "get", "secret", "vc-vcluster"]);
    assert_eq!(exported["metadata"]["labels"]["vcluster-name"], "vcluster");
    let kubeconfig = one.save_kubeconfig(&cluster);
    let server = format!("https://vcluster.{host_ns}.svc:443");
    assert!(
        kubeconfig.contains(&format!("server: {server}")),
        "{kubeconfig}"
    );
    assert_eq!(
        decode(&exported["data"]["certificate-authority"]).trim(),
        {
            let parsed: Value = serde_saphyr::from_str(&kubeconfig).expect("kubeconfig YAML");
            let ca = parsed["clusters"][0]["cluster"]["certificate-authority-data"].clone();
            decode(&ca).trim().to_string()
        },
        "the copied kubeconfig trusts the syncer's CA"
    );

    // Inside the vCluster, through service/vcluster from the node's namespace, with that
    // kubeconfig: the virtual API server is the harness's 1.35.4, and the platform program's
    // objects are there.
    let inside_run = |args: &[&str]| one.inside_run(&cluster, args);
    let inside = |args: &[&str]| one.inside(&cluster, args);
    let version = inside(&["get", "--raw", "/version"]);
    assert_eq!(version["gitVersion"], "v1.35.4", "{version}");
    let settings = inside(&[
        "-n",
        "di-platform",
        "get",
        "configmap",
        "platform-settings",
        "-o",
        "json",
    ]);
    assert_eq!(settings["data"]["packageVersion"], VERSION, "{settings}");
    assert_eq!(
        settings["metadata"]["labels"]["platform.di-framework.dev/stand-in"],
        "true"
    );
    let namespace = inside(&["get", "namespace", "di-platform", "-o", "json"]);
    assert_eq!(namespace["status"]["phase"], "Active");

    // vCluster's own CoreDNS, synced to the host namespace, runs from the built image.
    wait_for(
        "the vCluster's CoreDNS Ready on the host",
        Duration::from_secs(120),
        || one.diagnostics(&cluster),
        || {
            let pods = json(&cluster, &["-n", &host_ns, "get", "pods"]);
            pods["items"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|p| p["spec"]["containers"][0]["image"] == COREDNS_IMAGE && ready(p))
            })
        },
    );

    // The vCluster pod's memory, as the kubelet reads it from the pod's cgroups.
    let summary: Value = serde_json::from_str(&kubectl(
        &cluster,
        &[
            "get",
            "--raw",
            &format!(
                "/api/v1/nodes/{}/proxy/stats/summary",
                e2e::real_node::NODE_NAME
            ),
        ],
        None,
    ))
    .expect("summary JSON");
    let stats = summary["pods"]
        .as_array()
        .and_then(|pods| pods.iter().find(|p| p["podRef"]["uid"] == pod_uid.as_str()))
        .unwrap_or_else(|| panic!("no stats for {pod_name}: {summary}"));
    let mib = |v: &Value| v.as_f64().unwrap_or(0.0) / 1024.0 / 1024.0;
    let rss = mib(&stats["memory"]["rssBytes"]);
    let working_set = mib(&stats["memory"]["workingSetBytes"]);
    assert!(rss > 0.0, "the kubelet reads the pod's memory: {stats}");
    println!(
        "figure: real vCluster: apply to VClusterReady {:.1} s, to Ready {:.1} s",
        vcluster_ready.as_secs_f64(),
        all_ready.as_secs_f64()
    );
    println!(
        "figure: vCluster pod {pod_name}: RSS {rss:.1} MiB, working set {working_set:.1} MiB \
         (kubelet stats summary, from its cgroups)"
    );

    let client = cluster.client().await.expect("client");
    let instance_ready = |what: &str| one.wait_ready(&cluster, what, Duration::from_secs(300));
    // The control plane's one pod, Ready, and not `old`: its UID.
    let new_control_plane = |old: &str| -> Option<String> {
        let pods = one.control_planes(&cluster);
        let [pod] = pods.as_slice() else { return None };
        let uid = pod["metadata"]["uid"].as_str()?;
        (uid != old && ready(pod) && pod["metadata"]["deletionTimestamp"].is_null())
            .then(|| uid.to_string())
    };

    operator_restarts_change_nothing_of_a_ready_instance(&cluster, &one, &state, || {
        operator_release("upgrade", &["prometheus.scrapeAnnotations=false".into()])
    });

    // A second instance, `deletionPolicy: Retain`, started now so that it comes up while the
    // first is rotated and restored (the deletion policies are checked at the end).
    let two = Instance::new(&cluster, SECOND);
    apply_admitted(&cluster, &two.manifest("Retain"));

    // Defect 2: the syncer's certificate rotation patches its Deployment's pod template (a merge
    // patch of one annotation, `finishPendingRollout` in pkg/certs/watcher.go). The real rotation
    // fires only for certificates within 90 days of expiry (the syncer's are a year old at most
    // here), so the test patches as it does. A watch counts the control-plane pods: never two
    // running at once.
    let deployment = json(&cluster, &["-n", &host_ns, "get", "deployment", "vcluster"]);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    // Merge-patches deployment/vcluster with `patch` (`what`) while a watch counts the
    // control-plane pods, waits until a new pod (not `old`) is Ready, `done` holds and the instance
    // is Ready again, asserts that never two pods ran at once; the new pod's UID, the seconds to
    // it, and the most pod objects at once.
    let one_at_a_time = |old: &str, patch: &str, what: &str, done: &dyn Fn() -> bool| {
        let count = PodCount::start(client.clone(), &host_ns);
        count.wait_listed();
        let patched = Instant::now();
        let args = ["-n", &host_ns, "patch", "deployment", "vcluster"];
        kubectl(
            &cluster,
            &[&args[..], &["--type=merge", "-p", patch]].concat(),
            None,
        );
        let mut rolled = None;
        wait_for(
            &format!("{what}: the control plane's new pod Ready"),
            Duration::from_secs(300),
            || one.diagnostics(&cluster),
            || {
                rolled = new_control_plane(old);
                rolled.is_some() && done()
            },
        );
        let took = patched.elapsed();
        instance_ready(&format!("the instance Ready again after {what}"));
        std::thread::sleep(Duration::from_secs(2));
        let (objects, at_once) = count.most();
        drop(count);
        assert_eq!(at_once, 1, "{what}: two control-plane pods running at once");
        (rolled.expect("the new pod"), took, objects)
    };
    let rotation = format!(
        r#"{{"spec":{{"template":{{"metadata":{{"annotations":{{"{CERT_ROTATION_ANNOTATION}":"{}"}}}}}}}}}}"#,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
    );
    let (rotated_pod, rotated_in, objects) = one_at_a_time(
        &pod_uid,
        &rotation,
        "the pod template patched as the rotation does",
        &|| true,
    );
    let version = inside(&["get", "--raw", "/version"]);
    assert_eq!(version["gitVersion"], "v1.35.4", "{version}");
    println!(
        "figure: pod template patched as the certificate rotation does: new control plane Ready \
         in {:.1} s, at most 1 control-plane pod running at once ({objects} pod objects, the \
         ended one still held)",
        rotated_in.as_secs_f64()
    );

    // Defect 2, whoever patches the Deployment: its strategy patched back to the chart's
    // `RollingUpdate` with `maxSurge: 1` is put back to `Recreate` by the controller (a drift
    // upgrade of the release through its post-renderer, the control plane stopped before it),
    // and no two control-plane pods run meanwhile.
    let rolling = r#"{"spec":{"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}}}"#;
    let recreate = || {
        json_opt(&cluster, &["-n", &host_ns, "get", "deployment", "vcluster"])
            .is_some_and(|d| d["spec"]["strategy"] == serde_json::json!({"type": "Recreate"}))
    };
    let (control_plane, recreated_in, objects) = one_at_a_time(
        &rotated_pod,
        rolling,
        "the strategy patched to RollingUpdate, Recreate put back",
        &recreate,
    );
    println!(
        "figure: strategy patched to RollingUpdate (maxSurge 1): Recreate put back and the new \
         control plane Ready in {:.1} s, at most 1 control-plane pod running at once ({objects} \
         pod objects)",
        recreated_in.as_secs_f64()
    );

    // Defect 3: service/vcluster deleted. Inside the vCluster first: a ConfigMap and a bare Pod
    // using it (CoreDNS serving a Corefile from the ConfigMap), synced to the host namespace
    // beside what the syncer already syncs (its CoreDNS, Services, Endpoints, the certificates'
    // Secret). With the chart's default (setOwner true) all of it named the Service as owner: the
    // garbage collector deleted the host copies within seconds of the Service, and the running
    // syncer then deleted the virtual Pod and ConfigMap themselves (a host copy gone is taken for
    // a deletion: pods/syncer.go, configmaps/to_host_syncer.go), before any restore could act.
    // With them a NetworkPolicy (for pods `app: web`: none here), which the syncer writes into the
    // host namespace too (sync.toHost.networkPolicies, on in the controller's values).
    let manifest = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: keep, namespace: default }}\ndata:\n  \
         Corefile: |\n    .:1053 {{\n        whoami\n    }}\n---\napiVersion: v1\nkind: Pod\n\
         metadata: {{ name: keeper, namespace: default }}\nspec:\n  containers:\n    - name: dns\n      \
         image: {COREDNS_IMAGE}\n      imagePullPolicy: Never\n      args: [-conf, /etc/coredns/Corefile]\n      \
         volumeMounts: [{{ name: config, mountPath: /etc/coredns }}]\n  volumes:\n    - name: config\n      \
         configMap: {{ name: keep }}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {{ name: isolate, namespace: default, labels: {{ tenant: acme }} }}\nspec:\n  \
         podSelector: {{ matchLabels: {{ app: web }} }}\n  policyTypes: [Ingress]\n  ingress: [{{ \
         from: [{{ podSelector: {{}} }}] }}]\n"
    );
    let manifest_file = cluster.dir().join("inside-keep.yaml");
    std::fs::write(&manifest_file, &manifest).expect("manifest");
    inside(&[
        "apply",
        "-f",
        &manifest_file.display().to_string(),
        "-o",
        "json",
    ]);
    let host_pod = "keeper-x-default-x-vcluster";
    let host_config = "keep-x-default-x-vcluster";
    let host_policy = "isolate-x-default-x-vcluster";
    wait_for(
        "the Pod made inside Ready on the host",
        Duration::from_secs(120),
        || one.diagnostics(&cluster),
        || json_opt(&cluster, &["-n", &host_ns, "get", "pod", host_pod]).is_some_and(|p| ready(&p)),
    );
    // The NetworkPolicy's host copy: its labels kept, beside the syncer's marker and the virtual
    // namespace; its pod selector confined to the vCluster's pods of that namespace (an
    // unconfined one would select the host namespace's other pods); owned by nothing.
    let mut policy = None;
    wait_for(
        "the NetworkPolicy made inside synced to the host",
        Duration::from_secs(120),
        || one.diagnostics(&cluster),
        || {
            policy = json_opt(
                &cluster,
                &["-n", &host_ns, "get", "networkpolicy", host_policy],
            );
            policy.is_some()
        },
    );
    let policy = policy.expect("the synced NetworkPolicy");
    let labels = &policy["metadata"]["labels"];
    assert_eq!(labels["tenant"], "acme", "{policy}");
    assert_eq!(
        labels["vcluster.loft.sh/managed-by"], "vcluster",
        "{policy}"
    );
    assert_eq!(labels["vcluster.loft.sh/namespace"], "default", "{policy}");
    assert_eq!(
        policy["spec"]["podSelector"],
        serde_json::json!({"matchLabels": {
            "app": "web",
            "vcluster.loft.sh/managed-by": "vcluster",
            "vcluster.loft.sh/namespace": "default",
        }}),
        "{policy}"
    );
    assert!(policy["metadata"]["ownerReferences"].is_null(), "{policy}");
    let service = json(&cluster, &["-n", &host_ns, "get", "service", "vcluster"]);
    let old_service = service["metadata"]["uid"]
        .as_str()
        .expect("service uid")
        .to_string();
    let old_ip = service["spec"]["clusterIP"].clone();
    // Nothing the syncer wrote names the Service as its owner (experimental.syncSettings.setOwner
    // false): the garbage collector has nothing to take when it goes.
    let before = synced(&cluster, &host_ns);
    for name in [
        format!("Pod/{host_pod}"),
        format!("ConfigMap/{host_config}"),
        format!("NetworkPolicy/{host_policy}"),
    ] {
        assert!(before.contains_key(&name), "{name} is synced: {before:?}");
    }
    let owned = |m: &BTreeMap<String, (String, Vec<String>)>, uid: &str| -> Vec<String> {
        m.iter()
            .filter(|(_, (_, o))| o.iter().any(|o| o == uid))
            .map(|(k, _)| k.clone())
            .collect()
    };
    assert_eq!(
        owned(&before, &old_service),
        Vec::<String>::new(),
        "synced objects owned by service/vcluster"
    );
    // The protection policy refuses a cluster admin; the operator's own identity (a mistake, or
    // a cluster without admission policies) gets through.
    let mut refused = cluster.kubectl();
    refused.args([
        "-n",
        &host_ns,
        "delete",
        "service",
        "vcluster",
        "--dry-run=server",
    ]);
    let refused = run(refused, None).expect("kubectl runs");
    assert!(
        !refused.success
            && refused
                .stderr
                .contains("platform-operator-protect-vcluster-service"),
        "an admin's delete of service/vcluster is refused: {}{}",
        refused.stdout,
        refused.stderr
    );
    let deleted = Instant::now();
    kubectl(
        &cluster,
        &[
            "-n",
            &host_ns,
            "delete",
            "service",
            "vcluster",
            "--wait=false",
            "--as",
            OPERATOR_USER,
        ],
        None,
    );
    // Until the restore is recorded on the host namespace: when the host copies first vanished.
    let (mut pod_gone, mut config_gone, mut new_service) = (None, None, None);
    wait_for(
        "service/vcluster restored and recorded",
        Duration::from_secs(300),
        || one.diagnostics(&cluster),
        || {
            if pod_gone.is_none() && absent(&cluster, &["-n", &host_ns, "get", "pod", host_pod]) {
                pod_gone = Some(deleted.elapsed());
            }
            if config_gone.is_none()
                && absent(&cluster, &["-n", &host_ns, "get", "configmap", host_config])
            {
                config_gone = Some(deleted.elapsed());
            }
            let Some(ns) = json_opt(&cluster, &["get", "namespace", &host_ns]) else {
                return false;
            };
            let Some(svc) = json_opt(&cluster, &["-n", &host_ns, "get", "service", "vcluster"])
            else {
                return false;
            };
            let uid = svc["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let recorded = ns["metadata"]["annotations"][common::names::OWNER_SERVICE_ANNOTATION]
                .as_str()
                .is_some_and(|r| r.starts_with(&uid));
            if uid != old_service && recorded {
                new_service = Some(uid);
            }
            new_service.is_some()
        },
    );
    let new_service = new_service.expect("the new Service");
    let restored_in = deleted.elapsed();
    wait_for(
        "a new control plane Ready after the restore",
        Duration::from_secs(300),
        || one.diagnostics(&cluster),
        || new_control_plane(&control_plane).is_some(),
    );
    instance_ready("the instance Ready after the restore");
    let ready_in = deleted.elapsed();
    // The restarted syncer wrote the new Service at its start, as at its first.
    let service = json(&cluster, &["-n", &host_ns, "get", "service", "vcluster"]);
    let keeper_env = json_opt(&cluster, &["-n", &host_ns, "get", "pod", host_pod]).and_then(|p| {
        p["spec"]["containers"][0]["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == "KUBERNETES_SERVICE_HOST")
            .map(|e| e["value"].clone())
    });
    println!(
        "figure: service/vcluster's cluster IP before the delete {old_ip}, after the restore {}; \
         the Pod synced before has KUBERNETES_SERVICE_HOST {keeper_env:?}",
        service["spec"]["clusterIP"]
    );
    assert!(
        service["metadata"]["annotations"][SERVICE_CIDR_ANNOTATION].is_string(),
        "{service}"
    );
    // What was made inside: still there inside, and its host copies the same objects (same
    // UIDs), the Pod Ready.
    let survey = std::cell::RefCell::new(String::new());
    let same = |after: &BTreeMap<String, (String, Vec<String>)>, name: &str| {
        after.get(name).map(|a| &a.0) == before.get(name).map(|b| &b.0)
    };
    wait_for(
        "what was made inside to be there, the same objects synced",
        Duration::from_secs(120),
        || format!("{}\n{}", survey.borrow(), one.diagnostics(&cluster)),
        || {
            let vpod = inside_run(&["-n", "default", "get", "pod", "keeper", "-o", "json"]).ok();
            let vconfig =
                inside_run(&["-n", "default", "get", "configmap", "keep", "-o", "json"]).ok();
            let after = synced(&cluster, &host_ns);
            *survey.borrow_mut() = format!(
                "inside: pod keeper {}, configmap keep {}; synced before: {before:?}; after: \
                 {after:?}",
                if vpod.is_some() { "present" } else { "GONE" },
                if vconfig.is_some() { "present" } else { "GONE" },
            );
            vpod.is_some()
                && vconfig.is_some()
                && same(&after, &format!("Pod/{host_pod}"))
                && same(&after, &format!("ConfigMap/{host_config}"))
                && json_opt(&cluster, &["-n", &host_ns, "get", "pod", host_pod])
                    .is_some_and(|p| ready(&p))
        },
    );
    let after = synced(&cluster, &host_ns);
    let kept = before.keys().filter(|k| same(&after, k)).count();
    let again: Vec<_> = before
        .keys()
        .filter(|k| after.contains_key(*k) && !same(&after, k))
        .collect();
    let missing: Vec<_> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    let secs = |d: Option<Duration>| {
        d.map_or("never".to_string(), |d| {
            format!("after {:.1} s", d.as_secs_f64())
        })
    };
    println!(
        "figure: service/vcluster deleted: restored and recorded in {:.1} s, instance Ready in \
         {:.1} s; host copy of the Pod made inside gone {}, of its ConfigMap gone {}; of {} \
         synced objects {kept} kept (same UID), re-created {again:?}, not back {missing:?}",
        restored_in.as_secs_f64(),
        ready_in.as_secs_f64(),
        secs(pod_gone),
        secs(config_gone),
        before.len(),
    );
    assert!(
        pod_gone.is_none() && config_gone.is_none(),
        "the host copies were never deleted"
    );
    assert_eq!(owned(&after, &new_service), Vec::<String>::new());

    // The second instance Ready; a ConfigMap made inside it, to be found after the chart upgrade
    // and after the instance is deleted with `Retain` and created again.
    two.wait_ready(
        &cluster,
        "the second instance Ready",
        Duration::from_secs(600),
    );
    two.save_kubeconfig(&cluster);
    let kept_file = cluster.dir().join("inside-kept.yaml");
    std::fs::write(
        &kept_file,
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: {KEPT}, namespace: default }}\n\
             data:\n  made: before the chart upgrade and the Retain deletion\n"
        ),
    )
    .expect("manifest");
    let kept = two.inside(
        &cluster,
        &[
            "apply",
            "-f",
            &kept_file.display().to_string(),
            "-o",
            "json",
        ],
    );
    let kept_uid = text(&kept["metadata"]["uid"]);
    assert!(!kept_uid.is_empty(), "{kept}");

    // Defect 5: a pending upgrade recovered on the real vCluster.
    recovery_stops_the_control_plane_before_it_rolls_back(
        &cluster,
        &client,
        &one,
        &chart_path,
        &inputs.controller,
    );

    // The chart upgrade: the same real archive packaged as a second version onto the state
    // volume, whose syncer image is the one built here tagged with that version, given to the
    // controller by a helm upgrade of the operator chart (--vcluster-chart and its digest).
    let (next, next_sha) = e2e::real_vcluster::package_next_chart(helm.bin(), &state)
        .unwrap_or_else(|e| panic!("packaging the second chart version: {e}"));
    let next_name = next
        .file_name()
        .expect("archive name")
        .to_string_lossy()
        .into_owned();
    let mut wanted_next = wanted.clone();
    wanted_next.remove(VCLUSTER_IMAGE);
    wanted_next.insert(NEXT_VCLUSTER_IMAGE.to_string());
    assert_eq!(
        rendered_images(&helm, &next.display().to_string(), &values, &host_ns),
        wanted_next,
        "the second chart version selects the syncer image of its own version"
    );
    e2e::real_vcluster::tag_next_image(cluster.real_node().expect("the real node"))
        .unwrap_or_else(|e| panic!("tagging the syncer image: {e}"));
    chart_upgrade_keeps_everything_inside_and_synced(&cluster, &client, &[&one, &two], || {
        operator_release(
            "upgrade",
            &[
                "prometheus.scrapeAnnotations=false".into(),
                format!("extraArgs[0]=--vcluster-chart-sha256=sha256:{next_sha}"),
                format!("extraArgs[2]=--vcluster-chart={STATE_MOUNT}/{next_name}"),
            ],
        )
    });
    let kept_now = two.inside(
        &cluster,
        &["-n", "default", "get", "configmap", KEPT, "-o", "json"],
    );
    assert_eq!(text(&kept_now["metadata"]["uid"]), kept_uid, "{kept_now}");

    // Deletion: the first instance with `deletionPolicy: Delete`, the second with `Retain`. The
    // data the real vCluster wrote into each storage directory (kine's sqlite database
    // `state.db` and the certificates `pki/`) is there before; after, the first's is gone (the
    // cleanup Job), the second's kept.
    let data = |instance: &Instance| {
        let dir = instance.storage(&storage_root);
        (dir.join("state.db"), dir.join("pki"))
    };
    for instance in [&one, &two] {
        let (db, pki) = data(instance);
        assert!(
            db.is_file() && pki.join("ca.crt").is_file(),
            "{}: {db:?}, {pki:?}",
            instance.name
        );
    }
    kubectl(
        &cluster,
        &[
            "-n",
            TEAM,
            "patch",
            "platforminstance",
            NAME,
            "--type=merge",
            "-p",
            r#"{"spec":{"deletionPolicy":"Delete"}}"#,
        ],
        None,
    );
    let old_uid = text(&two.get(&cluster)["metadata"]["uid"]);
    let deleting = Instant::now();
    kubectl(
        &cluster,
        &[
            "-n",
            TEAM,
            "delete",
            "platforminstance",
            NAME,
            SECOND,
            "--wait=false",
        ],
        None,
    );
    wait_for(
        "both instances gone",
        Duration::from_secs(300),
        || one.diagnostics(&cluster),
        || {
            let list = json(&cluster, &["-n", TEAM, "get", "platforminstances"]);
            list["items"].as_array().is_some_and(Vec::is_empty)
        },
    );
    let (db, pki) = data(&one);
    assert!(
        !db.exists() && !pki.exists(),
        "Delete removed {db:?} and {pki:?}"
    );
    let (db, pki) = data(&two);
    assert!(
        db.is_file() && pki.join("ca.crt").is_file(),
        "Retain kept {db:?}, {pki:?}"
    );
    println!(
        "figure: both instances deleted in {:.1} s: Delete removed the real vCluster's state.db \
         and pki, Retain kept them",
        deleting.elapsed().as_secs_f64()
    );

    // The second instance created again under its name: another UID, so the retained directory's
    // owner marker names the old one and the real init container keeps the control plane off it
    // (StorageConflict) until the marker is removed, as docs/operations.md says to give the data
    // to the new instance. Then the vCluster comes back on the retained sqlite database: the
    // ConfigMap made inside before the deletion is there, the same object.
    let marker = two.storage(&storage_root).join(".platform-instance");
    let owner = std::fs::read_to_string(&marker).expect("the retained directory's owner marker");
    assert!(owner.starts_with(&old_uid), "{owner}");
    let recreated = apply_admitted(&cluster, &two.manifest("Retain"));
    let conflict = |pi: &Value| {
        pi["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["reason"] == "StorageConflict"))
    };
    wait_for(
        "the instance created again to report StorageConflict",
        Duration::from_secs(600),
        || two.diagnostics(&cluster),
        || conflict(&two.get(&cluster)),
    );
    let refused_in = recreated.elapsed();
    let new_uid = text(&two.get(&cluster)["metadata"]["uid"]);
    assert_ne!(new_uid, old_uid);
    assert_eq!(
        std::fs::read_to_string(&marker).expect("marker"),
        owner,
        "the marker of the old instance is left as it is"
    );
    assert!(db.is_file(), "the retained database is left as it is");
    std::fs::remove_file(&marker).expect("removing the owner marker");
    let consented = Instant::now();
    two.wait_ready(
        &cluster,
        "the instance created again Ready on the retained data",
        Duration::from_secs(600),
    );
    let ready_in = consented.elapsed();
    let claimed = std::fs::read_to_string(&marker).expect("the new owner marker");
    assert!(claimed.starts_with(&new_uid), "{claimed}");
    two.save_kubeconfig(&cluster);
    let kept_after = two.inside(
        &cluster,
        &["-n", "default", "get", "configmap", KEPT, "-o", "json"],
    );
    assert_eq!(
        text(&kept_after["metadata"]["uid"]),
        kept_uid,
        "the ConfigMap made inside before the deletion, the same object: {kept_after}"
    );
    println!(
        "figure: {SECOND} created again after Retain: StorageConflict {:.1} s after the apply; \
         owner marker removed, Ready {:.1} s later on the retained state.db (the ConfigMap made \
         inside before, same UID)",
        refused_in.as_secs_f64(),
        ready_in.as_secs_f64()
    );

    // Through restarts, upgrades, repairs and deletions: the program ran in install pods only.
    let (installs, outside) = runs.check(
        &uids(&operator_pods(&cluster, "controller")),
        &operator.by_digest(),
    );
    println!("install pods in all: {installs}");
    assert!(
        outside.is_empty(),
        "Pulumi or npm ran outside install pods (the key check and npm run in them): {outside:?}"
    );

    let node = cluster.real_node().expect("the real node");
    node.drain(&client, Duration::from_secs(60)).await;
}

/// Issue 28, on the real vCluster: with `one` Ready, `upgrade` (a helm upgrade of the operator
/// chart whose changed value rolls every operator pod) and then the deletion of the Lease
/// holder's pod change nothing of the instance ([`Untouched`]), checked every two seconds through
/// twenty seconds after a new replica leads (the new leader reconciles every instance as soon as
/// its caches are filled; the target poll is 10 s).
fn operator_restarts_change_nothing_of_a_ready_instance(
    cluster: &ControlPlane,
    one: &Instance,
    state: &Path,
    upgrade: impl FnOnce(),
) {
    let before = one.untouched(cluster, state);
    assert_eq!(before.control_plane.len(), 1, "{before:?}");
    assert!(
        !before.updates.is_empty()
            && !before.revisions.is_empty()
            && before.history.as_array().is_some_and(|h| !h.is_empty()),
        "the install left its Pulumi update, Helm revision and history entry: {before:?}"
    );
    let unchanged = |what: &str| {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            assert_eq!(
                one.untouched(cluster, state),
                before,
                "{what} changed the instance"
            );
            assert!(
                one.ready(cluster),
                "{what}: the instance is no longer Ready\n{}",
                one.diagnostics(cluster)
            );
            std::thread::sleep(Duration::from_secs(2));
        }
    };

    let old: BTreeSet<String> = uids(&operator_pods(cluster, "controller"))
        .union(&uids(&operator_pods(cluster, "webhook")))
        .cloned()
        .collect();
    let started = Instant::now();
    upgrade();
    let mut leader = String::new();
    wait_for(
        "every operator pod replaced and Ready, and a new one leading",
        Duration::from_secs(300),
        || one.diagnostics(cluster),
        || {
            let (controllers, webhooks) = (
                operator_pods(cluster, "controller"),
                operator_pods(cluster, "webhook"),
            );
            let fresh = |pods: &[Value]| {
                !pods.is_empty()
                    && pods
                        .iter()
                        .all(|p| ready(p) && !old.contains(&text(&p["metadata"]["uid"])))
            };
            leader = holder(cluster);
            controllers.len() == 2
                && fresh(&controllers)
                && fresh(&webhooks)
                && controllers
                    .iter()
                    .any(|p| p["metadata"]["name"] == leader.as_str())
        },
    );
    let rolled_in = started.elapsed();
    unchanged("helm upgrade of the operator chart");

    let standby: Vec<String> = operator_pods(cluster, "controller")
        .iter()
        .map(|p| text(&p["metadata"]["name"]))
        .filter(|n| *n != leader)
        .collect();
    let failover = Instant::now();
    kubectl(
        cluster,
        &["-n", NS, "delete", "pod", &leader, "--wait=false"],
        None,
    );
    let mut next = String::new();
    wait_for(
        "another controller pod to take the Lease",
        Duration::from_secs(120),
        || one.diagnostics(cluster),
        || {
            next = holder(cluster);
            !next.is_empty()
                && next != leader
                && operator_pods(cluster, "controller")
                    .iter()
                    .any(|p| p["metadata"]["name"] == next.as_str() && ready(p))
        },
    );
    let took = failover.elapsed();
    unchanged("the leader's failover");
    println!(
        "figure: operator chart upgraded with an instance Ready: both controller pods and the \
         webhook replaced and a new one leading in {:.1} s; leader pod {leader} deleted, {next} \
         ({}) holds the Lease {:.1} s later; neither changed the instance (control-plane pod, \
         kubeconfig Secret, Helm revisions, status.history, Pulumi updates, Ready)",
        rolled_in.as_secs_f64(),
        if standby.contains(&next) {
            "the replica standing by"
        } else {
            "the deleted pod's replacement"
        },
        took.as_secs_f64()
    );
}

/// Issue 29, defect 5, on the real vCluster: a helm upgrade of `one`'s release with other values
/// (a pod annotation: a new pod template), run as the controller runs it (as its ServiceAccount,
/// with its post-renderer, so `Recreate`) while the controller is scaled to zero, and killed once
/// it has changed the Deployment: the release is left `pending-upgrade` with the new template
/// running. The controller, scaled back, scales the control plane to zero before its rollback
/// brings the old template back (a watch records every version of the Deployment), at most one
/// control-plane pod runs at any time, and the instance is Ready again.
fn recovery_stops_the_control_plane_before_it_rolls_back(
    cluster: &ControlPlane,
    client: &kube::Client,
    one: &Instance,
    chart: &str,
    post_renderer: &Path,
) {
    let host = one.host_ns.as_str();
    let show = || one.diagnostics(cluster);
    kubectl(
        cluster,
        &["-n", NS, "scale", "deployment", CONTROLLER, "--replicas=0"],
        None,
    );
    wait_for(
        "the controller pods gone",
        Duration::from_secs(120),
        show,
        || operator_pods(cluster, "controller").is_empty(),
    );
    let deployed = config_hash(&json(
        cluster,
        &["-n", host, "get", "deployment", "vcluster"],
    ));
    let last = releases(cluster, host).pop().expect("a release record");
    assert_eq!(last.1, "deployed", "{last:?}");

    let helm_log = cluster.dir().join("interrupted-helm.log");
    let mut helm = Helm::with_kubeconfig(cluster.kubeconfig())
        .expect("helm")
        .command();
    // As the operator's ServiceAccount, as the controller runs helm: the policy lets only it
    // (and the syncer) patch service/vcluster, which the upgrade may do.
    helm.args(["upgrade", "vcluster", chart, "-n", host, "--reuse-values"])
        .args(["--kube-as-user", OPERATOR_USER])
        .args([
            "--set-string",
            "controlPlane.statefulSet.pods.annotations.e2e-interrupted=yes",
        ])
        .arg("--post-renderer")
        .arg(post_renderer)
        .args([
            "--post-renderer-args=post-render",
            "--wait",
            "--timeout",
            "10m",
            "--debug",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&helm_log).expect("helm's log"));
    let mut helm = helm.spawn().expect("helm starts");
    let started = Instant::now();
    loop {
        if let Some(status) = helm.try_wait().expect("helm") {
            panic!(
                "helm ended ({status}) before it changed the control plane's pod template: {}",
                std::fs::read_to_string(&helm_log).unwrap_or_default()
            );
        }
        let now = json_opt(cluster, &["-n", host, "get", "deployment", "vcluster"]);
        if now.is_some_and(|d| config_hash(&d) != deployed) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "helm never changed the control plane's pod template\n{}",
            show()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = helm.kill();
    let _ = helm.wait();
    let pending = releases(cluster, host).pop().expect("a release record");
    assert_eq!(
        pending.1,
        "pending-upgrade",
        "{pending:?}; helm said: {}",
        std::fs::read_to_string(&helm_log).unwrap_or_default()
    );
    wait_for(
        "the interrupted upgrade's control plane running",
        Duration::from_secs(300),
        show,
        || rolled_out(cluster, host),
    );

    let count = PodCount::start(client.clone(), host);
    count.wait_listed();
    let versions = Versions::start(client.clone(), host);
    wait_for(
        "the watch to list deployment/vcluster",
        Duration::from_secs(30),
        String::new,
        || !versions.seen().is_empty(),
    );
    let back = Instant::now();
    kubectl(
        cluster,
        &["-n", NS, "scale", "deployment", CONTROLLER, "--replicas=2"],
        None,
    );
    let rolled_back = |seen: &[(i32, String)]| seen.iter().position(|(_, h)| *h == deployed);
    wait_for(
        "the controller's rollback of the pending upgrade",
        Duration::from_secs(300),
        show,
        || rolled_back(&versions.seen()).is_some(),
    );
    let rolled_back_in = back.elapsed();
    let seen = versions.seen();
    let at = rolled_back(&seen).unwrap_or_default();
    assert!(
        seen[..at].iter().any(|(replicas, _)| *replicas == 0),
        "the pod template was rolled back before the control plane was stopped: {seen:?}"
    );
    wait_for(
        "the release deployed again and the instance Ready",
        Duration::from_secs(600),
        show,
        || {
            releases(cluster, host)
                .pop()
                .is_some_and(|r| r.0 > pending.0 && r.1 == "deployed")
                && rolled_out(cluster, host)
                && one.ready(cluster)
        },
    );
    let ready_in = back.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let (objects, at_once) = count.most();
    assert_eq!(at_once, 1, "two control-plane pods running at once");
    let logs = kubectl(
        cluster,
        &[
            "-n",
            NS,
            "logs",
            "-l",
            "app.kubernetes.io/component=controller",
            "--tail=-1",
        ],
        None,
    );
    assert!(
        logs.contains("recovering an interrupted helm release"),
        "{logs}"
    );
    // The Deployment's versions as replicas@template, each change once (`i` the interrupted
    // upgrade's template, `d` the deployed one the rollback brings back).
    let mut steps: Vec<String> = Vec::new();
    for (replicas, hash) in &versions.seen() {
        let template = if *hash == deployed { "d" } else { "i" };
        let step = format!("{replicas}@{template}");
        if steps.last() != Some(&step) {
            steps.push(step);
        }
    }
    println!(
        "figure: pending-upgrade recovered on the real vCluster: the controller, scaled back, \
         rolled back {:.1} s later, instance Ready after {:.1} s; deployment/vcluster went {} \
         (replicas@template: i the interrupted upgrade's, d the deployed one); at most \
         {at_once} control-plane pod running at once ({objects} pod objects)",
        rolled_back_in.as_secs_f64(),
        ready_in.as_secs_f64(),
        steps.join(" -> ")
    );
}

/// The UIDs of `service/vcluster` and of the Secret `vc-vcluster` (the kubeconfig the syncer
/// exports) in `host`, which an upgrade must keep; the Secret, like everything the syncer writes
/// (`setOwner: false`), names no owner.
fn service_and_export(cluster: &ControlPlane, host: &str) -> (String, String) {
    let service = json(cluster, &["-n", host, "get", "service", "vcluster"]);
    let export = json(cluster, &["-n", host, "get", "secret", "vc-vcluster"]);
    assert!(export["metadata"]["ownerReferences"].is_null(), "{export}");
    (
        text(&service["metadata"]["uid"]),
        text(&export["metadata"]["uid"]),
    )
}

/// Issue 29, the chart upgrade on the real vCluster: `upgrade` gives the controller the second
/// chart version; each of `instances` is upgraded to it (its release record labelled with it,
/// `service/vcluster` labelled with it, its control plane running the syncer image of that
/// version, Ready, `VClusterReady` for `VClusterServing`), never with two control-plane pods
/// running, and keeps every object inside ([`INSIDE_KINDS`]), every synced host object,
/// `service/vcluster` and the exported Secret `vc-vcluster` ([`service_and_export`]), the same
/// UIDs.
fn chart_upgrade_keeps_everything_inside_and_synced(
    cluster: &ControlPlane,
    client: &kube::Client,
    instances: &[&Instance],
    upgrade: impl FnOnce(),
) {
    type Uids = BTreeMap<String, String>;
    let kept_before: Vec<(String, String)> = instances
        .iter()
        .map(|i| service_and_export(cluster, &i.host_ns))
        .collect();
    let before: Vec<(Uids, Uids)> = instances
        .iter()
        .map(|i| {
            let inside = i
                .inside_objects(cluster)
                .unwrap_or_else(|e| panic!("inside {}: {e}", i.name));
            let synced: Uids = synced(cluster, &i.host_ns)
                .into_iter()
                .map(|(k, (uid, _))| (k, uid))
                .collect();
            assert!(
                !inside.is_empty() && !synced.is_empty(),
                "{}: {inside:?} {synced:?}",
                i.name
            );
            (inside, synced)
        })
        .collect();
    let counts: Vec<PodCount> = instances
        .iter()
        .map(|i| PodCount::start(client.clone(), &i.host_ns))
        .collect();
    for count in &counts {
        count.wait_listed();
    }

    let started = Instant::now();
    upgrade();
    let mut upgraded_in = Vec::new();
    for instance in instances {
        wait_for(
            &format!(
                "{} upgraded to chart {NEXT_CHART_VERSION} and Ready",
                instance.name
            ),
            Duration::from_secs(600),
            || instance.diagnostics(cluster),
            || {
                let host = instance.host_ns.as_str();
                let recorded = releases(cluster, host)
                    .pop()
                    .is_some_and(|r| r.1 == "deployed" && r.2 == NEXT_CHART_VERSION);
                let labelled = json_opt(cluster, &["-n", host, "get", "service", "vcluster"])
                    .is_some_and(|s| {
                        s["metadata"]["labels"]["chart"]
                            == format!("vcluster-{NEXT_CHART_VERSION}").as_str()
                    });
                let pods = instance.control_planes(cluster);
                let running = matches!(pods.as_slice(), [p] if ready(p)
                    && p["spec"]["containers"][0]["image"] == NEXT_VCLUSTER_IMAGE);
                recorded && labelled && running && instance.ready(cluster)
            },
        );
        upgraded_in.push(started.elapsed());
    }

    for (instance, (inside, synced_before)) in instances.iter().zip(&before) {
        let survey = std::cell::RefCell::new(String::new());
        wait_for(
            &format!(
                "every object inside {} and every synced one, the same",
                instance.name
            ),
            Duration::from_secs(120),
            || format!("{}\n{}", survey.borrow(), instance.diagnostics(cluster)),
            || {
                let now = instance.inside_objects(cluster).unwrap_or_default();
                let host: Uids = synced(cluster, &instance.host_ns)
                    .into_iter()
                    .map(|(k, (uid, _))| (k, uid))
                    .collect();
                let lost = |before: &Uids, after: &Uids| -> Vec<String> {
                    before
                        .iter()
                        .filter(|(k, uid)| after.get(*k) != Some(*uid))
                        .map(|(k, _)| k.clone())
                        .collect()
                };
                let (inside_lost, synced_lost) = (lost(inside, &now), lost(synced_before, &host));
                *survey.borrow_mut() = format!(
                    "not there or another object now: inside {inside_lost:?}, synced \
                     {synced_lost:?}"
                );
                inside_lost.is_empty() && synced_lost.is_empty()
            },
        );
    }
    for (instance, kept) in instances.iter().zip(&kept_before) {
        assert_eq!(
            &service_and_export(cluster, &instance.host_ns),
            kept,
            "{}: service/vcluster and secret/vc-vcluster, the same objects",
            instance.name
        );
        assert_eq!(
            reason(&instance.get(cluster), "VClusterReady").as_deref(),
            Some("VClusterServing"),
            "{}",
            instance.diagnostics(cluster)
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    for (instance, count) in instances.iter().zip(&counts) {
        let (_, at_once) = count.most();
        assert_eq!(
            at_once, 1,
            "{}: two control-plane pods running at once",
            instance.name
        );
    }
    let kept: Vec<String> = instances
        .iter()
        .zip(&before)
        .zip(&upgraded_in)
        .map(|((i, (inside, synced)), took)| {
            format!(
                "{} Ready on it {:.1} s after the helm upgrade, its {} objects inside and {} \
                 synced kept",
                i.name,
                took.as_secs_f64(),
                inside.len(),
                synced.len()
            )
        })
        .collect();
    println!(
        "figure: vCluster chart {} -> {NEXT_CHART_VERSION} through a helm upgrade of the operator \
         chart: {}; service/vcluster and secret/vc-vcluster the same objects; at most one \
         control-plane pod running at once",
        e2e::real_vcluster::CHART_VERSION,
        kept.join("; ")
    );
}
