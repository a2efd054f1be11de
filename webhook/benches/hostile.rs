//! Hostile-load benchmark (prints figures; asserts nothing about speed), on loopback only.
//!
//! One webhook process with its shipped defaults, against the shared local control plane. A
//! steady stream of ordinary reviews (one h2 connection, paced, as the API server sends them, from
//! a thread and runtime apart from the attackers' so it measures the webhook, not this process) runs
//! first alone (the quiet baseline), then during an attack of, at the same time:
//!
//! - slowloris clients: TLS connections that send request headers one byte a second, and others
//!   that send complete headers and then the body one byte a second;
//! - thousands of idle TLS connections that finish the handshake and send nothing;
//! - dozens of clients sending 7 MiB review bodies back to back.
//!
//! The attack runs twice, on a runtime of its own: first with the attackers' threads at the
//! lowest CPU priority (nice 19; on a cluster the attackers are other machines, whose CPU is not
//! the webhook's), then at normal priority (their own TLS and copying then compete with the
//! webhook and the ordinary client for these two cores). The achieved attack (connections opened,
//! bodies sent) is printed for both, so a weaker attack would show.
//!
//! It reports the webhook's peak RSS against the chart's memory limit, and the ordinary reviews'
//! p50/p99 and failures in every phase, and ends with two gate lines: no ordinary review failed
//! (quiet or under attack), and the peak RSS (VmHWM) is under the chart's 256 MiB limit. Bounded: every phase has a fixed duration and count, and
//! every attacker stops by itself.
//!
//! Run: `cargo bench -p webhook --bench hostile` (env `HOSTILE_SECONDS`, `HOSTILE_IDLE`,
//! `HOSTILE_SLOW`, `HOSTILE_BIG` change the attack; raise `ulimit -n` above the idle count).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/support/mod.rs"]
mod support;

use base64::Engine as _;
use bytes::Bytes;
use e2e::https::{HttpsConnection, tls_connector};
use e2e::webhook::Webhook;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

/// The chart's memory limit of the webhook container (`webhook.resources.limits.memory`).
const CHART_LIMIT_MIB: f64 = 256.0;
/// The pace of ordinary reviews.
const NORMAL_INTERVAL: Duration = Duration::from_millis(10);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An UPDATE review of `object` (its old object the same).
fn review(uid: &str, object: Value) -> Bytes {
    let review = support::review(
        uid,
        "UPDATE",
        object.clone(),
        Some(object),
        support::admin(),
    );
    Bytes::from(serde_json::to_vec(&review).expect("json"))
}

fn instance(annotation: &str) -> Value {
    json!({
        "apiVersion": "platform.di-framework.dev/v1alpha1", "kind": "PlatformInstance",
        "metadata": {"name": "one", "namespace": "team-a", "annotations": {"bench/pad": annotation}},
        "spec": {"version": "6.0.22", "platform": {"gateway": {"httpNodePort": 30080}}}
    })
}

/// A review just under the 7 MiB body limit (an UPDATE of two 3.5 MiB objects).
fn big_review() -> Bytes {
    review("big", instance(&"x".repeat(3 * 1024 * 1024 + 400 * 1024)))
}

/// The resident set of `pid` now and at its peak, in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Stream {
    latencies: Vec<Duration>,
    errors: u64,
    first_error: Option<String>,
}

/// [`normal_stream`] on a thread and runtime of its own, so that its figures are the webhook's
/// and not the queue of the attackers' runtime in this same process (which runs thousands of
/// attacking tasks): the API server's client is not the attacker's either.
fn normal_stream_apart(target: &Target, duration: Duration) -> std::thread::JoinHandle<Stream> {
    let target = target.clone();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(normal_stream(&target, duration))
    })
}

/// Sends ordinary reviews every [`NORMAL_INTERVAL`] for `duration` over one h2 connection
/// (reconnecting after a failure, which counts as an error).
async fn normal_stream(target: &Target, duration: Duration) -> Stream {
    let body = review("normal", instance("small"));
    let mut out = Stream {
        latencies: Vec::new(),
        errors: 0,
        first_error: None,
    };
    let mut conn: Option<HttpsConnection> = None;
    let mut tick = tokio::time::interval(NORMAL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = Instant::now() + duration;
    while Instant::now() < end {
        tick.tick().await;
        let started = Instant::now();
        let result = match conn.as_mut() {
            Some(c) => c.post("/validate", body.clone()).await,
            None => match target.connect(b"h2").await {
                Ok(mut c) => {
                    let r = c.post("/validate", body.clone()).await;
                    conn = Some(c);
                    r
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok((200, answer)) if answer.windows(14).any(|w| w == b"\"allowed\":true") => {
                out.latencies.push(started.elapsed());
            }
            other => {
                out.errors += 1;
                out.first_error
                    .get_or_insert_with(|| format!("{:?}", other.map(|(s, _)| s)));
                conn = None;
            }
        }
    }
    out
}

#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    name: String,
    ca: String,
    raw: TlsConnector,
}

impl Target {
    async fn connect(&self, alpn: &[u8]) -> Result<HttpsConnection, e2e::HarnessError> {
        HttpsConnection::connect(
            self.addr,
            &self.name,
            &self.ca,
            &[alpn],
            &[&rustls::version::TLS13],
        )
        .await
    }

    async fn tls(&self) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.ok()?;
        let name = ServerName::try_from(self.name.clone()).ok()?;
        self.raw.connect(name, tcp).await.ok()
    }
}

#[derive(Default)]
struct Counters {
    idle_open: AtomicU64,
    idle_closed_by_server: AtomicU64,
    idle_refused: AtomicU64,
    slow_closed: AtomicU64,
    slow_408: AtomicU64,
    big_ok: AtomicU64,
    big_503: AtomicU64,
    big_other: AtomicU64,
}

/// Opens an idle TLS connection and waits (until `end`) for the server to close it.
async fn idle(target: Target, counters: Arc<Counters>, end: Instant) {
    let Some(mut tls) = target.tls().await else {
        counters.idle_refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    counters.idle_open.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0u8; 64];
    if let Ok(Ok(_)) = tokio::time::timeout_at(end.into(), tls.read(&mut buf)).await {
        counters
            .idle_closed_by_server
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// A slowloris client: headers (or, with `slow_body`, the body) one byte a second until `end`.
async fn slowloris(target: Target, counters: Arc<Counters>, slow_body: bool, end: Instant) {
    let Some(tls) = target.tls().await else {
        return;
    };
    let (mut read, mut write) = tokio::io::split(tls);
    let head: &[u8] = if slow_body {
        b"POST /validate HTTP/1.1\r\nhost: webhook\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{"
    } else {
        b"POST /validate HTTP/1.1\r\n"
    };
    if write.write_all(head).await.is_err() {
        return;
    }
    let drip = async move {
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let byte: &[u8] = if slow_body { b" " } else { b"x" };
            if write.write_all(byte).await.is_err() {
                return;
            }
        }
    };
    let answer = async {
        let mut got = Vec::new();
        let _ = read.read_to_end(&mut got).await;
        got
    };
    tokio::select! {
        () = drip => {}
        got = tokio::time::timeout_at(end.into(), answer) => {
            if let Ok(got) = got {
                counters.slow_closed.fetch_add(1, Ordering::Relaxed);
                if got.starts_with(b"HTTP/1.1 408") {
                    counters.slow_408.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Sends 7 MiB reviews back to back until `end`, each on a new HTTP/1.1 connection.
async fn big_bodies(target: Target, counters: Arc<Counters>, body: Bytes, end: Instant) {
    while Instant::now() < end {
        let outcome = match target.connect(b"http/1.1").await {
            Ok(mut c) => c.post("/validate", body.clone()).await.map(|(s, _)| s),
            Err(e) => Err(e),
        };
        let counter = match outcome {
            Ok(200) => &counters.big_ok,
            Ok(503) => &counters.big_503,
            _ => &counters.big_other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Starts a webhook and returns it with how to reach it.
async fn start(cluster: &e2e::shared::Shared) -> (Webhook, Target) {
    let id = "hostile";
    let ns = cluster
        .create_namespace("hostile", &[("e2e-webhook", id)])
        .expect("namespace");
    let port = e2e::control_plane::free_port().expect("port");
    e2e::webhook::register(cluster, id, port).expect("register");
    let mut webhook = Webhook::start(
        Path::new(env!("CARGO_BIN_EXE_webhook")),
        cluster,
        id,
        &ns,
        &["--log-level", "warn"],
        Some(port),
    );
    webhook.wait_ready().await;
    let bundle = e2e::webhook::wait_for_bundle(cluster, id).await;
    let ca = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .expect("base64"),
    )
    .expect("pem");
    let raw = tls_connector(&ca, &[b"http/1.1"], &[&rustls::version::TLS13]).expect("tls");
    let target = Target {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        name: format!("platform-operator-webhook.{ns}.svc"),
        ca,
        raw,
    };
    (webhook, target)
}

/// Runs every attacker until `end`; returns the peak RSS seen meanwhile.
async fn attack(target: &Target, pid: u32, counters: &Arc<Counters>, end: Instant) -> f64 {
    let (idle_n, slow_n, big_n) = (
        env("HOSTILE_IDLE", 3000),
        env("HOSTILE_SLOW", 200),
        env("HOSTILE_BIG", 32),
    );
    let mut tasks = tokio::task::JoinSet::new();
    let body = big_review();
    for i in 0..slow_n {
        tasks.spawn(slowloris(target.clone(), counters.clone(), i % 2 == 1, end));
    }
    for _ in 0..big_n {
        tasks.spawn(big_bodies(
            target.clone(),
            counters.clone(),
            body.clone(),
            end,
        ));
    }
    for i in 0..idle_n {
        tasks.spawn(idle(target.clone(), counters.clone(), end));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut peak: f64 = 0.0;
    while Instant::now() < end {
        peak = peak.max(rss_mib(pid).0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    peak
}

fn row(label: &str, s: &mut Stream, quiet_p99: f64) {
    s.latencies.sort();
    let p99 = percentile(&s.latencies, 0.99);
    println!(
        "| {label} | {} | {} | {} | {} | {} | {:.2} |",
        s.latencies.len(),
        s.errors,
        ms(percentile(&s.latencies, 0.5)),
        ms(p99),
        ms(s.latencies.last().copied().unwrap_or_default()),
        p99.as_secs_f64() / quiet_p99,
    );
}

/// One attacked phase: the ordinary stream (at normal priority) while every attacker runs on a
/// runtime of its own whose threads have the nice value `nice`.
struct Attacked {
    stream: Stream,
    peak: f64,
    counters: Arc<Counters>,
}

async fn attacked_phase(target: &Target, pid: u32, phase: Duration, nice: i32) -> Attacked {
    let attackers = tokio::runtime::Builder::new_multi_thread()
        .thread_name("attacker")
        .on_thread_start(move || {
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice);
        })
        .enable_all()
        .build()
        .expect("attackers' runtime");
    let counters = Arc::new(Counters::default());
    let end = Instant::now() + phase;
    let ordinary = normal_stream_apart(target, phase);
    let peak = attackers
        .spawn({
            let (target, counters) = (target.clone(), counters.clone());
            async move { attack(&target, pid, &counters, end).await }
        })
        .await
        .expect("attack");
    let stream = tokio::task::spawn_blocking(move || ordinary.join())
        .await
        .expect("join")
        .expect("normal stream");
    attackers.shutdown_background();
    Attacked {
        stream,
        peak,
        counters,
    }
}

#[tokio::main]
async fn main() {
    let seconds = env("HOSTILE_SECONDS", 20);
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let (mut webhook, target) = start(&cluster).await;
    let pid = webhook.pid();
    let (idle_rss, _) = rss_mib(pid);

    let phase = Duration::from_secs(seconds);
    let mut quiet = tokio::task::spawn_blocking({
        let target = target.clone();
        move || normal_stream_apart(&target, phase).join()
    })
    .await
    .expect("join")
    .expect("normal stream");
    // First with the attackers at the lowest CPU priority: on a cluster they are other machines,
    // whose CPU is not the webhook's. Then at normal priority: on these two cores the attackers'
    // own TLS and copying then compete with the webhook and the ordinary client for the CPU.
    let mut phases = Vec::new();
    for nice in [19, 0] {
        phases.push((nice, attacked_phase(&target, pid, phase, nice).await));
    }
    let (after_rss, hwm) = rss_mib(pid);
    let alive = target.connect(b"h2").await.is_ok();

    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "# Hostile load ({seconds} s quiet, then {seconds} s under attack twice; ordinary reviews every {} ms on one h2 connection)\n",
        NORMAL_INTERVAL.as_millis()
    );
    println!(
        "| ordinary reviews | answered | failed | p50 | p99 | max | p99 / quiet |\n|---|---|---|---|---|---|---|"
    );
    quiet.latencies.sort();
    let quiet_p99 = percentile(&quiet.latencies, 0.99).as_secs_f64().max(1e-9);
    row("quiet", &mut quiet, quiet_p99);
    for (nice, attacked) in &mut phases {
        row(
            &format!("under attack, attackers at nice {nice}"),
            &mut attacked.stream,
            quiet_p99,
        );
    }
    for (nice, attacked) in &phases {
        if let Some(e) = attacked.stream.first_error.as_ref() {
            println!("first failure under attack (attackers at nice {nice}): {e}");
        }
    }
    if let Some(e) = quiet.first_error.as_ref() {
        println!("first failure, quiet: {e}");
    }
    println!("\n| webhook RSS | MiB |\n|---|---|");
    println!("| ready, before load | {idle_rss:.1} |");
    for (nice, attacked) in &phases {
        println!(
            "| peak sampled during the attack (attackers at nice {nice}) | {:.1} |",
            attacked.peak
        );
    }
    println!("| peak over the whole run (VmHWM) | {hwm:.1} |");
    println!("| after the attacks | {after_rss:.1} |");
    println!("| chart limit | {CHART_LIMIT_MIB:.0} |");
    let header: String = phases
        .iter()
        .map(|(nice, _)| format!(" attackers at nice {nice} |"))
        .collect();
    let rule: String = phases.iter().map(|_| "---|").collect();
    println!("\n| attacker |{header}\n|---|{rule}");
    let line = |label: &str, f: &dyn Fn(&Counters) -> String| {
        let cells: String = phases
            .iter()
            .map(|(_, a)| format!(" {} |", f(&a.counters)))
            .collect();
        println!("| {label} |{cells}");
    };
    line("idle TLS connections opened / refused at connect", &|k| {
        format!("{} / {}", c(&k.idle_open), c(&k.idle_refused))
    });
    line(
        "idle connections closed by the webhook before the attack ended",
        &|k| c(&k.idle_closed_by_server).to_string(),
    );
    line(
        "slowloris connections closed by the webhook (of which 408)",
        &|k| format!("{} ({})", c(&k.slow_closed), c(&k.slow_408)),
    );
    line(
        "7 MiB reviews answered 200 / 503 / failed otherwise",
        &|k| format!("{} / {} / {}", c(&k.big_ok), c(&k.big_503), c(&k.big_other)),
    );
    println!("\nwebhook still accepts connections after the attacks: {alive}");
    let failed = quiet.errors + phases.iter().map(|(_, a)| a.stream.errors).sum::<u64>();
    println!();
    support::gate("hostile-ordinary-reviews-failed", failed as f64, "<=", 0.0);
    support::gate("hostile-webhook-peak-rss-mib", hwm, "<", CHART_LIMIT_MIB);
    webhook.stop();
    e2e::webhook::unregister(&cluster, "hostile");
}
