//! A real Kubernetes control plane on loopback: etcd, kube-apiserver (RBAC, service-account
//! signing keys, an admin client certificate), kube-controller-manager, kube-scheduler and KWOK
//! with one fake node. Every process is started, watched and stopped by pid; its output goes to
//! a log file that is kept when a test fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::HarnessError;
use crate::pki::{Pki, PkiFiles};
use crate::tools::Tools;

/// Which parts of a control plane to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// A short name used in folder and log names.
    pub name: String,
    /// Run kube-controller-manager, kube-scheduler and KWOK with one fake node. Without them
    /// the control plane is a bare API server, such as the "inside" of a vCluster.
    pub workloads: bool,
    /// Extra kube-apiserver flags, such as `--runtime-config=...` to turn an API off.
    pub apiserver_args: Vec<String>,
    /// How long to wait for each part to become healthy.
    pub timeout: Duration,
    /// Serve as the inside of stand-in vClusters ([`crate::standin_vcluster`]): the default
    /// serving certificate names only 127.0.0.1, and this many SNI certificate slots (files the
    /// API server reloads when they change) are filled by the stand-in syncer, one per vCluster
    /// it starts, with exactly the names vCluster would serve.
    pub sni_slots: usize,
    /// How many pods the fake node takes (its `pods` capacity; the scheduler leaves the rest
    /// Pending). A real node's kubelet defaults to 110; one fake node stands for a cluster.
    pub node_pods: usize,
    /// Also start a real node ([`crate::real_node`]: containerd, runc, CNI, kubelet and
    /// kube-proxy in a network namespace of its own) beside the KWOK node, which is then tainted
    /// ([`crate::real_node::KWOK_TAINT`]) so that pods go to the real node unless they tolerate
    /// it. Needs root and the Debian packages [`crate::real_node::DEBIAN_PACKAGES`]; off by
    /// default.
    pub real_node: bool,
    /// Import into the real node what the controller's Jobs and its stand-in vCluster's pods run
    /// ([`crate::images::JobImages`], built while the control plane starts): the operator image
    /// by digest ([`ControlPlane::operator_image`]) and the stand-in vCluster chart's images.
    /// Off by default.
    pub job_images: bool,
    /// Give the real node a cluster DNS ([`crate::cluster_dns`]: CoreDNS serving
    /// `cluster.local` only, at [`crate::real_node::CLUSTER_DNS_IP`]); needs the real vCluster's
    /// tools (`e2e/tools/build.sh vcluster`) for its image. Off by default.
    pub cluster_dns: bool,
}

impl Options {
    /// A full control plane (with workloads) named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            workloads: true,
            apiserver_args: Vec::new(),
            timeout: Duration::from_secs(180),
            sni_slots: 0,
            job_images: false,
            node_pods: 1000,
            real_node: false,
            cluster_dns: false,
        }
    }

    /// The inside of stand-in vClusters: only etcd and the API server, with
    /// [`crate::standin_vcluster::SNI_SLOTS`] SNI certificate slots.
    pub fn standin_vcluster(mut self) -> Self {
        self.workloads = false;
        self.sni_slots = crate::standin_vcluster::SNI_SLOTS;
        self
    }

    /// Only etcd and the API server.
    pub fn api_only(mut self) -> Self {
        self.workloads = false;
        self
    }

    /// Sets the number of SNI certificate slots: one per stand-in vCluster served at once.
    pub fn sni_slots(mut self, slots: usize) -> Self {
        self.sni_slots = slots;
        self
    }

    /// Sets how many pods the fake node takes: at least one per vCluster a benchmark runs (each
    /// vCluster's control plane is one pod).
    pub fn node_pods(mut self, pods: usize) -> Self {
        self.node_pods = pods;
        self
    }

    /// Also starts a real node beside the KWOK one (see [`Options::real_node`]).
    pub fn real_node(mut self) -> Self {
        self.real_node = true;
        self
    }

    /// Also starts a real node with a cluster DNS (see [`Options::cluster_dns`]).
    pub fn real_node_with_dns(mut self) -> Self {
        self.real_node = true;
        self.cluster_dns = true;
        self
    }

    /// Also starts a real node, with the operator image and the stand-in vCluster's images
    /// imported (see [`Options::job_images`]): the controller's Jobs run there.
    pub fn real_node_for_jobs(mut self) -> Self {
        self.real_node = true;
        self.job_images = true;
        self
    }

    /// Adds kube-apiserver flags.
    pub fn apiserver_args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.apiserver_args.extend(args.into_iter().map(Into::into));
        self
    }
}

pub use crate::pki::ADMIN_USER;

/// The name of the fake node KWOK manages.
pub const NODE_NAME: &str = "kwok-node-0";

struct Process {
    name: &'static str,
    child: Child,
}

/// A running control plane. Dropping it stops every process; its folder (data, certificates,
/// logs) is removed unless the current thread is panicking, so a failed test keeps its logs.
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    tools: Tools,
    processes: Vec<Process>,
    real_node: Option<crate::real_node::RealNode>,
    node_kubeconfig: Option<PathBuf>,
    operator_image: Option<String>,
    keep: bool,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("server", &self.server)
            .finish()
    }
}

/// A TCP port on 127.0.0.1 for a server a test is about to start, reserved for this process.
///
/// Two things used to take such a port between this check and the server's own `bind`: an
/// outgoing connection of any process (the kernel hands those their local ports from the
/// ephemeral range, `net.ipv4.ip_local_port_range`, where `bind(0)` also picks), and another test
/// process that picked the same port. So the port comes from below the ephemeral range, and each
/// port handed out is reserved by an exclusive file lock in `platform-operator-ports` under the
/// system temporary folder (one for every test process on the machine, whatever its
/// `PLATFORM_OPERATOR_E2E_DIR`). This process holds the lock until it exits, and the kernel
/// releases it then, so nothing goes stale. A port another process reserved, or that something
/// already listens on, is skipped. Where the machine leaves no range outside the ephemeral one,
/// the kernel picks (`bind(0)`), as before.
pub fn free_port() -> Result<u16, HarnessError> {
    match reserved_range() {
        Some(range) => reserve_port(range),
        None => kernel_port(),
    }
}

fn kernel_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| HarnessError::io(Path::new("127.0.0.1:0"), e))?;
    let port = listener
        .local_addr()
        .map_err(|e| HarnessError::io(Path::new("127.0.0.1:0"), e))?
        .port();
    Ok(port)
}

/// The ports tests take from: below the kernel's ephemeral range (from 10000), or above it when
/// it starts too low; `None` when neither side has at least 1,000 ports.
fn reserved_range() -> Option<std::ops::RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut bounds = text.split_whitespace().map(|v| v.parse::<u32>().ok());
    let (first, last) = (bounds.next()??, bounds.next()??);
    const LOW: u32 = 10_000;
    if first >= LOW + 1_000 {
        Some(LOW as u16..=(first - 1) as u16)
    } else if last + 1_000 <= 65_535 {
        Some((last + 1) as u16..=65_535)
    } else {
        None
    }
}

/// The reservations this process holds: each file stays open (and locked) until it exits.
static RESERVATIONS: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

fn reserve_port(range: std::ops::RangeInclusive<u16>) -> Result<u16, HarnessError> {
    let dir = std::env::temp_dir().join("platform-operator-ports");
    std::fs::create_dir_all(&dir).map_err(|e| HarnessError::io(&dir, e))?;
    let (low, high) = (u32::from(*range.start()), u32::from(*range.end()));
    let span = high - low + 1;
    // Start somewhere different in each process and at each call, then walk the range once.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    let mut reservations = RESERVATIONS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for step in 0..span {
        let port = (low + (seed.wrapping_add(step) % span)) as u16;
        let path = dir.join(port.to_string());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| HarnessError::io(&path, e))?;
        // Held by another process, or by this one under an earlier call: skip it.
        if file.try_lock().is_err() {
            continue;
        }
        // Something outside the tests listens there: skip it, and keep the reservation so this
        // process does not try it again.
        let free = TcpListener::bind(("127.0.0.1", port)).is_ok();
        reservations.push(file);
        if free {
            return Ok(port);
        }
    }
    Err(HarnessError::io(
        &dir,
        std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("no free port left in {low}..={high}"),
        ),
    ))
}

/// The folder that holds every control plane's files: `$PLATFORM_OPERATOR_E2E_DIR`, or
/// `platform-operator-e2e` under the system temporary folder.
pub fn base_dir() -> PathBuf {
    std::env::var_os("PLATFORM_OPERATOR_E2E_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("platform-operator-e2e"))
}

impl ControlPlane {
    /// Starts a control plane and waits until it serves (and, with workloads, until its node is Ready).
    pub async fn start(options: Options) -> Result<Self, HarnessError> {
        let tools = Tools::locate()?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let dir = base_dir().join(format!("{}-{}-{stamp}", options.name, std::process::id()));
        for sub in ["logs", "pki", "etcd", "apiserver-certs"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| HarnessError::io(&dir, e))?;
        }
        let pki = if options.sni_slots > 0 {
            Pki::issue_for(&["127.0.0.1"])?
        } else {
            Pki::issue()?
        };
        let files = pki.write(&dir.join("pki"))?;
        let mut sni_args = Vec::new();
        for slot in 0..options.sni_slots {
            let (cert, key) = crate::standin_vcluster::slot_files(&dir, slot);
            let (cert_pem, key_pem) =
                pki.serving_certificate(&[format!("unused-slot-{slot}.standin.invalid")])?;
            std::fs::write(&cert, cert_pem).map_err(|e| HarnessError::io(&cert, e))?;
            std::fs::write(&key, key_pem).map_err(|e| HarnessError::io(&key, e))?;
            sni_args.push(format!(
                "--tls-sni-cert-key={},{}",
                cert.display(),
                key.display()
            ));
        }
        let mut cp = ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            server: String::new(),
            tools,
            processes: Vec::new(),
            real_node: None,
            node_kubeconfig: None,
            operator_image: None,
            keep: std::env::var_os("PLATFORM_OPERATOR_E2E_KEEP").is_some(),
        };
        let mut options = options;
        options.apiserver_args.extend(sni_args);
        // Built (or taken from the cache) while the control plane starts.
        let images = (options.real_node && options.workloads && options.job_images)
            .then(|| tokio::task::spawn_blocking(crate::images::job_images));
        if let Err(e) = cp.boot(&options, &pki, &files, images).await {
            cp.keep = true;
            return Err(HarnessError::Start {
                message: e.to_string(),
                logs: cp.dir.join("logs"),
            });
        }
        Ok(cp)
    }

    async fn boot(
        &mut self,
        options: &Options,
        pki: &Pki,
        files: &PkiFiles,
        images: Option<tokio::task::JoinHandle<Result<crate::images::JobImages, HarnessError>>>,
    ) -> Result<(), HarnessError> {
        let deadline = options.timeout;
        // etcd
        let client_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_data = self.dir.join("etcd");
        self.spawn(
            "etcd",
            &self.tools.etcd(),
            &[
                "--name=default".into(),
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        self.wait("etcd", deadline, || etcd_healthy(client_port))
            .await?;

        // kube-apiserver
        let port = free_port()?;
        self.server = format!("https://127.0.0.1:{port}");
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", self.dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", files.serving_cert.display()),
            format!("--tls-private-key-file={}", files.serving_key.display()),
            format!("--client-ca-file={}", files.ca_cert.display()),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!(
                "--service-account-key-file={}",
                files.service_account_pub.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                files.service_account_key.display()
            ),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        args.extend(options.apiserver_args.iter().cloned());
        if options.real_node && options.workloads {
            // Before the API server starts: it dials the node through the egress proxy.
            let mut node = crate::real_node::RealNode::prepare(&self.dir.join("node"))?;
            if options.cluster_dns {
                node.with_cluster_dns();
            }
            let cert = self.dir.join("pki/admin.crt");
            let key = self.dir.join("pki/admin.key");
            std::fs::write(&cert, &pki.admin_cert).map_err(|e| HarnessError::io(&cert, e))?;
            std::fs::write(&key, &pki.admin_key).map_err(|e| HarnessError::io(&key, e))?;
            // The Node authorizer beside RBAC (a list flag: repeating it would add RBAC twice).
            for arg in &mut args {
                if arg == "--authorization-mode=RBAC" {
                    *arg = "--authorization-mode=Node,RBAC".into();
                }
            }
            args.extend(node.apiserver_args(&cert, &key)?);
            self.real_node = Some(node);
        }
        self.spawn("kube-apiserver", &self.tools.bin("kube-apiserver"), &args)?;
        self.write_kubeconfig(
            &self.kubeconfig,
            &pki.ca_cert,
            &pki.admin_cert,
            &pki.admin_key,
        )?;
        let kcm = self.dir.join("kube-controller-manager.kubeconfig");
        self.write_kubeconfig(
            &kcm,
            &pki.ca_cert,
            &pki.controller_manager.0,
            &pki.controller_manager.1,
        )?;
        let scheduler = self.dir.join("kube-scheduler.kubeconfig");
        self.write_kubeconfig(&scheduler, &pki.ca_cert, &pki.scheduler.0, &pki.scheduler.1)?;
        let client = self.client().await?;
        self.wait("kube-apiserver", deadline, || {
            let client = client.clone();
            async move {
                let req = http_get("/readyz")?;
                client
                    .request_text(req)
                    .await
                    .ok()
                    .filter(|body| body.trim() == "ok")
                    .map(|_| ())
            }
        })
        .await?;

        if options.workloads {
            self.start_workloads(files, &client, deadline, options.node_pods)
                .await?;
            if let Some(node) = self.real_node.as_mut() {
                taint_kwok_node(&client).await?;
                let access = crate::real_node::ControlPlaneAccess {
                    api_port: port,
                    ca_cert: pki.ca_cert.clone(),
                    ca_key: pki.ca_key.clone(),
                    ca_file: files.ca_cert.clone(),
                };
                node.start(&access, &client, deadline).await?;
                // The admin's kubeconfig as seen from inside the node's namespace, where the
                // API server relay listens on 127.0.0.1 too (the serving certificate names it).
                let server = format!("https://127.0.0.1:{}", crate::node_net::API_PORT);
                let yaml = kubeconfig_yaml(&server, &pki.ca_cert, &pki.admin_cert, &pki.admin_key)?;
                let path = self.dir.join("node-netns.kubeconfig");
                std::fs::write(&path, yaml).map_err(|e| HarnessError::io(&path, e))?;
                self.node_kubeconfig = Some(path);
                if options.cluster_dns {
                    crate::cluster_dns::deploy(node, &self.kubeconfig, &self.tools, deadline)?;
                }
                if let Some(images) = images {
                    let images = images
                        .await
                        .map_err(|e| HarnessError::Node(format!("building the images: {e}")))??;
                    node.import_job_images(&images)?;
                    self.operator_image = Some(images.operator.by_digest());
                }
            }
        }
        Ok(())
    }

    async fn start_workloads(
        &mut self,
        files: &PkiFiles,
        client: &kube::Client,
        deadline: Duration,
        node_pods: usize,
    ) -> Result<(), HarnessError> {
        let kc = self
            .dir
            .join("kube-controller-manager.kubeconfig")
            .display()
            .to_string();
        self.spawn(
            "kube-controller-manager",
            &self.tools.bin("kube-controller-manager"),
            &[
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                format!(
                    "--service-account-private-key-file={}",
                    files.service_account_key.display()
                ),
                format!("--root-ca-file={}", files.ca_cert.display()),
                format!("--cluster-signing-cert-file={}", files.ca_cert.display()),
                format!("--cluster-signing-key-file={}", files.ca_key.display()),
                "--controllers=*".into(),
                // Each controller acts as its own service account, as in a real cluster.
                "--use-service-account-credentials=true".into(),
                "--v=1".into(),
            ],
        )?;
        let kc = self
            .dir
            .join("kube-scheduler.kubeconfig")
            .display()
            .to_string();
        self.spawn(
            "kube-scheduler",
            &self.tools.bin("kube-scheduler"),
            &[
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ],
        )?;
        let kc = self.kubeconfig.display().to_string();
        let mut kwok_args = vec![
            format!("--kubeconfig={kc}"),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            // Heartbeats through node Leases; without them the node goes NotReady after the
            // controller-manager's 40 s grace period and every pod with it.
            "--node-lease-duration-seconds=40".into(),
            format!("--server-address=127.0.0.1:{}", free_port()?),
        ];
        for stage in self.tools.kwok_stages()? {
            kwok_args.push(format!("--config={}", stage.display()));
        }
        self.spawn("kwok", &self.tools.bin("kwok"), &kwok_args)?;

        let nodes: Api<Node> = Api::all(client.clone());
        let pods = node_pods.to_string();
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/role": "agent",
                    "type": "kwok"
                }
            },
            "status": {
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": pods, "ephemeral-storage": "1Ti"},
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": pods, "ephemeral-storage": "1Ti"}
            }
        }))
        .map_err(|e| HarnessError::Pki(format!("node manifest: {e}")))?;
        self.wait("the node object", deadline, || {
            let nodes = nodes.clone();
            let node = node.clone();
            async move {
                match nodes.create(&PostParams::default(), &node).await {
                    Ok(_) => Some(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Some(()),
                    Err(_) => None,
                }
            }
        })
        .await?;
        self.wait("the KWOK node to be Ready", deadline, || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get(NODE_NAME).await.ok()?;
                let ready = node
                    .status?
                    .conditions?
                    .into_iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(())
            }
        })
        .await?;
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), "default");
        self.wait("the default service account", deadline, || {
            let accounts = accounts.clone();
            async move { accounts.get("default").await.ok().map(|_| ()) }
        })
        .await
    }

    fn spawn(
        &mut self,
        name: &'static str,
        program: &Path,
        args: &[String],
    ) -> Result<(), HarnessError> {
        let log_path = self.dir.join("logs").join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).map_err(|e| HarnessError::io(&log_path, e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| HarnessError::io(&log_path, e))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .current_dir(&self.dir);
        crate::process::die_with_parent(&mut command);
        let child = command.spawn().map_err(|e| HarnessError::io(program, e))?;
        self.processes.push(Process { name, child });
        Ok(())
    }

    /// Polls `check` every 250 ms until it yields, a process dies, or `timeout` passes.
    async fn wait<F, Fut>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<(), HarnessError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<()>>,
    {
        let start = Instant::now();
        loop {
            if check().await.is_some() {
                return Ok(());
            }
            for p in &mut self.processes {
                if let Ok(Some(status)) = p.child.try_wait() {
                    return Err(HarnessError::Exited {
                        name: p.name,
                        status: status.to_string(),
                    });
                }
            }
            if start.elapsed() > timeout {
                return Err(HarnessError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn write_kubeconfig(
        &self,
        path: &Path,
        ca: &str,
        cert: &str,
        key: &str,
    ) -> Result<(), HarnessError> {
        let yaml = kubeconfig_yaml(&self.server, ca, cert, key)?;
        std::fs::write(path, yaml).map_err(|e| HarnessError::io(path, e))
    }

    /// A kubeconfig for a new identity of its own, user `user` in group `group` (a client
    /// certificate from this control plane's CA), written to `<dir>/<user>.kubeconfig`. What the
    /// user may do is up to RBAC: bind it as needed.
    pub fn user_kubeconfig(
        &self,
        user: &str,
        group: Option<&str>,
    ) -> Result<PathBuf, HarnessError> {
        let read = |file: &str| {
            let path = self.dir.join("pki").join(file);
            std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))
        };
        let (ca_cert, ca_key) = (read("ca.crt")?, read("ca.key")?);
        let (cert, key) = crate::pki::client_certificate(&ca_key, user, group)?;
        let path = self.dir.join(format!("{user}.kubeconfig"));
        self.write_kubeconfig(&path, &ca_cert, &cert, &key)?;
        Ok(path)
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The API server's port on the machine's loopback (that of [`ControlPlane::server`]).
    pub fn port(&self) -> u16 {
        self.server
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the server this control plane was started with names its port")
    }

    /// The folder of this control plane (data, certificates, `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binaries this control plane runs (kubectl and helm among them).
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// A new admin client.
    pub async fn client(&self) -> Result<kube::Client, HarnessError> {
        client_for(&self.kubeconfig).await
    }

    /// A `kubectl` command with this control plane's admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(self.tools.bin("kubectl"));
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    /// Runs kubectl with `args` (and `stdin`), returning its standard output or its error.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String, HarnessError> {
        let mut cmd = self.kubectl();
        cmd.args(args);
        crate::cmd::run(cmd, stdin)?.ok(&format!("kubectl {}", args.join(" ")))
    }

    /// Keeps the folder (and its logs) after the control plane stops.
    pub fn keep_files(&mut self) {
        self.keep = true;
    }

    /// The operator image on the real node by digest (`<repository>@sha256:…`), what the
    /// controller's `--cleanup-image` names there, when [`Options::job_images`] imported it.
    pub fn operator_image(&self) -> Option<&str> {
        self.operator_image.as_deref()
    }

    /// The admin kubeconfig for processes started inside the real node's network namespace
    /// (server `https://127.0.0.1:6443`, the API server relay there), when there is a real node.
    pub fn node_kubeconfig(&self) -> Option<&Path> {
        self.node_kubeconfig.as_deref()
    }

    /// The name of the real node's network namespace (under `/run/netns`), when there is one.
    pub fn node_netns(&self) -> Option<&str> {
        self.real_node
            .as_ref()
            .and_then(|n| n.netns())
            .map(|n| n.name())
    }

    /// The real node, when [`Options::real_node`] asked for one.
    pub fn real_node(&self) -> Option<&crate::real_node::RealNode> {
        self.real_node.as_ref()
    }

    /// The real node, to open relays into it ([`crate::real_node::RealNode::relay`]).
    pub fn real_node_mut(&mut self) -> Option<&mut crate::real_node::RealNode> {
        self.real_node.as_mut()
    }

    /// Stops the real node (its processes by pid, its mounts, cgroups and network removed), then
    /// every process, newest first: SIGTERM, then SIGKILL after five seconds.
    pub fn stop(&mut self) {
        self.real_node.take();
        while let Some(mut p) = self.processes.pop() {
            crate::process::terminate(&mut p.child, Duration::from_secs(5));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
        if self.keep || std::thread::panicking() {
            eprintln!(
                "control plane files kept in {} (logs in logs/)",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A kubeconfig (YAML) for `server` with the CA and the client certificate and key (PEM).
pub fn kubeconfig_yaml(
    server: &str,
    ca: &str,
    cert: &str,
    key: &str,
) -> Result<String, HarnessError> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": "user", "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "user", "namespace": "default"}}],
        "current-context": "e2e"
    });
    serde_saphyr::to_string(&config).map_err(|e| HarnessError::Pki(format!("kubeconfig: {e}")))
}

/// Taints the KWOK node with [`crate::real_node::KWOK_TAINT`] (`NoSchedule`): with a real node
/// beside it, pods go there unless they tolerate the fake one.
async fn taint_kwok_node(client: &kube::Client) -> Result<(), HarnessError> {
    use kube::api::{Patch, PatchParams};
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({
        "spec": {"taints": [{"key": crate::real_node::KWOK_TAINT, "value": "fake", "effect": "NoSchedule"}]}
    });
    nodes
        .patch(NODE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| HarnessError::Node(format!("tainting {NODE_NAME}: {e}")))
}

/// A client for the kubeconfig at `path`.
pub async fn client_for(path: &Path) -> Result<kube::Client, HarnessError> {
    let kubeconfig =
        Kubeconfig::read_from(path).map_err(|e| HarnessError::Client(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| HarnessError::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| HarnessError::Client(e.to_string()))
}

fn http_get(path: &str) -> Option<http::Request<Vec<u8>>> {
    http::Request::get(path).body(Vec::new()).ok()
}

async fn etcd_healthy(port: u16) -> Option<()> {
    let (_, body) = plain_get(port, "/health").await?;
    body.contains("\"health\":\"true\"").then_some(())
}

/// A plain-HTTP GET of `path` on `127.0.0.1:port`: the status code and the whole response text.
pub async fn plain_get(port: u16, path: &str) -> Option<(u16, String)> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || blocking_get(port, &path))
        .await
        .ok()
        .flatten()
}

/// [`plain_get`] from the calling thread, blocking it.
pub fn blocking_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_outside_the_ephemeral_range_and_held_while_the_process_runs() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("port")).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port handed out twice: {ports:?}"
        );
        let Some(range) = reserved_range() else {
            // This machine's ephemeral range leaves no room: the kernel picks, nothing to check.
            return;
        };
        let dir = std::env::temp_dir().join("platform-operator-ports");
        for port in ports {
            assert!(range.contains(&port), "{port} is outside {range:?}");
            // Another open of the reservation (as another process would make) cannot lock it.
            let again = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(port.to_string()))
                .expect("reservation file");
            assert!(again.try_lock().is_err(), "{port} is not reserved");
            // And it is free to listen on.
            drop(TcpListener::bind(("127.0.0.1", port)).expect("bind the reserved port"));
        }
    }

    #[test]
    fn the_reserved_range_lies_outside_the_ephemeral_one() {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .expect("ip_local_port_range");
        let bounds: Vec<u16> = text
            .split_whitespace()
            .map(|v| v.parse().expect("port"))
            .collect();
        if let Some(range) = reserved_range() {
            assert!(
                *range.end() < bounds[0] || *range.start() > bounds[1],
                "{range:?} overlaps {bounds:?}"
            );
            assert!(range.len() >= 1_000);
        }
    }
}
