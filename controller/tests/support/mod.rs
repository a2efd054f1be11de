//! Shared by the controller's end-to-end tests and its benchmark: the controller as a process,
//! and the fixture around it (the stand-in vCluster chart, named a stand-in because the real
//! chart cannot be fetched here, and a second API server that stands for the vCluster's inside).
//!
//! A controller that installs (`--install-platform=true`) runs inside the real node's network
//! namespace, where its install's clients are: it reaches the host API server on
//! `https://127.0.0.1:6443` there ([`Shared::node_kubeconfig`]), each vCluster through a relay on
//! the node's address ([`installing_fixture`]) and the npm registry through another
//! ([`registry_in_node`]); its operations port is read from that namespace too.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use e2e::control_plane::{ADMIN_USER, free_port, plain_get};
use e2e::node_net::{NODE_IP, NetnsHandle, Relay};
use e2e::shared::Shared;
use e2e::standin_vcluster::StandInSyncer;
use e2e::{ControlPlane, Options};
use serde_json::Value;

/// A controller process; killed on drop (its log printed when a test fails).
pub struct Controller {
    /// The process.
    pub child: Child,
    log: PathBuf,
    ops_port: u16,
    /// The real node's network namespace it runs in (an installing controller).
    netns: Option<NetnsHandle>,
}

impl Controller {
    /// Starts the controller binary against `cluster` with the fixture's chart and values. An
    /// installing controller (`--install-platform=true`) on a cluster with a real node runs the
    /// platform program in install pods there, as the chart ships it (`--install-image`, the
    /// operator image the node imported; the state a hostPath of the test's folder).
    pub fn start(cluster: &Shared, fixture: &Fixture, extra: &[&str]) -> Self {
        let ours = std::path::Path::new(env!("CARGO_BIN_EXE_controller"));
        Self::spawn_binary(ours, cluster, fixture, extra, true)
    }

    /// As [`Controller::start`], watching every namespace: only for a process that has the API
    /// server to itself (the benchmarks). `binary`: another build of the controller to run
    /// instead of this workspace's.
    pub fn start_watching_all(
        binary: Option<&std::path::Path>,
        cluster: &Shared,
        fixture: &Fixture,
        extra: &[&str],
    ) -> Self {
        let ours = std::path::Path::new(env!("CARGO_BIN_EXE_controller"));
        Self::spawn_binary(binary.unwrap_or(ours), cluster, fixture, extra, false)
    }

    /// As [`Controller::start`], running `binary` (another build of the controller, such as a
    /// benchmark's baseline) instead of this workspace's.
    #[allow(dead_code)]
    pub fn start_binary(
        binary: &std::path::Path,
        cluster: &Shared,
        fixture: &Fixture,
        extra: &[&str],
    ) -> Self {
        Self::spawn_binary(binary, cluster, fixture, extra, true)
    }

    /// Starts the controller `binary` with the fixture's chart; `scoped`: it must watch one
    /// namespace (`--watch-namespace`).
    fn spawn_binary(
        binary: &std::path::Path,
        cluster: &Shared,
        fixture: &Fixture,
        extra: &[&str],
        scoped: bool,
    ) -> Self {
        let chart = (fixture.chart.as_path(), fixture.digest.as_str());
        // Tests share one API server: a controller that watched every namespace would reconcile
        // the instances of the tests running beside it (with other flags), and each test would
        // see a mix of both controllers' work.
        let watched = extra
            .iter()
            .position(|a| *a == "--watch-namespace")
            .and_then(|i| extra.get(i + 1));
        assert!(
            !scoped || watched.is_some(),
            "start the controller with --watch-namespace <the test's namespace>"
        );
        match watched {
            Some(namespace) if scoped => fixture.syncer.serve(namespace),
            _ => fixture.syncer.serve_all(),
        }
        // The installer runs only in tests that ask for it (`--install-platform=true`); the
        // others stop at Installing, as the provisioning path did before it.
        let installs = extra.contains(&"--install-platform=true");
        let netns = installs.then(|| node_netns(cluster, fixture));
        let ops_port = free_port().expect("port");
        let log = fixture.dir.join(format!("controller-{ops_port}.log"));
        let file = std::fs::File::create(&log).expect("log");
        let mut cmd = Command::new(binary);
        // The installer's tools: the Pulumi CLI and its Node.js language host and dynamic
        // provider plugin (built from Go modules into the tool cache), node and npm.
        let tools = e2e::tools::Tools::locate().expect("tools");
        let bin = tools.bin("pulumi").parent().expect("bin").to_path_buf();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path)
            .arg("--pulumi-binary")
            .arg(tools.bin("pulumi"));
        // The cleanup Jobs and the control planes' storage-owner init containers run the
        // operator image: on a real node, the image built from the Dockerfile, imported by
        // digest; without one (KWOK), an image no container is ever started from.
        if !extra.iter().any(|a| a.starts_with("--cleanup-image")) {
            let image = cluster.operator_image.as_deref();
            cmd.arg(format!(
                "--cleanup-image={}",
                image.unwrap_or(e2e::chart::TEST_IMAGE)
            ));
        }
        if !extra.contains(&"--passphrase-file") {
            cmd.arg("--passphrase-file").arg(&fixture.passphrase);
        }
        let kubeconfig = match &netns {
            None => {
                cmd.arg("--install-platform=false");
                cluster.kubeconfig.clone()
            }
            Some(netns) => {
                if !extra.contains(&"--npm-registry") {
                    cmd.args(["--npm-registry", &registry_in_node(cluster, netns)]);
                }
                // Install pods on the real node, their state the test's folder (a hostPath).
                let image = cluster.operator_image.as_deref();
                let chosen = extra.iter().any(|a| a.starts_with("--install-image"));
                if let Some(image) = image.filter(|_| !chosen) {
                    install_account(cluster, &fixture.operator_ns);
                    cmd.arg(format!("--install-image={image}"));
                    cmd.arg(format!("--install-node={}", e2e::real_node::NODE_NAME));
                }
                netns.enter_on_spawn(&mut cmd);
                cluster
                    .node_kubeconfig
                    .clone()
                    .expect("the node's kubeconfig")
            }
        };
        cmd.env("KUBECONFIG", kubeconfig)
            .args(["--metrics-bind-address", &format!("127.0.0.1:{ops_port}")])
            // Plain HTTP: the tests read /metrics directly (e2e/tests/chart_install.rs tests
            // the secure port).
            .arg("--metrics-secure=false")
            .args(["--namespace", &fixture.operator_ns])
            .args(["--operator-user", ADMIN_USER])
            .args(if extra.iter().any(|a| a.starts_with("--target-poll")) {
                &[][..]
            } else {
                &["--target-poll", "1s"][..]
            })
            .arg("--state-dir")
            .arg(fixture.dir.join("state"))
            .arg("--storage-root-base")
            .arg(fixture.dir.join("storage"))
            .arg("--vcluster-chart")
            .arg(chart.0)
            .args(["--vcluster-chart-sha256", chart.1])
            .arg("--vcluster-extra-values")
            .arg(&fixture.values)
            .args(if extra.contains(&"--helm-binary") {
                vec![]
            } else {
                vec![
                    "--helm-binary".to_string(),
                    cluster.helm.display().to_string(),
                ]
            })
            .args(if extra.contains(&"--log-level") {
                &[][..]
            } else {
                &["--log-level", "info,controller=debug"][..]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file);
        e2e::process::die_with_parent(&mut cmd);
        Controller {
            child: cmd.spawn().expect("controller starts"),
            log,
            ops_port,
            netns,
        }
    }

    /// A plain GET of `path` on its operations port (from the node's network namespace where it
    /// runs there): the status code and the whole response text.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        match &self.netns {
            Some(netns) => netns.plain_get(self.ops_port, path).await,
            None => plain_get(self.ops_port, path).await,
        }
    }

    /// Its `/metrics` text (empty when it does not answer).
    pub async fn metrics(&self) -> String {
        self.get("/metrics")
            .await
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    /// The sum of every sample of metric `name` (all label sets).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum()
    }

    /// The sum of the samples of metric `name` (exactly that name) whose labels contain
    /// `label` (such as `tool="npm"`).
    #[allow(dead_code)]
    pub async fn metric_with(&self, name: &str, label: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| l.contains(label))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the log if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the controller exited with {status}:\n{}", self.log());
        }
    }

    /// The operations port (in the node's network namespace for an installing controller: read
    /// it with [`Controller::get`]).
    pub fn ops_port(&self) -> u16 {
        self.ops_port
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        e2e::process::terminate(&mut self.child, Duration::from_secs(10));
        if std::thread::panicking() {
            eprintln!(
                "--- controller log {} ---\n{}",
                self.log.display(),
                self.log()
            );
        }
    }
}

/// The real node's network namespace, where an installing controller runs.
fn node_netns(cluster: &Shared, fixture: &Fixture) -> NetnsHandle {
    let name = cluster.node_netns.as_deref().unwrap_or_else(|| {
        panic!(
            "an installing controller (--install-platform=true) runs in the real node's network \
             namespace: start the cluster with a real node (e2e::shared_with_real_node(), \
             Options::real_node_for_jobs())"
        )
    });
    assert!(
        fixture.inside_relay.is_some(),
        "an installing controller reaches the vCluster through a relay into the node's network \
         namespace: make the fixture with support::installing_fixture"
    );
    NetnsHandle::open(name).expect("the node's network namespace")
}

/// The install pods' ServiceAccount `platform-operator-install` in `namespace` (no permissions),
/// as the chart creates it.
pub fn install_account(cluster: &Shared, namespace: &str) {
    let account = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: platform-operator-install}\nautomountServiceAccountToken: false\n";
    let apply = ["-n", namespace, "apply", "--server-side", "-f", "-"];
    cluster
        .kubectl_ok(&apply, Some(account))
        .expect("the install pods' ServiceAccount");
}

/// The relays of the shared npm registry into real nodes' network namespaces, by namespace name.
static REGISTRY_RELAYS: Mutex<Vec<(String, Relay)>> = Mutex::new(Vec::new());

/// The shared npm registry as the real node's namespace `netns` (that of `cluster`) reaches it:
/// `http://10.254.0.2:<port>/`, a relay opened once per process and node (closed when the
/// process exits; those into namespaces that are gone are closed at the next call).
pub fn registry_in_node(cluster: &Shared, netns: &NetnsHandle) -> String {
    let name = cluster.node_netns.clone().expect("the node's namespace");
    let registry = e2e::npm::shared().expect("npm registry");
    let mut relays = REGISTRY_RELAYS
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    relays.retain(|(n, _)| Path::new("/run/netns").join(n).exists());
    let port = match relays.iter().find(|(n, _)| *n == name) {
        Some((_, relay)) => relay.port(),
        None => {
            let upstream = registry.port().expect("the registry's port");
            let relay = Relay::open(netns, "npm-relay", 0, upstream).expect("relay the registry");
            let port = relay.port();
            relays.push((name, relay));
            port
        }
    };
    format!("http://{NODE_IP}:{port}/")
}

/// The stand-in chart, its digest, the inner API server and the stand-in syncer in front of it.
pub struct Fixture {
    /// Scratch folder (state, storage, logs).
    pub dir: PathBuf,
    /// The packaged stand-in chart.
    pub chart: PathBuf,
    /// Its digest.
    pub digest: String,
    /// Values pointing the stand-in at the inner API server.
    pub values: PathBuf,
    /// The operator's namespace.
    pub operator_ns: String,
    /// The passphrase file the controller reads.
    pub passphrase: PathBuf,
    /// The stand-in vCluster syncer (certificate, exported kubeconfig, NetworkPolicy sync);
    /// stopped before the inner API server.
    pub syncer: StandInSyncer,
    /// The inner (vCluster) API server.
    pub inner: ControlPlane,
    /// For an installing fixture ([`installing_fixture`]): the relay from the real node's address
    /// to the inner API server, the server its exported kubeconfigs name.
    pub inside_relay: Option<Relay>,
}

/// A packaged stand-in chart and its digest (`sha256:<hex>`).
pub fn chart(cluster: &Shared, dir: &std::path::Path, version: &str) -> (PathBuf, String) {
    let chart = e2e::standin_vcluster::package_chart(&cluster.helm, dir, version)
        .expect("helm package the stand-in chart");
    let digest = format!(
        "sha256:{}",
        controller::chart::sha256_file(&chart).expect("digest")
    );
    (chart, digest)
}

/// Packages the stand-in chart, starts the inner API server and the stand-in syncer in front of
/// it, and writes the (empty) extra values. The exported kubeconfigs name the inner API server on
/// the machine's loopback, where controllers that do not install run.
pub async fn fixture(cluster: &Shared, name: &str) -> Fixture {
    fixture_for(cluster, name, e2e::standin_vcluster::SNI_SLOTS).await
}

/// As [`fixture`], for up to `instances` vClusters serving at once.
pub async fn fixture_for(cluster: &Shared, name: &str, instances: usize) -> Fixture {
    make_fixture(cluster, name, instances, false).await
}

/// As [`fixture`], for a controller that installs: the inner API server is relayed into the
/// real node's network namespace (`cluster` must have a real node), and the exported kubeconfigs
/// name that relay, `https://10.254.0.2:<port>` with the same `tls-server-name`, which the
/// controller there and the pods reach alike.
pub async fn installing_fixture(cluster: &Shared, name: &str) -> Fixture {
    installing_fixture_for(cluster, name, e2e::standin_vcluster::SNI_SLOTS).await
}

/// As [`installing_fixture`], for up to `instances` vClusters serving at once.
#[allow(dead_code)]
pub async fn installing_fixture_for(cluster: &Shared, name: &str, instances: usize) -> Fixture {
    make_fixture(cluster, name, instances, true).await
}

async fn make_fixture(cluster: &Shared, name: &str, instances: usize, installs: bool) -> Fixture {
    let dir =
        e2e::control_plane::base_dir().join(format!("controller-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (chart, digest) = chart(cluster, &dir, e2e::standin_vcluster::CHART_VERSION);
    let inner = ControlPlane::start(
        Options::new("vcluster-inside")
            .standin_vcluster()
            .sni_slots(instances),
    )
    .await
    .expect("inner API server");
    let inside_relay = installs.then(|| {
        let netns = cluster
            .node_netns
            .as_deref()
            .unwrap_or_else(|| panic!("an installing fixture needs a cluster with a real node"));
        let netns = NetnsHandle::open(netns).expect("the node's network namespace");
        Relay::open(&netns, "vcluster-relay", 0, inner.port()).expect("relay the inner API server")
    });
    let advertised = inside_relay
        .as_ref()
        .map(|r| format!("https://{NODE_IP}:{}", r.port()));
    let syncer = StandInSyncer::start_advertising(&cluster.kubeconfig, &inner, advertised)
        .expect("stand-in syncer");
    // Other tests' vClusters on the shared API server are not this fixture's: the syncer serves
    // the namespaces its controllers watch (added as each starts).
    syncer.serve_only(&[]);
    // --vcluster-extra-values is exercised, with nothing to add: the stand-in syncer, like
    // vCluster, exports the kubeconfig itself.
    let values = dir.join("standin-values.yaml");
    std::fs::write(&values, "{}\n").expect("values");
    let operator_ns = cluster
        .create_namespace("operator", &[])
        .expect("namespace");
    let passphrase = dir.join("passphrase");
    std::fs::write(
        &passphrase,
        format!("test-passphrase-{}", std::process::id()),
    )
    .expect("passphrase");
    Fixture {
        passphrase,
        dir,
        chart,
        digest,
        values,
        operator_ns,
        syncer,
        inner,
        inside_relay,
    }
}

/// `kubectl ... -o json`, or `None` when it fails (not found).
/// Removes instance `ns/name`'s finalizers by hand (what a person does when the controller may
/// not finish a deletion), so that a shared control plane keeps no instance stuck in deletion.
pub fn release_finalizer(cluster: &Shared, ns: &str, name: &str) {
    let patch = r#"{"metadata":{"finalizers":null}}"#;
    cluster
        .kubectl_ok(
            &["-n", ns, "patch", "pi", name, "--type=merge", "-p", patch],
            None,
        )
        .expect("release the finalizer");
}

pub fn get(cluster: &Shared, args: &[&str]) -> Option<Value> {
    let mut cmd = cluster.kubectl();
    cmd.args(args).args(["-o", "json"]);
    let out = e2e::cmd::run(cmd, None).expect("kubectl");
    out.success
        .then(|| serde_json::from_str(&out.stdout).expect("json"))
}

/// A condition's status and reason.
pub fn condition(pi: &Value, type_: &str) -> Option<(String, String)> {
    pi["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// Polls `check` until it yields, failing with the controller's log after `limit`.
pub async fn wait_for<T>(
    what: &str,
    limit: Duration,
    controller: &Controller,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n--- controller log ---\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Prints a benchmark's gate line: `gate <name>: <figure> <= <limit>: ok|over` (benchmarks assert
/// nothing; the line says whether the figure meets its gate).
pub fn gate(name: &str, figure: f64, limit: f64, unit: &str) {
    let verdict = if figure <= limit { "ok" } else { "over" };
    println!("gate {name}: {figure:.2}{unit} <= {limit}{unit}: {verdict}");
}

/// Waits until instance `name` has condition `type_` at `status` with `reason`; the instance.
/// Fails at once if the instance is gone (the condition can no longer come).
#[allow(dead_code)]
pub async fn reaches(
    (cluster, controller): (&Shared, &Controller),
    (ns, name): (&str, &str),
    (type_, status, reason): (&str, &str, &str),
    limit: Duration,
) -> Value {
    wait_for(
        &format!("{name}: {type_}={status} {reason}"),
        limit,
        controller,
        || {
            let pi = get(cluster, &["-n", ns, "get", "pi", name]);
            assert!(pi.is_some(), "{name} is gone");
            let pi = pi?;
            (condition(&pi, type_) == Some((status.into(), reason.into()))).then_some(pi)
        },
    )
    .await
}

/// What the Argo CD health check `docs/argocd-health.lua` says of `pi` (its status and message),
/// run by a real Lua interpreter (Debian's `lua5.4`, which `e2e/run-tests.sh` installs) with
/// `obj` as Argo CD passes it: the object as a Lua table.
pub fn argo_health(pi: &Value) -> (String, String) {
    let script = e2e::repo_root().join("docs/argocd-health.lua");
    let program = format!(
        "obj = {}\nlocal hs = dofile({})\nio.write(hs.status, '\\n', hs.message or '')\n",
        lua(pi),
        lua(&Value::String(script.display().to_string()))
    );
    let lua = ["lua5.4", "lua"]
        .into_iter()
        .find(|l| Command::new(l).arg("-v").output().is_ok())
        .expect("a Lua interpreter: apt-get install lua5.4 (e2e/run-tests.sh does)");
    let mut cmd = Command::new(lua);
    cmd.arg("-");
    let out = e2e::cmd::run(cmd, Some(&program)).expect("lua runs");
    let out = out.ok("the Argo CD health check").expect("the check runs");
    let (status, message) = out.split_once('\n').unwrap_or((&out, ""));
    (status.to_string(), message.to_string())
}

/// `v` as a Lua expression: objects and arrays as tables, strings with every byte outside
/// printable ASCII (and `"` and `\`) escaped.
fn lua(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let escaped = s.bytes().map(|b| match b {
                b'"' | b'\\' | ..b' ' | 0x7f.. => format!("\\{b:03}"),
                _ => char::from(b).to_string(),
            });
            format!("\"{}\"", escaped.collect::<String>())
        }
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua).collect::<Vec<_>>().join(",")
        ),
        Value::Object(fields) => {
            let fields = fields
                .iter()
                .map(|(k, v)| format!("[{}]={}", lua(&Value::String(k.clone())), lua(v)));
            format!("{{{}}}", fields.collect::<Vec<_>>().join(","))
        }
    }
}

/// The stand-in control plane for instance `one` of a new namespace, serving: the
/// namespace, the controller and the instance's host namespace.
pub async fn serving(cluster: &Shared, fx: &Fixture) -> (String, Controller, String) {
    cluster.install_crd().expect("CRD");
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let pi = format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: one, namespace: {team} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: Delete\n"
    );
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&pi))
        .expect("apply");
    let controller = Controller::start(cluster, fx, &["--watch-namespace", &team]);
    let pi = reaches((cluster, &controller), (&team, "one"), READY, LIMIT).await;
    let host = pi["status"]["hostNamespace"].as_str().expect("host");
    let host = host.to_string();
    (team, controller, host)
}

/// The condition of a vCluster that serves.
pub const READY: (&str, &str, &str) = ("VClusterReady", "True", "VClusterServing");
/// How long the stand-in control plane takes at most to serve, or to roll out.
pub const LIMIT: Duration = Duration::from_secs(120);
