//! The chart on the real node ([`e2e::real_node`]) with the operator image built from the
//! project's `Dockerfile` ([`e2e::images::operator`]): `helm install` of
//! `charts/platform-operator` pinned to the built image's digest, into a namespace that enforces
//! Pod Security `restricted`. The controller and webhook pods run in real containers and become
//! Ready (their probes answered by the binaries, counted by the kubelet), as uid 1000 on a
//! read-only root; the API server calls the webhook through its Service (a server-side dry run is
//! defaulted, a NodePort collision refused via `kubectl apply`); a real Prometheus inside the
//! node's network namespace scrapes both pods over HTTPS with a token bound to
//! `platform-operator-metrics-reader`, and is refused without that binding. Then an instance with
//! `deletionPolicy: Delete`: its cleanup Job is refused while the cleanup namespace does not admit
//! hostPath volumes (the instance says `CleanupBlocked`), and once it does, the Job's pod runs on
//! the real node with its hostPath mount and removes that instance's storage folder only. Then
//! two controller replicas as pods: the Lease holder's pod is deleted and another pod takes the
//! Lease. `helm uninstall` keeps the CRD, the state claim and the passphrase Secret. Prints the
//! chart's install-to-Ready time and the failover time. Needs root and the Debian packages
//! `e2e/run-tests.sh` installs for its real-node lane.

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::chart::{Helm, chart_dir};
use e2e::cmd::run;
use e2e::images::{OperatorInputs, sha256_file};
use e2e::{ControlPlane, Options};
use serde_json::Value;

const RELEASE: &str = "platform-operator";
const NS: &str = "platform-operator";
const CLEANUP_NS: &str = "platform-operator-cleanup";

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

/// Polls `check` every 250 ms until it is true or `limit` passes; then fails with `show()`.
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
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The pods of `component` (controller or webhook) of the release.
fn pods(cluster: &ControlPlane, component: &str) -> Vec<Value> {
    json(
        cluster,
        &[
            "-n",
            NS,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/component={component}"),
        ],
    )["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Pods, events and the node's logs, for a failure message.
fn diagnostics(cluster: &ControlPlane) -> String {
    let mut out = String::new();
    for args in [
        vec!["-n", NS, "get", "pods,pvc,events", "-o", "wide"],
        vec![
            "-n",
            NS,
            "logs",
            "-l",
            "app.kubernetes.io/component=controller",
            "--tail=30",
        ],
        vec![
            "-n",
            NS,
            "logs",
            "-l",
            "app.kubernetes.io/component=webhook",
            "--tail=30",
        ],
    ] {
        let mut cmd = cluster.kubectl();
        cmd.args(&args);
        if let Ok(o) = run(cmd, None) {
            out.push_str(&format!(
                "$ kubectl {}\n{}{}\n",
                args.join(" "),
                o.stdout,
                o.stderr
            ));
        }
    }
    out
}

/// The processes of the node's containers (found by the node's cgroup) whose command starts
/// with `program`: their pids.
fn container_processes(cgroup: &str, program: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
    {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if first != program.as_bytes() {
            continue;
        }
        let groups = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if groups.contains(&format!("/{cgroup}/")) {
            pids.push(pid);
        }
    }
    pids
}

/// The real, effective, saved and filesystem uids of process `pid`.
fn uids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line")
        .split_whitespace()
        .map(|u| u.parse().expect("uid"))
        .collect()
}

/// The mount options of process `pid`'s root filesystem.
fn root_mount_options(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .expect("mountinfo")
        .lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.get(4) == Some(&"/")).then(|| fields.get(5).copied().unwrap_or("").to_string())
        })
        .expect("a root mount")
}

/// A ServiceAccount `account` in `NS` (bound to `platform-operator-metrics-reader` when
/// `reader`) and a token for it, written to `file`.
fn scraper_token(cluster: &ControlPlane, account: &str, reader: bool, file: &Path) {
    kubectl(
        cluster,
        &["-n", NS, "create", "serviceaccount", account],
        None,
    );
    if reader {
        kubectl(
            cluster,
            &[
                "create",
                "clusterrolebinding",
                &format!("{account}-{NS}"),
                "--clusterrole=platform-operator-metrics-reader",
                &format!("--serviceaccount={NS}:{account}"),
            ],
            None,
        );
    }
    let token = kubectl(
        cluster,
        &["-n", NS, "create", "token", account, "--duration=1h"],
        None,
    );
    std::fs::write(file, token.trim()).expect("token file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_on_the_real_node_with_the_image_built_from_the_dockerfile() {
    // The image first: it needs no cluster.
    let built = Instant::now();
    let inputs = OperatorInputs::for_tests().unwrap_or_else(|e| panic!("image inputs: {e}"));
    let image = e2e::images::operator(&inputs).unwrap_or_else(|e| panic!("operator image: {e}"));
    println!(
        "figure: operator image {} built or taken from the cache in {:.1} s",
        image.by_digest(),
        built.elapsed().as_secs_f64()
    );
    // Its configuration is the Dockerfile's final stage, the chart's digest variable set from
    // the chart archive it carries.
    let config = e2e::images::archive_config(&image.archive).expect("the image's configuration");
    let text = e2e::dockerfile::read().expect("Dockerfile");
    let stages = e2e::dockerfile::stages(&text);
    let runtime = stages.last().expect("final stage");
    assert_eq!(config["config"]["User"], "1000:1000");
    assert_eq!(config["config"]["WorkingDir"], "/home/platform-operator");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/controller"])
    );
    let env: Vec<String> = e2e::chart::strings(&config["config"]["Env"]);
    for (key, value) in e2e::dockerfile::env_in_order(runtime) {
        let value = value.replace(
            "${VCLUSTER_CHART_SHA256}",
            &sha256_file(&inputs.vcluster_chart).expect("chart digest"),
        );
        assert!(env.contains(&format!("{key}={value}")), "{key}: {env:?}");
    }

    let started = Instant::now();
    let cluster = ControlPlane::start(Options::new("real-node-chart").real_node())
        .await
        .unwrap_or_else(|e| panic!("control plane with a real node: {e}"));
    let node = cluster.real_node().expect("the real node");
    println!(
        "figure: real node Ready {:.2} s after its first process (control plane and node {:.1} s)",
        node.figures().node_ready.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    node.import_by_digest(&image)
        .unwrap_or_else(|e| panic!("importing the operator image: {e}"));
    let cgroup = node
        .netns()
        .expect("the node's namespace")
        .name()
        .to_string();

    // The release namespace enforces "restricted"; the state claim binds to a hostPath volume
    // that uid 1000 may write.
    let manifest = format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NS}
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
"#
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&manifest));
    // The cleanup namespace admits hostPath volumes (privileged), as the chart asks.
    let cleanup_ns = format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {CLEANUP_NS}
  labels:
    pod-security.kubernetes.io/enforce: privileged
"#
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&cleanup_ns));
    let storage_root = cluster.dir().join("instances");
    std::fs::create_dir_all(&storage_root).expect("storage root");
    e2e::chart::state_volume(&cluster, NS).unwrap_or_else(|e| panic!("state volume: {e}"));

    // helm install, timed until both Deployments' pods are Ready.
    let helm = Helm::with_kubeconfig(cluster.kubeconfig()).expect("helm");
    let chart = chart_dir().display().to_string();
    let digest = format!("image.digest={}", image.digest);
    let storage_set = format!("storageRootBase={}", storage_root.display());
    let cleanup_set = format!("cleanupNamespace={CLEANUP_NS}");
    let sets = [
        digest.as_str(),
        "image.pullPolicy=Never",
        // Nothing may reach outside: the registry is a dead port on the pod's loopback.
        "npmRegistry=http://127.0.0.1:9/",
        &storage_set,
        &cleanup_set,
    ];
    let release = |verb: &str, more: &[&str]| {
        let mut args = vec![verb, RELEASE, chart.as_str(), "-n", NS];
        for set in sets.iter().chain(more) {
            args.extend(["--set", set]);
        }
        helm.run(&args).expect("helm runs")
    };
    let install = Instant::now();
    let out = release("install", &[]);
    assert!(out.success, "helm install: {}", out.stderr);
    wait_for(
        "the controller and webhook pods Ready",
        Duration::from_secs(180),
        || diagnostics(&cluster),
        || {
            ["controller", "webhook"].iter().all(|c| {
                let p = pods(&cluster, c);
                !p.is_empty() && p.iter().all(ready)
            })
        },
    );
    println!(
        "figure: chart install-to-Ready (helm install to both pods Ready) {:.1} s",
        install.elapsed().as_secs_f64()
    );

    // Each pod: the built image by digest, on the real node, uid 1000 on a read-only root (the
    // controller's container runs its supervisor and the controller, two processes).
    let mut addresses = Vec::new();
    for (component, program, processes) in [
        ("controller", "/usr/local/bin/controller", 2),
        ("webhook", "/usr/local/bin/webhook", 1),
    ] {
        let pod = pods(&cluster, component).remove(0);
        assert_eq!(pod["spec"]["nodeName"], e2e::real_node::NODE_NAME);
        let status = &pod["status"]["containerStatuses"][0];
        assert!(
            status["imageID"]
                .as_str()
                .is_some_and(|id| id.contains(&image.digest)),
            "{component} runs {status}"
        );
        assert_eq!(status["restartCount"], 0, "{component}: {status}");
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        let pids = container_processes(&cgroup, program);
        assert_eq!(
            pids.len(),
            processes,
            "{program} in the node's containers: {pids:?}"
        );
        for pid in pids {
            assert!(
                uids(pid).iter().all(|u| *u == 1000),
                "{program} runs as {:?}",
                uids(pid)
            );
            let options = root_mount_options(pid);
            assert!(
                options.split(',').any(|o| o == "ro"),
                "{program}'s root is mounted {options}"
            );
        }
        addresses.push((
            component,
            format!("{}:8080", pod["status"]["podIP"].as_str().expect("pod IP")),
        ));
    }

    // The probes were answered: the kubelet counts successful liveness and readiness probes of
    // both containers (read through the API server's node proxy).
    wait_for(
        "a successful liveness probe of each container",
        Duration::from_secs(60),
        String::new,
        || {
            let metrics = kubectl(
                &cluster,
                &[
                    "get",
                    "--raw",
                    &format!(
                        "/api/v1/nodes/{}/proxy/metrics/probes",
                        e2e::real_node::NODE_NAME
                    ),
                ],
                None,
            );
            ["controller", "webhook"].iter().all(|c| {
                ["Liveness", "Readiness"].iter().all(|t| {
                    metrics.lines().any(|l| {
                        l.starts_with("prober_probe_total{")
                            && l.contains(&format!("container=\"{c}\""))
                            && l.contains(&format!("probe_type=\"{t}\""))
                            && l.contains("result=\"successful\"")
                    })
                })
            })
        },
    );

    // The API server calls the webhook through its Service: a server-side dry run of an
    // instance without a version comes back defaulted (the mutating webhook), and a NodePort
    // that a Service holds is refused by the validating webhook via kubectl apply.
    kubectl(&cluster, &["create", "namespace", "team-a"], None);
    let unversioned = r#"apiVersion: platform.di-framework.dev/v1alpha1
kind: PlatformInstance
metadata: { name: dry, namespace: team-a }
spec:
  target: { type: vcluster }
"#;
    let dry: Value = serde_json::from_str(&kubectl(
        &cluster,
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(unversioned),
    ))
    .expect("JSON");
    assert!(
        dry["spec"]["version"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "the mutating webhook set spec.version: {dry}"
    );
    let holder = r#"apiVersion: v1
kind: Service
metadata: { name: holder, namespace: team-a }
spec:
  type: NodePort
  ports: [{ port: 80, nodePort: 30080 }]
"#;
    kubectl(&cluster, &["apply", "-f", "-"], Some(holder));
    let colliding = r#"apiVersion: platform.di-framework.dev/v1alpha1
kind: PlatformInstance
metadata: { name: one, namespace: team-a }
spec:
  version: 6.0.22
  target: { type: vcluster }
  platform:
    gateway: { httpNodePort: 30080 }
"#;
    // The webhook learns of the Service through its watch: retry until it refuses.
    let mut refusal = String::new();
    wait_for(
        "the NodePort collision refused",
        Duration::from_secs(30),
        String::new,
        || {
            let mut cmd = cluster.kubectl();
            cmd.args(["apply", "-f", "-"]);
            let out = run(cmd, Some(colliding)).expect("kubectl");
            assert!(
                !out.success,
                "an instance taking the Service's NodePort was admitted: {}",
                out.stdout
            );
            refusal = out.stderr;
            refusal.contains("is already used by")
        },
    );
    assert!(
        refusal.contains("30080") && refusal.contains("holder") && refusal.contains("webhook"),
        "{refusal}"
    );

    // Prometheus, inside the node's network namespace, scrapes both pods over HTTPS: with a
    // metrics reader's token, and with a token of an account without that binding.
    let tools = e2e::prometheus::Tools::locate().expect("prometheus");
    let home = cluster.dir().join("prometheus");
    std::fs::create_dir_all(&home).expect("prometheus folder");
    let (reader, stranger) = (home.join("reader.token"), home.join("stranger.token"));
    scraper_token(&cluster, "scraper", true, &reader);
    scraper_token(&cluster, "stranger", false, &stranger);
    let targets: Vec<String> = addresses.iter().map(|(_, a)| a.clone()).collect();
    let config = e2e::prometheus::pod_scrape_config(&[
        ("reader".into(), targets.clone(), reader),
        ("stranger".into(), targets, stranger),
    ]);
    let mut prometheus = e2e::prometheus::Server::start_in(&tools, &home, &config, node.netns())
        .expect("prometheus");
    prometheus.wait_ready().await.expect("prometheus ready");
    for binary in ["controller", "webhook"] {
        let found = prometheus
            .series(&format!(
                r#"platform_operator_build_info{{binary="{binary}",job="reader"}} == 1"#
            ))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", prometheus.log_text()));
        assert_eq!(found.len(), 1, "{found:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let targets = prometheus.targets().await.expect("targets");
        let health = |job: &str| -> Vec<(String, String)> {
            targets
                .iter()
                .filter(|t| t["labels"]["job"] == job)
                .map(|t| {
                    (
                        t["health"].as_str().unwrap_or("").to_string(),
                        t["lastError"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        };
        let (readers, strangers) = (health("reader"), health("stranger"));
        let settled = readers.len() == 2
            && readers.iter().all(|(h, _)| h == "up")
            && strangers.len() == 2
            && strangers
                .iter()
                .all(|(h, e)| h == "down" && e.contains("403"));
        if settled {
            for t in &targets {
                assert!(
                    t["scrapeUrl"]
                        .as_str()
                        .is_some_and(|u| u.starts_with("https://10.88.")),
                    "{t}"
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "scrapes with the reader's token up, the stranger's refused (403): {readers:?} \
             {strangers:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(prometheus);

    the_storage_owner_check_runs_before_the_control_plane(&cluster, &storage_root);
    deletion_runs_the_cleanup_job_on_the_node(&cluster, &storage_root);

    // Two controller replicas as pods: one holds the Lease; when its pod is deleted, another
    // takes over.
    let out = release("upgrade", &["replicaCount=2"]);
    assert!(out.success, "helm upgrade: {}", out.stderr);
    wait_for(
        "two controller pods Ready",
        Duration::from_secs(180),
        || diagnostics(&cluster),
        || {
            let p = pods(&cluster, "controller");
            p.len() == 2 && p.iter().all(ready)
        },
    );
    let holder = || -> String {
        let mut cmd = cluster.kubectl();
        cmd.args([
            "-n",
            NS,
            "get",
            "lease",
            "platform-operator-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        run(cmd, None)
            .ok()
            .and_then(|o| o.ok("lease").ok())
            .unwrap_or_default()
    };
    let names = |pods: &[Value]| -> Vec<String> {
        pods.iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    };
    let mut leader = String::new();
    wait_for(
        "a controller pod holding the Lease",
        Duration::from_secs(60),
        String::new,
        || {
            leader = holder();
            names(&pods(&cluster, "controller")).contains(&leader)
        },
    );
    let failover = Instant::now();
    kubectl(
        &cluster,
        &["-n", NS, "delete", "pod", &leader, "--wait=false"],
        None,
    );
    let mut next = String::new();
    wait_for(
        "another controller pod to take the Lease",
        Duration::from_secs(90),
        || diagnostics(&cluster),
        || {
            next = holder();
            !next.is_empty()
                && next != leader
                && pods(&cluster, "controller")
                    .iter()
                    .any(|p| p["metadata"]["name"] == next.as_str() && ready(p))
        },
    );
    println!(
        "figure: leader pod {leader} deleted, {next} holds the Lease {:.1} s later",
        failover.elapsed().as_secs_f64()
    );

    // helm uninstall keeps the CRD, the state claim and the passphrase.
    let passphrase_uid = json(
        &cluster,
        &["-n", NS, "get", "secret", "platform-operator-passphrase"],
    )["metadata"]["uid"]
        .clone();
    let out = helm
        .run(&["uninstall", RELEASE, "-n", NS, "--wait"])
        .expect("helm runs");
    assert!(out.success, "helm uninstall: {}", out.stderr);
    json(
        &cluster,
        &["get", "crd", "platforminstances.platform.di-framework.dev"],
    );
    json(
        &cluster,
        &["-n", NS, "get", "pvc", "platform-operator-state"],
    );
    assert_eq!(
        json(
            &cluster,
            &["-n", NS, "get", "secret", "platform-operator-passphrase"]
        )["metadata"]["uid"],
        passphrase_uid
    );
    let node = cluster.real_node().expect("the real node");
    node.drain(
        &cluster.client().await.expect("client"),
        Duration::from_secs(30),
    )
    .await;
}

/// An instance's reason on `Ready`, and its message.
fn ready_reason(cluster: &ControlPlane, ns: &str, name: &str) -> Option<(String, String)> {
    let mut cmd = cluster.kubectl();
    cmd.args(["-n", ns, "get", "platforminstance", name, "-o", "json"]);
    let out = run(cmd, None).ok()?;
    let pi: Value = serde_json::from_str(&out.stdout).ok()?;
    pi["status"]["conditions"].as_array()?.iter().find_map(|c| {
        (c["type"] == "Ready").then(|| {
            (
                c["reason"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        })
    })
}

/// Issue 30, item 1: the control plane's first init container (`controller claim-storage` from
/// the operator image, as root) runs on the real node with the storage directory mounted. A
/// directory whose owner marker names another instance stops the control plane there: the
/// instance says whose it is (`StorageConflict`) and the marker and data stay as they were.
fn the_storage_owner_check_runs_before_the_control_plane(cluster: &ControlPlane, root: &Path) {
    let instance = r#"apiVersion: platform.di-framework.dev/v1alpha1
kind: PlatformInstance
metadata: { name: taken, namespace: team-a }
spec:
  version: 6.0.22
  target: { type: vcluster }
"#;
    let host_ns = common::names::host_namespace("team-a", "taken");
    let folder = root.join(common::names::storage_dir("team-a", "taken", &host_ns));
    std::fs::create_dir_all(&folder).expect("folder");
    std::fs::write(folder.join("data.db"), "team-b's").expect("data");
    let theirs = "u-thief\nteam-b/thief\n";
    std::fs::write(folder.join(".platform-instance"), theirs).expect("marker");
    kubectl(cluster, &["apply", "-f", "-"], Some(instance));
    let mut seen = None;
    wait_for(
        "the instance to report StorageConflict",
        Duration::from_secs(240),
        || {
            format!(
                "{:?}\n{}",
                ready_reason(cluster, "team-a", "taken"),
                diagnostics(cluster)
            )
        },
        || {
            seen = ready_reason(cluster, "team-a", "taken");
            seen.as_ref().is_some_and(|(r, _)| r == "StorageConflict")
        },
    );
    let (_, message) = seen.clone().expect("a reason");
    assert!(message.contains("team-b/thief"), "whose it is: {message}");
    let pods = json(cluster, &["-n", &host_ns, "get", "pods"]);
    let init = &pods["items"][0]["status"]["initContainerStatuses"];
    let ran = init.to_string();
    assert!(
        ran.contains("storage-owner") && ran.contains("\"exitCode\":3"),
        "{ran}"
    );
    assert_eq!(
        pods["items"][0]["spec"]["nodeName"],
        e2e::real_node::NODE_NAME
    );
    assert_eq!(
        std::fs::read_to_string(folder.join(".platform-instance")).expect("marker"),
        theirs,
        "the marker is never rewritten"
    );
    assert_eq!(
        std::fs::read_to_string(folder.join("data.db")).expect("data"),
        "team-b's"
    );
    kubectl(
        cluster,
        &["-n", "team-a", "delete", "platforminstance", "taken"],
        None,
    );
}

/// An instance with `deletionPolicy: Delete` beside a neighbour's storage folder: while the
/// cleanup namespace does not admit hostPath volumes its Job cannot create its pod and the
/// instance says so (`CleanupBlocked`); once it is privileged again the Job's pod runs in a
/// real container with the hostPath mount, removes the instance's folder and leaves the
/// neighbour's.
fn deletion_runs_the_cleanup_job_on_the_node(cluster: &ControlPlane, storage_root: &Path) {
    let instance = r#"apiVersion: platform.di-framework.dev/v1alpha1
kind: PlatformInstance
metadata: { name: gone, namespace: team-a }
spec:
  version: 6.0.22
  target: { type: vcluster }
  deletionPolicy: Delete
"#;
    kubectl(cluster, &["apply", "-f", "-"], Some(instance));
    let host_ns = common::names::host_namespace("team-a", "gone");
    // What the instance's vCluster would have written, and a neighbour's folder beside it.
    let folder = storage_root.join(common::names::storage_dir("team-a", "gone", &host_ns));
    let neighbour = storage_root.join("pi-team-b-neighbour");
    for dir in [&folder, &neighbour] {
        std::fs::create_dir_all(dir.join("data")).expect("folder");
        std::fs::write(dir.join("data/state"), "kept until cleaned").expect("file");
    }
    wait_for(
        "the instance's host namespace",
        Duration::from_secs(120),
        || diagnostics(cluster),
        || {
            let mut cmd = cluster.kubectl();
            cmd.args(["get", "namespace", &host_ns]);
            run(cmd, None).is_ok_and(|o| o.success)
        },
    );
    // Its control plane's init container claims the directory on the node: the marker names it.
    let uid = json(
        cluster,
        &["-n", "team-a", "get", "platforminstance", "gone"],
    )["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let marker = folder.join(".platform-instance");
    wait_for(
        "the storage owner marker",
        Duration::from_secs(180),
        || diagnostics(cluster),
        || marker.exists(),
    );
    assert_eq!(
        std::fs::read_to_string(&marker).expect("marker"),
        format!("{uid}\nteam-a/gone\n")
    );

    // The cleanup namespace stops admitting hostPath volumes: the Job cannot create its pod.
    kubectl(
        cluster,
        &[
            "label",
            "--overwrite",
            "namespace",
            CLEANUP_NS,
            "pod-security.kubernetes.io/enforce=baseline",
        ],
        None,
    );
    kubectl(
        cluster,
        &[
            "-n",
            "team-a",
            "delete",
            "platforminstance",
            "gone",
            "--wait=false",
        ],
        None,
    );
    let mut seen = None;
    wait_for(
        "the instance to report CleanupBlocked",
        Duration::from_secs(180),
        || {
            format!(
                "{:?}\n{}",
                ready_reason(cluster, "team-a", "gone"),
                diagnostics(cluster)
            )
        },
        || {
            seen = ready_reason(cluster, "team-a", "gone");
            seen.as_ref().is_some_and(|(r, _)| r == "CleanupBlocked")
        },
    );
    let (_, message) = seen.clone().expect("a reason");
    assert!(
        message.contains("hostPath") || message.contains("PodSecurity"),
        "the condition names the refusal: {message}"
    );
    assert!(
        folder.join("data/state").exists(),
        "nothing was cleaned yet"
    );

    // Privileged again: the Job's pod runs on the real node and the instance goes.
    kubectl(
        cluster,
        &[
            "label",
            "--overwrite",
            "namespace",
            CLEANUP_NS,
            "pod-security.kubernetes.io/enforce=privileged",
        ],
        None,
    );
    let mut ran_on = String::new();
    wait_for(
        "the instance to be gone",
        Duration::from_secs(240),
        || {
            format!(
                "{:?}\n{}",
                ready_reason(cluster, "team-a", "gone"),
                diagnostics(cluster)
            )
        },
        || {
            let mut cmd = cluster.kubectl();
            cmd.args([
                "-n",
                CLEANUP_NS,
                "get",
                "pods",
                "-o",
                "jsonpath={.items[*].spec.nodeName}",
            ]);
            if let Some(nodes) = run(cmd, None).ok().and_then(|o| o.ok("pods").ok())
                && !nodes.trim().is_empty()
            {
                ran_on = nodes.trim().to_string();
            }
            let mut cmd = cluster.kubectl();
            cmd.args(["-n", "team-a", "get", "platforminstance", "gone"]);
            run(cmd, None).is_ok_and(|o| !o.success && o.stderr.contains("NotFound"))
        },
    );
    assert_eq!(ran_on, e2e::real_node::NODE_NAME, "the cleanup pod's node");
    assert!(
        !folder.exists(),
        "the instance's folder {} is gone",
        folder.display()
    );
    assert_eq!(
        std::fs::read_to_string(neighbour.join("data/state")).expect("the neighbour's file"),
        "kept until cleaned"
    );
}
