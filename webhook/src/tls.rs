//! The admission port: axum over rustls (TLS 1.2 and 1.3, HTTP/1.1 and h2), with the serving
//! certificate read through a swappable resolver, and a graceful shutdown that lets in-flight
//! reviews finish.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus::IntCounter;
use rustls::ServerConfig;
use rustls::server::ResolvesServerCert;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(25);

/// The rustls configuration of the admission port.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig, rustls::Error> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `router` over TLS on `listener` until `shutdown` completes, then drains connections.
pub async fn serve(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    router: Router,
    handshake_failures: IntCounter,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(config);
    let graceful = GracefulShutdown::new();
    let builder = Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                let builder = builder.clone();
                let watcher = graceful.watcher();
                let failures = handshake_failures.clone();
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            failures.inc();
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            failures.inc();
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
                    if let Err(e) = watcher.watch(connection).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("in-flight reviews did not finish within {DRAIN_TIMEOUT:?}");
    }
}
