//! The Helm chart on a real control plane (one per test binary; the tests take turns, since the
//! chart installs once per cluster):
//!
//! - `--dry-run=server` renders with `lookup` and creates nothing; a client-side dry run fails
//!   with the passphrase rule; `helm install` into a namespace that enforces Pod Security
//!   `restricted` (the pods are admitted); the real webhook, run as a process under the chart's
//!   webhook ServiceAccount, fills the caBundle and `helm upgrade` keeps it and the passphrase;
//!   `helm uninstall` keeps the CRD, the claim and the Secret; a second install adopts them.
//! - With `rbac.clusterAdmin=false`, the controller and the webhook run as processes with the
//!   chart's own arguments under the chart's ServiceAccounts (tokens from the TokenRequest API):
//!   the webhook defaults and validates an instance, the controller provisions it with the
//!   **stand-in** vCluster chart and installs the **stand-in** `@di-framework/platform` (the real
//!   ones cannot be fetched here) from a local npm registry in install pods on the real node,
//!   restores a deleted `service/vcluster`, and deletes it with `deletionPolicy: Delete`. Any
//!   `forbidden` in either log, and any npm, node or Pulumi process in the controller's process
//!   tree, fails the test.
//!   Both serve `/metrics` securely (the chart's default): 401 without or with a bad token, 403
//!   for a ServiceAccount without platform-operator-metrics-reader; a real Prometheus (Debian's
//!   package) scrapes both over HTTPS with a reader's token, and the key series, `promtool check
//!   metrics`, the dashboard's queries and the chart's alert rules are checked through it.
//!
//! The chart's Deployments never run the binaries here (KWOK runs no containers, and the chart's
//! digest is one no image has): the processes run on the host with the flags the chart rendered,
//! and only paths and listen addresses changed for the host. The `rbac.clusterAdmin=false` test's
//! control plane has a real node, where the vCluster's control plane pod, the install pods and
//! the cleanup Job run (the chart's `cleanupImage` and the controller's `--install-image` are the
//! operator image built from the Dockerfile, its `storageRootBase` a folder of the test). Its
//! controller runs in the node's network namespace, as in its pod: it reaches the API server
//! through the node's relay, the stand-in vCluster and the npm registry (as its install pods do)
//! through relays on the node's address, and the tests and Prometheus reach its operations port
//! through a door on the machine's loopback (`node_net::ReverseRelay`). Its install pods mount
//! `--state-dir` from the node (no `--install-state-claim`; the node is this machine).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e::chart::{
    Helm, Rendered, TEST_DIGEST, chart_dir, operator_binaries, service_account_kubeconfig,
    service_account_node_kubeconfig,
};
use e2e::control_plane::free_port;
use e2e::node_net::{NODE_IP, NetnsHandle, Relay, ReverseRelay};
use e2e::shared::Shared;
use e2e::standin_vcluster::StandInSyncer;
use e2e::{ControlPlane, Options};
use serde_json::Value;

/// The chart installs once per cluster: its tests take turns on the shared control plane.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const RELEASE: &str = "platform-operator";

fn cluster() -> Shared {
    e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"))
}

fn digest_set() -> String {
    format!("image.digest={TEST_DIGEST}")
}

/// `helm <verb> platform-operator <chart> -n <ns> --set ...`.
fn helm_release(
    helm: &Helm,
    verb: &str,
    ns: &str,
    sets: &[&str],
    extra: &[&str],
) -> e2e::cmd::Outcome {
    let chart = chart_dir().display().to_string();
    let mut args = vec![verb, RELEASE, &chart, "-n", ns];
    let digest = digest_set();
    for set in std::iter::once(&digest.as_str()).chain(sets) {
        args.push("--set");
        args.push(set);
    }
    args.extend_from_slice(extra);
    helm.run(&args).expect("helm runs")
}

/// Uninstalls the release when dropped, so a failed test leaves the cluster to the next one.
struct Installed {
    helm: Helm,
    ns: String,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = self
            .helm
            .run(&["uninstall", RELEASE, "-n", &self.ns, "--wait=false"]);
    }
}

fn get(cluster: &Shared, args: &[&str]) -> Option<Value> {
    let mut cmd = cluster.kubectl();
    cmd.args(args).args(["-o", "json"]);
    let out = e2e::cmd::run(cmd, None).expect("kubectl");
    out.success
        .then(|| serde_json::from_str(&out.stdout).expect("kubectl prints JSON"))
}

fn uid(object: &Value) -> String {
    object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn passphrase(cluster: &Shared, ns: &str) -> (String, String) {
    let secret = get(
        cluster,
        &["-n", ns, "get", "secret", "platform-operator-passphrase"],
    )
    .expect("the passphrase Secret exists");
    let data = secret["data"]["passphrase"]
        .as_str()
        .expect("key passphrase");
    let plain = base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64");
    (uid(&secret), String::from_utf8(plain).expect("utf-8"))
}

fn ca_bundle(cluster: &Shared, kind: &str) -> String {
    cluster
        .kubectl_ok(
            &[
                "get",
                kind,
                "platform-operator",
                "-o",
                "jsonpath={.webhooks[0].clientConfig.caBundle}",
            ],
            None,
        )
        .unwrap_or_default()
}

/// Polls `check` until it yields; on timeout fails with `show()` (what was last seen) and the
/// processes' logs.
async fn eventually<T>(
    what: &str,
    limit: Duration,
    logs: &[&Proc],
    show: impl Fn() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        for p in logs {
            p.assert_running();
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = logs.iter().map(|p| p.describe()).collect();
            panic!(
                "timed out after {limit:?} waiting for {what}\n{}\n{}",
                show(),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// An operator binary run as a process; stopped on drop (its log printed if the test fails).
/// Its operations port speaks HTTPS with the certificate of `metrics_ca` (the chart's default
/// `--metrics-secure=true`, with `--metrics-cert-dir`).
struct Proc {
    name: &'static str,
    child: std::cell::RefCell<Child>,
    log: PathBuf,
    /// The operations port on the machine's loopback (a reverse relay's for a process in the
    /// real node's network namespace).
    ops_port: u16,
    metrics_ca: String,
    /// For a process in the real node's network namespace: the door from the machine's
    /// loopback to its operations port there.
    _door: Option<ReverseRelay>,
}

impl Proc {
    /// Starts `bin`, listening on `ops_port` (with the certificate of `metrics_ca`) on the
    /// loopback of the namespace it runs in: the machine's, or `netns`, whose port is then
    /// carried to a free one on the machine's loopback ([`ReverseRelay`]).
    fn start(
        name: &'static str,
        (bin, args): (&Path, &[String]),
        env: &[(&str, String)],
        log: PathBuf,
        (ops_port, metrics_ca): (u16, String),
        netns: Option<&NetnsHandle>,
    ) -> Self {
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        e2e::process::die_with_parent(&mut cmd);
        let door = netns.map(|netns| {
            netns.enter_on_spawn(&mut cmd);
            ReverseRelay::open(netns, "ops-door", ops_port).expect("a door to the ops port")
        });
        let child = cmd.spawn().unwrap_or_else(|e| panic!("{name} starts: {e}"));
        Proc {
            name,
            child: std::cell::RefCell::new(child),
            log,
            ops_port: door.as_ref().map_or(ops_port, ReverseRelay::port),
            metrics_ca,
            _door: door,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn describe(&self) -> String {
        format!(
            "--- {} log {} ---\n{}",
            self.name,
            self.log.display(),
            self.log_text()
        )
    }

    fn assert_running(&self) {
        if let Ok(Some(status)) = self.child.borrow_mut().try_wait() {
            panic!("{} exited with {status}\n{}", self.name, self.describe());
        }
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(self.ops_get("/readyz", None).await, Ok((200, _))) {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "{} not ready\n{}",
                self.name,
                self.describe()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// GETs `path` from the secure operations port, with `token` as bearer token.
    async fn ops_get(
        &self,
        path: &str,
        token: Option<&str>,
    ) -> Result<(u16, String), e2e::HarnessError> {
        e2e::prometheus::secure_get(self.ops_port, &self.metrics_ca, path, token).await
    }

    /// `/metrics` as `token` sees it; fails unless it answers 200.
    async fn scrape(&self, token: &str) -> String {
        match self.ops_get("/metrics", Some(token)).await {
            Ok((200, body)) => body,
            other => panic!("{} /metrics: {other:?}\n{}", self.name, self.describe()),
        }
    }

    /// Fails when the process was refused anything by the API server.
    fn assert_never_forbidden(&self) {
        let log = self.log_text();
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
            .collect();
        assert!(
            refused.is_empty(),
            "{} was refused by RBAC:\n{}",
            self.name,
            refused.join("\n")
        );
    }

    fn stop(&self) {
        e2e::process::terminate(&mut self.child.borrow_mut(), Duration::from_secs(10));
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("{}", self.describe());
        }
    }
}

/// The arguments of Deployment `name` as rendered, each `--flag=...` in `remove` dropped, each
/// in `replace` swapped for the value given, and `add` appended.
fn host_args(
    rendered: &Rendered,
    deployment: &str,
    (remove, replace): (&[&str], &[(&str, String)]),
    add: &[String],
) -> Vec<String> {
    let mut args = rendered.args(deployment);
    for flag in remove {
        let prefix = format!("{flag}=");
        let before = args.len();
        args.retain(|a| !a.starts_with(&prefix));
        assert!(
            args.len() < before,
            "the chart does not pass {flag} to {deployment}: {args:?}"
        );
    }
    for (flag, value) in replace {
        let prefix = format!("{flag}=");
        let at = args
            .iter()
            .position(|a| a.starts_with(&prefix))
            .unwrap_or_else(|| panic!("the chart does not pass {flag} to {deployment}: {args:?}"));
        args[at] = format!("{flag}={value}");
    }
    args.extend_from_slice(add);
    args
}

/// The manifest of the installed release.
fn release_manifest(helm: &Helm, ns: &str) -> Rendered {
    let manifest = helm
        .ok(&["get", "manifest", RELEASE, "-n", ns])
        .expect("helm get manifest");
    Rendered::parse(&manifest).expect("manifest")
}

fn scratch(name: &str) -> PathBuf {
    let dir = e2e::control_plane::base_dir().join(format!("chart-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// Starts the real webhook with the chart's arguments under its ServiceAccount, listening on
/// loopback (the certificate also names 127.0.0.1 for a URL-configured webhook).
fn start_webhook(cluster: &Shared, helm: &Helm, ns: &str, dir: &Path, admission_port: u16) -> Proc {
    let (_, webhook_bin) = operator_binaries().expect("operator binaries");
    let kubeconfig = dir.join("webhook.kubeconfig");
    service_account_kubeconfig(cluster, ns, "platform-operator-webhook", &kubeconfig)
        .expect("webhook token");
    let ops_port = free_port().expect("port");
    let rendered = release_manifest(helm, ns);
    // The chart serves metrics securely by default; a certificate for 127.0.0.1 is mounted the
    // way metrics.certSecret would be, so that the tests (and Prometheus) verify it.
    let certs = dir.join("metrics-tls");
    let metrics_ca = e2e::prometheus::serving_certificate(&certs).expect("metrics certificate");
    let args = host_args(
        &rendered,
        "platform-operator-webhook",
        (
            &[],
            &[
                (
                    "--admission-bind-address",
                    format!("127.0.0.1:{admission_port}"),
                ),
                ("--metrics-bind-address", format!("127.0.0.1:{ops_port}")),
            ],
        ),
        &[
            "--extra-san=127.0.0.1".into(),
            "--log-level=info,webhook=debug".into(),
            format!("--metrics-cert-dir={}", certs.display()),
        ],
    );
    Proc::start(
        "webhook",
        (&webhook_bin, &args),
        &[
            ("KUBECONFIG", kubeconfig.display().to_string()),
            ("POD_NAMESPACE", ns.to_string()),
            ("POD_NAME", "platform-operator-webhook-e2e".to_string()),
        ],
        dir.join(format!("webhook-{ops_port}.log")),
        (ops_port, metrics_ca),
        None,
    )
}

#[tokio::test]
async fn install_upgrade_uninstall_and_install_again_keep_the_crd_claim_and_passphrase() {
    let _turn = SERIAL.lock().await;
    let cluster = cluster();
    let helm = Helm::for_cluster(&cluster);
    let ns = cluster
        .create_namespace(
            "po-lifecycle",
            &[("pod-security.kubernetes.io/enforce", "restricted")],
        )
        .expect("namespace");
    let dir = scratch("lifecycle");

    // --dry-run=server sees the cluster: it renders (generating a passphrase) and creates nothing.
    let dry = helm_release(&helm, "install", &ns, &[], &["--dry-run=server"]);
    assert!(dry.success, "{}", dry.stderr);
    assert!(
        dry.stdout.contains("name: platform-operator-passphrase"),
        "{}",
        dry.stdout
    );
    assert!(
        get(
            &cluster,
            &["-n", &ns, "get", "secret", "platform-operator-passphrase"]
        )
        .is_none()
    );
    assert!(
        get(
            &cluster,
            &[
                "-n",
                &ns,
                "get",
                "deployment",
                "platform-operator-controller"
            ]
        )
        .is_none()
    );
    // A client-side dry run cannot look the passphrase up, so it refuses.
    let client = helm_release(&helm, "install", &ns, &[], &["--dry-run=client"]);
    assert!(!client.success);
    assert!(
        client
            .stderr
            .contains("set passphrase.existingSecret=platform-operator-passphrase"),
        "{}",
        client.stderr
    );

    // Install.
    let out = helm_release(&helm, "install", &ns, &[], &[]);
    assert!(out.success, "{}", out.stderr);
    let _installed = Installed {
        helm: helm.clone(),
        ns: ns.clone(),
    };
    let crd = get(
        &cluster,
        &["get", "crd", "platforminstances.platform.di-framework.dev"],
    )
    .expect("the CRD");
    let (secret_uid, first) = passphrase(&cluster, &ns);
    assert_eq!(first.len(), 48, "36 random bytes, base64");
    let claim = get(
        &cluster,
        &["-n", &ns, "get", "pvc", "platform-operator-state"],
    )
    .expect("the claim");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "10Gi");

    // The namespace enforces Pod Security "restricted": the ReplicaSets' pods are admitted.
    for component in ["controller", "webhook"] {
        eventually(
            &format!("a {component} pod"),
            Duration::from_secs(60),
            &[],
            String::new,
            || {
                let pods = get(
                    &cluster,
                    &[
                        "-n",
                        &ns,
                        "get",
                        "pods",
                        "-l",
                        &format!("app.kubernetes.io/component={component}"),
                    ],
                )?;
                pods["items"]
                    .as_array()
                    .filter(|i| !i.is_empty())
                    .map(|_| ())
            },
        )
        .await;
    }

    // The webhook, under the chart's webhook ServiceAccount, fills both caBundles.
    let webhook = start_webhook(&cluster, &helm, &ns, &dir, free_port().expect("port"));
    let bundle = eventually(
        "the caBundle",
        Duration::from_secs(60),
        &[&webhook],
        String::new,
        || {
            let m = ca_bundle(&cluster, "mutatingwebhookconfiguration");
            let v = ca_bundle(&cluster, "validatingwebhookconfiguration");
            (!m.is_empty() && m == v).then_some(m)
        },
    )
    .await;
    webhook.stop();
    webhook.assert_never_forbidden();

    // An upgrade that changes the webhook configurations keeps the caBundle (the webhook is
    // stopped, so nothing puts it back) and the passphrase.
    let out = helm_release(&helm, "upgrade", &ns, &["webhook.timeoutSeconds=9"], &[]);
    assert!(out.success, "{}", out.stderr);
    let validating = get(
        &cluster,
        &["get", "validatingwebhookconfiguration", "platform-operator"],
    )
    .expect("config");
    assert_eq!(
        validating["webhooks"][0]["timeoutSeconds"], 9,
        "the upgrade applied"
    );
    assert_eq!(
        ca_bundle(&cluster, "validatingwebhookconfiguration"),
        bundle
    );
    assert_eq!(ca_bundle(&cluster, "mutatingwebhookconfiguration"), bundle);
    assert_eq!(
        passphrase(&cluster, &ns),
        (secret_uid.clone(), first.clone())
    );
    let out = helm_release(
        &helm,
        "upgrade",
        &ns,
        &["webhook.timeoutSeconds=9", "state.size=10Gi"],
        &[],
    );
    assert!(out.success, "{}", out.stderr);
    assert_eq!(passphrase(&cluster, &ns).1, first, "a second upgrade too");

    // Uninstall keeps the CRD, the claim and the Secret.
    let out = helm
        .run(&["uninstall", RELEASE, "-n", &ns, "--wait"])
        .expect("helm");
    assert!(out.success, "{}", out.stderr);
    for (kind, name) in [
        ("deployment", "platform-operator-controller"),
        ("deployment", "platform-operator-webhook"),
        ("serviceaccount", "platform-operator"),
        ("service", "platform-operator-webhook"),
    ] {
        assert!(
            get(&cluster, &["-n", &ns, "get", kind, name]).is_none(),
            "{kind}/{name} is gone"
        );
    }
    for (kind, name) in [
        ("clusterrole", "platform-operator"),
        ("clusterrolebinding", "platform-operator-cluster-admin"),
        ("validatingwebhookconfiguration", "platform-operator"),
        ("mutatingwebhookconfiguration", "platform-operator"),
    ] {
        assert!(
            get(&cluster, &["get", kind, name]).is_none(),
            "{kind}/{name} is gone"
        );
    }
    let kept = get(
        &cluster,
        &["get", "crd", "platforminstances.platform.di-framework.dev"],
    )
    .expect("the CRD is kept");
    assert_eq!(uid(&kept), uid(&crd));
    let kept = get(
        &cluster,
        &["-n", &ns, "get", "pvc", "platform-operator-state"],
    )
    .expect("the claim is kept");
    assert_eq!(uid(&kept), uid(&claim));
    assert_eq!(
        passphrase(&cluster, &ns),
        (secret_uid.clone(), first.clone()),
        "the Secret is kept"
    );

    // Installing again with the same release name and namespace adopts all three.
    let out = helm_release(&helm, "install", &ns, &[], &[]);
    assert!(out.success, "{}", out.stderr);
    assert_eq!(
        passphrase(&cluster, &ns),
        (secret_uid, first.clone()),
        "same Secret, same passphrase"
    );
    let adopted = get(
        &cluster,
        &["-n", &ns, "get", "pvc", "platform-operator-state"],
    )
    .expect("claim");
    assert_eq!(uid(&adopted), uid(&claim), "same claim");
    assert_eq!(
        adopted["metadata"]["annotations"]["meta.helm.sh/release-name"],
        RELEASE
    );
    let manifest = release_manifest(&helm, &ns);
    assert!(
        manifest
            .find("Secret", "platform-operator-passphrase")
            .is_some()
    );
    assert!(
        manifest
            .find("PersistentVolumeClaim", "platform-operator-state")
            .is_some()
    );

    // A lost passphrase Secret is never replaced by a new passphrase: the upgrade fails until it
    // is restored, and then goes on with the same passphrase.
    let saved = cluster
        .kubectl_ok(
            &[
                "-n",
                &ns,
                "get",
                "secret",
                "platform-operator-passphrase",
                "-o",
                "json",
            ],
            None,
        )
        .expect("the Secret");
    cluster
        .kubectl_ok(
            &[
                "-n",
                &ns,
                "delete",
                "secret",
                "platform-operator-passphrase",
            ],
            None,
        )
        .expect("delete");
    let out = helm_release(&helm, "upgrade", &ns, &[], &[]);
    assert!(
        !out.success,
        "an upgrade without the passphrase Secret must fail"
    );
    assert!(
        out.stderr.contains("Secret")
            && out.stderr.contains(
                "platform-operator-passphrase is missing but the operator's state exists"
            ),
        "{}",
        out.stderr
    );
    let mut restored: Value = serde_json::from_str(&saved).expect("json");
    for field in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
    ] {
        if let Some(meta) = restored["metadata"].as_object_mut() {
            meta.remove(field);
        }
    }
    cluster
        .kubectl_ok(&["create", "-f", "-"], Some(&restored.to_string()))
        .expect("restore the Secret");
    let out = helm_release(&helm, "upgrade", &ns, &[], &[]);
    assert!(out.success, "{}", out.stderr);
    assert_eq!(passphrase(&cluster, &ns).1, first);
    let _ = std::fs::remove_dir_all(dir);
}

fn condition(pi: &Value, type_: &str) -> Option<(String, String)> {
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

/// The stand-in vCluster (`e2e/standin-vcluster`; the real chart cannot be fetched here).
struct StandIn {
    /// The packaged chart.
    chart: PathBuf,
    /// Its digest.
    digest: String,
    /// The (empty) extra values.
    values: PathBuf,
    /// The stand-in syncer, held while the test runs; stopped before the inside API server.
    _syncer: StandInSyncer,
    /// The vCluster's inside: a second API server.
    _inner: ControlPlane,
    /// The door to it from the real node's network namespace, the server its exported
    /// kubeconfigs name.
    _relay: Relay,
}

/// The stand-in vCluster chart, packaged, its digest, (empty) extra values, a second API server
/// (the vCluster's inside) and the stand-in syncer in front of it for the cluster of
/// `host_kubeconfig`, exporting kubeconfigs whose server is a relay from the node's address in
/// `netns` to that API server (`https://10.254.0.2:<port>`, the same `tls-server-name`): where
/// the controller and its install pods reach it.
async fn standin_vcluster(
    helm: &Helm,
    dir: &Path,
    host_kubeconfig: &Path,
    netns: &NetnsHandle,
) -> StandIn {
    let chart =
        e2e::standin_vcluster::package_chart(helm.bin(), dir, e2e::standin_vcluster::CHART_VERSION)
            .expect("helm package");
    let bytes = std::fs::read(&chart).expect("chart archive");
    let digest: String = ring::digest::digest(&ring::digest::SHA256, &bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let inner = ControlPlane::start(Options::new("chart-vcluster-inside").standin_vcluster())
        .await
        .expect("inner API server");
    let relay =
        Relay::open(netns, "vcluster-relay", 0, inner.port()).expect("relay the inner API server");
    let advertised = format!("https://{NODE_IP}:{}", relay.port());
    let syncer = StandInSyncer::start_advertising(host_kubeconfig, &inner, Some(advertised))
        .expect("stand-in syncer");
    let values = dir.join("standin-values.yaml");
    std::fs::write(&values, "{}\n").expect("values");
    StandIn {
        chart,
        digest: format!("sha256:{digest}"),
        values,
        _syncer: syncer,
        _inner: inner,
        _relay: relay,
    }
}

/// Audit every request of every ServiceAccount (metadata only), once per request.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n    userGroups: [\"system:serviceaccounts\"]\n  - level: None\n";

/// Permissions of the ClusterRole platform-operator that this test cannot see used, each with why
/// the operator holds it: `(resource, verb)`, `*` for every verb.
const NOT_SEEN_HERE: &[(&str, &str)] = &[
    // What the vCluster chart's Role grants its syncer (Kubernetes lets Helm create that Role
    // only with permissions the operator holds): the stand-in chart creates the same Role, but
    // no syncer runs under it here. The controller itself lists and watches pods (the control
    // planes' and its install pods) and deletes an ended install pod the garbage collector has
    // not reached yet (a race it may lose to the collector).
    ("pods", "get"),
    ("pods", "create"),
    ("pods", "update"),
    ("pods", "patch"),
    ("pods", "delete"),
    ("pods/attach", "*"),
    ("pods/portforward", "*"),
    ("pods/exec", "*"),
    ("pods/status", "*"),
    ("pods/ephemeralcontainers", "*"),
    ("pods/resize", "*"),
    // The controller reads an install pod's log only when the pod ended without an outcome.
    ("pods/log", "*"),
    ("persistentvolumeclaims", "*"),
    ("endpoints", "*"),
    ("endpointslices", "*"),
    ("events", "*"),
    ("replicasets", "*"),
    ("statefulsets", "*"),
    ("deployments", "list"),
    ("deployments", "watch"),
    ("deployments", "update"),
    ("networkpolicies", "list"),
    ("networkpolicies", "watch"),
    ("networkpolicies", "update"),
    ("networkpolicies", "delete"),
    ("configmaps", "*"),
    ("services", "update"),
    // The chart's ServiceAccount, Role and RoleBinding: Helm creates, reads and deletes them
    // here; it patches them on an upgrade to a new vCluster chart version.
    ("serviceaccounts", "*"),
    ("roles", "*"),
    ("rolebindings", "*"),
    // Helm patches the release's objects when it upgrades the vCluster to a new chart version;
    // the controller scales the control plane to zero first (a patch), only when it exists.
    ("services", "patch"),
    ("deployments", "patch"),
    // PersistentVolumes: read and set to Retain only while an instance whose host namespace has
    // bound volumes is deleted with Retain, which this install never does; exercised in
    // controller/tests/e2e.rs retain_keeps_the_volumes_bound_in_the_host_namespace.
    ("persistentvolumes", "*"),
];

/// `(group, resource[/subresource], verb)` of every request `user` made, from the audit log.
fn used_permissions(
    audit: &Path,
    user: &str,
) -> std::collections::BTreeSet<(String, String, String)> {
    let text = std::fs::read_to_string(audit).expect("audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == user && e["objectRef"].is_object())
        .map(|e| {
            let r = &e["objectRef"];
            let mut resource = r["resource"].as_str().unwrap_or_default().to_string();
            if let Some(sub) = r["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            (
                r["apiGroup"].as_str().unwrap_or_default().to_string(),
                resource,
                e["verb"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// `(namespace, name)` of every Secret request `user` made, from the audit log (name empty for a
/// create or a list).
fn secrets_touched(audit: &Path, user: &str) -> std::collections::BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(audit).expect("audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == user && e["objectRef"]["resource"] == "secrets")
        .map(|e| {
            let r = &e["objectRef"];
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (text(&r["namespace"]), text(&r["name"]))
        })
        .collect()
}

/// `(verb, namespace, name)` of every request `user` made on `resource`, from the audit log (name
/// empty for a create or a list).
fn requests_on(
    audit: &Path,
    user: &str,
    resource: &str,
) -> std::collections::BTreeSet<(String, String, String)> {
    let text = std::fs::read_to_string(audit).expect("audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == user && e["objectRef"]["resource"] == resource)
        .map(|e| {
            let r = &e["objectRef"];
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (text(&e["verb"]), text(&r["namespace"]), text(&r["name"]))
        })
        .collect()
}

/// `(group, resource, verb)` of every rule of the `Kind/name` roles in `rendered`.
fn granted(rendered: &Rendered, roles: &[&str]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for role in roles {
        let (kind, name) = role.split_once('/').expect("Kind/name");
        for rule in rendered.get(kind, name)["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            for group in e2e::chart::strings(&rule["apiGroups"]) {
                for resource in e2e::chart::strings(&rule["resources"]) {
                    for verb in e2e::chart::strings(&rule["verbs"]) {
                        out.push((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    out
}

/// Samples, every 200 ms until `stop` is set, the processes descended from `pid` (the
/// controller: its container's processes); ends with the command lines of those that were the
/// platform program's tools (npm, node, Pulumi), which run only in install pods.
fn watch_for_tools(
    pid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<std::collections::BTreeSet<String>> {
    std::thread::spawn(move || {
        let mut seen = std::collections::BTreeSet::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // Every process's parent, from /proc/<pid>/stat (after the command's closing paren).
            let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| {
                    let child: u32 = entry.file_name().to_str()?.parse().ok()?;
                    let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                    let (_, rest) = stat.rsplit_once(')')?;
                    let parent = rest.split_whitespace().nth(1)?.parse().ok()?;
                    Some((child, parent))
                })
                .collect();
            let mut tree = vec![pid];
            let mut at = 0;
            while let Some(&parent) = tree.get(at) {
                tree.extend(
                    parents
                        .iter()
                        .filter(|(_, p)| *p == parent)
                        .map(|(c, _)| *c),
                );
                at += 1;
            }
            for descendant in &tree[1..] {
                let path = format!("/proc/{descendant}/cmdline");
                let cmdline = std::fs::read(path).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                let tool = cmdline.split(' ').take(2).any(|word| {
                    let file = word.rsplit('/').next().unwrap_or(word);
                    ["npm", "npx", "node", "npm-cli.js"].contains(&file)
                        || file.starts_with("pulumi")
                });
                if tool {
                    seen.insert(cmdline);
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        seen
    })
}

fn scraper_token(cluster: &Shared, ns: &str, account: &str, reader: bool) -> String {
    e2e::prometheus::scraper_token(cluster, ns, account, reader).expect("a scraper's token")
}

/// Starts a real Prometheus on loopback scraping `procs` (webhook, controller) every second over
/// HTTPS, verifying their certificate, with `token` in a file as Prometheus reads it, and
/// evaluating the chart's alerts.
async fn start_prometheus(
    tools: &e2e::prometheus::Tools,
    dir: &Path,
    token: &str,
    procs: &[&Proc],
) -> e2e::prometheus::Server {
    let home = dir.join("prometheus");
    std::fs::create_dir_all(&home).expect("prometheus folder");
    let token_file = home.join("token");
    std::fs::write(&token_file, token).expect("token file");
    let jobs: Vec<(String, u16)> = procs
        .iter()
        .map(|p| (format!("platform-operator-{}", p.name), p.ops_port))
        .collect();
    let config = e2e::prometheus::secure_scrape_config(
        &jobs,
        &dir.join("metrics-tls/ca.crt"),
        &token_file,
        &[chart_dir().join("files/alerts.yaml")],
    );
    let mut server = e2e::prometheus::Server::start(tools, &home, &config).expect("prometheus");
    server.wait_ready().await.expect("prometheus ready");
    server
}

async fn series(prometheus: &e2e::prometheus::Server, expr: &str) -> Vec<Value> {
    prometheus
        .series(expr)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", prometheus.log_text()))
}

/// The key series, with their labels, once an instance is Ready.
async fn ready_series(prometheus: &e2e::prometheus::Server) {
    for (expr, job) in [
        (
            r#"platform_operator_build_info{binary="controller"} == 1"#,
            "controller",
        ),
        (
            r#"platform_operator_build_info{binary="webhook"} == 1"#,
            "webhook",
        ),
        ("platform_operator_controller_leader == 1", "controller"),
        (
            r#"platform_operator_controller_instances{phase="Ready"} == 1"#,
            "controller",
        ),
        (
            r#"platform_operator_controller_instance_conditions{condition="Ready",status="True"} == 1"#,
            "controller",
        ),
        (
            r#"platform_operator_controller_install_duration_seconds_count{operation="install",result="ok"} >= 1"#,
            "controller",
        ),
        (
            r#"platform_operator_controller_tool_duration_seconds_count{tool="pulumi",result="ok"} >= 1"#,
            "controller",
        ),
        (
            r#"platform_operator_controller_helm_duration_seconds_count{operation="install",result="ok"} >= 1"#,
            "controller",
        ),
        (
            r#"platform_operator_webhook_reviews_total{webhook="validate",operation="CREATE",result="denied"} >= 1"#,
            "webhook",
        ),
        (
            r#"platform_operator_webhook_reviews_total{webhook="mutate",operation="CREATE",result="allowed"} >= 1"#,
            "webhook",
        ),
        (
            "platform_operator_webhook_certificate_expiry_timestamp_seconds > time()",
            "webhook",
        ),
    ] {
        let found = series(prometheus, expr).await;
        let labels = &found[0]["metric"];
        assert_eq!(
            labels["job"],
            format!("platform-operator-{job}"),
            "{expr}: {found:?}"
        );
        assert!(
            labels["instance"]
                .as_str()
                .is_some_and(|i| i.starts_with("127.0.0.1:")),
            "{found:?}"
        );
    }
    // The instance's Ready is the only Ready=True, and Stalled is False for it.
    let stalled = series(
        prometheus,
        r#"platform_operator_controller_instance_conditions{condition="Stalled"}"#,
    )
    .await;
    assert!(
        stalled.iter().all(|s| s["metric"]["status"] == "False"),
        "{stalled:?}"
    );
}

/// At the end: both targets up over HTTPS; `promtool check metrics` passes on both endpoints;
/// every dashboard query is accepted by Prometheus and names only metrics the binaries exported
/// (now, or in `families_seen` while the instance existed);
/// every alert rule evaluates without error, and the binaries' health alerts are not firing.
async fn check_prometheus(
    prometheus: &e2e::prometheus::Server,
    tools: &e2e::prometheus::Tools,
    procs: &[&Proc],
    token: &str,
    mut families_seen: Vec<String>,
) {
    let targets = prometheus.targets().await.expect("targets");
    assert_eq!(targets.len(), 2, "{targets:?}");
    for t in &targets {
        assert_eq!(t["health"], "up", "{t}");
        assert!(
            t["scrapeUrl"]
                .as_str()
                .is_some_and(|u| u.starts_with("https://127.0.0.1:")),
            "{t}"
        );
    }
    for p in procs {
        let body = p.scrape(token).await;
        let out = tools
            .promtool(&["check", "metrics"], Some(&body))
            .expect("promtool");
        assert!(
            out.success,
            "promtool check metrics on the {}:\n{}{}",
            p.name, out.stdout, out.stderr
        );
        families_seen.extend(e2e::prometheus::families(&body));
    }
    let families = families_seen;
    let queries = e2e::prometheus::dashboard_queries().expect("dashboard");
    for (title, expr) in &queries {
        prometheus
            .query(expr)
            .await
            .unwrap_or_else(|e| panic!("dashboard panel {title:?}: {e}"));
        for name in e2e::prometheus::metric_names(expr, &families) {
            assert!(
                families.contains(&name),
                "dashboard panel {title:?} uses {name}, which neither binary exported: {families:?}"
            );
        }
    }
    let rules = prometheus.api("/api/v1/rules").await.expect("rules");
    let groups = rules["data"]["groups"].as_array().expect("rule groups");
    assert_eq!(groups.len(), 2, "{rules}");
    for rule in groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
    {
        assert_eq!(rule["health"], "ok", "{rule}");
        if ["PlatformOperatorNoLeader", "PlatformOperatorWebhookDown"]
            .contains(&rule["name"].as_str().unwrap_or(""))
        {
            assert_eq!(rule["state"], "inactive", "{rule}");
        }
    }
}

#[tokio::test]
async fn the_operator_runs_under_the_charts_accounts_with_rbac_cluster_admin_false() {
    let _turn = SERIAL.lock().await;
    // A control plane of its own, with an audit log of every request a ServiceAccount makes and
    // the OwnerReferencesPermissionEnforcement admission plugin of hardened clusters.
    let dir = scratch("rbac");
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY).expect("audit policy");
    let audit = dir.join("audit.log");
    // A real node runs the vCluster's control plane pod, the install pods and the cleanup Job.
    let plane = ControlPlane::start(
        Options::new("chart-rbac")
            .real_node_for_jobs()
            .apiserver_args([
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", audit.display()),
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".to_string(),
            ]),
    )
    .await
    .expect("control plane");
    let cluster = plane.handle();
    let operator_image = cluster.operator_image.clone().expect("the operator image");
    let helm = Helm::for_cluster(&cluster);
    // The controller runs in the real node's network namespace, as in its pod, and each install
    // in an install pod on the node: both reach the npm registry through a relay on the node's
    // address.
    let netns = cluster
        .node_netns
        .as_deref()
        .expect("the real node's namespace");
    let netns = NetnsHandle::open(netns).expect("the node's network namespace");
    let registry = e2e::npm::shared().expect("npm registry");
    let registry_port = registry.port().expect("the registry's port");
    let npm_relay = Relay::open(&netns, "npm-relay", 0, registry_port).expect("relay the registry");
    let registry_url = format!("http://{NODE_IP}:{}/", npm_relay.port());
    let (controller_bin, _) = operator_binaries().expect("operator binaries");
    // The seed: the namespace the cleanup Jobs run in admits privileged pods.
    let ns = cluster
        .create_namespace(
            "po-rbac",
            &[("pod-security.kubernetes.io/enforce", "privileged")],
        )
        .expect("namespace");
    let registry_set = format!("npmRegistry={registry_url}");
    let cleanup_image_set = format!("cleanupImage={operator_image}");
    let storage_set = format!("storageRootBase={}", dir.join("storage").display());
    let out = helm_release(
        &helm,
        "install",
        &ns,
        &[
            "rbac.clusterAdmin=false",
            "targetPoll=1s",
            "webhook.certLifetime=60s",
            "installTimeout=10m",
            &registry_set,
            &cleanup_image_set,
            &storage_set,
        ],
        &[],
    );
    assert!(out.success, "{}", out.stderr);
    let _installed = Installed {
        helm: helm.clone(),
        ns: ns.clone(),
    };
    let rendered = release_manifest(&helm, &ns);
    assert!(
        rendered
            .find("ClusterRoleBinding", "platform-operator-cluster-admin")
            .is_none()
    );

    // The webhook's pods do not run here (the chart's digest is one no image has), so the chart's
    // configurations are pointed at the webhook process; everything else is the chart's.
    let admission_port = free_port().expect("port");
    for (kind, path) in [
        ("mutatingwebhookconfiguration", "mutate"),
        ("validatingwebhookconfiguration", "validate"),
    ] {
        let patch = format!(
            r#"[{{"op":"replace","path":"/webhooks/0/clientConfig","value":{{"url":"https://127.0.0.1:{admission_port}/{path}"}}}}]"#
        );
        cluster
            .kubectl_ok(
                &[
                    "patch",
                    kind,
                    "platform-operator",
                    "--type=json",
                    "-p",
                    &patch,
                ],
                None,
            )
            .expect("point the configuration at the process");
    }
    let webhook = start_webhook(&cluster, &helm, &ns, &dir, admission_port);
    webhook.wait_ready().await;
    eventually(
        "the caBundle",
        Duration::from_secs(60),
        &[&webhook],
        String::new,
        || {
            (!ca_bundle(&cluster, "validatingwebhookconfiguration").is_empty()
                && !ca_bundle(&cluster, "mutatingwebhookconfiguration").is_empty())
            .then_some(())
        },
    )
    .await;

    // The controller: the chart's arguments, in the real node's network namespace (its API
    // server on https://127.0.0.1:6443 there, its operations port carried to the machine's
    // loopback), with the state volume and the mounted passphrase as host paths, the image's
    // vCluster chart and helm as the stand-in chart and the tool cache's helm on PATH. Its
    // installs run in install pods on the node from the operator image the node imported,
    // their state a hostPath of --state-dir (no claim: the node is this machine).
    let standin = standin_vcluster(&helm, &dir, &cluster.kubeconfig, &netns).await;
    let passphrase_file = dir.join("passphrase");
    std::fs::write(&passphrase_file, passphrase(&cluster, &ns).1).expect("passphrase file");
    let kubeconfig = dir.join("controller.kubeconfig");
    service_account_node_kubeconfig(&cluster, &ns, "platform-operator", &kubeconfig)
        .expect("controller token");
    let ops_port = free_port().expect("port");
    let state = dir.join("state");
    let args = host_args(
        &rendered,
        "platform-operator-controller",
        (
            &["--install-state-claim"],
            &[
                ("--state-dir", state.display().to_string()),
                ("--passphrase-file", passphrase_file.display().to_string()),
                ("--metrics-bind-address", format!("127.0.0.1:{ops_port}")),
                ("--install-image", operator_image.clone()),
            ],
        ),
        &[
            format!("--vcluster-chart={}", standin.chart.display()),
            format!("--vcluster-extra-values={}", standin.values.display()),
            "--log-level=info,controller=debug".into(),
            // The webhook's certificate folder (start_webhook wrote it).
            format!("--metrics-cert-dir={}", dir.join("metrics-tls").display()),
            format!("--install-node={}", e2e::real_node::NODE_NAME),
        ],
    );
    assert!(
        args.contains(&format!("--npm-registry={registry_url}")),
        "{args:?}"
    );
    let tools = e2e::tools::Tools::locate().expect("tools");
    let tool_bin = tools.bin("helm").parent().expect("bin").to_path_buf();
    let path = format!(
        "{}:{}",
        tool_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let controller = Proc::start(
        "controller",
        (&controller_bin, &args),
        &[
            ("KUBECONFIG", kubeconfig.display().to_string()),
            ("POD_NAMESPACE", ns.clone()),
            ("POD_NAME", "platform-operator-controller-e2e".into()),
            ("VCLUSTER_CHART_SHA256", standin.digest.clone()),
            ("PATH", path),
        ],
        dir.join(format!("controller-{ops_port}.log")),
        (
            ops_port,
            std::fs::read_to_string(dir.join("metrics-tls/ca.crt")).expect("metrics CA"),
        ),
        Some(&netns),
    );
    controller.wait_ready().await;
    let procs = [&webhook, &controller];
    // No npm, node or Pulumi process ever runs in the controller's process tree.
    let stop_watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let controller_pid = controller.child.borrow().id();
    let tools_seen = watch_for_tools(controller_pid, stop_watching.clone());

    // Secure metrics: only a token the API server accepts, whose user may get /metrics.
    let reader = scraper_token(&cluster, &ns, "prometheus-e2e", true);
    let nobody = scraper_token(&cluster, &ns, "nobody-e2e", false);
    for p in procs {
        for (token, want) in [
            (None, 401),
            (Some("not-a-token"), 401),
            (Some(nobody.as_str()), 403),
        ] {
            let got = p.ops_get("/metrics", token).await.expect("an answer");
            assert_eq!(got.0, want, "{} /metrics with {token:?}: {}", p.name, got.1);
        }
        assert!(
            p.scrape(&reader)
                .await
                .contains("platform_operator_build_info")
        );
        assert_eq!(p.ops_get("/healthz", None).await.expect("healthz").0, 200);
    }
    // A real Prometheus scrapes both over HTTPS with the reader's token and evaluates the chart's
    // alerts.
    let prometheus_tools = e2e::prometheus::Tools::locate().expect("prometheus and promtool");
    let prometheus =
        start_prometheus(&prometheus_tools, &dir, &reader, &[&webhook, &controller]).await;

    let team = cluster.create_namespace("team", &[]).expect("namespace");
    cluster
        .kubectl_ok(
            &[
                "-n",
                &team,
                "create",
                "secret",
                "generic",
                "oauth",
                "--from-literal=clientSecret=e2e-chart-secret",
            ],
            None,
        )
        .expect("secret");
    let instance = |version: &str| {
        format!(
            r#"apiVersion: platform.di-framework.dev/v1alpha1
kind: PlatformInstance
metadata: {{ name: one, namespace: {team} }}
spec:
  {version}
  deletionPolicy: Delete
  target: {{ type: vcluster }}
  platform:
    tenants: [{{ name: acme }}]
    users: [{{ name: dev, memberships: [{{ tenant: acme, role: developer }}] }}]
    tenantAuth:
      image: "ghcr.io/di-framework/tenant-auth@sha256:0000000000000000000000000000000000000000000000000000000000000000"
      issuer: https://id.example
      clientId: console
      clientSecretRef: {{ name: oauth, key: clientSecret }}
"#
        )
    };
    // The webhook validates (outside the supported range: denied) ...
    let mut apply = cluster.kubectl();
    apply.args(["apply", "--server-side", "-f", "-"]);
    let denied = e2e::cmd::run(apply, Some(&instance("version: 7.0.22"))).expect("kubectl");
    assert!(
        !denied.success && denied.stderr.contains("validate.platform.di-framework.dev"),
        "{}",
        denied.stderr
    );
    // ... and defaults: no spec.version, so it sets --default-platform-version (its
    // clientSecretRef check asks the API server whether the requester may read the Secret).
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&instance("")))
        .expect("the instance is admitted");
    let pi = get(&cluster, &["-n", &team, "get", "pi", "one"]).expect("instance");
    assert_eq!(pi["spec"]["version"], "6.0.22", "defaulted by the webhook");

    // The controller, under the ClusterRole platform-operator, takes it to Ready.
    let started = Instant::now();
    let show = || {
        cluster
            .kubectl_ok(&["-n", &team, "get", "pi", "one", "-o", "yaml"], None)
            .unwrap_or_default()
    };
    let pi = eventually(
        "the instance to be Ready",
        // npm and then Pulumi, each in an install pod of its own, on two shared cores.
        Duration::from_secs(900),
        &procs,
        show,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "one"])?;
            (pi["status"]["phase"] == "Ready"
                && condition(&pi, "Ready").is_some_and(|c| c.0 == "True"))
            .then_some(pi)
        },
    )
    .await;
    eprintln!("the instance was Ready after {:?}", started.elapsed());
    ready_series(&prometheus).await;
    // What both export while an instance exists (its conditions go with it).
    let mut exported = Vec::new();
    for p in procs {
        exported.extend(e2e::prometheus::families(&p.scrape(&reader).await));
    }
    assert_eq!(
        condition(&pi, "OwnerServiceProtected"),
        Some(("True".into(), "PolicyActive".into()))
    );
    assert_eq!(
        condition(&pi, "KubeconfigReady").map(|c| c.0),
        Some("True".into())
    );
    assert_eq!(pi["status"]["installedVersion"], "6.0.22");
    let host = pi["status"]["hostNamespace"]
        .as_str()
        .expect("host namespace")
        .to_string();
    // Leader election through the Role in the release namespace; Events through events.k8s.io.
    let lease = get(
        &cluster,
        &["-n", &ns, "get", "lease", "platform-operator-controller"],
    )
    .expect("lease");
    assert_eq!(
        lease["spec"]["holderIdentity"],
        "platform-operator-controller-e2e"
    );
    let events = get(&cluster, &["-n", &team, "get", "events.v1.events.k8s.io"]).expect("events");
    assert!(
        events["items"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["regarding"]["name"] == "one"
                && e["reportingController"] == "platform-operator")),
        "{events}"
    );

    // Owner-Service resync: the vCluster's own account (vc-vcluster, the syncer's account the
    // values name, which the policy lets through) deletes service/vcluster; the controller
    // recreates it and relinks owner references.
    let before =
        get(&cluster, &["-n", &host, "get", "service", "vcluster"]).expect("service/vcluster");
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{ name: vc-e2e, namespace: {host} }}\nrules: [{{ apiGroups: [\"\"], resources: [services], verbs: [delete] }}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{ name: vc-e2e, namespace: {host} }}\nroleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-e2e }}\nsubjects: [{{ kind: ServiceAccount, name: vc-vcluster, namespace: {host} }}]\n"
    );
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rbac))
        .expect("vc-e2e");
    let vc = dir.join("vc.kubeconfig");
    service_account_kubeconfig(&cluster, &host, "vc-vcluster", &vc).expect("vc token");
    let mut delete = Command::new(&cluster.kubectl);
    delete.env("KUBECONFIG", &vc).args([
        "-n",
        &host,
        "delete",
        "service",
        "vcluster",
        "--wait=false",
    ]);
    e2e::cmd::run(delete, None)
        .expect("kubectl")
        .ok("delete service/vcluster as vc-vcluster")
        .expect("deleted");
    eventually(
        "service/vcluster to be restored",
        Duration::from_secs(120),
        &procs,
        String::new,
        || {
            let svc = get(&cluster, &["-n", &host, "get", "service", "vcluster"])?;
            let ns = get(&cluster, &["get", "namespace", &host])?;
            let record =
                ns["metadata"]["annotations"]["platform.di-framework.dev/vcluster-service"]
                    .as_str()?
                    .to_string();
            (uid(&svc) != uid(&before) && record.starts_with(&uid(&svc))).then_some(())
        },
    )
    .await;

    // deletionPolicy: Delete: helm uninstall, the host namespace, the cleanup Job in the release
    // namespace, the state directory, the kubeconfig Secret, then the finalizer.
    cluster
        .kubectl_ok(&["-n", &team, "delete", "pi", "one", "--wait=false"], None)
        .expect("delete");
    eventually(
        "the instance to be gone",
        Duration::from_secs(180),
        &procs,
        show,
        || {
            get(&cluster, &["-n", &team, "get", "pi", "one"])
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        get(&cluster, &["-n", &ns, "get", "job", &host]).is_some(),
        "the cleanup Job ran in the release namespace"
    );
    assert!(!dir.join("state").join(&team).join("one").exists());

    // The webhook rotates its certificate (webhook.certLifetime=60s: a new pair is prepared at
    // half of it) by updating its Secret, as its Role allows.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let metrics = webhook.scrape(&reader).await;
        let prepared = metrics
            .lines()
            .filter(|l| l.starts_with("platform_operator_webhook_certificate_rotations_total"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>();
        if prepared >= 1.0 {
            break;
        }
        webhook.assert_running();
        assert!(
            Instant::now() < deadline,
            "the webhook did not rotate\n{}",
            webhook.describe()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    webhook.assert_never_forbidden();
    controller.assert_never_forbidden();
    stop_watching.store(true, std::sync::atomic::Ordering::Relaxed);
    let tools_seen = tools_seen.join().expect("the process watch");
    assert!(
        tools_seen.is_empty(),
        "the platform program's tools ran in the controller's process tree: {tools_seen:?}"
    );
    check_prometheus(&prometheus, &prometheus_tools, &procs, &reader, exported).await;

    // The install ran in an install Job of the release namespace, which the controller deleted
    // when it ended.
    let install_job = format!("pi-install-{}", uid(&pi));
    let jobs = requests_on(
        &audit,
        &format!("system:serviceaccount:{ns}:platform-operator"),
        "jobs",
    );
    assert!(
        jobs.contains(&("delete".into(), ns.clone(), install_job.clone())),
        "no install Job {install_job} in {ns}: {jobs:?}"
    );

    // Every permission the chart grants was used, but those the controller holds only so that
    // Helm may create the vCluster chart's Role (the stand-in creates the same Role).
    let rendered = release_manifest(&helm, &ns);
    let mut unused = Vec::new();
    for (account, roles, not_seen) in [
        (
            "platform-operator",
            &[
                "ClusterRole/platform-operator",
                "Role/platform-operator",
                "Role/platform-operator-cleanup",
                "ClusterRole/platform-operator-metrics-auth",
            ][..],
            NOT_SEEN_HERE,
        ),
        (
            "platform-operator-webhook",
            &[
                "ClusterRole/platform-operator-webhook",
                "Role/platform-operator-webhook",
                "ClusterRole/platform-operator-metrics-auth",
            ][..],
            &[][..],
        ),
    ] {
        let used = used_permissions(&audit, &format!("system:serviceaccount:{ns}:{account}"));
        let seen = |group: &str, resource: &str, verb: &str| {
            used.contains(&(group.to_string(), resource.to_string(), verb.to_string()))
        };
        for (group, resource, verb) in granted(&rendered, roles) {
            let excused = not_seen
                .iter()
                .any(|(r, v)| *r == resource && (*v == "*" || *v == verb));
            // A server-side apply that creates is audited as a patch.
            let applied = verb == "create" && seen(&group, &resource, "patch");
            if !(excused || applied || seen(&group, &resource, &verb)) {
                unused.push(format!("{account}: {verb} {resource}.{group}"));
            }
        }
    }
    assert!(unused.is_empty(), "granted but never used: {unused:?}");
    // Least privilege, as used: the webhook touched no Secret but its own certificate Secret, even
    // while it checked the instance's clientSecretRef (team/oauth exists and was referenced).
    let foreign = secrets_touched(
        &audit,
        &format!("system:serviceaccount:{ns}:platform-operator-webhook"),
    )
    .into_iter()
    .filter(|(namespace, name)| {
        !(namespace == &ns && (name == "platform-operator-webhook-tls" || name.is_empty()))
    })
    .collect::<Vec<_>>();
    assert!(
        foreign.is_empty(),
        "the webhook touched other Secrets: {foreign:?}"
    );
    drop(standin);
    drop(npm_relay);
    let _ = std::fs::remove_dir_all(&dir);
}
