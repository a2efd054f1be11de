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
//! namespace) from its own pod through the in-cluster address that kubeconfig names. The test
//! then asks the vCluster's API itself (from the node's namespace, through `service/vcluster`)
//! for the objects the program applied. Prints the seconds from apply to `VClusterReady` and to
//! `Ready`, and the vCluster pod's memory as the kubelet reads it from its cgroups.
//!
//! Needs root, the Debian packages `e2e/run-tests.sh` installs for its real-node lane, and the
//! real vCluster's tools (`e2e/tools/build.sh vcluster`, which the test runs: cold, ~15 min).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e::chart::{Helm, chart_dir};
use e2e::cmd::run;
use e2e::images::OperatorInputs;
use e2e::real_vcluster::{COREDNS_IMAGE, DISTRO_IMAGE, VCLUSTER_IMAGE};
use e2e::{ControlPlane, Options};
use serde_json::Value;

const RELEASE: &str = "platform-operator";
const NS: &str = "platform-operator";
const CLEANUP_NS: &str = "platform-operator-cleanup";
const TEAM: &str = "team-a";
const NAME: &str = "one";
const VERSION: &str = "6.0.22";
/// The npm registry's port on the node's addresses (relayed to the registry on loopback).
const REGISTRY_PORT: u16 = 4873;

fn kubectl(cluster: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let mut cmd = cluster.kubectl();
    cmd.args(args);
    run(cmd, stdin)
        .expect("kubectl runs")
        .ok(&format!("kubectl {}", args.join(" ")))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn json(cluster: &ControlPlane, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(cluster, &all, None)).expect("kubectl prints JSON")
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

/// The instance, the pods and the logs that say why it is not there yet.
fn diagnostics(cluster: &ControlPlane, host_ns: &str) -> String {
    let mut out = String::new();
    for args in [
        vec!["-n", TEAM, "get", "platforminstance", NAME, "-o", "yaml"],
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

/// The status of condition `kind` of the instance, if it has one.
fn condition(pi: &Value, kind: &str) -> Option<String> {
    pi["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str().map(str::to_string))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_becomes_ready_on_the_real_vcluster() {
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
    let mut print = std::process::Command::new(&inputs.controller);
    print.args([
        "--print-vcluster-values",
        &format!("{TEAM}/{NAME}"),
        "--cleanup-image",
        &operator.by_digest(),
    ]);
    let values = run(print, None)
        .expect("controller runs")
        .ok("controller --print-vcluster-values")
        .unwrap_or_else(|e| panic!("{e}"));
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
    let upstream: u16 = registry
        .url()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the registry's port");
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
    e2e::chart::state_volume(&cluster, NS).unwrap_or_else(|e| panic!("state volume: {e}"));

    // The operator chart, its controller given the real chart's digest.
    let chart_dir = chart_dir().display().to_string();
    let sets = [
        format!("image.digest={}", operator.digest),
        "image.pullPolicy=Never".into(),
        format!("npmRegistry=http://{node_ip}:{REGISTRY_PORT}/"),
        format!("storageRootBase={}", storage_root.display()),
        format!("cleanupNamespace={CLEANUP_NS}"),
        format!("extraArgs[0]=--vcluster-chart-sha256=sha256:{chart_sha}"),
    ];
    let mut args = vec!["install", RELEASE, chart_dir.as_str(), "-n", NS];
    for set in &sets {
        args.extend(["--set", set.as_str()]);
    }
    let operator_helm = Helm::with_kubeconfig(cluster.kubeconfig()).expect("helm");
    let out = operator_helm.run(&args).expect("helm runs");
    assert!(out.success, "helm install: {}", out.stderr);
    wait_for(
        "the controller and webhook pods Ready",
        Duration::from_secs(180),
        || diagnostics(&cluster, &host_ns),
        || {
            let pods = json(&cluster, &["-n", NS, "get", "pods"]);
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            items.len() >= 2 && items.iter().all(ready)
        },
    );

    // One instance: apply, then time VClusterReady and Ready.
    let instance = format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ \
         name: {NAME}, namespace: {TEAM} }}\nspec:\n  version: {VERSION}\n  target: {{ type: \
         vcluster }}\n"
    );
    // The API server calls the webhook through its Service as soon as kube-proxy has its
    // endpoint: until then the apply is refused ("failed calling webhook") and is retried.
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
            let out = run(cmd, Some(&instance)).expect("kubectl runs");
            assert!(
                out.success || out.stderr.contains("failed calling webhook"),
                "the instance was refused: {}",
                out.stderr
            );
            *refusal.borrow_mut() = out.stderr;
            out.success
        },
    );
    let (mut vcluster_ready, mut all_ready) = (None, None);
    wait_for(
        "the instance Ready on the real vCluster",
        Duration::from_secs(900),
        || diagnostics(&cluster, &host_ns),
        || {
            let pi = json(&cluster, &["-n", TEAM, "get", "platforminstance", NAME]);
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

    // The kubeconfig the syncer exported, as the controller copied it: the in-cluster address.
    let exported = json(&cluster, &["-n", &host_ns, "get", "secret", "vc-vcluster"]);
    assert_eq!(exported["metadata"]["labels"]["vcluster-name"], "vcluster");
    let copied = json(
        &cluster,
        &[
            "-n",
            TEAM,
            "get",
            "secret",
            &common::names::kubeconfig_secret(NAME),
        ],
    );
    let decode = |v: &Value| -> String {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().expect("base64 data"))
                .expect("base64"),
        )
        .expect("UTF-8")
    };
    let kubeconfig = decode(&copied["data"]["kubeconfig"]);
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
    let cluster_ip =
        json(&cluster, &["-n", &host_ns, "get", "service", "vcluster"])["spec"]["clusterIP"]
            .as_str()
            .expect("clusterIP")
            .to_string();
    let kubeconfig_file = cluster.dir().join("vcluster.kubeconfig");
    std::fs::write(&kubeconfig_file, &kubeconfig).expect("kubeconfig file");
    let inside = |args: &[&str]| -> Value {
        let node = cluster.real_node().expect("the real node");
        let netns = node.netns().expect("the node's namespace");
        let kubectl = cluster.tools().bin("kubectl").display().to_string();
        let kc = format!("--kubeconfig={}", kubeconfig_file.display());
        let server = format!("--server=https://{cluster_ip}:443");
        let name = format!("--tls-server-name=vcluster.{host_ns}.svc");
        let mut all = vec![kc.as_str(), server.as_str(), name.as_str()];
        all.extend_from_slice(args);
        let out = netns
            .exec(&kubectl, &all)
            .unwrap_or_else(|e| panic!("kubectl inside the vCluster: {e}"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
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
        || diagnostics(&cluster, &host_ns),
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

    let node = cluster.real_node().expect("the real node");
    node.drain(
        &cluster.client().await.expect("client"),
        Duration::from_secs(60),
    )
    .await;
}
