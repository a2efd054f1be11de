//! Installer benchmark (prints figures; asserts nothing about speed).
//!
//! On one control plane, with the stand-in `@di-framework/platform` in a local npm registry and
//! the real Pulumi CLI: the time from `kubectl apply` to `Ready` of a first instance at a
//! version (empty npm cache and Pulumi home), then of a second instance at the same version
//! (the shared caches warm), side by side in one run; and for each, the operator's own overhead:
//! time to Ready minus the seconds spent inside npm and pulumi (and, shown apart, inside Helm
//! for the vCluster).
//!
//! Run: `cargo bench -p controller --bench install` (env `BENCH_VERSION`, default 6.0.22).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::{Controller, fixture};

async fn sum(controller: &Controller, metric: &str) -> f64 {
    controller.metric(&format!("{metric}_sum")).await
}

struct Figures {
    ready: f64,
    npm_pulumi: f64,
    helm: f64,
    downloads: usize,
}

async fn one(
    cluster: &e2e::shared::Shared,
    controller: &Controller,
    registry: &e2e::npm::RegistryHandle,
    version: &str,
    label: &str,
) -> Figures {
    let ns = cluster.create_namespace("bench", &[]).expect("namespace");
    let tools_before = sum(
        controller,
        "platform_operator_controller_tool_duration_seconds",
    )
    .await;
    let helm_before = sum(
        controller,
        "platform_operator_controller_helm_duration_seconds",
    )
    .await;
    let downloads_before = registry.tarball_downloads(e2e::npm::STANDIN_PACKAGE, version);
    let manifest = format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {label}, namespace: {ns} }}\nspec:\n  version: {version}\n  platform:\n    tenants: [{{ name: acme }}]\n    users: [{{ name: dev, memberships: [{{ tenant: acme, role: developer }}] }}]\n"
    );
    let start = Instant::now();
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&manifest))
        .expect("apply");
    loop {
        let phase = cluster
            .kubectl_ok(
                &[
                    "-n",
                    &ns,
                    "get",
                    "pi",
                    label,
                    "-o",
                    "jsonpath={.status.phase}",
                ],
                None,
            )
            .unwrap_or_default();
        if phase == "Ready" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "{label} never became Ready (phase {phase})\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready = start.elapsed().as_secs_f64();
    Figures {
        ready,
        npm_pulumi: sum(
            controller,
            "platform_operator_controller_tool_duration_seconds",
        )
        .await
            - tools_before,
        helm: sum(
            controller,
            "platform_operator_controller_helm_duration_seconds",
        )
        .await
            - helm_before,
        downloads: registry.tarball_downloads(e2e::npm::STANDIN_PACKAGE, version)
            - downloads_before,
    }
}

#[tokio::main]
async fn main() {
    let version = std::env::var("BENCH_VERSION").unwrap_or_else(|_| "6.0.22".into());
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let registry = e2e::npm::shared().expect("npm registry");
    let fx = fixture(&cluster, "bench-install").await;
    let controller = Controller::start_watching_all(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--install-platform=true",
            "--log-level",
            "info",
        ],
    );
    let first = one(&cluster, &controller, &registry, &version, "first").await;
    let second = one(&cluster, &controller, &registry, &version, "second").await;
    let row = |name: &str, f: &Figures| {
        println!(
            "{name:<8} ready {:>7.1} s   npm+pulumi {:>7.1} s   helm {:>5.1} s   operator overhead {:>5.1} s ({:.1} s with helm)   package downloads {}",
            f.ready,
            f.npm_pulumi,
            f.helm,
            f.ready - f.npm_pulumi - f.helm,
            f.ready - f.npm_pulumi,
            f.downloads
        );
    };
    println!(
        "installer benchmark: {version} of the stand-in @di-framework/platform, real Pulumi CLI, one run"
    );
    row("first", &first);
    row("second", &second);
    println!(
        "ratio first/second time to Ready: {:.2}   npm+pulumi first/second: {:.2}",
        first.ready / second.ready,
        first.npm_pulumi / second.npm_pulumi
    );
}
