//! Whether each vCluster's API serves, probed on the target-poll cadence.
//!
//! The probe (`GET /version` through the kubeconfig the vCluster exported) runs at most once per
//! `--target-poll` per vCluster while that kubeconfig stays the same (by SHA-256): reconciles in
//! between reuse its answer, and a changed kubeconfig is probed at once. Per vCluster only the
//! digest and the last answer are kept; the client is built for the probe and dropped after it. A
//! kept client (its TLS configuration with the CA, the client key and a session ticket, its
//! connection pool and its request buffer task) cost about 17 KiB per vCluster, 17 MiB at a
//! thousand, to save one TLS handshake per vCluster per poll. The instance's going drops its
//! entry ([`VClusters::forget`]).

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

/// The SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

/// What is kept per vCluster: the kubeconfig probed, when the last probe started and what it
/// found.
struct Entry {
    kubeconfig: Digest,
    probed: (Instant, bool),
}

/// The vClusters' last probes, by host namespace.
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
        let wanted = digest(kubeconfig.as_bytes());
        if let Ok(entries) = self.entries.lock()
            && let Some(e) = entries.get(host_ns)
            && e.kubeconfig == wanted
            && e.probed.0.elapsed() < every
        {
            return e.probed.1;
        }
        self.builds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        let serves = match build(kubeconfig).await {
            Some(client) => {
                self.probes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                matches!(
                    tokio::time::timeout(timeout, client.apiserver_version()).await,
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
                    probed: (started, serves),
                },
            );
        }
        serves
    }

    /// Drops what is kept of the vCluster in `host_ns` (its instance is gone).
    pub fn forget(&self, host_ns: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(host_ns);
        }
    }

    /// How many vClusters have a probe kept.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    /// Whether no probe is kept.
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

/// A client of the API `kubeconfig` names, for one probe: kube's TLS (its server name, CA and
/// client identity) and authentication, with no session cache and no idle connection kept.
async fn build(kubeconfig: &str) -> Option<kube::Client> {
    let parsed = Kubeconfig::from_yaml(kubeconfig).ok()?;
    let config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .ok()?;
    let mut tls = config.rustls_client_config().ok()?;
    // The client is dropped after one request: a session cache (sized for 256 servers by
    // default) would never be used.
    tls.resumption = rustls::client::Resumption::disabled();
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
