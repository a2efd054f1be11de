//! Controller benchmark (prints figures; asserts nothing about speed).
//!
//! N PlatformInstances (default 1,000) on a control plane of their own, each provisioned through
//! the stand-in vCluster chart. Provisioning is timed, and split into the time Helm's slots were
//! busy and the rest (the operator's own share, with the controller's and the API server's CPU
//! seconds and the controller's reconciles and writes). Once all are `Installing`, one full
//! resync (every instance reconciled once, driven by `--repair-interval`) is measured: the
//! controller's resident memory, its CPU seconds, its API writes (the goal is zero: nothing
//! changed), where its observations came from (the reflector stores or the API server), how its
//! vCluster API probes went (served, failed), and the reconcile p99. It ends with one gate line
//! per goal (`gate <name>: <figure> <= <limit>: ok|over`); it asserts nothing.
//!
//! Run: `cargo bench -p controller --bench resync` (env `BENCH_INSTANCES` sets N;
//! `BENCH_CONTROLLER` a controller binary to measure instead of this workspace's, e.g. one built
//! with another release profile).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use e2e::{ControlPlane, Options};
use support::{Controller, fixture_for};

fn proc_stat(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = 100.0; // USER_HZ on Linux
    let cpu = (fields
        .get(11)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0))
        / ticks;
    (cpu, memory(pid).0)
}

/// Resident memory in MiB from `/proc/<pid>/status`: all of it (`VmRSS`), its anonymous part
/// (heap, stacks) and its file-backed part (mostly the binary's own code).
fn memory(pid: u32) -> (f64, f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (mib("VmRSS:"), mib("RssAnon:"), mib("RssFile:"))
}

/// The machine's load averages over 1, 5 and 15 minutes (`/proc/loadavg`).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The process id of the kube-apiserver whose command line names `dir` (the control plane's).
fn apiserver_pid(dir: &std::path::Path) -> Option<u32> {
    let dir = dir.to_string_lossy();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        (cmdline.contains("kube-apiserver") && cmdline.contains(dir.as_ref())).then_some(pid)
    })
}

/// How many instances in `team` report phase `Installing`.
fn installing(cluster: &e2e::shared::Shared, team: &str) -> usize {
    let jsonpath = "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}";
    let phases = cluster
        .kubectl_ok(&["-n", team, "get", "pi", "-o", jsonpath], None)
        .unwrap_or_default();
    phases.lines().filter(|p| *p == "Installing").count()
}

/// The reconcile-duration histogram's cumulative buckets.
async fn buckets(controller: &Controller) -> Vec<(f64, f64)> {
    let text = e2e::control_plane::plain_get(controller.ops_port(), "/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("platform_operator_controller_reconcile_duration_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.split_whitespace().last()?.parse().ok()?))
        })
        .collect()
}

/// The 99th percentile's bucket bound from the difference of two cumulative histograms.
fn p99(before: &[(f64, f64)], after: &[(f64, f64)]) -> (f64, f64) {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .zip(before)
        .map(|((le, a), (_, b))| (*le, a - b))
        .collect();
    let total = diff.last().map(|d| d.1).unwrap_or(0.0);
    let bound = diff
        .iter()
        .find(|(_, c)| *c >= total * 0.99)
        .map(|d| d.0)
        .unwrap_or(f64::NAN);
    (bound, total)
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("BENCH_INSTANCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let repair = 60u64;
    // One vCluster control plane pod per instance: the fake node takes them all (its default
    // capacity, 1,000 pods, held a run at 3,000 with 2,000 instances waiting for their pods).
    let cp = ControlPlane::start(Options::new("bench-resync").node_pods(n.max(1000)))
        .await
        .expect("control plane");
    let cluster = cp.handle();
    cluster.install_crd().expect("CRD");
    // One SNI slot of the stand-in vCluster inside per instance.
    let fx = fixture_for(&cluster, "bench", n).await;
    let repair_flag = format!("{repair}s");
    let flags = [
        "--leader-elect=false",
        "--max-concurrent-installs=8",
        "--repair-interval",
        &repair_flag,
        "--log-level",
        "warn",
    ];
    // BENCH_CONTROLLER: another build of the controller (another release profile, or the code
    // before a change), measured the same way.
    let other = std::env::var_os("BENCH_CONTROLLER").map(std::path::PathBuf::from);
    let mut controller = Controller::start_watching_all(other.as_deref(), &cluster, &fx, &flags);
    let team = cluster.create_namespace("bench", &[]).expect("namespace");
    let manifest: String = (0..n)
        .map(|i| {
            format!(
                "---\napiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: i{i:04}, namespace: {team} }}\nspec: {{ version: 6.0.22 }}\n"
            )
        })
        .collect();
    // The binary started is the supervisor; the controller is its child. The figures below are
    // the controller's own (the supervisor's are printed apart).
    let supervisor = controller.pid();
    let pid = controller::reaper::descendants(&controller::reaper::processes(), supervisor as i32)
        .first()
        .map(|p| *p as u32)
        .expect("the supervised controller runs");
    let apiserver = apiserver_pid(cp.dir());
    let api_cpu = || apiserver.map(|p| proc_stat(p).0);
    let (cpu_start, _) = proc_stat(pid);
    let api_cpu_start = api_cpu();
    let start = Instant::now();
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&manifest))
        .expect("apply");
    // Progress from the controller's instances-by-phase gauge (listing 1,000 instances with
    // kubectl every few seconds would load the machine being measured); confirmed by the API
    // server once the gauge says all are there.
    let gauge = "platform_operator_controller_instances{phase=\"Installing\"}";
    loop {
        controller.assert_running();
        if controller.metric(gauge).await as usize == n && installing(&cluster, &team) == n {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3600),
            "only {} of {n} reached Installing:\n{}",
            installing(&cluster, &team),
            controller.log()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let provisioned = start.elapsed();
    let load_provisioned = loadavg();
    let (cpu_provisioned, _) = proc_stat(pid);
    let api_cpu_provisioned = api_cpu();
    let helm_seconds = controller
        .metric("platform_operator_controller_helm_duration_seconds_sum")
        .await;
    let provisioning_reconciles = controller
        .metric("platform_operator_controller_reconciles_total")
        .await;
    let provisioning_status_writes = controller
        .metric("platform_operator_controller_api_writes_total{kind=\"status\"}")
        .await;
    let provisioning_writes = controller
        .metric("platform_operator_controller_api_writes_total")
        .await;
    let provisioning_observations = (
        controller
            .metric_with(
                "platform_operator_controller_observations_total",
                "source=\"cache\"",
            )
            .await,
        controller
            .metric_with(
                "platform_operator_controller_observations_total",
                "source=\"api\"",
            )
            .await,
    );
    // Let the last status writes and their watch events settle, then measure one repair interval.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let c = &controller;
    let labelled = |metric: &'static str, label: &'static str, value: &'static str| async move {
        c.metric_with(metric, &format!("{label}=\"{value}\"")).await
    };
    let observations = |source| {
        labelled(
            "platform_operator_controller_observations_total",
            "source",
            source,
        )
    };
    let (cached0, live0) = (observations("cache").await, observations("api").await);
    const OUTCOMES: [&str; 2] = ["served", "failed"];
    let probes = || async {
        let mut counts = Vec::new();
        for outcome in OUTCOMES {
            counts.push(
                labelled(
                    "platform_operator_controller_vcluster_probes_total",
                    "outcome",
                    outcome,
                )
                .await,
            );
        }
        counts
    };
    let probes0 = probes().await;
    let (cpu0, _) = proc_stat(pid);
    let writes0 = controller
        .metric("platform_operator_controller_api_writes_total")
        .await;
    let reconciles0 = controller
        .metric("platform_operator_controller_reconciles_total")
        .await;
    let buckets0 = buckets(&controller).await;
    tokio::time::sleep(Duration::from_secs(repair + 10)).await;
    let (cpu1, rss) = proc_stat(pid);
    let writes1 = controller
        .metric("platform_operator_controller_api_writes_total")
        .await;
    let reconciles1 = controller
        .metric("platform_operator_controller_reconciles_total")
        .await;
    let (cached1, live1) = (observations("cache").await, observations("api").await);
    let probes1 = probes().await;
    let (p99_bound, counted) = p99(&buckets0, &buckets(&controller).await);
    let load_window = loadavg();
    let still_installing = installing(&cluster, &team);
    let sample = support::get(&cluster, &["-n", &team, "get", "pi", "i0000"])
        .map(|pi| pi["status"]["conditions"].to_string())
        .unwrap_or_default();

    println!(
        "# Controller resync benchmark ({n} instances, stand-in vCluster chart, repair interval {repair} s)\n"
    );
    if let Some(binary) = &other {
        println!(
            "controller binary: {} (BENCH_CONTROLLER)\n",
            binary.display()
        );
    }
    println!("| figure | value |\n|---|---|");
    println!(
        "| time to provision all {n} to Installing (8 concurrent installs) | {:.0} s |",
        provisioned.as_secs_f64()
    );
    let slots = 8.0;
    let helm_wall = helm_seconds / slots;
    println!(
        "| seconds inside Helm (sum over installs) / with 8 slots busy | {helm_seconds:.0} s / {helm_wall:.0} s |"
    );
    println!(
        "| operator's own share: provisioning time outside Helm's busy slots | {:.0} s ({:.0} %) |",
        provisioned.as_secs_f64() - helm_wall,
        100.0 * (provisioned.as_secs_f64() - helm_wall) / provisioned.as_secs_f64()
    );
    println!(
        "| controller CPU seconds while provisioning | {:.1} s |",
        cpu_provisioned - cpu_start
    );
    if let (Some(a), Some(b)) = (api_cpu_start, api_cpu_provisioned) {
        println!(
            "| kube-apiserver CPU seconds while provisioning | {:.1} s |",
            b - a
        );
    }
    println!(
        "| reconciles / API writes (of which status) while provisioning | {provisioning_reconciles:.0} / {provisioning_writes:.0} ({provisioning_status_writes:.0}) |"
    );
    println!(
        "| observations while provisioning from the reflector stores / the API server (each a fresh read of about nine objects) | {:.0} / {:.0} |",
        provisioning_observations.0, provisioning_observations.1
    );
    println!(
        "| reconciles in the measured window | {:.0} |",
        reconciles1 - reconciles0
    );
    println!(
        "| observations in the window from the reflector stores / the API server | {:.0} / {:.0} |",
        cached1 - cached0,
        live1 - live0
    );
    let window_probes: Vec<String> = probes1
        .iter()
        .zip(&probes0)
        .map(|(after, before)| format!("{:.0}", after - before))
        .collect();
    println!(
        "| vCluster API probes in the window, {} | {} |",
        OUTCOMES.join(" / "),
        window_probes.join(" / ")
    );
    println!(
        "| controller CPU seconds over the window (one full resync) | {:.2} s |",
        cpu1 - cpu0
    );
    let (_, anon, file) = memory(pid);
    println!(
        "| supervisor resident memory (VmRSS) | {:.1} MiB |",
        memory(supervisor).0
    );
    println!(
        "| controller resident memory (VmRSS) / of it anonymous (RssAnon) / file-backed (RssFile) | {rss:.1} MiB / {anon:.1} MiB / {file:.1} MiB |"
    );
    println!(
        "| API writes during the resync (nothing changed) | {:.0} |",
        writes1 - writes0
    );
    println!(
        "| reconcile p99 (histogram bucket bound, {counted:.0} reconciles) | <= {p99_bound} s |"
    );
    println!("| instances still Installing after the window | {still_installing} of {n} |");
    println!(
        "| load average (1, 5, 15 min) when provisioned / after the window | {load_provisioned} / {load_window} |"
    );
    if still_installing != n {
        eprintln!("conditions of i0000: {sample}");
    }
    println!();
    support::gate(&format!("controller-rss-{n}-idle"), rss, 64.0, "MiB");
    support::gate(&format!("idle-resync-cpu-{n}"), cpu1 - cpu0, 2.0, "s");
    support::gate(
        &format!("reconcile-p99-{n}"),
        p99_bound * 1000.0,
        50.0,
        "ms",
    );
    support::gate("idle-resync-api-writes", writes1 - writes0, 0.0, "");
}
