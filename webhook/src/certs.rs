//! Self-issued certificates: a CA and the serving certificate it signs, kept in one Secret that
//! every replica reads, rotated before expiry with an overlap, and served through a rustls
//! certificate resolver over a swappable key.
//!
//! Rotation runs in two steps over each generation's lifetime `L` (from its `notBefore`):
//! at `L/2` a replica *prepares* the next generation (new CA and certificate) beside the current
//! one, so the CA bundle carries both; once the bundle with the new CA is published in both
//! webhook configurations and `3L/4` has passed, a replica *promotes* it. Every replica then
//! serves the new certificate at its next poll, while the old CA stays in the bundle until it
//! expires, so no review fails during a rollover. Every write to the Secret is conditional on the
//! `resourceVersion` it read, so no replica ever overwrites another's CA.

use std::sync::{Arc, RwLock};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

/// Key of the Secret's data holding the whole [`CertState`] as JSON.
pub const STATE_KEY: &str = "state.json";
/// Key of the Secret's data holding the current CA bundle (for people and tools).
pub const BUNDLE_KEY: &str = "ca.crt";

/// Errors of certificate handling.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Issuing a CA or certificate failed.
    #[error("issuing a certificate failed: {0}")]
    Issue(#[from] rcgen::Error),
    /// The PEM in the Secret could not be loaded into rustls.
    #[error(
        "the certificate in the Secret cannot be served ({0}); delete the Secret to issue a new CA"
    )]
    Load(String),
    /// The Secret's state is not what this webhook writes.
    #[error("Secret {name} holds no readable {STATE_KEY} ({reason}); delete it to issue a new CA")]
    Corrupt {
        /// The Secret.
        name: String,
        /// Why.
        reason: String,
    },
    /// Reading or writing the Secret failed.
    #[error(
        "{action} Secret {name} failed: {source}; check the webhook's RBAC on Secrets in its namespace"
    )]
    Api {
        /// What was attempted.
        action: &'static str,
        /// The Secret.
        name: String,
        /// Why.
        source: kube::Error,
    },
}

/// A CA and the serving certificate it issued, with the validity they share (Unix seconds).
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Generation {
    /// CA certificate, PEM.
    pub ca_cert: String,
    /// CA key, PEM.
    pub ca_key: String,
    /// Serving certificate, PEM.
    pub cert: String,
    /// Serving key, PEM.
    pub key: String,
    /// When it was issued; the rotation schedule counts from here.
    pub issued_at: i64,
    /// Start of validity (a little before `issued_at`, for clock skew).
    pub not_before: i64,
    /// End of validity.
    pub not_after: i64,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print keys.
        f.debug_struct("Generation")
            .field("issued_at", &self.issued_at)
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// A CA kept in the bundle after its generation was replaced, until it expires.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RetiredCa {
    /// CA certificate, PEM.
    pub ca_cert: String,
    /// End of validity.
    pub not_after: i64,
}

/// Everything the Secret holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CertState {
    /// The generation every replica serves.
    pub current: Generation,
    /// The prepared successor, already in the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Generation>,
    /// The replaced CA, kept in the bundle until it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<RetiredCa>,
}

/// What the serving certificate names.
#[derive(Clone, Debug)]
pub struct Subject {
    /// The webhook Service's name.
    pub service: String,
    /// Its namespace.
    pub namespace: String,
    /// Extra DNS names or IP addresses, such as `127.0.0.1` for a local run.
    pub extra_sans: Vec<String>,
}

impl Subject {
    /// Every subject alternative name of the serving certificate.
    pub fn sans(&self) -> Vec<String> {
        let mut sans = vec![
            format!("{}.{}.svc", self.service, self.namespace),
            format!("{}.{}.svc.cluster.local", self.service, self.namespace),
        ];
        sans.extend(self.extra_sans.iter().cloned());
        sans
    }
}

fn to_offset(unix: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// Issues a new CA and a serving certificate for `subject`, both valid from `now` for `lifetime_secs`.
pub fn issue(subject: &Subject, now: i64, lifetime_secs: i64) -> Result<Generation, CertError> {
    // Allow for clock skew between replicas and the API server.
    let not_before = now - 60.min(lifetime_secs / 4);
    let not_after = now + lifetime_secs;

    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("platform-operator-webhook-ca@{now}"),
    );
    ca.distinguished_name = dn;
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = to_offset(not_before);
    ca.not_after = to_offset(not_after);
    let issuer = CertifiedIssuer::self_signed(ca, ca_key)?;

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(subject.sans())?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{}.{}.svc", subject.service, subject.namespace),
    );
    leaf.distinguished_name = dn;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.not_before = to_offset(not_before);
    leaf.not_after = to_offset(not_after);
    let cert = leaf.signed_by(&key, &issuer)?;

    Ok(Generation {
        ca_cert: issuer.pem(),
        ca_key: ca_key_pem,
        cert: cert.pem(),
        key: key.serialize_pem(),
        issued_at: now,
        not_before,
        not_after,
    })
}

impl CertState {
    /// A first state: one fresh generation.
    pub fn new(subject: &Subject, now: i64, lifetime_secs: i64) -> Result<Self, CertError> {
        Ok(Self {
            current: issue(subject, now, lifetime_secs)?,
            next: None,
            previous: None,
        })
    }

    /// The CA bundle the webhook configurations must carry at `now`: the retired CA while it is
    /// valid, the current CA, and the prepared one.
    pub fn bundle(&self, now: i64) -> String {
        let mut pems = Vec::new();
        if let Some(previous) = self.previous.as_ref().filter(|p| p.not_after > now) {
            pems.push(previous.ca_cert.trim_end().to_string());
        }
        pems.push(self.current.ca_cert.trim_end().to_string());
        if let Some(next) = &self.next {
            pems.push(next.ca_cert.trim_end().to_string());
        }
        pems.join("\n") + "\n"
    }
}

/// What the rotation loop should do with the state it read (its metric label: the variant in
/// lower case).
#[derive(Clone, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Step {
    /// Nothing to do.
    Keep,
    /// Issue the next generation beside the current one.
    Prepare,
    /// Make the prepared generation current.
    Promote,
    /// The current generation has expired with nothing prepared (the webhook was down for
    /// longer than a lifetime): replace it at once.
    Replace,
}

/// Decides the rotation step at `now`. `next_published` says whether both webhook
/// configurations already carry the prepared CA; in the last eighth of the current lifetime the
/// prepared generation is promoted even when they do not (a configuration that cannot be written
/// must not leave the webhook serving an expired certificate).
pub fn plan(state: &CertState, now: i64, next_published: bool) -> Step {
    let current = &state.current;
    let span = (current.not_after - current.issued_at).max(1);
    match &state.next {
        None if now >= current.not_after => Step::Replace,
        None if now >= current.issued_at + span / 2 => Step::Prepare,
        None => Step::Keep,
        Some(_) if next_published && now >= current.issued_at + span * 3 / 4 => Step::Promote,
        // Whatever the publication says, never serve the current one to its end.
        Some(_) if now >= current.not_after - span / 8 => Step::Promote,
        Some(_) => Step::Keep,
    }
}

/// Applies `step` to `state`, issuing what it needs; `None` when there is nothing to change.
pub fn apply_step(
    state: &CertState,
    step: &Step,
    subject: &Subject,
    now: i64,
    lifetime_secs: i64,
) -> Result<Option<CertState>, CertError> {
    Ok(match step {
        Step::Keep => None,
        Step::Prepare => Some(CertState {
            next: Some(issue(subject, now, lifetime_secs)?),
            ..state.clone()
        }),
        Step::Promote => state.next.clone().map(|next| CertState {
            previous: Some(RetiredCa {
                ca_cert: state.current.ca_cert.clone(),
                not_after: state.current.not_after,
            }),
            current: next,
            next: None,
        }),
        Step::Replace => Some(CertState::new(subject, now, lifetime_secs)?),
    })
}

/// Loads a generation's certificate and key into the form rustls serves.
pub fn certified_key(generation: &Generation) -> Result<Arc<CertifiedKey>, CertError> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(generation.cert.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| CertError::Load(format!("certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(generation.key.as_bytes())
        .map_err(|e| CertError::Load(format!("key: {e}")))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| CertError::Load(format!("key: {e}")))?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

/// The certificate the TLS listener serves, swapped in place when the Secret changes.
#[derive(Debug)]
pub struct Resolver {
    current: RwLock<(String, Arc<CertifiedKey>)>,
}

impl Resolver {
    /// A resolver serving `generation`.
    pub fn new(generation: &Generation) -> Result<Self, CertError> {
        Ok(Self {
            current: RwLock::new((generation.cert.clone(), certified_key(generation)?)),
        })
    }

    /// Serves `generation` from the next handshake on; returns whether it changed.
    pub fn swap(&self, generation: &Generation) -> Result<bool, CertError> {
        let unchanged = self
            .current
            .read()
            .map(|c| c.0 == generation.cert)
            .unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let key = certified_key(generation)?;
        if let Ok(mut guard) = self.current.write() {
            *guard = (generation.cert.clone(), key);
        }
        Ok(true)
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.1.clone())
    }
}

/// Reads the state from the Secret `name`; `None` when the Secret does not exist.
pub async fn read(api: &Api<Secret>, name: &str) -> Result<Option<(CertState, String)>, CertError> {
    let secret = api.get_opt(name).await.map_err(|source| CertError::Api {
        action: "reading",
        name: name.into(),
        source,
    })?;
    let Some(secret) = secret else {
        return Ok(None);
    };
    let version = secret.metadata.resource_version.clone().unwrap_or_default();
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(STATE_KEY))
        .ok_or_else(|| CertError::Corrupt {
            name: name.into(),
            reason: format!("no {STATE_KEY} key"),
        })?;
    let state = serde_json::from_slice(&raw.0).map_err(|e| CertError::Corrupt {
        name: name.into(),
        reason: e.to_string(),
    })?;
    Ok(Some((state, version)))
}

fn secret_for(
    name: &str,
    namespace: &str,
    state: &CertState,
    now: i64,
    resource_version: Option<String>,
) -> Secret {
    let mut data = std::collections::BTreeMap::new();
    data.insert(
        STATE_KEY.to_string(),
        ByteString(serde_json::to_vec(state).unwrap_or_default()),
    );
    data.insert(
        BUNDLE_KEY.to_string(),
        ByteString(state.bundle(now).into_bytes()),
    );
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            resource_version,
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "platform-operator-webhook".to_string(),
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// Loads the state, creating the Secret with a first generation when there is none. Losing the
/// create race to another replica is fine: the winner's Secret is read and used.
pub async fn load_or_create(
    api: &Api<Secret>,
    name: &str,
    namespace: &str,
    subject: &Subject,
    now: i64,
    lifetime_secs: i64,
) -> Result<(CertState, String), CertError> {
    if let Some(found) = read(api, name).await? {
        return Ok(found);
    }
    let state = CertState::new(subject, now, lifetime_secs)?;
    match api
        .create(
            &PostParams::default(),
            &secret_for(name, namespace, &state, now, None),
        )
        .await
    {
        Ok(created) => Ok((state, created.metadata.resource_version.unwrap_or_default())),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            read(api, name).await?.ok_or_else(|| CertError::Corrupt {
                name: name.into(),
                reason: "deleted right after it was created".into(),
            })
        }
        Err(source) => Err(CertError::Api {
            action: "creating",
            name: name.into(),
            source,
        }),
    }
}

/// Writes `state` if the Secret is still at `resource_version`. `Ok(false)` when another
/// replica changed it first (the caller reads again and re-plans).
pub async fn write(
    api: &Api<Secret>,
    name: &str,
    namespace: &str,
    state: &CertState,
    now: i64,
    resource_version: &str,
) -> Result<bool, CertError> {
    let secret = secret_for(
        name,
        namespace,
        state,
        now,
        Some(resource_version.to_string()),
    );
    match api.replace(name, &PostParams::default(), &secret).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(source) => Err(CertError::Api {
            action: "updating",
            name: name.into(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> Subject {
        Subject {
            service: "platform-operator-webhook".into(),
            namespace: "ops".into(),
            extra_sans: vec!["127.0.0.1".into()],
        }
    }

    #[test]
    fn issued_generation_loads_into_rustls() {
        let g = issue(&subject(), 1_000_000, 3600).expect("issues");
        assert_eq!(g.not_after, 1_003_600);
        assert_eq!((g.issued_at, g.not_before), (1_000_000, 999_940));
        assert!(g.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        certified_key(&g).expect("rustls accepts it");
        assert!(
            !format!("{g:?}").contains("PRIVATE KEY"),
            "Debug never prints keys"
        );
    }

    #[test]
    fn rotation_prepares_then_promotes_only_once_published() {
        let s = subject();
        let t0 = 1_000_000;
        let state = CertState::new(&s, t0, 400).expect("state");
        let (nb, na) = (state.current.issued_at, state.current.not_after);
        let span = na - nb;
        assert_eq!(plan(&state, t0 + 10, false), Step::Keep);
        assert_eq!(plan(&state, nb + span / 2, false), Step::Prepare);

        let prepared = apply_step(&state, &Step::Prepare, &s, nb + span / 2, 400)
            .expect("ok")
            .expect("changed");
        assert_eq!(
            prepared.current, state.current,
            "preparing keeps serving the current generation"
        );
        let bundle = prepared.bundle(nb + span / 2);
        assert_eq!(
            bundle.matches("BEGIN CERTIFICATE").count(),
            2,
            "the bundle carries both CAs"
        );
        assert_eq!(
            plan(&prepared, nb + span * 3 / 4, false),
            Step::Keep,
            "never promote before the bundle is published"
        );
        assert_eq!(plan(&prepared, nb + span * 3 / 4, true), Step::Promote);
        // Close to the end of its lifetime the current certificate is replaced whatever the
        // publication says: a configuration that cannot be written must not leave the webhook
        // serving an expired certificate.
        assert_eq!(
            plan(&prepared, na - span / 8, false),
            Step::Promote,
            "promoted before expiry even when unpublished"
        );
        assert_eq!(
            plan(&prepared, nb + span / 2 + 1, true),
            Step::Keep,
            "too early to promote"
        );

        let promoted = apply_step(&prepared, &Step::Promote, &s, nb + span * 3 / 4, 400)
            .expect("ok")
            .expect("changed");
        assert_eq!(Some(promoted.current.clone()), prepared.next);
        let bundle = promoted.bundle(nb + span * 3 / 4);
        assert!(
            bundle.contains(state.current.ca_cert.trim_end()),
            "the old CA stays while it is valid"
        );
        assert!(bundle.contains(promoted.current.ca_cert.trim_end()));
        let after_expiry = promoted.bundle(na + 1);
        assert!(
            !after_expiry.contains(state.current.ca_cert.trim_end()),
            "an expired CA leaves the bundle"
        );
        assert_eq!(after_expiry.matches("BEGIN CERTIFICATE").count(), 1);
    }

    #[test]
    fn an_expired_generation_is_replaced_and_keep_changes_nothing() {
        let s = subject();
        let state = CertState::new(&s, 1_000_000, 100).expect("state");
        assert_eq!(plan(&state, 1_000_200, false), Step::Replace);
        let replaced = apply_step(&state, &Step::Replace, &s, 1_000_200, 100)
            .expect("ok")
            .expect("changed");
        assert_ne!(replaced.current.ca_cert, state.current.ca_cert);
        assert_eq!(
            apply_step(&state, &Step::Keep, &s, 1_000_200, 100).expect("ok"),
            None
        );
    }

    #[test]
    fn resolver_swaps_only_on_a_new_generation() {
        let s = subject();
        let a = issue(&s, 1_000_000, 100).expect("a");
        let b = issue(&s, 1_000_050, 100).expect("b");
        let resolver = Resolver::new(&a).expect("resolver");
        assert!(!resolver.swap(&a).expect("same"));
        assert!(resolver.swap(&b).expect("new"));
    }
}
