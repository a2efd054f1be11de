//! Whether each vCluster's API serves, probed on the target-poll cadence.
//!
//! The probe (`GET /version` through the kubeconfig the vCluster exported) runs at most once per
//! `--target-poll` per vCluster while that kubeconfig stays the same (by SHA-256): reconciles in
//! between reuse its answer, and a changed kubeconfig is parsed and probed at once.
//!
//! Each kubeconfig is parsed once (not once per probe): what is kept per vCluster is its digest,
//! the last answer and a small parsed form (the address, the server name, and the TLS
//! configuration kube builds from the kubeconfig, with the exported CA as the only root and the
//! client certificate as the identity) and the latest TLS session its server issued
//! ([`OneSession`]). A probe is one TCP connection, one TLS
//! handshake and one HTTP/1.1 request on it, closed after the answer: no connection and no
//! `kube::Client` are kept (a kept client cost about 17 KiB per vCluster). The server's
//! certificate is checked against the exported CA and the kubeconfig's server name (or
//! `tls-server-name`) as kube checks it, and the client certificate is presented. The TLS
//! configuration keeps one vCluster's TLS 1.3 session tickets, so the probes after the first
//! resume the session (the server proved its certificate and saw the client's in the handshake
//! that issued the ticket) instead of verifying and signing again; a server that declines the
//! ticket gets a full handshake.
//!
//! A kubeconfig the light probe cannot honour exactly (authentication other than the client
//! certificate: a token, exec, an auth provider; a proxy; extra headers; plain HTTP) is probed
//! as before, through a `kube::Client` built for the probe and dropped after it. The instance's
//! going drops its entry ([`VClusters::forget`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::pki_types::ServerName;
use tower::ServiceBuilder;

use super::kubeconfig::KubeconfigRefused;

/// The SHA-256 of a kubeconfig.
pub type Digest = [u8; 32];

/// A kubeconfig a vCluster exported, with its SHA-256 computed once, when it is read (from a
/// watch event or the API server): every reconcile after that shares it (an `Arc`) and finds its
/// vCluster's entry by the digest, instead of copying about 6 KB out of the cache and hashing it
/// again at each step.
pub struct Exported {
    text: String,
    digest: Digest,
}

impl Exported {
    /// `text` with its digest.
    pub fn new(text: String) -> Self {
        let digest = digest(text.as_bytes());
        Self { text, digest }
    }

    /// The kubeconfig.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Its SHA-256.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }
}

/// The largest `/version` answer read.
const VERSION_LIMIT: usize = 64 * 1024;

/// The SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

/// An exported kubeconfig, parsed once.
#[derive(Clone)]
enum Parsed {
    /// Probed by the light probe.
    Light(Arc<Target>),
    /// Needs what only a `kube::Client` does (see the module header): probed through one.
    Kube,
    /// Not a kubeconfig a client can use: never serves.
    Unusable,
}

/// What the light probe needs of a kubeconfig.
struct Target {
    /// Host and port to connect to (an IPv6 literal without brackets).
    host: String,
    port: u16,
    /// The `Host` header: the server URL's authority.
    authority: String,
    /// The server URL's path with `/version` after it.
    path: String,
    /// The name the server's certificate must have.
    server_name: ServerName<'static>,
    /// kube's TLS configuration for the kubeconfig, with a session store of its own.
    tls: Arc<rustls::ClientConfig>,
    connect_timeout: Option<Duration>,
}

/// What is kept per vCluster, all of it derived from one exported kubeconfig (by its digest):
/// what vetting it found, its server, its parsed form, when the last probe started and what it
/// found. Each part is filled when first asked, and a changed kubeconfig starts afresh.
struct Entry {
    kubeconfig: Digest,
    vetted: Option<Result<(), KubeconfigRefused>>,
    server: Option<Option<String>>,
    probe: Option<Probed>,
}

/// The parsed form of a kubeconfig and its last probe: when it started and what it found.
struct Probed {
    parsed: Parsed,
    started: Instant,
    serves: bool,
}

/// The vClusters' last probes, by host namespace.
pub struct VClusters {
    entries: Mutex<HashMap<String, Entry>>,
    /// The applied-hash each host namespace should carry, by host namespace, with the UID of
    /// the instance it was computed for (see [`VClusters::namespace_hash`]).
    namespace_hashes: Mutex<HashMap<String, (String, String)>>,
    /// The probes by how they went: the one count of them (the metric
    /// `platform_operator_controller_vcluster_probes_total`, read by tests and benchmarks too).
    outcomes: prometheus::IntCounterVec,
}

impl VClusters {
    /// Probes counted by outcome in `outcomes` (label `handshake`: `resumed`, `full`, `client`,
    /// `failed`).
    pub fn counted(outcomes: prometheus::IntCounterVec) -> Self {
        Self {
            entries: Mutex::default(),
            namespace_hashes: Mutex::default(),
            outcomes,
        }
    }

    fn count(&self, outcome: &str) {
        self.outcomes.with_label_values(&[outcome]).inc();
    }

    /// What `read` finds in the entry of `host_ns` when that entry is for kubeconfig `wanted`.
    fn known<T>(
        &self,
        host_ns: &str,
        wanted: &Digest,
        read: impl FnOnce(&Entry) -> Option<T>,
    ) -> Option<T> {
        let entries = self.entries.lock().ok()?;
        entries
            .get(host_ns)
            .filter(|e| e.kubeconfig == *wanted)
            .and_then(read)
    }

    /// Writes into the entry of `host_ns` for kubeconfig `wanted` (a new entry when there was
    /// none or it was for another kubeconfig).
    fn keep(&self, host_ns: &str, wanted: Digest, write: impl FnOnce(&mut Entry)) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let fresh = || Entry {
            kubeconfig: wanted,
            vetted: None,
            server: None,
            probe: None,
        };
        let entry = entries.entry(host_ns.to_string()).or_insert_with(fresh);
        if entry.kubeconfig != wanted {
            *entry = fresh();
        }
        write(entry);
    }

    /// [`super::kubeconfig::vet`] of the kubeconfig the vCluster in `host_ns` exported, done
    /// once per kubeconfig (a YAML parse per reconcile was a good part of an idle resync's CPU).
    pub fn vet(&self, host_ns: &str, kubeconfig: &Exported) -> Result<(), KubeconfigRefused> {
        let wanted = kubeconfig.digest;
        if let Some(vetted) = self.known(host_ns, &wanted, |e| e.vetted.clone()) {
            return vetted;
        }
        let vetted = super::kubeconfig::vet(kubeconfig.text());
        self.keep(host_ns, wanted, |e| e.vetted = Some(vetted.clone()));
        vetted
    }

    /// The server of the current context of the kubeconfig the vCluster in `host_ns` exported
    /// ([`crate::installer::config::kubeconfig_server`]), read once per kubeconfig.
    pub fn server(&self, host_ns: &str, kubeconfig: &Exported) -> Option<String> {
        let wanted = kubeconfig.digest;
        if let Some(server) = self.known(host_ns, &wanted, |e| e.server.clone()) {
            return server;
        }
        let server = crate::installer::config::kubeconfig_server(kubeconfig.text());
        self.keep(host_ns, wanted, |e| e.server = Some(server.clone()));
        server
    }

    /// Whether the vCluster in `host_ns` serves its API through `kubeconfig` within `timeout`,
    /// asking it at most once per `every`.
    pub async fn serves(
        &self,
        host_ns: &str,
        kubeconfig: &Exported,
        timeout: Duration,
        every: Duration,
    ) -> bool {
        let wanted = kubeconfig.digest;
        let known = self.known(host_ns, &wanted, |e| {
            let p = e.probe.as_ref()?;
            Some(if p.started.elapsed() < every {
                Err(p.serves)
            } else {
                Ok(p.parsed.clone())
            })
        });
        let parsed = match known {
            Some(Err(answer)) => return answer,
            Some(Ok(parsed)) => parsed,
            None => parse(kubeconfig.text()).await,
        };
        let started = Instant::now();
        let serves = match &parsed {
            Parsed::Light(target) => match tokio::time::timeout(timeout, target.probe()).await {
                Ok(Some(true)) => {
                    self.count("resumed");
                    true
                }
                Ok(Some(false)) => {
                    self.count("full");
                    true
                }
                _ => {
                    self.count("failed");
                    false
                }
            },
            Parsed::Kube => match kube_client(kubeconfig.text()).await {
                Some(client) => {
                    let serves = matches!(
                        tokio::time::timeout(timeout, client.apiserver_version()).await,
                        Ok(Ok(_))
                    );
                    self.count(if serves { "client" } else { "failed" });
                    serves
                }
                None => false,
            },
            Parsed::Unusable => false,
        };
        self.keep(host_ns, wanted, |e| {
            e.probe = Some(Probed {
                parsed,
                started,
                serves,
            })
        });
        serves
    }

    /// The applied-hash the host namespace `host_ns` of instance `uid` should carry:
    /// `compute`'s answer, computed once per host namespace and instance UID (it depends on
    /// nothing else that can change while the controller runs: the instance's key, its UID and
    /// the controller's settings), instead of building, serialising and hashing the namespace
    /// and its NetworkPolicy at every reconcile.
    pub fn namespace_hash(
        &self,
        host_ns: &str,
        uid: &str,
        compute: impl FnOnce() -> String,
    ) -> String {
        if let Ok(hashes) = self.namespace_hashes.lock()
            && let Some((for_uid, hash)) = hashes.get(host_ns)
            && for_uid == uid
        {
            return hash.clone();
        }
        let hash = compute();
        if let Ok(mut hashes) = self.namespace_hashes.lock() {
            hashes.insert(host_ns.to_string(), (uid.to_string(), hash.clone()));
        }
        hash
    }

    /// Drops what is kept of the vCluster in `host_ns` (its instance is gone).
    pub fn forget(&self, host_ns: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(host_ns);
        }
        if let Ok(mut hashes) = self.namespace_hashes.lock() {
            hashes.remove(host_ns);
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

    /// The parsed form kept for the vCluster in `host_ns`: the same `Arc` as long as its
    /// kubeconfig was parsed once.
    #[cfg(test)]
    fn target(&self, host_ns: &str) -> Option<Arc<Target>> {
        let entries = self.entries.lock().ok()?;
        match &entries.get(host_ns)?.probe.as_ref()?.parsed {
            Parsed::Light(target) => Some(target.clone()),
            Parsed::Kube | Parsed::Unusable => None,
        }
    }
}

/// Parses `kubeconfig` into what its probes need, as kube reads it.
async fn parse(kubeconfig: &str) -> Parsed {
    let Ok(parsed) = Kubeconfig::from_yaml(kubeconfig) else {
        return Parsed::Unusable;
    };
    let Ok(config) =
        kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default()).await
    else {
        return Parsed::Unusable;
    };
    match Target::from_config(&config) {
        Ok(Some(target)) => Parsed::Light(Arc::new(target)),
        Ok(None) => Parsed::Kube,
        Err(()) => Parsed::Unusable,
    }
}

impl Target {
    /// The light probe's form of `config`: `Ok(None)` when it needs a `kube::Client`, `Err` when
    /// no client could use it.
    fn from_config(config: &kube::Config) -> Result<Option<Self>, ()> {
        let plain_https = config.cluster_url.scheme_str() == Some("https");
        let client_certificate_only = matches!(config.auth_layer(), Ok(None));
        if !plain_https
            || !client_certificate_only
            || config.proxy_url.is_some()
            || !config.headers.is_empty()
        {
            return Ok(None);
        }
        let mut tls = config.rustls_client_config().map_err(|_| ())?;
        // The latest session of this one server, so the next probe resumes.
        tls.resumption = rustls::client::Resumption::store(Arc::new(OneSession::default()));
        let url = &config.cluster_url;
        let authority = url.authority().ok_or(())?.to_string();
        let host = url
            .host()
            .ok_or(())?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url.port_u16().unwrap_or(443);
        let name = config.tls_server_name.as_deref().unwrap_or(&host);
        let server_name = ServerName::try_from(name.to_string()).map_err(|_| ())?;
        Ok(Some(Self {
            path: format!("{}/version", url.path().trim_end_matches('/')),
            host,
            port,
            authority,
            server_name,
            tls: Arc::new(tls),
            connect_timeout: config.connect_timeout,
        }))
    }

    /// One `GET /version` on a new connection: `Some(resumed)` when the server answered 200 with
    /// a version, `resumed` telling whether the TLS session was resumed.
    async fn probe(&self) -> Option<bool> {
        let connect = tokio::net::TcpStream::connect((self.host.as_str(), self.port));
        let tcp = match self.connect_timeout {
            Some(limit) => tokio::time::timeout(limit, connect).await.ok()?,
            None => connect.await,
        }
        .ok()?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .ok()?;
        let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tls))
                .await
                .ok()?;
        let request = hyper::Request::get(self.path.as_str())
            .header(hyper::header::HOST, self.authority.as_str())
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::new())
            .ok()?;
        let exchange = async {
            let response = sender.send_request(request).await.ok()?;
            if response.status() != hyper::StatusCode::OK {
                return None;
            }
            let body = Limited::new(response.into_body(), VERSION_LIMIT)
                .collect()
                .await
                .ok()?
                .to_bytes();
            // What kube's `apiserver_version` reads: an object with a `gitVersion` (a string);
            // only that field is read, not the whole object as a `Value`.
            serde_json::from_slice::<Version<'_>>(&body).ok()?;
            Some(resumed)
        };
        tokio::pin!(connection);
        tokio::select! {
            answer = exchange => answer,
            // The connection ended before the answer.
            _ = &mut connection => None,
        }
    }
}

/// The session store of one vCluster's probes: the latest TLS 1.3 ticket (or TLS 1.2 session)
/// its server issued and the key-exchange group it chose, for the one server name its
/// configuration talks to. Each probe takes the ticket and the handshake that uses it leaves a
/// new one. rustls's in-memory cache, even sized for one server, allocated about 0.9 KB of maps
/// per vCluster and kept up to eight tickets, each with the server's certificate chain (heap
/// profile of a 200-instance run, docs/benchmarks.md).
#[derive(Debug, Default)]
struct OneSession(Mutex<Session>);

#[derive(Debug, Default)]
struct Session {
    group: Option<rustls::NamedGroup>,
    tls13: Option<rustls::client::Tls13ClientSessionValue>,
    tls12: Option<rustls::client::Tls12ClientSessionValue>,
}

impl OneSession {
    fn with<T>(&self, f: impl FnOnce(&mut Session) -> T) -> Option<T> {
        self.0.lock().ok().map(|mut s| f(&mut s))
    }
}

impl rustls::client::ClientSessionStore for OneSession {
    fn set_kx_hint(&self, _: ServerName<'static>, group: rustls::NamedGroup) {
        self.with(|s| s.group = Some(group));
    }

    fn kx_hint(&self, _: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.with(|s| s.group).flatten()
    }

    fn set_tls12_session(
        &self,
        _: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.with(|s| s.tls12 = Some(value));
    }

    fn tls12_session(&self, _: &ServerName<'_>) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.with(|s| s.tls12.clone()).flatten()
    }

    fn remove_tls12_session(&self, _: &ServerName<'static>) {
        self.with(|s| s.tls12 = None);
    }

    fn insert_tls13_ticket(
        &self,
        _: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.with(|s| s.tls13 = Some(value));
    }

    fn take_tls13_ticket(
        &self,
        _: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.with(|s| s.tls13.take()).flatten()
    }
}

/// What the probe reads of a `/version` answer: that it is an object with a `gitVersion` string.
#[derive(serde::Deserialize)]
struct Version<'a> {
    #[serde(rename = "gitVersion", borrow)]
    _git_version: std::borrow::Cow<'a, str>,
}

/// A client of the API `kubeconfig` names, for one probe: kube's TLS (its server name, CA and
/// client identity) and authentication, with no session cache and no idle connection kept.
async fn kube_client(kubeconfig: &str) -> Option<kube::Client> {
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
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// The probes' counter, as the controller registers it, and a `VClusters` counting into it.
    fn counted() -> (VClusters, prometheus::IntCounterVec) {
        let outcomes = prometheus::IntCounterVec::new(
            prometheus::Opts::new("probes", "probes"),
            &["handshake"],
        )
        .expect("counter");
        (VClusters::counted(outcomes.clone()), outcomes)
    }

    /// `text` as a vCluster's exported kubeconfig.
    fn x(text: &str) -> Exported {
        Exported::new(text.to_string())
    }

    /// The probes counted, by outcome: resumed, full, client, failed.
    fn outcomes(counter: &prometheus::IntCounterVec) -> [u64; 4] {
        ["resumed", "full", "client", "failed"].map(|o| counter.with_label_values(&[o]).get())
    }

    #[tokio::test]
    async fn an_unusable_kubeconfig_does_not_serve_and_is_probed_once_per_poll() {
        let (v, counter) = counted();
        let every = Duration::from_secs(60);
        assert!(
            !v.serves("h", &x("not: [a kubeconfig"), Duration::from_secs(1), every)
                .await
        );
        assert_eq!(outcomes(&counter), [0; 4], "nothing to probe");
        assert!(
            !v.serves("h", &x("not: [a kubeconfig"), Duration::from_secs(1), every)
                .await
        );
        assert_eq!(v.len(), 1, "the answer is kept");
        assert!(
            !v.serves("h", &x("other: [x"), Duration::from_secs(1), every)
                .await
        );
        assert_eq!(outcomes(&counter), [0; 4]);
        assert_eq!(v.len(), 1, "another kubeconfig replaces the entry");
        v.forget("h");
        assert!(v.is_empty());
    }

    #[test]
    fn the_namespace_hash_is_computed_once_per_host_namespace_and_uid() {
        let (v, _) = counted();
        let computed = std::cell::Cell::new(0);
        let compute = |hash: &str| {
            computed.set(computed.get() + 1);
            hash.to_string()
        };
        assert_eq!(v.namespace_hash("h", "uid-1", || compute("a")), "a");
        assert_eq!(v.namespace_hash("h", "uid-1", || compute("b")), "a", "kept");
        assert_eq!(computed.get(), 1);
        // Another instance (a new UID) under the same host namespace: computed for it.
        assert_eq!(v.namespace_hash("h", "uid-2", || compute("c")), "c");
        assert_eq!(v.namespace_hash("other", "uid-1", || compute("d")), "d");
        assert_eq!(computed.get(), 3);
        // The instance went: computed again.
        v.forget("h");
        assert_eq!(v.namespace_hash("h", "uid-2", || compute("e")), "e");
        assert_eq!(computed.get(), 4);
    }

    #[test]
    fn vetting_and_the_server_are_kept_per_kubeconfig() {
        let (v, _) = counted();
        let good = "apiVersion: v1\nkind: Config\nclusters:\n- name: vc\n  cluster: {server: \"https://10.0.0.1:443\"}\ncontexts:\n- name: vc\n  context: {cluster: vc, user: u}\nusers:\n- name: u\n  user: {token: t}\ncurrent-context: vc\n";
        let exec = good.replace("{token: t}", "{exec: {command: sh}}");
        for _ in 0..2 {
            assert_eq!(v.vet("h", &x(good)), Ok(()));
            assert_eq!(
                v.server("h", &x(good)).as_deref(),
                Some("https://10.0.0.1:443")
            );
        }
        // Another kubeconfig of the same vCluster is vetted afresh, and its answers kept.
        for _ in 0..2 {
            let refused = v.vet("h", &x(&exec)).expect_err("exec is refused");
            assert!(refused.to_string().contains("exec"), "{refused}");
        }
        assert_eq!(v.len(), 1);
        // And back: accepted again.
        assert_eq!(v.vet("h", &x(good)), Ok(()));
        assert_eq!(v.server("other", &x("not: [yaml")), None);
        assert_eq!(v.len(), 2);
    }

    use base64::Engine as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    /// STAND-IN for a vCluster's API server (the real one cannot run here; the controller's
    /// end-to-end tests probe a real kube-apiserver): TLS with a serving certificate for
    /// `vcluster.team` issued by `pki`'s CA, a client certificate of that CA required (as the
    /// API server requires one or a token), TLS 1.3 session tickets issued as Go's server does,
    /// and `GET /version` answered with a version object. Returns its port and a count of the
    /// requests that reached HTTP.
    async fn api_server(pki: &e2e::pki::Pki) -> (u16, Arc<AtomicU64>) {
        let certs = |pem: &str| {
            CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("certificates")
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in certs(&pki.ca_cert) {
            roots.add(ca).expect("CA");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let mut config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                certs(&pki.serving_cert),
                PrivateKeyDer::from_pem_slice(pki.serving_key.as_bytes()).expect("key"),
            )
            .expect("server config");
        config.ticketer = rustls::crypto::ring::Ticketer::new().expect("ticketer");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let requests = Arc::new(AtomicU64::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        counted.fetch_add(1, Ordering::Relaxed);
                        let (status, body) = if request.uri().path() == "/version" {
                            (200, r#"{"major":"1","minor":"35","gitVersion":"v1.35.0"}"#)
                        } else {
                            (404, "{}")
                        };
                        async move {
                            hyper::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(Bytes::from(body)))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        (port, requests)
    }

    /// A kubeconfig for the stand-in at `port`, as vCluster exports it (server on loopback,
    /// `tls-server-name` the name asked for), with `pki`'s CA and admin certificate.
    fn kubeconfig(port: u16, pki: &e2e::pki::Pki, server_name: &str, identity: bool) -> Exported {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let user = if identity {
            format!(
                "{{client-certificate-data: {}, client-key-data: {}}}",
                b64(&pki.admin_cert),
                b64(&pki.admin_key)
            )
        } else {
            "{}".to_string()
        };
        x(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: vc\n  cluster: {{server: \"https://127.0.0.1:{port}\", certificate-authority-data: {}, tls-server-name: {server_name}}}\nusers:\n- name: admin\n  user: {user}\ncontexts:\n- name: vc\n  context: {{cluster: vc, user: admin}}\ncurrent-context: vc\n",
            b64(&pki.ca_cert)
        ))
    }

    #[tokio::test]
    async fn the_light_probe_checks_the_server_presents_the_client_and_resumes() {
        let pki = e2e::pki::Pki::issue_for(&["vcluster.team"]).expect("pki");
        let (port, requests) = api_server(&pki).await;
        let (v, counter) = counted();
        let (limit, every) = (Duration::from_secs(5), Duration::ZERO);
        let good = kubeconfig(port, &pki, "vcluster.team", true);
        assert!(v.serves("h", &good, limit, every).await, "the first probe");
        let parsed = v.target("h").expect("a light probe target");
        assert!(v.serves("h", &good, limit, every).await, "the second probe");
        assert!(v.serves("h", &good, limit, every).await, "the third probe");
        assert!(
            Arc::ptr_eq(&parsed, &v.target("h").expect("target")),
            "parsed once"
        );
        assert_eq!(
            outcomes(&counter),
            [2, 1, 0, 0],
            "one full handshake, then the probes resume"
        );
        assert_eq!(requests.load(Ordering::Relaxed), 3);
        // Within the poll the answer is reused: no new connection.
        assert!(v.serves("h", &good, limit, Duration::from_secs(60)).await);
        assert_eq!(requests.load(Ordering::Relaxed), 3);

        // A server name the certificate does not have: the handshake fails, nothing is asked.
        let wrong_name = kubeconfig(port, &pki, "vcluster.other", true);
        assert!(!v.serves("h", &wrong_name, limit, every).await);
        // Another CA: the server's certificate is not trusted.
        let other = e2e::pki::Pki::issue_for(&["vcluster.team"]).expect("pki");
        let wrong_ca = kubeconfig(port, &other, "vcluster.team", true);
        assert!(!v.serves("h", &wrong_ca, limit, every).await);
        // No client certificate: the server refuses the handshake.
        let anonymous = kubeconfig(port, &pki, "vcluster.team", false);
        assert!(!v.serves("h", &anonymous, limit, every).await);
        assert_eq!(
            requests.load(Ordering::Relaxed),
            3,
            "none of them reached HTTP"
        );
        // Nothing listening: no answer.
        let closed = kubeconfig(1, &pki, "vcluster.team", true);
        assert!(!v.serves("h", &closed, limit, every).await);
        // The first kubeconfig again: parsed again (its entry was replaced), and it serves.
        assert!(v.serves("h", &good, limit, every).await);
        assert!(
            !Arc::ptr_eq(&parsed, &v.target("h").expect("target")),
            "parsed again"
        );
        let [_, _, client, failed] = outcomes(&counter);
        assert_eq!((client, failed), (0, 4));
    }
}
