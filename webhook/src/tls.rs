//! The admission port: axum over rustls (TLS 1.2 and 1.3, HTTP/1.1 and h2), with the serving
//! certificate read through a swappable resolver, served with the timeouts and limits of
//! [`common::server`] (the handshake must finish within the header-read timeout) and a graceful
//! shutdown that lets in-flight reviews finish.

use std::sync::Arc;

use axum::Router;
use common::server::{Limits, Tls};
use prometheus::IntCounter;
use rustls::ServerConfig;
use rustls::server::ResolvesServerCert;
use tokio::net::TcpListener;

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
        Tls::new(config, Some(handshake_failures)),
        router,
        limits,
        shutdown,
    )
    .await;
}
