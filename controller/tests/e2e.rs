//! End-to-end: the controller binary as a process on the local control plane, with the stand-in
//! vCluster chart (`e2e/standin-vcluster`, named a stand-in: the real chart cannot be fetched
//! here) whose exported kubeconfig points at a second, real API server started by the harness.
//! KWOK makes the StatefulSet Ready and the cleanup Job complete.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::shared::Shared;
use e2e::{ControlPlane, Options};

mod support;
use support::{Controller, condition, fixture, get, wait_for};

fn instance(ns: &str, name: &str, policy: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: {policy}\n"
    )
}

#[tokio::test]
async fn instances_provision_and_delete_as_their_policy_says() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "main").await;
    let controller = Controller::start(&cluster, &fx, &["--leader-elect=false"]);
    let team = cluster.create_namespace("team", &[]).expect("namespace");

    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "kept", "Retain")),
        )
        .expect("apply");
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "gone", "Delete")),
        )
        .expect("apply");

    // Both reach Installing with the vCluster serving and the kubeconfig written.
    for name in ["kept", "gone"] {
        let pi = wait_for(
            &format!("{name} to reach Installing"),
            Duration::from_secs(120),
            &controller,
            || {
                let pi = get(&cluster, &["-n", &team, "get", "pi", name])?;
                (pi["status"]["phase"] == "Installing"
                    && condition(&pi, "KubeconfigReady").is_some_and(|c| c.0 == "True"))
                .then_some(pi)
            },
        )
        .await;
        assert_eq!(
            condition(&pi, "VClusterReady"),
            Some(("True".into(), "VClusterServing".into()))
        );
        assert_eq!(
            condition(&pi, "HostNamespaceReady").map(|c| c.0),
            Some("True".into())
        );
        assert_eq!(
            condition(&pi, "OwnerServiceProtected"),
            Some(("True".into(), "PolicyActive".into()))
        );
        assert_eq!(
            condition(&pi, "Ready").map(|c| c.0),
            Some("False".into()),
            "Ready waits for the installer"
        );
        assert_eq!(
            pi["status"]["kubeconfigSecretRef"]["name"],
            format!("{name}-kubeconfig")
        );
        assert!(
            pi["metadata"]["finalizers"]
                .to_string()
                .contains("platform.di-framework.dev/instance")
        );
        let host = pi["status"]["hostNamespace"]
            .as_str()
            .expect("host namespace")
            .to_string();
        assert!(
            host.starts_with(&format!("pi-{team}-{name}-")) && host.len() <= 63,
            "{host}"
        );
        let ns = get(&cluster, &["get", "namespace", &host]).expect("host namespace exists");
        assert_eq!(
            ns["metadata"]["annotations"]["platform.di-framework.dev/instance"],
            format!("{team}/{name}")
        );
        assert!(
            get(
                &cluster,
                &["-n", &host, "get", "networkpolicy", "vcluster-api"]
            )
            .is_some()
        );
    }

    // The kubeconfig Secret works against the vCluster's (second) API server.
    let secret = get(&cluster, &["-n", &team, "get", "secret", "kept-kubeconfig"]).expect("secret");
    let data = secret["data"]["kubeconfig"]
        .as_str()
        .expect("kubeconfig key");
    let kubeconfig =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data).expect("base64");
    let file = fx.dir.join("kept.kubeconfig");
    std::fs::write(&file, kubeconfig).expect("write");
    let mut inside = Command::new(&cluster.kubectl);
    inside
        .env("KUBECONFIG", &file)
        .args(["create", "namespace", "made-through-the-secret"]);
    e2e::cmd::run(inside, None)
        .expect("kubectl")
        .ok("kubectl with the instance kubeconfig")
        .expect("the kubeconfig works");
    let mut check = fx.inner.kubectl();
    check.args(["get", "namespace", "made-through-the-secret"]);
    assert!(
        e2e::cmd::run(check, None).expect("kubectl").success,
        "the namespace landed in the second API server"
    );

    // The admission policy stops an ordinary user from deleting service/vcluster.
    let host =
        get(&cluster, &["-n", &team, "get", "pi", "kept"]).expect("pi")["status"]["hostNamespace"]
            .as_str()
            .expect("host")
            .to_string();
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{ name: services, namespace: {host} }}\nrules: [{{ apiGroups: [\"\"], resources: [services], verbs: [get, update, patch, delete] }}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{ name: bob, namespace: {host} }}\nroleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: services }}\nsubjects: [{{ apiGroup: rbac.authorization.k8s.io, kind: User, name: bob }}]\n"
    );
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rbac))
        .expect("rbac");
    let denied = wait_for(
        "the policy to deny bob",
        Duration::from_secs(30),
        &controller,
        || {
            let mut del = cluster.kubectl();
            del.args([
                "-n",
                &host,
                "delete",
                "service",
                "vcluster",
                "--as=bob",
                "--dry-run=server",
            ]);
            let out = e2e::cmd::run(del, None).expect("kubectl");
            (!out.success && out.stderr.contains("managed by the platform operator"))
                .then_some(out.stderr)
        },
    )
    .await;
    assert!(
        denied.contains("platform-operator-protect-vcluster-service"),
        "{denied}"
    );
    let mut operator = cluster.kubectl();
    operator.args([
        "-n",
        &host,
        "delete",
        "service",
        "vcluster",
        "--dry-run=server",
    ]);
    assert!(
        e2e::cmd::run(operator, None).expect("kubectl").success,
        "the operator's own user may"
    );

    // A resync that finds nothing changed writes nothing.
    let before = controller
        .metric("platform_operator_controller_api_writes_total")
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = controller
        .metric("platform_operator_controller_api_writes_total")
        .await;
    assert!(
        before > 0.0 && before == after,
        "idle reconciles wrote {} times",
        after - before
    );

    // A person asks for an immediate retry; the status acknowledges it.
    cluster
        .kubectl_ok(
            &[
                "-n",
                &team,
                "annotate",
                "pi",
                "kept",
                "platform.di-framework.dev/retry=first",
            ],
            None,
        )
        .expect("annotate");
    wait_for(
        "the retry to be acknowledged",
        Duration::from_secs(30),
        &controller,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "kept"])?;
            (pi["status"]["acknowledgedRetry"] == "first").then_some(())
        },
    )
    .await;

    // service/vcluster changed or deleted anyway (by a user the policy lets through): put back.
    let svc_port = |cluster: &Shared| -> Option<(String, i64)> {
        let svc = get(cluster, &["-n", &host, "get", "service", "vcluster"])?;
        Some((
            svc["metadata"]["uid"].as_str()?.to_string(),
            svc["spec"]["ports"][0]["port"].as_i64()?,
        ))
    };
    let (uid, port) = svc_port(&cluster).expect("service/vcluster");
    assert_eq!(port, 443);
    cluster
        .kubectl_ok(
            &[
                "-n",
                &host,
                "patch",
                "service",
                "vcluster",
                "--type=json",
                "-p",
                r#"[{"op":"replace","path":"/spec/ports/0/port","value":444}]"#,
            ],
            None,
        )
        .expect("change the service");
    let restored = |cluster: &Shared, old: &str| -> Option<String> {
        let (u, p) = svc_port(cluster)?;
        let ns = get(cluster, &["get", "namespace", &host])?;
        let record = ns["metadata"]["annotations"]["platform.di-framework.dev/vcluster-service"]
            .as_str()?
            .to_string();
        (u != old && p == 443 && record.starts_with(&u)).then_some(u)
    };
    let second = wait_for(
        "the changed service to be put back and recorded",
        Duration::from_secs(60),
        &controller,
        || restored(&cluster, &uid),
    )
    .await;
    cluster
        .kubectl_ok(&["-n", &host, "delete", "service", "vcluster"], None)
        .expect("delete the service");
    let third = wait_for(
        "the deleted service to be recreated and recorded",
        Duration::from_secs(60),
        &controller,
        || restored(&cluster, &second),
    )
    .await;
    assert_ne!(third, uid);
    let events = cluster
        .kubectl_ok(
            &[
                "-n",
                &team,
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=kept",
                "-o",
                "json",
            ],
            None,
        )
        .expect("events");
    assert!(
        events.contains("OwnerServiceRestoring"),
        "an Event records the repair"
    );
    assert!(
        events.contains("VClusterServing") && events.contains("KubeconfigWritten"),
        "Events on every transition"
    );

    // Retain keeps the storage and state directories; Delete removes them with a cleanup Job.
    let state = fx.dir.join("state").join(&team);
    for name in ["kept", "gone"] {
        std::fs::create_dir_all(state.join(name)).expect("state dir");
        std::fs::write(state.join(name).join("Pulumi.dev.yaml"), "marker").expect("marker");
    }
    let gone_host =
        get(&cluster, &["-n", &team, "get", "pi", "gone"]).expect("pi")["status"]["hostNamespace"]
            .as_str()
            .expect("host")
            .to_string();
    cluster
        .kubectl_ok(
            &["-n", &team, "delete", "pi", "kept", "gone", "--wait=false"],
            None,
        )
        .expect("delete");
    for name in ["kept", "gone"] {
        wait_for(
            &format!("{name} to be deleted"),
            Duration::from_secs(120),
            &controller,
            || {
                get(&cluster, &["-n", &team, "get", "pi", name])
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }
    for h in [&host, &gone_host] {
        assert!(
            get(&cluster, &["get", "namespace", h]).is_none(),
            "host namespace {h} is removed (the policy never stops the namespace controller)"
        );
    }
    assert!(
        state.join("kept").join("Pulumi.dev.yaml").exists(),
        "Retain keeps the state"
    );
    assert!(!state.join("gone").exists(), "Delete removes the state");
    assert!(
        get(&cluster, &["-n", &team, "get", "secret", "gone-kubeconfig"]).is_none(),
        "Delete removes the kubeconfig Secret"
    );
    let job = get(&cluster, &["-n", &fx.operator_ns, "get", "job", &gone_host])
        .expect("the cleanup Job ran in the cleanup namespace");
    assert_eq!(job["status"]["succeeded"], 1, "{job}");
    let command = job["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
    assert!(
        command.contains(&format!("/storage/{gone_host}")),
        "it removes only the instance's directory: {command}"
    );
    assert!(
        get(&cluster, &["-n", &fx.operator_ns, "get", "job", &host]).is_none(),
        "Retain runs no cleanup"
    );
}

#[tokio::test]
async fn a_chart_digest_mismatch_stops_the_controller() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let dir =
        e2e::control_plane::base_dir().join(format!("controller-digest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let out = Command::new(&cluster.helm)
        .arg("package")
        .arg(e2e::repo_root().join("e2e/standin-vcluster"))
        .arg("-d")
        .arg(&dir)
        .output()
        .expect("helm");
    assert!(out.status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_controller"))
        .env("KUBECONFIG", &cluster.kubeconfig)
        .arg("--vcluster-chart")
        .arg(dir.join("vcluster-0.37.3-standin.tgz"))
        .args([
            "--vcluster-chart-sha256",
            &format!("sha256:{}", "0".repeat(64)),
            "--metrics-bind-address",
            "127.0.0.1:0",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to start"), "{stderr}");
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}

#[tokio::test]
async fn leadership_crash_recovery_and_no_admission_policies() {
    // A control plane of its own, whose API server serves no ValidatingAdmissionPolicy.
    let cp = ControlPlane::start(Options::new("no-vap").apiserver_args([
        "--runtime-config=admissionregistration.k8s.io/v1/validatingadmissionpolicies=false,admissionregistration.k8s.io/v1/validatingadmissionpolicybindings=false",
        "--disable-admission-plugins=ValidatingAdmissionPolicy",
    ]))
    .await
    .expect("control plane without admission policies");
    let cluster = cp.handle();
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "leader").await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");

    // An interrupted helm: a first install killed mid-way leaves the release pending-install.
    let host = common::names::host_namespace(&team, "crashed");
    cluster
        .kubectl_ok(&["create", "namespace", &host], None)
        .expect("host namespace");
    let mut helm = Command::new(&cluster.helm);
    helm.env("KUBECONFIG", &cluster.kubeconfig)
        .args(["upgrade", "--install", "vcluster"])
        .arg(&fx.chart)
        .args([
            "-n",
            &host,
            "--wait",
            "--timeout",
            "5m",
            "--set",
            "standIn.block=true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut helm = helm.spawn().expect("helm");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let secrets = get(
            &cluster,
            &[
                "-n",
                &host,
                "get",
                "secrets",
                "-l",
                "owner=helm,name=vcluster",
            ],
        );
        if secrets.is_some_and(|s| s["items"].to_string().contains("pending-install")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "helm never left a pending release"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = helm.kill();
    let _ = helm.wait();

    // Two controllers with leader election: exactly one leads.
    let first = Controller::start(&cluster, &fx, &[]);
    let second = Controller::start(&cluster, &fx, &[]);
    let leaders = wait_for("a leader", Duration::from_secs(60), &first, || {
        let lease = get(
            &cluster,
            &[
                "-n",
                &fx.operator_ns,
                "get",
                "lease",
                "platform-operator-controller",
            ],
        )?;
        lease["spec"]["holderIdentity"].as_str().map(String::from)
    })
    .await;
    assert!(!leaders.is_empty());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (a, b) = (
        first.metric("platform_operator_controller_leader").await,
        second.metric("platform_operator_controller_leader").await,
    );
    assert_eq!(a + b, 1.0, "exactly one leader: {a} and {b}");
    let (mut leader, standby) = if a == 1.0 {
        (first, second)
    } else {
        (second, first)
    };

    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "crashed", "Retain")),
        )
        .expect("apply");
    let pi = wait_for(
        "the crashed release to be recovered and installed",
        Duration::from_secs(120),
        &leader,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "crashed"])?;
            (pi["status"]["phase"] == "Installing").then_some(pi)
        },
    )
    .await;
    assert_eq!(
        condition(&pi, "OwnerServiceProtected"),
        Some(("False".into(), "AdmissionPoliciesUnavailable".into())),
        "without admission policies the controller carries on and says so"
    );
    assert_eq!(
        standby
            .metric("platform_operator_controller_reconciles_total")
            .await,
        0.0,
        "the standby never reconciles"
    );
    assert!(
        leader
            .log()
            .contains("recovering an interrupted helm release"),
        "{}",
        leader.log()
    );

    // The leader dies; the standby takes over and reconciles new work.
    e2e::process::terminate(&mut leader.child, Duration::from_secs(0));
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "after", "Retain")),
        )
        .expect("apply");
    wait_for(
        "the standby to take over",
        Duration::from_secs(90),
        &standby,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "after"])?;
            (pi["status"]["phase"] == "Installing").then_some(())
        },
    )
    .await;
    assert_eq!(
        standby.metric("platform_operator_controller_leader").await,
        1.0
    );
}

#[tokio::test]
async fn installs_beyond_the_limit_queue_in_order() {
    let cp = ControlPlane::start(Options::new("queue"))
        .await
        .expect("control plane");
    let cluster = cp.handle();
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "queue").await;
    // Real helm, slowed down so the queue can be seen: every install takes two seconds more.
    let slow_helm = fx.dir.join("slow-helm");
    std::fs::write(
        &slow_helm,
        format!(
            "#!/bin/sh\n[ \"$1\" = upgrade ] && sleep 2\nexec '{}' \"$@\"\n",
            cluster.helm.display()
        ),
    )
    .expect("wrapper");
    let chmod = Command::new("chmod")
        .arg("+x")
        .arg(&slow_helm)
        .status()
        .expect("chmod");
    assert!(chmod.success());
    let controller = Controller::start(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--max-concurrent-installs=1",
            "--helm-binary",
            &slow_helm.display().to_string(),
        ],
    );
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    for name in ["q1", "q2", "q3"] {
        cluster
            .kubectl_ok(
                &["apply", "--server-side", "-f", "-"],
                Some(&instance(&team, name, "Retain")),
            )
            .expect("apply");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let mut queued_messages = std::collections::BTreeSet::new();
    let mut most_running = 0.0f64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut installing = 0;
        for name in ["q1", "q2", "q3"] {
            if let Some(pi) = get(&cluster, &["-n", &team, "get", "pi", name]) {
                if let Some(c) = pi["status"]["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "VClusterReady").cloned())
                    && c["reason"] == "Queued"
                {
                    queued_messages.insert(format!(
                        "{name}: {}",
                        c["message"].as_str().unwrap_or_default()
                    ));
                }
                if pi["status"]["phase"] == "Installing" {
                    installing += 1;
                }
            }
        }
        most_running = most_running.max(
            controller
                .metric("platform_operator_controller_tasks_running")
                .await,
        );
        if installing == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all installed; queued: {queued_messages:?}\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(
        queued_messages.iter().any(|m| m.contains("position")),
        "a queued instance said its position: {queued_messages:?}"
    );
    assert!(
        most_running <= 1.0,
        "never more than --max-concurrent-installs at once: {most_running}"
    );
    // Installed in the order they were created: compare the first release revisions' creation times.
    let created = |name: &str| -> String {
        let host = common::names::host_namespace(&team, name);
        let secret = get(
            &cluster,
            &[
                "-n",
                &host,
                "get",
                "secret",
                "sh.helm.release.v1.vcluster.v1",
            ],
        )
        .expect("release");
        secret["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let (t1, t2, t3) = (created("q1"), created("q2"), created("q3"));
    assert!(
        t1 <= t2 && t2 <= t3,
        "installs ran in order: {t1} {t2} {t3}"
    );
}
