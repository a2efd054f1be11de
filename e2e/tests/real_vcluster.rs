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
//! The same install then proves issue 29's defects fixed on the real vCluster: the operator chart
//! is installed with `rbac.clusterAdmin=false` (Helm acts with the narrow ClusterRole, which must
//! hold every rule of the real chart's Role: defect 1) and a `--vcluster-extra-values` file (on
//! the state volume) renaming the syncer's ServiceAccount, under which the real syncer writes
//! `service/vcluster` at its first start through the admission policy (defect 4). Then: the
//! Deployment's pod template patched as the syncer's certificate rotation does, a watch counting
//! the control-plane pods (never two: defect 2); `service/vcluster` deleted under the operator's
//! identity (an admin is refused), a Pod and a ConfigMap made inside keeping their host copies,
//! the same objects, while the controller restores the Service and restarts the syncer (defect 3);
//! a second instance, and the two deleted with `deletionPolicy: Delete` and `Retain` (the real
//! vCluster's `state.db` and `pki/` removed, kept).
//!
//! Needs root, the Debian packages `e2e/run-tests.sh` installs for its real-node lane, and the
//! real vCluster's tools (`e2e/tools/build.sh vcluster`, which the test runs: cold, ~15 min).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e::chart::{Helm, chart_dir};
use e2e::cmd::run;
use e2e::images::OperatorInputs;
use e2e::real_vcluster::{COREDNS_IMAGE, DISTRO_IMAGE, VCLUSTER_IMAGE};
use e2e::{ControlPlane, Options};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use serde_json::Value;

const RELEASE: &str = "platform-operator";
const NS: &str = "platform-operator";
const CLEANUP_NS: &str = "platform-operator-cleanup";
const TEAM: &str = "team-a";
const NAME: &str = "one";
/// The second instance (deletionPolicy Retain; the first is deleted with Delete).
const SECOND: &str = "two";
const VERSION: &str = "6.0.22";
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
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
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
    let state =
        e2e::chart::state_volume(&cluster, NS).unwrap_or_else(|e| panic!("state volume: {e}"));
    // The operator image carries no extra values and the chart has no value for them (they come
    // with the image): the file is put on the state volume, which the controller mounts.
    std::fs::write(state.join("vcluster-extra-values.yaml"), &extra_values)
        .expect("extra values on the state volume");

    // The operator chart, its controller given the real chart's digest, Helm acting with the
    // narrow ClusterRole platform-operator (rbac.clusterAdmin=false: defect 1, the API server
    // refuses a Role granting what its creator lacks) and the syncer's account renamed.
    let chart_dir = chart_dir().display().to_string();
    let sets = [
        format!("image.digest={}", operator.digest),
        "image.pullPolicy=Never".into(),
        format!("npmRegistry=http://{node_ip}:{REGISTRY_PORT}/"),
        format!("storageRootBase={}", storage_root.display()),
        format!("cleanupNamespace={CLEANUP_NS}"),
        "rbac.clusterAdmin=false".into(),
        format!("extraArgs[0]=--vcluster-chart-sha256=sha256:{chart_sha}"),
        "extraArgs[1]=--vcluster-extra-values=/var/lib/platform-operator/state/vcluster-extra-values.yaml"
            .into(),
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
    let kubeconfig_file = cluster.dir().join("vcluster.kubeconfig");
    std::fs::write(&kubeconfig_file, &kubeconfig).expect("kubeconfig file");
    // (The Service's address is read at each call: a restored Service has a new one.)
    let inside_run = |args: &[&str]| -> Result<String, String> {
        let cluster_ip =
            json(&cluster, &["-n", &host_ns, "get", "service", "vcluster"])["spec"]["clusterIP"]
                .as_str()
                .expect("clusterIP")
                .to_string();
        let node = cluster.real_node().expect("the real node");
        let netns = node.netns().expect("the node's namespace");
        let kubectl = cluster.tools().bin("kubectl").display().to_string();
        let kc = format!("--kubeconfig={}", kubeconfig_file.display());
        let server = format!("--server=https://{cluster_ip}:443");
        let name = format!("--tls-server-name=vcluster.{host_ns}.svc");
        let mut all = vec![kc.as_str(), server.as_str(), name.as_str()];
        all.extend_from_slice(args);
        netns.exec(&kubectl, &all).map_err(|e| e.to_string())
    };
    let inside = |args: &[&str]| -> Value {
        let out = inside_run(args).unwrap_or_else(|e| panic!("kubectl inside the vCluster: {e}"));
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

    let client = cluster.client().await.expect("client");
    let instance_ready = |what: &str| {
        wait_for(
            what,
            Duration::from_secs(300),
            || diagnostics(&cluster, &host_ns),
            || {
                let pi = json(&cluster, &["-n", TEAM, "get", "platforminstance", NAME]);
                condition(&pi, "Ready").as_deref() == Some("True")
            },
        )
    };
    // The control plane's one pod, Ready, and not `old`: its UID.
    let new_control_plane = |old: &str| -> Option<String> {
        let pods = json(
            &cluster,
            &["-n", &host_ns, "get", "pods", "-l", "app=vcluster"],
        );
        let items = pods["items"].as_array()?;
        let [pod] = items.as_slice() else { return None };
        let uid = pod["metadata"]["uid"].as_str()?;
        (uid != old && ready(pod) && pod["metadata"]["deletionTimestamp"].is_null())
            .then(|| uid.to_string())
    };

    // A second instance, `deletionPolicy: Retain`, started now so that it comes up while the
    // first is rotated and restored (the deletion policies are checked at the end).
    let second = format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ \
         name: {SECOND}, namespace: {TEAM} }}\nspec:\n  version: {VERSION}\n  target: {{ type: \
         vcluster }}\n  deletionPolicy: Retain\n"
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&second));

    // Defect 2: the syncer's certificate rotation patches its Deployment's pod template (a merge
    // patch of one annotation, `finishPendingRollout` in pkg/certs/watcher.go). The real rotation
    // fires only for certificates within 90 days of expiry (the syncer's are a year old at most
    // here), so the test patches as it does. A watch counts the control-plane pods: never two
    // running at once.
    let deployment = json(&cluster, &["-n", &host_ns, "get", "deployment", "vcluster"]);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    // It records the most pod objects at once and the most not in a terminal phase. A pod that ended
    // (Succeeded or Failed: its containers have stopped) stays an object until the kubelet has
    // released it, and the Deployment controller's Recreate waits for the end, not the object:
    // the first real run counted 2 objects at once, the old one ended.
    let most = Arc::new(Mutex::new((0usize, 0usize)));
    let into = most.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &host_ns);
    let config = watcher::Config::default().labels("app=vcluster,release=vcluster");
    let watch = tokio::spawn(async move {
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
                _ => continue,
            };
            let running = objects.values().filter(|ended| !**ended).count();
            let mut most = into.lock().expect("lock");
            *most = (most.0.max(objects.len()), most.1.max(running));
        }
    });
    wait_for(
        "the watch to see the control plane's pod",
        Duration::from_secs(30),
        String::new,
        || *most.lock().expect("lock") == (1, 1),
    );
    let rotation = format!(
        r#"{{"spec":{{"template":{{"metadata":{{"annotations":{{"{CERT_ROTATION_ANNOTATION}":"{}"}}}}}}}}}}"#,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
    );
    let rotated = Instant::now();
    kubectl(
        &cluster,
        &[
            "-n",
            &host_ns,
            "patch",
            "deployment",
            "vcluster",
            "--type=merge",
            "-p",
            &rotation,
        ],
        None,
    );
    let mut rolled = None;
    wait_for(
        "the rotated control plane's pod Ready",
        Duration::from_secs(300),
        || diagnostics(&cluster, &host_ns),
        || {
            rolled = new_control_plane(&pod_uid);
            rolled.is_some()
        },
    );
    let rotated_in = rotated.elapsed();
    instance_ready("the instance Ready after the rotation");
    std::thread::sleep(Duration::from_secs(2));
    let (objects, at_once) = *most.lock().expect("lock");
    watch.abort();
    assert_eq!(at_once, 1, "two control-plane pods running at once");
    let version = inside(&["get", "--raw", "/version"]);
    assert_eq!(version["gitVersion"], "v1.35.4", "{version}");
    println!(
        "figure: pod template patched as the certificate rotation does: new control plane Ready \
         in {:.1} s, at most {at_once} control-plane pod running at once ({objects} pod \
         objects, the ended one still held)",
        rotated_in.as_secs_f64()
    );
    let control_plane = rolled.expect("the rotated pod");

    // Defect 3: service/vcluster deleted. Inside the vCluster first: a ConfigMap and a bare Pod
    // using it (CoreDNS serving a Corefile from the ConfigMap), synced to the host namespace
    // beside what the syncer already syncs (its CoreDNS, Services, Endpoints, the certificates'
    // Secret). With the chart's default (setOwner true) all of it named the Service as owner: the
    // garbage collector deleted the host copies within seconds of the Service, and the running
    // syncer then deleted the virtual Pod and ConfigMap themselves (a host copy gone is taken for
    // a deletion: pods/syncer.go, configmaps/to_host_syncer.go), before any restore could act.
    let manifest = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: keep, namespace: default }}\ndata:\n  \
         Corefile: |\n    .:1053 {{\n        whoami\n    }}\n---\napiVersion: v1\nkind: Pod\n\
         metadata: {{ name: keeper, namespace: default }}\nspec:\n  containers:\n    - name: dns\n      \
         image: {COREDNS_IMAGE}\n      imagePullPolicy: Never\n      args: [-conf, /etc/coredns/Corefile]\n      \
         volumeMounts: [{{ name: config, mountPath: /etc/coredns }}]\n  volumes:\n    - name: config\n      \
         configMap: {{ name: keep }}\n"
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
    wait_for(
        "the Pod made inside Ready on the host",
        Duration::from_secs(120),
        || diagnostics(&cluster, &host_ns),
        || json_opt(&cluster, &["-n", &host_ns, "get", "pod", host_pod]).is_some_and(|p| ready(&p)),
    );
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
        || diagnostics(&cluster, &host_ns),
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
        || diagnostics(&cluster, &host_ns),
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
        || format!("{}\n{}", survey.borrow(), diagnostics(&cluster, &host_ns)),
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

    // Deletion: the first instance with `deletionPolicy: Delete`, the second with `Retain`. The
    // data the real vCluster wrote into each storage directory (kine's sqlite database
    // `state.db` and the certificates `pki/`) is there before; after, the first's is gone (the
    // cleanup Job), the second's kept.
    let second_host = common::names::host_namespace(TEAM, SECOND);
    wait_for(
        "the second instance Ready",
        Duration::from_secs(600),
        || diagnostics(&cluster, &second_host),
        || {
            let pi = json(&cluster, &["-n", TEAM, "get", "platforminstance", SECOND]);
            condition(&pi, "Ready").as_deref() == Some("True")
        },
    );
    let data = |name: &str| {
        let host = common::names::host_namespace(TEAM, name);
        let dir = storage_root.join(common::names::storage_dir(TEAM, name, &host));
        (dir.join("state.db"), dir.join("pki"))
    };
    for name in [NAME, SECOND] {
        let (db, pki) = data(name);
        assert!(
            db.is_file() && pki.join("ca.crt").is_file(),
            "{name}: {db:?}, {pki:?}"
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
        || diagnostics(&cluster, &host_ns),
        || {
            let list = json(&cluster, &["-n", TEAM, "get", "platforminstances"]);
            list["items"].as_array().is_some_and(Vec::is_empty)
        },
    );
    let (db, pki) = data(NAME);
    assert!(
        !db.exists() && !pki.exists(),
        "Delete removed {db:?} and {pki:?}"
    );
    let (db, pki) = data(SECOND);
    assert!(
        db.is_file() && pki.join("ca.crt").is_file(),
        "Retain kept {db:?}, {pki:?}"
    );
    println!(
        "figure: both instances deleted in {:.1} s: Delete removed the real vCluster's state.db \
         and pki, Retain kept them",
        deleting.elapsed().as_secs_f64()
    );

    let node = cluster.real_node().expect("the real node");
    node.drain(
        &cluster.client().await.expect("client"),
        Duration::from_secs(60),
    )
    .await;
}
