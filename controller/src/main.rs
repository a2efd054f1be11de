//! The platform-operator controller binary: flags, start-up checks, leader election, and the
//! reconcile loop.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use common::crd::PlatformInstance;
use common::http::{OpsArgs, OpsServer, Readiness, ops_router, shutdown_signal};
use common::secure_metrics::{self, Secure};
use common::telemetry::LogArgs;
use controller::decide::Protection;
use controller::helm::Helm;
use controller::installer::Installer;
use controller::leader::Election;
use controller::metrics::{InstanceConditions, Metrics};
use controller::reconcile::{Context, Settings, error_policy, keep_policy, reconcile};
use controller::tasks::Tasks;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};

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

    /// Hold a coordination.k8s.io Lease so that only one replica reconciles.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,

    /// Node-local root under which each instance's storage directory lives.
    #[arg(long, default_value = "/var/lib/kubesolo/instances")]
    storage_root_base: String,

    /// How long one install may run before it is stopped.
    #[arg(long, default_value = "30m", value_parser = common::duration::parse)]
    install_timeout: Duration,

    /// How often an idle instance is checked and repaired.
    #[arg(long, default_value = "30m", value_parser = common::duration::parse)]
    repair_interval: Duration,

    /// How often work in progress is looked at.
    #[arg(long, default_value = "10s", value_parser = common::duration::parse)]
    target_poll: Duration,

    /// How many instances may provision or install at once; the others queue in order.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_installs: u16,

    /// Namespace of the storage cleanup Jobs (default: the namespace the operator runs in).
    #[arg(long)]
    cleanup_namespace: Option<String>,

    /// Image of the storage cleanup Jobs (needs `rm`).
    #[arg(long, env = "CLEANUP_IMAGE", default_value = "busybox:1.37")]
    cleanup_image: String,

    /// Root of the operator's state volume: one directory per instance.
    #[arg(long, default_value = "/var/lib/platform-operator/state")]
    state_dir: PathBuf,

    /// File holding the passphrase that encrypts the Pulumi state (the passphrase Secret's key
    /// `passphrase`, mounted).
    #[arg(long, default_value = "/etc/platform-operator/passphrase/passphrase")]
    passphrase_file: PathBuf,

    /// The npm registry the platform package is installed from (a mirror for air-gapped sites).
    #[arg(
        long,
        env = "NPM_REGISTRY",
        default_value = "https://registry.npmjs.org/"
    )]
    npm_registry: String,

    /// The npm executable.
    #[arg(long, default_value = "npm")]
    npm_binary: String,

    /// Run the platform program. `false` stops every instance at `Installing` with its vCluster
    /// and kubeconfig (for benchmarks of the provisioning path).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    install_platform: bool,

    /// The Pulumi CLI executable (its language host `pulumi-language-nodejs` on PATH beside it).
    #[arg(long, default_value = "pulumi")]
    pulumi_binary: String,

    /// The namespace the operator runs in.
    #[arg(long, env = "POD_NAMESPACE", default_value = "platform-operator")]
    namespace: String,

    /// The user the operator acts as, exempt from the service/vcluster admission policy
    /// (default: system:serviceaccount:<namespace>:platform-operator).
    #[arg(long)]
    operator_user: Option<String>,

    /// This replica's identity in the leader Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// The vCluster chart archive shipped with the operator.
    #[arg(
        long,
        default_value = "/opt/platform-operator/charts/vcluster-0.37.3.tgz"
    )]
    vcluster_chart: PathBuf,

    /// The expected sha256 of that archive (`sha256:<hex>`); a mismatch stops the controller.
    #[arg(long, env = "VCLUSTER_CHART_SHA256")]
    vcluster_chart_sha256: String,

    /// Extra values for the vCluster chart, applied after the controller's own.
    #[arg(long)]
    vcluster_extra_values: Option<PathBuf>,

    /// The helm executable.
    #[arg(long, default_value = "helm")]
    helm_binary: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::telemetry::init(&args.log)?;
    controller::chart::verify(&args.vcluster_chart, &args.vcluster_chart_sha256)?;
    let chart_version = controller::chart::version(&args.helm_binary, &args.vcluster_chart).await?;
    tracing::info!(chart = %args.vcluster_chart.display(), %chart_version, "vCluster chart verified");

    let registry = common::metrics::registry("controller");
    let metrics = Metrics::register(&registry).context("registering metrics")?;
    metrics
        .install_timeout
        .set(args.install_timeout.as_secs_f64());
    let readiness = Readiness::default();
    let ops = OpsServer::bind(args.ops.metrics_bind_address).await?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
    let secure = Secure::from_args(&args.ops.security, client.clone())?;
    let ops_task = tokio::spawn(secure_metrics::serve(
        ops,
        ops_router(registry.clone(), readiness.clone()),
        secure,
        shutdown_signal(),
    ));

    let identity = args.identity.clone().unwrap_or_else(|| {
        std::env::var("HOSTNAME").unwrap_or_else(|_| format!("controller-{}", std::process::id()))
    });
    let election = Election {
        namespace: args.namespace.clone(),
        name: "platform-operator-controller".into(),
        identity: identity.clone(),
        duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(4),
    };
    readiness.set(true);
    if args.leader_elect {
        tracing::info!(%identity, "waiting for the leader lease");
        tokio::select! {
            () = election.acquire(&client) => {},
            () = shutdown_signal() => return Ok(()),
        }
        tracing::info!(%identity, "leading");
    }
    metrics.leader.set(1);

    let hosts: Arc<Mutex<std::collections::BTreeMap<String, (String, String)>>> = Arc::default();
    let tasks = Tasks::new(
        args.max_concurrent_installs.into(),
        metrics.tasks_running.clone(),
        metrics.tasks_queued.clone(),
    );
    let settings = Settings {
        storage_root_base: args.storage_root_base.clone(),
        target_poll: args.target_poll,
        repair_interval: args.repair_interval,
        cleanup_namespace: args
            .cleanup_namespace
            .clone()
            .unwrap_or_else(|| args.namespace.clone()),
        cleanup_image: args.cleanup_image.clone(),
        state_dir: args.state_dir.clone(),
        operator_namespace: args.namespace.clone(),
        chart: args.vcluster_chart.clone(),
        chart_version,
        extra_values: args.vcluster_extra_values.clone(),
        operator_user: args.operator_user.clone().unwrap_or_else(|| {
            format!("system:serviceaccount:{}:platform-operator", args.namespace)
        }),
        install_platform: args.install_platform,
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        installer: Installer {
            state_dir: args.state_dir.clone(),
            passphrase_file: args.passphrase_file.clone(),
            registry: args.npm_registry.clone(),
            npm_binary: args.npm_binary.clone(),
            pulumi_binary: args.pulumi_binary.clone(),
            timeout: args.install_timeout,
            tool_seconds: metrics.tool_seconds.clone(),
        },
        helm: Helm {
            binary: args.helm_binary.clone(),
            timeout: args.install_timeout,
            work_dir: std::env::temp_dir().join("platform-operator-helm"),
        },
        settings,
        tasks,
        protection: RwLock::new(Protection::Unknown),
        metrics: metrics.clone(),
        reporter: kube::runtime::events::Reporter {
            controller: "platform-operator".into(),
            instance: Some(identity),
        },
        phases: Mutex::new(Default::default()),
        hosts: hosts.clone(),
    });
    tokio::spawn(keep_policy(ctx.clone(), Duration::from_secs(60)));

    let instances: Api<PlatformInstance> = Api::all(client.clone());
    let controller = Controller::new(instances, watcher::Config::default().any_semantic());
    // The instances' conditions, read from the controller's own cache at each scrape.
    registry
        .register(Box::new(InstanceConditions::new(controller.store())?))
        .context("registering the instance condition metrics")?;
    let controller = controller
        .owns(
            Api::<Secret>::all(client.clone()),
            watcher::Config::default().labels("app.kubernetes.io/managed-by=platform-operator"),
        )
        // A change to any service/vcluster wakes the instance whose host namespace holds it.
        .watches(
            Api::<Service>::all(client.clone()),
            watcher::Config::default().fields("metadata.name=vcluster"),
            move |svc| {
                let host = svc.metadata.namespace.clone().unwrap_or_default();
                let owner = hosts.lock().ok().and_then(|h| h.get(&host).cloned());
                owner.map(|(namespace, name)| {
                    ObjectRef::<PlatformInstance>::new(&name).within(&namespace)
                })
            },
        )
        .graceful_shutdown_on(shutdown_signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));

    if args.leader_elect {
        tokio::select! {
            () = controller => {},
            () = election.hold(&client) => {
                metrics.leader.set(0);
                anyhow::bail!("lost the leader lease; stopping at once so that another replica can take over");
            }
        }
    } else {
        controller.await;
    }
    tracing::info!("controller stopped");
    ops_task.abort();
    Ok(())
}
