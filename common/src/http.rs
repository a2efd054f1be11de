//! The operations port every binary serves: `/healthz` (the process is alive), `/readyz` (it is
//! ready for work) and `/metrics` (Prometheus text format), with the timeouts and limits of
//! [`crate::server`]; over plain HTTP here, over HTTPS with a guarded `/metrics` in
//! [`crate::secure_metrics`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::server::{Limits, Plain};

/// Readiness shared between a binary's work and its `/readyz` endpoint.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether the process is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct OpsState {
    registry: Registry,
    readiness: Readiness,
}

/// The router for the operations port.
pub fn ops_router(registry: Registry, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(OpsState {
            registry,
            readiness,
        })
}

async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    if state.readiness.get() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn metrics(State(state): State<OpsState>) -> impl IntoResponse {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&state.registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, encoder.format_type().to_string())],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".to_string())],
            format!("encoding metrics failed: {e}").into_bytes(),
        ),
    }
}

/// Error from the operations server.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address could not be bound.
    #[error("cannot listen on {addr} ({source}); choose a free address with the bind-address flag")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving on {addr} failed: {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A bound operations listener, so callers learn the real address (port 0 picks a free one).
pub struct OpsServer {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
}

impl OpsServer {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> Result<Self, HttpError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| HttpError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| HttpError::Bind { addr, source })?;
        Ok(Self { listener, addr })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound socket, for serving it another way (over TLS: `secure_metrics`).
    pub fn into_listener(self) -> tokio::net::TcpListener {
        self.listener
    }

    /// Serves `router` with the default [`Limits`] until `shutdown` completes, then lets
    /// in-flight requests finish.
    pub async fn serve(
        self,
        router: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), HttpError> {
        self.serve_with(router, Limits::default(), shutdown).await
    }

    /// Serves `router` with the timeouts and limits of `limits` (see [`crate::server`]) until
    /// `shutdown` completes, then lets in-flight requests finish.
    pub async fn serve_with(
        self,
        router: Router,
        limits: Limits,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), HttpError> {
        crate::server::serve(self.listener, Plain, router, limits, shutdown).await;
        Ok(())
    }
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get_path(router: Router, path: &str) -> (StatusCode, String) {
        use tower::ServiceExt;
        let response = router
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .expect("request"),
            )
            .await
            .expect("response");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("test_total", "a test counter").expect("counter");
        registry
            .register(Box::new(counter.clone()))
            .expect("register");
        counter.inc();
        let readiness = Readiness::default();
        let router = ops_router(registry, readiness.clone());

        assert_eq!(
            get_path(router.clone(), "/healthz").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            get_path(router.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        readiness.set(true);
        assert_eq!(
            get_path(router.clone(), "/readyz").await,
            (StatusCode::OK, "ok".into())
        );
        let (status, body) = get_path(router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("test_total 1"), "{body}");
    }
}

/// Flags shared by every binary for the operations port.
#[derive(Clone, Debug, clap::Args)]
pub struct OpsArgs {
    /// Address of the operations port serving /healthz, /readyz and /metrics (HTTPS unless
    /// --metrics-secure=false).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,

    /// HTTPS and authorization of the operations port.
    #[command(flatten)]
    pub security: crate::secure_metrics::SecureMetricsArgs,
}
