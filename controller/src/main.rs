//! The platform-operator controller binary: flags, start-up checks, leader election, and the
//! reconcile loop.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use common::crd::PlatformInstance;
use common::http::{OpsArgs, OpsServer, Readiness, ops_router, shutdown_signal};
use common::names::INSTANCE_ANNOTATION;
use common::secure_metrics::{self, Secure};
use common::telemetry::LogArgs;
use controller::decide::model::Protection;
use controller::helm::Helm;
use controller::installer::Installer;
use controller::leader::Election;
use controller::metrics::{InstanceConditions, Metrics};
use controller::reconcile::stores::Triggers;
use controller::reconcile::{Context, Settings, error_policy, instance_of, reconcile};
use controller::tasks::Tasks;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

/// jemalloc, not glibc's malloc: glibc keeps most of what provisioning 1,000 instances freed
/// (80.5 MiB resident at idle against 53.9 MiB with jemalloc; docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Command-line flags of the controller.
#[derive(Debug, Parser)]
#[command(
    name = "controller",
    version,
    about = "Reconciles PlatformInstances into vClusters running the di-framework platform.",
    subcommand_negates_reqs = true
)]
struct Args {
    /// Run one task instead of the controller (the storage cleanup Jobs run `cleanup`).
    #[command(subcommand)]
    task: Option<Task>,

    #[command(flatten)]
    ops: OpsArgs,
    #[command(flatten)]
    log: LogArgs,

    /// Hold a coordination.k8s.io Lease so that only one replica reconciles. Given bare
    /// (`--leader-elect`) it means true, as Go operators accept it.
    #[arg(
        long,
        env = "LEADER_ELECT",
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    leader_elect: bool,

    /// Reconcile only the PlatformInstances of this namespace (default: every namespace).
    #[arg(long, value_name = "NAMESPACE")]
    watch_namespace: Option<String>,

    /// Node-local root under which each instance's storage directory lives.
    #[arg(long, default_value = "/var/lib/kubesolo/instances")]
    storage_root_base: String,

    #[command(flatten)]
    installer: Installer,

    /// How often an idle instance is checked and repaired.
    #[arg(long, default_value = "30m", value_parser = common::duration::parse)]
    repair_interval: Duration,

    /// How often work in progress is looked at.
    #[arg(long, default_value = "10s", value_parser = common::duration::parse)]
    target_poll: Duration,

    /// How many instances may provision or install at once; the others queue in order.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_installs: u16,

    /// How many reconciles may run at once (each holds at most one API connection while it
    /// reads or writes; the client keeps every connection it ever opened at once).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_reconciles: u16,

    /// Namespace of the storage cleanup Jobs (default: the namespace the operator runs in).
    #[arg(long)]
    cleanup_namespace: Option<String>,

    /// Image of the storage cleanup Jobs: the operator's own image, pinned by digest (the chart
    /// passes its own); the Jobs run its `/usr/local/bin/controller cleanup`.
    #[arg(
        long,
        env = "CLEANUP_IMAGE",
        required_unless_present = "print_vcluster_values"
    )]
    cleanup_image: Option<String>,

    /// How often a storage cleanup Job's pod is retried before the Job fails.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(0..))]
    cleanup_backoff_limit: i32,

    /// How long a finished storage cleanup Job is kept (its `ttlSecondsAfterFinished`).
    #[arg(long, default_value = "24h", value_parser = common::duration::parse)]
    cleanup_ttl: Duration,

    /// How long a storage cleanup Job may run before it fails (its `activeDeadlineSeconds`);
    /// a Job whose pod is never created (a quota, an admission policy) fails then too.
    #[arg(long, default_value = "30m", value_parser = common::duration::parse)]
    cleanup_deadline: Duration,

    #[command(flatten)]
    helm: Helm,

    /// How long the controller waits for a vCluster's API to answer before it reports
    /// `WaitingForAPI`.
    #[arg(long, default_value = "5s", value_parser = common::duration::parse)]
    vcluster_api_timeout: Duration,

    /// How often the admission policy that protects service/vcluster is applied again.
    #[arg(long, default_value = "60s", value_parser = common::duration::parse)]
    policy_interval: Duration,

    #[command(flatten)]
    election: Election,

    /// The Pod Security Standards level pods created inside each vCluster are held to (vCluster's
    /// `policies.podSecurityStandard`); the host namespace warns and audits at it too.
    #[arg(long, value_enum, default_value_t = controller::pod_security::Level::Baseline)]
    pod_security_standard: controller::pod_security::Level,

    /// Run the platform program (in install pods: `true` needs --install-image). `false` stops
    /// every instance at `Installing` with its vCluster and kubeconfig (for benchmarks of the
    /// provisioning path).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    install_platform: bool,

    /// Failed installs, upgrades, repairs or Helm runs in a row at one generation after which an
    /// instance stops retrying (`Stalled`, reason `RetriesExhausted`) until its spec changes or
    /// the retry annotation is set; 0 retries forever.
    #[arg(long, default_value_t = 5)]
    max_retries: u32,

    /// The quotas (JSON, as `spec.resources`: `{"quota": {...}, "limitRange": {...}}`) of every
    /// instance without `spec.resources`: a ResourceQuota and LimitRange in its host namespace.
    #[arg(long, value_parser = parse_resources)]
    default_instance_resources: Option<common::crd::InstanceResources>,

    /// The namespace the operator runs in.
    #[arg(long, env = "POD_NAMESPACE", default_value = "platform-operator")]
    namespace: String,

    /// The user the operator acts as, exempt from the service/vcluster admission policy
    /// (default: system:serviceaccount:<namespace>:platform-operator).
    #[arg(long)]
    operator_user: Option<String>,

    /// The lowest platform MAJOR.MINOR this operator installs (the webhook's flag of the same
    /// name admits the same range; give both the same value).
    #[arg(long, default_value = "6.0", value_parser = common::version::parse_minor)]
    min_platform_version: common::version::Minor,

    /// The highest platform MAJOR.MINOR this operator installs (the webhook's flag of the same
    /// name admits the same range; give both the same value).
    #[arg(long, default_value = "6.0", value_parser = common::version::parse_minor)]
    max_platform_version: common::version::Minor,

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
    #[arg(
        long,
        env = "VCLUSTER_CHART_SHA256",
        required_unless_present = "print_vcluster_values"
    )]
    vcluster_chart_sha256: Option<String>,

    /// Extra values for the vCluster chart, applied after the controller's own.
    #[arg(long)]
    vcluster_extra_values: Option<PathBuf>,

    /// Print the vCluster chart values the controller installs for the instance
    /// `<namespace>/<name>` (with this --storage-root-base) to standard output and exit, checking
    /// nothing else (the image build renders the real chart with them).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    print_vcluster_values: Option<String>,
}

/// The controller's API configuration, never `~/.kube/config` (which whatever runs as the
/// controller's user could write): the files `KUBECONFIG` names when it is set (a controller run
/// outside a cluster), else the pod's in-cluster configuration.
async fn kube_config() -> anyhow::Result<kube::Config> {
    let options = kube::config::KubeConfigOptions::default();
    match kube::config::Kubeconfig::from_env().context("reading the files KUBECONFIG names")? {
        Some(kubeconfig) => Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?),
        None => kube::Config::incluster().context(
            "no KUBECONFIG and no in-cluster configuration (KUBERNETES_SERVICE_HOST and the mounted ServiceAccount token): run the controller in a pod or set KUBECONFIG; it never reads ~/.kube/config",
        ),
    }
}

/// Whether a URL names a user or password (`scheme://user:secret@host/`).
fn has_credentials(url: &str) -> bool {
    url.split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or_default())
        .is_some_and(|authority| authority.contains('@'))
}

/// Tasks the controller binary runs instead of the controller.
#[derive(Debug, clap::Subcommand)]
enum Task {
    /// Remove one instance's storage directory `<root>/<dir>` (what a storage cleanup Job runs):
    /// never following a symbolic link, never crossing into another filesystem.
    Cleanup {
        /// The storage root as mounted in the Job (`--storage-root-base` on the node).
        #[arg(long)]
        root: PathBuf,
        /// The instance's storage directory under it (one name, not a path).
        #[arg(long)]
        dir: String,
        /// The instance's UID: a directory whose owner marker names another is left (exit 3).
        #[arg(long)]
        uid: Option<String>,
    },
    /// Run one install, repair preview or upgrade preview of the platform program from a request
    /// file (`request.json`, the instance's key in the file `passphrase` beside it) and write its
    /// outcome into the instance's folder: Pulumi only, no Kubernetes client.
    Install {
        /// The request file.
        #[arg(long)]
        request: PathBuf,
    },
    /// Print the passphrase of one instance's Pulumi state, derived from --passphrase-file and the
    /// instance's UID, to open that state by hand with the Pulumi CLI
    /// (`PULUMI_CONFIG_PASSPHRASE_FILE`); docs/operations.md.
    StatePassphrase {
        /// The instance's UID (`kubectl get platforminstance <name> -o jsonpath={.metadata.uid}`).
        #[arg(long)]
        uid: String,
    },
    /// Helm's post-renderer: the vCluster chart's manifest from standard input to standard output,
    /// its control plane set to the `Recreate` strategy (`controller::helm::post_render`).
    PostRender,
    /// Claim the storage directory `dir` for the instance (what the control plane's init
    /// container runs): write its owner marker when there is none; exit 3 when it names another.
    ClaimStorage {
        /// The storage directory as mounted.
        #[arg(long)]
        dir: PathBuf,
        /// The instance's UID.
        #[arg(long)]
        uid: String,
        /// The instance, `<namespace>/<name>`.
        #[arg(long)]
        instance: String,
    },
}

/// The exit of a task whose storage directory belongs to another instance.
fn conflict(e: controller::marker::MarkerError) -> anyhow::Result<std::process::ExitCode> {
    if matches!(e, controller::marker::MarkerError::Conflict(_)) {
        eprintln!("Error: {e}");
        return Ok(controller::marker::CONFLICT_EXIT.into());
    }
    Err(e.into())
}

impl Args {
    /// Flags that only make sense together.
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.install_platform || self.installer.install_image.is_some(),
            "--install-platform=true needs --install-image (the operator image, by digest): the platform program runs only in install pods, never in the controller's process (the chart sets it); or set --install-platform=false"
        );
        self.installer.check_pods()?;
        if let Some(namespace) = &self.watch_namespace {
            anyhow::ensure!(
                common::names::is_dns_label(namespace),
                "--watch-namespace {namespace:?} is not a namespace name: use lower-case letters, digits and '-', at most 63 characters, starting and ending with a letter or digit"
            );
        }
        if let (Some(path), Some(values)) = (&self.vcluster_extra_values, self.extra_values()?) {
            // The policy names it in a CEL string: a ServiceAccount name (a DNS subdomain) only.
            let account = controller::policy::syncer_account(Some(&values));
            anyhow::ensure!(
                account.split('.').all(common::names::is_dns_label),
                "--vcluster-extra-values {} sets controlPlane.advanced.serviceAccount.name {account:?}, which is no ServiceAccount name",
                path.display()
            );
            // Helm replaces these whole: the controller's pin and its storage owner check.
            for (key, what) in [
                (
                    "scheduling/affinity",
                    "to keep each control plane on the node that holds its storage: remove it (nodeSelector and tolerations may be set)",
                ),
                (
                    "initContainers",
                    "to check who owns each storage directory before the control plane starts: remove it",
                ),
            ] {
                anyhow::ensure!(
                    values
                        .pointer(&format!("/controlPlane/statefulSet/{key}"))
                        .is_none(),
                    "--vcluster-extra-values {} sets controlPlane.statefulSet.{}, which the controller sets itself {what}",
                    path.display(),
                    key.replace('/', ".")
                );
            }
        }
        anyhow::ensure!(
            !has_credentials(&self.installer.npm_registry),
            "--npm-registry carries credentials, which would be visible in the process list: put the URL in a Secret and pass its file with --npm-registry-file (the chart's npmRegistrySecret)"
        );
        anyhow::ensure!(
            self.election.leader_renew_interval < self.election.leader_lease_duration,
            "--leader-renew-interval ({:?}) must be shorter than --leader-lease-duration ({:?})",
            self.election.leader_renew_interval,
            self.election.leader_lease_duration
        );
        anyhow::ensure!(
            self.election.leader_renew_interval < self.election.leader_renew_deadline
                && self.election.leader_renew_deadline < self.election.leader_lease_duration,
            "--leader-renew-deadline ({:?}) must be longer than --leader-renew-interval ({:?}) and shorter than --leader-lease-duration ({:?})",
            self.election.leader_renew_deadline,
            self.election.leader_renew_interval,
            self.election.leader_lease_duration
        );
        Ok(())
    }

    /// The `--vcluster-extra-values` file, parsed.
    fn extra_values(&self) -> anyhow::Result<Option<serde_json::Value>> {
        let Some(path) = &self.vcluster_extra_values else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --vcluster-extra-values {}", path.display()))?;
        let values = serde_saphyr::from_str(&text)
            .with_context(|| format!("--vcluster-extra-values {} is not YAML", path.display()))?;
        Ok(Some(values))
    }

    fn settings(&self, chart_version: String) -> Settings {
        Settings {
            storage_root_base: self.storage_root_base.clone(),
            target_poll: self.target_poll,
            repair_interval: self.repair_interval,
            cleanup_namespace: self
                .cleanup_namespace
                .clone()
                .unwrap_or_else(|| self.namespace.clone()),
            cleanup_image: self.cleanup_image.clone().unwrap_or_default(),
            cleanup_backoff_limit: self.cleanup_backoff_limit,
            cleanup_ttl: self.cleanup_ttl,
            cleanup_deadline: self.cleanup_deadline,
            api_probe_timeout: self.vcluster_api_timeout,
            state_dir: self.installer.state_dir.clone(),
            operator_namespace: self.namespace.clone(),
            chart: self.vcluster_chart.clone(),
            chart_version,
            extra_values: self.vcluster_extra_values.clone(),
            operator_user: self.operator_user.clone().unwrap_or_else(|| {
                format!("system:serviceaccount:{}:platform-operator", self.namespace)
            }),
            syncer_account: controller::policy::syncer_account(
                self.extra_values().ok().flatten().as_ref(),
            ),
            install_platform: self.install_platform,
            max_retries: self.max_retries,
            pod_security: self.pod_security_standard,
            default_resources: self.default_instance_resources.clone(),
            supported_versions: (self.min_platform_version, self.max_platform_version),
        }
    }
}

/// Maps an object of a host namespace to the instance the namespace's annotation names.
fn by_host<K: Resource>(
    namespaces: Store<Namespace>,
) -> impl Fn(K) -> Option<ObjectRef<PlatformInstance>> {
    move |object| {
        let host = namespaces.get(&ObjectRef::new(object.meta().namespace.as_deref()?))?;
        let (namespace, name) = host
            .annotations()
            .get(INSTANCE_ANNOTATION)?
            .split_once('/')?;
        Some(ObjectRef::new(name).within(namespace))
    }
}

/// The reconcile loop over every instance, woken by its Secrets, by its `service/vcluster` and
/// by the vCluster's rollout (its Deployment, Helm release and exported kubeconfig); each of those
/// watches feeds the controller's caches before it wakes an instance.
async fn run(
    args: &Args,
    ctx: Arc<Context>,
    triggers: Triggers,
    registry: &prometheus::Registry,
) -> anyhow::Result<()> {
    // Objects of other namespaces that map to an instance are dropped by the controller: it
    // reconciles only what its own instance cache holds.
    let instances: Api<PlatformInstance> = match &args.watch_namespace {
        Some(namespace) => Api::namespaced(ctx.client.clone(), namespace),
        None => Api::all(ctx.client.clone()),
    };
    // The instances' cache keeps no managed fields: nothing reads them, and with server-side
    // apply they are the largest part of each object.
    let (reader, writer) = kube::runtime::reflector::store();
    let stream = watcher(instances, watcher::Config::default().any_semantic())
        .modify(|pi| pi.metadata.managed_fields = None)
        .reflect(writer)
        .applied_objects();
    // Bounded: kube's HTTP/1.1 client opens a connection per request in flight and keeps each
    // idle in its pool for ever, so unbounded reconciles (hundreds at once while a thousand
    // instances provision) left hundreds of idle TLS connections for the life of the process.
    let config = kube::runtime::controller::Config::default();
    let controller = Controller::for_stream(stream, reader)
        .with_config(config.concurrency(args.max_concurrent_reconciles));
    // Tracked tasks wake their instances when they end, start, or move in the queue (tasks.rs).
    let mut woken = ctx.tasks.woken();
    let woken =
        futures::stream::poll_fn(move |cx| woken.poll_recv(cx)).filter_map(|key| async move {
            let (namespace, name) = instance_of(&key)?;
            Some(ObjectRef::<PlatformInstance>::new(name).within(namespace))
        });
    registry
        .register(Box::new(InstanceConditions::new(controller.store())?))
        .context("registering the instance condition metrics")?;
    let namespaces = &ctx.stores.namespaces;
    controller
        .owns_stream(triggers.kubeconfigs)
        .watches_stream(triggers.services, by_host(namespaces.clone()))
        .watches_stream(triggers.deployments, by_host(namespaces.clone()))
        .watches_stream(triggers.exported, by_host(namespaces.clone()))
        .watches_stream(triggers.releases, by_host(namespaces.clone()))
        .watches_stream(triggers.pods, by_host(namespaces.clone()))
        .reconcile_on(woken)
        .graceful_shutdown_on(shutdown_signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    if let Some(Task::PostRender) = &args.task {
        let manifest = std::io::read_to_string(std::io::stdin())?;
        print!("{}", controller::helm::post_render(&manifest)?);
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(Task::Install { request }) = &args.task {
        let runtime = tokio::runtime::Runtime::new()?;
        let outcome = runtime.block_on(args.installer.run_request(request))?;
        match outcome.result {
            Ok(_) => println!(
                "run {} of instance {} done",
                outcome.install_id, outcome.uid
            ),
            Err((failure, message)) => {
                let reason: &str = failure.into();
                println!(
                    "run {} of instance {} failed ({reason}): {message}",
                    outcome.install_id, outcome.uid
                );
            }
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(Task::StatePassphrase { uid }) = &args.task {
        let file = &args.installer.passphrase_file;
        let passphrase = std::fs::read(file)
            .map_err(|e| anyhow::anyhow!("reading the passphrase file {}: {e}", file.display()))?;
        println!(
            "{}",
            controller::installer::state_key::derive(&passphrase, uid)
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(Task::ClaimStorage { dir, uid, instance }) = &args.task {
        if let Err(e) = controller::marker::claim(dir, uid, instance) {
            return conflict(e);
        }
        println!("{} is instance {instance}'s (uid {uid})", dir.display());
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(Task::Cleanup { root, dir, uid }) = &args.task {
        let path = root.join(dir);
        // Only a directory has a marker: a link at that name is removed as a link.
        if let Some(uid) = uid
            && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            && let Err(e) = controller::marker::check(&path, uid)
        {
            return conflict(e);
        }
        let removed = controller::cleanup::remove_instance_dir(root, dir)?;
        if removed.absent {
            println!("{} does not exist; nothing to remove", path.display());
        } else {
            println!(
                "removed {}: {} directories, {} other entries",
                path.display(),
                removed.directories,
                removed.entries
            );
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(instance) = &args.print_vcluster_values {
        let (namespace, name) = instance
            .split_once('/')
            .context("--print-vcluster-values takes <namespace>/<name>")?;
        let host = common::names::host_namespace(namespace, name);
        let claim = controller::reconcile::objects::Claim {
            image: args.cleanup_image.as_deref().unwrap_or("<--cleanup-image>"),
            uid: "<uid>",
            instance,
        };
        print!(
            "{}",
            controller::reconcile::vcluster_values(
                &args.storage_root_base,
                &host,
                &common::names::storage_dir(namespace, name, &host),
                args.pod_security_standard,
                None,
                &claim,
                args.default_instance_resources.as_ref(),
            )
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    // The binary as started supervises the controller: a process of its own that reaps the
    // tools' orphans and ends whatever is left when the controller ends (controller::reaper).
    let Ok(supervisor) = std::env::var(controller::reaper::SUPERVISOR) else {
        return controller::reaper::supervise(std::env::args_os().skip(1))
            .context("starting the supervised controller");
    };
    controller::reaper::follow_supervisor(&supervisor)?;
    tokio::runtime::Runtime::new()?.block_on(run_controller(args))?;
    Ok(std::process::ExitCode::SUCCESS)
}

async fn run_controller(args: Args) -> anyhow::Result<()> {
    common::telemetry::init(&args.log)?;
    args.check()?;
    controller::chart::verify(
        &args.vcluster_chart,
        args.vcluster_chart_sha256.as_deref().unwrap_or_default(),
    )?;
    let chart_version = controller::chart::version(&args.helm, &args.vcluster_chart).await?;
    tracing::info!(chart = %args.vcluster_chart.display(), %chart_version, "vCluster chart verified");

    let registry = common::metrics::registry("controller");
    let metrics = Metrics::register(&registry).context("registering metrics")?;
    metrics
        .install_timeout
        .set(args.installer.install_timeout.as_secs_f64());
    // The state volume's usage, now and every 30 s (docs/operations.md: what to do near full).
    let (volume, dir) = (metrics.clone(), args.installer.state_dir.clone());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(30));
        loop {
            every.tick().await;
            if let Err(e) = volume.observe_state_volume(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "measuring the state volume failed");
            }
        }
    });
    let readiness = Readiness::default();
    let ops = OpsServer::bind(args.ops.metrics_bind_address).await?;
    let client = kube::Client::try_from(kube_config().await?)
        .context("connecting to the Kubernetes API (in-cluster or KUBECONFIG)")?;
    let secure = Secure::from_args(&args.ops.security, client.clone(), &registry)?;
    let ops_task = tokio::spawn(secure_metrics::serve(
        ops,
        ops_router(registry.clone(), readiness.clone()),
        secure,
        common::server::Limits::default(),
        shutdown_signal(),
    ));

    let identity = args.identity.clone().unwrap_or_else(|| {
        std::env::var("HOSTNAME").unwrap_or_else(|_| format!("controller-{}", std::process::id()))
    });
    let election = Election {
        namespace: args.namespace.clone(),
        identity: identity.clone(),
        ..args.election.clone()
    };
    readiness.set(true);
    let mut renewed = tokio::time::Instant::now();
    if args.leader_elect {
        tracing::info!(%identity, "waiting for the leader lease");
        tokio::select! {
            sent = election.acquire(&client) => renewed = sent,
            () = shutdown_signal() => return Ok(()),
        }
        tracing::info!(%identity, "leading");
    }
    metrics.leader.set(1);

    let (stores, triggers) =
        controller::reconcile::stores::Stores::start(&client, args.watch_namespace.as_deref());
    let ctx = Arc::new(Context {
        client: client.clone(),
        installer: Installer {
            tool_seconds: Some(metrics.tool_seconds.clone()),
            launcher: args.installer.launcher(&client, &args.namespace)?,
            ..args.installer.clone()
        },
        helm: args.helm.clone(),
        settings: args.settings(chart_version),
        tasks: Tasks::new(
            args.max_concurrent_installs.into(),
            metrics.tasks_running.clone(),
            metrics.tasks_queued.clone(),
        ),
        protection: RwLock::new(Protection::Unknown),
        metrics: metrics.clone(),
        reporter: kube::runtime::events::Reporter {
            controller: "platform-operator".into(),
            instance: Some(identity.clone()),
        },
        backoff: Default::default(),
        stores,
        probes: controller::reconcile::reader::Probes::counted(metrics.probes.clone()),
    });
    tokio::spawn(controller::policy::keep(ctx.clone(), args.policy_interval));
    let controller = run(&args, ctx, triggers, &registry);

    if args.leader_elect {
        // The fence stops all work at once, before the lease can expire for another replica,
        // without waiting for tasks or requests in flight: the process exits, and its supervisor
        // kills every tool (helm, npm, pulumi and what they started).
        let fence = {
            let identity = identity.clone();
            move || {
                tracing::error!(%identity, "lost the leader lease: it was not renewed within --leader-renew-deadline; exiting so that another replica can take over");
                std::process::exit(1);
            }
        };
        tokio::select! {
            result = controller => result?,
            lost = election.hold(&client, renewed, fence) => {
                metrics.leader.set(0);
                tracing::error!(%identity, reason = %lost?, "lost the leader lease; exiting so that another replica can take over");
                std::process::exit(1);
            }
        }
    } else {
        controller.await?;
    }
    tracing::info!("controller stopped");
    ops_task.abort();
    Ok(())
}

/// `--default-instance-resources`: JSON as `spec.resources` takes it (the API server checks
/// each quantity when Helm applies the quota).
fn parse_resources(text: &str) -> Result<common::crd::InstanceResources, String> {
    serde_json::from_str(text).map_err(|e| {
        format!("{e}: give JSON as spec.resources takes it, such as {{\"quota\": {{\"limits.cpu\": \"8\"}}}} (the chart value controller.defaultInstanceResources)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses the controller's flags `flags` after the two it always needs.
    fn parse_with(flags: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec![
            "controller",
            "--vcluster-chart-sha256",
            "sha256:00",
            "--cleanup-image=x@sha256:00",
            "--install-image=x@sha256:00",
            "--install-state-claim=state",
        ];
        argv.extend_from_slice(flags);
        Args::try_parse_from(argv)
    }

    #[test]
    fn the_tunables_default_to_the_values_they_had_as_constants() {
        let args = Args::try_parse_from([
            "controller",
            "--vcluster-chart-sha256",
            "sha256:00",
            "--cleanup-image",
            "ghcr.io/di-framework/platform-operator@sha256:00",
        ])
        .expect("flags");
        let error = args.check().expect_err("no install image").to_string();
        assert!(error.contains("--install-image"), "{error}");
        let args = parse_with(&[]).expect("flags");
        args.check().expect("defaults are consistent");
        assert_eq!(args.election.leader_lease_duration, Duration::from_secs(15));
        assert_eq!(args.election.leader_renew_interval, Duration::from_secs(4));
        assert_eq!(args.election.leader_renew_deadline, Duration::from_secs(10));
        assert_eq!(
            args.pod_security_standard,
            controller::pod_security::Level::Baseline
        );
        assert_eq!(args.policy_interval, Duration::from_secs(60));
        assert_eq!(args.vcluster_api_timeout, Duration::from_secs(5));
        assert_eq!(args.max_concurrent_reconciles, 16);
        assert_eq!(args.cleanup_backoff_limit, 3);
        assert_eq!(args.cleanup_ttl, Duration::from_secs(86400));
        let settings = args.settings("0.37.3".into());
        assert_eq!(settings.api_probe_timeout, Duration::from_secs(5));
        assert_eq!(settings.cleanup_backoff_limit, 3);
    }

    #[test]
    fn registry_credentials_are_refused_in_argv() {
        let parse = |flags: &[&str]| parse_with(flags).expect("flags");
        let error = parse(&["--npm-registry=https://ci:s3cret@npm.example/"])
            .check()
            .expect_err("refused")
            .to_string();
        assert!(error.contains("--npm-registry-file"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
        parse(&["--npm-registry=https://npm.example/a@b"])
            .check()
            .expect("an @ in the path is no credential");
        let args = parse(&["--npm-registry-file=/etc/npm/url"]);
        args.check().expect("a file");
        assert!(
            !args.installer.npm_allow_scripts,
            "scripts are off by default"
        );
        assert_eq!(args.installer.pulumi_sdk_version, "3.248.0");
    }

    #[test]
    fn leader_elect_given_bare_means_true() {
        let parse = |flags: &[&str]| parse_with(flags).map(|a| a.leader_elect);
        assert!(parse(&["--leader-elect"]).expect("bare"));
        assert!(parse(&["--leader-elect", "--state-dir", "/s"]).expect("bare, then another flag"));
        assert!(parse(&["--leader-elect=true"]).expect("=true"));
        assert!(!parse(&["--leader-elect=false"]).expect("=false"));
        assert!(!parse(&["--leader-elect", "false"]).expect("false"));
        assert!(parse(&[]).expect("default"));
        assert!(
            parse(&["--leader-elect=maybe"])
                .is_err_and(|e| e.to_string().contains("--leader-elect")),
            "a value that is no boolean is refused, naming the flag"
        );
    }

    #[test]
    fn printing_the_values_needs_no_chart_digest() {
        let args = Args::try_parse_from([
            "controller",
            "--print-vcluster-values",
            "team-a/one",
            "--storage-root-base",
            "/srv/instances",
        ])
        .expect("flags");
        assert_eq!(args.print_vcluster_values.as_deref(), Some("team-a/one"));
    }

    #[test]
    fn the_cleanup_task_needs_no_chart_digest() {
        let args = Args::try_parse_from([
            "controller",
            "cleanup",
            "--root",
            "/storage",
            "--dir",
            "pi-a-b-1",
        ])
        .expect("flags");
        assert!(matches!(args.task, Some(Task::Cleanup { ref dir, .. }) if dir == "pi-a-b-1"));
    }

    #[test]
    fn a_watch_namespace_that_is_no_namespace_name_is_refused() {
        refused(&["--watch-namespace=Team_A"], "--watch-namespace");
        let args = parse_with(&["--watch-namespace=team-a"]).expect("flags");
        args.check().expect("a namespace name");
        assert_eq!(args.watch_namespace.as_deref(), Some("team-a"));
        assert_eq!(parse_with(&[]).expect("flags").watch_namespace, None);
    }

    /// The check of flags `flags` fails naming `flag`.
    fn refused(flags: &[&str], flag: &str) {
        let args = parse_with(flags).expect("flags");
        let error = args.check().expect_err("refused").to_string();
        assert!(error.contains(flag), "{error}");
    }

    #[test]
    fn a_renewal_slower_than_the_lease_is_refused() {
        refused(
            &["--leader-lease-duration=10s", "--leader-renew-interval=10s"],
            "--leader-renew-interval",
        );
        // The holder must give up before its lease can expire for another replica.
        refused(
            &["--leader-lease-duration=10s", "--leader-renew-deadline=10s"],
            "--leader-renew-deadline",
        );
        assert!(
            parse_with(&["--pod-security-standard=lenient"])
                .is_err_and(|e| e.to_string().contains("--pod-security-standard")),
            "only the three Pod Security levels are accepted"
        );
        assert!(
            parse_with(&["--cleanup-backoff-limit=-1"])
                .is_err_and(|e| e.to_string().contains("--cleanup-backoff-limit")),
            "a negative backoff limit is refused"
        );
    }

    #[test]
    fn extra_values_may_not_replace_the_storage_node_pin() {
        let dir = std::env::temp_dir().join(format!("extra-values-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (pinned, other) = (dir.join("pinned.yaml"), dir.join("other.yaml"));
        let affinity = "controlPlane:\n  statefulSet:\n    scheduling:\n      affinity: {}\n";
        std::fs::write(&pinned, affinity).expect("write");
        std::fs::write(
            &other,
            "controlPlane:\n  statefulSet:\n    scheduling:\n      nodeSelector: {a: b}\n",
        )
        .expect("write");
        let with = |file: &std::path::Path| {
            parse_with(&["--vcluster-extra-values", file.to_str().expect("path")])
                .expect("flags")
                .check()
        };
        let refused = with(&pinned).expect_err("an affinity is refused");
        assert!(
            refused.to_string().contains("scheduling.affinity"),
            "{refused}"
        );
        with(&other).expect("a nodeSelector is fine");
        let inits = dir.join("inits.yaml");
        let text = "controlPlane:\n  statefulSet:\n    initContainers: [{name: x}]\n";
        std::fs::write(&inits, text).expect("write");
        let refused = with(&inits).expect_err("init containers are refused");
        assert!(
            refused.to_string().contains("statefulSet.initContainers"),
            "{refused}"
        );
        // The syncer's ServiceAccount, as the values name it, is what the policy lets through.
        let renamed = dir.join("renamed.yaml");
        let account = |name: &str| {
            let text = format!(
                "controlPlane:\n  advanced:\n    serviceAccount:\n      name: \"{name}\"\n"
            );
            std::fs::write(&renamed, text).expect("write");
            let args = parse_with(&["--vcluster-extra-values", renamed.to_str().expect("path")]);
            let args = args.expect("flags");
            args.check()
                .map(|()| args.settings("0.37.3".into()).syncer_account)
        };
        assert_eq!(account("syncer.a").expect("a name"), "syncer.a");
        account("x' || true || 'y").expect_err("no ServiceAccount name");
        let _ = std::fs::remove_dir_all(dir);
    }
}
