//! The admission port's TLS layer, in process: TLS 1.2 and 1.3, HTTP/1.1 and h2, certificates
//! swapped without a restart, failed handshakes counted, and a graceful shutdown that lets an
//! in-flight request finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use e2e::https::HttpsConnection;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::io::AsyncWriteExt;
use webhook::certs::{Generation, Resolver, Subject, issue};

const NAME: &str = "platform-operator-webhook.ops.svc";

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
    failures: prometheus::IntCounter,
}

fn generation() -> Generation {
    let subject = Subject {
        service: "platform-operator-webhook".into(),
        namespace: "ops".into(),
        extra_sans: vec![],
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    issue(&subject, now, 3600).expect("issue")
}

async fn start(resolver: Arc<Resolver>) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = Arc::new(webhook::tls::server_config(resolver).expect("config"));
    let router = Router::new()
        .route("/echo", post(|body: Bytes| async move { body }))
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(700)).await;
                "finished"
            }),
        );
    let failures = prometheus::IntCounter::new("failures", "test").expect("counter");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(webhook::tls::serve(
        listener,
        config,
        router,
        failures.clone(),
        common::server::Limits::default(),
        async {
            let _ = rx.await;
        },
    ));
    Server {
        addr,
        stop: Some(tx),
        done,
        failures,
    }
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("pem")
        .as_ref()
        .to_vec()
}

#[tokio::test]
async fn serves_h2_and_http11_over_tls13_and_tls12() {
    let g = generation();
    let server = start(Arc::new(Resolver::new(&g).expect("resolver"))).await;
    let mut h2 = HttpsConnection::connect(
        server.addr,
        NAME,
        &g.ca_cert,
        &[b"h2"],
        &[&rustls::version::TLS13],
    )
    .await
    .expect("TLS 1.3 with h2");
    assert_eq!(h2.alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(h2.tls_version, Some(rustls::ProtocolVersion::TLSv1_3));
    assert_eq!(
        h2.post("/echo", Bytes::from_static(b"ping"))
            .await
            .expect("post"),
        (200, Bytes::from_static(b"ping"))
    );

    let mut h1 = HttpsConnection::connect(
        server.addr,
        NAME,
        &g.ca_cert,
        &[b"http/1.1"],
        &[&rustls::version::TLS12],
    )
    .await
    .expect("TLS 1.2 with HTTP/1.1");
    assert_eq!(h1.alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(h1.tls_version, Some(rustls::ProtocolVersion::TLSv1_2));
    for _ in 0..3 {
        // Keep-alive: several requests on one connection.
        assert_eq!(
            h1.post("/echo", Bytes::from_static(b"pong"))
                .await
                .expect("post")
                .0,
            200
        );
    }
    // A client that trusts another CA is refused.
    let other = generation();
    assert!(
        HttpsConnection::connect(
            server.addr,
            NAME,
            &other.ca_cert,
            &[b"h2"],
            &[&rustls::version::TLS13]
        )
        .await
        .is_err()
    );
}

#[tokio::test]
async fn certificates_swap_without_a_restart() {
    let (a, b) = (generation(), generation());
    let resolver = Arc::new(Resolver::new(&a).expect("resolver"));
    let server = start(resolver.clone()).await;
    let bundle = format!("{}{}", a.ca_cert, b.ca_cert);
    let first = HttpsConnection::connect(
        server.addr,
        NAME,
        &bundle,
        &[b"h2"],
        &[&rustls::version::TLS13],
    )
    .await
    .expect("a");
    assert_eq!(first.peer_certificate, Some(der(&a.cert)));
    assert!(resolver.swap(&b).expect("swap"));
    let mut second = HttpsConnection::connect(
        server.addr,
        NAME,
        &bundle,
        &[b"h2"],
        &[&rustls::version::TLS13],
    )
    .await
    .expect("b");
    assert_eq!(
        second.peer_certificate,
        Some(der(&b.cert)),
        "new handshakes get the new certificate"
    );
    assert_eq!(
        second
            .post("/echo", Bytes::from_static(b"x"))
            .await
            .expect("post")
            .0,
        200
    );
}

#[tokio::test]
async fn failed_handshakes_are_counted() {
    let g = generation();
    let server = start(Arc::new(Resolver::new(&g).expect("resolver"))).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("tcp");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: plain\r\n\r\n")
        .await
        .expect("write");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.failures.get() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a plain-HTTP request must count as a failed handshake"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let g = generation();
    let mut server = start(Arc::new(Resolver::new(&g).expect("resolver"))).await;
    let mut conn = HttpsConnection::connect(
        server.addr,
        NAME,
        &g.ca_cert,
        &[b"http/1.1"],
        &[&rustls::version::TLS13],
    )
    .await
    .expect("connect");
    let in_flight = tokio::spawn(async move { conn.post("/slow", Bytes::new()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = server.stop.take().expect("stop").send(());
    let (status, body) = in_flight
        .await
        .expect("join")
        .expect("the in-flight request completes");
    assert_eq!((status, body), (200, Bytes::from_static(b"finished")));
    tokio::time::timeout(Duration::from_secs(5), server.done)
        .await
        .expect("server drains and stops")
        .expect("join");
    assert!(
        HttpsConnection::connect(
            server.addr,
            NAME,
            &g.ca_cert,
            &[b"h2"],
            &[&rustls::version::TLS13]
        )
        .await
        .is_err(),
        "no new connections after shutdown"
    );
}
