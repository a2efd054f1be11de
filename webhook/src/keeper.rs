//! The certificate keeper: every tick (and whenever a webhook configuration changes) it reads the
//! certificate Secret, serves its current generation, keeps the CA bundle in both webhook
//! configurations, and takes the rotation step that is due.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::Notify;

use crate::cabundle::{self, Configurations};
use crate::certs::{self, CertState, Resolver, Step, Subject};
use crate::metrics::Metrics;

/// What the keeper needs.
#[derive(Clone)]
pub struct Keeper {
    /// Cluster access.
    pub client: kube::Client,
    /// The webhook's namespace (where the Secret lives).
    pub namespace: String,
    /// The certificate Secret's name.
    pub secret: String,
    /// What the serving certificate names.
    pub subject: Subject,
    /// The lifetime of each new generation.
    pub lifetime: Duration,
    /// The webhook configurations to keep the bundle in.
    pub configs: Configurations,
    /// The resolver the TLS listener serves from.
    pub resolver: Arc<Resolver>,
    /// Metrics.
    pub metrics: Metrics,
}

/// Error from one pass of the keeper: the certificate's or the CA bundle's step that failed.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// Reading, issuing, serving or writing the certificate failed.
    #[error(transparent)]
    Certificate(#[from] certs::CertError),
    /// Keeping the CA bundle in the webhook configurations failed.
    #[error(transparent)]
    Bundle(#[from] cabundle::BundleError),
}

/// Seconds since the Unix epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The interval between checks: a twentieth of the lifetime, between 1 and 30 seconds.
pub fn tick(lifetime: Duration) -> Duration {
    (lifetime / 20).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

impl Keeper {
    /// Reads (or creates) the Secret and returns the state to serve first.
    pub async fn bootstrap(
        client: &kube::Client,
        namespace: &str,
        secret: &str,
        subject: &Subject,
        lifetime: Duration,
    ) -> Result<CertState, certs::CertError> {
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let (state, _) = certs::load_or_create(
            &api,
            secret,
            namespace,
            subject,
            now(),
            lifetime.as_secs() as i64,
        )
        .await?;
        Ok(state)
    }

    /// One pass: serve, publish, rotate. Returns the state it left in place.
    pub async fn pass(&self) -> Result<CertState, KeeperError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let lifetime = self.lifetime.as_secs() as i64;
        let now = now();
        let (mut state, version) = certs::load_or_create(
            &api,
            &self.secret,
            &self.namespace,
            &self.subject,
            now,
            lifetime,
        )
        .await?;
        self.serve(&state)?;
        let bundle = state.bundle(now);
        // A configuration that cannot be written holds a rotation back, but never past the
        // end of the certificate's life: the plan runs either way, and the error is returned
        // once the step is taken.
        let ensured = cabundle::ensure(&self.client, &self.configs, &bundle).await;
        let published = ensured.as_ref().is_ok_and(|e| e.published);
        if let Ok(e) = &ensured {
            self.metrics.ca_bundle_writes.inc_by(e.written as u64);
        }
        let step = certs::plan(&state, now, published);
        if step == Step::Keep {
            return ensured.map(|_| state).map_err(Into::into);
        }
        let next = certs::apply_step(&state, &step, &self.subject, now, lifetime)?;
        if let Some(next) = next
            && certs::write(&api, &self.secret, &self.namespace, &next, now, &version).await?
        {
            tracing::info!(?step, "certificate rotation step written");
            self.metrics
                .rotations
                .with_label_values(&[<&str>::from(&step)])
                .inc();
            state = next;
            let bundle = state.bundle(now);
            let again = cabundle::ensure(&self.client, &self.configs, &bundle).await?;
            self.metrics.ca_bundle_writes.inc_by(again.written as u64);
            self.serve(&state)?;
        }
        ensured.map(|_| state).map_err(Into::into)
    }

    fn serve(&self, state: &CertState) -> Result<(), KeeperError> {
        if self.resolver.swap(&state.current)? {
            tracing::info!(
                not_after = state.current.not_after,
                "serving a new certificate"
            );
        }
        self.metrics.certificate_expiry.set(state.current.not_after);
        Ok(())
    }

    /// Runs passes every tick and whenever a webhook configuration changes, forever.
    pub async fn run(self) {
        let changed = Arc::new(Notify::new());
        tokio::spawn(watch_configs(
            self.client.clone(),
            self.configs.clone(),
            changed.clone(),
        ));
        let tick = tick(self.lifetime);
        loop {
            if let Err(e) = self.pass().await {
                tracing::warn!(error = %e, "certificate upkeep failed; retrying");
            }
            tokio::select! {
                () = tokio::time::sleep(tick) => {},
                () = changed.notified() => {},
            }
        }
    }
}

/// Notifies on every change of either webhook configuration, so a reset caBundle is put back
/// at once rather than at the next tick.
async fn watch_configs(client: kube::Client, configs: Configurations, changed: Arc<Notify>) {
    let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mutating = watcher::watcher(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        by_name(&configs.mutating),
    )
    .default_backoff()
    .map(|_| ())
    .boxed();
    let validating = watcher::watcher(
        Api::<ValidatingWebhookConfiguration>::all(client),
        by_name(&configs.validating),
    )
    .default_backoff()
    .map(|_| ())
    .boxed();
    let mut events = futures::stream::select(mutating, validating);
    while events.next().await.is_some() {
        changed.notify_one();
    }
}
