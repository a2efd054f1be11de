//! Helm benchmark (prints figures; asserts nothing about speed): what one
//! `helm upgrade --install` of the stand-in vCluster chart costs, as the controller runs it.
//!
//! On a control plane of its own (API server and etcd only: no controller-manager, scheduler or
//! node, so that nothing but Helm works while it runs), the variants below install the stand-in
//! chart into fresh host namespaces, interleaved round by round so that load hits them alike.
//! For each run: wall time, Helm's own CPU seconds (user + system of the waited-for child, from
//! this process's `cutime`/`cstime` in `/proc/self/stat`), the API server's and etcd's CPU seconds
//! over the run (their `/proc/<pid>/stat`), and the API requests it made (the delta of the API
//! server's `apiserver_request_total`, less the requests of reading it). An idle row gives the
//! API server's and etcd's CPU over the same wall time with no Helm.
//!
//! Run: `cargo bench -p controller --bench helm` (env `BENCH_ROUNDS`, default 10).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::{ControlPlane, Options};

/// USER_HZ on Linux.
const TICKS: f64 = 100.0;

/// Fields of `/proc/<pid>/stat` after the command: (utime + stime, cutime + cstime) in seconds.
fn cpu(pid: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0);
    ((at(11) + at(12)) / TICKS, (at(13) + at(14)) / TICKS)
}

/// The pid of the process whose command line starts with a binary named `name` and mentions
/// `dir` (the control plane's folder).
fn pid_of(name: &str, dir: &Path) -> String {
    let dir = dir.display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().into_owned();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let first = args.first()?;
            (first.rsplit('/').next() == Some(name) && args.iter().any(|a| a.contains(&dir)))
                .then_some(pid)
        })
        .next()
        .unwrap_or_else(|| panic!("no {name} process of {dir}"))
}

/// The API server's request counts by verb (`apiserver_request_total`, summed over the rest of
/// the labels).
fn requests(kubectl: &Path, kubeconfig: &Path) -> std::collections::BTreeMap<String, f64> {
    let out = std::process::Command::new(kubectl)
        .env("KUBECONFIG", kubeconfig)
        .args(["get", "--raw", "/metrics"])
        .output()
        .expect("kubectl get --raw /metrics");
    let mut by_verb = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(labels) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let verb = labels
            .split("verb=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap_or("?")
            .to_string();
        let value: f64 = line
            .split_whitespace()
            .last()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *by_verb.entry(verb).or_insert(0.0) += value;
    }
    by_verb
}

/// One way of running Helm.
struct Variant {
    name: &'static str,
    /// Extra flags after the controller's.
    flags: Vec<String>,
    /// Extra environment.
    env: Vec<(&'static str, &'static str)>,
    /// The chart as an unpacked folder instead of the archive.
    unpacked: bool,
    /// `helm install` instead of `helm upgrade --install`.
    install: bool,
    /// Exactly the controller's arguments ([`controller::helm::Helm::upgrade_args`]).
    controller: bool,
}

#[derive(Default, Clone)]
struct Sum {
    runs: f64,
    wall: f64,
    helm: f64,
    apiserver: f64,
    etcd: f64,
    requests: std::collections::BTreeMap<String, f64>,
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let cp = ControlPlane::start(Options::new("bench-helm").api_only())
        .await
        .expect("control plane");
    let cluster = cp.handle();
    let dir = e2e::control_plane::base_dir().join(format!("bench-helm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let chart = e2e::standin_vcluster::package_chart(
        &cluster.helm,
        &dir,
        e2e::standin_vcluster::CHART_VERSION,
    )
    .expect("helm package the stand-in chart");
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked).expect("dir");
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&chart)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .expect("tar");
    assert!(status.success(), "unpacking the chart");
    let unpacked = unpacked.join("vcluster");
    let apiserver = pid_of("kube-apiserver", cp.dir());
    let etcd = pid_of("etcd", cp.dir());

    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let variants = [
        Variant {
            name: "the controller's flags before (fa2963a)",
            flags: vec![],
            env: vec![],
            unpacked: false,
            install: false,
            controller: false,
        },
        Variant {
            name: "+ --disable-openapi-validation",
            flags: s(&["--disable-openapi-validation"]),
            env: vec![],
            unpacked: false,
            install: false,
            controller: false,
        },
        Variant {
            name: "+ GOGC=off",
            flags: vec![],
            env: vec![("GOGC", "off")],
            unpacked: false,
            install: false,
            controller: false,
        },
        Variant {
            name: "+ GOMAXPROCS=1",
            flags: vec![],
            env: vec![("GOMAXPROCS", "1")],
            unpacked: false,
            install: false,
            controller: false,
        },
        Variant {
            name: "chart unpacked",
            flags: vec![],
            env: vec![],
            unpacked: true,
            install: false,
            controller: false,
        },
        Variant {
            name: "helm install",
            flags: vec![],
            env: vec![],
            unpacked: false,
            install: true,
            controller: false,
        },
        Variant {
            name: "the controller's (after)",
            flags: vec![],
            env: vec![],
            unpacked: false,
            install: false,
            controller: true,
        },
    ];
    let values = dir.join("values.yaml");
    let helm = controller::helm::Helm {
        binary: cluster.helm.display().to_string(),
        timeout: Duration::from_secs(300),
        work_dir: dir.clone(),
        post_renderer: Some(env!("CARGO_BIN_EXE_controller").into()),
    };
    let mut sums = vec![Sum::default(); variants.len()];
    // The requests of reading the metrics themselves.
    let r0 = requests(&cluster.kubectl, &cluster.kubeconfig);
    let r1 = requests(&cluster.kubectl, &cluster.kubeconfig);
    let reading: f64 = r1.values().sum::<f64>() - r0.values().sum::<f64>();
    let mut idle = Sum::default();
    for round in 0..rounds {
        for (i, v) in variants.iter().enumerate() {
            let ns = cluster
                .create_namespace(&format!("h{i}r{round}"), &[])
                .expect("namespace");
            let claim = controller::reconcile::objects::Claim {
                image: "platform-operator@sha256:00",
                uid: "u-1",
                instance: "bench/one",
            };
            let vals = controller::reconcile::objects::vcluster_values(
                "/var/lib/platform-operator/storage",
                &ns,
                &ns,
                controller::pod_security::Level::Restricted,
                None,
                &claim,
                None,
            );
            std::fs::write(&values, vals).expect("values");
            let home: PathBuf = dir.join(format!("home-{i}"));
            std::fs::create_dir_all(&home).expect("home");
            let chart = if v.unpacked { &unpacked } else { &chart };
            let args = if v.controller {
                helm.upgrade_args(
                    &ns,
                    chart,
                    e2e::standin_vcluster::CHART_VERSION,
                    &values,
                    None,
                )
            } else {
                // The flags `controller::helm` gave before issue #13, and the variant's.
                let mut args = if v.install {
                    s(&["install"])
                } else {
                    s(&["upgrade", "--install"])
                };
                args.extend([
                    "vcluster".into(),
                    chart.display().to_string(),
                    "-n".into(),
                    ns.clone(),
                    "--values".into(),
                    values.display().to_string(),
                    "--timeout".into(),
                    "300s".into(),
                    "--labels".into(),
                    format!(
                        "{}={}",
                        controller::helm::CHART_VERSION_LABEL,
                        e2e::standin_vcluster::CHART_VERSION
                    ),
                ]);
                if !v.install {
                    args.extend(s(&["--history-max", "3"]));
                }
                args.extend(v.flags.iter().cloned());
                args
            };
            let before = requests(&cluster.kubectl, &cluster.kubeconfig);
            let (a0, _) = cpu(&apiserver);
            let (e0, _) = cpu(&etcd);
            let (_, c0) = cpu("self");
            let start = Instant::now();
            let out = tokio::process::Command::new(&cluster.helm)
                .args(&args)
                .env("KUBECONFIG", &cluster.kubeconfig)
                .env("HOME", &home)
                .envs(v.env.iter().copied())
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .expect("helm runs");
            let wall = start.elapsed().as_secs_f64();
            let (_, c1) = cpu("self");
            let (a1, _) = cpu(&apiserver);
            let (e1, _) = cpu(&etcd);
            let after = requests(&cluster.kubectl, &cluster.kubeconfig);
            assert!(
                out.status.success(),
                "{}: {}",
                v.name,
                String::from_utf8_lossy(&out.stderr)
            );
            let sum = &mut sums[i];
            sum.runs += 1.0;
            sum.wall += wall;
            sum.helm += c1 - c0;
            sum.apiserver += a1 - a0;
            sum.etcd += e1 - e0;
            for (verb, count) in &after {
                *sum.requests.entry(verb.clone()).or_insert(0.0) +=
                    count - before.get(verb).copied().unwrap_or(0.0);
            }
            *sum.requests.entry("GET".into()).or_insert(0.0) -= reading;
            // The API server and etcd with nothing to do, over the same time.
            let (a0, _) = cpu(&apiserver);
            let (e0, _) = cpu(&etcd);
            tokio::time::sleep(Duration::from_secs_f64(wall)).await;
            idle.runs += 1.0;
            idle.wall += wall;
            idle.apiserver += cpu(&apiserver).0 - a0;
            idle.etcd += cpu(&etcd).0 - e0;
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# Helm benchmark ({rounds} rounds of {} runs, stand-in vCluster chart, API server and etcd only; load average {})\n",
        variants.len(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "| variant | wall s | helm CPU s | API server CPU s | etcd CPU s | total CPU s | API requests (by verb) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (v, s) in variants.iter().zip(&sums) {
        let per = |x: f64| x / s.runs;
        let verbs: Vec<String> = s
            .requests
            .iter()
            .filter(|(_, c)| **c > 0.0)
            .map(|(verb, c)| format!("{verb} {:.1}", c / s.runs))
            .collect();
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1}: {} |",
            v.name,
            per(s.wall),
            per(s.helm),
            per(s.apiserver),
            per(s.etcd),
            per(s.helm + s.apiserver + s.etcd),
            s.requests.values().sum::<f64>() / s.runs,
            verbs.join(", ")
        );
    }
    println!(
        "| idle (no helm, same wall time) | {:.3} | | {:.3} | {:.3} | {:.3} | |",
        idle.wall / idle.runs,
        idle.apiserver / idle.runs,
        idle.etcd / idle.runs,
        (idle.apiserver + idle.etcd) / idle.runs
    );
    let _ = std::fs::remove_dir_all(&dir);
}
