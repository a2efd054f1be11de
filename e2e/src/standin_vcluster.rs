//! STAND-IN for the vCluster syncer, for the end-to-end tests: the real vCluster image does not
//! run on KWOK, and on a real node its pod runs the pause program ([`control_plane_images`]), so
//! the harness does what the syncer does at start-up and while it runs, for each release of the
//! stand-in chart (`e2e/standin-vcluster`, see its `STANDIN.md`):
//!
//! - **start-up**, when the control plane pod of a host namespace is ready (and again whenever a
//!   new pod replaces it): issues the serving certificate with exactly the names vCluster would
//!   serve ([`serving_names`]: `vcluster`, `vcluster.<host ns>`, the Service's ClusterIP, the pod
//!   IP, `localhost`, `127.0.0.1`, the `kubernetes.default` names and
//!   `controlPlane.proxy.extraSANs`), installs it in one SNI slot of the inside API server
//!   ([`crate::Options::standin_vcluster`]) and, once served, writes the exported kubeconfig into
//!   Secret `vc-vcluster`, owned by `service/vcluster` as `experimental.syncSettings.setOwner`
//!   says. The inside is reached on loopback, so the kubeconfig's server is the inside API server's
//!   address with `tls-server-name` set to the host of `exportKubeConfig.server`: a client checks
//!   the certificate against exactly the name the operator asked for. Started with an advertised
//!   server ([`StandInSyncer::start_advertising`]), the kubeconfig names that instead (a relay to
//!   the inside, such as `https://10.254.0.2:<port>` in a real node's namespace, where pods reach
//!   it), with the same `tls-server-name`.
//! - **NetworkPolicy sync**, only with `sync.toHost.networkPolicies.enabled`: every policy inside
//!   is written, translated as vCluster translates it ([`translate_network_policy`]), into the
//!   host namespace, owned by `service/vcluster`; host copies whose source is gone are deleted.
//!
//! One inside API server may stand for several instances of a test: each host namespace then
//! receives every NetworkPolicy of the shared inside.
//!
//! The host's control plane pods and `service/vcluster`s are read from watches (the Service is
//! read live once when a vCluster starts, as the real syncer does: a lagging watch could still
//! hold a deleted namespace's Service, whose uid as the export's owner would have the export
//! collected), and each pass
//! (every 250 ms) lists the policies inside and the synced host copies once for all vClusters, so
//! the syncer's load on the API servers does not grow with the number of vClusters it stands for
//! (as the real syncer's, one per vCluster with watches of its own, does not). The syncer runs on its own thread and
//! runtime, so a test blocking on kubectl does not stall it; its log is
//! `logs/standin-syncer.log` in the inside API server's folder.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::{ControlPlane, HarnessError};

/// The SNI certificate slots of an inside API server by default: how many vClusters it can stand
/// for at once ([`crate::Options::sni_slots`] sets another number).
pub const SNI_SLOTS: usize = 4;

/// The stand-in chart's version.
pub const CHART_VERSION: &str = "0.37.3-standin";

/// The image of the stand-in chart's control plane container at chart `version`: the real
/// chart's repository, tagged with the chart version as the real chart tags it.
pub fn control_plane_image(version: &str) -> String {
    format!("ghcr.io/loft-sh/vcluster-pro:{version}")
}

/// The stand-in chart's control plane image for a real node, [`CHART_VERSION`]'s
/// ([`control_plane_image`]): the pause program
/// ([`crate::images::pause_named`]), since this syncer does vCluster's work from the harness.
/// Its pod then runs as a real one: the kubelet mounts its volumes (the hostPath storage
/// directory among them) and runs its init containers, and it is Ready once started.
pub fn control_plane_images() -> Result<Vec<crate::images::BuiltImage>, HarnessError> {
    Ok(vec![crate::images::pause_named(&control_plane_image(
        CHART_VERSION,
    ))?])
}

/// The release name and the name of the control plane and its Service, as the operator installs.
const RELEASE: &str = "vcluster";

/// The field manager of everything the stand-in syncer writes on the host.
const MANAGER: &str = "vcluster-standin-syncer";

/// vCluster's label naming the virtual namespace of a synced object.
pub const NAMESPACE_LABEL: &str = "vcluster.loft.sh/namespace";
/// vCluster's label marking what one vCluster synced (value: the vCluster's name).
pub const MARKER_LABEL: &str = "vcluster.loft.sh/managed-by";
/// vCluster's annotation with the virtual name of a synced object.
pub const NAME_ANNOTATION: &str = "vcluster.loft.sh/object-name";
/// vCluster's annotation with the virtual namespace of a synced object.
pub const NAMESPACE_ANNOTATION: &str = "vcluster.loft.sh/object-namespace";
/// vCluster's annotation with the virtual UID of a synced object.
pub const UID_ANNOTATION: &str = "vcluster.loft.sh/object-uid";
/// The prefix of the pod labels vCluster derives from a virtual namespace's labels.
pub const NAMESPACE_LABEL_PREFIX: &str = "vcluster.loft.sh/ns-label";

/// The certificate and key files of SNI slot `slot` of the control plane in `dir`.
pub fn slot_files(dir: &Path, slot: usize) -> (PathBuf, PathBuf) {
    let pki = dir.join("pki");
    (
        pki.join(format!("sni-{slot}.crt")),
        pki.join(format!("sni-{slot}.key")),
    )
}

/// Packages the stand-in chart as `version` into `dir` and returns the archive.
pub fn package_chart(helm: &Path, dir: &Path, version: &str) -> Result<PathBuf, HarnessError> {
    let mut cmd = std::process::Command::new(helm);
    cmd.arg("package")
        .arg(crate::repo_root().join("e2e/standin-vcluster"))
        .arg("-d")
        .arg(dir)
        .args(["--version", version]);
    crate::cmd::run(cmd, None)?.ok("helm package e2e/standin-vcluster")?;
    Ok(dir.join(format!("vcluster-{version}.tgz")))
}

/// The names vCluster's serving certificate carries for a vCluster in `host_ns` (release
/// `vcluster`): the Service's short and namespaced names, its ClusterIP, the pod IP, localhost,
/// the loopback address, the in-cluster names of the API, and `extra_sans`. Nothing else: not
/// `vcluster.<host ns>.svc` unless `extra_sans` names it.
pub fn serving_names(
    host_ns: &str,
    cluster_ip: &str,
    pod_ip: &str,
    extra_sans: &[String],
) -> Vec<String> {
    let mut names: Vec<String> = [
        RELEASE.to_string(),
        format!("{RELEASE}.{host_ns}"),
        cluster_ip.to_string(),
        pod_ip.to_string(),
        "localhost".into(),
        "127.0.0.1".into(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
    ]
    .into_iter()
    .chain(extra_sans.iter().cloned())
    .filter(|n| !n.is_empty())
    .collect();
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// vCluster's name for a synced object: `<name>-x-<namespace>-x-vcluster`, and beyond 63
/// characters its first 52 characters, `-` and ten hex digits of the SHA-256 of the whole.
fn translated_name(name: &str, namespace: &str) -> String {
    safe_concat(&[name, "x", namespace, "x", RELEASE])
}

fn safe_concat(parts: &[&str]) -> String {
    let full = parts.join("-");
    if full.len() <= 63 {
        return full;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, full.as_bytes());
    let hex: String = digest.as_ref()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}-{hex}", &full[..52]).replace(".-", "-")
}

/// A label key of a virtual namespace as vCluster puts it on pods (and so into translated
/// namespace selectors): the prefix, the vCluster's name and a hash of the key.
fn namespace_label_key(key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest.as_ref()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    safe_concat(&[NAMESPACE_LABEL_PREFIX, RELEASE, "x", &hex])
}

/// A selector with every key turned by `key`.
fn map_selector(selector: &Value, key: impl Fn(&str) -> String) -> Value {
    let mut out = json!({});
    if let Some(labels) = selector["matchLabels"].as_object() {
        out["matchLabels"] = labels.iter().map(|(k, v)| (key(k), v.clone())).collect();
    }
    if let Some(expressions) = selector["matchExpressions"].as_array() {
        out["matchExpressions"] = expressions
            .iter()
            .map(|e| {
                let mut e = e.clone();
                if let Some(k) = e["key"].as_str() {
                    e["key"] = json!(key(k));
                }
                e
            })
            .collect();
    }
    out
}

fn with_label(mut selector: Value, key: &str, value: &str) -> Value {
    if !selector["matchLabels"].is_object() {
        selector["matchLabels"] = json!({});
    }
    selector["matchLabels"][key] = json!(value);
    selector
}

/// The peers of one rule, translated: pod selectors keep their keys, namespace selectors become
/// pod selectors on the namespace labels vCluster copies onto pods, and a peer without a
/// namespace selector is confined to the policy's own virtual namespace; IP blocks stay.
fn translate_peers(peers: &Value, namespace: &str) -> Value {
    let Some(peers) = peers.as_array() else {
        return Value::Null;
    };
    peers
        .iter()
        .map(|peer| {
            if peer["ipBlock"].is_object() {
                return json!({"ipBlock": peer["ipBlock"]});
            }
            let mut selector = map_selector(&peer["podSelector"], str::to_string);
            if peer["namespaceSelector"].is_object() {
                let ns = map_selector(&peer["namespaceSelector"], namespace_label_key);
                for (k, v) in ns["matchLabels"].as_object().into_iter().flatten() {
                    selector = with_label(selector, k, v.as_str().unwrap_or_default());
                }
                if let Some(e) = ns["matchExpressions"].as_array() {
                    let mut all = selector["matchExpressions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    all.extend(e.iter().cloned());
                    selector["matchExpressions"] = json!(all);
                }
            } else {
                selector = with_label(selector, NAMESPACE_LABEL, namespace);
            }
            json!({"podSelector": with_label(selector, MARKER_LABEL, RELEASE)})
        })
        .collect()
}

/// A NetworkPolicy written inside, as vCluster writes it into `host_ns`: the translated name,
/// the virtual labels plus vCluster's marker and namespace labels, the object annotations, and a
/// spec whose pod selectors are confined to the vCluster's pods of the policy's namespace.
pub fn translate_network_policy(
    virtual_policy: &Value,
    host_ns: &str,
    owner: Option<&Value>,
) -> Value {
    let meta = &virtual_policy["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let mut labels = meta["labels"].as_object().cloned().unwrap_or_default();
    labels.insert(MARKER_LABEL.into(), json!(RELEASE));
    labels.insert(NAMESPACE_LABEL.into(), json!(namespace));
    let mut annotations = meta["annotations"].as_object().cloned().unwrap_or_default();
    annotations.insert(NAME_ANNOTATION.into(), json!(name));
    annotations.insert(NAMESPACE_ANNOTATION.into(), json!(namespace));
    annotations.insert(UID_ANNOTATION.into(), meta["uid"].clone());
    let spec = &virtual_policy["spec"];
    let pod_selector = with_label(
        with_label(
            map_selector(&spec["podSelector"], str::to_string),
            NAMESPACE_LABEL,
            namespace,
        ),
        MARKER_LABEL,
        RELEASE,
    );
    let mut out_spec = json!({"podSelector": pod_selector});
    if spec["policyTypes"].is_array() {
        out_spec["policyTypes"] = spec["policyTypes"].clone();
    }
    for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
        if let Some(rules) = spec[direction].as_array() {
            out_spec[direction] = rules
                .iter()
                .map(|r| {
                    let mut rule = json!({});
                    if r["ports"].is_array() {
                        rule["ports"] = r["ports"].clone();
                    }
                    let translated = translate_peers(&r[peers], namespace);
                    if !translated.is_null() {
                        rule[peers] = translated;
                    }
                    rule
                })
                .collect();
        }
    }
    let mut metadata = json!({
        "name": translated_name(name, namespace),
        "namespace": host_ns,
        "labels": labels,
        "annotations": annotations,
    });
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": out_spec,
    })
}

/// The host of a server URL (`https://host:port/path`), brackets of an IPv6 literal removed.
fn url_host(server: &str) -> String {
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or_default().to_string();
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .to_string()
}

/// What the syncer knows: the pod each host namespace's vCluster last started in, the pod whose
/// certificate was written but is not served yet, and the host namespace of each SNI slot.
#[derive(Debug, Default)]
struct State {
    /// The instance namespaces whose host namespaces this syncer serves (`None`: every one).
    scope: Option<std::collections::BTreeSet<String>>,
    started: BTreeMap<String, String>,
    pending: BTreeMap<String, String>,
    slots: Vec<Option<String>>,
}

/// The inside API server's material the syncer needs.
#[derive(Clone)]
struct Inside {
    dir: PathBuf,
    server: String,
    /// The server the exported kubeconfig names instead of [`Inside::server`], when the inside
    /// is relayed to where its clients are.
    advertised: Option<String>,
    kubeconfig: PathBuf,
    ca_key: String,
}

/// The running stand-in syncer; stops (and joins its thread) on drop.
pub struct StandInSyncer {
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<State>>,
    thread: Option<std::thread::JoinHandle<()>>,
    log: PathBuf,
}

impl std::fmt::Debug for StandInSyncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInSyncer")
            .field("log", &self.log)
            .finish()
    }
}

impl StandInSyncer {
    /// Starts the syncer for the host cluster of `host_kubeconfig`, standing in front of `inside`
    /// (a control plane started with [`crate::Options::standin_vcluster`]).
    pub fn start(host_kubeconfig: &Path, inside: &ControlPlane) -> Result<Self, HarnessError> {
        Self::start_advertising(host_kubeconfig, inside, None)
    }

    /// As [`StandInSyncer::start`], the exported kubeconfigs naming `advertised` as their server
    /// (with the same `tls-server-name`) instead of the inside API server's loopback address:
    /// a relay to it that the clients reach, such as `https://10.254.0.2:<port>` in a real node's
    /// namespace ([`crate::node_net::Relay`]), for pods and the processes started there.
    pub fn start_advertising(
        host_kubeconfig: &Path,
        inside: &ControlPlane,
        advertised: Option<String>,
    ) -> Result<Self, HarnessError> {
        let ca_key_path = inside.dir().join("pki").join("ca.key");
        let ca_key =
            std::fs::read_to_string(&ca_key_path).map_err(|e| HarnessError::io(&ca_key_path, e))?;
        let inside = Inside {
            dir: inside.dir().to_path_buf(),
            server: inside.server().to_string(),
            advertised,
            kubeconfig: inside.kubeconfig().to_path_buf(),
            ca_key,
        };
        let log = inside.dir.join("logs").join("standin-syncer.log");
        let file = std::fs::File::create(&log).map_err(|e| HarnessError::io(&log, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut slots = 0;
        while slot_files(&inside.dir, slots).0.exists() {
            slots += 1;
        }
        if slots == 0 {
            return Err(HarnessError::Pki(format!(
                "{} has no SNI slots: start it with Options::standin_vcluster()",
                inside.dir.display()
            )));
        }
        let state = Arc::new(Mutex::new(State {
            slots: vec![None; slots],
            ..Default::default()
        }));
        let host_kubeconfig = host_kubeconfig.to_path_buf();
        let (stop2, state2) = (stop.clone(), state.clone());
        let thread = crate::process::spawn_on_own_runtime("standin-syncer", move || async move {
            run(host_kubeconfig, inside, stop2, state2, file).await;
        })
        .map_err(|e| HarnessError::io(Path::new("standin-syncer thread"), e))?;
        Ok(Self {
            stop,
            state,
            thread: Some(thread),
            log,
        })
    }

    /// Serves only the host namespaces of instances in `namespaces` from now on (a real vCluster
    /// syncer serves its own namespace only; tests that share one host API server each have a
    /// syncer of their own, which must leave the others' vClusters alone). Empty: none.
    pub fn serve_only(&self, namespaces: &[&str]) {
        if let Ok(mut s) = self.state.lock() {
            s.scope = Some(namespaces.iter().map(|n| n.to_string()).collect());
        }
    }

    /// Adds the host namespaces of instances in `namespace` to those served (after
    /// [`StandInSyncer::serve_only`]; without it every namespace is served already).
    pub fn serve(&self, namespace: &str) {
        if let Ok(mut s) = self.state.lock()
            && let Some(scope) = s.scope.as_mut()
        {
            scope.insert(namespace.to_string());
        }
    }

    /// Serves every host namespace again.
    pub fn serve_all(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.scope = None;
        }
    }

    /// The syncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for StandInSyncer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn client_for(
    kubeconfig: &Path,
    tls_server_name: Option<&str>,
) -> Result<kube::Client, String> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    if let Some(name) = tls_server_name {
        config.tls_server_name = Some(name.to_string());
    }
    config.read_timeout = Some(Duration::from_secs(10));
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Whether `pod` is a control plane pod: one a ReplicaSet controls. The labels alone are not
/// enough, as for the real syncer's Deployment: a tenant pod may carry them.
fn of_replica_set(pod: &Pod) -> bool {
    (pod.metadata.owner_references.iter().flatten())
        .any(|r| r.kind == "ReplicaSet" && r.controller == Some(true))
}

async fn run(
    host_kubeconfig: PathBuf,
    inside: Inside,
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<State>>,
    mut log: std::fs::File,
) {
    let mut say = |line: String| {
        let _ = writeln!(log, "{line}");
    };
    let (host, inner) = match (
        client_for(&host_kubeconfig, None).await,
        client_for(&inside.kubeconfig, None).await,
    ) {
        (Ok(h), Ok(i)) => (h, i),
        (h, i) => {
            say(format!("no clients: {:?} {:?}", h.err(), i.err()));
            return;
        }
    };
    // The host's control plane pods and Services from watches: a pass reads them from memory, so
    // its requests do not grow with the number of vClusters (a list per vCluster every 250 ms
    // loaded the API server in proportion to them, and made the benchmarks' provisioning time
    // grow with their square).
    let watched = Watched::start(&host);
    watched.ready().await;
    let mut last_error = String::new();
    while !stop.load(Ordering::SeqCst) {
        if let Err(e) = pass(&host, &inner, &inside, &state, &watched, &mut say).await
            && e != last_error
        {
            say(format!("error: {e}"));
            last_error = e;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The host's vCluster configs, control plane pods, `service/vcluster`s and host namespaces, kept
/// by watches.
struct Watched {
    configs: Store<Secret>,
    /// The operator's host namespaces (their annotation names the instance they serve).
    namespaces: Store<Namespace>,
    pods: Store<Pod>,
    services: Store<Service>,
    /// Each config's values as parsed, by namespace, with the resourceVersion they were read at.
    parsed: Mutex<BTreeMap<String, Parsed>>,
}

/// A config's resourceVersion and its values as parsed (or why they are not YAML).
type Parsed = (String, Result<Value, String>);

impl Watched {
    /// Starts the watches on the current runtime.
    fn start(host: &kube::Client) -> Self {
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;
        let (configs, configs_writer) = reflector::store();
        let config_watch = watcher::watcher(
            Api::<Secret>::all(host.clone()),
            watcher::Config::default().fields(&format!("metadata.name=vc-config-{RELEASE}")),
        );
        tokio::spawn(
            reflector::reflector(configs_writer, config_watch)
                .default_backoff()
                .for_each(|_| std::future::ready(())),
        );
        let (pods, pods_writer) = reflector::store();
        let (services, services_writer) = reflector::store();
        let pod_watch = watcher::watcher(
            Api::<Pod>::all(host.clone()),
            watcher::Config::default().labels(&format!("app=vcluster,release={RELEASE}")),
        );
        let service_watch = watcher::watcher(
            Api::<Service>::all(host.clone()),
            watcher::Config::default().fields(&format!("metadata.name={RELEASE}")),
        );
        tokio::spawn(
            reflector::reflector(pods_writer, pod_watch)
                .default_backoff()
                .for_each(|_| std::future::ready(())),
        );
        tokio::spawn(
            reflector::reflector(services_writer, service_watch)
                .default_backoff()
                .for_each(|_| std::future::ready(())),
        );
        let (namespaces, namespaces_writer) = reflector::store();
        let namespace_watch = watcher::watcher(
            Api::<Namespace>::all(host.clone()),
            watcher::Config::default().labels(common::names::HOST_NAMESPACE_LABEL),
        );
        tokio::spawn(
            reflector::reflector(namespaces_writer, namespace_watch)
                .default_backoff()
                .for_each(|_| std::future::ready(())),
        );
        Self {
            configs,
            namespaces,
            pods,
            services,
            parsed: Mutex::new(BTreeMap::new()),
        }
    }

    /// The values of vCluster config `secret` (parsed again only when it changed).
    fn values(&self, secret: &Secret) -> Result<Value, String> {
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let Ok(mut parsed) = self.parsed.lock() else {
            return Err("the syncer's parse cache is poisoned".into());
        };
        if let Some((v, values)) = parsed.get(&ns)
            && *v == version
        {
            return values.clone();
        }
        let text = secret
            .data
            .as_ref()
            .and_then(|d| d.get("config.yaml"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default();
        let values = serde_saphyr::from_str::<Value>(&text)
            .map_err(|e| format!("the vCluster config is not YAML: {e}"));
        parsed.insert(ns, (version, values.clone()));
        values
    }

    /// Waits until every watch has listed once.
    async fn ready(&self) {
        let _ = self.configs.wait_until_ready().await;
        let _ = self.pods.wait_until_ready().await;
        let _ = self.services.wait_until_ready().await;
        let _ = self.namespaces.wait_until_ready().await;
    }

    /// The namespace of the instance that host namespace `ns` serves (from the operator's
    /// annotation `namespace/name`), if the watch shows one.
    fn owner(&self, ns: &str) -> Option<String> {
        let namespace = self.namespaces.get(&ObjectRef::new(ns))?;
        let instance = namespace
            .metadata
            .annotations
            .as_ref()?
            .get(common::names::INSTANCE_ANNOTATION)?;
        Some(instance.split('/').next()?.to_string())
    }

    /// The control plane pods by host namespace.
    fn pods_by_namespace(&self) -> BTreeMap<String, Vec<Arc<Pod>>> {
        let mut by_ns: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for pod in self.pods.state().into_iter().filter(|p| of_replica_set(p)) {
            by_ns
                .entry(pod.metadata.namespace.clone().unwrap_or_default())
                .or_default()
                .push(pod);
        }
        by_ns
    }

    /// `service/vcluster` of `ns`.
    fn service(&self, ns: &str) -> Option<Service> {
        self.services
            .get(&ObjectRef::new(RELEASE).within(ns))
            .map(|s| (*s).clone())
    }
}

/// What one pass reads once for every vCluster: the policies inside (one inside API server stands
/// for every vCluster of a test) and the host copies synced so far, by host namespace.
#[derive(Default)]
struct Policies {
    inside: Option<Vec<NetworkPolicy>>,
    synced: BTreeMap<String, Vec<NetworkPolicy>>,
}

impl Policies {
    async fn read(host: &kube::Client, inner: &kube::Client) -> Result<Self, String> {
        let inside = Api::<NetworkPolicy>::all(inner.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing NetworkPolicies inside: {e}"))?
            .items;
        let mut synced: BTreeMap<String, Vec<NetworkPolicy>> = BTreeMap::new();
        for policy in Api::<NetworkPolicy>::all(host.clone())
            .list(&ListParams::default().labels(&format!("{MARKER_LABEL}={RELEASE}")))
            .await
            .map_err(|e| format!("listing synced NetworkPolicies: {e}"))?
            .items
        {
            synced
                .entry(policy.metadata.namespace.clone().unwrap_or_default())
                .or_default()
                .push(policy);
        }
        Ok(Self {
            inside: Some(inside),
            synced,
        })
    }
}

/// One look at every stand-in release on the host.
async fn pass(
    host: &kube::Client,
    inner: &kube::Client,
    inside: &Inside,
    state: &Arc<Mutex<State>>,
    watched: &Watched,
    say: &mut impl FnMut(String),
) -> Result<(), String> {
    let scope = state.lock().ok().and_then(|s| s.scope.clone());
    // A host namespace is served when its instance's namespace (from the operator's annotation)
    // is in scope; a namespace the watch has not shown yet waits for a later pass.
    let served = |ns: &str| {
        scope.as_ref().is_none_or(|scope| {
            watched
                .owner(ns)
                .is_some_and(|owner| scope.contains(&owner))
        })
    };
    let configs: Vec<Arc<Secret>> = watched
        .configs
        .state()
        .into_iter()
        .filter(|s| s.metadata.namespace.as_deref().is_some_and(served))
        .collect();
    let live: Vec<String> = configs
        .iter()
        .filter_map(|s| s.metadata.namespace.clone())
        .collect();
    if let Ok(mut s) = state.lock() {
        // A namespace whose release is gone frees its slot.
        for slot in s.slots.iter_mut() {
            if slot.as_ref().is_some_and(|ns| !live.contains(ns)) {
                *slot = None;
            }
        }
        s.started.retain(|ns, _| live.contains(ns));
        s.pending.retain(|ns, _| live.contains(ns));
    }
    // One namespace's trouble (its Service deleted, say) holds up no other.
    let mut errors = Vec::new();
    let pods = watched.pods_by_namespace();
    let mut policies = Policies::default();
    for secret in configs {
        let Some(ns) = secret.metadata.namespace.clone() else {
            continue;
        };
        let result = match watched.values(&secret) {
            Ok(values) => {
                let seen = Seen {
                    pods: pods.get(&ns).map(Vec::as_slice).unwrap_or_default(),
                    service: watched.service(&ns),
                };
                one(
                    host,
                    inner,
                    inside,
                    state,
                    &ns,
                    &values,
                    &seen,
                    &mut policies,
                    say,
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            errors.push(format!("{ns}: {e}"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The values of `policies.podSecurityStandard` vCluster's syncer starts with (empty: none).
pub const POD_SECURITY_LEVELS: [&str; 4] = ["", "privileged", "baseline", "restricted"];

/// vCluster's config validation at start-up: the chart's schema takes any string for the level,
/// the syncer refuses to start on any but [`POD_SECURITY_LEVELS`] (and so exports nothing).
pub fn check_pod_security(values: &Value) -> Result<(), String> {
    let level = &values["policies"]["podSecurityStandard"];
    match level.as_str() {
        Some(l) if POD_SECURITY_LEVELS.contains(&l) => Ok(()),
        None if level.is_null() => Ok(()),
        _ => Err(format!(
            "the syncer does not start: policies.podSecurityStandard {level} is none of privileged, baseline, restricted"
        )),
    }
}

/// What the watches show of one host namespace.
struct Seen<'a> {
    pods: &'a [Arc<Pod>],
    service: Option<Service>,
}

#[allow(clippy::too_many_arguments)]
async fn one(
    host: &kube::Client,
    inner: &kube::Client,
    inside: &Inside,
    state: &Arc<Mutex<State>>,
    ns: &str,
    values: &Value,
    seen: &Seen<'_>,
    policies: &mut Policies,
    say: &mut impl FnMut(String),
) -> Result<(), String> {
    check_pod_security(values)?;
    let existing: Vec<&Pod> = seen
        .pods
        .iter()
        .map(Arc::as_ref)
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded") | Some("Failed"))
        })
        .collect();
    let ready = existing.iter().find(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().is_some_and(|s| {
                s.pod_ip.is_some()
                    && s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            })
    });
    let Some(pod) = ready else {
        return Ok(());
    };
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    let (started, pending) = state
        .lock()
        .ok()
        .map(|s| (s.started.get(ns).cloned(), s.pending.get(ns).cloned()))
        .unwrap_or_default();
    let set_owner = values["experimental"]["syncSettings"]["setOwner"]
        .as_bool()
        .unwrap_or(true);
    let starting = started.as_deref() != Some(pod_uid.as_str());
    // At start-up the real syncer reads its Service from the API server. The watch may still
    // hold the Service of a namespace deleted and created again under the same name: an export
    // owned by that dead uid would be collected at once by the garbage collector, and never
    // written again. So the start-up path reads it live; the steady path (policies, re-synced
    // every pass) takes the watch's copy.
    let service = if starting {
        Api::<Service>::namespaced(host.clone(), ns)
            .get_opt(RELEASE)
            .await
            .map_err(|e| format!("reading service/{RELEASE}: {e}"))?
    } else {
        seen.service.clone()
    };
    let owner = match (&service, set_owner) {
        (Some(svc), true) => Some(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "name": RELEASE,
            "uid": svc.metadata.uid.clone().unwrap_or_default(),
        })),
        (None, true) => {
            return Err(format!(
                "service/{RELEASE} is missing; vCluster cannot set it as the owner of what it syncs"
            ));
        }
        _ => None,
    };
    if starting {
        if pending.as_deref() == Some(pod_uid.as_str()) {
            if served(inside, ns).await {
                export(host, inside, ns, owner.as_ref(), values).await?;
                if let Ok(mut s) = state.lock() {
                    s.pending.remove(ns);
                    s.started.insert(ns.to_string(), pod_uid);
                }
                say(format!(
                    "the vCluster of {ns} serves and exported its kubeconfig"
                ));
            }
        } else {
            start(inside, state, ns, pod, service.as_ref(), values, say)?;
        }
        return Ok(());
    }
    if values["sync"]["toHost"]["networkPolicies"]["enabled"].as_bool() == Some(true) {
        if policies.inside.is_none() {
            *policies = Policies::read(host, inner).await?;
        }
        sync_network_policies(host, policies, ns, owner.as_ref()).await?;
    }
    Ok(())
}

/// vCluster's start-up, first half: the serving certificate for the pod now running, written
/// into the namespace's SNI slot (the inside API server picks it up when the file changes).
fn start(
    inside: &Inside,
    state: &Arc<Mutex<State>>,
    ns: &str,
    pod: &Pod,
    service: Option<&Service>,
    values: &Value,
    say: &mut impl FnMut(String),
) -> Result<(), String> {
    let pod_ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    let cluster_ip = service
        .and_then(|s| s.spec.as_ref()?.cluster_ip.clone())
        .unwrap_or_default();
    let extra: Vec<String> = values["controlPlane"]["proxy"]["extraSANs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    let names = serving_names(ns, &cluster_ip, &pod_ip, &extra);
    let mut s = state.lock().map_err(|_| "state poisoned".to_string())?;
    let slot = match s.slots.iter().position(|x| x.as_deref() == Some(ns)) {
        Some(i) => i,
        None => {
            let free = s.slots.iter().position(Option::is_none).ok_or_else(|| {
                format!(
                    "all {} SNI slots of the inside API server are in use",
                    s.slots.len()
                )
            })?;
            s.slots[free] = Some(ns.to_string());
            free
        }
    };
    let (cert, key) =
        crate::pki::serving_certificate(&inside.ca_key, &names).map_err(|e| e.to_string())?;
    let (cert_file, key_file) = slot_files(&inside.dir, slot);
    std::fs::write(&key_file, key).map_err(|e| format!("{}: {e}", key_file.display()))?;
    std::fs::write(&cert_file, cert).map_err(|e| format!("{}: {e}", cert_file.display()))?;
    s.pending
        .insert(ns.to_string(), pod.metadata.uid.clone().unwrap_or_default());
    say(format!(
        "starting the vCluster of {ns} (pod {}, slot {slot}) serving {names:?}",
        pod.metadata.name.clone().unwrap_or_default()
    ));
    Ok(())
}

/// The inside API server answers a client that asks for `vcluster.<ns>`, a name only the
/// namespace's certificate carries.
async fn served(inside: &Inside, ns: &str) -> bool {
    let Ok(probe) = client_for(&inside.kubeconfig, Some(&format!("{RELEASE}.{ns}"))).await else {
        return false;
    };
    tokio::time::timeout(Duration::from_secs(3), probe.apiserver_version())
        .await
        .is_ok_and(|r| r.is_ok())
}

/// vCluster's start-up, second half: the exported kubeconfig in its Secret, owned by
/// `service/vcluster` when `setOwner`.
async fn export(
    host: &kube::Client,
    inside: &Inside,
    ns: &str,
    owner: Option<&Value>,
    values: &Value,
) -> Result<(), String> {
    let kubeconfig = exported_kubeconfig(inside, values)?;
    let secret_name = values["exportKubeConfig"]["secret"]["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map_or_else(|| format!("vc-{RELEASE}"), String::from);
    let mut metadata = json!({"name": secret_name, "namespace": ns});
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
    }
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {"config": base64_of(&kubeconfig)},
    });
    Api::<Secret>::namespaced(host.clone(), ns)
        .patch(
            &secret_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(|e| format!("writing secret/{secret_name}: {e}"))?;
    Ok(())
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
}

/// The inside's admin kubeconfig as vCluster exports it: the server named by
/// `exportKubeConfig.server` (default `https://localhost:8443`) reached on loopback, that is the
/// inside API server's address (or the advertised relay to it) with `tls-server-name` set to the
/// server's host; its context named by `exportKubeConfig.context`; TLS checks skipped only with
/// `exportKubeConfig.insecure`.
fn exported_kubeconfig(inside: &Inside, values: &Value) -> Result<String, String> {
    let text = std::fs::read_to_string(&inside.kubeconfig)
        .map_err(|e| format!("{}: {e}", inside.kubeconfig.display()))?;
    let mut config: Value = serde_saphyr::from_str(&text).map_err(|e| e.to_string())?;
    let export = &values["exportKubeConfig"];
    let server = export["server"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("https://localhost:8443");
    let context = export["context"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("my-vcluster")
        .to_string();
    let cluster = &mut config["clusters"][0]["cluster"];
    cluster["server"] = json!(inside.advertised.as_deref().unwrap_or(&inside.server));
    cluster["tls-server-name"] = json!(url_host(server));
    if export["insecure"].as_bool() == Some(true) {
        cluster["insecure-skip-tls-verify"] = json!(true);
        if let Some(c) = cluster.as_object_mut() {
            c.remove("certificate-authority-data");
        }
    }
    config["contexts"][0]["name"] = json!(context);
    config["current-context"] = json!(context);
    serde_saphyr::to_string(&config).map_err(|e| e.to_string())
}

/// Writes every NetworkPolicy of the inside into `ns`, translated, and deletes the host copies
/// whose source is gone.
async fn sync_network_policies(
    host: &kube::Client,
    policies: &Policies,
    ns: &str,
    owner: Option<&Value>,
) -> Result<(), String> {
    let api = Api::<NetworkPolicy>::namespaced(host.clone(), ns);
    let mut wanted = Vec::new();
    for policy in policies.inside.iter().flatten() {
        let value = serde_json::to_value(policy).map_err(|e| e.to_string())?;
        let translated = translate_network_policy(&value, ns, owner);
        let name = translated["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&translated),
        )
        .await
        .map_err(|e| format!("writing networkpolicy/{name}: {e}"))?;
        wanted.push(name);
    }
    for stale in policies.synced.get(ns).into_iter().flatten() {
        let name = stale.metadata.name.clone().unwrap_or_default();
        if !wanted.contains(&name) {
            api.delete(&name, &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting networkpolicy/{name}: {e}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_syncer_starts_only_with_a_known_pod_security_level() {
        for ok in [json!({}), json!({"policies": {"podSecurityStandard": ""}})] {
            assert_eq!(check_pod_security(&ok), Ok(()));
        }
        for level in ["privileged", "baseline", "restricted"] {
            let values = json!({"policies": {"podSecurityStandard": level}});
            assert_eq!(check_pod_security(&values), Ok(()));
        }
        for bad in [json!("Baseline"), json!("lenient"), json!(1)] {
            let values = json!({"policies": {"podSecurityStandard": bad}});
            assert!(check_pod_security(&values).is_err(), "{values}");
        }
    }

    #[test]
    fn the_export_names_the_advertised_server_with_the_asked_name() {
        let dir = std::env::temp_dir().join(format!("standin-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let kubeconfig = dir.join("kubeconfig");
        let yaml = crate::control_plane::kubeconfig_yaml("https://127.0.0.1:7443", "ca", "c", "k")
            .expect("kubeconfig");
        std::fs::write(&kubeconfig, yaml).expect("write");
        let values = json!({"exportKubeConfig": {"server": "https://vcluster.pi-a-b-1.svc:443"}});
        let cluster = |advertised: Option<&str>| {
            let inside = Inside {
                dir: dir.clone(),
                server: "https://127.0.0.1:7443".into(),
                advertised: advertised.map(String::from),
                kubeconfig: kubeconfig.clone(),
                ca_key: String::new(),
            };
            let text = exported_kubeconfig(&inside, &values).expect("export");
            let config: Value = serde_saphyr::from_str(&text).expect("yaml");
            config["clusters"][0]["cluster"].clone()
        };
        let on_loopback = cluster(None);
        assert_eq!(on_loopback["server"], "https://127.0.0.1:7443");
        assert_eq!(on_loopback["tls-server-name"], "vcluster.pi-a-b-1.svc");
        let relayed = cluster(Some("https://10.254.0.2:20001"));
        assert_eq!(relayed["server"], "https://10.254.0.2:20001");
        assert_eq!(relayed["tls-server-name"], "vcluster.pi-a-b-1.svc");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_certificate_names_the_service_not_its_svc_name() {
        let names = serving_names("pi-a-b-1", "10.96.0.7", "10.0.0.3", &[]);
        assert!(names.contains(&"vcluster.pi-a-b-1".to_string()));
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with(".svc") && n.starts_with("vcluster"))
        );
        let names = serving_names(
            "pi-a-b-1",
            "10.96.0.7",
            "10.0.0.3",
            &["vcluster.pi-a-b-1.svc".into()],
        );
        assert!(names.contains(&"vcluster.pi-a-b-1.svc".to_string()));
        assert_eq!(names.len(), 11);
    }

    #[test]
    fn names_are_translated_as_vcluster_does() {
        assert_eq!(translated_name("deny", "team"), "deny-x-team-x-vcluster");
        let long = translated_name(&"a".repeat(60), "team");
        assert_eq!(long.len(), 63);
        assert!(long.starts_with(&"a".repeat(52)));
        assert_eq!(
            url_host("https://vcluster.pi-x.svc:443"),
            "vcluster.pi-x.svc"
        );
        assert_eq!(url_host("https://localhost:8443/"), "localhost");
        assert_eq!(url_host("https://[::1]:443"), "::1");
    }

    #[test]
    fn a_policy_is_confined_to_the_vclusters_pods_of_its_namespace() {
        let policy = json!({
            "metadata": {"name": "isolate", "namespace": "tenant-a", "uid": "u1", "labels": {"team": "a"}},
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": {}}]}],
                "egress": [{"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": 443}]}]
            }
        });
        let owner = json!({"apiVersion": "v1", "kind": "Service", "name": "vcluster", "uid": "s1"});
        let host = translate_network_policy(&policy, "pi-x", Some(&owner));
        assert_eq!(host["metadata"]["name"], "isolate-x-tenant-a-x-vcluster");
        assert_eq!(host["metadata"]["namespace"], "pi-x");
        assert_eq!(host["metadata"]["labels"]["team"], "a");
        assert_eq!(host["metadata"]["labels"][MARKER_LABEL], "vcluster");
        assert_eq!(host["metadata"]["labels"][NAMESPACE_LABEL], "tenant-a");
        assert_eq!(host["metadata"]["annotations"][NAME_ANNOTATION], "isolate");
        assert_eq!(host["metadata"]["ownerReferences"][0]["uid"], "s1");
        let selector = &host["spec"]["podSelector"]["matchLabels"];
        assert_eq!(selector["app"], "web");
        assert_eq!(selector[NAMESPACE_LABEL], "tenant-a");
        let from = &host["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
        assert_eq!(from[NAMESPACE_LABEL], "tenant-a");
        assert_eq!(from[MARKER_LABEL], "vcluster");
        assert_eq!(
            host["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"],
            "10.1.0.0/16"
        );
        assert_eq!(host["spec"]["egress"][0]["ports"][0]["port"], 443);
    }
}
