//! Installer benchmark (prints figures; asserts nothing about speed).
//!
//! On one control plane, with the stand-in `@di-framework/platform` in a local npm registry and
//! the real Pulumi CLI, two rounds side by side in one run, each with its own controller and a
//! fresh state volume (empty npm cache, Pulumi home and dependency trees):
//!
//! - **cold registry**: the registry this run started, serving its first requests;
//! - **warm registry**: the same registry, which has just served the same packages.
//!
//! In each round a first instance at a version, then a second at the same version; for each, the
//! time from `kubectl apply` to `Ready` and where it went: inside npm (and how many npm runs),
//! inside `pulumi up` itself, inside the rest of the Pulumi step (the stack's config file, the
//! stack's creation, pending operations, the outputs: any other Pulumi command and the work the
//! operator does in their place), inside Helm for the vCluster, and the rest (the operator's own
//! work and its queues). "Outside `pulumi up`" is time to Ready minus `pulumi up`'s own seconds.
//! Figures come from the controller's `platform_operator_controller_tool_duration_seconds` and
//! `platform_operator_controller_helm_duration_seconds`; Ready is seen by a watch
//! (`kubectl wait`), not a poll.
//!
//! Run: `cargo bench -p controller --bench install` (env `BENCH_VERSION`, default 6.0.22).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Instant;

use support::{Controller, fixture};

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
}

impl Figures {
    fn outside_up(&self) -> f64 {
        self.ready - self.spent.up
    }

    fn operator(&self) -> f64 {
        self.ready - self.spent.npm - self.spent.up - self.spent.pulumi_other - self.spent.helm
    }
}

async fn one(
    cluster: &e2e::shared::Shared,
    controller: &Controller,
    registry: &e2e::npm::RegistryHandle,
    (ns, version, label): (&str, &str, &str),
) -> Figures {
    let before = counters(controller).await;
    let downloads_before = registry.tarball_downloads(e2e::npm::STANDIN_PACKAGE, version);
    let manifest = format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {label}, namespace: {ns} }}\nspec:\n  version: {version}\n  platform:\n    tenants: [{{ name: acme }}]\n    users: [{{ name: dev, memberships: [{{ tenant: acme, role: developer }}] }}]\n"
    );
    let start = Instant::now();
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&manifest))
        .expect("apply");
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
    }
}

/// One round: a controller on a fresh state volume, a first and a second instance at `version`.
async fn round(
    cluster: &e2e::shared::Shared,
    registry: &e2e::npm::RegistryHandle,
    version: &str,
    name: &str,
) -> (Figures, Figures) {
    let fx = fixture(cluster, &format!("bench-install-{name}")).await;
    let ns = cluster.create_namespace("bench", &[]).expect("namespace");
    let controller = Controller::start(
        cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--watch-namespace",
            &ns,
            "--install-platform=true",
            "--log-level",
            "info",
        ],
    );
    let first = one(cluster, &controller, registry, (&ns, version, "first")).await;
    let second = one(cluster, &controller, registry, (&ns, version, "second")).await;
    (first, second)
}

fn row(name: &str, f: &Figures) {
    println!(
        "{name:<15} {:>7.1} {:>6.1} {:>4} {:>9.1} {:>7.1} {:>5.1} {:>8.1} {:>13.1} {:>9}",
        f.ready,
        f.spent.npm,
        f.spent.npm_runs,
        f.spent.up,
        f.spent.pulumi_other,
        f.spent.helm,
        f.operator(),
        f.outside_up(),
        f.downloads
    );
}

#[tokio::main]
async fn main() {
    let version = std::env::var("BENCH_VERSION").unwrap_or_else(|_| "6.0.22".into());
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let registry = e2e::npm::shared().expect("npm registry");
    let cold = round(&cluster, &registry, &version, "cold").await;
    let warm = round(&cluster, &registry, &version, "warm").await;
    println!(
        "installer benchmark: {version} of the stand-in @di-framework/platform, real Pulumi CLI, one run; seconds"
    );
    println!(
        "{:<15} {:>7} {:>6} {:>4} {:>9} {:>7} {:>5} {:>8} {:>13} {:>9}",
        "instance",
        "ready",
        "npm",
        "runs",
        "pulumi-up",
        "pulumi",
        "helm",
        "operator",
        "outside up",
        "downloads"
    );
    row("cold: first", &cold.0);
    row("cold: second", &cold.1);
    row("warm: first", &warm.0);
    row("warm: second", &warm.1);
    for (name, (first, second)) in [("cold", &cold), ("warm", &warm)] {
        println!(
            "{name}: ratio first/second time to Ready {:.2}; second: {} npm runs, {:.1} s outside pulumi up ({:.1} s without helm)",
            first.ready / second.ready,
            second.spent.npm_runs,
            second.outside_up(),
            second.outside_up() - second.spent.helm
        );
    }
}
