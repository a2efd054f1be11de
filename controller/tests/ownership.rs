//! End-to-end, issue 15: nothing of another's is touched and nothing wedges. The controller
//! binary on the local control plane (real kube-apiserver, etcd, controller-manager with its Job
//! and quota controllers, a real node that runs the control planes' pods and the cleanup Jobs'
//! pods in real containers), the stand-in vCluster chart and syncer of `support`. Each part injects one fault and checks what survives:
//!
//! - a Secret `<name>-kubeconfig` somebody else made is neither overwritten nor deleted;
//! - a host namespace another instance's annotation names, and one somebody made without any
//!   mark, are neither adopted nor relabelled, nor deleted, cleaned or uninstalled when the
//!   instance is deleted, and an Event says what was left;
//! - create → delete → create → delete under one name: the second deletion does not believe the
//!   first deletion's (complete) cleanup Job, it replaces it with its own;
//! - a write the API server refuses (an admission policy) reaches status and Events, and is
//!   retried with growing waits, not every few seconds;
//! - a cleanup namespace that refuses the Job's pod (a quota of zero pods) is reported as
//!   `CleanupBlocked`, then `CleanupTimedOut` at `--cleanup-deadline`, and the deletion finishes
//!   once the cause is fixed and the Job deleted.

use std::time::Duration;

use common::names::{INSTANCE_UID_LABEL, host_namespace};
use serde_json::Value;

mod support;
use support::{Controller, condition, fixture, get, reaches, wait_for};

fn instance(ns: &str, name: &str, policy: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: {policy}\n"
    )
}

fn apply(cluster: &e2e::shared::Shared, yaml: &str) {
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(yaml))
        .expect("apply");
}

/// The reasons of the Events about instance `name` in `ns`.
fn event_reasons(cluster: &e2e::shared::Shared, ns: &str, name: &str) -> Vec<(String, String)> {
    let events = get(
        cluster,
        &[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ],
    )
    .unwrap_or(Value::Null);
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Waits until instance `name` is gone.
async fn gone(cluster: &e2e::shared::Shared, controller: &Controller, ns: &str, name: &str) {
    wait_for(
        &format!("{name} to be deleted"),
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

/// Waits until instance `name` has its kubeconfig written; its UID.
async fn serving(
    cluster: &e2e::shared::Shared,
    controller: &Controller,
    ns: &str,
    name: &str,
) -> String {
    wait_for(
        &format!("{name} to serve"),
        Duration::from_secs(120),
        controller,
        || {
            let pi = get(cluster, &["-n", ns, "get", "pi", name])?;
            (condition(&pi, "KubeconfigReady").is_some_and(|c| c.0 == "True"))
                .then(|| pi["metadata"]["uid"].as_str().map(String::from))
                .flatten()
        },
    )
    .await
}

#[tokio::test]
async fn nothing_of_another_is_touched_and_nothing_wedges() {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "ownership").await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let controller = Controller::start(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--watch-namespace",
            &team,
            "--cleanup-deadline=25s",
        ],
    );
    let ops = fx.operator_ns.clone();

    // 1. Somebody's own Secret under the kubeconfig Secret's name.
    cluster
        .kubectl_ok(
            &[
                "-n",
                &team,
                "create",
                "secret",
                "generic",
                "squat-kubeconfig",
                "--from-literal=kubeconfig=theirs",
            ],
            None,
        )
        .expect("their secret");
    // 2. A host namespace another instance's annotation names (as two names that map to one
    //    host namespace would), with something of theirs in it.
    let clash_host = host_namespace(&team, "clash");
    apply(
        &cluster,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {clash_host}\n  annotations: {{ platform.di-framework.dev/instance: {team}/someone-else }}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: theirs, namespace: {clash_host} }}\ndata: {{ a: b }}\n"
        ),
    );
    // 2b. A host namespace somebody made with neither mark nor annotation (anyone who may
    //     create namespaces can pre-create a victim's), with something of theirs in it.
    let bare_host = host_namespace(&team, "bare");
    apply(
        &cluster,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {bare_host}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: theirs, namespace: {bare_host} }}\ndata: {{ a: b }}\n"
        ),
    );
    for name in ["squat", "clash", "bare", "again"] {
        apply(&cluster, &instance(&team, name, "Delete"));
    }

    let at = (&cluster, &controller);
    let squat = reaches(
        at,
        (&team, "squat"),
        ("KubeconfigReady", "False", "KubeconfigSecretConflict"),
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(
        condition(&squat, "Stalled"),
        Some(("True".into(), "KubeconfigSecretConflict".into()))
    );
    let message = squat["status"]["conditions"].to_string();
    assert!(message.contains("squat-kubeconfig"), "{message}");
    let clash = reaches(
        at,
        (&team, "clash"),
        ("Stalled", "True", "HostNamespaceConflict"),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(clash["status"]["phase"], "Failed");
    let bare = reaches(
        at,
        (&team, "bare"),
        ("Stalled", "True", "HostNamespaceConflict"),
        Duration::from_secs(60),
    )
    .await;
    let message = bare["status"]["conditions"].to_string();
    assert!(message.contains(INSTANCE_UID_LABEL), "{message}");
    let ns = get(&cluster, &["get", "namespace", &bare_host]).expect("their namespace");
    let labels = ns["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        labels.keys().all(|k| k == "kubernetes.io/metadata.name"),
        "neither marked nor relabelled: {ns}"
    );

    // 3. create → delete → create → delete under one name.
    let first_uid = serving(&cluster, &controller, &team, "again").await;
    let again_host = host_namespace(&team, "again");
    cluster
        .kubectl_ok(
            &["-n", &team, "delete", "pi", "again", "--wait=false"],
            None,
        )
        .expect("delete");
    gone(&cluster, &controller, &team, "again").await;
    let first_job = get(&cluster, &["-n", &ops, "get", "job", &again_host]).expect("first Job");
    assert_eq!(first_job["status"]["succeeded"], 1, "{first_job}");
    assert_eq!(
        first_job["metadata"]["labels"][INSTANCE_UID_LABEL],
        first_uid
    );
    wait_for(
        "the first host namespace to go",
        Duration::from_secs(60),
        &controller,
        || {
            get(&cluster, &["get", "namespace", &again_host])
                .is_none()
                .then_some(())
        },
    )
    .await;
    apply(&cluster, &instance(&team, "again", "Delete"));
    let second_uid = serving(&cluster, &controller, &team, "again").await;
    assert_ne!(first_uid, second_uid);
    let host_ns = get(&cluster, &["get", "namespace", &again_host]).expect("host namespace");
    assert_eq!(
        host_ns["metadata"]["labels"][INSTANCE_UID_LABEL], second_uid,
        "the host namespace carries the instance's UID"
    );
    let secret = get(
        &cluster,
        &["-n", &team, "get", "secret", "again-kubeconfig"],
    )
    .expect("secret");
    assert_eq!(secret["metadata"]["labels"][INSTANCE_UID_LABEL], second_uid);
    cluster
        .kubectl_ok(
            &["-n", &team, "delete", "pi", "again", "--wait=false"],
            None,
        )
        .expect("delete");
    gone(&cluster, &controller, &team, "again").await;
    let second_job = get(&cluster, &["-n", &ops, "get", "job", &again_host]).expect("second Job");
    assert_ne!(
        second_job["metadata"]["uid"], first_job["metadata"]["uid"],
        "the first deletion's Job was replaced, not believed"
    );
    assert_eq!(
        second_job["metadata"]["labels"][INSTANCE_UID_LABEL],
        second_uid
    );
    assert_eq!(second_job["status"]["succeeded"], 1, "{second_job}");

    // 1 and 2, deleted: what is not theirs is left.
    cluster
        .kubectl_ok(
            &[
                "-n",
                &team,
                "delete",
                "pi",
                "squat",
                "clash",
                "bare",
                "--wait=false",
            ],
            None,
        )
        .expect("delete");
    gone(&cluster, &controller, &team, "squat").await;
    gone(&cluster, &controller, &team, "clash").await;
    gone(&cluster, &controller, &team, "bare").await;
    for host in [&clash_host, &bare_host] {
        let ns = get(&cluster, &["get", "namespace", host]).expect("their namespace stays");
        assert!(ns["metadata"]["deletionTimestamp"].is_null(), "{ns}");
        assert!(get(&cluster, &["-n", host, "get", "configmap", "theirs"]).is_some());
        assert!(
            get(&cluster, &["-n", &ops, "get", "job", host]).is_none(),
            "no cleanup ran on their storage"
        );
    }
    let theirs = get(
        &cluster,
        &["-n", &team, "get", "secret", "squat-kubeconfig"],
    )
    .expect("their Secret survives the instance's deletion");
    assert_eq!(
        theirs["data"]["kubeconfig"], "dGhlaXJz",
        "unchanged: base64 of 'theirs'"
    );
    assert!(
        theirs["metadata"]["labels"]
            .get(INSTANCE_UID_LABEL)
            .is_none(),
        "{theirs}"
    );
    let squat_host = host_namespace(&team, "squat");
    assert!(
        get(&cluster, &["-n", &ops, "get", "job", &squat_host]).is_some(),
        "squat's own storage was cleaned"
    );
    let left = wait_for(
        "the LeftAlone Event",
        Duration::from_secs(30),
        &controller,
        || {
            let events = event_reasons(&cluster, &team, "clash");
            events.into_iter().find(|(reason, _)| reason == "LeftAlone")
        },
    )
    .await;
    assert!(
        left.1.contains(&clash_host) && left.1.contains("someone-else"),
        "{left:?}"
    );
    assert!(
        event_reasons(&cluster, &team, "squat")
            .iter()
            .any(|(reason, note)| reason == "LeftAlone" && note.contains("squat-kubeconfig")),
        "an Event says the Secret was left"
    );

    // 4. A write the API server refuses: an admission policy denies the kubeconfig Secret.
    let policy = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {{ name: deny-refused-kubeconfig-{team} }}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules: [{{ apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [secrets] }}]\n  validations: [{{ expression: \"object.metadata.name != 'refused-kubeconfig'\", message: injected refusal }}]\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {{ name: deny-refused-kubeconfig-{team} }}\nspec:\n  policyName: deny-refused-kubeconfig-{team}\n  validationActions: [Deny]\n  matchResources: {{ namespaceSelector: {{ matchLabels: {{ kubernetes.io/metadata.name: {team} }} }} }}\n"
    );
    apply(&cluster, &policy);
    // The policy takes a moment to be enforced: wait until a dry run is refused.
    wait_for(
        "the injected policy to deny",
        Duration::from_secs(30),
        &controller,
        || {
            let mut create = cluster.kubectl();
            create.args([
                "-n",
                &team,
                "create",
                "secret",
                "generic",
                "refused-kubeconfig",
                "--dry-run=server",
            ]);
            let out = e2e::cmd::run(create, None).expect("kubectl");
            (!out.success && out.stderr.contains("injected refusal")).then_some(())
        },
    )
    .await;
    apply(&cluster, &instance(&team, "refused", "Delete"));
    let refused = reaches(
        at,
        (&team, "refused"),
        ("Ready", "False", "ReconcileFailed"),
        Duration::from_secs(120),
    )
    .await;
    let message = refused["status"]["conditions"].to_string();
    assert!(
        message.contains("writing the kubeconfig Secret failed")
            && message.contains("injected refusal"),
        "{message}"
    );
    assert!(
        event_reasons(&cluster, &team, "refused")
            .iter()
            .any(|(reason, _)| reason == "ReconcileFailed"),
        "an Event reports the failed action"
    );
    // Retried with growing waits: count the failed attempts over 24 s. A fixed 1 s retry
    // (--target-poll=1s, as before) would make about 24.
    let errors = || async {
        controller
            .metric("platform_operator_controller_reconciles_total{category=\"write_kubeconfig\",result=\"error\"}")
            .await
    };
    let before = errors().await;
    tokio::time::sleep(Duration::from_secs(24)).await;
    let during = errors().await - before;
    println!("failed writes retried in 24 s with backoff: {during}");
    assert!(
        (1.0..=8.0).contains(&during),
        "{during} retries in 24 s: expected a few, with growing waits"
    );
    cluster
        .kubectl_ok(
            &[
                "delete",
                "validatingadmissionpolicybinding,validatingadmissionpolicy",
                &format!("deny-refused-kubeconfig-{team}"),
            ],
            None,
        )
        .expect("remove the policy");
    // Recovers once the cause is gone (within the capped wait).
    serving(&cluster, &controller, &team, "refused").await;

    // 5. A cleanup namespace that refuses the Job's pod.
    apply(
        &cluster,
        &format!(
            "apiVersion: v1\nkind: ResourceQuota\nmetadata: {{ name: no-pods, namespace: {ops} }}\nspec: {{ hard: {{ pods: \"0\" }} }}\n"
        ),
    );
    let refused_host = host_namespace(&team, "refused");
    cluster
        .kubectl_ok(
            &["-n", &team, "delete", "pi", "refused", "--wait=false"],
            None,
        )
        .expect("delete");
    reaches(
        at,
        (&team, "refused"),
        ("Ready", "False", "CleanupBlocked"),
        Duration::from_secs(120),
    )
    .await;
    let timed_out = reaches(
        at,
        (&team, "refused"),
        ("Stalled", "True", "CleanupTimedOut"),
        Duration::from_secs(90),
    )
    .await;
    assert!(
        timed_out["metadata"]["finalizers"]
            .to_string()
            .contains("platform.di-framework.dev/instance"),
        "a timed-out cleanup keeps the finalizer"
    );
    let reasons = event_reasons(&cluster, &team, "refused");
    for reason in ["CleanupBlocked", "CleanupTimedOut"] {
        assert!(
            reasons.iter().any(|(r, _)| r == reason),
            "an Event for {reason}: {reasons:?}"
        );
    }
    let blocked = reasons
        .iter()
        .find(|(r, _)| r == "CleanupBlocked")
        .map(|(_, n)| n.clone())
        .unwrap_or_default();
    assert!(blocked.contains("quota"), "the cause is named: {blocked}");
    // Fixed: the quota goes, the Job is deleted as the condition says; the deletion finishes.
    cluster
        .kubectl_ok(&["-n", &ops, "delete", "resourcequota", "no-pods"], None)
        .expect("remove the quota");
    cluster
        .kubectl_ok(&["-n", &ops, "delete", "job", &refused_host], None)
        .expect("delete the Job");
    gone(&cluster, &controller, &team, "refused").await;
}
