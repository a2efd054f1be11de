//! Serving HTTP under hostile load: every server socket of both binaries (the webhook's TLS
//! admission port and the plain operations port of each binary) runs through [`serve`], which
//! bounds each connection and each request:
//!
//! - at most `max_concurrent_handshakes` TLS handshakes run at once; a client must finish its
//!   handshake (waiting for a turn included), and then send a request's headers, within the
//!   header-read timeout (hyper's HTTP/1 `header_read_timeout`, which also runs while a keep-alive
//!   connection waits for its next request, so an idle HTTP/1.1 connection is closed after it; for
//!   HTTP/2, the first request must come within it);
//! - an HTTP/2 connection with no request in flight is closed after the idle timeout (an HTTP/1.1
//!   one after the shorter of both);
//! - HTTP/2 connections get keep-alive pings and a bound on concurrent streams;
//! - at most `max_connections` connections are open at once; one accepted beyond that is closed
//!   at once;
//! - each request is answered within the request timeout, body included (HTTP 408 otherwise);
//! - each request is classified by the body size it declares, before anything else is done with
//!   it ([`admit`]): a *small* body (a `Content-Length` of at most [`SMALL_BODY`], which every
//!   ordinary review and every GET has) reserves its declared size from the small-body budget
//!   while it is received and answered, and, once it has arrived whole, one of
//!   `max_requests_in_flight` slots while it is answered; a *large* one (over [`SMALL_BODY`],
//!   chunked, or of unknown length) reserves its declared size, or [`MAX_BODY`], from the
//!   large-body budget. The two classes share nothing, so large bodies can never crowd small
//!   ones out, and a slowly sent small body holds bytes of its budget but no slot. A request
//!   over a budget, or beyond the slots, gets HTTP 503 with `Retry-After: 1` at once, never a
//!   queue; one refused before its body was read also gets `Connection: close` (HTTP/1.1), and
//!   its body is never read. A body is never read past the size it declared (HTTP 413);
//! - heavy work a client can ask for in bulk (every TLS handshake, and reading, parsing and
//!   answering every large body) runs on the [`bulk`] runtime, whose threads run at the lowest
//!   CPU priority: a connection moves there while it has such work under way and back when it is
//!   done, so ordinary requests on established connections get the CPU first;
//! - a panic in a handler becomes HTTP 500 for that request, never a dropped connection.
//!
//! On shutdown it stops accepting, asks every connection to close after its in-flight requests,
//! and waits for them up to a drain timeout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::State;
use axum::http::{Request, StatusCode, Version, header};
use axum::middleware::Next;
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

    /// Requests with a small body (declared, at most 256 KiB: every ordinary review, every GET)
    /// answered at once on each port, counted once the body has arrived whole; one more gets
    /// HTTP 503 with Retry-After: 1. Large bodies never take these slots.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_requests_in_flight: u32,

    /// MiB of small request bodies (declared, at most 256 KiB) being received or answered at once
    /// on each port, each counted at its declared size; a request that would go over it gets
    /// HTTP 503 with Retry-After: 1 before its body is read.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub small_body_budget_mib: u32,

    /// MiB of large request bodies (over 256 KiB, or of unknown length, counted as 7 MiB) being
    /// received or answered at once on each port; a request that would go over it gets HTTP 503
    /// with Retry-After: 1 before its body is read.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(8..))]
    pub large_body_budget_mib: u32,

    /// TLS handshakes run at once on each port; a new connection waits for its turn within the
    /// header-read timeout, and is closed if it does not get one.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_handshakes: u32,

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
            small_body_budget_mib: 32,
            large_body_budget_mib: 24,
            max_concurrent_handshakes: 64,
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

    /// Whether the handshake costs CPU (then it runs on the [`bulk`] runtime).
    const HEAVY: bool;

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
    const HEAVY: bool = false;

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
    const HEAVY: bool = true;

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

/// Request bodies that declare at most this many bytes are small: they have a budget and
/// slots of their own (see the module header).
pub const SMALL_BODY: u64 = 256 * 1024;
/// The largest request body any port reads, in bytes; a body of unknown length reserves this
/// much of the large-body budget and is never read past it.
pub const MAX_BODY: u64 = 7 * 1024 * 1024;

/// The layers every router is served with, outermost first: a panic becomes HTTP 500, the request
/// timeout HTTP 408, and [`admit`] classifies each request by its body and applies its class's
/// budget and slots.
pub fn layers(router: Router, limits: &Limits) -> Router {
    let gate = Arc::new(Gate::new(limits));
    router.layer(
        tower::ServiceBuilder::new()
            .layer(CatchPanicLayer::custom(panicked))
            .layer(TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                limits.request_timeout,
            ))
            .layer(axum::middleware::from_fn_with_state(gate, admit)),
    )
}

/// What [`admit`] hands out: the two body budgets (in KiB) and the slots of small requests.
struct Gate {
    small_kib: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    large_kib: Arc<Semaphore>,
}

impl Gate {
    fn new(limits: &Limits) -> Self {
        let kib = |mib: u32| Arc::new(Semaphore::new(mib as usize * 1024));
        Self {
            small_kib: kib(limits.small_body_budget_mib),
            slots: Arc::new(Semaphore::new(limits.max_requests_in_flight as usize)),
            large_kib: kib(limits.large_body_budget_mib),
        }
    }
}

/// `bytes` rounded up to whole KiB, as semaphore permits.
fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// Classifies a request by the body size it declares and admits it by its class (see the
/// module header); the body is read here, never past the size it declared, and handed on whole.
async fn admit(State(gate): State<Arc<Gate>>, request: Request<Body>, next: Next) -> Response {
    let declared = request.body().size_hint().exact();
    let version = request.version();
    match declared {
        Some(size) if size <= SMALL_BODY => {
            let Ok(bytes) = gate.small_kib.clone().try_acquire_many_owned(kib(size)) else {
                return refused(
                    version,
                    true,
                    "too many request bodies being received at once (the small-body budget is spent); retry in a second",
                );
            };
            let (parts, body) = request.into_parts();
            let body = match read_body(body, size, version).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            // The body has arrived: only now does the request take a slot.
            let Ok(slot) = gate.slots.clone().try_acquire_owned() else {
                return refused(
                    version,
                    false,
                    "too many requests in flight; retry in a second",
                );
            };
            let response = next.run(Request::from_parts(parts, Body::from(body))).await;
            drop((slot, bytes));
            response
        }
        Some(size) if size > MAX_BODY => too_large(version),
        _ => {
            let size = declared.unwrap_or(MAX_BODY);
            let Ok(bytes) = gate.large_kib.clone().try_acquire_many_owned(kib(size)) else {
                return refused(
                    version,
                    true,
                    "too many large request bodies in flight (the large-body budget is spent); retry in a second",
                );
            };
            // Reading (its connection's TLS included), parsing and answering a large body is
            // heavy work: it runs at low priority, on the bulk runtime.
            let heavy = request
                .extensions()
                .get::<HeavyMark>()
                .map(|mark| mark.0.begin());
            let response = on_bulk(async move {
                let (parts, body) = request.into_parts();
                match read_body(body, size, version).await {
                    Ok(body) => next.run(Request::from_parts(parts, Body::from(body))).await,
                    Err(response) => response,
                }
            })
            .await;
            drop((heavy, bytes));
            response
        }
    }
}

/// Reads `body` whole, never past `limit` bytes (HTTP 413 beyond: a body that sends more than it
/// declared is cut off there).
async fn read_body(body: Body, limit: u64, version: Version) -> Result<Bytes, Response> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit)).await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(version)),
        Err(e) => {
            tracing::debug!(error = %e, "reading a request body failed");
            Err((
                StatusCode::BAD_REQUEST,
                "the request body could not be read; send it whole",
            )
                .into_response())
        }
    }
}

/// HTTP 413 for a body over [`MAX_BODY`], or one longer than it declared.
fn too_large(version: Version) -> Response {
    let mut response = (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is larger than it declared, or than the {} MiB this server reads",
            MAX_BODY / (1024 * 1024)
        ),
    )
        .into_response();
    close(version, &mut response);
    response
}

/// HTTP 503 with `Retry-After: 1`; with `unread`, the body was not read and an HTTP/1 connection
/// is closed after the answer.
fn refused(version: Version, unread: bool, message: &'static str) -> Response {
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        message,
    )
        .into_response();
    if unread {
        close(version, &mut response);
    }
    response
}

/// Asks an HTTP/1 client to close the connection (its unread body cannot be skipped); HTTP/2
/// resets the stream by itself.
fn close(version: Version, response: &mut Response) {
    if version <= Version::HTTP_11 {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
}

fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked; answered 500");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error while answering this request; see the server's log",
    )
        .into_response()
}

/// The nice value of the bulk runtime's threads: the lowest priority there is.
const BULK_NICE: i32 = 19;

static BULK: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();

/// The runtime heavy work runs on: TLS handshakes, and reading, parsing and answering large
/// bodies. Its threads (workers and blocking pool) run at the lowest CPU priority (nice 19), so
/// under load the workers answering ordinary requests always get the CPU first. `None` when it
/// could not be built (the heavy work then stays where it is, at normal priority).
pub fn bulk() -> Option<tokio::runtime::Handle> {
    BULK.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread()
            .thread_name("bulk")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()
        {
            Ok(runtime) => Some(runtime),
            Err(e) => {
                tracing::warn!(error = %e, "building the low-priority runtime failed; heavy work runs at normal priority");
                None
            }
        }
    })
    .as_ref()
    .map(|runtime| runtime.handle().clone())
}

/// Sets the calling thread's nice value to [`BULK_NICE`] (on Linux the nice value is per
/// thread; raising it needs no privilege).
fn lower_priority() {
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), BULK_NICE)
    {
        tracing::debug!(error = %e, "lowering a bulk thread's priority failed");
    }
}

/// Runs `work` on the [`bulk`] runtime and waits for it; a panic in it is resumed here (so the
/// panic layer answers 500).
async fn on_bulk<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    let Some(bulk) = bulk() else {
        return work.await;
    };
    match bulk.spawn(work).await {
        Ok(done) => done,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only a runtime shutting down cancels its tasks, and the bulk runtime never does.
            Err(_) => std::future::pending().await,
        },
    }
}

/// How much heavy work one connection has under way (its TLS handshake, large bodies): while
/// any, the connection is served on the [`bulk`] runtime.
#[derive(Default)]
struct Heavy {
    count: AtomicUsize,
    changed: tokio::sync::Notify,
}

/// Marks heavy work under way on a connection until dropped.
struct HeavyWork(Arc<Heavy>);

impl Drop for HeavyWork {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

impl Heavy {
    fn begin(self: &Arc<Self>) -> HeavyWork {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        HeavyWork(self.clone())
    }

    /// Completes once the connection has heavy work under way (`heavy`), or none (`!heavy`).
    async fn until(&self, heavy: bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if (self.count.load(Ordering::SeqCst) > 0) == heavy {
                return;
            }
            changed.await;
        }
    }
}

/// The request extension through which [`admit`] marks a large body as heavy work of its
/// connection.
#[derive(Clone)]
struct HeavyMark(Arc<Heavy>);

/// A connection's whole life as one future.
type Life = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Polls `life` on the current runtime while its connection has no heavy work under way, and
/// on the [`bulk`] runtime while it has, moving it between them as that changes.
async fn shuttle(mut life: Life, heavy: Arc<Heavy>) {
    let Some(bulk) = bulk() else {
        return life.await;
    };
    loop {
        tokio::select! {
            biased;
            () = heavy.until(true) => {}
            () = life.as_mut() => return,
        }
        let moved = bulk.spawn({
            let heavy = heavy.clone();
            async move {
                tokio::select! {
                    biased;
                    () = heavy.until(false) => Some(life),
                    () = life.as_mut() => None,
                }
            }
        });
        match moved.await {
            Ok(Some(back)) => life = back,
            Ok(None) => return,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => return,
            },
        }
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
    let handshakes = Arc::new(Semaphore::new(limits.max_concurrent_handshakes as usize));
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
                    handshakes: handshakes.clone(),
                    builder: builder.clone(),
                    router: router.clone(),
                    limits,
                    stop: stop_rx.clone(),
                };
                tokio::spawn(async move {
                    let heavy = Arc::new(Heavy::default());
                    let handshaking = H::HEAVY.then(|| heavy.begin());
                    let life = Box::pin(connection.run(tcp, peer, heavy.clone(), handshaking));
                    shuttle(life, heavy).await;
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
    handshakes: Arc<Semaphore>,
    builder: Builder<TokioExecutor>,
    router: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
}

impl<H: Handshake> Connection<H> {
    /// Handshakes, then serves requests until the client leaves, the connection idles out, or
    /// shutdown asks it to close after its in-flight requests.
    /// It runs on the [`bulk`] runtime while `heavy` counts work under way: `handshaking`, then
    /// any large body.
    async fn run(
        mut self,
        tcp: TcpStream,
        peer: SocketAddr,
        heavy: Arc<Heavy>,
        handshaking: Option<HeavyWork>,
    ) {
        // The header-read timeout covers waiting for a handshake turn and the handshake itself.
        let deadline = Instant::now() + self.limits.header_read_timeout;
        let Ok(Ok(turn)) =
            tokio::time::timeout_at(deadline, self.handshakes.clone().acquire_owned()).await
        else {
            tracing::debug!(%peer, "no handshake turn within the header-read timeout; closing");
            return;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let shaken = self.handshake.handshake(tcp, peer, left).await;
        drop((turn, handshaking));
        let Some(io) = shaken else {
            return;
        };
        let activity = Activity::new();
        let service = {
            let activity = activity.clone();
            let router = self.router.clone();
            tower::service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(HeavyMark(heavy.clone()));
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

    /// Serves `app` (plus `/echo`, which answers the length of the body it got) on loopback with
    /// `limits` and `handshake`; returns its address, what stops it and its task.
    async fn start<H: Handshake>(
        limits: Limits,
        handshake: H,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = app(Arc::new(tokio::sync::Notify::new()))
            .route(
                "/echo",
                axum::routing::post(|body: Bytes| async move { body.len().to_string() }),
            )
            .route("/nice", axum::routing::post(|_: Bytes| async { nice() }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, handshake, router, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop, server)
    }

    /// Stops a server from [`start`] and waits for it to drain.
    async fn finish(stop: tokio::sync::oneshot::Sender<()>, server: tokio::task::JoinHandle<()>) {
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("drains")
            .expect("join");
    }

    /// Opens a connection and sends `bytes`, and no more.
    async fn open(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(bytes).await.expect("write");
        tcp
    }

    /// The head of a POST to `/echo` declaring a body of `len` bytes.
    fn post(len: u64) -> Vec<u8> {
        format!("POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n").into_bytes()
    }

    /// Reads one answer (its head, and as much body as its `content-length` says), lowercased.
    async fn answer(tcp: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            let text = String::from_utf8_lossy(&got).to_lowercase();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    return text;
                }
            }
            let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
                .await
                .expect("an answer in time")
                .expect("read");
            assert!(n > 0, "closed before a whole answer: {text}");
            got.extend_from_slice(&buf[..n]);
        }
    }

    fn roomy() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            max_connections: 64,
            max_requests_in_flight: 1,
            small_body_budget_mib: 1,
            large_body_budget_mib: 8,
            ..Limits::default()
        }
    }

    #[tokio::test]
    async fn small_requests_are_answered_while_large_and_slow_bodies_hold_their_budgets() {
        let (addr, stop, server) = start(roomy(), Plain).await;
        // The whole large-body budget (8 MiB) held by two bodies still arriving.
        let mut large = open(addr, &post(7 * 1024 * 1024)).await;
        large.write_all(&[b' '; 1024]).await.expect("write");
        let mut rest = open(addr, &post(1024 * 1024)).await;
        rest.write_all(&[b' '; 1024]).await.expect("write");
        // Three small bodies sent slowly hold 600 KiB of the 1 MiB small-body budget, no slot.
        let mut slow = Vec::new();
        for _ in 0..3 {
            slow.push(open(addr, &[post(200 * 1024), b"{".to_vec()].concat()).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Another large body is refused at once, its body unread, the connection closed.
        let mut refused = open(addr, &post(300 * 1024)).await;
        let got = answer(&mut refused).await;
        assert!(got.starts_with("http/1.1 503"), "{got}");
        assert!(got.contains("retry-after: 1"), "{got}");
        assert!(got.contains("connection: close"), "{got}");
        assert!(got.contains("large-body budget"), "{got}");
        let _ = until_closed(&mut refused).await;
        // Small requests still get the one slot (max_requests_in_flight = 1).
        let mut ok = open(addr, b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(answer(&mut ok).await.starts_with("http/1.1 200"));
        let mut echo = open(addr, &[post(5), b"hello".to_vec()].concat()).await;
        let got = answer(&mut echo).await;
        assert!(
            got.starts_with("http/1.1 200") && got.ends_with("\r\n5"),
            "{got}"
        );
        // A small body that would go over the small-body budget is refused before it is read
        // (600 KiB held, 250 KiB more held, 250 KiB more is over the 1 MiB).
        slow.push(open(addr, &[post(250 * 1024), b"{".to_vec()].concat()).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut over = open(addr, &post(250 * 1024)).await;
        let got = answer(&mut over).await;
        assert!(got.starts_with("http/1.1 503"), "{got}");
        assert!(got.contains("small-body budget"), "{got}");
        assert!(got.contains("connection: close"), "{got}");
        // Once a large body has arrived it is answered, and its share comes back.
        rest.write_all(&vec![b' '; 1024 * 1024 - 1024])
            .await
            .expect("write");
        let got = answer(&mut rest).await;
        assert!(got.ends_with("\r\n1048576"), "{got}");
        let mut again = open(addr, &[post(300 * 1024), vec![b' '; 300 * 1024]].concat()).await;
        let got = answer(&mut again).await;
        assert!(got.ends_with("\r\n307200"), "{got}");
        drop((large, slow));
        finish(stop, server).await;
    }

    #[tokio::test]
    async fn a_body_is_never_read_past_what_it_declared() {
        let (addr, stop, server) = start(roomy(), Plain).await;
        // It declares 10 bytes and sends 100 more: the handler gets 10, and the rest is read as a
        // next request, which is garbage: HTTP 400 and the connection closed.
        let mut liar = open(
            addr,
            &[post(10), b"0123456789".to_vec(), vec![0u8; 100]].concat(),
        )
        .await;
        let got = String::from_utf8_lossy(&until_closed(&mut liar).await).to_lowercase();
        assert!(got.starts_with("http/1.1 200"), "{got}");
        assert!(got.contains("\r\n\r\n10http/1.1 400"), "{got}");
        // One that declares more than the largest body is refused before it is read.
        let mut huge = open(addr, &post(MAX_BODY + 1)).await;
        let got = answer(&mut huge).await;
        assert!(got.starts_with("http/1.1 413"), "{got}");
        assert!(got.contains("connection: close"), "{got}");
        let _ = until_closed(&mut huge).await;
        finish(stop, server).await;
    }

    /// A handshake that takes 100 ms and records how many ran at once.
    #[derive(Clone, Default)]
    struct Turnstile {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl Handshake for Turnstile {
        type Io = TcpStream;
        const HEAVY: bool = false;

        async fn handshake(&self, tcp: TcpStream, _: SocketAddr, _: Duration) -> Option<TcpStream> {
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            Some(tcp)
        }
    }

    #[tokio::test]
    async fn handshakes_take_turns_within_the_header_read_timeout() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(250),
            max_concurrent_handshakes: 1,
            ..roomy()
        };
        let turnstile = Turnstile::default();
        let (addr, stop, server) = start(limits, turnstile.clone()).await;
        let get = b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n";
        let mut first = open(addr, get).await;
        let mut others = Vec::new();
        for _ in 0..3 {
            others.push(open(addr, get).await);
        }
        assert!(answer(&mut first).await.starts_with("http/1.1 200"));
        // The fourth cannot have a turn before 300 ms, past its 250 ms: closed unanswered.
        let mut last = others.pop().expect("fourth");
        assert!(until_closed(&mut last).await.is_empty());
        assert_eq!(turnstile.most.load(Ordering::SeqCst), 1, "one at a time");
        drop(others);
        finish(stop, server).await;
    }

    /// The calling thread's nice value.
    fn nice() -> String {
        rustix::process::getpriority_process(Some(rustix::thread::gettid()))
            .expect("getpriority")
            .to_string()
    }

    #[tokio::test]
    async fn large_bodies_are_read_and_answered_at_the_lowest_priority_and_small_ones_are_not() {
        let (addr, stop, server) = start(roomy(), Plain).await;
        let post = |len: usize| {
            [
                format!("POST /nice HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n")
                    .into_bytes(),
                vec![b' '; len],
            ]
            .concat()
        };
        let here = nice();
        // A small body and a large one on one keep-alive connection, then a small one again:
        // the connection moves to the bulk runtime for the large one, and back.
        let mut tcp = open(addr, &post(10)).await;
        let small = answer(&mut tcp).await;
        assert!(small.ends_with(&format!("\r\n{here}")), "{small}");
        tcp.write_all(&post(300 * 1024)).await.expect("write");
        let large = answer(&mut tcp).await;
        assert!(large.ends_with("\r\n19"), "{large}");
        // Back once the large body is done (a request that arrives while the connection is
        // still finishing the large one's answer on the bulk runtime may be served there).
        let mut back = false;
        for _ in 0..50 {
            tcp.write_all(&post(10)).await.expect("write");
            if answer(&mut tcp).await.ends_with(&format!("\r\n{here}")) {
                back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            back,
            "the connection came back to the normal-priority runtime"
        );
        drop(tcp);
        finish(stop, server).await;
    }
}
