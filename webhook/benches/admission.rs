//! Admission benchmark (prints figures; asserts nothing about speed).
//!
//! 1. Direct: one webhook process, one TLS keep-alive HTTP/1.1 connection on loopback (what the
//!    API server speaks to a webhook: its webhook client offers only `http/1.1`), N sequential
//!    `POST /validate` reviews of two sizes; beside it, on the same loopback with the same client,
//!    certificate and bodies, an in-process TLS echo server as the floor, and the same echo as a
//!    process of its own (as the webhook is) as a second floor.
//! 2. Throughput: the webhook process pinned to one core (`taskset`), 16 concurrent TLS
//!    keep-alive connections from this process (pinned to the other core) sending the seed's
//!    review; beside it the TLS echo floor, run as a process of its own (this binary again) pinned
//!    the same way. Twice: both processes pinned after they started (the first table), and a
//!    second webhook and echo started on CPU 0, so that their runtimes are sized to one CPU.
//! 3. Through the API server: p50/p99 of a PlatformInstance server-side apply in a namespace
//!    the webhooks are registered for, in one where the same local rules are a
//!    ValidatingAdmissionPolicy (CEL in the API server, the side-by-side peer), and in one with
//!    neither, interleaved in one run; for a write that changes only an annotation (no work for
//!    either webhook) and for one that changes the spec (work for the validating webhook).
//!
//! It ends with two gate lines: the slowest of the webhook's throughput rows against 10,000
//! reviews/s, and the annotation write's apply p50 ratio (the webhooks against neither) against
//! 1.15.
//!
//! Run: `cargo bench -p webhook --bench admission` (env `BENCH_N` sets the request count;
//! `ADMISSION_BENCH_WEBHOOK` runs another webhook executable, such as a build of an earlier
//! commit kept aside, so that a before and an after are measured by the same benchmark).

use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../tests/support/mod.rs"]
mod support;

use axum::Router;
use axum::routing::post;
use base64::Engine as _;
use bytes::Bytes;
use e2e::https::HttpsConnection;
use e2e::webhook::Webhook;
use serde_json::{Value, json};

const NAME: &str = "platform-operator-webhook.bench.svc";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Figures {
    p50: Duration,
    p99: Duration,
    per_second: f64,
}

fn figures(mut samples: Vec<Duration>, total: Duration) -> Figures {
    samples.sort();
    Figures {
        p50: percentile(&samples, 0.5),
        p99: percentile(&samples, 0.99),
        per_second: samples.len() as f64 / total.as_secs_f64(),
    }
}

async fn drive(conn: &mut HttpsConnection, path: &str, body: &Bytes, n: usize) -> Figures {
    for _ in 0..n / 10 {
        let (status, _) = conn
            .post(path, body.clone())
            .await
            .expect("warm-up request");
        assert_eq!(status, 200);
    }
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let (status, _) = conn.post(path, body.clone()).await.expect("request");
        samples.push(t.elapsed());
        assert_eq!(status, 200);
    }
    figures(samples, start.elapsed())
}

/// A TLS 1.3, HTTP/1.1 keep-alive connection to `addr`, verified as `name` against `ca`.
async fn connect_h1(
    addr: std::net::SocketAddr,
    name: &str,
    ca: &str,
) -> Result<HttpsConnection, e2e::HarnessError> {
    HttpsConnection::connect(addr, name, ca, &[b"http/1.1"], &[&rustls::version::TLS13]).await
}

fn review(object: Value) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "bench",
                "kind": {"group": "platform.di-framework.dev", "version": "v1alpha1", "kind": "PlatformInstance"},
                "resource": {"group": "platform.di-framework.dev", "version": "v1alpha1", "resource": "platforminstances"},
                "name": object["metadata"]["name"],
                "namespace": object["metadata"]["namespace"],
                "operation": "CREATE",
                "userInfo": {"username": "bench", "groups": ["system:masters"]},
                "object": object,
                "dryRun": false
            }
        }))
        .expect("json"),
    )
}

fn small() -> Value {
    json!({
        "apiVersion": "platform.di-framework.dev/v1alpha1", "kind": "PlatformInstance",
        "metadata": {"name": "one", "namespace": "team-a"},
        "spec": {"version": "6.0.22", "target": {"type": "vcluster"}, "deletionPolicy": "Retain",
                 "platform": {"networkPolicyEngine": "existing", "gateway": {"httpNodePort": 30080, "httpEndpoint": "http://apps.example:30080"}}}
    })
}

fn large() -> Value {
    let mut v = small();
    let tenants: Vec<Value> = (0..32)
        .map(|i| json!({"name": format!("tenant-{i}")}))
        .collect();
    let users: Vec<Value> = (0..128)
        .map(|i| json!({"name": format!("user-{i}"), "memberships": (0..4).map(|t| json!({"tenant": format!("tenant-{}", (i + t) % 32), "role": "developer"})).collect::<Vec<_>>()}))
        .collect();
    v["spec"]["platform"]["tenants"] = json!(tenants);
    v["spec"]["platform"]["users"] = json!(users);
    v
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// The peer: the webhook's local rules that CEL in the API server can express, as two
/// ValidatingAdmissionPolicies (refusals, and warnings) bound to namespaces labelled
/// `bench-vap=<id>`, with the validating webhook's matchConditions. Not expressible there: the
/// NodePort conflict (other objects) and the Secret rule (left out: the webhook's
/// SubjectAccessReview could be CEL's `authorizer`, but it is not a local rule). The supported
/// range is the webhook's default (6.0).
fn peer_policy(id: &str) -> String {
    let (when_name, when) = e2e::webhook::VALIDATE_WHEN;
    let deleting = "!has(object.metadata.deletionTimestamp) || has(object.spec.version) != has(oldObject.spec.version) || (has(object.spec.version) && object.spec.version != oldObject.spec.version)";
    let annotation = "(has(object.metadata.annotations) && 'platform.di-framework.dev/allow-downgrade' in object.metadata.annotations ? object.metadata.annotations['platform.di-framework.dev/allow-downgrade'] : '')";
    let gw = "has(object.spec.platform) && has(object.spec.platform.gateway)";
    let endpoint = "object.spec.platform.gateway.httpEndpoint";
    let port = "object.spec.platform.gateway.httpNodePort";
    let policy = |name: &str, validations: &[(&str, String)], action: &str| {
        let validations: String = validations
            .iter()
            .map(|(message, rule)| {
                format!(
                    "      - expression: {}\n        message: {}\n",
                    json!(rule),
                    json!(message)
                )
            })
            .collect();
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:\n  name: bench-{name}-{id}\n  labels: {{ bench-peer: \"{id}\" }}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules:\n      - apiGroups: [platform.di-framework.dev]\n        apiVersions: [v1alpha1]\n        operations: [CREATE, UPDATE]\n        resources: [platforminstances]\n  matchConditions:\n    - name: not-being-deleted-or-changing-version\n      expression: {}\n    - name: {when_name}\n      expression: {}\n  validations:\n{validations}---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata:\n  name: bench-{name}-{id}\n  labels: {{ bench-peer: \"{id}\" }}\nspec:\n  policyName: bench-{name}-{id}\n  validationActions: [{action}]\n  matchResources:\n    namespaceSelector:\n      matchLabels: {{ bench-vap: \"{id}\" }}\n---\n",
            json!(deleting),
            json!(when),
        )
    };
    let refusals = [
        (
            "spec.version cannot change while the instance is being deleted",
            "oldObject == null || !has(oldObject.metadata.deletionTimestamp)".to_string(),
        ),
        (
            "spec.version is outside the versions this operator supports (6.0.x to 6.0.x)",
            "!has(object.spec) || !has(object.spec.version) || (isSemver(object.spec.version) && semver(object.spec.version).major() == 6 && semver(object.spec.version).minor() == 0)".to_string(),
        ),
        (
            "spec.version is below the installed version; set the annotation platform.di-framework.dev/allow-downgrade=true to downgrade on purpose",
            format!("oldObject == null || !has(oldObject.status) || !has(oldObject.status.installedVersion) || !isSemver(oldObject.status.installedVersion) || !has(object.spec.version) || !isSemver(object.spec.version) || !semver(object.spec.version).isLessThan(semver(oldObject.status.installedVersion)) || {annotation} == 'true'"),
        ),
        (
            "spec.platform.gateway.httpNodePort is outside the API server's NodePort range 30000-32767",
            format!("!({gw}) || {port} == 0 || ({port} >= 30000 && {port} <= 32767)"),
        ),
    ];
    let url_port = format!(
        "(url({endpoint}).getPort() != '' ? int(url({endpoint}).getPort()) : (url({endpoint}).getScheme() == 'https' ? 443 : 80))"
    );
    let host = format!("url({endpoint}).getHostname()");
    let warnings = [
        (
            "spec.platform.gateway.httpEndpoint names another port than httpNodePort; make sure something forwards it to the NodePort",
            format!("!({gw}) || {port} == 0 || !has({endpoint}) || !isURL({endpoint}) || {url_port} == {port}"),
        ),
        (
            "spec.platform.gateway.httpEndpoint is not a loopback URL, so the platform cannot derive tenant route URLs from it; set spec.platform.gateway.routeUrlPattern",
            format!("!({gw}) || !has({endpoint}) || has(object.spec.platform.gateway.routeUrlPattern) || !isURL({endpoint}) || {host} == 'localhost' || {host}.endsWith('.localhost') || {host} == '::1' || {host}.matches('^127\\\\.[0-9]{{1,3}}\\\\.[0-9]{{1,3}}\\\\.[0-9]{{1,3}}$')"),
        ),
        (
            "spec.deletionPolicy is Delete: deleting this instance removes its storage and Pulumi state for good",
            "!has(object.spec) || !has(object.spec.deletionPolicy) || object.spec.deletionPolicy != 'Delete' || (oldObject != null && has(oldObject.spec.deletionPolicy) && oldObject.spec.deletionPolicy == 'Delete')".to_string(),
        ),
    ];
    policy("refuse", &refusals, "Deny") + &policy("warn", &warnings, "Warn")
}

/// Counts this process's heap allocations, for the parse profile.
struct Counting;

static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether [`Counting`] counts: only while the parse profile runs, so the other rows pay nothing.
static COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn count_allocation() {
    if COUNTING.load(std::sync::atomic::Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

// SAFETY: forwards every call unchanged to the system allocator; only counts.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Time and allocations per call of `parse` on `body`, over `n` calls on this thread.
fn parse_cost(body: &[u8], n: usize, parse: impl Fn(&[u8]) -> bool) -> (Duration, f64) {
    for _ in 0..n / 10 {
        assert!(parse(body));
    }
    let before = ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    for _ in 0..n {
        assert!(parse(body));
    }
    let elapsed = start.elapsed();
    let allocations = ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed) - before;
    (elapsed / n as u32, allocations as f64 / n as f64)
}

/// Where a review's time goes before the rules run: the body parsed as the validating webhook
/// parses it (into kube's typed review of a PlatformInstance), into a JSON tree, and only scanned
/// (serde's `IgnoredAny`, the least any parser must do), on this thread, for both bodies.
fn parse_profile(n: usize) {
    use kube::core::admission::AdmissionReview;
    COUNTING.store(true, std::sync::atomic::Ordering::Relaxed);
    println!(
        "\n# Parse profile (in this process, one thread, {n} parses per cell; load average {})\n",
        load_average()
    );
    println!(
        "| body | size | typed review (the webhook's parse): time / allocations | JSON tree: time / allocations | scan only: time / allocations |\n|---|---|---|---|---|"
    );
    for (label, object) in [
        ("seed example", small()),
        ("32 tenants / 128 users", large()),
    ] {
        let body = review(object);
        let typed = parse_cost(&body, n, |b| {
            serde_json::from_slice::<AdmissionReview<common::crd::PlatformInstance>>(b).is_ok()
        });
        let tree = parse_cost(&body, n, |b| serde_json::from_slice::<Value>(b).is_ok());
        let scan = parse_cost(&body, n, |b| {
            serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
        });
        let cell = |(t, a): (Duration, f64)| format!("{:.1} µs / {a:.0}", t.as_secs_f64() * 1e6);
        println!(
            "| {label} | {} B | {} | {} | {} |",
            body.len(),
            cell(typed),
            cell(tree),
            cell(scan)
        );
    }
    COUNTING.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// The webhook's own work per review, without TLS, HTTP or a socket: its router (with the layers
/// of `common::server`, as served) called in this process on one thread, for both bodies; the
/// rules that need no API server run as in the webhook (none of these bodies needs one).
async fn handler_profile(n: usize) {
    use tower::ServiceExt as _;
    let registry = prometheus::Registry::new();
    let state = Arc::new(webhook::admission::Admission {
        settings: webhook::rules::Settings {
            default_version: "6.0.22".into(),
            min_version: (6, 0),
            max_version: (6, 0),
            node_port_range: (30000, 32767),
        },
        index: Arc::new(webhook::index::NodePortIndex::default()),
        client: kube::Client::try_from(kube::Config::new(
            "https://127.0.0.1:9".parse().expect("uri"),
        ))
        .expect("client"),
        metrics: webhook::metrics::Metrics::register(&registry).expect("metrics"),
    });
    let app = common::server::layers(
        webhook::admission::router(state),
        &common::server::Limits::default(),
    );
    // The echo floor's router through the same layers: what the webhook's handler costs over
    // a handler that only hands the body back.
    let echo = common::server::layers(echo_router(), &common::server::Limits::default());
    println!(
        "\n# The webhook's handler alone (its router and layers called in this process, no TLS, HTTP or socket; {n} reviews per row; load average {}), and the echo's router through the same layers\n",
        load_average()
    );
    println!("| body | size | per review | echo, per review |\n|---|---|---|---|");
    for (label, object) in [
        ("seed example", small()),
        ("32 tenants / 128 users", large()),
    ] {
        let body = review(object);
        let mut times = Vec::new();
        for app in [&app, &echo] {
            let call = |body: Bytes| {
                let request = axum::http::Request::post("/validate")
                    .header("content-type", "application/json")
                    .header("content-length", body.len())
                    .body(axum::body::Body::from(body))
                    .expect("request");
                app.clone().oneshot(request)
            };
            for _ in 0..n / 10 {
                let response = call(body.clone()).await.expect("answer");
                assert_eq!(response.status(), 200);
            }
            let start = Instant::now();
            for _ in 0..n {
                let response = call(body.clone()).await.expect("answer");
                assert_eq!(response.status(), 200);
                let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
            }
            times.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        println!(
            "| {label} | {} B | {:.1} µs | {:.1} µs |",
            body.len(),
            times[0],
            times[1]
        );
    }
}

/// The webhook executable measured: `ADMISSION_BENCH_WEBHOOK` when set, else the one Cargo built
/// beside this benchmark.
fn webhook_binary() -> std::path::PathBuf {
    std::env::var_os("ADMISSION_BENCH_WEBHOOK")
        .map_or_else(|| env!("CARGO_BIN_EXE_webhook").into(), Into::into)
}

/// Set (to a file path) when this binary runs as the TLS echo process of the throughput row: it
/// writes its CA there, prints its port and serves until killed.
const ECHO_PROCESS: &str = "ADMISSION_BENCH_ECHO_CA_FILE";

/// The TLS echo floor, served by the same server code, certificate kind and limits as the webhook.
async fn serve_echo(listener: tokio::net::TcpListener, generation: &webhook::certs::Generation) {
    let config = Arc::new(
        webhook::tls::server_config(Arc::new(
            webhook::certs::Resolver::new(generation).expect("resolver"),
        ))
        .expect("tls"),
    );
    let echo = echo_router();
    let counter = prometheus::IntCounter::new("echo_failures", "unused").expect("counter");
    webhook::tls::serve(
        listener,
        config,
        echo,
        counter,
        common::server::Limits::default(),
        std::future::pending::<()>(),
    )
    .await;
}

/// The echo's router: `POST /validate` answers with the request body.
fn echo_router() -> Router {
    Router::new().route("/validate", post(|body: Bytes| async move { body }))
}

fn echo_certificate() -> webhook::certs::Generation {
    let subject = webhook::certs::Subject {
        service: "platform-operator-webhook".into(),
        namespace: "bench".into(),
        extra_sans: vec![],
    };
    webhook::certs::issue(&subject, webhook::keeper::now(), 3600).expect("certificate")
}

/// This binary as the echo process: CA to `ca_file`, port on stdout, then serve.
async fn echo_process(ca_file: &str) {
    let generation = echo_certificate();
    std::fs::write(ca_file, &generation.ca_cert).expect("CA file");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!("{}", listener.local_addr().expect("addr").port());
    serve_echo(listener, &generation).await;
}

/// A TLS echo process (this binary again): the process, its address and its CA.
struct EchoProcess {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    ca: String,
    ca_file: std::path::PathBuf,
}

impl EchoProcess {
    /// Starts this binary as the echo process; `tag` names its CA file.
    fn start(tag: &str) -> Self {
        let ca_file = std::env::temp_dir().join(format!(
            "admission-echo-ca-{}-{tag}.pem",
            std::process::id()
        ));
        let mut cmd = std::process::Command::new(std::env::current_exe().expect("this binary"));
        cmd.env(ECHO_PROCESS, &ca_file)
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null());
        e2e::process::die_with_parent(&mut cmd);
        let mut child = cmd.spawn().expect("echo process");
        let port: u16 = {
            use std::io::BufRead as _;
            let stdout = child.stdout.take().expect("stdout");
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .expect("echo port");
            line.trim().parse().expect("port number")
        };
        let ca = std::fs::read_to_string(&ca_file).expect("echo CA");
        Self {
            child,
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            ca,
            ca_file,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

/// Runs `start` with this thread pinned to CPU 0, so that the process it starts begins its life
/// on one CPU, as one given a single CPU does (a pod with a one-CPU limit, or started under
/// `taskset -c 0`): its tokio runtimes size themselves from the CPUs it may use
/// (`available_parallelism`), one worker each. The thread's affinity is restored after.
fn started_on_cpu0<T>(start: impl FnOnce() -> T) -> T {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    let before = sched_getaffinity(None).expect("this thread's CPU affinity");
    let mut one = CpuSet::new();
    one.set(0);
    sched_setaffinity(None, &one).expect("pinning this thread to CPU 0");
    let started = start();
    sched_setaffinity(None, &before).expect("restoring this thread's CPU affinity");
    started
}

/// Pins every thread of process `pid` to `cpus` (a `taskset` list such as `0` or `0-1`).
fn pin(pid: u32, cpus: &str) {
    let out = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .output()
        .expect("taskset runs");
    assert!(out.status.success(), "taskset: {out:?}");
}

/// CPU seconds (user + system) process `pid` has used, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of stat (utime, stime), counted from the state (field 3) here.
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    ticks / hz
}

/// What one throughput run measured.
struct Throughput {
    per_second: f64,
    latency: Figures,
    cpu_per_review: Duration,
}

/// `conns` keep-alive connections to `addr`, each sending `per_conn` reviews back to back after a
/// warm-up, all started together; the server is process `pid`.
async fn throughput(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca: &str,
    body: &Bytes,
    conns: usize,
    per_conn: usize,
    pid: u32,
) -> Throughput {
    let barrier = Arc::new(tokio::sync::Barrier::new(conns + 1));
    let mut tasks = Vec::with_capacity(conns);
    for _ in 0..conns {
        let (barrier, body, ca, name) = (
            barrier.clone(),
            body.clone(),
            ca.to_string(),
            server_name.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let mut conn = connect_h1(addr, &name, &ca).await.expect("connect");
            for _ in 0..per_conn / 10 {
                let (status, _) = conn.post("/validate", body.clone()).await.expect("warm-up");
                assert_eq!(status, 200);
            }
            barrier.wait().await;
            let mut samples = Vec::with_capacity(per_conn);
            for _ in 0..per_conn {
                let t = Instant::now();
                let (status, _) = conn.post("/validate", body.clone()).await.expect("request");
                samples.push(t.elapsed());
                assert_eq!(status, 200);
            }
            samples
        }));
    }
    barrier.wait().await;
    let cpu_before = cpu_seconds(pid);
    let start = Instant::now();
    let mut samples = Vec::with_capacity(conns * per_conn);
    for task in tasks {
        samples.extend(task.await.expect("client task"));
    }
    let elapsed = start.elapsed();
    let cpu = cpu_seconds(pid) - cpu_before;
    let count = samples.len();
    Throughput {
        per_second: count as f64 / elapsed.as_secs_f64(),
        latency: figures(samples, elapsed),
        cpu_per_review: Duration::from_secs_f64(cpu / count as f64),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::main]
async fn main() {
    if let Ok(ca_file) = std::env::var(ECHO_PROCESS) {
        return echo_process(&ca_file).await;
    }
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let id = "bench";
    let ns = cluster
        .create_namespace("bench-with", &[("e2e-webhook", id)])
        .expect("namespace");
    let ns_without = cluster
        .create_namespace("bench-without", &[])
        .expect("namespace");
    let port = e2e::control_plane::free_port().expect("port");
    e2e::webhook::register(&cluster, id, port).expect("register");
    let mut webhook = Webhook::start(&webhook_binary(), &cluster, id, &ns, &[], Some(port));
    webhook.wait_ready().await;
    let bundle = e2e::webhook::wait_for_bundle(&cluster, id).await;
    let ca = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .expect("base64"),
    )
    .expect("pem");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));

    // The webhook and the echo floor again, each started on CPU 0 (for the second throughput
    // table), and the echo floor as a process of its own, not pinned (for the direct rows' second
    // floor and the first throughput table).
    let cpu0_port = e2e::control_plane::free_port().expect("port");
    let mut webhook_cpu0 = started_on_cpu0(|| {
        Webhook::start(&webhook_binary(), &cluster, id, &ns, &[], Some(cpu0_port))
    });
    webhook_cpu0.wait_ready().await;
    let echo_cpu0 = started_on_cpu0(|| EchoProcess::start("cpu0"));
    let echo_free = EchoProcess::start("free");

    // The floor: a TLS echo on the same loopback, same certificate shape, same client.
    let generation = echo_certificate();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let echo_addr = listener.local_addr().expect("addr");
    let echo_generation = generation.clone();
    tokio::spawn(async move { serve_echo(listener, &echo_generation).await });

    println!(
        "# Admission benchmark ({n} sequential requests per row, one TLS 1.3 HTTP/1.1 keep-alive connection, loopback; load average at start {}; webhook {})\n",
        load_average(),
        webhook_binary().display()
    );
    println!(
        "| request | body | webhook p50 | webhook p99 | webhook req/s | TLS echo p50 | TLS echo p99 | TLS echo req/s | p50 ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let webhook_server_name = format!("platform-operator-webhook.{ns}.svc");
    let mut second_floor = Vec::new();
    for (label, object) in [
        ("validate, seed example", small()),
        ("validate, 32 tenants / 128 users", large()),
    ] {
        let body = review(object);
        let mut conn = connect_h1(addr, &webhook_server_name, &ca)
            .await
            .expect("webhook");
        let w = drive(&mut conn, "/validate", &body, n).await;
        let mut conn = connect_h1(echo_addr, NAME, &generation.ca_cert)
            .await
            .expect("echo");
        let e = drive(&mut conn, "/validate", &body, n).await;
        let mut conn = connect_h1(echo_free.addr, NAME, &echo_free.ca)
            .await
            .expect("echo process");
        let p = drive(&mut conn, "/validate", &body, n).await;
        println!(
            "| {label} | {} B | {} | {} | {:.0} | {} | {} | {:.0} | {:.2} |",
            body.len(),
            ms(w.p50),
            ms(w.p99),
            w.per_second,
            ms(e.p50),
            ms(e.p99),
            e.per_second,
            w.p50.as_secs_f64() / e.p50.as_secs_f64()
        );
        second_floor.push((label, body.len(), w, p));
    }
    println!(
        "\n# The same rows against the TLS echo as a process of its own (as the webhook is; the same webhook figures as above, the floor measured right after)\n"
    );
    println!(
        "| request | body | webhook p50 | webhook p99 | TLS echo process p50 | TLS echo process p99 | TLS echo process req/s | p50 ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, size, w, p) in &second_floor {
        println!(
            "| {label} | {size} B | {} | {} | {} | {} | {:.0} | {:.2} |",
            ms(w.p50),
            ms(w.p99),
            ms(p.p50),
            ms(p.p99),
            p.per_second,
            w.p50.as_secs_f64() / p.p50.as_secs_f64()
        );
    }

    parse_profile(n);
    handler_profile(n).await;

    // Throughput: the webhook pinned to one core, 16 connections from this process on the other;
    // the echo floor as a process of its own, pinned the same way; alternated twice. First both
    // pinned after their start (their runtimes sized for every CPU), then the two started on CPU 0.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let all = format!("0-{}", cores.saturating_sub(1));
    pin(webhook.pid(), "0");
    pin(echo_free.pid(), "0");
    if cores > 1 {
        pin(std::process::id(), &format!("1-{}", cores - 1));
    }
    let conns = 16;
    let per_conn = (n / 2).max(100);
    let small_body = review(small());
    let cpu0_addr = std::net::SocketAddr::from(([127, 0, 0, 1], cpu0_port));
    let mut webhook_rates = Vec::new();
    let tables = [
        (
            "pinned to CPU 0 (`taskset -a`) after they started, so their runtimes were sized for every CPU",
            addr,
            webhook.pid(),
            &echo_free,
        ),
        (
            "started on CPU 0 (their runtimes sized to the one CPU they may use, as in a pod given one CPU)",
            cpu0_addr,
            webhook_cpu0.pid(),
            &echo_cpu0,
        ),
    ];
    for (how, webhook_addr, webhook_pid, echo) in tables {
        println!(
            "\n# Throughput, servers {how}; {conns} concurrent TLS 1.3 HTTP/1.1 keep-alive connections from a client on the other CPUs, {per_conn} sequential reviews each (seed example, {} B); load average at start {}\n",
            small_body.len(),
            load_average()
        );
        println!(
            "| run | server | reviews/s | p50 | p99 | server CPU per review | reviews per server CPU-second |\n|---|---|---|---|---|---|---|"
        );
        let mut ratios = Vec::new();
        for run in 1..=2 {
            let w = throughput(
                webhook_addr,
                &webhook_server_name,
                &ca,
                &small_body,
                conns,
                per_conn,
                webhook_pid,
            )
            .await;
            let e = throughput(
                echo.addr,
                NAME,
                &echo.ca,
                &small_body,
                conns,
                per_conn,
                echo.pid(),
            )
            .await;
            for (label, t) in [("webhook", &w), ("TLS echo", &e)] {
                println!(
                    "| {run} | {label} | {:.0} | {} | {} | {:.1} µs | {:.0} |",
                    t.per_second,
                    ms(t.latency.p50),
                    ms(t.latency.p99),
                    t.cpu_per_review.as_secs_f64() * 1e6,
                    1.0 / t.cpu_per_review.as_secs_f64()
                );
            }
            ratios.push(w.per_second / e.per_second);
            webhook_rates.push(w.per_second);
        }
        println!(
            "\nwebhook / echo throughput: {}",
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    pin(webhook.pid(), &all);
    pin(std::process::id(), &all);
    drop(echo_free);
    drop(echo_cpu0);
    webhook_cpu0.stop();

    // Through the API server: the webhooks, the peer ValidatingAdmissionPolicy, neither;
    // interleaved, for an annotation-only write and a spec write.
    let vap_ns = cluster
        .create_namespace("bench-vap", &[("bench-vap", id)])
        .expect("namespace");
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "--field-manager=bench", "-f", "-"],
            Some(&peer_policy(id)),
        )
        .expect("the peer ValidatingAdmissionPolicy applies");
    let client = cluster.client().await.expect("client");
    let targets: Vec<(&str, kube::Api<common::crd::PlatformInstance>)> = vec![
        ("the webhooks", kube::Api::namespaced(client.clone(), &ns)),
        (
            "the ValidatingAdmissionPolicy",
            kube::Api::namespaced(client.clone(), &vap_ns),
        ),
        ("neither", kube::Api::namespaced(client, &ns_without)),
    ];
    let params = kube::api::PatchParams::apply("bench");
    // The peer and the webhooks both refuse a version out of range (the policy takes a moment to
    // be loaded by the API server); neither does without them.
    for (label, api) in &targets {
        let bad = json!({
            "apiVersion": "platform.di-framework.dev/v1alpha1", "kind": "PlatformInstance",
            "metadata": {"name": "out-of-range"}, "spec": {"version": "7.0.0"}
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = api
                .patch("out-of-range", &params, &kube::api::Patch::Apply(&bad))
                .await;
            let refused = matches!(&out, Err(kube::Error::Api(s)) if s.message.contains("outside the versions"));
            if *label == "neither" {
                assert!(out.is_ok(), "{label}: {out:?}");
                break;
            }
            if refused {
                break;
            }
            if out.is_ok() {
                let _ = api.delete("out-of-range", &Default::default()).await;
            }
            assert!(
                Instant::now() < deadline,
                "{label} never refused 7.0.0: {out:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let rounds = (n / 4).max(50);
    let warm = rounds / 10;
    let reviews_before = webhook.reviews_answered().await;
    // samples[write][target]
    let mut samples = vec![vec![Vec::with_capacity(rounds); targets.len()]; 2];
    for i in 0..rounds + warm {
        let writes = [
            json!({
                "apiVersion": "platform.di-framework.dev/v1alpha1", "kind": "PlatformInstance",
                "metadata": {"name": "applied", "annotations": {"bench/round": i.to_string()}},
                "spec": {"version": "6.0.22", "platform": {"gateway": {"httpNodePort": 0}}}
            }),
            json!({
                "apiVersion": "platform.di-framework.dev/v1alpha1", "kind": "PlatformInstance",
                "metadata": {"name": "changed"},
                "spec": {"version": "6.0.22", "platform": {"gateway": {"httpNodePort": 0, "httpEndpoint": format!("http://127.0.0.1:{}", 20000 + i)}}}
            }),
        ];
        for (w, patch) in writes.iter().enumerate() {
            let name = patch["metadata"]["name"].as_str().unwrap_or_default();
            for (t, (label, api)) in targets.iter().enumerate() {
                let start = Instant::now();
                api.patch(name, &params, &kube::api::Patch::Apply(patch))
                    .await
                    .unwrap_or_else(|e| panic!("apply with {label}: {e}"));
                if i >= warm {
                    samples[w][t].push(start.elapsed());
                }
            }
        }
    }
    let reviews_after = webhook.reviews_answered().await;
    let mut apply_ratios = Vec::new();
    println!(
        "\n# Server-side apply through the API server ({rounds} applies of each write to each namespace, interleaved; load average at the end {})\n",
        load_average()
    );
    println!(
        "| write | admission | p50 | p99 | p50 / neither | p99 / neither |\n|---|---|---|---|---|---|"
    );
    for (w, write) in [
        "an annotation only (no work for the webhooks)",
        "the spec (work for the validating webhook)",
    ]
    .iter()
    .enumerate()
    {
        let figs: Vec<Figures> = samples[w]
            .iter()
            .map(|s| figures(s.clone(), s.iter().sum()))
            .collect();
        let base = &figs[targets.len() - 1];
        apply_ratios.push(figs[0].p50.as_secs_f64() / base.p50.as_secs_f64());
        for ((label, _), f) in targets.iter().zip(&figs) {
            println!(
                "| {write} | {label} | {} | {} | {:.2} | {:.2} |",
                ms(f.p50),
                ms(f.p99),
                f.p50.as_secs_f64() / base.p50.as_secs_f64(),
                f.p99.as_secs_f64() / base.p99.as_secs_f64()
            );
        }
    }
    println!(
        "\nreviews the webhook answered during the applies: mutate {}, validate {}",
        reviews_after.0 - reviews_before.0,
        reviews_after.1 - reviews_before.1,
    );
    // The gates: the slowest throughput row of the webhook (every run, both ways of pinning), and
    // the p50 ratio with the webhooks against neither for the annotation write (what every write
    // of an instance pays for the webhooks being registered); the spec write's ratio, where the
    // validating webhook does its work, is printed above beside the ValidatingAdmissionPolicy's.
    println!();
    support::gate(
        "webhook-reviews-per-second-one-core-16-connections",
        webhook_rates.iter().copied().fold(f64::INFINITY, f64::min),
        ">=",
        10_000.0,
    );
    support::gate(
        "server-side-apply-p50-with-webhooks-over-without",
        apply_ratios[0],
        "<=",
        1.15,
    );
    let _ = cluster.kubectl_ok(
        &[
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "-l",
            &format!("bench-peer={id}"),
            "--ignore-not-found",
        ],
        None,
    );
    webhook.stop();
    e2e::webhook::unregister(&cluster, id);
}
