//! The admission port: axum over rustls (TLS 1.2 and 1.3, HTTP/1.1 and h2), with the serving
//! certificate read through a swappable resolver, served with the timeouts and limits of
//! [`common::server`] (the handshake must finish within the header-read timeout) and a graceful
//! shutdown that lets in-flight reviews finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use common::server::{Handshake, Limits};
use prometheus::IntCounter;
use rustls::ServerConfig;
use rustls::server::ResolvesServerCert;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

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

/// The TLS handshake of the admission port, counting the ones that fail or time out.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    failures: IntCounter,
}

impl Tls {
    /// Handshakes with `config`, counting failures in `failures`.
    pub fn new(config: Arc<ServerConfig>, failures: IntCounter) -> Self {
        Self {
            acceptor: TlsAcceptor::from(config),
            failures,
        }
    }
}

impl Handshake for Tls {
    type Io = TlsStream<TcpStream>;

    async fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Option<Self::Io> {
        match tokio::time::timeout(timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                self.failures.inc();
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                self.failures.inc();
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        }
    }
}

/// Serves `router` over TLS on `listener` with the timeouts and limits of `limits` (see
/// [`common::server`]) until `shutdown` completes, then drains connections.
pub async fn serve(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    router: Router,
    handshake_failures: IntCounter,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    common::server::serve(
        listener,
        Tls::new(config, handshake_failures),
        router,
        limits,
        shutdown,
    )
    .await;
}
