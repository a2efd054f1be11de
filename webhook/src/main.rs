//! The platform-operator admission webhook binary: flags, start-up and shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use common::http::{OpsArgs, OpsServer, Readiness, ops_router, shutdown_signal};
use common::secure_metrics::{self, Secure};
use common::server::Limits;
use common::telemetry::LogArgs;
use webhook::admission::{Admission, router};
use webhook::cabundle::Configurations;
use webhook::certs::{Resolver, Subject};
use webhook::index::{Kind, NodePortIndex};
use webhook::keeper::Keeper;
use webhook::metrics::Metrics;
use webhook::rules::Settings;

/// Command-line flags of the webhook.
#[derive(Debug, Parser)]
#[command(
    name = "webhook",
    version,
    about = "Admission webhook that defaults and validates PlatformInstances."
)]
struct Args {
    #[command(flatten)]
    ops: OpsArgs,
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    limits: Limits,

    /// Address of the TLS admission port (POST /mutate, POST /validate).
    #[arg(long, env = "ADMISSION_BIND_ADDRESS", default_value = "0.0.0.0:9443")]
    admission_bind_address: SocketAddr,

    /// The namespace the webhook runs in; its certificate Secret lives there.
    #[arg(long, env = "POD_NAMESPACE", default_value = "platform-operator")]
    namespace: String,

    /// The webhook's Service name; the serving certificate names <service>.<namespace>.svc.
    #[arg(
        long,
        env = "WEBHOOK_SERVICE_NAME",
        default_value = "platform-operator-webhook"
    )]
    service_name: String,

    /// Extra names or IP addresses in the serving certificate (comma-separated), such as 127.0.0.1 for a local run.
    #[arg(long, value_delimiter = ',')]
    extra_san: Vec<String>,

    /// The Secret holding the webhook's CA and serving certificate (created by the first replica).
    #[arg(long, default_value = "platform-operator-webhook-tls")]
    tls_secret_name: String,

    /// Lifetime of each CA and serving certificate; they rotate at half and three quarters of it.
    #[arg(long, default_value = "8760h", value_parser = common::duration::parse)]
    cert_lifetime: Duration,

    /// The MutatingWebhookConfiguration whose caBundle the webhook keeps.
    #[arg(long, default_value = "platform-operator")]
    mutating_webhook_configuration: String,

    /// The ValidatingWebhookConfiguration whose caBundle the webhook keeps.
    #[arg(long, default_value = "platform-operator")]
    validating_webhook_configuration: String,

    /// The platform version set on instances that leave spec.version out.
    #[arg(long, default_value = "6.0.22", value_parser = parse_default_version)]
    default_platform_version: String,

    /// The lowest supported platform MAJOR.MINOR.
    #[arg(long, default_value = "6.0", value_parser = common::version::parse_minor)]
    min_platform_version: common::version::Minor,

    /// The highest supported platform MAJOR.MINOR.
    #[arg(long, default_value = "6.0", value_parser = common::version::parse_minor)]
    max_platform_version: common::version::Minor,

    /// The API server's NodePort range (its --service-node-port-range), LOW-HIGH.
    #[arg(long, default_value = "30000-32767", value_parser = parse_port_range)]
    service_node_port_range: (i32, i32),
}

/// A flag value the webhook cannot use.
#[derive(Debug, thiserror::Error)]
enum FlagError {
    /// `--default-platform-version` is no exact version.
    #[error(transparent)]
    Version(#[from] common::version::VersionError),
    /// `--service-node-port-range` is no `LOW-HIGH` port range.
    #[error("{0:?} is not a port range LOW-HIGH, such as 30000-32767")]
    PortRange(String),
}

fn parse_default_version(value: &str) -> Result<String, FlagError> {
    common::version::parse_exact(value)?;
    Ok(value.to_string())
}

fn parse_port_range(value: &str) -> Result<(i32, i32), FlagError> {
    let err = || FlagError::PortRange(value.to_string());
    let (lo, hi) = value.split_once('-').ok_or_else(err)?;
    let (lo, hi): (i32, i32) = (
        lo.trim().parse().map_err(|_| err())?,
        hi.trim().parse().map_err(|_| err())?,
    );
    if lo < 1 || hi > 65535 || lo > hi {
        Err(err())
    } else {
        Ok((lo, hi))
    }
}

/// Starts the NodePort index's watches; `readiness` follows its sync.
fn start_index(
    client: &kube::Client,
    metrics: &Metrics,
    readiness: &Readiness,
) -> Arc<NodePortIndex> {
    let index = Arc::new(NodePortIndex::default());
    let (watched, client) = (index.clone(), client.clone());
    let gauge = metrics.cache_objects.clone();
    let readiness = readiness.clone();
    tokio::spawn(async move {
        let on_change = {
            let index = watched.clone();
            move || {
                gauge
                    .with_label_values(&["PlatformInstance"])
                    .set(index.count(Kind::Instance) as i64);
                gauge
                    .with_label_values(&["Service"])
                    .set(index.count(Kind::Service) as i64);
                readiness.set(index.synced());
            }
        };
        webhook::index::run(&watched, client, &on_change).await;
    });
    index
}

/// Loads (or issues) the certificate, starts the keeper that rotates it and keeps the caBundle,
/// and returns the resolver the TLS port serves from.
async fn start_certificates(
    args: &Args,
    client: &kube::Client,
    metrics: &Metrics,
) -> anyhow::Result<Arc<Resolver>> {
    let subject = Subject {
        service: args.service_name.clone(),
        namespace: args.namespace.clone(),
        extra_sans: args.extra_san.clone(),
    };
    let state = Keeper::bootstrap(
        client,
        &args.namespace,
        &args.tls_secret_name,
        &subject,
        args.cert_lifetime,
    )
    .await?;
    let resolver = Arc::new(Resolver::new(&state.current)?);
    metrics.certificate_expiry.set(state.current.not_after);
    let keeper = Keeper {
        client: client.clone(),
        namespace: args.namespace.clone(),
        secret: args.tls_secret_name.clone(),
        subject,
        lifetime: args.cert_lifetime,
        configs: Configurations {
            mutating: args.mutating_webhook_configuration.clone(),
            validating: args.validating_webhook_configuration.clone(),
        },
        resolver: resolver.clone(),
        metrics: metrics.clone(),
    };
    tokio::spawn(keeper.run());
    Ok(resolver)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::telemetry::init(&args.log)?;
    if args.min_platform_version > args.max_platform_version {
        anyhow::bail!("--min-platform-version is above --max-platform-version");
    }
    let registry = common::metrics::registry("webhook");
    let metrics = Metrics::register(&registry).context("registering metrics")?;
    let readiness = Readiness::default();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
    let resolver = start_certificates(&args, &client, &metrics).await?;
    let admission = Arc::new(Admission {
        settings: Settings {
            default_version: args.default_platform_version.clone(),
            min_version: args.min_platform_version,
            max_version: args.max_platform_version,
            node_port_range: args.service_node_port_range,
        },
        index: start_index(&client, &metrics, &readiness),
        client,
        metrics: metrics.clone(),
    });
    let tls_config = Arc::new(webhook::tls::server_config(resolver)?);
    let listener = tokio::net::TcpListener::bind(args.admission_bind_address)
        .await
        .with_context(|| {
            format!(
                "listening on --admission-bind-address {}",
                args.admission_bind_address
            )
        })?;
    let ops = OpsServer::bind(args.ops.metrics_bind_address).await?;
    let secure = Secure::from_args(&args.ops.security, admission.client.clone(), &registry)?;
    tracing::info!(admission = %listener.local_addr()?, ops = %ops.local_addr(), version = env!("CARGO_PKG_VERSION"), "webhook serving");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let admission_server = tokio::spawn(webhook::tls::serve(
        listener,
        tls_config,
        router(admission),
        metrics.tls_handshake_failures.clone(),
        args.limits,
        stopped(stop_rx.clone()),
    ));
    let ops_server = tokio::spawn(secure_metrics::serve(
        ops,
        ops_router(registry, readiness.clone()),
        secure,
        args.limits,
        stopped(stop_rx),
    ));
    shutdown_signal().await;
    tracing::info!("shutting down: finishing in-flight reviews");
    readiness.set(false);
    let _ = stop_tx.send(true);
    let _ = admission_server.await;
    let _ = ops_server.await;
    tracing::info!("webhook stopped");
    Ok(())
}
