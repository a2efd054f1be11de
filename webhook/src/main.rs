//! The platform-operator admission webhook: defaults and validates `PlatformInstance`s beyond
//! what the CRD schema can check. This release serves its operations port; admission arrives with
//! the webhook issue.

use clap::Parser;
use common::http::{OpsArgs, OpsServer, Readiness, ops_router, shutdown_signal};
use common::telemetry::LogArgs;

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::telemetry::init(&args.log)?;
    let registry = common::metrics::registry("webhook");
    let readiness = Readiness::default();
    let server = OpsServer::bind(args.ops.metrics_bind_address).await?;
    tracing::info!(addr = %server.local_addr(), version = env!("CARGO_PKG_VERSION"), "webhook serving its operations port");
    readiness.set(true);
    server
        .serve(ops_router(registry, readiness), shutdown_signal())
        .await?;
    tracing::info!("webhook stopped");
    Ok(())
}
