//! End-to-end faults (issue 15, items 6, 9 and 11): the controller binary on the local control
//! plane with the stand-in vCluster chart (named a stand-in: the real chart cannot be fetched
//! here). A leader whose API connection stalls behind a loopback proxy is replaced only after it
//! has stopped working; an orphan of a tool the controller runs (helm) leaves no zombie; host
//! namespaces and vCluster values carry the Pod Security levels. The control plane has a real
//! node.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use e2e::shared::Shared;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod support;
use support::{Controller, fixture, get, wait_for};

fn instance(ns: &str, name: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: Retain\n"
    )
}

/// An executable shell script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).expect("script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Whether `pid` runs (present and not a zombie).
fn alive(pid: i32) -> bool {
    controller::reaper::processes()
        .iter()
        .any(|p| p.pid == pid && p.state != 'Z')
}

/// A loopback TCP proxy to `target` that forwards until [`Proxy::stall`]: from then on it
/// forwards nothing more in either direction and closes nothing (connections hang, as behind a
/// dead link or a wedged load balancer).
struct Proxy {
    port: u16,
    stalled: Arc<AtomicBool>,
    /// Bytes forwarded after the stall (must stay 0).
    leaked: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stalled = Arc::new(AtomicBool::new(false));
        let leaked = Arc::new(AtomicU64::new(0));
        let (s, l) = (stalled.clone(), leaked.clone());
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                if s.load(Ordering::SeqCst) {
                    held.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, s.clone(), l.clone()));
                tokio::spawn(pump(sr, cw, s.clone(), l.clone()));
            }
        });
        Proxy {
            port,
            stalled,
            leaked,
            task,
        }
    }

    fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: Arc<AtomicBool>,
    leaked: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Stalled: hold what was read, and both halves, for ever.
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if stalled.load(Ordering::SeqCst) {
            leaked.fetch_add(n as u64, Ordering::SeqCst);
        }
    }
}

/// The port of `cluster`'s API server (on loopback).
fn api_port(cluster: &Shared) -> u16 {
    std::fs::read_to_string(&cluster.kubeconfig)
        .expect("kubeconfig")
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("a loopback server")
}

/// `cluster`'s kubeconfig with its server moved to `127.0.0.1:<port>` (the same address, so the
/// certificate still fits).
fn kubeconfig_via(cluster: &Shared, port: u16, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(&cluster.kubeconfig).expect("kubeconfig");
    let target = api_port(cluster);
    let path = dir.join(format!("kubeconfig-via-{port}"));
    std::fs::write(
        &path,
        text.replace(
            &format!("server: https://127.0.0.1:{target}"),
            &format!("server: https://127.0.0.1:{port}"),
        ),
    )
    .expect("kubeconfig");
    path
}

fn holder(cluster: &Shared, operator_ns: &str) -> Option<String> {
    let lease = get(
        cluster,
        &[
            "-n",
            operator_ns,
            "get",
            "lease",
            "platform-operator-controller",
        ],
    )?;
    lease["spec"]["holderIdentity"].as_str().map(String::from)
}

/// The shipped lease timings but a shorter renew interval: a take-over takes seconds, and a
/// leader on a loaded machine (CI shares two cores with the control plane) does not lose its
/// lease before the test stalls its link.
const LEASE: [&str; 3] = [
    "--leader-lease-duration=15s",
    "--leader-renew-deadline=10s",
    "--leader-renew-interval=2s",
];

#[tokio::test]
async fn a_leader_whose_api_connection_stalls_stops_working_before_another_takes_over() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "stall").await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");

    // The old leader reaches the API server through the proxy; its helm hangs in an upgrade
    // with a child of its own (work in flight when the link stalls).
    let proxy = Proxy::start(api_port(&cluster)).await;
    let via = kubeconfig_via(&cluster, proxy.port, &fx.dir);
    let upgrades = fx.dir.join("helm-upgrades");
    let slow_helm = script(
        &fx.dir,
        "slow-helm",
        &format!(
            "if [ \"$1\" = upgrade ]; then echo $$ >> {}; sleep 3600 & wait; fi\nexec {} \"$@\"\n",
            upgrades.display(),
            cluster.helm.display()
        ),
    );
    let proxied = Shared {
        kubeconfig: via,
        ..cluster.clone()
    };
    let slow = slow_helm.display().to_string();
    let mut old_args = vec![
        "--identity",
        "old",
        "--helm-binary",
        &slow,
        "--watch-namespace",
        &team,
    ];
    old_args.extend(LEASE);
    let mut old = Controller::start(&proxied, &fx, &old_args);
    wait_for("the old leader", Duration::from_secs(60), &old, || {
        (holder(&cluster, &fx.operator_ns)? == "old").then_some(())
    })
    .await;
    let mut new_args = vec!["--identity", "new", "--watch-namespace", &team];
    new_args.extend(LEASE);
    let new = Controller::start(&cluster, &fx, &new_args);

    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "stalled")),
        )
        .expect("apply");
    wait_for("helm upgrading", Duration::from_secs(60), &old, || {
        std::fs::read_to_string(&upgrades)
            .ok()
            .filter(|t| !t.trim().is_empty())
    })
    .await;
    let me = i32::try_from(old.pid()).expect("pid");
    let tools = controller::reaper::descendants(&controller::reaper::processes(), me);
    assert!(
        tools.len() >= 2,
        "helm and its child run under the old leader: {tools:?}"
    );
    wait_for("the standby to wait", Duration::from_secs(60), &new, || {
        new.log()
            .contains("waiting for the leader lease")
            .then_some(())
    })
    .await;

    proxy.stall();
    let stalled = Instant::now();
    let mut old_stopped = None;
    let taken = loop {
        // The holder is read first: if the new replica holds the lease now, whatever is
        // observed of the old one afterwards was also true when the lease changed hands.
        let leader = holder(&cluster, &fx.operator_ns);
        let old_exited = old.child.try_wait().expect("wait").is_some();
        let tools_alive: Vec<i32> = tools.iter().copied().filter(|p| alive(*p)).collect();
        if old_exited && tools_alive.is_empty() && old_stopped.is_none() {
            old_stopped = Some(stalled.elapsed());
        }
        if leader.as_deref() == Some("new") {
            assert!(
                old_exited,
                "the new leader took over while the old one still ran:\n{}",
                old.log()
            );
            assert!(
                tools_alive.is_empty(),
                "the old leader's tools {tools_alive:?} outlived it"
            );
            break stalled.elapsed();
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(90),
            "no new leader 90 s after the stall\n--- old ---\n{}\n--- new ---\n{}",
            old.log(),
            new.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let old_stopped = old_stopped.expect("stopped before the take-over");
    println!(
        "stall → old leader stopped with its tools: {:.1} s; → new leader: {:.1} s",
        old_stopped.as_secs_f64(),
        taken.as_secs_f64()
    );
    let status = old.child.try_wait().expect("wait").expect("exited");
    assert!(!status.success(), "a lost lease is an error exit: {status}");
    assert!(old.log().contains("lost the leader lease"), "{}", old.log());
    assert_eq!(
        proxy.leaked.load(Ordering::SeqCst),
        0,
        "nothing passed the stalled link"
    );

    // The new leader carries on with the work (its helm is the real one).
    wait_for(
        "the new leader to provision",
        Duration::from_secs(120),
        &new,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "stalled"])?;
            (pi["status"]["phase"] == "Installing").then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn an_orphan_of_helm_leaves_no_zombie_and_host_namespaces_carry_pod_security() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "zombie").await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");

    // A helm that leaves an orphan (a child that starts a grandchild and exits at once, as a
    // daemonising plugin does), then runs the real helm. The controller's only tools are helm and
    // the post-renderer helm starts: the platform program runs in install pods.
    let orphans = fx.dir.join("orphans");
    let helm = script(
        &fx.dir,
        "orphaning-helm",
        &format!(
            "sh -c 'sleep 5 & echo $! >> {}'\nexec {} \"$@\"\n",
            orphans.display(),
            cluster.helm.display()
        ),
    );
    let helm = helm.display().to_string();
    let controller = Controller::start(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--watch-namespace",
            &team,
            "--helm-binary",
            &helm,
            "--pod-security-standard",
            "restricted",
        ],
    );
    let me = i32::try_from(controller.pid()).expect("pid");
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "orphans")),
        )
        .expect("apply");

    // The orphan is adopted by the controller (its child subreaper) and reaped when it ends.
    let orphan: i32 = wait_for(
        "the stand-in helm to leave an orphan",
        Duration::from_secs(120),
        &controller,
        || {
            std::fs::read_to_string(&orphans)
                .ok()?
                .lines()
                .next()?
                .trim()
                .parse()
                .ok()
        },
    )
    .await;
    let adopted = controller::reaper::processes()
        .into_iter()
        .find(|p| p.pid == orphan)
        .map(|p| p.ppid);
    assert_eq!(
        adopted,
        Some(me),
        "the orphan is re-parented to the controller"
    );
    wait_for(
        "the orphan to end",
        Duration::from_secs(60),
        &controller,
        || (!alive(orphan)).then_some(()),
    )
    .await;
    // Reaping follows the child's exit signal; allow the sweep a moment, then count.
    let zombies = wait_for(
        "no zombie children of the controller",
        Duration::from_secs(20),
        &controller,
        || {
            let zombies: Vec<i32> = controller::reaper::processes()
                .into_iter()
                .filter(|p| p.ppid == me && p.state == 'Z')
                .map(|p| p.pid)
                .collect();
            zombies.is_empty().then_some(zombies)
        },
    )
    .await;
    assert!(zombies.is_empty());

    // Pod Security: the host namespace admits the control plane and warns and audits at the
    // level enforced inside; the vCluster's values carry that level.
    let host = common::names::host_namespace(&team, "orphans");
    let labels = wait_for(
        "the host namespace",
        Duration::from_secs(60),
        &controller,
        || get(&cluster, &["get", "namespace", &host]).map(|n| n["metadata"]["labels"].clone()),
    )
    .await;
    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "privileged");
    assert_eq!(labels["pod-security.kubernetes.io/warn"], "restricted");
    assert_eq!(labels["pod-security.kubernetes.io/audit"], "restricted");
    let config = wait_for(
        "the vCluster's values",
        Duration::from_secs(60),
        &controller,
        || {
            let secret = get(
                &cluster,
                &["-n", &host, "get", "secret", "vc-config-vcluster"],
            )?;
            let text = secret["data"]["config.yaml"].as_str()?.to_string();
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .ok()?;
            serde_saphyr::from_str::<serde_json::Value>(&String::from_utf8_lossy(&bytes)).ok()
        },
    )
    .await;
    assert_eq!(config["policies"]["podSecurityStandard"], "restricted");
}
