//! The real node's network, confined: a network namespace of its own (the node's address, the
//! pod bridge and every pod's interface live there or in the pods' namespaces below it), no link
//! to the machine's network, forwarding from the pod bridge to anything but itself dropped, and
//! two doors the harness holds open on loopback-only terms:
//!
//! - the **API server relay**: a listener inside the node's namespace ([`API_PORT`] on every
//!   address there, so the kubelet, kube-proxy, pods behind the `kubernetes` Service and
//!   processes a test starts in the namespace on `https://127.0.0.1:6443` reach it) whose
//!   connections the harness carries to the API server on the machine's 127.0.0.1;
//! - the **egress proxy**: an HTTP CONNECT proxy on a Unix socket that the API server's egress
//!   selector (`cluster`: webhooks, the kubelet's logs and exec) uses, dialling from inside the
//!   node's namespace, only IP addresses (no name is ever looked up).
//!
//! More doors are [`Relay`]s: a port in the namespace (any free one with port 0) carried to a
//! server of the test on the machine's loopback, closed when dropped; and [`ReverseRelay`]s, the
//! other way: a port on the machine's loopback carried to a server a test started on the
//! namespace's own loopback.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Semaphore;

use crate::HarnessError;

/// The node's address (on a dummy device, or a bridge without ports where this machine has no
/// dummy devices), inside its namespace.
pub const NODE_IP: &str = "10.254.0.2";
/// The prefix of the node's address.
const NODE_PREFIX: u8 = 24;
/// The device that holds the node's address.
const NODE_DEVICE: &str = "po-node0";
/// The pods' addresses (the CNI bridge plugin's host-local range).
pub const POD_CIDR: &str = "10.88.0.0/16";
/// The pod bridge the CNI bridge plugin creates in the node's namespace.
pub const POD_BRIDGE: &str = "po-pods0";
/// The port of the API server relay inside the node's namespace.
pub const API_PORT: u16 = 6443;
/// Connections each door carries at once; more wait.
const MAX_IN_FLIGHT: usize = 256;
/// Connections the API server relay carries at once; more wait. Every watch holds one
/// (HTTP/1.1): the kubelet's, kube-proxy's, the pods' and those of the controllers the tests start
/// in the node's namespace, several at once in one test process.
const API_RELAY_IN_FLIGHT: usize = 1024;
/// How long the egress proxy waits for a CONNECT request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A network namespace the harness created, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    handle: NetnsHandle,
}

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

impl Netns {
    /// Creates a new namespace `po-<pid>-<n>` with loopback up.
    pub fn create() -> Result<Self, HarnessError> {
        let name = format!(
            "po-{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        );
        run_ip(&["netns", "add", &name])?;
        let path = Path::new("/run/netns").join(&name);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                let _ = run_ip(&["netns", "del", &name]);
                return Err(HarnessError::io(&path, e));
            }
        };
        let ns = Netns {
            name,
            handle: NetnsHandle(file),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name (under `/run/netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n <name> args`.
    pub fn ip(&self, args: &[&str]) -> Result<(), HarnessError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_ip(&all)
    }

    /// Runs `program args` inside the namespace (`ip netns exec`), returning its output.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String, HarnessError> {
        let mut cmd = Command::new(ip_binary());
        cmd.args(["netns", "exec", &self.name, program])
            .args(args)
            .env("PATH", crate::real_node::SYSTEM_PATH);
        let what = format!("{program} {} (in {})", args.join(" "), self.name);
        crate::cmd::run(cmd, None)?.ok(&what)
    }

    /// Makes `command` start inside this namespace (the namespace must outlive its spawn).
    pub fn enter_on_spawn(&self, command: &mut Command) {
        self.handle.enter_on_spawn(command);
    }

    /// A handle for moving threads into this namespace.
    pub fn handle(&self) -> std::io::Result<NetnsHandle> {
        self.handle.try_clone()
    }
}

/// An open namespace file, for moving threads and new processes into it (it does not delete the
/// namespace).
#[derive(Debug)]
pub struct NetnsHandle(File);

impl NetnsHandle {
    /// Opens the namespace `name` (under `/run/netns`), such as a real node's
    /// ([`crate::shared::Shared::node_netns`]).
    pub fn open(name: &str) -> std::io::Result<Self> {
        File::open(Path::new("/run/netns").join(name)).map(NetnsHandle)
    }

    /// Makes `command` start inside the namespace (the handle must outlive its spawn).
    #[allow(unsafe_code)]
    pub fn enter_on_spawn(&self, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        let fd = self.0.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and calls only setns(2), which
        // is async-signal-safe; `fd` stays open in the parent (and so in the child) until then.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Another handle on the same namespace.
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(NetnsHandle(self.0.try_clone()?))
    }

    /// Moves the calling thread into the namespace: sockets it creates from now on live there.
    #[allow(unsafe_code)]
    pub fn enter_thread(&self) -> std::io::Result<()> {
        // SAFETY: setns(2) on a namespace file we hold open; it affects only this thread.
        if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// A plain-HTTP GET of `path` on `127.0.0.1:port` inside the namespace, from a thread that
    /// enters it ([`crate::control_plane::blocking_get`]): the status code and the whole response
    /// text.
    pub async fn plain_get(&self, port: u16, path: &str) -> Option<(u16, String)> {
        let handle = self.try_clone().ok()?;
        let path = path.to_string();
        tokio::task::spawn_blocking(move || {
            // A thread of its own: the blocking pool's threads are reused, and this one does not
            // come back from the namespace.
            std::thread::spawn(move || {
                handle.enter_thread().ok()?;
                crate::control_plane::blocking_get(port, &path)
            })
            .join()
            .ok()
            .flatten()
        })
        .await
        .ok()
        .flatten()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete_netns(&self.name);
    }
}

/// Deletes the network namespace `name` (with its devices and rules), if it exists.
pub fn delete_netns(name: &str) {
    let _ = run_ip(&["netns", "del", name]);
}

fn ip_binary() -> PathBuf {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("ip"))
}

fn run_ip(args: &[&str]) -> Result<(), HarnessError> {
    let mut cmd = Command::new(ip_binary());
    cmd.args(args);
    crate::cmd::run(cmd, None)?
        .ok(&format!("ip {}", args.join(" ")))
        .map(|_| ())
}

/// The node's confined network: its namespace, its address and the doors in and out.
pub struct NodeNetwork {
    netns: Netns,
    egress_socket: PathBuf,
    bridge_nf_call: bool,
    notes: Vec<String>,
    /// The relays into the namespace, the API server relay among them.
    relays: Vec<Relay>,
    /// Dropped (or sent) to stop the egress proxy.
    stop: tokio::sync::watch::Sender<()>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for NodeNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeNetwork")
            .field("netns", &self.netns.name)
            .finish()
    }
}

impl NodeNetwork {
    /// Creates the namespace, the node's address (a dummy device, or a bridge without ports where
    /// the machine has no dummy devices: noted), a default route into that device (a dead end:
    /// nothing is attached to it), the forwarding rule and the egress proxy on
    /// `<dir>/egress.sock`.
    pub fn create(dir: &Path) -> Result<Self, HarnessError> {
        let netns = Netns::create()?;
        let mut notes = Vec::new();
        if netns
            .ip(&["link", "add", NODE_DEVICE, "type", "dummy"])
            .is_err()
        {
            netns.ip(&["link", "add", NODE_DEVICE, "type", "bridge"])?;
            notes.push(format!(
                "no dummy network devices on this machine: the node's address {NODE_IP} is on \
                 {NODE_DEVICE}, a bridge without ports"
            ));
        }
        let address = format!("{NODE_IP}/{NODE_PREFIX}");
        netns.ip(&["addr", "add", &address, "dev", NODE_DEVICE])?;
        netns.ip(&["link", "set", NODE_DEVICE, "up"])?;
        // Every destination that is not local goes into the device with nothing behind it (also
        // the Service range, whose addresses kube-proxy rewrites before they leave).
        netns.ip(&["route", "add", "default", "dev", NODE_DEVICE])?;
        // No IPv6 in the node's namespace (no link-local addresses either).
        netns.exec(
            "sh",
            &[
                "-c",
                "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; \
                 echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; \
                 echo 1 > /proc/sys/net/ipv4/ip_forward",
            ],
        )?;
        // Pods reach each other through Services on one bridge: the replies must pass netfilter
        // to be un-NATed. Where the kernel keeps this per namespace, set it here.
        let bridge_nf_call = netns
            .exec(
                "sh",
                &[
                    "-c",
                    "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables",
                ],
            )
            .is_ok();
        if !bridge_nf_call {
            notes.push(
                "net.bridge.bridge-nf-call-iptables cannot be set in the node's namespace: \
                 kube-proxy masquerades all Service traffic instead"
                    .into(),
            );
        }
        // Nothing the pods send leaves through any device but their own bridge. In the mangle
        // table, which kube-proxy leaves alone, so that none of its accept rules comes first.
        netns.exec(
            "iptables",
            &[
                "-w", "-t", "mangle", "-A", "FORWARD", "-i", POD_BRIDGE, "!", "-o", POD_BRIDGE,
                "-j", "DROP",
            ],
        )?;
        let egress_socket = dir.join("egress.sock");
        let mut network = NodeNetwork {
            netns,
            egress_socket,
            bridge_nf_call,
            notes,
            relays: Vec::new(),
            stop: tokio::sync::watch::channel(()).0,
            threads: Vec::new(),
        };
        network.start_egress_proxy()?;
        Ok(network)
    }

    /// The namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// Whether bridged traffic in the node's namespace passes iptables
    /// (`net.bridge.bridge-nf-call-iptables`); without it kube-proxy masquerades everything.
    pub fn bridge_nf_call(&self) -> bool {
        self.bridge_nf_call
    }

    /// What this machine lacked and how the network works around it.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The egress selector configuration for kube-apiserver: the `cluster` traffic (webhooks,
    /// the kubelet) through the egress proxy.
    pub fn egress_selector_config(&self) -> String {
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\n\
             kind: EgressSelectorConfiguration\n\
             egressSelections:\n\
             - name: cluster\n  \
               connection:\n    \
                 proxyProtocol: HTTPConnect\n    \
                 transport:\n      \
                   uds:\n        \
                     udsName: {}\n",
            self.egress_socket.display()
        )
    }

    fn start_egress_proxy(&mut self) -> Result<(), HarnessError> {
        let _ = std::fs::remove_file(&self.egress_socket);
        let listener = std::os::unix::net::UnixListener::bind(&self.egress_socket)
            .map_err(|e| HarnessError::io(&self.egress_socket, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| HarnessError::io(&self.egress_socket, e))?;
        let netns = self.handle()?;
        let mut stop = self.stop.subscribe();
        let thread = std::thread::Builder::new()
            .name("egress-proxy".into())
            .spawn(move || {
                // Every socket this thread's runtime dials lives in the node's namespace.
                if netns.enter_thread().is_err() {
                    return;
                }
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
                        return;
                    };
                    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
                    loop {
                        let accepted = tokio::select! {
                            _ = stop.changed() => return,
                            accepted = listener.accept() => accepted,
                        };
                        let Ok((stream, _)) = accepted else { continue };
                        let Ok(permit) = slots.clone().acquire_owned().await else {
                            return;
                        };
                        tokio::spawn(async move {
                            let _permit = permit;
                            let _ = connect_once(stream).await;
                        });
                    }
                });
            })
            .map_err(|e| HarnessError::io(Path::new("egress-proxy thread"), e))?;
        self.threads.push(thread);
        Ok(())
    }

    /// Opens the API server relay: [`API_PORT`] on every address of the node's namespace,
    /// carried to `127.0.0.1:api_port` on the machine.
    pub fn start_api_relay(&mut self, api_port: u16) -> Result<(), HarnessError> {
        let relay = Relay::open_bounded(
            &self.handle()?,
            "api-relay",
            (API_PORT, api_port),
            API_RELAY_IN_FLIGHT,
        )?;
        self.relays.push(relay);
        Ok(())
    }

    /// Opens a relay ([`Relay::open`]) that closes with the network: `port` on every address of
    /// the node's namespace, carried to `127.0.0.1:upstream` on the machine.
    pub fn start_relay(
        &mut self,
        name: &'static str,
        port: u16,
        upstream: u16,
    ) -> Result<(), HarnessError> {
        let relay = Relay::open(&self.handle()?, name, port, upstream)?;
        self.relays.push(relay);
        Ok(())
    }

    fn handle(&self) -> Result<NetnsHandle, HarnessError> {
        self.netns
            .handle()
            .map_err(|e| HarnessError::io(Path::new("/run/netns"), e))
    }
}

/// A door into a network namespace: a port on every address there whose connections are carried
/// to a server of the test on the machine's loopback (`127.0.0.1:<upstream>`), which so becomes
/// reachable from inside without anything leaving the test's namespaces. It carries at most
/// [`MAX_IN_FLIGHT`] connections at once (more wait) and stops when dropped: its listener closed
/// and the connections it carries ended.
pub struct Relay {
    name: &'static str,
    port: u16,
    /// Dropped (or sent) to stop it.
    stop: tokio::sync::watch::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish()
    }
}

impl Relay {
    /// Opens `port` (0: any free port there) on every address of the namespace `netns`, carrying
    /// each connection to `127.0.0.1:upstream` on the machine; [`Relay::port`] says which port.
    pub fn open(
        netns: &NetnsHandle,
        name: &'static str,
        port: u16,
        upstream: u16,
    ) -> Result<Self, HarnessError> {
        Self::open_bounded(netns, name, (port, upstream), MAX_IN_FLIGHT)
    }

    /// As [`Relay::open`], carrying at most `in_flight` connections at once.
    fn open_bounded(
        netns: &NetnsHandle,
        name: &'static str,
        (port, upstream): (u16, u16),
        in_flight: usize,
    ) -> Result<Self, HarnessError> {
        let listener = {
            let netns = netns
                .try_clone()
                .map_err(|e| HarnessError::io(Path::new("/run/netns"), e))?;
            // Bound by a short-lived thread inside the namespace; the listener stays there.
            std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
                netns.enter_thread()?;
                let listener = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))?;
                listener.set_nonblocking(true)?;
                Ok(listener)
            })
            .join()
            .map_err(|_| HarnessError::Pki("the relay's thread panicked".into()))?
            .map_err(|e| HarnessError::io(Path::new(name), e))?
        };
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io(Path::new(name), e))?
            .port();
        let (stop, thread) = carry(name, listener, upstream, in_flight, None)?;
        Ok(Relay {
            name,
            port,
            stop,
            thread: Some(thread),
        })
    }

    /// The port it listens on inside the namespace.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.send_replace(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A door out of a network namespace: a port on the machine's 127.0.0.1 whose connections are
/// carried to `127.0.0.1:<inner>` inside the namespace (a server a test started there, such as
/// the operations port of a controller run in a real node's namespace), which so becomes
/// reachable from the machine. It carries at most [`MAX_IN_FLIGHT`] connections at once (more
/// wait) and stops when dropped: its listener closed and the connections it carries ended.
pub struct ReverseRelay {
    name: &'static str,
    port: u16,
    /// Dropped (or sent) to stop it.
    stop: tokio::sync::watch::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ReverseRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReverseRelay")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish()
    }
}

impl ReverseRelay {
    /// Opens a free port on the machine's 127.0.0.1 ([`ReverseRelay::port`] says which), carrying
    /// each connection to `127.0.0.1:inner` inside the namespace `netns` (dialled from a thread
    /// that entered it).
    pub fn open(netns: &NetnsHandle, name: &'static str, inner: u16) -> Result<Self, HarnessError> {
        let io = |e| HarnessError::io(Path::new(name), e);
        // Bound by the calling thread, in the machine's namespace; the socket stays there.
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let port = listener.local_addr().map_err(io)?.port();
        let netns = netns
            .try_clone()
            .map_err(|e| HarnessError::io(Path::new("/run/netns"), e))?;
        let (stop, thread) = carry(name, listener, inner, MAX_IN_FLIGHT, Some(netns))?;
        Ok(ReverseRelay {
            name,
            port,
            stop,
            thread: Some(thread),
        })
    }

    /// The port it listens on, on the machine's 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for ReverseRelay {
    fn drop(&mut self) {
        self.stop.send_replace(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Carries each connection `listener` accepts to `127.0.0.1:upstream`, at most `in_flight` at
/// once, on a thread of its own (named `name`) with a runtime of its own, which first enters
/// `dial_in` when given: the connections to `upstream` are made in that namespace. Stops when
/// the returned sender is dropped or sent to.
fn carry(
    name: &'static str,
    listener: std::net::TcpListener,
    upstream: u16,
    in_flight: usize,
    dial_in: Option<NetnsHandle>,
) -> Result<(tokio::sync::watch::Sender<()>, std::thread::JoinHandle<()>), HarnessError> {
    let (stop, mut stopped) = tokio::sync::watch::channel(());
    let thread = crate::process::spawn_on_own_runtime(name, move || async move {
        // A current-thread runtime: every socket its tasks dial is made on this thread.
        if dial_in.is_some_and(|netns| netns.enter_thread().is_err()) {
            return;
        }
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
            return;
        };
        let slots = Arc::new(Semaphore::new(in_flight));
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream));
        loop {
            let accepted = tokio::select! {
                _ = stopped.changed() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((mut inside, _)) = accepted else {
                continue;
            };
            let permit = tokio::select! {
                _ = stopped.changed() => return,
                permit = slots.clone().acquire_owned() => permit,
            };
            let Ok(permit) = permit else {
                return;
            };
            tokio::spawn(async move {
                let _permit = permit;
                if let Ok(mut outside) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                }
            });
        }
    })
    .map_err(|e| HarnessError::io(Path::new(name), e))?;
    Ok((stop, thread))
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        // The relays first, while their namespace is still there.
        self.relays.clear();
        self.stop.send_replace(());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.egress_socket);
    }
}

/// Serves one CONNECT request: `CONNECT <ip>:<port>`, dialled from the node's namespace.
async fn connect_once(stream: tokio::net::UnixStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let head = tokio::time::timeout(HEAD_TIMEOUT, async {
        let mut first = String::new();
        reader.read_line(&mut first).await?;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await? == 0 || line == "\r\n" || line == "\n" {
                break;
            }
        }
        Ok::<_, std::io::Error>(first)
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "CONNECT head"))??;
    let target = parse_connect(&head);
    let Some(target) = target else {
        reader
            .get_mut()
            .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            .await?;
        return Ok(());
    };
    let mut upstream = match tokio::net::TcpStream::connect(target).await {
        Ok(s) => s,
        Err(e) => {
            let reply = format!("HTTP/1.1 502 Bad Gateway\r\n\r\n{e}");
            reader.get_mut().write_all(reply.as_bytes()).await?;
            return Ok(());
        }
    };
    reader
        .get_mut()
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    // Anything the client sent after the head is still in the reader's buffer.
    let buffered = reader.buffer().to_vec();
    let mut stream = reader.into_inner();
    if !buffered.is_empty() {
        upstream.write_all(&buffered).await?;
    }
    tokio::io::copy_bidirectional(&mut stream, &mut upstream).await?;
    Ok(())
}

/// The target of a `CONNECT <ip>:<port> HTTP/1.x` request line; names are refused (nothing is
/// looked up).
fn parse_connect(line: &str) -> Option<SocketAddr> {
    let mut parts = line.split_whitespace();
    if parts.next()? != "CONNECT" {
        return None;
    }
    let target: SocketAddr = parts.next()?.parse().ok()?;
    parts.next()?.starts_with("HTTP/1.").then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_takes_only_ip_addresses() {
        assert_eq!(
            parse_connect("CONNECT 10.96.0.10:443 HTTP/1.1\r\n"),
            Some(SocketAddr::from(([10, 96, 0, 10], 443)))
        );
        assert_eq!(
            parse_connect("CONNECT registry.example:443 HTTP/1.1\r\n"),
            None
        );
        assert_eq!(parse_connect("GET / HTTP/1.1\r\n"), None);
        assert_eq!(parse_connect("CONNECT 10.0.0.1:1\r\n"), None);
    }
}
