//! Admission benchmark (prints figures; asserts nothing about speed).
//!
//! 1. Direct: one webhook process, one TLS keep-alive HTTP/1.1 connection on loopback, N
//!    sequential `POST /validate` reviews of two sizes; beside it, on the same loopback with the
//!    same client, certificate and bodies, an in-process TLS echo server as the floor.
//! 2. Through the API server: p50/p99 of a PlatformInstance server-side apply in a namespace
//!    the webhook is registered for, and in one it is not, interleaved in one run.
//!
//! Run: `cargo bench -p webhook --bench admission` (env `BENCH_N` sets the request count).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

#[tokio::main]
async fn main() {
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
    let mut webhook = Webhook::start(
        Path::new(env!("CARGO_BIN_EXE_webhook")),
        &cluster,
        id,
        &ns,
        &[],
        Some(port),
    );
    webhook.wait_ready().await;
    let bundle = e2e::webhook::wait_for_bundle(&cluster, id).await;
    let ca = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .expect("base64"),
    )
    .expect("pem");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));

    // The floor: a TLS echo on the same loopback, same certificate shape, same client.
    let subject = webhook::certs::Subject {
        service: "platform-operator-webhook".into(),
        namespace: "bench".into(),
        extra_sans: vec![],
    };
    let generation =
        webhook::certs::issue(&subject, webhook::keeper::now(), 3600).expect("certificate");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let echo_addr = listener.local_addr().expect("addr");
    let config = Arc::new(
        webhook::tls::server_config(Arc::new(
            webhook::certs::Resolver::new(&generation).expect("resolver"),
        ))
        .expect("tls"),
    );
    let echo = Router::new().route("/validate", post(|body: Bytes| async move { body }));
    let counter = prometheus::IntCounter::new("echo_failures", "unused").expect("counter");
    tokio::spawn(webhook::tls::serve(
        listener,
        config,
        echo,
        counter,
        common::server::Limits::default(),
        std::future::pending::<()>(),
    ));

    println!(
        "# Admission benchmark ({n} sequential requests per row, one TLS 1.3 HTTP/1.1 keep-alive connection, loopback)\n"
    );
    println!(
        "| request | body | webhook p50 | webhook p99 | webhook req/s | TLS echo p50 | TLS echo p99 | TLS echo req/s | p50 ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let webhook_server_name = format!("platform-operator-webhook.{ns}.svc");
    for (label, object) in [
        ("validate, seed example", small()),
        ("validate, 32 tenants / 128 users", large()),
    ] {
        let body = review(object);
        let mut conn = HttpsConnection::connect(
            addr,
            &webhook_server_name,
            &ca,
            &[b"http/1.1"],
            &[&rustls::version::TLS13],
        )
        .await
        .expect("webhook");
        let w = drive(&mut conn, "/validate", &body, n).await;
        let mut conn = HttpsConnection::connect(
            echo_addr,
            NAME,
            &generation.ca_cert,
            &[b"http/1.1"],
            &[&rustls::version::TLS13],
        )
        .await
        .expect("echo");
        let e = drive(&mut conn, "/validate", &body, n).await;
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
    }

    // Through the API server: server-side apply with and without the webhook, interleaved.
    let client = cluster.client().await.expect("client");
    let with: kube::Api<common::crd::PlatformInstance> = kube::Api::namespaced(client.clone(), &ns);
    let without: kube::Api<common::crd::PlatformInstance> =
        kube::Api::namespaced(client, &ns_without);
    let params = kube::api::PatchParams::apply("bench");
    let rounds = (n / 4).max(50);
    let (mut a, mut b) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for i in 0..rounds + rounds / 10 {
        let patch = json!({
            "apiVersion": "platform.di-framework.dev/v1alpha1", "kind": "PlatformInstance",
            "metadata": {"name": "applied", "annotations": {"bench/round": i.to_string()}},
            "spec": {"version": "6.0.22", "platform": {"gateway": {"httpNodePort": 0}}}
        });
        let t = Instant::now();
        with.patch("applied", &params, &kube::api::Patch::Apply(&patch))
            .await
            .expect("apply with webhook");
        let with_time = t.elapsed();
        let t = Instant::now();
        without
            .patch("applied", &params, &kube::api::Patch::Apply(&patch))
            .await
            .expect("apply without webhook");
        let without_time = t.elapsed();
        if i >= rounds / 10 {
            a.push(with_time);
            b.push(without_time);
        }
    }
    let total_a: Duration = a.iter().sum();
    let total_b: Duration = b.iter().sum();
    let fa = figures(a, total_a);
    let fb = figures(b, total_b);
    println!("\n# Server-side apply through the API server ({rounds} applies each, interleaved)\n");
    println!("| | p50 | p99 |\n|---|---|---|");
    println!(
        "| with the webhooks (mutate + validate) | {} | {} |",
        ms(fa.p50),
        ms(fa.p99)
    );
    println!("| without | {} | {} |", ms(fb.p50), ms(fb.p99));
    println!(
        "| ratio | {:.2} | {:.2} |",
        fa.p50.as_secs_f64() / fb.p50.as_secs_f64(),
        fa.p99.as_secs_f64() / fb.p99.as_secs_f64()
    );
    webhook.stop();
    e2e::webhook::unregister(&cluster, id);
}
