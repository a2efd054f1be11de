//! `local-cluster`: the local demo for people. `up` starts the control plane with a real node,
//! starts a local npm registry (verdaccio) with the **stand-in** `@di-framework/platform`
//! published into it (the real package cannot be fetched here), builds the operator image from
//! the `Dockerfile` with the real vCluster chart inside, `helm install`s the operator chart on the
//! real node ([`e2e::operator_on_node`]), applies the example instance, waits for it to be
//! `Ready` (the real vCluster, the platform installed by the real Pulumi CLI in an install pod
//! on the node), prints `kubectl get pi -A`, its endpoints and where its kubeconfig is, and
//! runs until Ctrl-C.
//!
//! `up --process` is the lighter mode (no root needed): the webhook and the controller run as
//! processes on this machine with the **stand-in** vCluster chart and syncer, which export a
//! kubeconfig for a second API server with exactly the certificate names vCluster would serve.
//! The platform program runs only in install pods, which this mode does not start: its
//! controller runs with `--install-platform=false`, and the example stops at `Installing` with
//! its vCluster serving and its kubeconfig written (condition `Installed`, reason
//! `InstallerDisabled`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use e2e::{ControlPlane, Options};

/// The user the person trying the demo acts as: an admin of their own, not the operator.
const DEMO_USER: &str = "demo-admin";

#[derive(Debug, Parser)]
#[command(
    name = "local-cluster",
    version,
    about = "A local Kubernetes control plane running platform-operator with an example instance."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start everything, apply the example instance, and run until Ctrl-C.
    Up {
        /// The example manifest to apply (its namespace is created first).
        #[arg(long, default_value_os_t = e2e::repo_root().join("docs/examples/one.yaml"))]
        example: PathBuf,
        /// Keep the control plane's folder (data and logs) after it stops.
        #[arg(long)]
        keep: bool,
        /// Run the webhook and the controller as processes on this machine with the stand-in
        /// vCluster, instead of the operator chart and the real vCluster on a real node (which
        /// need root, the Debian packages e2e/run-tests.sh installs and the real vCluster's
        /// tools, `e2e/tools/build.sh vcluster`). The platform program is not installed: the
        /// controller runs with --install-platform=false (the program runs only in install
        /// pods), so the example stops at Installing with its vCluster and kubeconfig.
        #[arg(long)]
        process: bool,
        /// With --process: also start a real node (containerd, runc, CNI, kubelet, kube-proxy
        /// in a network namespace of its own) beside the KWOK node.
        #[arg(long, requires = "process")]
        real_node: bool,
        /// Where the controller and webhook binaries are (default: the workspace's
        /// target/debug); with --process only (the chart mode builds the image from the
        /// release binaries).
        #[arg(long, requires = "process")]
        bin_dir: Option<PathBuf>,
    },
}

/// What runs the operator: the chart on the real node, or processes on this machine.
enum Operator {
    /// `helm install` of the operator chart on the real node.
    Chart,
    /// The webhook and the controller as processes, with the stand-in vCluster.
    Process {
        /// The stand-in vCluster's inside API server.
        inner: Box<ControlPlane>,
        /// Kept running until the demo stops.
        _syncer: e2e::standin_vcluster::StandInSyncer,
        webhook: e2e::webhook::Webhook,
        controller: std::process::Child,
        controller_log: PathBuf,
    },
}

/// The running demo: the control plane, the npm registry (with the chart: the process mode
/// installs no platform) and the operator.
struct Demo {
    cp: ControlPlane,
    registry: Option<e2e::npm::Registry>,
    operator: Operator,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli {
        command:
            Cmd::Up {
                example,
                keep,
                process,
                real_node,
                bin_dir,
            },
    } = Cli::parse();
    let mut demo = if process {
        up_process(bin_dir, real_node).await?
    } else {
        up_chart().await?
    };
    if keep {
        demo.cp.keep_files();
    }
    let cluster = demo.cp.handle();

    // The person trying the demo gets an admin identity of their own (user demo-admin, bound to
    // cluster-admin), not the operator's: the protection policy exempts the operator's user,
    // so with the operator's kubeconfig `kubectl label svc vcluster` would be admitted.
    let user_kubeconfig = demo.cp.user_kubeconfig(DEMO_USER, None)?;
    cluster.kubectl_ok(
        &[
            "create",
            "clusterrolebinding",
            DEMO_USER,
            "--clusterrole=cluster-admin",
            &format!("--user={DEMO_USER}"),
        ],
        None,
    )?;

    // The example instance, in its own namespace (the webhook serves every namespace).
    let manifest = std::fs::read_to_string(&example)
        .with_context(|| format!("reading {}", example.display()))?;
    let parsed: serde_json::Value = serde_saphyr::from_str(&manifest)
        .with_context(|| format!("parsing {}", example.display()))?;
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    let namespace = text(&parsed["metadata"]["namespace"]).unwrap_or_else(|| "default".to_string());
    let name = text(&parsed["metadata"]["name"])
        .with_context(|| format!("{} names no metadata.name", example.display()))?;
    let ns = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&ns))?;
    // Under the chart, the API server calls the webhook through its Service as soon as
    // kube-proxy has its endpoint: until then the apply is refused and is tried again.
    let applied = Instant::now();
    let example_path = example.display().to_string();
    let out = loop {
        match cluster.kubectl_ok(&["apply", "--server-side", "-f", &example_path], None) {
            Ok(out) => break out,
            Err(e)
                if e.to_string().contains("failed calling webhook")
                    && applied.elapsed() < Duration::from_secs(60) =>
            {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    print!("{out}");
    // With the chart: Ready. As processes the platform is not installed (no install pods): the
    // instance stops at Installing, its vCluster serving and its kubeconfig written.
    let (goal, done) = match demo.operator {
        Operator::Chart => (
            "Ready (the vCluster starts, npm and pulumi install the platform in install pods)",
            "Ready",
        ),
        Operator::Process { .. } => (
            "Installing with its vCluster and kubeconfig (--process installs no platform: the program runs only in install pods)",
            "Installing",
        ),
    };
    eprintln!("waiting for the example to be {goal}");
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut last = String::new();
    loop {
        let phases = cluster
            .kubectl_ok(
                &["get", "pi", "-A", "-o", "jsonpath={.items[*].status.phase}"],
                None,
            )
            .unwrap_or_default();
        if phases != last {
            eprintln!(
                "  phase: {phases} ({:.0} s)",
                applied.elapsed().as_secs_f64()
            );
            last = phases.clone();
        }
        let reached = !phases.is_empty() && phases.split_whitespace().all(|p| p == done);
        if reached && (done == "Ready" || installer_disabled(&cluster)) {
            break;
        }
        if Instant::now() > deadline {
            eprintln!(
                "the example is not {done} yet; see kubectl describe pi -A and {}",
                demo.controller_logs()
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    print!("{}", cluster.kubectl_ok(&["get", "pi", "-A"], None)?);
    let endpoints = cluster.kubectl_ok(
        &[
            "get",
            "pi",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}: http {.status.endpoints.http}, routes {.status.endpoints.routeUrlPattern}, kubeconfig Secret {.metadata.namespace}/{.status.kubeconfigSecretRef.name} (key {.status.kubeconfigSecretRef.key}){\"\\n\"}{end}",
        ],
        None,
    )?;
    println!("\nEndpoints and kubeconfig:\n{endpoints}");

    println!("\nThe control plane is up at {}.", demo.cp.server());
    println!(
        "  export KUBECONFIG={}   # you, as {DEMO_USER} (cluster-admin); the operator runs as {}",
        user_kubeconfig.display(),
        demo.operator_user()
    );
    println!(
        "  export PATH={}:$PATH   # kubectl and helm built for the tests",
        cluster
            .kubectl
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    println!(
        "Then: kubectl describe pi -n {namespace} {name}; kubectl get secret -n {namespace}; kubectl get ns -l platform.di-framework.dev/host-namespace"
    );
    if let Some(registry) = &demo.registry {
        println!(
            "The stand-in platform package is served by the npm registry at {} (log {}).",
            registry.url(),
            registry.handle().log().display()
        );
    }
    demo.print_notes(&namespace, &name)?;
    println!(
        "Logs: {}; the control plane's in {}/logs. Press Ctrl-C to stop.",
        demo.controller_logs(),
        demo.cp.dir().display()
    );
    common::http::shutdown_signal().await;
    eprintln!("stopping");
    demo.stop();
    Ok(())
}

/// The operator chart on a real node with the real vCluster.
async fn up_chart() -> anyhow::Result<Demo> {
    eprintln!(
        "building the images: the real vCluster's (from ../shared/vendor/vcluster), the operator's from the Dockerfile (cached)"
    );
    let built = e2e::operator_on_node::build().context(
        "building the images (needs root, buildah and the real vCluster's tools: e2e/run-demo.sh builds them; or run with --process)",
    )?;
    eprintln!(
        "starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK and a real node (first run builds them from Go modules)"
    );
    let mut cp = ControlPlane::start(Options::new("local").real_node_with_dns()).await?;
    if let Some(node) = cp.real_node() {
        let f = node.figures();
        eprintln!(
            "real node {} Ready in {:.1} s",
            e2e::real_node::NODE_NAME,
            f.node_ready.as_secs_f64()
        );
    }
    eprintln!("starting the npm registry with the stand-in @di-framework/platform");
    let registry = e2e::npm::Registry::start(&cp.dir().join("npm-registry"))?;
    registry.publish_standins()?;
    e2e::operator_on_node::prepare_node(&mut cp, &built, registry.url())?;
    eprintln!("helm install of charts/platform-operator with the operator image");
    let installed = e2e::operator_on_node::install(
        &cp,
        &built,
        &[e2e::operator_on_node::chart_digest_arg(&built, 0)],
        |_| Ok(()),
    )?;
    eprintln!(
        "the operator's pods Ready {:.1} s after helm install",
        installed.ready_after.as_secs_f64()
    );
    Ok(Demo {
        cp,
        registry: Some(registry),
        operator: Operator::Chart,
    })
}

/// Whether every instance says the platform program is not run (condition `Installed`, reason
/// `InstallerDisabled`): its vCluster serves and its kubeconfig is written, all a controller with
/// `--install-platform=false` does.
fn installer_disabled(cluster: &e2e::shared::Shared) -> bool {
    let reasons = cluster
        .kubectl_ok(
            &[
                "get",
                "pi",
                "-A",
                "-o",
                r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Installed")].reason}{" "}{end}"#,
            ],
            None,
        )
        .unwrap_or_default();
    let reasons: Vec<&str> = reasons.split_whitespace().collect();
    !reasons.is_empty() && reasons.iter().all(|r| *r == "InstallerDisabled")
}

/// The webhook and the controller as processes, with the stand-in vCluster; the controller runs
/// with `--install-platform=false` (the platform program runs only in install pods).
async fn up_process(bin_dir: Option<PathBuf>, real_node: bool) -> anyhow::Result<Demo> {
    let bin_dir = bin_dir.unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| e2e::repo_root().join("target"))
            .join("debug")
    });
    for b in ["controller", "webhook"] {
        if !bin_dir.join(b).exists() {
            bail!(
                "{} is missing: run e2e/run-demo.sh (it builds both binaries) or pass --bin-dir",
                bin_dir.join(b).display()
            );
        }
    }
    eprintln!(
        "starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK (first run builds them from Go modules)"
    );
    // The cleanup Jobs run only on a real node, with the operator image imported.
    let mut options = Options::new("local");
    if real_node {
        options = options.real_node_for_jobs();
    }
    let cp = ControlPlane::start(options).await?;
    if let Some(node) = cp.real_node() {
        let f = node.figures();
        eprintln!(
            "real node {} Ready in {:.1} s (images imported in {:.1} s)",
            e2e::real_node::NODE_NAME,
            f.node_ready.as_secs_f64(),
            f.images.as_secs_f64()
        );
    }
    let cluster = cp.handle();
    cluster.install_crd()?;

    // The stand-in vCluster: a second API server, the stand-in chart, and the stand-in syncer
    // that issues its certificate and exports its kubeconfig when the chart's pod is ready.
    let inner = ControlPlane::start(Options::new("local-vcluster").standin_vcluster()).await?;
    let syncer = e2e::standin_vcluster::StandInSyncer::start(cp.kubeconfig(), &inner)?;
    let chart_dir = cp.dir().join("chart");
    std::fs::create_dir_all(&chart_dir)?;
    let chart = e2e::standin_vcluster::package_chart(
        &cluster.helm,
        &chart_dir,
        e2e::standin_vcluster::CHART_VERSION,
    )?;
    let values = chart_dir.join("standin-values.yaml");
    std::fs::write(&values, "{}\n")?;

    let passphrase = cp.dir().join("passphrase");
    std::fs::write(&passphrase, format!("demo-{}", std::process::id()))?;

    // The operator's namespace, the webhook and the controller.
    let operator_ns = "platform-operator";
    cluster.kubectl_ok(&["create", "namespace", operator_ns], None)?;
    let port = e2e::control_plane::free_port()?;
    // Registered exactly as the chart registers them (every namespace, the same rules and
    // matchConditions), so an instance applied in any namespace is defaulted and checked.
    e2e::webhook::register_in(&cluster, "demo", port, e2e::webhook::Scope::LikeTheChart)?;
    let mut webhook = e2e::webhook::Webhook::start(
        &bin_dir.join("webhook"),
        &cluster,
        "demo",
        operator_ns,
        &["--log-level", "info"],
        Some(port),
    );
    webhook.wait_ready().await;
    let controller_log = cp.dir().join("logs/controller.log");
    let log = std::fs::File::create(&controller_log)?;
    let mut controller = Command::new(bin_dir.join("controller"));
    controller
        .env("KUBECONFIG", cp.kubeconfig())
        // The platform program runs only in install pods, which this mode does not start: the
        // instance stops at Installing with its vCluster and kubeconfig.
        .arg("--install-platform=false")
        .arg(format!(
            "--cleanup-image={}",
            cp.operator_image().unwrap_or(e2e::chart::TEST_IMAGE)
        ))
        .arg("--passphrase-file")
        .arg(&passphrase)
        .args([
            "--namespace",
            operator_ns,
            "--operator-user",
            e2e::control_plane::ADMIN_USER,
            "--target-poll",
            "2s",
        ])
        .args([
            "--metrics-bind-address",
            &format!("127.0.0.1:{}", e2e::control_plane::free_port()?),
        ])
        .arg("--state-dir")
        .arg(cp.dir().join("state"))
        .arg("--storage-root-base")
        .arg(cp.dir().join("storage"))
        .arg("--vcluster-chart")
        .arg(&chart)
        .args([
            "--vcluster-chart-sha256",
            &format!("sha256:{}", e2e::images::sha256_file(&chart)?),
        ])
        .arg("--vcluster-extra-values")
        .arg(&values)
        .arg("--helm-binary")
        .arg(&cluster.helm)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    e2e::process::die_with_parent(&mut controller);
    let controller = controller.spawn().context("starting the controller")?;

    Ok(Demo {
        cp,
        registry: None,
        operator: Operator::Process {
            inner: Box::new(inner),
            _syncer: syncer,
            webhook,
            controller,
            controller_log,
        },
    })
}

impl Demo {
    /// Where the controller's log is.
    fn controller_logs(&self) -> String {
        match &self.operator {
            Operator::Chart => format!(
                "kubectl -n {} logs deploy/platform-operator-controller",
                e2e::operator_on_node::NAMESPACE
            ),
            Operator::Process { controller_log, .. } => controller_log.display().to_string(),
        }
    }

    /// The identity the operator acts as.
    fn operator_user(&self) -> String {
        match &self.operator {
            Operator::Chart => format!(
                "system:serviceaccount:{}:platform-operator",
                e2e::operator_on_node::NAMESPACE
            ),
            Operator::Process { .. } => e2e::control_plane::ADMIN_USER.to_string(),
        }
    }

    /// What is where, for the example instance `namespace/name`.
    fn print_notes(&self, namespace: &str, name: &str) -> anyhow::Result<()> {
        let cluster = self.cp.handle();
        match &self.operator {
            Operator::Chart => {
                let host_ns = common::names::host_namespace(namespace, name);
                let secret = common::names::kubeconfig_secret(name);
                let kubeconfig = cluster.kubectl_ok(
                    &[
                        "-n",
                        namespace,
                        "get",
                        "secret",
                        &secret,
                        "-o",
                        "jsonpath={.data.kubeconfig}",
                    ],
                    None,
                )?;
                let file = self.cp.dir().join(format!("{name}.kubeconfig"));
                use base64::Engine as _;
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(kubeconfig.trim())
                    .unwrap_or_default();
                std::fs::write(&file, decoded)?;
                let cluster_ip = cluster.kubectl_ok(
                    &[
                        "-n",
                        &host_ns,
                        "get",
                        "service",
                        "vcluster",
                        "-o",
                        "jsonpath={.spec.clusterIP}",
                    ],
                    None,
                )?;
                let netns = self
                    .cp
                    .real_node()
                    .and_then(|n| n.netns())
                    .map(|n| n.name().to_string())
                    .unwrap_or_default();
                println!(
                    "The vCluster runs in host namespace {host_ns} (kubectl get pods -n {host_ns}); its admin kubeconfig (Secret {namespace}/{secret}) is in {file}. It names the in-cluster address, reached from the node's network namespace:
  ip netns exec {netns} kubectl --kubeconfig {file} --server https://{cluster_ip}:443 --tls-server-name vcluster.{host_ns}.svc get ns",
                    file = file.display()
                );
                println!(
                    "Each instance's storage directory is on the real node under {}: `kubectl delete pi -n {namespace} {name}` (deletionPolicy: Delete) runs a cleanup Job in a real container there, and the directory goes (kubectl get jobs -n {}).",
                    self.cp.dir().join("instances").display(),
                    e2e::operator_on_node::CLEANUP_NAMESPACE
                );
            }
            Operator::Process { inner, .. } => {
                println!(
                    "The stand-in vCluster's API server is at {}; the platform is not installed into it (--process runs the controller with --install-platform=false: the program runs only in install pods, which the chart mode starts on its real node).",
                    inner.server()
                );
                let storage = self.cp.dir().join("storage");
                println!(
                    "Each instance's storage directory is {}/<dir> on the node its control plane runs on: with --real-node, `kubectl delete pi` with deletionPolicy: Delete runs a cleanup Job there whose `controller cleanup` removes it (ls it before and after; kubectl get jobs -n platform-operator); on the KWOK node no Job runs.",
                    storage.display()
                );
            }
        }
        Ok(())
    }

    fn stop(mut self) {
        if let Operator::Process {
            mut webhook,
            mut controller,
            ..
        } = self.operator
        {
            e2e::process::terminate(&mut controller, Duration::from_secs(10));
            webhook.stop();
        }
        self.cp.stop();
    }
}
