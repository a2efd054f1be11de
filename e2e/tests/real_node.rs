//! The real node ([`e2e::real_node`]): it becomes Ready beside the KWOK node, runs busybox pods
//! to completion in real containers, fails a Job whose image it does not have (never completing
//! it unrun), serves a ClusterIP Service through kube-proxy, and lets a test reach into its
//! network namespace (the API server from `127.0.0.1:6443` there, and a relay on any free port
//! carrying a round trip to a server of the test on loopback, for processes and pods). Prints
//! the figures of the issue: node start, pod start p50/p99 over 20 pods, kubelet and containerd
//! RSS. Needs root and the Debian packages `e2e/run-tests.sh` installs for its real-node lane.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use e2e::cmd::run;
use e2e::images::BUSYBOX_IMAGE;
use e2e::node_net::{NODE_IP, NetnsHandle, Relay};
use e2e::real_node::NODE_NAME;
use e2e::{ControlPlane, Options};

fn kubectl(cluster: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    cluster
        .kubectl_ok(args, stdin)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Polls `check` every 100 ms until it is true or `limit` passes.
fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `command` (`sh -c`) in a busybox pod `name` of `ns` on the real node until it ends; its
/// log.
fn run_to_end(cluster: &ControlPlane, ns: &str, name: &str, command: &str) -> String {
    let command = serde_json::to_string(command).expect("json");
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  nodeName: {NODE_NAME}
  restartPolicy: Never
  containers:
  - name: c
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", {command}]
"#
    );
    kubectl(cluster, &["apply", "-f", "-"], Some(&pod));
    wait_for(
        &format!("pod {name} to end"),
        Duration::from_secs(60),
        || {
            let mut cmd = cluster.kubectl();
            let phase = "jsonpath={.status.phase}";
            cmd.args(["-n", ns, "get", "pod", name, "-o", phase]);
            run(cmd, None)
                .ok()
                .and_then(|o| o.ok("phase").ok())
                .is_some_and(|p| p == "Succeeded" || p == "Failed")
        },
    );
    kubectl(cluster, &["-n", ns, "logs", name], None)
}

/// A server on the machine's loopback that answers each connection's first line with
/// `relayed: <line>` and closes it; its port.
fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut line = String::new();
                let mut reader = BufReader::new(&stream);
                if reader.read_line(&mut line).is_ok() {
                    let _ = (&stream).write_all(format!("relayed: {line}").as_bytes());
                }
            });
        }
    });
    port
}

/// Sends `line` to `addr` from a thread inside `netns`; what comes back until the server closes.
fn round_trip(netns: &NetnsHandle, addr: SocketAddr, line: &str) -> std::io::Result<String> {
    let netns = netns.try_clone()?;
    let line = format!("{line}\n");
    std::thread::spawn(move || {
        netns.enter_thread()?;
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(line.as_bytes())?;
        let mut back = String::new();
        stream.read_to_string(&mut back)?;
        Ok(back)
    })
    .join()
    .expect("the round trip's thread")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_runs_pods_and_serves_a_cluster_ip_service() {
    let started = Instant::now();
    let cluster = ControlPlane::start(Options::new("real-node").real_node())
        .await
        .unwrap_or_else(|e| panic!("control plane with a real node: {e}"));
    let node = cluster.real_node().expect("the real node");
    let figures = node.figures();
    println!(
        "figure: real node Ready {:.2} s after its first process (images imported in {:.2} s; \
         control plane and node {:.1} s)",
        figures.node_ready.as_secs_f64(),
        figures.images.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for note in node.notes() {
        println!("note: {note}");
    }

    let ns = "real-node-test";
    kubectl(&cluster, &["create", "namespace", ns], None);
    wait_for(
        "the default service account",
        Duration::from_secs(30),
        || {
            let mut cmd = cluster.kubectl();
            cmd.args(["-n", ns, "get", "serviceaccount", "default"]);
            run(cmd, None).is_ok_and(|o| o.ok("get sa").is_ok())
        },
    );

    // A pod to completion, in a real container.
    let once = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{ name: once, namespace: {ns} }}
spec:
  nodeName: {NODE_NAME}
  restartPolicy: Never
  containers:
  - name: once
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hello from $(hostname) && test -d /proc/self"]
"#
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&once));
    wait_for("the pod to succeed", Duration::from_secs(60), || {
        let mut cmd = cluster.kubectl();
        cmd.args([
            "-n",
            ns,
            "get",
            "pod",
            "once",
            "-o",
            "jsonpath={.status.phase}",
        ]);
        let phase = run(cmd, None).ok().and_then(|o| o.ok("phase").ok());
        assert_ne!(phase.as_deref(), Some("Failed"), "the pod failed");
        phase.as_deref() == Some("Succeeded")
    });
    let logs = kubectl(&cluster, &["-n", ns, "logs", "once"], None);
    assert!(logs.contains("hello from once"), "logs: {logs}");

    // A pod whose image was never imported fails at once, naming the image (no pull leaves).
    let missing = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{ name: missing, namespace: {ns} }}
spec:
  nodeName: {NODE_NAME}
  restartPolicy: Never
  containers: [{{ name: c, image: registry.invalid/nothing:1 }}]
"#
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&missing));
    wait_for(
        "the missing image's pull error",
        Duration::from_secs(60),
        || {
            let mut cmd = cluster.kubectl();
            cmd.args([
                "-n",
                ns,
                "get",
                "pod",
                "missing",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.message}",
            ]);
            run(cmd, None)
                .ok()
                .and_then(|o| o.ok("waiting").ok())
                .is_some_and(|m| m.contains("registry.invalid/nothing:1"))
        },
    );

    // A Job in an image that was never imported does not complete unrun: its pod (scheduled
    // here, the KWOK node being tainted) waits naming the image, and the Job fails at its
    // deadline.
    let job = format!(
        r#"apiVersion: batch/v1
kind: Job
metadata: {{ name: unpulled, namespace: {ns} }}
spec:
  backoffLimit: 0
  activeDeadlineSeconds: 15
  template:
    spec:
      restartPolicy: Never
      containers: [{{ name: c, image: "registry.example/once@sha256:{d}" }}]
"#,
        d = "0".repeat(64)
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&job));
    let pod_of_job = |path: &str| -> String {
        let mut cmd = cluster.kubectl();
        cmd.args([
            "-n",
            ns,
            "get",
            "pods",
            "-l",
            "job-name=unpulled",
            "-o",
            &format!("jsonpath={{.items[0].{path}}}"),
        ]);
        run(cmd, None)
            .ok()
            .and_then(|o| o.ok("the Job's pod").ok())
            .unwrap_or_default()
    };
    wait_for(
        "the Job's pod to wait for its image",
        Duration::from_secs(60),
        || {
            pod_of_job("status.containerStatuses[0].state.waiting.message")
                .contains("registry.example/once@sha256:")
        },
    );
    assert_eq!(pod_of_job("spec.nodeName"), NODE_NAME);
    wait_for("the Job to fail", Duration::from_secs(60), || {
        let mut cmd = cluster.kubectl();
        cmd.args([
            "-n",
            ns,
            "get",
            "job",
            "unpulled",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Failed\")].reason}",
        ]);
        run(cmd, None)
            .ok()
            .and_then(|o| o.ok("the Job").ok())
            .is_some_and(|r| r == "DeadlineExceeded")
    });
    let succeeded = kubectl(
        &cluster,
        &[
            "-n",
            ns,
            "get",
            "job",
            "unpulled",
            "-o",
            "jsonpath={.status.succeeded}",
        ],
        None,
    );
    assert!(succeeded.is_empty() || succeeded == "0", "{succeeded}");

    // Pod start over 20 pods: created one after another, each timed to Running.
    let mut starts = Vec::new();
    for i in 0..20 {
        let pod = format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{ name: p{i}, namespace: {ns}, labels: {{ app: sleepers }} }}
spec:
  nodeName: {NODE_NAME}
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sleep", "3600"]
"#
        );
        let t = Instant::now();
        kubectl(&cluster, &["apply", "-f", "-"], Some(&pod));
        let name = format!("p{i}");
        wait_for(
            &format!("pod {name} Running"),
            Duration::from_secs(60),
            || {
                let mut cmd = cluster.kubectl();
                cmd.args([
                    "-n",
                    ns,
                    "get",
                    "pod",
                    &name,
                    "-o",
                    "jsonpath={.status.phase}",
                ]);
                run(cmd, None)
                    .ok()
                    .and_then(|o| o.ok("phase").ok())
                    .is_some_and(|p| p == "Running")
            },
        );
        starts.push(t.elapsed());
    }
    starts.sort();
    println!(
        "figure: pod start (apply to Running, 20 pods one by one) p50 {:.2} s, p99 {:.2} s",
        percentile(&starts, 50.0).as_secs_f64(),
        percentile(&starts, 99.0).as_secs_f64()
    );

    // A ClusterIP Service in front of an HTTP server pod, reached from another pod through
    // kube-proxy's rules. The client is nc: Debian's busybox 1.35 `wget -T` segfaults on a
    // refused connection.
    let web = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{ name: web, namespace: {ns}, labels: {{ app: web }} }}
spec:
  nodeName: {NODE_NAME}
  terminationGracePeriodSeconds: 0
  containers:
  - name: web
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo served-by-web > /www/index.html && exec httpd -f -p 8080 -h /www"]
    readinessProbe:
      tcpSocket: {{ port: 8080 }}
      periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: {ns} }}
spec:
  selector: {{ app: web }}
  ports: [{{ port: 80, targetPort: 8080 }}]
"#
    );
    kubectl(&cluster, &["apply", "-f", "-"], Some(&web));
    wait_for("the web pod Ready", Duration::from_secs(60), || {
        let mut cmd = cluster.kubectl();
        cmd.args([
            "-n",
            ns,
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        run(cmd, None)
            .ok()
            .and_then(|o| o.ok("ready").ok())
            .is_some_and(|s| s == "True")
    });
    let ip = kubectl(
        &cluster,
        &[
            "-n",
            ns,
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
        None,
    );
    let get = format!(
        "for i in 1 2 3 4 5 6 7 8 9 10; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 80 | grep served-by && exit 0; sleep 1; done; exit 1"
    );
    let out = run_to_end(&cluster, ns, "client", &get);
    assert!(
        out.contains("served-by-web"),
        "the Service {ip} did not answer through kube-proxy: {out}"
    );

    // From inside the node's namespace, as the controller's installing tests run it: the
    // handle's kubeconfig reaches the API server through the relay on 127.0.0.1:6443 there, and a
    // relay on any free port carries a round trip to a server of the test on the machine's
    // loopback, from the node's address (as a process there and a pod see it) and from
    // 127.0.0.1 there, until it is dropped.
    let handle = cluster.handle();
    let netns_name = handle.node_netns.as_deref().expect("the node's namespace");
    let netns = NetnsHandle::open(netns_name).expect("open the node's namespace");
    let mut inside = std::process::Command::new(&handle.kubectl);
    inside
        .env(
            "KUBECONFIG",
            handle.node_kubeconfig.as_ref().expect("kubeconfig"),
        )
        .args(["get", "--raw", "/readyz"]);
    netns.enter_on_spawn(&mut inside);
    let ready = run(inside, None)
        .expect("kubectl")
        .ok("kubectl get --raw /readyz in the node's namespace")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ready.trim(), "ok");
    let upstream = echo_server();
    let relay = Relay::open(&netns, "test-relay", 0, upstream).expect("relay");
    let port = relay.port();
    assert_ne!(port, 0);
    for host in [NODE_IP, "127.0.0.1"] {
        let addr: SocketAddr = format!("{host}:{port}").parse().expect("address");
        let back = round_trip(&netns, addr, "from the node's namespace")
            .unwrap_or_else(|e| panic!("a round trip through {addr}: {e}"));
        assert_eq!(back, "relayed: from the node's namespace\n");
    }
    let send = format!("printf 'from a pod\\n' | nc -w 5 {NODE_IP} {port}");
    let out = run_to_end(&cluster, ns, "relayed", &send);
    assert_eq!(out.trim(), "relayed: from a pod", "a pod through the relay");
    drop(relay);
    let addr: SocketAddr = format!("{NODE_IP}:{port}").parse().expect("address");
    assert!(
        round_trip(&netns, addr, "after the drop").is_err(),
        "the relay still listens after it was dropped"
    );

    let rss = node.rss_kib();
    for (name, kib) in &rss {
        println!("figure: {name} RSS {:.1} MiB", *kib as f64 / 1024.0);
    }
}
