//! End-to-end: the controller binary as a process on the local control plane with a real node
//! (`e2e::shared_with_real_node`), with the stand-in vCluster chart (`e2e/standin-vcluster`,
//! named a stand-in: the real chart cannot be fetched here) and the harness's stand-in syncer,
//! which exports a kubeconfig for a second, real API server serving exactly the certificate names
//! vCluster would. The control plane's pod runs on the real node (its `storage-owner` init
//! container from the operator image built from the Dockerfile, its hostPath storage a folder of
//! the test), and so does the cleanup Job.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::shared::Shared;
use e2e::{ControlPlane, Options};
use serde_json::Value;

mod support;
use support::{Controller, condition, fixture, get, wait_for};

fn instance(ns: &str, name: &str, policy: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: {policy}\n"
    )
}

/// A PersistentVolumeClaim in `host` bound to a static hostPath PersistentVolume `pv`
/// (`reclaimPolicy: Delete`), as the vCluster's syncer and a provisioner would leave them.
fn bound_volume(cluster: &Shared, host: &str, pv: &str) {
    let yaml = format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{ name: {pv} }}\nspec:\n  capacity: {{ storage: 1Mi }}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: \"\"\n  hostPath: {{ path: /tmp/{pv} }}\n  claimRef: {{ namespace: {host}, name: data }}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{ name: data, namespace: {host} }}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: \"\"\n  volumeName: {pv}\n  resources: {{ requests: {{ storage: 1Mi }} }}\n"
    );
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&yaml))
        .expect("volume");
}

/// Issue 30, item 6: with `Retain`, every PersistentVolume bound to a claim in the host
/// namespace is set to `Retain` before the namespace goes, and named in the instance's
/// `retained-volumes.json`; with `Delete`, and for volumes bound elsewhere, nothing changes.
#[tokio::test]
async fn retain_keeps_the_volumes_bound_in_the_host_namespace() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "volumes").await;
    let team = cluster.create_namespace("vols", &[]).expect("namespace");
    let controller = Controller::start(
        &cluster,
        &fx,
        &["--leader-elect=false", "--watch-namespace", &team],
    );
    let mut volumes = Vec::new();
    for (name, policy) in [("keep", "Retain"), ("drop", "Delete")] {
        cluster
            .kubectl_ok(
                &["apply", "--server-side", "-f", "-"],
                Some(&instance(&team, name, policy)),
            )
            .expect("apply");
        let host = installing(&cluster, &controller, &team, name).await;
        let pv = format!("{team}-{name}");
        bound_volume(&cluster, &host, &pv);
        volumes.push(pv);
    }
    // A volume bound to a claim outside the host namespaces is never touched.
    let other = format!("{team}-other");
    bound_volume(&cluster, &team, &other);
    volumes.push(other.clone());
    for pv in &volumes {
        wait_for(
            &format!("{pv} to be bound"),
            Duration::from_secs(60),
            &controller,
            || {
                let v = get(&cluster, &["get", "pv", pv])?;
                (v["status"]["phase"] == "Bound").then_some(())
            },
        )
        .await;
    }
    cluster
        .kubectl_ok(
            &["-n", &team, "delete", "pi", "keep", "drop", "--wait=false"],
            None,
        )
        .expect("delete");
    for name in ["keep", "drop"] {
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
    let policy = |pv: &str| {
        get(&cluster, &["get", "pv", pv])
            .map(|v| v["spec"]["persistentVolumeReclaimPolicy"].clone())
    };
    assert_eq!(
        policy(&volumes[0]),
        Some("Retain".into()),
        "Retain keeps the volume its host namespace's claim was bound to"
    );
    let record = fx
        .dir
        .join("state")
        .join(&team)
        .join("keep")
        .join("retained-volumes.json");
    let record = std::fs::read_to_string(&record).unwrap_or_default();
    assert!(
        record.contains(&volumes[0]),
        "the record names it: {record:?}"
    );
    // The PV controller cannot delete a hostPath volume here: it is Failed, still Delete.
    assert_ne!(
        policy(&volumes[1]),
        Some("Retain".into()),
        "Delete changes nothing"
    );
    assert_eq!(
        policy(&other),
        Some("Delete".into()),
        "a volume bound elsewhere is left alone"
    );
    drop(controller);
}

/// Issue 30, item 1: an instance whose host namespace an earlier release made (a 32-bit hash in
/// its name) keeps it and its storage directory: no second namespace, the vCluster's hostPath
/// and the cleanup stay on the old names. A namespace of that old name that is not the
/// instance's (another UID) is never taken: the instance gets this release's name.
#[tokio::test]
async fn an_instance_of_an_earlier_release_keeps_its_host_namespace_and_storage() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "legacy").await;
    let team = cluster.create_namespace("legacy", &[]).expect("namespace");
    // What the earlier release left: the instances, and their host namespaces of the old names
    // (one marked with its instance's UID, one with someone else's).
    for name in ["old", "squatted"] {
        cluster
            .kubectl_ok(
                &["apply", "--server-side", "-f", "-"],
                Some(&instance(&team, name, "Delete")),
            )
            .expect("apply");
        let uid = match name {
            "old" => uid_of(&cluster, &team, "pi", name).expect("uid"),
            _ => "someone-else".to_string(),
        };
        let legacy = common::names::legacy_host_namespace(&team, name);
        let yaml = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {legacy}\n  labels: {{ platform.di-framework.dev/host-namespace: \"true\", platform.di-framework.dev/instance-uid: {uid} }}\n  annotations: {{ platform.di-framework.dev/instance: {team}/{name} }}\n"
        );
        cluster
            .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&yaml))
            .expect("legacy namespace");
    }
    let storage = Storage::new(&cluster, &fx);
    let legacy = common::names::legacy_host_namespace(&team, "old");
    let old_dir = storage.instance(&legacy);
    std::fs::create_dir_all(&old_dir).expect("old storage");
    std::fs::write(old_dir.join("data.db"), "the old vCluster's").expect("data");

    let controller = Controller::start(
        &cluster,
        &fx,
        &["--leader-elect=false", "--watch-namespace", &team],
    );
    for name in ["old", "squatted"] {
        let host = installing(&cluster, &controller, &team, name).await;
        let (kept, new) = (
            common::names::legacy_host_namespace(&team, name),
            common::names::host_namespace(&team, name),
        );
        if name == "old" {
            assert_eq!(host, kept, "the instance keeps its namespace");
            assert!(get(&cluster, &["get", "namespace", &new]).is_none());
        } else {
            assert_eq!(
                host, new,
                "another's namespace of the old name is not taken"
            );
            let squatted = get(&cluster, &["get", "namespace", &kept]).expect("left");
            assert!(
                squatted["metadata"]["labels"]
                    .to_string()
                    .contains("someone-else")
            );
        }
        let deployment = get(&cluster, &["-n", &host, "get", "deployment", "vcluster"])
            .expect("the control plane");
        let path = deployment["spec"]["template"]["spec"]["volumes"].to_string();
        let dir = common::names::storage_dir(&team, name, &host);
        assert!(path.contains(&format!("/{dir}\"")), "{dir} in {path}");
    }
    assert_eq!(
        std::fs::read_to_string(old_dir.join("data.db")).expect("the data"),
        "the old vCluster's"
    );
    for name in ["old", "squatted"] {
        deleted(&cluster, &controller, &team, name).await;
    }
    assert!(!old_dir.exists(), "its cleanup removed the old directory");
    assert!(
        get(
            &cluster,
            &[
                "get",
                "namespace",
                &common::names::legacy_host_namespace(&team, "squatted")
            ]
        )
        .is_some(),
        "the namespace that was not its own is left"
    );
    drop(controller);
}

#[tokio::test]
async fn instances_provision_and_delete_as_their_policy_says() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "main").await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let controller = Controller::start(
        &cluster,
        &fx,
        &["--leader-elect=false", "--watch-namespace", &team],
    );
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
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "taken", "Delete")),
        )
        .expect("apply");
    // A version outside the supported range (no admission webhook here to refuse it): the
    // controller refuses it itself and creates nothing for it.
    let too_new = instance(&team, "too-new", "Delete").replace("6.0.22", "7.0.0");
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&too_new))
        .expect("apply");
    let pi = wait_for(
        "too-new to be refused",
        Duration::from_secs(60),
        &controller,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "too-new"])?;
            (pi["status"]["phase"] == "Failed").then_some(pi)
        },
    )
    .await;
    let stalled = condition(&pi, "Stalled").expect("Stalled");
    assert_eq!(
        (stalled.0.as_str(), stalled.1.as_str()),
        ("True", "InvalidSpec")
    );
    assert!(
        pi.to_string().contains(
            "spec.version 7.0.0 is outside the versions this operator supports (6.0.x to 6.0.x)"
        ),
        "{pi}"
    );
    let host = pi["status"]["hostNamespace"]
        .as_str()
        .expect("its host namespace's name");
    assert!(
        get(&cluster, &["get", "namespace", host]).is_none(),
        "nothing is created for it"
    );

    // They reach Installing with the vCluster serving and the kubeconfig written.
    for name in ["kept", "gone", "taken"] {
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

    // A change that keeps service/vcluster's identity (its labels, as a new chart version
    // rewrites them) is never a reason to delete it: deleting it would let the garbage collector
    // remove everything vCluster synced (the exported kubeconfig Secret among it).
    let svc_port = |cluster: &Shared| -> Option<(String, i64)> {
        let svc = get(cluster, &["-n", &host, "get", "service", "vcluster"])?;
        Some((
            svc["metadata"]["uid"].as_str()?.to_string(),
            svc["spec"]["ports"][0]["port"].as_i64()?,
        ))
    };
    let (uid, port) = svc_port(&cluster).expect("service/vcluster");
    assert_eq!(port, 443);
    let exported = |cluster: &Shared| -> Option<String> {
        get(cluster, &["-n", &host, "get", "secret", "vc-vcluster"])?["metadata"]["uid"]
            .as_str()
            .map(String::from)
    };
    let exported_uid = exported(&cluster).expect("secret/vc-vcluster");
    cluster
        .kubectl_ok(
            &[
                "-n",
                &host,
                "label",
                "--overwrite",
                "service",
                "vcluster",
                "chart=vcluster-9.9.9",
            ],
            None,
        )
        .expect("relabel the service");
    // The Service watch wakes the instance at once; give it a few reconciles.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(svc_port(&cluster).map(|s| s.0), Some(uid.clone()));
    assert_eq!(exported(&cluster), Some(exported_uid));

    // service/vcluster deleted anyway (by a user the policy lets through): put back.
    let restored = |cluster: &Shared, old: &str| -> Option<String> {
        let (u, p) = svc_port(cluster)?;
        let ns = get(cluster, &["get", "namespace", &host])?;
        let record = ns["metadata"]["annotations"]["platform.di-framework.dev/vcluster-service"]
            .as_str()?
            .to_string();
        (u != old && p == 443 && record.starts_with(&u)).then_some(u)
    };
    cluster
        .kubectl_ok(&["-n", &host, "delete", "service", "vcluster"], None)
        .expect("delete the service");
    let second = wait_for(
        "the deleted service to be recreated and recorded",
        Duration::from_secs(90),
        &controller,
        || restored(&cluster, &uid),
    )
    .await;
    assert_ne!(second, uid);
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

    // Retain keeps the storage and state directories; Delete removes them with a cleanup Job
    // that runs on the real node: `controller cleanup` from the operator image.
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
    let storage = Storage::new(&cluster, &fx);
    // The kubelet created each vCluster's hostPath (DirectoryOrCreate) on the node, and its
    // init container claimed it: its storage directory, keyed by the whole digest of
    // `<ns>/<name>`. The data vCluster would write there, a link out of it and the Retain
    // instance's directory beside.
    let dir_of = |name: &str, host: &str| common::names::storage_dir(&team, name, host);
    let gone_dir = storage.instance(&dir_of("gone", &gone_host));
    let kept_dir = storage.instance(&dir_of("kept", &host));
    for dir in [&gone_dir, &kept_dir] {
        assert!(dir.is_dir(), "the node holds {}", dir.display());
    }
    storage.fill(&gone_dir);
    std::fs::write(kept_dir.join("data.db"), "kept").expect("neighbour data");
    // Issue 30, item 1: the owner marker of "taken"'s directory now names another instance (as
    // if another had taken it over after its control plane started): its cleanup removes
    // nothing and the instance says whose the directory is.
    let taken = get(&cluster, &["-n", &team, "get", "pi", "taken"]).expect("pi");
    let taken_host = taken["status"]["hostNamespace"].as_str().expect("host");
    let taken_dir = storage.instance(&dir_of("taken", taken_host));
    std::fs::write(taken_dir.join("data.db"), "someone else's").expect("data");
    std::fs::write(
        taken_dir.join(".platform-instance"),
        "u-other\nteam-b/other\n",
    )
    .expect("marker");
    cluster
        .kubectl_ok(
            &[
                "-n",
                &team,
                "delete",
                "pi",
                "kept",
                "gone",
                "taken",
                "--wait=false",
            ],
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
    assert!(
        !gone_dir.exists(),
        "Delete removes the instance's storage directory"
    );
    storage.assert_untouched();
    assert_eq!(
        std::fs::read_to_string(kept_dir.join("data.db")).expect("Retain keeps its storage"),
        "kept"
    );
    let job = get(&cluster, &["-n", &fx.operator_ns, "get", "job", &gone_host])
        .expect("the cleanup Job ran in the cleanup namespace");
    assert_eq!(job["status"]["succeeded"], 1, "{job}");
    assert_eq!(job_condition(&job), Some("Complete".into()), "{job}");
    let command = job["spec"]["template"]["spec"]["containers"][0]["command"].clone();
    assert_eq!(
        command,
        serde_json::json!([
            "/usr/local/bin/controller",
            "cleanup",
            "--root",
            "/storage",
            "--dir",
            dir_of("gone", &gone_host),
            "--uid",
            job["metadata"]["labels"]["platform.di-framework.dev/instance-uid"]
        ]),
        "it removes only the instance's directory, and only if it is the instance's"
    );
    let stalled = wait_for(
        "taken to stall with StorageConflict",
        Duration::from_secs(120),
        &controller,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "taken"])?;
            let stalled = condition(&pi, "Stalled");
            (stalled.as_ref().map(|c| (c.0.as_str(), c.1.as_str()))
                == Some(("True", "StorageConflict")))
            .then_some(pi)
        },
    )
    .await;
    let message = stalled["status"]["conditions"].to_string();
    assert!(message.contains("owner marker"), "{message}");
    assert_eq!(
        std::fs::read_to_string(taken_dir.join("data.db")).expect("kept"),
        "someone else's",
        "another's directory is never erased"
    );
    let exit = job_pod_exit(&cluster, &fx.operator_ns, taken_host);
    assert_eq!(exit.as_ref().map(|e| e.0), Some(3), "{exit:?}");
    let taken_job = get(&cluster, &["-n", &fx.operator_ns, "get", "job", taken_host]).expect("job");
    assert_eq!(
        job_condition(&taken_job),
        Some("Failed".into()),
        "{taken_job}"
    );
    support::release_finalizer(&cluster, &team, "taken");
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"],
        false
    );
    assert_eq!(
        job["spec"]["template"]["spec"]["nodeName"],
        e2e::real_node::NODE_NAME,
        "pinned to the node the vCluster ran on"
    );
    assert_eq!(
        job_pod_exit(&cluster, &fx.operator_ns, &gone_host),
        Some((0, "Completed".into()))
    );
    assert!(
        get(&cluster, &["-n", &fx.operator_ns, "get", "job", &host]).is_none(),
        "Retain runs no cleanup"
    );

    // A cleanup image that cannot run the command (the busybox image on the node has no
    // /usr/local/bin/controller, so its container cannot start) fails the Job: the instance
    // stalls with CleanupFailed, keeps its finalizer and its storage. The instance comes up with
    // the operator image (its control plane's init container runs it too); a controller with
    // the busybox image as its cleanup image then deletes it.
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "stuck", "Delete")),
        )
        .expect("apply");
    let stuck_host = wait_for(
        "stuck to reach Installing",
        Duration::from_secs(120),
        &controller,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "stuck"])?;
            (pi["status"]["phase"] == "Installing")
                .then(|| pi["status"]["hostNamespace"].as_str().map(String::from))?
        },
    )
    .await;
    let stuck_dir = storage.instance(&common::names::storage_dir(&team, "stuck", &stuck_host));
    assert!(stuck_dir.is_dir(), "{}", stuck_dir.display());
    std::fs::write(stuck_dir.join("data.db"), "still here").expect("data");
    drop(controller);
    cluster
        .kubectl_ok(
            &["-n", &team, "delete", "pi", "stuck", "--wait=false"],
            None,
        )
        .expect("delete");
    let controller = Controller::start(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--watch-namespace",
            &team,
            &format!("--cleanup-image={}", e2e::images::BUSYBOX_IMAGE),
            "--cleanup-backoff-limit=0",
        ],
    );
    wait_for(
        "stuck to stall with CleanupFailed",
        Duration::from_secs(120),
        &controller,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "stuck"])?;
            (condition(&pi, "Stalled") == Some(("True".into(), "CleanupFailed".into())))
                .then_some(())
        },
    )
    .await;
    let job = get(
        &cluster,
        &["-n", &fx.operator_ns, "get", "job", &stuck_host],
    )
    .expect("job");
    assert_eq!(job_condition(&job), Some("Failed".into()), "{job}");
    assert_eq!(
        job_pod_exit(&cluster, &fx.operator_ns, &stuck_host),
        Some((128, "StartError".into()))
    );
    assert!(
        stuck_dir.join("data.db").exists(),
        "a failed cleanup leaves the storage"
    );
    assert!(
        get(&cluster, &["-n", &team, "get", "pi", "stuck"]).is_some(),
        "the finalizer holds"
    );
    // Let it go, so the shared control plane keeps no instance stuck in deletion.
    support::release_finalizer(&cluster, &team, "stuck");
}

/// The node's storage root (`--storage-root-base`, a folder of the test on this machine, which
/// the real node's hostPath volumes mount), with a link out of an instance's directory and a file
/// outside that the cleanup must not touch.
struct Storage {
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
}

impl Storage {
    fn new(cluster: &Shared, fx: &support::Fixture) -> Self {
        assert!(
            cluster.operator_image.is_some(),
            "the control plane has a real node"
        );
        let root = fx.dir.join("storage");
        let outside = fx.dir.join("outside-storage");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("precious"), "keep").expect("precious");
        Storage { root, outside }
    }

    fn instance(&self, host: &str) -> std::path::PathBuf {
        self.root.join(host)
    }

    /// Data, a nested tree, a link to a folder outside and a link to a file outside.
    fn fill(&self, dir: &Path) {
        std::fs::create_dir_all(dir.join("data/member/snap")).expect("tree");
        std::fs::write(dir.join("data/member/snap/db"), "x").expect("db");
        std::os::unix::fs::symlink(&self.outside, dir.join("data/escape")).expect("link");
        std::os::unix::fs::symlink(self.outside.join("precious"), dir.join("precious-link"))
            .expect("link");
    }

    fn assert_untouched(&self) {
        assert_eq!(
            std::fs::read_to_string(self.outside.join("precious")).expect("the link target stays"),
            "keep"
        );
    }
}

/// The type of a Job's finishing condition (`Complete` or `Failed`) that is `True`.
fn job_condition(job: &Value) -> Option<String> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
        .and_then(|c| c["type"].as_str().map(String::from))
}

/// The exit code and reason of the cleanup container of the Job's (last) pod.
fn job_pod_exit(cluster: &Shared, ns: &str, job: &str) -> Option<(i64, String)> {
    let pods = get(
        cluster,
        &["-n", ns, "get", "pods", "-l", &format!("job-name={job}")],
    )?;
    let pod = pods["items"].as_array()?.last()?.clone();
    let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    Some((t["exitCode"].as_i64()?, t["reason"].as_str()?.to_string()))
}

#[tokio::test]
async fn a_chart_digest_mismatch_stops_the_controller() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
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
            &format!("--cleanup-image={}", e2e::chart::TEST_IMAGE),
            "--install-platform=false",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to start"), "{stderr}");

    // Issue 32: outside a pod and without KUBECONFIG, the controller refuses to start, even
    // with a working `~/.kube/config` in its home (which anything running as its user could
    // have written).
    let chart = dir.join("vcluster-0.37.3-standin.tgz");
    let digest = Command::new("sha256sum")
        .arg(&chart)
        .output()
        .expect("sha256sum");
    let digest = String::from_utf8_lossy(&digest.stdout);
    let home = dir.join("home");
    std::fs::create_dir_all(home.join(".kube")).expect("home");
    std::fs::copy(&cluster.kubeconfig, home.join(".kube/config")).expect("kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_controller"))
        .arg("--helm-binary")
        .arg(&cluster.helm)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", &home)
        .arg("--vcluster-chart")
        .arg(&chart)
        .arg("--vcluster-chart-sha256")
        .arg(format!(
            "sha256:{}",
            digest.split_whitespace().next().expect("digest")
        ))
        .args([
            "--metrics-bind-address",
            "127.0.0.1:0",
            &format!("--cleanup-image={}", e2e::chart::TEST_IMAGE),
            "--install-platform=false",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("it never reads ~/.kube/config"), "{stderr}");
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

    // An interrupted helm: a first install killed mid-way leaves the release pending-install,
    // in the host namespace the controller had applied (marked with the instance's UID) before
    // it ran helm. The instance exists before any controller runs.
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "crashed", "Retain")),
        )
        .expect("apply");
    let uid = uid_of(&cluster, &team, "pi", "crashed").expect("the instance's UID");
    let host = common::names::host_namespace(&team, "crashed");
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {host}\n  labels: {{ {}: {uid} }}\n  annotations: {{ {}: {team}/crashed }}\n",
                common::names::INSTANCE_UID_LABEL,
                common::names::INSTANCE_ANNOTATION
            )),
        )
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
    let first = Controller::start(&cluster, &fx, &["--watch-namespace", &team]);
    let second = Controller::start(&cluster, &fx, &["--watch-namespace", &team]);
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
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let controller = Controller::start(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--watch-namespace",
            &team,
            "--max-concurrent-installs=1",
            "--helm-binary",
            &slow_helm.display().to_string(),
        ],
    );
    for name in ["q1", "q2", "q3"] {
        cluster
            .kubectl_ok(
                &["apply", "--server-side", "-f", "-"],
                Some(&instance(&team, name, "Retain")),
            )
            .expect("apply");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // An instance deleted while its install waits in the queue is cancelled at once: it goes
    // without waiting for the installs ahead of it, and no helm install ever runs for it.
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "q4", "Retain")),
        )
        .expect("apply");
    let mut queued_messages = std::collections::BTreeSet::new();
    let q4 = wait_for("q4 queued", Duration::from_secs(30), &controller, || {
        let pi = get(&cluster, &["-n", &team, "get", "pi", "q4"])?;
        let c = pi["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "VClusterReady" && c["reason"] == "Queued")?;
        Some(format!("q4: {}", c["message"].as_str().unwrap_or_default()))
    })
    .await;
    queued_messages.insert(q4);
    cluster
        .kubectl_ok(&["-n", &team, "delete", "pi", "q4", "--wait=false"], None)
        .expect("delete q4");
    wait_for("q4 gone", Duration::from_secs(60), &controller, || {
        get(&cluster, &["-n", &team, "get", "pi", "q4"])
            .is_none()
            .then_some(())
    })
    .await;
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
    let installs = controller
        .metric_with(
            "platform_operator_controller_helm_duration_seconds_count",
            "operation=\"install\"",
        )
        .await;
    // q1 to q3: each installed, then upgraded once to pin its control plane to the node it was
    // scheduled on (its storage node); the deleted q4 never ran helm.
    assert_eq!(installs, 6.0, "no helm install ran for the deleted q4");
}

/// `metadata.uid` of `kind/name` in `ns`.
fn uid_of(cluster: &Shared, ns: &str, kind: &str, name: &str) -> Option<String> {
    get(cluster, &["-n", ns, "get", kind, name])?["metadata"]["uid"]
        .as_str()
        .map(String::from)
}

/// Waits for instance `ns/name` to reach `Installing`; its host namespace.
async fn installing(cluster: &Shared, controller: &Controller, ns: &str, name: &str) -> String {
    wait_for(
        &format!("{name} to reach Installing"),
        Duration::from_secs(120),
        controller,
        || {
            let pi = get(cluster, &["-n", ns, "get", "pi", name])?;
            (pi["status"]["phase"] == "Installing")
                .then(|| pi["status"]["hostNamespace"].as_str().map(String::from))?
        },
    )
    .await
}

/// Deletes instance `name` in `ns` and waits until it is gone.
async fn deleted(cluster: &Shared, controller: &Controller, ns: &str, name: &str) {
    cluster
        .kubectl_ok(&["-n", ns, "delete", "pi", name, "--wait=false"], None)
        .expect("delete");
    wait_for(
        "the instance to be deleted",
        Duration::from_secs(120),
        controller,
        || {
            get(cluster, &["-n", ns, "get", "pi", name])
                .is_none()
                .then_some(())
        },
    )
    .await;
}

/// The reason of an instance's `VClusterReady` condition.
fn vcluster_reason(cluster: &Shared, ns: &str, name: &str) -> Option<String> {
    let pi = get(cluster, &["-n", ns, "get", "pi", name])?;
    condition(&pi, "VClusterReady").map(|c| c.1)
}

/// `--target-poll` of the test below, and the fallback it gives (30 polls).
const POLL: Duration = Duration::from_secs(3);
const FALLBACK: Duration = Duration::from_secs(90);

/// Instance `name` in `ns`, which waits with `reason` (since `since`), is not polled: it is
/// reconciled at most once in 15 s (a poll every `POLL` would be 5 times). Then `release` lets
/// the watched object change, `changed` sees when it has, and the instance must leave `reason`
/// within 20 s of the change, well before the fallback would have looked again.
async fn woken_by_its_watch(
    cluster: &Shared,
    controller: &Controller,
    (ns, name): (&str, &str),
    (reason, since): (&str, Instant),
    release: impl FnOnce(),
    mut changed: impl FnMut() -> bool,
) {
    let reconciles = || controller.metric("platform_operator_controller_reconciles_total");
    let quiet = Duration::from_secs(15);
    let before = reconciles().await;
    tokio::time::sleep(quiet).await;
    let during = reconciles().await - before;
    eprintln!("reconciles in {quiet:?} of {reason} at --target-poll {POLL:?}: {during}");
    assert!(
        during <= 1.0,
        "an instance in {reason} was reconciled {during} times in {quiet:?}: polled, not woken by a watch"
    );
    release();
    let seen = wait_for(
        &format!("the change {reason} waits for"),
        Duration::from_secs(120),
        controller,
        || changed().then(Instant::now),
    )
    .await;
    let left = wait_for(
        &format!("the instance to leave {reason}"),
        Duration::from_secs(60),
        controller,
        || (vcluster_reason(cluster, ns, name).as_deref() != Some(reason)).then(Instant::now),
    )
    .await;
    let after = left.saturating_duration_since(seen);
    eprintln!(
        "{reason}: the change came {:?} into the wait, the instance left it {after:?} after the change",
        seen - since
    );
    // Not a timing of performance: a wait left to the fallback ends 90 s after the last
    // reconcile; a wake-up by the watch within a few seconds of the change.
    assert!(
        left - since < FALLBACK - POLL && after < Duration::from_secs(20),
        "{reason} was left {after:?} after the change ({:?} into the wait): not woken by the watch",
        left - since
    );
}

/// Waits that a watch sees are not polled: an instance waiting for its exported kubeconfig or
/// for its control plane is reconciled when the watched object changes (and at a fallback of 30
/// polls), and advances at once when the kubeconfig is exported / the Deployment is available.
#[tokio::test]
async fn waits_for_the_kubeconfig_and_the_control_plane_are_woken_by_their_watches() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "watched").await;
    let team = cluster.create_namespace("watched", &[]).expect("namespace");
    let controller = Controller::start(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--watch-namespace",
            &team,
            &format!("--target-poll={}s", POLL.as_secs()),
            "--repair-interval=10m",
        ],
    );
    // The stand-in syncer holds back this vCluster's start, so its kubeconfig is not exported.
    fx.syncer.serve_only(&[]);
    cluster
        .kubectl_ok(
            &["apply", "--server-side", "-f", "-"],
            Some(&instance(&team, "w", "Delete")),
        )
        .expect("apply");
    let host = common::names::host_namespace(&team, "w");
    let reason_is = |reason: &str| vcluster_reason(&cluster, &team, "w").as_deref() == Some(reason);
    let since = wait_for(
        "the instance to wait for the exported kubeconfig",
        Duration::from_secs(120),
        &controller,
        || reason_is("WaitingForKubeconfig").then(Instant::now),
    )
    .await;
    // The syncer starts the vCluster and exports its kubeconfig: the watch wakes the instance.
    woken_by_its_watch(
        &cluster,
        &controller,
        (&team, "w"),
        ("WaitingForKubeconfig", since),
        || fx.syncer.serve(&team),
        || get(&cluster, &["-n", &host, "get", "secret", "vc-vcluster"]).is_some(),
    )
    .await;
    let serving = |what: &'static str| {
        wait_for(what, Duration::from_secs(120), &controller, || {
            reason_is("VClusterServing").then_some(())
        })
    };
    serving("the vCluster to serve").await;

    // The control plane goes (scaled to zero): the Deployment's watch wakes the instance, which
    // then waits for it without polling until it is back.
    let scale = |replicas: u8| {
        let replicas = format!("--replicas={replicas}");
        let args = ["-n", &host, "scale", "deployment", "vcluster", &replicas];
        cluster.kubectl_ok(&args, None).expect("scale");
    };
    let deployment = |field: &str| {
        get(&cluster, &["-n", &host, "get", "deployment", "vcluster"])
            .and_then(|d| d["status"][field].as_i64())
            .unwrap_or(0)
    };
    scale(0);
    let since = wait_for(
        "the instance to wait for its control plane",
        Duration::from_secs(60),
        &controller,
        || reason_is("WaitingForControlPlane").then(Instant::now),
    )
    .await;
    // The Deployment's status settles (its pod goes) after the reason changed: let it.
    wait_for(
        "the control plane's pod to go",
        Duration::from_secs(60),
        &controller,
        || (deployment("replicas") == 0).then_some(()),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    woken_by_its_watch(
        &cluster,
        &controller,
        (&team, "w"),
        ("WaitingForControlPlane", since),
        || scale(1),
        || deployment("availableReplicas") == 1,
    )
    .await;
    serving("the vCluster to serve again").await;

    deleted(&cluster, &controller, &team, "w").await;
}
