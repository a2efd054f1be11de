//! `local-cluster`: runs the local control plane for people. `up` starts it, installs the
//! PlatformInstance CRD and the example instance, prints how to reach it, and runs until Ctrl-C.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::{Parser, Subcommand};
use e2e::{ControlPlane, Options};

#[derive(Debug, Parser)]
#[command(
    name = "local-cluster",
    version,
    about = "A local Kubernetes control plane with the platform-operator CRD and an example instance."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start the control plane, install the CRD and the example instance, and run until Ctrl-C.
    Up {
        /// The example manifest to apply after the CRD (its namespace is created first).
        #[arg(long, default_value_os_t = repo_root().join("docs/examples/one.yaml"))]
        example: PathBuf,
        /// Keep the control plane's folder (data and logs) after it stops.
        #[arg(long)]
        keep: bool,
    },
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: Command, what: &str) -> anyhow::Result<String> {
    Ok(e2e::cmd::run(cmd, None)?.ok(what)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli {
        command: Cmd::Up { example, keep },
    } = Cli::parse();
    eprintln!(
        "starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK (first run builds them from Go modules)"
    );
    let mut cp = ControlPlane::start(Options::new("local")).await?;
    if keep {
        cp.keep_files();
    }
    let crds = repo_root().join("charts/platform-operator/crds");
    let mut apply = cp.kubectl();
    apply.args(["apply", "--server-side", "-f"]).arg(&crds);
    print!("{}", run(apply, "kubectl apply of the CRD")?);
    let mut wait = cp.kubectl();
    wait.args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/platforminstances.platform.di-framework.dev",
    ]);
    print!("{}", run(wait, "waiting for the CRD")?);

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
    let mut ns = cp.kubectl();
    ns.args([
        "create",
        "namespace",
        &namespace,
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    let ns_yaml = run(ns, "rendering the namespace")?;
    let mut apply_ns = cp.kubectl();
    apply_ns.args(["apply", "--server-side", "-f", "-"]);
    e2e::cmd::run(apply_ns, Some(&ns_yaml))?.ok("creating the namespace")?;
    let mut apply_example = cp.kubectl();
    apply_example
        .args(["apply", "--server-side", "-f"])
        .arg(&example);
    print!("{}", run(apply_example, "applying the example instance")?);
    let mut get = cp.kubectl();
    get.args(["get", "pi", "-A"]);
    print!("{}", run(get, "kubectl get pi -A")?);

    println!("\nThe control plane is up at {}.", cp.server());
    println!("  export KUBECONFIG={}", cp.kubeconfig().display());
    println!(
        "  export PATH={}:$PATH   # kubectl and helm built for the tests",
        cp.tools()
            .bin("kubectl")
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    println!(
        "Logs are in {}/logs. Press Ctrl-C to stop.",
        cp.dir().display()
    );
    common::http::shutdown_signal().await;
    eprintln!("stopping");
    cp.stop();
    Ok(())
}
