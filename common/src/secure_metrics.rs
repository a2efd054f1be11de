//! Secure metrics, the kubebuilder way: the operations port served over HTTPS, and `/metrics`
//! answered only to callers the API server authenticates (a `TokenReview` of their bearer token)
//! and authorizes for `get` on the non-resource URL `/metrics` (a `SubjectAccessReview`). Both
//! answers are cached for a short while per token. `/healthz` and `/readyz` stay open, for the
//! kubelet's probes. `--metrics-secure=false` serves the port over plain HTTP with `/metrics`
//! open to every caller.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::http::{HttpError, OpsServer};
use crate::server::{Limits, Tls};

/// The path that needs authentication and authorization.
pub const METRICS_PATH: &str = "/metrics";
/// The certificate file in `--metrics-cert-dir` (the key of a `kubernetes.io/tls` Secret).
pub const CERT_FILE: &str = "tls.crt";
/// The private key file in `--metrics-cert-dir`.
pub const KEY_FILE: &str = "tls.key";
/// Tokens whose answers are remembered at once.
const CACHE_ENTRIES: usize = 1024;
/// How often a mounted certificate is looked at for a change.
const RELOAD_EVERY: Duration = Duration::from_secs(30);

/// Flags shared by every binary for securing the operations port.
#[derive(Clone, Debug, clap::Args)]
pub struct SecureMetricsArgs {
    /// Serve the operations port over HTTPS and answer /metrics only to callers the API server
    /// authenticates (TokenReview) and authorizes for get on the non-resource URL /metrics
    /// (SubjectAccessReview). false: plain HTTP, /metrics open to every caller.
    #[arg(long, env = "METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_secure: bool,

    /// Folder holding tls.crt and tls.key (a mounted kubernetes.io/tls Secret) for the secure
    /// operations port; re-read when they change. Unset: a self-issued certificate made at start.
    #[arg(long, env = "METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<PathBuf>,

    /// How long the authentication and authorization answers for one token are reused.
    #[arg(long, env = "METRICS_AUTH_CACHE_TTL", default_value = "30s", value_parser = crate::duration::parse)]
    pub metrics_auth_cache_ttl: Duration,
}

/// Error from setting up or serving the secure operations port.
#[derive(Debug, thiserror::Error)]
pub enum SecureMetricsError {
    /// A file in `--metrics-cert-dir` could not be read.
    #[error(
        "reading {path} failed ({source}); mount a kubernetes.io/tls Secret at --metrics-cert-dir or leave the flag out for a self-issued certificate"
    )]
    ReadCertificate {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate or key is not usable PEM.
    #[error(
        "{path} is not a usable PEM certificate and key ({reason}); check the Secret's tls.crt and tls.key"
    )]
    ParseCertificate {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Issuing the self-issued certificate failed.
    #[error(
        "issuing a self-issued certificate failed ({0}); set --metrics-cert-dir to a mounted certificate"
    )]
    SelfIssue(String),
    /// The TLS configuration was refused.
    #[error("building the TLS configuration failed: {0}")]
    Tls(#[from] rustls::Error),
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] HttpError),
}

/// Who the API server says the caller is, and whether they may read `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated and authorized.
    Allowed,
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated,
    /// Authenticated but not allowed `get` on `/metrics`: 403.
    Forbidden,
}

/// Asks the API server about bearer tokens, remembering each answer for `ttl`.
pub struct Guard {
    client: kube::Client,
    ttl: Duration,
    cache: Mutex<HashMap<[u8; 32], (Verdict, Instant)>>,
}

/// Error from asking the API server about a caller.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The TokenReview could not be made.
    #[error(
        "TokenReview failed ({0}); grant the operator's ServiceAccount create on tokenreviews.authentication.k8s.io"
    )]
    TokenReview(kube::Error),
    /// The SubjectAccessReview could not be made.
    #[error(
        "SubjectAccessReview failed ({0}); grant the operator's ServiceAccount create on subjectaccessreviews.authorization.k8s.io"
    )]
    SubjectAccessReview(kube::Error),
}

impl Guard {
    /// A guard asking through `client`, caching answers for `ttl`.
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict on `token`, from the cache or from the API server.
    pub async fn check(&self, token: &str) -> Result<Verdict, ReviewError> {
        let key = token_key(token);
        if let Some(verdict) = self.cached(&key) {
            return Ok(verdict);
        }
        let verdict = match self.authenticate(token).await? {
            None => Verdict::Unauthenticated,
            Some(user) => {
                if self.authorize(user).await? {
                    Verdict::Allowed
                } else {
                    Verdict::Forbidden
                }
            }
        };
        self.remember(key, verdict);
        Ok(verdict)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Verdict> {
        let cache = self.cache.lock().ok()?;
        cache
            .get(key)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(v, _)| *v)
    }

    fn remember(&self, key: [u8; 32], verdict: Verdict) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        if cache.len() >= CACHE_ENTRIES {
            let ttl = self.ttl;
            cache.retain(|_, (_, at)| at.elapsed() < ttl);
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(key, (verdict, Instant::now()));
    }

    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::TokenReview)?;
        Ok(answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user))
    }

    async fn authorize(&self, user: UserInfo) -> Result<bool, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_string()),
                    verb: Some("get".to_string()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::SubjectAccessReview)?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// The cache key of a token: its SHA-256, so the cache holds no token.
fn token_key(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// The bearer token of an `Authorization` header value, if it is one.
pub fn bearer(value: Option<&HeaderValue>) -> Option<&str> {
    let value = value?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn refuse(status: StatusCode, message: &'static str) -> Response {
    let mut response = (status, message).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// Middleware: `/metrics` only for allowed callers; every other path passes.
async fn guard_metrics(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    if request.uri().path() != METRICS_PATH {
        return next.run(request).await;
    }
    let Some(token) = bearer(request.headers().get(header::AUTHORIZATION)) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "a bearer token is required for /metrics\n",
        );
    };
    match guard.check(token).await {
        Ok(Verdict::Allowed) => next.run(request).await,
        Ok(Verdict::Unauthenticated) => refuse(
            StatusCode::UNAUTHORIZED,
            "the API server did not accept the bearer token\n",
        ),
        Ok(Verdict::Forbidden) => refuse(
            StatusCode::FORBIDDEN,
            "not allowed get on /metrics: bind the ClusterRole platform-operator-metrics-reader\n",
        ),
        Err(e) => {
            tracing::warn!(error = %e, "checking a /metrics caller failed");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the caller could not be checked with the API server\n",
            )
        }
    }
}

/// `router` with `/metrics` guarded by `guard`.
pub fn protect(router: Router, guard: Arc<Guard>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(guard, guard_metrics))
}

/// The serving certificate, swapped in place when a mounted one changes.
#[derive(Debug)]
struct Certificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    path: &Path,
) -> Result<CertifiedKey, SecureMetricsError> {
    let parse = |reason: String| SecureMetricsError::ParseCertificate {
        path: path.to_path_buf(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| parse(e.to_string()))?;
    if chain.is_empty() {
        return Err(parse("no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| parse(e.to_string()))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| parse(e.to_string()))
}

fn read(path: &Path) -> Result<Vec<u8>, SecureMetricsError> {
    std::fs::read(path).map_err(|source| SecureMetricsError::ReadCertificate {
        path: path.to_path_buf(),
        source,
    })
}

/// The certificate and key files of `dir`, read.
fn read_dir_pair(dir: &Path) -> Result<(Vec<u8>, Vec<u8>), SecureMetricsError> {
    Ok((read(&dir.join(CERT_FILE))?, read(&dir.join(KEY_FILE))?))
}

/// A certificate for the names this process answers to, signed by its own key, valid for a year.
fn self_issued() -> Result<CertifiedKey, SecureMetricsError> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if let Ok(host) = std::env::var("HOSTNAME")
        && !host.is_empty()
    {
        names.push(host);
    }
    let issue = |e: rcgen::Error| SecureMetricsError::SelfIssue(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(issue)?;
    let mut params = rcgen::CertificateParams::new(names).map_err(issue)?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(365);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "platform-operator metrics");
    let cert = params.self_signed(&key).map_err(issue)?;
    certified_key(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        Path::new("<self-issued>"),
    )
}

/// Re-reads the mounted pair every `every` and swaps it in when it changed and parses.
async fn reload(
    certificate: Arc<Certificate>,
    dir: PathBuf,
    mut last: (Vec<u8>, Vec<u8>),
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let pair = match read_dir_pair(&dir) {
            Ok(pair) if pair != last => pair,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "re-reading the metrics certificate failed; keeping the current one");
                continue;
            }
        };
        match certified_key(&pair.0, &pair.1, &dir) {
            Ok(key) => {
                if let Ok(mut current) = certificate.current.write() {
                    *current = Arc::new(key);
                }
                tracing::info!(dir = %dir.display(), "loaded the changed metrics certificate");
                last = pair;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the changed metrics certificate is not usable; keeping the current one")
            }
        }
    }
}

/// A mounted certificate to watch: the resolver that serves it, its folder, the files as read.
struct Mounted {
    certificate: Arc<Certificate>,
    dir: PathBuf,
    pair: (Vec<u8>, Vec<u8>),
}

/// What the secure port needs: the TLS configuration and the guard of `/metrics`.
pub struct Secure {
    tls: Arc<rustls::ServerConfig>,
    guard: Arc<Guard>,
    mounted: Option<Mounted>,
}

impl Secure {
    /// The secure setup `args` ask for (`None` for plain HTTP); a mounted certificate is read
    /// now, so that a bad one stops the binary at start.
    pub fn from_args(
        args: &SecureMetricsArgs,
        client: kube::Client,
    ) -> Result<Option<Self>, SecureMetricsError> {
        if !args.metrics_secure {
            return Ok(None);
        }
        let (key, reload) = match &args.metrics_cert_dir {
            Some(dir) => {
                let pair = read_dir_pair(dir)?;
                (
                    certified_key(&pair.0, &pair.1, dir)?,
                    Some((dir.clone(), pair)),
                )
            }
            None => (self_issued()?, None),
        };
        let certificate = Arc::new(Certificate {
            current: RwLock::new(Arc::new(key)),
        });
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(certificate.clone());
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(Self {
            tls: Arc::new(tls),
            guard: Arc::new(Guard::new(client, args.metrics_auth_cache_ttl)),
            mounted: reload.map(|(dir, pair)| Mounted {
                certificate,
                dir,
                pair,
            }),
        }))
    }
}

/// Serves `router` on `server` with the timeouts and limits of `limits` (see [`crate::server`])
/// until `shutdown` completes: over HTTPS with `/metrics` guarded when `secure` is given, else
/// over plain HTTP.
pub async fn serve(
    server: OpsServer,
    router: Router,
    secure: Option<Secure>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), SecureMetricsError> {
    let Some(secure) = secure else {
        return Ok(server.serve_with(router, limits, shutdown).await?);
    };
    let reloader = secure
        .mounted
        .map(|m| tokio::spawn(reload(m.certificate, m.dir, m.pair, RELOAD_EVERY)));
    crate::server::serve(
        server.into_listener(),
        Tls::new(secure.tls, None),
        protect(router, secure.guard),
        limits,
        shutdown,
    )
    .await;
    if let Some(task) = reloader {
        task.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of an API server that is not there (a closed loopback port): the guard must
    /// answer without it where it can, and say 503 where it cannot.
    fn unreachable_client() -> kube::Client {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("http://127.0.0.1:{port}").parse().expect("url");
        kube::Client::try_from(kube::Config::new(url)).expect("client")
    }

    async fn call(router: Router, path: &str, auth: Option<&str>) -> (StatusCode, Option<String>) {
        use tower::ServiceExt;
        let mut request = axum::http::Request::get(path);
        if let Some(auth) = auth {
            request = request.header(header::AUTHORIZATION, auth);
        }
        let response = router
            .oneshot(request.body(axum::body::Body::empty()).expect("request"))
            .await
            .expect("response");
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        (response.status(), challenge)
    }

    #[tokio::test]
    async fn metrics_need_a_bearer_token_and_an_answer_from_the_api_server() {
        let guard = Arc::new(Guard::new(unreachable_client(), Duration::from_secs(60)));
        let router = protect(
            crate::http::ops_router(prometheus::Registry::new(), Default::default()),
            guard.clone(),
        );
        // No token, or another scheme: 401 with a Bearer challenge, without asking anyone.
        for auth in [None, Some("Basic dXNlcjpwdw=="), Some("Bearer ")] {
            assert_eq!(
                call(router.clone(), "/metrics", auth).await,
                (StatusCode::UNAUTHORIZED, Some("Bearer".into())),
                "{auth:?}"
            );
        }
        // The probes' paths stay open.
        assert_eq!(
            call(router.clone(), "/healthz", None).await.0,
            StatusCode::OK
        );
        assert_eq!(
            call(router.clone(), "/readyz", None).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        // A token the API server cannot be asked about: 503, and nothing is cached.
        for _ in 0..2 {
            assert_eq!(
                call(router.clone(), "/metrics", Some("Bearer some-token"))
                    .await
                    .0,
                StatusCode::SERVICE_UNAVAILABLE
            );
            assert!(guard.cached(&token_key("some-token")).is_none());
        }
    }

    #[test]
    fn answers_are_cached_for_the_ttl_only() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _inside = runtime.enter();
        let guard = Guard::new(unreachable_client(), Duration::from_millis(200));
        let key = token_key("t");
        guard.remember(key, Verdict::Forbidden);
        assert_eq!(guard.cached(&key), Some(Verdict::Forbidden));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(guard.cached(&key), None);
        // A full cache drops expired answers first, and never grows past its bound.
        for i in 0..(CACHE_ENTRIES + 10) {
            guard.remember(token_key(&i.to_string()), Verdict::Allowed);
        }
        assert!(guard.cache.lock().expect("cache").len() <= CACHE_ENTRIES);
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let value = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(bearer(Some(&value("Bearer abc.def"))), Some("abc.def"));
        assert_eq!(bearer(Some(&value("bearer  abc "))), Some("abc"));
        assert_eq!(bearer(Some(&value("Basic dXNlcjpwdw=="))), None);
        assert_eq!(bearer(Some(&value("Bearer "))), None);
        assert_eq!(bearer(Some(&value("Bearer"))), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn the_cache_key_is_a_digest_not_the_token() {
        let key = token_key("secret-token");
        assert_ne!(&key[..12], b"secret-token");
        assert_eq!(key, token_key("secret-token"));
        assert_ne!(key, token_key("secret-token2"));
    }

    #[test]
    fn a_self_issued_certificate_is_usable_by_rustls() {
        let key = self_issued().expect("self-issued");
        assert_eq!(key.cert.len(), 1);
        assert!(key.keys_match().is_ok());
    }

    /// A self-signed pair as PEM files would hold it.
    fn pem_pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate");
        (cert.pem(), key.serialize_pem())
    }

    #[tokio::test]
    async fn a_changed_mounted_certificate_is_swapped_in_and_a_broken_one_is_not() {
        let dir =
            std::env::temp_dir().join(format!("secure-metrics-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let write = |(cert, key): &(String, String)| {
            std::fs::write(dir.join(CERT_FILE), cert).expect("write");
            std::fs::write(dir.join(KEY_FILE), key).expect("write");
        };
        let first = pem_pair("first.example");
        write(&first);
        let pair = read_dir_pair(&dir).expect("read");
        let certificate = Arc::new(Certificate {
            current: RwLock::new(Arc::new(
                certified_key(&pair.0, &pair.1, &dir).expect("parse"),
            )),
        });
        let served = || certificate.current.read().expect("lock").cert[0].to_vec();
        let der = |pem: &str| {
            CertificateDer::from_pem_slice(pem.as_bytes())
                .expect("pem")
                .to_vec()
        };
        assert_eq!(served(), der(&first.0));
        let task = tokio::spawn(reload(
            certificate.clone(),
            dir.clone(),
            pair,
            Duration::from_millis(50),
        ));
        let second = pem_pair("second.example");
        write(&second);
        let deadline = Instant::now() + Duration::from_secs(5);
        while served() != der(&second.0) {
            assert!(
                Instant::now() < deadline,
                "the new certificate was not loaded"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A broken pair (a key that does not match) is refused: the served one stays.
        std::fs::write(dir.join(KEY_FILE), pem_pair("third.example").1).expect("write");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(served(), der(&second.0));
        task.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_mounted_pair_must_parse() {
        let dir = std::env::temp_dir().join(format!("secure-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join(CERT_FILE), "not a certificate").expect("write");
        std::fs::write(dir.join(KEY_FILE), "not a key").expect("write");
        let (cert, key) = read_dir_pair(&dir).expect("read");
        let err = certified_key(&cert, &key, &dir).expect_err("garbage is refused");
        assert!(
            matches!(err, SecureMetricsError::ParseCertificate { .. }),
            "{err}"
        );
        std::fs::remove_file(dir.join(KEY_FILE)).expect("remove");
        let err = read_dir_pair(&dir).expect_err("a missing key is refused");
        assert!(err.to_string().contains(KEY_FILE), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
