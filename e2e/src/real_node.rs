//! A real node beside the KWOK one: Debian's containerd, runc and CNI plugins, with a kubelet and
//! kube-proxy built from the same pinned `k8s.io/kubernetes` module as the API server
//! (`e2e/tools/build.sh`), all started on private sockets and folders of the control plane's
//! folder and inside the node's confined network namespace ([`crate::node_net`]).
//!
//! What this machine may lack is found before anything starts, worked around and reported
//! ([`RealNode::notes`]): cgroup v1 (the kubelet runs with `failCgroupV1: false`), no
//! `CAP_SYS_RESOURCE` (containerd's `restrict_oom_score_adj`, the kubelet's `oomScoreAdj: 0`), no
//! dummy network devices (the node's address on a bridge without ports), an inotify instance limit
//! too low for the parallel lanes' nodes (raised).
//!
//! containerd never pulls: its proxy is a dead port on the node's loopback, so an image that was
//! not imported ([`crate::images`]) fails at once with a message naming it, and no registry host
//! is ever looked up. Pods get a `resolv.conf` without name servers.
//!
//! Everything is stopped by pid: the pods first (through the API, so the kubelet tears down their
//! sandboxes and networks), then kube-proxy, the kubelet and containerd, then any shim of this
//! containerd left behind and any process left in the node's cgroups; then the mounts under the
//! node's folder, the cgroups and the namespace (with its devices and rules) are removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::HarnessError;
use crate::node_net::{API_PORT, NODE_IP, NodeNetwork, POD_BRIDGE, POD_CIDR};

/// The real node's name.
pub const NODE_NAME: &str = "real-node";
/// The `kubernetes` Service's ClusterIP (the first address of the Service range).
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The cluster DNS Service's ClusterIP when the node has one ([`RealNode::with_cluster_dns`]).
pub const CLUSTER_DNS_IP: &str = "10.96.0.10";
/// The taint the KWOK node carries when a real node runs beside it: pods go to the real node
/// unless they tolerate it.
pub const KWOK_TAINT: &str = "kwok.x-k8s.io/node";
/// `PATH` for the node's processes (iptables, runc and the shims live in the sbin folders).
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where Debian's CNI plugins are.
const CNI_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];
/// The Debian packages the node needs (the test command installs them when missing).
pub const DEBIAN_PACKAGES: &str = "containerd runc containernetworking-plugins iptables";
/// The port containerd's proxy points at: nothing listens there in the node's namespace, so a
/// pull fails with "connection refused" at once.
const DEAD_PROXY: &str = "http://127.0.0.1:9";

/// What the machine offers the node, found before it starts.
#[derive(Debug, Clone)]
pub struct Machine {
    containerd: PathBuf,
    runc: PathBuf,
    ctr: PathBuf,
    cni_dir: PathBuf,
    /// The cgroup v1 hierarchies (mount points), empty on a cgroup v2 machine.
    cgroup_v1: Vec<PathBuf>,
    /// Whether this process may lower OOM scores (`CAP_SYS_RESOURCE`).
    sys_resource: bool,
    notes: Vec<String>,
}

fn find_program(name: &str) -> Option<PathBuf> {
    SYSTEM_PATH
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

impl Machine {
    /// Finds the programs and what the kernel and this process allow.
    pub fn inspect() -> Result<Self, HarnessError> {
        let mut missing = Vec::new();
        let mut program = |name: &str| {
            find_program(name).unwrap_or_else(|| {
                missing.push(name.to_string());
                PathBuf::from(name)
            })
        };
        let containerd = program("containerd");
        let _shim = program("containerd-shim-runc-v2");
        let runc = program("runc");
        let ctr = program("ctr");
        let _iptables = program("iptables");
        let cni_dir = CNI_DIRS.iter().map(PathBuf::from).find(|d| {
            ["bridge", "host-local", "loopback"]
                .iter()
                .all(|p| d.join(p).is_file())
        });
        if cni_dir.is_none() {
            missing.push(format!(
                "the CNI plugins bridge, host-local and loopback ({CNI_DIRS:?})"
            ));
        }
        if !missing.is_empty() {
            return Err(HarnessError::Node(format!(
                "missing {}: install the Debian packages {DEBIAN_PACKAGES} (e2e/run-tests.sh \
                 installs them when missing)",
                missing.join(", ")
            )));
        }
        let mut notes = Vec::new();
        let cgroup_v1 = cgroup_v1_hierarchies();
        if !cgroup_v1.is_empty() {
            notes.push(
                "cgroup v1 on this machine: the kubelet runs with failCgroupV1: false and the \
                 cgroupfs driver"
                    .to_string(),
            );
        }
        let sys_resource = has_capability(24);
        if !sys_resource {
            notes.push(
                "no CAP_SYS_RESOURCE: containerd restricts containers' oom_score_adj to its own \
                 (restrict_oom_score_adj) and the kubelet keeps oomScoreAdj 0"
                    .to_string(),
            );
        }
        if let Some(note) = inotify_instances()? {
            notes.push(note);
        }
        Ok(Machine {
            containerd,
            runc,
            ctr,
            cni_dir: cni_dir.unwrap_or_default(),
            cgroup_v1,
            sys_resource,
            notes,
        })
    }
}

const INOTIFY_INSTANCES: &str = "/proc/sys/fs/inotify/max_user_instances";
/// Enough inotify instances for the real nodes, vClusters and control planes of every test lane
/// at once: containerd, the kubelet and kube-proxy each hold several, and kube-proxy exits with
/// "too many open files" when it cannot get one. Debian's default is 128 per user.
const INOTIFY_INSTANCES_NEEDED: u64 = 1024;

/// Raises the machine's inotify instance limit to [`INOTIFY_INSTANCES_NEEDED`] when it is lower
/// (a limit, so raising it takes nothing from anyone), and says so; a limit it cannot raise is
/// an error naming the setting.
fn inotify_instances() -> Result<Option<String>, HarnessError> {
    let read = || -> Option<u64> {
        std::fs::read_to_string(INOTIFY_INSTANCES)
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let Some(current) = read() else {
        return Ok(None);
    };
    if current >= INOTIFY_INSTANCES_NEEDED {
        return Ok(None);
    }
    let _ = std::fs::write(INOTIFY_INSTANCES, INOTIFY_INSTANCES_NEEDED.to_string());
    match read() {
        Some(now) if now >= INOTIFY_INSTANCES_NEEDED => Ok(Some(format!(
            "fs.inotify.max_user_instances raised from {current} to {now}: each real node's \
             containerd, kubelet and kube-proxy hold inotify instances"
        ))),
        _ => Err(HarnessError::Node(format!(
            "fs.inotify.max_user_instances is {current} and cannot be raised here; the real nodes \
             of parallel tests need {INOTIFY_INSTANCES_NEEDED} (kube-proxy exits with \"too many \
             open files\" otherwise): run `sysctl fs.inotify.max_user_instances=\
             {INOTIFY_INSTANCES_NEEDED}` as root"
        ))),
    }
}

/// The last line of a Kubernetes component's log that reports an error (klog's `E` or `F`).
fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find(|l| l.starts_with('E') || l.starts_with('F'))
        .map(str::to_string)
}

/// The cgroup v1 hierarchies mounted on this machine (every `cgroup` mount, named ones too).
fn cgroup_v1_hierarchies() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup" {
                return None;
            }
            Some(PathBuf::from(left.split_whitespace().nth(4)?))
        })
        .collect()
}

/// Whether capability `bit` is in this process's effective set.
fn has_capability(bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// What the node needs from its control plane.
#[derive(Debug, Clone)]
pub struct ControlPlaneAccess {
    /// The API server's port on the machine's loopback.
    pub api_port: u16,
    /// The CA certificate (PEM).
    pub ca_cert: String,
    /// The CA's key (PEM), for the node's client certificates.
    pub ca_key: String,
    /// The CA certificate's file, for the kubelet's client authentication.
    pub ca_file: PathBuf,
}

struct Process {
    name: &'static str,
    child: Child,
}

/// The figures of one node start.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartFigures {
    /// From the first process started to the node `Ready`.
    pub node_ready: Duration,
    /// Importing the pause and busybox images.
    pub images: Duration,
}

/// A running real node; stopped (and everything it made removed) on drop.
pub struct RealNode {
    dir: PathBuf,
    machine: Machine,
    network: Option<NodeNetwork>,
    cgroup_root: String,
    processes: Vec<Process>,
    kubeconfig: Option<PathBuf>,
    figures: StartFigures,
    cluster_dns: bool,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode").field("dir", &self.dir).finish()
    }
}

impl RealNode {
    /// Checks the machine and creates the node's network (before the API server starts: it
    /// dials through the egress proxy this creates). `dir` is the node's own folder.
    pub fn prepare(dir: &Path) -> Result<Self, HarnessError> {
        let machine = Machine::inspect()?;
        sweep_ended(&crate::control_plane::base_dir());
        std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
        let network = NodeNetwork::create(dir)?;
        let cgroup_root = network.netns().name().to_string();
        let node = RealNode {
            dir: dir.to_path_buf(),
            machine,
            network: Some(network),
            cgroup_root,
            processes: Vec::new(),
            kubeconfig: None,
            figures: StartFigures::default(),
            cluster_dns: false,
        };
        for note in node.notes() {
            eprintln!("real node: {note}");
        }
        Ok(node)
    }

    /// Gives the node's pods a cluster DNS (set before [`RealNode::start`]): the kubelet's
    /// `clusterDNS` is [`CLUSTER_DNS_IP`], and the `resolv.conf` of pods with `dnsPolicy: Default`
    /// names it too, so no pod's lookup ever leaves the test's namespaces. The server itself
    /// ([`crate::cluster_dns`]) is deployed once the node is Ready.
    pub fn with_cluster_dns(&mut self) {
        self.cluster_dns = true;
    }

    /// Opens a relay from `port` on the node's addresses to `127.0.0.1:upstream` on the machine
    /// ([`NodeNetwork::start_relay`]); it closes with the node.
    pub fn relay(
        &mut self,
        name: &'static str,
        port: u16,
        upstream: u16,
    ) -> Result<(), HarnessError> {
        self.network
            .as_mut()
            .ok_or_else(|| HarnessError::Node("the node's network is gone".into()))?
            .start_relay(name, port, upstream)
    }

    /// What this machine lacked and how the node works around it.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = self.machine.notes.clone();
        if let Some(n) = &self.network {
            notes.extend(n.notes().iter().cloned());
        }
        notes
    }

    /// The kube-apiserver flags the node needs: the egress selector (written into the node's
    /// folder), NodeRestriction and the client certificate for the kubelet. The caller adds the
    /// Node authorizer to its `--authorization-mode`.
    pub fn apiserver_args(
        &self,
        admin_cert: &Path,
        admin_key: &Path,
    ) -> Result<Vec<String>, HarnessError> {
        let network = self.network()?;
        let egress = self.dir.join("egress-selector.yaml");
        write(&egress, &network.egress_selector_config())?;
        Ok(vec![
            format!("--egress-selector-config-file={}", egress.display()),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--kubelet-client-certificate={}", admin_cert.display()),
            format!("--kubelet-client-key={}", admin_key.display()),
            "--kubelet-preferred-address-types=InternalIP".into(),
        ])
    }

    fn network(&self) -> Result<&NodeNetwork, HarnessError> {
        self.network
            .as_ref()
            .ok_or_else(|| HarnessError::Node("the node's network is gone".into()))
    }

    /// The node's network namespace.
    pub fn netns(&self) -> Option<&crate::node_net::Netns> {
        self.network.as_ref().map(NodeNetwork::netns)
    }

    /// The figures of its start.
    pub fn figures(&self) -> StartFigures {
        self.figures
    }

    /// The resident set size (KiB) of each of the node's processes (containerd, kube-proxy,
    /// kubelet), read from `/proc/<pid>/status`.
    pub fn rss_kib(&self) -> Vec<(&'static str, u64)> {
        self.processes
            .iter()
            .filter_map(|p| {
                let status =
                    std::fs::read_to_string(format!("/proc/{}/status", p.child.id())).ok()?;
                let kib = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()?;
                Some((p.name, kib))
            })
            .collect()
    }

    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// Starts containerd, imports the images, starts kube-proxy and the kubelet, points the
    /// `kubernetes` Service at the relay and waits until the node is `Ready`.
    pub async fn start(
        &mut self,
        access: &ControlPlaneAccess,
        client: &kube::Client,
        timeout: Duration,
    ) -> Result<(), HarnessError> {
        let started = Instant::now();
        let network = self
            .network
            .as_mut()
            .ok_or_else(|| HarnessError::Node("the node's network is gone".into()))?;
        network.start_api_relay(access.api_port)?;
        for sub in [
            "logs",
            "cni/net.d",
            "cni/ipam",
            "kubelet",
            "pod-logs",
            "containerd",
        ] {
            let path = self.dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| HarnessError::io(&path, e))?;
        }
        self.make_cgroup_root()?;
        self.write_cni_config()?;
        let config = self.write_containerd_config()?;
        let containerd = self.machine.containerd.clone();
        self.spawn(
            "containerd",
            &containerd,
            &["--config".into(), config.display().to_string()],
            &[
                ("HTTP_PROXY", DEAD_PROXY),
                ("HTTPS_PROXY", DEAD_PROXY),
                ("http_proxy", DEAD_PROXY),
                ("https_proxy", DEAD_PROXY),
                ("NO_PROXY", ""),
                ("no_proxy", ""),
            ],
        )?;
        let (ctr, socket) = (self.machine.ctr.clone(), self.containerd_socket());
        self.wait(timeout, "containerd", || {
            let ready = ctr_at(&ctr, &socket, &["version"]).is_ok();
            async move { ready.then_some(()) }
        })
        .await?;

        let images = Instant::now();
        let built = crate::images::test_images()?;
        for archive in &built {
            self.import(&archive.archive)?;
        }
        self.figures.images = images.elapsed();

        let tools = crate::tools::Tools::locate()?;
        let kubelet_kc = self.write_node_kubeconfig(
            access,
            "kubelet.kubeconfig",
            &format!("system:node:{NODE_NAME}"),
            Some("system:nodes"),
        )?;
        let proxy_kc =
            self.write_node_kubeconfig(access, "kube-proxy.kubeconfig", "system:kube-proxy", None)?;
        self.kubeconfig = Some(kubelet_kc.clone());
        let proxy_config = self.write_kube_proxy_config(&proxy_kc)?;
        self.spawn(
            "kube-proxy",
            &tools.bin("kube-proxy"),
            &[
                format!("--config={}", proxy_config.display()),
                "--v=1".into(),
            ],
            &[],
        )?;
        let kubelet_config = self.write_kubelet_config(access)?;
        self.spawn(
            "kubelet",
            &tools.bin("kubelet"),
            &[
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubelet_kc.display()),
                format!("--root-dir={}", self.dir.join("kubelet").display()),
                // Its self-signed serving certificate in the node's folder, not in
                // /var/lib/kubelet/pki, which every node on the machine would share.
                format!("--cert-dir={}", self.dir.join("kubelet/pki").display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                "--v=1".into(),
            ],
            &[],
        )?;
        point_kubernetes_service_at_relay(client).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        self.wait(timeout, "the real node to be Ready", || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get(NODE_NAME).await.ok()?;
                node.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
                    .then_some(())
            }
        })
        .await?;
        self.figures.node_ready = started.elapsed();
        Ok(())
    }

    /// Runs `ctr` against this node's containerd, in the `k8s.io` namespace (the kubelet's).
    pub fn ctr(&self, args: &[&str]) -> Result<String, HarnessError> {
        ctr_at(&self.machine.ctr, &self.containerd_socket(), args)
    }

    /// Imports the OCI archive `archive` (its names are in its index).
    pub fn import(&self, archive: &Path) -> Result<(), HarnessError> {
        let path = archive.display().to_string();
        self.ctr(&["images", "import", "--snapshotter", "overlayfs", &path])
            .map(|_| ())
    }

    /// Imports `image` so that the kubelet finds it by its name and by `<repository>@<digest>`
    /// (as the chart refers to the operator image), and checks that both names are there.
    pub fn import_by_digest(&self, image: &crate::images::BuiltImage) -> Result<(), HarnessError> {
        let by_digest = image.by_digest();
        let repository = by_digest.split('@').next().unwrap_or_default();
        let path = image.archive.display().to_string();
        self.ctr(&[
            "images",
            "import",
            "--snapshotter",
            "overlayfs",
            "--base-name",
            repository,
            "--digests",
            &path,
        ])?;
        let names = self.ctr(&["images", "ls", "--quiet"])?;
        for name in [image.name.as_str(), by_digest.as_str()] {
            if !names.lines().any(|l| l.trim() == name) {
                return Err(HarnessError::Node(format!(
                    "{name} is not in containerd after importing {path}: {names}"
                )));
            }
        }
        Ok(())
    }

    /// Imports what the controller's Jobs and its stand-in vCluster's pods run
    /// ([`crate::images::JobImages`]): the operator image by name and digest, the stand-in
    /// vCluster's images by name.
    pub fn import_job_images(&self, images: &crate::images::JobImages) -> Result<(), HarnessError> {
        self.import_by_digest(&images.operator)?;
        for image in &images.standin_vcluster {
            self.import(&image.archive)?;
        }
        Ok(())
    }

    fn make_cgroup_root(&self) -> Result<(), HarnessError> {
        for hierarchy in &self.machine.cgroup_v1 {
            let dir = hierarchy.join(&self.cgroup_root);
            std::fs::create_dir_all(&dir).map_err(|e| HarnessError::io(&dir, e))?;
            // A new cpuset has no CPUs or memory nodes of its own: its parent's.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                    let _ = std::fs::write(dir.join(file), value.trim());
                }
            }
        }
        Ok(())
    }

    fn write_cni_config(&self) -> Result<(), HarnessError> {
        let config = json!({
            "cniVersion": "1.0.0",
            "name": "platform-operator-e2e",
            "plugins": [{
                "type": "bridge",
                "bridge": POD_BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": self.dir.join("cni/ipam"),
                }
            }]
        });
        let path = self.dir.join("cni/net.d/10-pods.conflist");
        write(&path, &config.to_string())
    }

    fn write_containerd_config(&self) -> Result<PathBuf, HarnessError> {
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        let text = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
oom_score = 0

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{ttrpc}"

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[{cri}]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = {restrict}
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  max_concurrent_downloads = 1

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"
"#,
            root = d("containerd/root"),
            state = d("containerd/state"),
            socket = self.containerd_socket().display(),
            ttrpc = d("containerd.ttrpc.sock"),
            opt = d("containerd/opt"),
            pause = crate::images::PAUSE_IMAGE,
            restrict = !self.machine.sys_resource,
            runc = self.machine.runc.display(),
            cni_bin = self.machine.cni_dir.display(),
            cni_conf = d("cni/net.d"),
        );
        let path = self.dir.join("containerd.toml");
        write(&path, &text)?;
        Ok(path)
    }

    fn write_node_kubeconfig(
        &self,
        access: &ControlPlaneAccess,
        file: &str,
        user: &str,
        group: Option<&str>,
    ) -> Result<PathBuf, HarnessError> {
        let (cert, key) = crate::pki::client_certificate(&access.ca_key, user, group)?;
        let server = format!("https://127.0.0.1:{API_PORT}");
        let yaml = crate::control_plane::kubeconfig_yaml(&server, &access.ca_cert, &cert, &key)?;
        let path = self.dir.join(file);
        write(&path, &yaml)?;
        Ok(path)
    }

    fn write_kube_proxy_config(&self, kubeconfig: &Path) -> Result<PathBuf, HarnessError> {
        // Where bridged replies skip netfilter, only masquerading every Service connection keeps
        // pod-to-Service-to-pod on one bridge working.
        let masquerade_all = self.network.as_ref().is_some_and(|n| !n.bridge_nf_call());
        let config = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "mode": "iptables",
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            // Leave the kernel's connection-tracking settings alone (they are not this test's).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s"
            },
            "iptables": {"masqueradeAll": masquerade_all},
            "nodePortAddresses": [format!("{NODE_IP}/32")]
        });
        let path = self.dir.join("kube-proxy.yaml");
        write(&path, &config.to_string())?;
        Ok(path)
    }

    fn write_kubelet_config(&self, access: &ControlPlaneAccess) -> Result<PathBuf, HarnessError> {
        let resolv = self.dir.join("resolv.conf");
        let resolv_text = if self.cluster_dns {
            format!(
                "# The real node's pods ask only the cluster DNS, which forwards nowhere.\n\
                 nameserver {CLUSTER_DNS_IP}\n"
            )
        } else {
            "# The real node's pods get no name servers: nothing of theirs is looked up.\n".into()
        };
        write(&resolv, &resolv_text)?;
        let mut config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": access.ca_file}
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": format!("unix://{}", self.containerd_socket().display()),
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", self.cgroup_root),
            "failSwapOn": false,
            "oomScoreAdj": if self.machine.sys_resource { -999 } else { 0 },
            "resolvConf": resolv,
            "clusterDomain": "cluster.local",
            "podLogsDir": self.dir.join("pod-logs"),
            "registerNode": true,
            "serializeImagePulls": false,
            "protectKernelDefaults": false,
            "makeIPTablesUtilChains": false,
            "maxPods": 110,
            // Images are imported, never pulled: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%"
            },
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "enableServer": true,
            "rotateCertificates": false,
            "serverTLSBootstrap": false
        });
        if !self.machine.cgroup_v1.is_empty() {
            config["failCgroupV1"] = json!(false);
        }
        if self.cluster_dns {
            config["clusterDNS"] = json!([CLUSTER_DNS_IP]);
        }
        let path = self.dir.join("kubelet.yaml");
        write(&path, &config.to_string())?;
        Ok(path)
    }

    fn spawn(
        &mut self,
        name: &'static str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<(), HarnessError> {
        let network = self.network()?;
        let log_path = self.dir.join("logs").join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).map_err(|e| HarnessError::io(&log_path, e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| HarnessError::io(&log_path, e))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .env("PATH", SYSTEM_PATH)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .current_dir(&self.dir);
        for (k, v) in env {
            command.env(k, v);
        }
        crate::process::die_with_parent(&mut command);
        network.netns().enter_on_spawn(&mut command);
        let child = command.spawn().map_err(|e| HarnessError::io(program, e))?;
        self.processes.push(Process { name, child });
        Ok(())
    }

    async fn wait<F, Fut>(
        &mut self,
        timeout: Duration,
        what: &str,
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
                    let log = self.dir.join("logs").join(format!("{}.log", p.name));
                    return Err(HarnessError::Exited {
                        name: p.name,
                        status: format!(
                            "{status} (log: {}; its last error: {})",
                            log.display(),
                            last_error_line(&log).unwrap_or_else(|| "none".into())
                        ),
                    });
                }
            }
            if start.elapsed() > timeout {
                return Err(HarnessError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes every pod on the node through the API (the kubelet stops their sandboxes and
    /// networks), and waits until containerd runs no task, up to `timeout`.
    pub async fn drain(&self, client: &kube::Client, timeout: Duration) {
        let pods: Api<Pod> = Api::all(client.clone());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={NODE_NAME}"));
        if let Ok(list) = pods.list(&on_node).await {
            for pod in list {
                let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
                    continue;
                };
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let _ = api
                    .delete(&name, &DeleteParams::default().grace_period(0))
                    .await;
            }
        }
        let start = Instant::now();
        while start.elapsed() < timeout {
            match self.ctr(&["tasks", "ls", "--quiet"]) {
                Ok(out) if out.trim().is_empty() => return,
                Err(_) => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Stops every process by pid, newest first, then removes what the node made.
    pub fn stop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            crate::process::terminate(&mut p.child, Duration::from_secs(5));
        }
        self.kill_leftovers();
        unmount_under(&self.dir);
        self.remove_cgroups();
        remove_container_log_links(&self.dir.join("pod-logs"));
        self.network.take();
    }

    /// Kills the shims of this node's containerd (found by its socket in their arguments) and
    /// every process left in the node's cgroups.
    fn kill_leftovers(&self) {
        let mut pids = shims_of(&self.containerd_socket());
        for hierarchy in &self.machine.cgroup_v1 {
            collect_cgroup_pids(&hierarchy.join(&self.cgroup_root), &mut pids);
        }
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            kill(pid);
        }
    }

    fn remove_cgroups(&self) {
        remove_cgroups(&self.machine.cgroup_v1, &self.cgroup_root);
    }
}

/// The containerd shims started by the containerd at `socket` (its address is in their
/// arguments).
fn shims_of(socket: &Path) -> Vec<i32> {
    let socket = socket.display().to_string();
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
        if is_shim && args.contains(&socket.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Removes the cgroup `name` (and its children) from each of `hierarchies`, retrying for up to
/// five seconds while killed processes leave it.
fn remove_cgroups(hierarchies: &[PathBuf], name: &str) {
    for hierarchy in hierarchies {
        let root = hierarchy.join(name);
        let deadline = Instant::now() + Duration::from_secs(5);
        while root.exists() && Instant::now() < deadline {
            remove_cgroup_tree(&root);
            if root.exists() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what the real nodes of test processes that ended without stopping them (killed, or
/// a shared control plane whose process was) left behind: under `base` (the control planes'
/// folders, `<name>-<pid>-<time>`), the shims of their containerd and every mount; then the
/// cgroups and network namespaces (`po-<pid>-<n>`) of those processes. Their folders stay, for
/// whoever owns them; a process that still runs is never touched.
pub fn sweep_ended(base: &Path) {
    if let Ok(entries) = std::fs::read_dir(base) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
            let node = entry.path().join("node");
            if pid.is_some_and(|p| !alive(p)) && node.is_dir() {
                for shim in shims_of(&node.join("containerd.sock")) {
                    kill(shim);
                }
                unmount_under(&entry.path());
            }
        }
    }
    let Ok(namespaces) = std::fs::read_dir("/run/netns") else {
        return;
    };
    let hierarchies = cgroup_v1_hierarchies();
    for entry in namespaces.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("po-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_none_or(alive) {
            continue;
        }
        let mut pids = Vec::new();
        for hierarchy in &hierarchies {
            collect_cgroup_pids(&hierarchy.join(&name), &mut pids);
        }
        for pid in pids {
            kill(pid);
        }
        remove_cgroups(&hierarchies, &name);
        crate::node_net::delete_netns(&name);
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `ctr` against the containerd at `socket`, in the `k8s.io` namespace.
fn ctr_at(ctr: &Path, socket: &Path, args: &[&str]) -> Result<String, HarnessError> {
    let mut cmd = Command::new(ctr);
    cmd.arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io"])
        .args(args);
    crate::cmd::run(cmd, None)?.ok(&format!("ctr {}", args.join(" ")))
}

fn write(path: &Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(path, text).map_err(|e| HarnessError::io(path, e))
}

#[allow(unsafe_code)]
fn kill(pid: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

fn collect_cgroup_pids(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_pids(&entry.path(), pids);
            }
        }
    }
}

/// Removes a cgroup and its children, deepest first (a cgroup's files go with its rmdir).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Unmounts every mount point under `dir` (the kubelet's volumes, containers' root
/// filesystems, the pods' network namespace files), deepest first.
#[allow(unsafe_code)]
pub fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let Ok(c) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2(2) with a valid NUL-terminated path.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// Removes the kubelet's links in `/var/log/containers` that point into `pod_logs`.
fn remove_container_log_links(pod_logs: &Path) {
    let Ok(entries) = std::fs::read_dir("/var/log/containers") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        if std::fs::read_link(entry.path()).is_ok_and(|t| t.starts_with(pod_logs)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Points the `kubernetes` Service at the relay inside the node's namespace (the API server of
/// a test runs with `--endpoint-reconciler-type=none` and advertises 127.0.0.1, which means
/// nothing inside a pod).
async fn point_kubernetes_service_at_relay(client: &kube::Client) -> Result<(), HarnessError> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes-real-node",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "platform-operator-e2e"
            }
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": API_PORT, "protocol": "TCP"}]
    }))
    .map_err(|e| HarnessError::Node(format!("EndpointSlice: {e}")))?;
    match slices.create(&PostParams::default(), &slice).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(HarnessError::Node(format!(
            "the kubernetes Service's EndpointSlice: {e}"
        ))),
    }
}
