//! Installer benchmark (prints figures; asserts nothing about speed).
//!
//! On one control plane with a real node, with the stand-in `@di-framework/platform` in a local
//! npm registry and the real Pulumi CLI, two rounds side by side in one run, each with its own
//! controller (in the node's network namespace, reaching the API server, the vCluster and the
//! registry through the harness's relays) and a fresh state volume (empty npm cache, Pulumi home
//! and dependency trees):
//!
//! - **cold registry**: the registry this run started, serving its first requests;
//! - **warm registry**: the same registry, which has just served the same packages.
//!
//! Both controllers run with `--install-image` (the operator image the real node imported), as
//! the chart ships them: npm, the key check and every Pulumi run in install pods.
//!
//! In each round a first instance at a version, then a second at the same version (in the warm
//! round then more, untimed, until `BENCH_INSTALLS` installs have run, default 10),
//! while the resident memory of the controller and every process under it is sampled every
//! 100 ms (what its container's memory limit counts; an install pod's is its own). For each, the
//! time from `kubectl apply` to `Ready` and where it went: inside npm (and how many npm runs),
//! inside `pulumi up` itself, inside the rest of the Pulumi step (the stack's config file, the
//! stack's creation, pending operations, the outputs: any other Pulumi command and the work the
//! operator does in their place), inside Helm for the vCluster, the **stand-in** vCluster's start
//! (from the timeline: its Helm release `deployed` to its exported kubeconfig written; its pod on
//! the real node and the stand-in syncer, where a real vCluster takes its own, longer, time), the
//! install pods' starts (each from its first sight to its container running: the Job
//! controller, the scheduler and the kubelet), and the rest (the operator's own work and its
//! queues). "Outside `pulumi up`" is time to Ready minus
//! `pulumi up`'s own seconds.
//! Figures come from the controller's `platform_operator_controller_tool_duration_seconds` and
//! `platform_operator_controller_helm_duration_seconds`; Ready is seen by a watch
//! (`kubectl wait`), not a poll.
//!
//! For each second instance it also prints a **timeline**, seconds from `kubectl apply`: every
//! change of the instance's phase and condition reasons, of its host namespace, of the vCluster's
//! Helm release record, Deployment, pod and exported kubeconfig, and of the Secrets the
//! controller writes, each seen by a watch of its own (started before the apply; a handful of
//! watch events, nothing polled), with the wall-clock time of the apply to line it up with the
//! controller's log (kept in the round's folder, printed at the end).
//!
//! Gate: the operator's own share (the rest above) of each second instance's time to Ready <= 10 %.
//!
//! Run: `cargo bench -p controller --bench install` (env `BENCH_VERSION`, default 6.0.22;
//! `BENCH_LOG_LEVEL`, default `info`, the controller's `--log-level`: `info,controller=debug`
//! for the installer's steps in its log; `BENCH_BASELINE`, another build of the controller
//! binary, such as main's, measured in a round of its own after the cold round; `BENCH_INSTALLS`).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::crd::PlatformInstance;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use support::{Controller, installing_fixture_for};

const TOOL: &str = "platform_operator_controller_tool_duration_seconds";
const HELM: &str = "platform_operator_controller_helm_duration_seconds";

#[derive(Clone, Copy, Default)]
struct Counters {
    npm: f64,
    npm_runs: f64,
    up: f64,
    pulumi_other: f64,
    helm: f64,
}

async fn counters(c: &Controller) -> Counters {
    let sum = format!("{TOOL}_sum");
    Counters {
        npm: c.metric_with(&sum, "tool=\"npm\"").await,
        npm_runs: c
            .metric_with(&format!("{TOOL}_count"), "tool=\"npm\"")
            .await,
        up: c.metric_with(&sum, "tool=\"pulumi-up\"").await,
        pulumi_other: c.metric_with(&sum, "tool=\"pulumi\"").await,
        helm: c.metric_with(&format!("{HELM}_sum"), "").await,
    }
}

struct Figures {
    ready: f64,
    spent: Counters,
    downloads: usize,
    /// Seconds from `kubectl apply`, and what changed then.
    timeline: Vec<(f64, String)>,
    /// The wall-clock time of the apply (to find it in the controller's log).
    applied_at: String,
}

/// What one watch turns an object into: a line of the timeline (a change is a new line).
type Summary = fn(&Value) -> Option<String>;

/// The changes the watches of one instance saw, with when.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(Instant, String)>>>);

impl Seen {
    fn push(&self, line: String) {
        if let Ok(mut v) = self.0.lock() {
            v.push((Instant::now(), line));
        }
    }

    /// The lines from `start` on, in seconds from it.
    fn since(&self, start: Instant) -> Vec<(f64, String)> {
        let mut lines: Vec<(f64, String)> = self
            .0
            .lock()
            .map(|v| {
                v.iter()
                    .filter(|(at, _)| *at >= start)
                    .map(|(at, line)| (at.duration_since(start).as_secs_f64(), line.clone()))
                    .collect()
            })
            .unwrap_or_default();
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        lines
    }
}

/// Watches `api` (narrowed by `config`) and records each object's summary whenever it changes;
/// tells `listed` once the watch has listed.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    summary: Summary,
    seen: Seen,
    listed: tokio::sync::mpsc::Sender<()>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
    K: Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut last: BTreeMap<String, String> = BTreeMap::new();
        let mut stream = std::pin::pin!(watcher::watcher(api, config));
        while let Some(event) = stream.next().await {
            let (object, deleted) = match event {
                Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => (o, false),
                Ok(Event::Delete(o)) => (o, true),
                Ok(Event::InitDone) => {
                    let _ = listed.send(()).await;
                    continue;
                }
                Ok(Event::Init) | Err(_) => continue,
            };
            let name = object.meta().name.clone().unwrap_or_default();
            let Ok(value) = serde_json::to_value(&object) else {
                continue;
            };
            let line = if deleted {
                Some("deleted".to_string())
            } else {
                summary(&value)
            };
            if let Some(line) = line
                && last.get(&name) != Some(&line)
            {
                seen.push(format!("{what} {name}: {line}"));
                last.insert(name, line);
            }
        }
    })
}

/// The reason of condition `type_`, or `-`.
fn reason(value: &Value, type_: &str) -> String {
    value["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .map(|c| {
            format!(
                "{}/{}",
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "-".into())
}

fn instance_summary(v: &Value) -> Option<String> {
    Some(format!(
        "phase {} finalizer {} | Reconciling {} VClusterReady {} KubeconfigReady {} Installed {} Ready {}",
        v["status"]["phase"].as_str().unwrap_or("-"),
        v["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty()),
        reason(v, "Reconciling"),
        reason(v, "VClusterReady"),
        reason(v, "KubeconfigReady"),
        reason(v, "Installed"),
        reason(v, "Ready"),
    ))
}

fn exists(_: &Value) -> Option<String> {
    Some("written".into())
}

fn release_summary(v: &Value) -> Option<String> {
    Some(format!(
        "status {}",
        v["metadata"]["labels"]["status"].as_str().unwrap_or("-")
    ))
}

fn deployment_summary(v: &Value) -> Option<String> {
    let s = &v["status"];
    Some(format!(
        "replicas {} updated {} ready {} available {}",
        s["replicas"].as_i64().unwrap_or(0),
        s["updatedReplicas"].as_i64().unwrap_or(0),
        s["readyReplicas"].as_i64().unwrap_or(0),
        s["availableReplicas"].as_i64().unwrap_or(0)
    ))
}

fn pod_summary(v: &Value) -> Option<String> {
    Some(format!(
        "node {} ip {} Ready {}",
        v["spec"]["nodeName"].as_str().unwrap_or("-"),
        v["status"]["podIP"].as_str().unwrap_or("-"),
        reason(v, "Ready").trim_end_matches('/')
    ))
}

fn install_pod_summary(v: &Value) -> Option<String> {
    let running = v["status"]["containerStatuses"][0]["state"]["running"].is_object();
    let phase = v["status"]["phase"].as_str().unwrap_or("created");
    Some(if running { "running" } else { phase }.to_lowercase())
}

/// Starts the watches of instance `ns/name` and what belongs to it (and of the install pods in
/// `operator_ns`), and waits until each has listed.
async fn watch_instance(
    client: &kube::Client,
    (ns, name): (&str, &str),
    operator_ns: &str,
    seen: &Seen,
) -> Vec<tokio::task::JoinHandle<()>> {
    let host = common::names::host_namespace(ns, name);
    let by_name = |n: &str| watcher::Config::default().fields(&format!("metadata.name={n}"));
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let c = client.clone();
    let tasks = vec![
        watch(
            Api::<PlatformInstance>::namespaced(c.clone(), ns),
            by_name(name),
            "instance",
            instance_summary,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Namespace>::all(c.clone()),
            by_name(&host),
            "host namespace",
            exists,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Secret>::namespaced(c.clone(), &host),
            watcher::Config::default().labels("owner=helm"),
            "helm release",
            release_summary,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Deployment>::namespaced(c.clone(), &host),
            by_name(common::names::VCLUSTER),
            "deployment",
            deployment_summary,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Pod>::namespaced(c.clone(), &host),
            watcher::Config::default().labels("app=vcluster"),
            "pod",
            pod_summary,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Secret>::namespaced(c.clone(), &host),
            by_name(common::names::EXPORTED_KUBECONFIG_SECRET),
            "exported kubeconfig",
            exists,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Secret>::namespaced(c.clone(), ns),
            by_name(&common::names::kubeconfig_secret(name)),
            "admin kubeconfig",
            exists,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Secret>::namespaced(c.clone(), ns),
            watcher::Config::default()
                .labels(&format!("platform.di-framework.dev/membership-of={name}")),
            "membership secret",
            exists,
            seen.clone(),
            tx.clone(),
        ),
        watch(
            Api::<Pod>::namespaced(c, operator_ns),
            watcher::Config::default().labels(common::names::MANAGED_BY_SELECTOR),
            "install pod",
            install_pod_summary,
            seen.clone(),
            tx,
        ),
    ];
    for _ in 0..tasks.len() {
        if tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .ok()
            .flatten()
            .is_none()
        {
            panic!("a timeline watch of {ns}/{name} did not list within 30 s");
        }
    }
    tasks
}

impl Figures {
    fn outside_up(&self) -> f64 {
        self.ready - self.spent.up
    }

    /// The **stand-in** vCluster's start, from the timeline: from its Helm release's last
    /// `deployed` to the exported kubeconfig written (KWOK's pod start, the stand-in syncer's serving
    /// certificate and export). Neither npm, Helm nor the operator: a real vCluster takes its own
    /// (longer) time there. `None` when either moment is missing from the timeline.
    fn vcluster_start(&self) -> Option<f64> {
        let first = |what: &str, line_ends: &str| {
            self.timeline
                .iter()
                .find(|(_, line)| line.starts_with(what) && line.ends_with(line_ends))
                .map(|(at, _)| *at)
        };
        let exported = first("exported kubeconfig ", ": written")?;
        // The last Helm run before it (the first install is followed by an upgrade that pins
        // the control plane to its storage node: Helm's time, not the vCluster's).
        let deployed = self.timeline.iter().rev().find(|(at, line)| {
            *at <= exported
                && line.starts_with("helm release ")
                && line.ends_with(": status deployed")
        });
        let deployed = deployed.map(|(at, _)| *at)?;
        Some((exported - deployed).max(0.0))
    }

    /// The install pods' starts, from the timeline: for each install pod, from its first sight
    /// to its container running (the Job controller, the scheduler and the kubelet: Kubernetes'
    /// time, not the operator's). 0 without install pods.
    fn pod_start(&self) -> f64 {
        let mut created: BTreeMap<&str, f64> = BTreeMap::new();
        let mut started = 0.0;
        for (at, line) in &self.timeline {
            let Some(rest) = line.strip_prefix("install pod ") else {
                continue;
            };
            let name = rest.split(':').next().unwrap_or_default();
            match created.get(name) {
                None => {
                    created.insert(name, *at);
                }
                Some(first) if rest.ends_with(": running") => started += at - first,
                Some(_) => {}
            }
        }
        started
    }

    /// The rest: time to Ready minus npm, Pulumi, Helm, the stand-in vCluster's start and the
    /// install pods' starts.
    fn operator(&self) -> f64 {
        self.ready
            - self.spent.npm
            - self.spent.up
            - self.spent.pulumi_other
            - self.spent.helm
            - self.vcluster_start().unwrap_or(0.0)
            - self.pod_start()
    }
}

async fn one(
    cluster: &e2e::shared::Shared,
    (controller, operator_ns): (&Controller, &str),
    registry: &e2e::npm::RegistryHandle,
    (ns, version, label): (&str, &str, &str),
) -> Figures {
    let client = cluster.client().await.expect("client");
    let seen = Seen::default();
    let watches = watch_instance(&client, (ns, label), operator_ns, &seen).await;
    let before = counters(controller).await;
    let downloads_before = registry.tarball_downloads(e2e::npm::STANDIN_PACKAGE, version);
    let manifest = format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {label}, namespace: {ns} }}\nspec:\n  version: {version}\n  platform:\n    tenants: [{{ name: acme }}]\n    users: [{{ name: dev, memberships: [{{ tenant: acme, role: developer }}] }}]\n"
    );
    let applied_at = k8s_openapi::jiff::Timestamp::now().to_string();
    let start = Instant::now();
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&manifest))
        .expect("apply");
    seen.push("kubectl apply returned".into());
    // One watch (`kubectl wait`), not a poll: Ready is seen when the status is written.
    let label_ref = format!("pi/{label}");
    if let Err(e) = cluster.kubectl_ok(
        &[
            "-n",
            ns,
            "wait",
            "--for=jsonpath={.status.phase}=Ready",
            &label_ref,
            "--timeout=900s",
        ],
        None,
    ) {
        panic!("{label} never became Ready: {e}\n{}", controller.log());
    }
    let ready = start.elapsed().as_secs_f64();
    seen.push("kubectl wait saw Ready".into());
    // The last events (the status write that made it Ready) reach the other watches too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for w in watches {
        w.abort();
    }
    let after = counters(controller).await;
    Figures {
        ready,
        spent: Counters {
            npm: after.npm - before.npm,
            npm_runs: after.npm_runs - before.npm_runs,
            up: after.up - before.up,
            pulumi_other: after.pulumi_other - before.pulumi_other,
            helm: after.helm - before.helm,
        },
        downloads: registry.tarball_downloads(e2e::npm::STANDIN_PACKAGE, version)
            - downloads_before,
        timeline: seen.since(start),
        applied_at,
    }
}

/// A round's figures: the first and the second instance, and the controller's peak memory.
struct Round {
    first: Figures,
    second: Figures,
    /// Installs the round ran (the first and second, then more untimed ones).
    installs: usize,
    /// The most resident memory of the controller and every process under it at once, MiB
    /// (sampled every 100 ms: what its container's memory limit would count).
    peak_rss_mib: f64,
}

/// The resident memory of process `pid` and its descendants, in MiB.
fn tree_rss_mib(pid: u32) -> f64 {
    let mut parents: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        parents.insert(p, (field("PPid:") as u32, field("VmRSS:")));
    }
    let mut kib = 0;
    for (&p, &(_, rss)) in &parents {
        let mut at = p;
        while at != 0 && at != pid {
            at = parents.get(&at).map_or(0, |(parent, _)| *parent);
        }
        if at == pid {
            kib += rss;
        }
    }
    kib as f64 / 1024.0
}

/// One round: a controller (`binary`, or this workspace's) on a fresh state volume, a first and a
/// second instance at `version`, then more instances until `installs` have run.
async fn round(
    cluster: &e2e::shared::Shared,
    registry: &e2e::npm::RegistryHandle,
    (version, installs): (&str, usize),
    (name, binary): (&str, Option<&std::path::Path>),
) -> Round {
    let fx =
        installing_fixture_for(cluster, &format!("bench-install-{name}"), installs.max(2)).await;
    let ns = cluster.create_namespace("bench", &[]).expect("namespace");
    let log_level = std::env::var("BENCH_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    let args = [
        "--leader-elect=false",
        "--watch-namespace",
        &ns,
        "--install-platform=true",
        "--log-level",
        &log_level,
    ];
    // npm and Pulumi run in install pods on the real node (`--install-image`).
    let controller = match binary {
        Some(binary) => Controller::start_binary(binary, cluster, &fx, &args),
        None => Controller::start(cluster, &fx, &args),
    };
    let pid = controller.child.id();
    let peak = Arc::new(Mutex::new(0.0_f64));
    let (sampling, into) = (
        Arc::new(std::sync::atomic::AtomicBool::new(true)),
        peak.clone(),
    );
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                let rss = tree_rss_mib(pid);
                if let Ok(mut peak) = into.lock() {
                    *peak = peak.max(rss);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let at = (&controller, fx.operator_ns.as_str());
    let first = one(cluster, at, registry, (&ns, version, "first")).await;
    let second = one(cluster, at, registry, (&ns, version, "second")).await;
    for n in 3..=installs {
        one(cluster, at, registry, (&ns, version, &format!("i{n}"))).await;
    }
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.join();
    // Kept past the run: the timeline's wall-clock times find their lines in it.
    let log = fx.dir.join(format!("controller-{name}.log"));
    match std::fs::write(&log, controller.log()) {
        Ok(()) => println!("the {name} round's controller log: {}", log.display()),
        Err(e) => eprintln!(
            "keeping the controller's log in {} failed: {e}",
            log.display()
        ),
    }
    let peak_rss_mib = *peak.lock().expect("peak");
    Round {
        first,
        second,
        installs: installs.max(2),
        peak_rss_mib,
    }
}

fn print_timeline(name: &str, f: &Figures) {
    println!(
        "timeline, {name} (kubectl apply at {} UTC; seconds from it):",
        f.applied_at
    );
    for (at, line) in &f.timeline {
        println!("  {at:>7.3}  {line}");
    }
}

fn row(name: &str, f: &Figures) {
    println!(
        "{name:<15} {:>7.2} {:>6.2} {:>4} {:>9.2} {:>7.2} {:>5.2} {:>8} {:>9.2} {:>8.2} {:>10.2} {:>9}",
        f.ready,
        f.spent.npm,
        f.spent.npm_runs,
        f.spent.up,
        f.spent.pulumi_other,
        f.spent.helm,
        f.vcluster_start()
            .map_or_else(|| "-".to_string(), |s| format!("{s:.2}")),
        f.pod_start(),
        f.operator(),
        f.outside_up(),
        f.downloads
    );
}

#[tokio::main]
async fn main() {
    let version = std::env::var("BENCH_VERSION").unwrap_or_else(|_| "6.0.22".into());
    let installs: usize = std::env::var("BENCH_INSTALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10);
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let registry = e2e::npm::shared().expect("npm registry");
    let baseline_binary = std::env::var_os("BENCH_BASELINE").map(std::path::PathBuf::from);
    let reg = &registry;
    let mut rounds = vec![(
        "cold",
        round(&cluster, reg, (&version, 2), ("cold", None)).await,
    )];
    // The baseline between the cold round and the warm one, with a warm registry.
    if let Some(binary) = &baseline_binary {
        let at = ("baseline", Some(binary.as_path()));
        rounds.push(("baseline", round(&cluster, reg, (&version, 2), at).await));
    }
    rounds.push((
        "warm",
        round(&cluster, reg, (&version, installs), ("warm", None)).await,
    ));
    println!(
        "installer benchmark: {version} of the stand-in @di-framework/platform, real Pulumi CLI, one run; seconds"
    );
    if let Some(binary) = &baseline_binary {
        println!(
            "baseline: the controller binary {} (BENCH_BASELINE), a round of its own after the cold round, warm registry",
            binary.display()
        );
    }
    println!(
        "rounds: cold (a registry serving its first requests), warm (the same, warm); npm and Pulumi run in install pods on the real node"
    );
    println!(
        "{:<15} {:>7} {:>6} {:>4} {:>9} {:>7} {:>5} {:>8} {:>9} {:>8} {:>10} {:>9}",
        "instance",
        "ready",
        "npm",
        "runs",
        "pulumi-up",
        "pulumi",
        "helm",
        "vc start",
        "pod start",
        "operator",
        "outside up",
        "downloads"
    );
    println!(
        "vc start: the stand-in vCluster's start (Helm release deployed -> exported kubeconfig written); pod start: install pods first seen -> running; operator: the rest"
    );
    for (name, r) in &rounds {
        row(&format!("{name}: first"), &r.first);
        row(&format!("{name}: second"), &r.second);
    }
    for (name, r) in &rounds {
        print_timeline(&format!("{name}: second"), &r.second);
    }
    for (name, r) in &rounds {
        let (first, second) = (&r.first, &r.second);
        println!(
            "{name}: ratio first/second time to Ready {:.2}; second: {} npm runs, {:.2} s outside pulumi up ({:.2} s without helm; {:.2} s without the stand-in vCluster's start)",
            first.ready / second.ready,
            second.spent.npm_runs,
            second.outside_up(),
            second.outside_up() - second.spent.helm,
            second.outside_up() - second.vcluster_start().unwrap_or(0.0)
        );
        println!(
            "{name}: the controller's peak memory (its process and every process under it) over {} installs: {:.1} MiB",
            r.installs, r.peak_rss_mib
        );
    }
    for (name, r) in &rounds {
        let share = 100.0 * r.second.operator() / r.second.ready;
        support::gate(&format!("operator-share-second-{name}"), share, 10.0, " %");
    }
}
