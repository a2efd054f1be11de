//! Secure metrics, the kubebuilder way: the operations port served over HTTPS, and `/metrics`
//! answered only to callers the API server authenticates (a `TokenReview` of their bearer token)
//! and authorizes for `get` on the non-resource URL `/metrics` (a `SubjectAccessReview`). Both
//! answers are cached for a short while per token, the API server's refusals too (a negative
//! cache), each cache bounded; TokenReviews of tokens in neither cache are rate-limited, so that
//! a flood of made-up tokens costs the API server a bounded number of reviews and never pushes
//! an accepted token out. `/healthz` and `/readyz` stay open, for the kubelet's probes.
//! `--metrics-secure=false` serves the port over plain HTTP with `/metrics` open to every caller.

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
use prometheus::{IntCounterVec, Opts, Registry};
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
/// Tokens the API server accepted (allowed or forbidden) whose verdicts are remembered at once.
const ACCEPTED_ENTRIES: usize = 256;
/// Tokens the API server refused whose refusals are remembered at once (the negative cache).
const REFUSED_ENTRIES: usize = 1024;
/// TokenReviews of tokens in neither cache that may be made at once...
const REVIEW_BURST: f64 = 10.0;
/// ...and how many more each second adds back, up to the burst.
const REVIEWS_PER_SECOND: f64 = 1.0;
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
    /// The guard's metric could not be registered.
    #[error("registering the /metrics guard's metric failed: {0}")]
    Register(#[from] prometheus::Error),
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
    /// A token in neither cache while the TokenReview rate limit is spent: 429, nobody asked.
    Limited,
}

/// `platform_operator_metrics_auth_checks_total{answered_by}`: bearer tokens on `/metrics` by
/// what answered: `cache`, `api_server` (a TokenReview was made) or `rate_limit` (refused
/// without one).
pub fn auth_checks() -> IntCounterVec {
    IntCounterVec::new(
        Opts::new(
            "platform_operator_metrics_auth_checks_total",
            "Bearer tokens presented on /metrics, by what answered: cache, api_server or rate_limit.",
        ),
        &["answered_by"],
    )
    .expect("static metric definition is valid")
}

/// A verdict and when the API server gave it.
type Entry = (Verdict, Instant);

/// What the guard remembers.
struct Memory {
    /// Verdicts on tokens the API server authenticated (`Allowed`, `Forbidden`). Only tokens it
    /// accepts get in, so made-up tokens cannot push the real scraper's out; an entry past the
    /// TTL is reviewed again without waiting for the rate limit.
    accepted: HashMap<[u8; 32], Entry>,
    /// Tokens the API server refused, answered 401 again until the TTL passes.
    refused: HashMap<[u8; 32], Entry>,
    /// The TokenReviews tokens in neither cache may still cost now (a token bucket).
    allowance: f64,
    /// When `allowance` was last topped up.
    topped_up: Instant,
}

/// What a lookup found.
#[derive(Debug, PartialEq)]
enum Lookup {
    /// A fresh verdict.
    Answer(Verdict),
    /// A token once accepted, its verdict past the TTL: review it, no limit.
    Known,
    /// A token in neither cache: review it, within the limit.
    Unknown,
}

impl Memory {
    fn lookup(&self, key: &[u8; 32], ttl: Duration) -> Lookup {
        if let Some((verdict, at)) = self.accepted.get(key) {
            return if at.elapsed() < ttl {
                Lookup::Answer(*verdict)
            } else {
                Lookup::Known
            };
        }
        match self.refused.get(key) {
            Some((verdict, at)) if at.elapsed() < ttl => Lookup::Answer(*verdict),
            _ => Lookup::Unknown,
        }
    }

    /// Takes one TokenReview from the allowance, if one is left.
    fn take_review(&mut self, now: Instant) -> bool {
        let earned = now.duration_since(self.topped_up).as_secs_f64() * REVIEWS_PER_SECOND;
        self.allowance = (self.allowance + earned).min(REVIEW_BURST);
        self.topped_up = now;
        if self.allowance >= 1.0 {
            self.allowance -= 1.0;
            true
        } else {
            false
        }
    }

    fn remember(&mut self, key: [u8; 32], verdict: Verdict) {
        let now = Instant::now();
        match verdict {
            Verdict::Allowed | Verdict::Forbidden => {
                self.refused.remove(&key);
                insert_bounded(&mut self.accepted, ACCEPTED_ENTRIES, key, (verdict, now));
            }
            Verdict::Unauthenticated => {
                self.accepted.remove(&key);
                insert_bounded(&mut self.refused, REFUSED_ENTRIES, key, (verdict, now));
            }
            Verdict::Limited => {}
        }
    }
}

/// Inserts into `map`, first dropping its oldest entry when it holds `bound` others.
fn insert_bounded(map: &mut HashMap<[u8; 32], Entry>, bound: usize, key: [u8; 32], entry: Entry) {
    if map.len() >= bound && !map.contains_key(&key) {
        let oldest = map.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| *k);
        if let Some(oldest) = oldest {
            map.remove(&oldest);
        }
    }
    map.insert(key, entry);
}

/// Asks the API server about bearer tokens, remembering each answer for `ttl` and limiting the
/// TokenReviews of tokens it has not seen.
pub struct Guard {
    client: kube::Client,
    ttl: Duration,
    memory: Mutex<Memory>,
    checks: IntCounterVec,
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
            memory: Mutex::new(Memory {
                accepted: HashMap::new(),
                refused: HashMap::new(),
                allowance: REVIEW_BURST,
                topped_up: Instant::now(),
            }),
            checks: auth_checks(),
        }
    }

    /// The verdict on `token`: from a cache, [`Verdict::Limited`] for a token in neither cache
    /// while the rate limit is spent, else from the API server.
    pub async fn check(&self, token: &str) -> Result<Verdict, ReviewError> {
        let key = token_key(token);
        let known = {
            let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
            match memory.lookup(&key, self.ttl) {
                Lookup::Answer(verdict) => Some(verdict),
                Lookup::Known => None,
                Lookup::Unknown if memory.take_review(Instant::now()) => None,
                Lookup::Unknown => Some(Verdict::Limited),
            }
        };
        match known {
            Some(Verdict::Limited) => {
                self.count("rate_limit");
                return Ok(Verdict::Limited);
            }
            Some(verdict) => {
                self.count("cache");
                return Ok(verdict);
            }
            None => self.count("api_server"),
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
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remember(key, verdict);
        Ok(verdict)
    }

    fn count(&self, answered_by: &str) {
        self.checks.with_label_values(&[answered_by]).inc();
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
        Ok(Verdict::Limited) => {
            let mut response = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "too many unknown bearer tokens; try again in a second\n",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
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
    /// The secure setup `args` ask for (`None` for plain HTTP), its metric registered in
    /// `registry`; a mounted certificate is read now, so that a bad one stops the binary at
    /// start.
    pub fn from_args(
        args: &SecureMetricsArgs,
        client: kube::Client,
        registry: &Registry,
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
        let guard = Guard::new(client, args.metrics_auth_cache_ttl);
        registry.register(Box::new(guard.checks.clone()))?;
        Ok(Some(Self {
            tls: Arc::new(tls),
            guard: Arc::new(guard),
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
            assert_eq!(
                guard
                    .memory
                    .lock()
                    .expect("memory")
                    .lookup(&token_key("some-token"), guard.ttl),
                Lookup::Unknown
            );
        }
    }

    /// The token [`standin_api_server`] authenticates, as a user allowed `get` on `/metrics`.
    const PROMETHEUS_TOKEN: &str = "prometheus-token";

    /// A stand-in API server for the guard: TokenReviews accept [`PROMETHEUS_TOKEN`] only, and
    /// every SubjectAccessReview is allowed. It counts the TokenReviews it answered.
    fn standin_api_server() -> (kube::Client, Arc<std::sync::atomic::AtomicUsize>) {
        use http_body_util::BodyExt;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let reviews = Arc::new(AtomicUsize::new(0));
        let counted = reviews.clone();
        let service = tower::service_fn(move |request: axum::http::Request<kube::client::Body>| {
            let counted = counted.clone();
            async move {
                let path = request.uri().path().to_string();
                let body = request.into_body().collect().await?.to_bytes();
                let answer = if path.ends_with("/tokenreviews") {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let review: TokenReview = serde_json::from_slice(&body)?;
                    let accepted = review.spec.token.as_deref() == Some(PROMETHEUS_TOKEN);
                    serde_json::json!({
                        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                        "spec": {},
                        "status": if accepted {
                            serde_json::json!({"authenticated": true, "user": {"username": "system:serviceaccount:monitoring:prometheus"}})
                        } else {
                            serde_json::json!({"authenticated": false})
                        }
                    })
                } else {
                    serde_json::json!({
                        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                        "spec": {}, "status": {"allowed": true}
                    })
                };
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                    axum::http::Response::builder()
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(answer.to_string())
                        .expect("response"),
                )
            }
        });
        (kube::Client::new(service, "default"), reviews)
    }

    /// The operations router guarded with answers cached for `ttl`, the guard, and the count of
    /// TokenReviews [`standin_api_server`] answered.
    fn guarded(ttl: Duration) -> (Router, Arc<Guard>, Arc<std::sync::atomic::AtomicUsize>) {
        let (client, reviews) = standin_api_server();
        let guard = Arc::new(Guard::new(client, ttl));
        let router = protect(
            crate::http::ops_router(prometheus::Registry::new(), Default::default()),
            guard.clone(),
        );
        (router, guard, reviews)
    }

    /// What `/metrics` answers the scraper with [`PROMETHEUS_TOKEN`].
    async fn scrape(router: &Router) -> StatusCode {
        let auth = format!("Bearer {PROMETHEUS_TOKEN}");
        call(router.clone(), "/metrics", Some(&auth)).await.0
    }

    #[tokio::test]
    async fn a_flood_of_random_tokens_costs_a_bounded_number_of_token_reviews() {
        use std::sync::atomic::Ordering;
        let (router, guard, reviews) = guarded(Duration::from_secs(60));
        let started = Instant::now();
        let mut limited = 0;
        for i in 0..500 {
            let auth = format!("Bearer random-{i}");
            match call(router.clone(), "/metrics", Some(&auth)).await.0 {
                StatusCode::UNAUTHORIZED => {}
                StatusCode::TOO_MANY_REQUESTS => limited += 1,
                other => panic!("a random token was answered {other}"),
            }
        }
        let made = reviews.load(Ordering::SeqCst);
        let bound = REVIEW_BURST + started.elapsed().as_secs_f64() * REVIEWS_PER_SECOND;
        assert!(
            made as f64 <= bound,
            "500 random tokens cost {made} TokenReviews under the operator's identity (bound {bound})"
        );
        assert_eq!(
            made + limited,
            500,
            "each one reviewed or refused by the limit"
        );
        let checks = |by: &str| guard.checks.with_label_values(&[by]).get() as usize;
        assert_eq!(
            (checks("api_server"), checks("rate_limit")),
            (made, limited)
        );
        // A token refused a moment ago is refused again from the negative cache.
        assert_eq!(
            call(router.clone(), "/metrics", Some("Bearer random-0"))
                .await
                .0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(reviews.load(Ordering::SeqCst), made);
    }

    #[tokio::test]
    async fn an_allowed_token_keeps_working_under_a_flood_of_random_ones() {
        use std::sync::atomic::Ordering;
        let (router, _, reviews) = guarded(Duration::from_secs(60));
        assert_eq!(scrape(&router).await, StatusCode::OK);
        assert_eq!(reviews.load(Ordering::SeqCst), 1);
        for i in 0..(2 * REFUSED_ENTRIES + 10) {
            let auth = format!("Bearer random-{i}");
            let status = call(router.clone(), "/metrics", Some(&auth)).await.0;
            assert_ne!(status, StatusCode::OK, "random token {i}");
            // The real scraper is answered from its cached verdict throughout.
            if i % 100 == 0 {
                let before = reviews.load(Ordering::SeqCst);
                assert_eq!(
                    scrape(&router).await,
                    StatusCode::OK,
                    "after {i} random tokens"
                );
                assert_eq!(
                    reviews.load(Ordering::SeqCst),
                    before,
                    "the allowed token was reviewed again after {i} random tokens: the flood evicted it"
                );
            }
        }
        assert_eq!(scrape(&router).await, StatusCode::OK);
    }

    #[tokio::test]
    async fn an_accepted_token_past_its_ttl_is_reviewed_again_while_the_limit_is_spent() {
        use std::sync::atomic::Ordering;
        let (router, _, reviews) = guarded(Duration::from_millis(300));
        assert_eq!(scrape(&router).await, StatusCode::OK);
        let mut i = 0;
        while call(
            router.clone(),
            "/metrics",
            Some(&format!("Bearer random-{i}")),
        )
        .await
        .0 != StatusCode::TOO_MANY_REQUESTS
        {
            i += 1;
        }
        tokio::time::sleep(Duration::from_millis(350)).await;
        // Spend what the pause earned back, then the scraper's stale verdict is asked about again.
        for j in 0..3 {
            call(
                router.clone(),
                "/metrics",
                Some(&format!("Bearer more-{j}")),
            )
            .await;
        }
        let (status, challenge) = call(router.clone(), "/metrics", Some("Bearer one-more")).await;
        assert_eq!(
            (status, challenge.as_deref()),
            (StatusCode::TOO_MANY_REQUESTS, None)
        );
        let before = reviews.load(Ordering::SeqCst);
        assert_eq!(scrape(&router).await, StatusCode::OK);
        assert_eq!(reviews.load(Ordering::SeqCst), before + 1, "reviewed again");
    }

    #[test]
    fn answers_are_cached_for_the_ttl_only() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _inside = runtime.enter();
        let guard = Guard::new(unreachable_client(), Duration::from_millis(200));
        let mut memory = guard.memory.lock().expect("memory");
        let (accepted, refused) = (token_key("accepted"), token_key("refused"));
        memory.remember(accepted, Verdict::Forbidden);
        memory.remember(refused, Verdict::Unauthenticated);
        assert_eq!(
            memory.lookup(&accepted, guard.ttl),
            Lookup::Answer(Verdict::Forbidden)
        );
        assert_eq!(
            memory.lookup(&refused, guard.ttl),
            Lookup::Answer(Verdict::Unauthenticated)
        );
        std::thread::sleep(Duration::from_millis(250));
        // Past the TTL an accepted token is asked about again, outside the limit; a refused
        // one is like any unknown token.
        assert_eq!(memory.lookup(&accepted, guard.ttl), Lookup::Known);
        assert_eq!(memory.lookup(&refused, guard.ttl), Lookup::Unknown);
        // Each cache keeps its bound, dropping its oldest entries; refusals never push an
        // accepted token out.
        for i in 0..(REFUSED_ENTRIES + 10) {
            memory.remember(token_key(&format!("r{i}")), Verdict::Unauthenticated);
        }
        for i in 0..(ACCEPTED_ENTRIES + 10) {
            memory.remember(token_key(&format!("a{i}")), Verdict::Allowed);
        }
        assert_eq!(memory.refused.len(), REFUSED_ENTRIES);
        assert_eq!(memory.accepted.len(), ACCEPTED_ENTRIES);
        assert!(!memory.refused.contains_key(&token_key("r0")));
        assert!(
            memory
                .refused
                .contains_key(&token_key(&format!("r{}", REFUSED_ENTRIES + 9)))
        );
        assert!(!memory.accepted.contains_key(&token_key("a0")));
        // A token the API server stops accepting moves to the negative cache.
        let last = token_key(&format!("a{}", ACCEPTED_ENTRIES + 9));
        memory.remember(last, Verdict::Unauthenticated);
        assert!(!memory.accepted.contains_key(&last));
        assert_eq!(
            memory.lookup(&last, guard.ttl),
            Lookup::Answer(Verdict::Unauthenticated)
        );
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
