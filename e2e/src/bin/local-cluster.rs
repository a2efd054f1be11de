//! `local-cluster`: the local demo for people. `up` starts the control plane, installs the
//! PlatformInstance CRD, starts a local npm registry (verdaccio) with the **stand-in**
//! `@di-framework/platform` published into it, runs the admission webhook and the controller
//! (built by `e2e/run-demo.sh`) with the **stand-in** vCluster chart (the real chart and package
//! cannot be fetched here) and the **stand-in** syncer, which exports a kubeconfig for a second
//! API server with exactly the certificate names vCluster would serve, applies the example
//! instance, waits for it to be `Ready` (installed by the real Pulumi CLI), prints
//! `kubectl get pi -A`, its endpoints and where its kubeconfig is, and runs until Ctrl-C.

use std::path::{Path, PathBuf};
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
        /// Where the controller and webhook binaries are (default: the workspace's target/debug).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Keep the control plane's folder (data and logs) after it stops.
        #[arg(long)]
        keep: bool,
        /// Also start a real node (containerd, runc, CNI, kubelet, kube-proxy in a network
        /// namespace of its own) beside the KWOK node; needs root and the Debian packages that
        /// e2e/run-tests.sh installs.
        #[arg(long)]
        real_node: bool,
    },
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    Ok(digest.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli {
        command:
            Cmd::Up {
                example,
                bin_dir,
                keep,
                real_node,
            },
    } = Cli::parse();
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
    // The stand-in kubelet (Jobs) runs the cleanup Jobs' `controller cleanup` from bin_dir.
    let mut options = Options::new("local").operator_bin_dir(bin_dir.clone());
    if real_node {
        options = options.real_node();
    }
    let mut cp = ControlPlane::start(options).await?;
    if let Some(node) = cp.real_node() {
        let f = node.figures();
        eprintln!(
            "real node {} Ready in {:.1} s (images imported in {:.1} s)",
            e2e::real_node::NODE_NAME,
            f.node_ready.as_secs_f64(),
            f.images.as_secs_f64()
        );
    }
    if keep {
        cp.keep_files();
    }
    let cluster = cp.handle();
    cluster.install_crd()?;

    // The stand-in vCluster: a second API server, the stand-in chart, and the stand-in syncer
    // that issues its certificate and exports its kubeconfig when the chart's pod is ready.
    let inner = ControlPlane::start(Options::new("local-vcluster").standin_vcluster()).await?;
    let _syncer = e2e::standin_vcluster::StandInSyncer::start(cp.kubeconfig(), &inner)?;
    let chart_dir = cp.dir().join("chart");
    std::fs::create_dir_all(&chart_dir)?;
    let chart = e2e::standin_vcluster::package_chart(
        &cluster.helm,
        &chart_dir,
        e2e::standin_vcluster::CHART_VERSION,
    )?;
    let values = chart_dir.join("standin-values.yaml");
    std::fs::write(&values, "{}\n")?;

    // The npm registry with the stand-in platform package, and the installer's tools.
    eprintln!("starting the npm registry with the stand-in @di-framework/platform");
    let registry = e2e::npm::Registry::start(&cp.dir().join("npm-registry"))?;
    registry.publish_standins()?;
    let tools = e2e::tools::Tools::locate()?;
    let tool_bin = tools
        .bin("pulumi")
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
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
        .env(
            "PATH",
            format!(
                "{}:{}",
                tool_bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .args(["--npm-registry", registry.url()])
        .arg(format!(
            "--cleanup-image={}@{}",
            e2e::standin_kubelet::KNOWN_IMAGE,
            e2e::chart::TEST_DIGEST
        ))
        .arg("--pulumi-binary")
        .arg(tools.bin("pulumi"))
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
            &format!("sha256:{}", sha256_file(&chart)?),
        ])
        .arg("--vcluster-extra-values")
        .arg(&values)
        .arg("--helm-binary")
        .arg(&cluster.helm)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    e2e::process::die_with_parent(&mut controller);
    let mut controller = controller.spawn().context("starting the controller")?;

    // The person trying the demo gets an admin identity of their own (user demo-admin, bound to
    // cluster-admin), not the operator's: the protection policy exempts the operator's user,
    // so with the operator's kubeconfig `kubectl label svc vcluster` would be admitted.
    let user_kubeconfig = cp.user_kubeconfig(DEMO_USER, None)?;
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
    let namespace = manifest
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("namespace:")
                .map(|n| n.trim().to_string())
        })
        .unwrap_or_else(|| "default".to_string());
    let ns = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&ns))?;
    print!(
        "{}",
        cluster.kubectl_ok(
            &[
                "apply",
                "--server-side",
                "-f",
                &example.display().to_string()
            ],
            None
        )?
    );
    eprintln!("waiting for the example to be Ready (npm and pulumi install the platform)");
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = String::new();
    loop {
        let phases = cluster
            .kubectl_ok(
                &["get", "pi", "-A", "-o", "jsonpath={.items[*].status.phase}"],
                None,
            )
            .unwrap_or_default();
        if phases != last {
            eprintln!("  phase: {phases}");
            last = phases.clone();
        }
        if !phases.is_empty() && phases.split_whitespace().all(|p| p == "Ready") {
            break;
        }
        if Instant::now() > deadline {
            eprintln!(
                "the example is not Ready yet; see kubectl describe pi -A and {}",
                controller_log.display()
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

    println!(
        "\nThe control plane is up at {}; the stand-in vCluster's API server at {}.",
        cp.server(),
        inner.server()
    );
    println!(
        "  export KUBECONFIG={}   # you, as {DEMO_USER} (cluster-admin); the operator runs as {}",
        user_kubeconfig.display(),
        e2e::control_plane::ADMIN_USER
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
        "Then: kubectl describe pi -n {namespace}; kubectl get secret -n {namespace}; kubectl get ns -l platform.di-framework.dev/host-namespace"
    );
    println!(
        "The stand-in platform package is served by the npm registry at {} (log {}).",
        registry.url(),
        registry.handle().log().display()
    );
    let storage = cp
        .host_path(&cp.dir().join("storage").display().to_string())
        .unwrap_or_default();
    println!(
        "Each instance's storage directory is on the (stand-in) node under {}: `kubectl delete pi` with deletionPolicy: Delete runs a cleanup Job whose `controller cleanup` the stand-in kubelet (Jobs) really runs, and the directory goes (ls it before and after; kubectl get jobs -n {operator_ns}).",
        storage.display()
    );
    println!(
        "Logs are in {}/logs (controller.log among them); the instance's Pulumi project is under {}/state. Press Ctrl-C to stop.",
        cp.dir().display(),
        cp.dir().display()
    );
    common::http::shutdown_signal().await;
    eprintln!("stopping");
    e2e::process::terminate(&mut controller, Duration::from_secs(10));
    webhook.stop();
    cp.stop();
    Ok(())
}
