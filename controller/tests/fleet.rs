//! End-to-end tests of what a fleet needs (issue 31): suspend, retries you can see and bound,
//! history, and the GitOps health of an instance. The controller binary runs on the local
//! control plane with the stand-in vCluster chart and real helm, as in `e2e.rs`; instances are
//! written with `kubectl apply --server-side`, as a user would.

use std::time::Duration;

use e2e::shared::Shared;
use serde_json::Value;

mod support;
use support::{Controller, condition, fixture, get, reaches, wait_for};

/// Helm runs the controller made (the `_count` of its helm durations).
const HELM_RUNS: &str = "platform_operator_controller_helm_duration_seconds_count";

/// Instance `ns/name` at 6.0.22 with `extra` spec lines.
fn instance(ns: &str, name: &str, extra: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: Retain\n{extra}"
    )
}

fn apply(cluster: &Shared, yaml: &str) {
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(yaml))
        .expect("kubectl apply --server-side");
}

/// Applies instance `ns/held` with `suspend: true`, and waits until it reports `Suspended`.
async fn suspend(cluster: &Shared, controller: &Controller, ns: &str) -> Value {
    apply(cluster, &instance(ns, "held", "  suspend: true\n"));
    let (condition, limit) = (("Suspended", "True", "Suspended"), Duration::from_secs(120));
    reaches((cluster, controller), (ns, "held"), condition, limit).await
}

fn pi(cluster: &Shared, ns: &str, name: &str) -> Value {
    get(cluster, &["-n", ns, "get", "pi", name]).expect("the instance")
}

/// Item 1: `spec.suspend` holds every Helm run and write (deletion is still honoured), says so
/// in a condition and a column of `kubectl get pi`, and resumes where it stopped.
#[tokio::test]
async fn a_suspended_instance_runs_nothing_until_resumed_and_is_still_deleted() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "suspend").await;
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let controller = Controller::start(
        &cluster,
        &fx,
        &["--leader-elect=false", "--watch-namespace", &team],
    );
    let cc = (&cluster, &controller);
    let limit = Duration::from_secs(120);

    // Created suspended: the finalizer only; no host namespace, no helm.
    let held = suspend(&cluster, &controller, &team).await;
    assert_eq!(
        condition(&held, "Reconciling"),
        Some(("False".into(), "Suspended".into()))
    );
    assert!(held["metadata"]["finalizers"].as_array().is_some());
    let host = held["status"]["hostNamespace"]
        .as_str()
        .expect("host")
        .to_string();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(get(&cluster, &["get", "namespace", &host]).is_none());
    assert_eq!(controller.metric(HELM_RUNS).await, 0.0);
    let table = cluster
        .kubectl_ok(&["-n", &team, "get", "pi", "held"], None)
        .expect("kubectl get pi");
    let (header, row) = table.split_once('\n').expect("two lines");
    let column = header.find("SUSPENDED");
    let column = column.unwrap_or_else(|| panic!("no SUSPENDED column: {table}"));
    assert!(row[column..].starts_with("true "), "{table}");

    // Resumed (the field removed by the same apply): it provisions.
    apply(&cluster, &instance(&team, "held", ""));
    let resumed = reaches(
        cc,
        (&team, "held"),
        ("Installed", "False", "InstallerDisabled"),
        limit,
    )
    .await;
    assert!(condition(&resumed, "Suspended").is_none(), "{resumed}");
    let secret = common::names::kubeconfig_secret("held");
    assert!(get(&cluster, &["-n", &team, "get", "secret", &secret]).is_some());

    // Suspended again: its kubeconfig Secret deleted stays deleted, no helm runs ...
    suspend(&cluster, &controller, &team).await;
    let helm_runs = controller.metric(HELM_RUNS).await;
    cluster
        .kubectl_ok(&["-n", &team, "delete", "secret", &secret], None)
        .expect("delete the kubeconfig Secret");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(get(&cluster, &["-n", &team, "get", "secret", &secret]).is_none());
    assert_eq!(controller.metric(HELM_RUNS).await, helm_runs);
    // ... until it resumes.
    apply(&cluster, &instance(&team, "held", "  suspend: false\n"));
    wait_for(
        "the kubeconfig Secret to be written again",
        limit,
        &controller,
        || get(&cluster, &["-n", &team, "get", "secret", &secret]),
    )
    .await;
    assert!(condition(&pi(&cluster, &team, "held"), "Suspended").is_none());

    // Deleting a suspended instance is honoured.
    suspend(&cluster, &controller, &team).await;
    cluster
        .kubectl_ok(&["-n", &team, "delete", "pi", "held", "--wait=false"], None)
        .expect("delete");
    wait_for(
        "the suspended instance to be deleted",
        limit,
        &controller,
        || {
            get(&cluster, &["-n", &team, "get", "pi", "held"])
                .is_none()
                .then_some(())
        },
    )
    .await;
}

/// Item 2: a failing Helm run (real helm refusing values the chart's schema does not allow)
/// shows its failures and when it retries, stops at `--max-retries` as `Stalled`, and starts
/// over at once on a spec change and on the retry annotation.
#[tokio::test]
async fn a_failing_helm_run_says_when_it_retries_and_stalls_at_max_retries() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "retries").await;
    // The stand-in chart's schema, as strict as the real chart's, has no policies.notAField.
    std::fs::write(&fx.values, "policies: { notAField: true }\n").expect("values");
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let controller = Controller::start(
        &cluster,
        &fx,
        &[
            "--leader-elect=false",
            "--watch-namespace",
            &team,
            "--max-retries=2",
        ],
    );
    let limit = Duration::from_secs(120);
    let failures = |pi: &Value| pi["status"]["failures"].as_u64();

    apply(&cluster, &instance(&team, "flaky", ""));
    let first = wait_for("the first failure", limit, &controller, || {
        let pi = get(&cluster, &["-n", &team, "get", "pi", "flaky"])?;
        (failures(&pi) == Some(1)).then_some(pi)
    })
    .await;
    let next = first["status"]["nextRetryAt"]
        .as_str()
        .expect("nextRetryAt");
    let message = message(&first, "VClusterReady");
    assert_eq!(
        condition(&first, "VClusterReady").map(|c| c.1),
        Some("InstallFailed".into())
    );
    assert!(
        message.contains("notAField")
            && message.contains(&format!(
                "failure 1 of --max-retries 2; the next try runs at {next}"
            )),
        "{message}"
    );

    // The second failure stops it: Stalled (kstatus Failed), no retry time, no more helm.
    let cc = (&cluster, &controller);
    let stalled = ("Stalled", "True", "RetriesExhausted");
    let pi = reaches(cc, (&team, "flaky"), stalled, limit).await;
    assert_eq!(failures(&pi), Some(2));
    assert!(pi["status"]["nextRetryAt"].is_null(), "{pi}");
    assert_eq!(pi["status"]["phase"], "Failed");
    let runs = controller.metric(HELM_RUNS).await;
    assert_eq!(runs, 2.0);
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(controller.metric(HELM_RUNS).await, runs, "no third try");

    // A spec change starts over at once: two more tries, then stalled again.
    apply(
        &cluster,
        &instance(&team, "flaky", "").replace("6.0.22", "6.0.21"),
    );
    wait_for("helm to run again", limit, &controller, || {
        let pi = get(&cluster, &["-n", &team, "get", "pi", "flaky"])?;
        let generation = pi["metadata"]["generation"].as_i64();
        let at = pi["status"]["observedGeneration"].as_i64() == generation;
        (at && failures(&pi) == Some(1)).then_some(())
    })
    .await;
    reaches(cc, (&team, "flaky"), stalled, limit).await;
    assert_eq!(controller.metric(HELM_RUNS).await, runs + 2.0);

    // Fixed, and the retry annotation set: it starts over at once and provisions.
    std::fs::write(&fx.values, "{}\n").expect("values");
    cluster
        .kubectl_ok(
            &[
                "-n",
                &team,
                "annotate",
                "pi",
                "flaky",
                "platform.di-framework.dev/retry=1",
            ],
            None,
        )
        .expect("annotate");
    let pi = reaches(
        cc,
        (&team, "flaky"),
        ("Installed", "False", "InstallerDisabled"),
        limit,
    )
    .await;
    assert!(
        failures(&pi).is_none() && pi["status"]["nextRetryAt"].is_null(),
        "{pi}"
    );
    assert_eq!(condition(&pi, "Stalled").map(|c| c.0), Some("False".into()));
}

/// The message of condition `type_`.
fn message(pi: &Value, type_: &str) -> String {
    let conditions = pi["status"]["conditions"].as_array();
    let found = conditions.and_then(|c| c.iter().find(|c| c["type"] == type_));
    found.map(|c| c["message"].to_string()).unwrap_or_default()
}
