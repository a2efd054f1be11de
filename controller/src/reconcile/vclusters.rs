//! One client per vCluster API, and its probe on the target-poll cadence.
//!
//! A client is built from the kubeconfig the vCluster exported the first time it is needed and
//! kept while that kubeconfig stays the same (by SHA-256); a changed kubeconfig builds a new one,
//! and the instance's going drops it ([`VClusters::forget`]). The probe (`GET /version`) runs at
//! most once per `--target-poll` per vCluster: reconciles in between reuse its answer. A client
//! keeps no idle connection (a thousand idle TLS connections would cost more memory than the
//! handshakes they save at one probe per poll); its TLS configuration keeps the session ticket of
//! its one server, so a probe resumes the TLS session instead of a full handshake.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::ServiceBuilder;

/// The SHA-256 of a kubeconfig.
type Digest = [u8; 32];

fn digest(kubeconfig: &str) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(
        ring::digest::digest(&ring::digest::SHA256, kubeconfig.as_bytes()).as_ref(),
    );
    out
}

/// What is kept per vCluster.
struct Entry {
    kubeconfig: Digest,
    /// `None` when the kubeconfig gave no usable client (its probe is then `false`).
    client: Option<kube::Client>,
    /// When the last probe started and what it found.
    probed: Option<(Instant, bool)>,
}

/// The vCluster clients, by host namespace.
#[derive(Default)]
pub struct VClusters {
    entries: Mutex<HashMap<String, Entry>>,
    builds: std::sync::atomic::AtomicU64,
    probes: std::sync::atomic::AtomicU64,
}

impl VClusters {
    /// Whether the vCluster in `host_ns` serves its API through `kubeconfig` within `timeout`,
    /// asking it at most once per `every`.
    pub async fn serves(
        &self,
        host_ns: &str,
        kubeconfig: &str,
        timeout: Duration,
        every: Duration,
    ) -> bool {
        let wanted = digest(kubeconfig);
        let kept = {
            let Ok(entries) = self.entries.lock() else {
                return false;
            };
            match entries.get(host_ns) {
                Some(e) if e.kubeconfig == wanted => {
                    if let Some((at, serves)) = e.probed
                        && at.elapsed() < every
                    {
                        return serves;
                    }
                    Some(e.client.clone())
                }
                _ => None,
            }
        };
        let client = match kept {
            Some(client) => client,
            None => {
                self.builds
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                build(kubeconfig).await
            }
        };
        let started = Instant::now();
        let serves = match &client {
            Some(c) => {
                self.probes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                matches!(
                    tokio::time::timeout(timeout, c.apiserver_version()).await,
                    Ok(Ok(_))
                )
            }
            None => false,
        };
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(
                host_ns.to_string(),
                Entry {
                    kubeconfig: wanted,
                    client,
                    probed: Some((started, serves)),
                },
            );
        }
        serves
    }

    /// Drops the client of the vCluster in `host_ns` (its instance is gone).
    pub fn forget(&self, host_ns: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(host_ns);
        }
    }

    /// How many clients are kept.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    /// Whether no client is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many clients were built and how many probes were sent, since the start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.builds.load(std::sync::atomic::Ordering::Relaxed),
            self.probes.load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}

/// A client of the API `kubeconfig` names: kube's TLS (its server name, CA and client identity)
/// and authentication, with a session cache of one server and no idle connection kept.
async fn build(kubeconfig: &str) -> Option<kube::Client> {
    let parsed = Kubeconfig::from_yaml(kubeconfig).ok()?;
    let config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .ok()?;
    let mut tls = config.rustls_client_config().ok()?;
    // The default session cache is sized for 256 servers; this client talks to one.
    tls.resumption = rustls::client::Resumption::in_memory_sessions(1);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => builder.with_server_name_resolver(
            hyper_rustls::FixedServerNameResolver::new(name.clone().try_into().ok()?),
        ),
        None => builder,
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let https = builder.enable_http1().wrap_connector(http);
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(https);
    let client = tower::ServiceExt::map_err(client, |e| -> tower::BoxError { Box::new(e) });
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().ok()?)
        .service(client);
    Some(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unusable_kubeconfig_does_not_serve_and_is_probed_once_per_poll() {
        let v = VClusters::default();
        let every = Duration::from_secs(60);
        assert!(
            !v.serves("h", "not: [a kubeconfig", Duration::from_secs(1), every)
                .await
        );
        assert_eq!(v.counts(), (1, 0), "one build tried, nothing to probe");
        assert!(
            !v.serves("h", "not: [a kubeconfig", Duration::from_secs(1), every)
                .await
        );
        assert_eq!(v.counts(), (1, 0), "the answer is reused within the poll");
        // Another kubeconfig builds again.
        assert!(
            !v.serves("h", "other: [x", Duration::from_secs(1), every)
                .await
        );
        assert_eq!(v.counts(), (2, 0));
        assert_eq!(v.len(), 1);
        v.forget("h");
        assert!(v.is_empty());
    }
}
