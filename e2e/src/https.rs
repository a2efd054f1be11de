//! A minimal HTTPS client for tests and benchmarks: one keep-alive connection over rustls,
//! speaking HTTP/1.1 or h2 as ALPN decides, trusting only a given CA bundle.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};

use crate::HarnessError;

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// One TLS connection.
pub struct HttpsConnection {
    sender: Sender,
    /// The ALPN protocol the server chose.
    pub alpn: Option<Vec<u8>>,
    /// The negotiated TLS version.
    pub tls_version: Option<rustls::ProtocolVersion>,
    /// The server's leaf certificate.
    pub peer_certificate: Option<Vec<u8>>,
}

fn err(what: &str) -> impl FnOnce(String) -> HarnessError + '_ {
    move |e| HarnessError::Command {
        what: what.to_string(),
        stderr: e,
    }
}

/// A TLS client trusting only `ca_pem`, offering `alpn` protocols and `versions` of TLS.
pub fn tls_connector(
    ca_pem: &str,
    alpn: &[&[u8]],
    versions: &[&'static SupportedProtocolVersion],
) -> Result<tokio_rustls::TlsConnector, HarnessError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| err("reading the CA bundle")(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| err("trusting the CA")(e.to_string()))?;
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .map_err(|e| err("TLS versions")(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

impl HttpsConnection {
    /// Connects to `addr`, verifying the server as `server_name` against `ca_pem`, offering
    /// `alpn` protocols and `versions` of TLS.
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        ca_pem: &str,
        alpn: &[&[u8]],
        versions: &[&'static SupportedProtocolVersion],
    ) -> Result<Self, HarnessError> {
        let connector = tls_connector(ca_pem, alpn, versions)?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| err("connecting")(e.to_string()))?;
        tcp.set_nodelay(true)
            .map_err(|e| err("TCP_NODELAY")(e.to_string()))?;
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|e| err("server name")(e.to_string()))?;
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| err("TLS handshake")(e.to_string()))?;
        let (_, session) = tls.get_ref();
        let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
        let tls_version = session.protocol_version();
        let peer_certificate = session
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec());
        let io = TokioIo::new(tls);
        let sender = if alpn.as_deref() == Some(b"h2") {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| err("h2 handshake")(e.to_string()))?;
            tokio::spawn(conn);
            Sender::H2(sender)
        } else {
            let (sender, conn) = http1::handshake(io)
                .await
                .map_err(|e| err("HTTP/1.1 handshake")(e.to_string()))?;
            tokio::spawn(conn);
            Sender::H1(sender)
        };
        Ok(Self {
            sender,
            alpn,
            tls_version,
            peer_certificate,
        })
    }

    /// POSTs `body` as JSON to `path`; returns the status and the response body.
    pub async fn post(&mut self, path: &str, body: Bytes) -> Result<(u16, Bytes), HarnessError> {
        let request = hyper::Request::post(path)
            .header("content-type", "application/json")
            .header("host", "webhook")
            .body(Full::new(body))
            .map_err(|e| err("building a request")(e.to_string()))?;
        self.send(request).await
    }

    /// GETs `path`, with `Authorization: Bearer <token>` when a token is given; returns the
    /// status and the response body.
    pub async fn get(
        &mut self,
        path: &str,
        token: Option<&str>,
    ) -> Result<(u16, Bytes), HarnessError> {
        let mut request = hyper::Request::get(path).header("host", "127.0.0.1");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| err("building a request")(e.to_string()))?;
        self.send(request).await
    }

    async fn send(
        &mut self,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<(u16, Bytes), HarnessError> {
        // A keep-alive HTTP/1.1 connection takes the next request only once it has finished the
        // previous exchange: wait for it to be ready rather than racing it.
        let response = match &mut self.sender {
            Sender::H1(s) => match s.ready().await {
                Ok(()) => s.send_request(request).await,
                Err(e) => Err(e),
            },
            Sender::H2(s) => match s.ready().await {
                Ok(()) => s.send_request(request).await,
                Err(e) => Err(e),
            },
        }
        .map_err(|e| err("sending a request")(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| err("reading a response")(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }
}
