//! Serving HTTP under hostile load: every server socket of both binaries (the webhook's TLS
//! admission port and the plain operations port of each binary) runs through [`serve`], which
//! bounds each connection and each request:
//!
//! - a client must finish its handshake (TLS), and then send a request's headers, within the
//!   header-read timeout (hyper's HTTP/1 `header_read_timeout`, which also runs while a keep-alive
//!   connection waits for its next request, so an idle HTTP/1.1 connection is closed after it; for
//!   HTTP/2, the first request must come within it);
//! - an HTTP/2 connection with no request in flight is closed after the idle timeout (an HTTP/1.1
//!   one after the shorter of both);
//! - HTTP/2 connections get keep-alive pings and a bound on concurrent streams;
//! - at most `max_connections` connections are open at once; one accepted beyond that is closed
//!   at once;
//! - each request is answered within the request timeout, body included (HTTP 408 otherwise);
//! - at most `max_requests_in_flight` requests are answered at once; one more gets HTTP 503 with
//!   `Retry-After: 1` at once, never a queue;
//! - a panic in a handler becomes HTTP 500 for that request, never a dropped connection.
//!
//! On shutdown it stops accepting, asks every connection to close after its in-flight requests,
//! and waits for them up to a drain timeout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::TimeoutLayer;

/// How long in-flight requests get after shutdown begins.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(25);
/// The largest header block an HTTP/2 client may send, in bytes (HTTP/1 is bounded by hyper's
/// read buffer).
const MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;

/// The limits of one server socket; the webhook takes them as flags, the controller's operations
/// port uses the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Args)]
pub struct Limits {
    /// Time a client has for the TLS handshake, and then for each request's headers (also the
    /// longest wait for the first request on a new connection).
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    pub header_read_timeout: Duration,

    /// An HTTP/2 connection with no request in flight for this long is closed (an HTTP/1.1 one
    /// after the shorter of this and the header-read timeout).
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse)]
    pub idle_timeout: Duration,

    /// Time to answer one request, reading its body included; past it the client gets HTTP 408.
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    pub request_timeout: Duration,

    /// Connections open at once on each port; one more is closed as soon as it is accepted.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Requests answered at once on each port; one more gets HTTP 503 with Retry-After: 1.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_requests_in_flight: u32,

    /// Concurrent HTTP/2 streams a client may open on one connection.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,

    /// Interval of HTTP/2 keep-alive pings; a connection whose ping is not answered within the
    /// same time is closed.
    #[arg(long, default_value = "20s", value_parser = crate::duration::parse)]
    pub http2_keepalive_interval: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            max_connections: 2048,
            max_requests_in_flight: 64,
            http2_max_concurrent_streams: 32,
            http2_keepalive_interval: Duration::from_secs(20),
        }
    }
}

/// What turns an accepted TCP connection into the stream HTTP is spoken over: nothing for plain
/// HTTP ([`Plain`]), a TLS handshake for the webhook's admission port.
pub trait Handshake: Clone + Send + Sync + 'static {
    /// The stream after the handshake.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Completes the handshake within `timeout`, or gives `None` (the connection is dropped).
    fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        timeout: Duration,
    ) -> impl Future<Output = Option<Self::Io>> + Send;
}

/// Plain HTTP: no handshake.
#[derive(Clone, Copy, Debug, Default)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;

    async fn handshake(&self, tcp: TcpStream, _: SocketAddr, _: Duration) -> Option<TcpStream> {
        Some(tcp)
    }
}

/// TLS with rustls: the handshake must finish within the header-read timeout; the ones that fail
/// or time out are counted in `failures` when given.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    failures: Option<prometheus::IntCounter>,
}

impl Tls {
    /// Handshakes with `config`, counting failures in `failures`.
    pub fn new(
        config: Arc<rustls::ServerConfig>,
        failures: Option<prometheus::IntCounter>,
    ) -> Self {
        Self {
            acceptor: tokio_rustls::TlsAcceptor::from(config),
            failures,
        }
    }
}

impl Handshake for Tls {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;

    async fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Option<Self::Io> {
        let failed = |why: &dyn std::fmt::Display| {
            if let Some(failures) = &self.failures {
                failures.inc();
            }
            tracing::debug!(%peer, error = %why, "TLS handshake failed");
        };
        match tokio::time::timeout(timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                failed(&e);
                None
            }
            Err(_) => {
                failed(&"timed out");
                None
            }
        }
    }
}

/// The layers every router is served with, outermost first: a panic becomes HTTP 500, the request
/// timeout HTTP 408, and a request beyond `max_requests_in_flight` HTTP 503 at once.
pub fn layers(router: Router, limits: &Limits) -> Router {
    let in_flight = limits.max_requests_in_flight as usize;
    router.layer(
        tower::ServiceBuilder::new()
            .layer(CatchPanicLayer::custom(panicked))
            .layer(TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                limits.request_timeout,
            ))
            .layer(HandleErrorLayer::new(overloaded))
            .load_shed()
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(in_flight)),
    )
}

fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked; answered 500");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error while answering this request; see the server's log",
    )
        .into_response()
}

async fn overloaded(error: tower::BoxError) -> Response {
    if error.is::<tower::load_shed::error::Overloaded>() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "too many requests in flight; retry in a second",
        )
            .into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
    }
}

/// The hyper connection builder: both protocols, with the timeouts and limits of `limits`.
fn builder(limits: &Limits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keepalive_interval)
        .keep_alive_timeout(limits.http2_keepalive_interval)
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(MAX_HEADER_LIST_SIZE);
    builder
}

/// When a connection last finished a request, and how many it has in flight.
struct Activity {
    in_flight: AtomicUsize,
    served: AtomicUsize,
    since: Mutex<Instant>,
}

/// Marks one request in flight until dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.served.fetch_add(1, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        })
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// When the connection counts as idle: `header_read_timeout` after it opened while it has
    /// served nothing, then `idle_timeout` after its last request; `None` while one is in flight.
    fn idle_at(&self, limits: &Limits) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = *self.since.lock().unwrap_or_else(|e| e.into_inner());
        Some(if self.served.load(Ordering::SeqCst) == 0 {
            since + limits.header_read_timeout
        } else {
            since + limits.idle_timeout
        })
    }
}

/// Serves `router` (with [`layers`]) on `listener` until `shutdown` completes, then lets
/// in-flight requests finish for up to [`DRAIN_TIMEOUT`].
pub async fn serve<H: Handshake>(
    listener: TcpListener,
    handshake: H,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let router = layers(router, &limits);
    let builder = builder(&limits);
    let connections = Arc::new(Semaphore::new(limits.max_connections as usize));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        // Out of file descriptors, say: give the peers a moment to go away.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, max = limits.max_connections, "too many connections; closing a new one");
                    continue;
                };
                let connection = Connection {
                    handshake: handshake.clone(),
                    builder: builder.clone(),
                    router: router.clone(),
                    limits,
                    stop: stop_rx.clone(),
                };
                tokio::spawn(async move {
                    connection.run(tcp, peer).await;
                    drop(permit);
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let all = limits.max_connections;
    if tokio::time::timeout(DRAIN_TIMEOUT, connections.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within {DRAIN_TIMEOUT:?}");
    }
}

/// One accepted connection and what it needs.
struct Connection<H> {
    handshake: H,
    builder: Builder<TokioExecutor>,
    router: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
}

impl<H: Handshake> Connection<H> {
    /// Handshakes, then serves requests until the client leaves, the connection idles out, or
    /// shutdown asks it to close after its in-flight requests.
    async fn run(mut self, tcp: TcpStream, peer: SocketAddr) {
        let timeout = self.limits.header_read_timeout;
        let Some(io) = self.handshake.handshake(tcp, peer, timeout).await else {
            return;
        };
        let activity = Activity::new();
        let service = {
            let activity = activity.clone();
            let router = self.router.clone();
            tower::service_fn(move |request: Request<Incoming>| {
                let in_flight = activity.begin();
                let answer = router.clone().oneshot(request);
                async move {
                    let response = answer.await;
                    drop(in_flight);
                    Ok::<_, Infallible>(response.unwrap_or_else(|never| match never {}))
                }
            })
        };
        let conn = self
            .builder
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        tokio::pin!(conn);
        let mut closing = false;
        loop {
            let idle_at = activity
                .idle_at(&self.limits)
                .unwrap_or_else(|| Instant::now() + self.limits.idle_timeout);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = self.stop.wait_for(|stop| *stop), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                () = tokio::time::sleep_until(idle_at), if !closing => {
                    if activity.idle_at(&self.limits).is_some_and(|at| at <= Instant::now()) {
                        tracing::debug!(%peer, "closing an idle connection");
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Only {
        #[command(flatten)]
        limits: Limits,
    }

    #[test]
    fn the_flag_defaults_are_the_defaults() {
        assert_eq!(Only::parse_from(["x"]).limits, Limits::default());
        let set = Only::parse_from(["x", "--idle-timeout", "5s", "--max-connections", "7"]);
        assert_eq!(set.limits.idle_timeout, Duration::from_secs(5));
        assert_eq!(set.limits.max_connections, 7);
        assert!(Only::try_parse_from(["x", "--max-requests-in-flight", "0"]).is_err());
    }

    use axum::body::Body;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn short() -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(400),
            idle_timeout: Duration::from_millis(600),
            request_timeout: Duration::from_millis(400),
            max_connections: 3,
            max_requests_in_flight: 1,
            ..Limits::default()
        }
    }

    fn app(release: Arc<tokio::sync::Notify>) -> Router {
        Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route(
                "/panic",
                get(|| async {
                    let empty: Vec<&'static str> = Vec::new();
                    empty[0]
                }),
            )
            .route(
                "/sleep",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }),
            )
            .route(
                "/hold",
                get(move || async move {
                    release.notified().await;
                    "released"
                }),
            )
    }

    async fn status(router: &Router, path: &str) -> StatusCode {
        let request = Request::get(path).body(Body::empty()).expect("request");
        router
            .clone()
            .oneshot(request)
            .await
            .expect("answer")
            .status()
    }

    #[tokio::test]
    async fn panics_timeouts_and_requests_beyond_the_limit_get_clear_answers() {
        let release = Arc::new(tokio::sync::Notify::new());
        let router = layers(app(release.clone()), &short());
        assert_eq!(status(&router, "/ok").await, StatusCode::OK);
        assert_eq!(
            status(&router, "/panic").await,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(status(&router, "/sleep").await, StatusCode::REQUEST_TIMEOUT);
        // One request in flight (the limit): the next is shed at once with Retry-After.
        let held = tokio::spawn({
            let router = router.clone();
            async move { status(&router, "/hold").await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let request = Request::get("/ok").body(Body::empty()).expect("request");
        let shed = router.clone().oneshot(request).await.expect("answer");
        assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(shed.headers()[header::RETRY_AFTER], "1");
        release.notify_one();
        assert_eq!(held.await.expect("join"), StatusCode::OK);
        assert_eq!(
            status(&router, "/ok").await,
            StatusCode::OK,
            "the slot is back"
        );
    }

    /// Reads until the server closes the connection; returns what it sent.
    async fn until_closed(tcp: &mut TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got))
            .await
            .expect("the server closes the connection");
        got
    }

    #[tokio::test]
    async fn slow_idle_and_surplus_connections_are_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let release = Arc::new(tokio::sync::Notify::new());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Plain, app(release), short(), async {
            let _ = stopped.await;
        }));
        let t0 = Instant::now();
        // Slowloris: headers never finished.
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("write");
        // Idle after one answered request (keep-alive).
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        // A third connection fills the cap; a fourth is closed at once.
        let mut third = TcpStream::connect(addr).await.expect("connect");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut fourth = TcpStream::connect(addr).await.expect("connect");
        let started = Instant::now();
        assert!(until_closed(&mut fourth).await.is_empty(), "surplus closed");
        assert!(started.elapsed() < Duration::from_millis(300));
        let _ = until_closed(&mut slow).await;
        assert!(
            t0.elapsed() >= Duration::from_millis(350),
            "the slow client had its header-read time"
        );
        let answered = until_closed(&mut idle).await;
        assert!(answered.starts_with(b"HTTP/1.1 200"), "{answered:?}");
        // HTTP/1.1: hyper runs the header-read clock while a kept-alive connection waits for its
        // next request, so it is closed after the header-read timeout (here shorter than idle).
        assert!(
            t0.elapsed() >= Duration::from_millis(350),
            "the idle connection had its header-read time"
        );
        // The third never sent a request: closed at the header-read deadline.
        let _ = until_closed(&mut third).await;
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("drains")
            .expect("join");
    }
}
