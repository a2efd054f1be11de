//! The platform-operator controller: turns each `PlatformInstance` into a vCluster with the
//! platform installed into it. This release serves its operations port; reconciling arrives with
//! the controller issue.

use clap::Parser;
use common::http::{OpsArgs, OpsServer, Readiness, ops_router, shutdown_signal};
use common::telemetry::LogArgs;

/// Command-line flags of the controller.
#[derive(Debug, Parser)]
#[command(
    name = "controller",
    version,
    about = "Reconciles PlatformInstances into vClusters running the di-framework platform."
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
    let registry = common::metrics::registry("controller");
    let readiness = Readiness::default();
    let server = OpsServer::bind(args.ops.metrics_bind_address).await?;
    tracing::info!(addr = %server.local_addr(), version = env!("CARGO_PKG_VERSION"), "controller serving its operations port");
    readiness.set(true);
    server
        .serve(ops_router(registry, readiness), shutdown_signal())
        .await?;
    tracing::info!("controller stopped");
    Ok(())
}
