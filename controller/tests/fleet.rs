//! End-to-end tests of what a fleet needs (issue 31): suspend, retries you can see and bound,
//! history, and the GitOps health of an instance. The controller binary runs on the local
//! control plane with the stand-in vCluster chart and real helm, as in `e2e.rs`; instances are
//! written with `kubectl apply --server-side`, as a user would. The control plane has a real node
//! (where the installing controllers run, in its network namespace).

use std::time::Duration;

use e2e::shared::Shared;
use serde_json::Value;

mod support;
use support::{
    Controller, Fixture, argo_health, condition, fixture, get, installing_fixture, reaches,
    wait_for,
};

/// Helm runs the controller made (the `_count` of its helm durations).
const HELM_RUNS: &str = "platform_operator_controller_helm_duration_seconds_count";

/// Instance `ns/name` at 6.0.22 with `extra` spec lines.
fn instance(ns: &str, name: &str, extra: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  version: 6.0.22\n  deletionPolicy: Retain\n{extra}"
    )
}

/// The shared control plane (with a real node) with the CRD, a fixture named `name` whose
/// vCluster chart gets the extra `values` (an installing one when `flags` install), a new
/// namespace, and a controller watching it with `flags`. (Bind all four: the controller must stop
/// before the fixture.)
async fn start(name: &str, values: &str, flags: &[&str]) -> (Shared, Fixture, String, Controller) {
    let cluster = e2e::shared_with_real_node().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = if flags.contains(&"--install-platform=true") {
        installing_fixture(&cluster, name).await
    } else {
        fixture(&cluster, name).await
    };
    std::fs::write(&fx.values, values).expect("values");
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let mut args = vec!["--leader-elect=false", "--watch-namespace", &team];
    args.extend(flags);
    let controller = Controller::start(&cluster, &fx, &args);
    (cluster, fx, team, controller)
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

/// Sets the retry annotation of instance `ns/name`, as a person asking for a retry.
fn ask_for_retry(cluster: &Shared, ns: &str, name: &str) {
    let annotation = "platform.di-framework.dev/retry=1";
    let args = ["-n", ns, "annotate", "pi", name, annotation];
    cluster.kubectl_ok(&args, None).expect("annotate");
}

/// Deletes instance `ns/name` and waits until it is gone.
async fn delete(cluster: &Shared, controller: &Controller, ns: &str, name: &str) {
    let args = ["-n", ns, "delete", "pi", name, "--wait=false"];
    cluster.kubectl_ok(&args, None).expect("delete");
    let limit = Duration::from_secs(180);
    wait_for(&format!("{name} to be gone"), limit, controller, || {
        let gone = get(cluster, &["-n", ns, "get", "pi", name]).is_none();
        gone.then_some(())
    })
    .await;
}

fn pi(cluster: &Shared, ns: &str, name: &str) -> Value {
    get(cluster, &["-n", ns, "get", "pi", name]).expect("the instance")
}

/// Item 1: `spec.suspend` holds every Helm run and write (deletion is still honoured), says so
/// in a condition and a column of `kubectl get pi`, and resumes where it stopped.
#[tokio::test]
async fn a_suspended_instance_runs_nothing_until_resumed_and_is_still_deleted() {
    let (cluster, _fx, team, controller) = start("suspend", "{}\n", &[]).await;
    let cc = (&cluster, &controller);
    let limit = Duration::from_secs(120);

    // Created suspended: the finalizer only; no host namespace, no helm.
    let held = suspend(&cluster, &controller, &team).await;
    assert_eq!(
        condition(&held, "Reconciling"),
        Some(("False".into(), "Suspended".into()))
    );
    assert!(held["metadata"]["finalizers"].as_array().is_some());
    assert_eq!(argo_health(&held).0, "Suspended");
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
    let (health, message) = argo_health(&resumed);
    assert_eq!(health, "Progressing");
    assert!(message.contains("--install-platform=false"), "{message}");
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
    delete(&cluster, &controller, &team, "held").await;
}

/// Item 2: a failing Helm run (real helm refusing values the chart's schema does not allow)
/// shows its failures and when it retries, stops at `--max-retries` as `Stalled`, and starts
/// over at once on a spec change and on the retry annotation.
#[tokio::test]
async fn a_failing_helm_run_says_when_it_retries_and_stalls_at_max_retries() {
    // The stand-in chart's schema, as strict as the real chart's, has no policies.notAField.
    let (cluster, fx, team, controller) = start(
        "retries",
        "policies: { notAField: true }\n",
        &["--max-retries=2"],
    )
    .await;
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
    let (health, message) = argo_health(&pi);
    assert_eq!(health, "Degraded");
    assert!(
        message.starts_with("RetriesExhausted: helm failed"),
        "{message}"
    );
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
    ask_for_retry(&cluster, &team, "flaky");
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

/// Items 5 and 7: a real install (the STAND-IN `@di-framework/platform` from the test npm
/// registry, the real Pulumi CLI) and a repair asked for by the retry annotation are kept in
/// `status.history`, newest first; the Argo CD health check reads the Ready instance as Healthy;
/// the per-instance metrics show it while it exists, and not after.
#[tokio::test]
async fn the_history_keeps_each_run_newest_first_and_a_ready_instance_is_healthy() {
    // --install-timeout is a liveness bound here: on a loaded CI run a first install (npm tree,
    // Pulumi) took past 300 s, and the retry after a timeout is a second entry in the history.
    let (cluster, _fx, team, controller) = start(
        "history",
        "{}\n",
        &["--install-platform=true", "--install-timeout", "1200s"],
    )
    .await;
    let history = |pi: &Value| {
        pi["status"]["history"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    apply(&cluster, &instance(&team, "one", ""));
    // A liveness bound, not a timing: provisioning and a first npm and Pulumi install at a
    // version (see tests/installer.rs).
    let pi = wait_for(
        "one to be Ready",
        Duration::from_secs(1500),
        &controller,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "one"])?;
            (condition(&pi, "Ready") == Some(("True".into(), "Installed".into()))).then_some(pi)
        },
    )
    .await;
    let runs = history(&pi);
    assert_eq!(runs.len(), 1, "{pi}");
    let install = &runs[0];
    assert_eq!(
        (&install["kind"], &install["result"], &install["version"]),
        (&"Install".into(), &"Succeeded".into(), &"6.0.22".into())
    );
    assert!(
        install["summary"]["created"].as_i64() > Some(0),
        "{install}"
    );
    assert_eq!(
        install["configHash"],
        pi["status"]["lastInstall"]["summary"]["configHash"]
    );
    assert!(install["startedAt"].is_string() && install["finishedAt"].is_string());
    assert_eq!(argo_health(&pi).0, "Healthy");

    // The per-instance metrics, without kube-state-metrics.
    let one = "name=\"one\"";
    let info = "platform_operator_instance_info";
    let labels = [
        one,
        "installed_version=\"6.0.22\"",
        "phase=\"Ready\"",
        "version=\"6.0.22\"",
    ];
    let text = controller.metrics().await;
    let line = text
        .lines()
        .find(|l| l.starts_with(info) && l.contains(one));
    let line = line.unwrap_or_else(|| panic!("no {info} of one:\n{text}"));
    assert!(
        labels.iter().all(|l| line.contains(l)) && line.ends_with(" 1"),
        "{line}"
    );
    let condition_series = "platform_operator_instance_condition";
    let ready = [one, "type=\"Ready\"", "status=\"True\""];
    assert!(
        text.lines()
            .any(|l| l.starts_with(condition_series) && ready.iter().all(|r| l.contains(r))),
        "{text}"
    );

    // A repair on request: newest first, the install kept behind it.
    ask_for_retry(&cluster, &team, "one");
    let pi = wait_for(
        "the repair in the history",
        Duration::from_secs(600),
        &controller,
        || {
            let pi = get(&cluster, &["-n", &team, "get", "pi", "one"])?;
            (history(&pi).len() == 2).then_some(pi)
        },
    )
    .await;
    let runs = history(&pi);
    assert_eq!(
        (&runs[0]["kind"], &runs[0]["result"]),
        (&"Repair".into(), &"Succeeded".into())
    );
    assert_eq!(runs[1], *install, "the install, unchanged, behind it");

    // Deleted: its series go.
    delete(&cluster, &controller, &team, "one").await;
    let gone = controller.metric_with(info, one).await;
    let conditions = controller.metric_with(condition_series, one).await;
    assert_eq!((gone, conditions), (0.0, 0.0));
}

/// Runs kubectl with `args` inside the fixture's vCluster (its inner API server).
fn inside(fx: &Fixture, cluster: &Shared, args: &[&str]) -> e2e::cmd::Outcome {
    let mut cmd = std::process::Command::new(&cluster.kubectl);
    cmd.env("KUBECONFIG", fx.inner.kubeconfig()).args(args);
    e2e::cmd::run(cmd, None).expect("kubectl")
}

/// The stand-in program's settings ConfigMap inside the vCluster exists.
fn settings_exist(fx: &Fixture, cluster: &Shared) -> bool {
    let args = ["-n", "di-platform", "get", "configmap", "platform-settings"];
    inside(fx, cluster, &args).success
}

/// Waits until instance `ns/name` is Ready (a real install: npm and Pulumi).
async fn ready(cluster: &Shared, controller: &Controller, ns: &str, name: &str) -> Value {
    // A liveness bound, not a timing (see tests/installer.rs).
    let limit = Duration::from_secs(1500);
    wait_for(&format!("{name} to be Ready"), limit, controller, || {
        let pi = get(cluster, &["-n", ns, "get", "pi", name])?;
        (condition(&pi, "Ready") == Some(("True".into(), "Installed".into()))).then_some(pi)
    })
    .await
}

/// Item 3: `spec.repair.mode: Warn` reports drift (how many resources, which, and a Warning
/// Event) at each repair tick and changes nothing; `Repair` then puts it back.
#[tokio::test]
async fn warn_reports_drift_without_repairing_it_until_the_mode_is_repair() {
    let (cluster, fx, team, controller) = start(
        "drift",
        "{}\n",
        &[
            "--install-platform=true",
            "--install-timeout=1200s",
            "--repair-interval=5s",
        ],
    )
    .await;
    let warn = "  repair: { mode: Warn }\n";
    apply(&cluster, &instance(&team, "one", warn));
    ready(&cluster, &controller, &team, "one").await;
    assert!(settings_exist(&fx, &cluster));

    // Drift: an object the program made is deleted behind Pulumi's back.
    let remove = [
        "-n",
        "di-platform",
        "delete",
        "configmap",
        "platform-settings",
    ];
    assert!(inside(&fx, &cluster, &remove).success);
    let limit = Duration::from_secs(240);
    let cc = (&cluster, &controller);
    let drift = ("DriftDetected", "True", "DriftDetected");
    let found = reaches(cc, (&team, "one"), drift, limit).await;
    let said = message(&found, "DriftDetected");
    assert!(
        said.contains("create 1") && said.contains("platform-settings") && said.contains("Warn"),
        "{said}"
    );
    assert_eq!(found["status"]["phase"], "Ready");
    let events = get(&cluster, &["-n", &team, "get", "events"]).expect("events");
    let warned = events["items"].as_array().into_iter().flatten().any(|e| {
        e["reason"] == "DriftDetected"
            && e["type"] == "Warning"
            && e["note"]
                .as_str()
                .or(e["message"].as_str())
                .is_some_and(|m| m.contains("platform-settings"))
    });
    assert!(warned, "{events}");
    // Several repair ticks later: still gone, no run but the install.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let pi = pi(&cluster, &team, "one");
    assert!(!settings_exist(&fx, &cluster), "Warn changed nothing");
    assert_eq!(
        pi["status"]["history"].as_array().map(Vec::len),
        Some(1),
        "{pi}"
    );
    assert_eq!(
        condition(&pi, "DriftDetected").map(|c| c.0),
        Some("True".into())
    );

    // Repair: the next tick puts it back.
    apply(
        &cluster,
        &instance(&team, "one", "  repair: { mode: Repair }\n"),
    );
    wait_for("the ConfigMap to be put back", limit, &controller, || {
        settings_exist(&fx, &cluster).then_some(())
    })
    .await;
    delete(&cluster, &controller, &team, "one").await;
}

/// Instance `ns/one` at `version` with `annotations` (flow YAML) and `extra` spec lines.
fn one_at(ns: &str, version: &str, annotations: &str, extra: &str) -> String {
    let yaml = instance(ns, "one", extra).replace("6.0.22", version);
    yaml.replace(
        "metadata: {",
        &format!("metadata: {{ annotations: {{ {annotations} }},"),
    )
}

/// The stand-in program's `packageVersion` in its settings ConfigMap inside the vCluster.
fn deployed_version(fx: &Fixture, cluster: &Shared) -> String {
    let args = "-n di-platform get configmap platform-settings -o jsonpath={.data.packageVersion}";
    let out = inside(fx, cluster, &args.split(' ').collect::<Vec<_>>());
    out.stdout.trim().to_string()
}

/// Waits until instance `ns/one` has installed `version`.
async fn installed(cluster: &Shared, controller: &Controller, ns: &str, version: &str) -> Value {
    let limit = Duration::from_secs(1500);
    wait_for(&format!("{version} installed"), limit, controller, || {
        let pi = get(cluster, &["-n", ns, "get", "pi", "one"])?;
        let done = pi["status"]["installedVersion"] == version
            && condition(&pi, "Ready") == Some(("True".into(), "Installed".into()));
        done.then_some(pi)
    })
    .await
}

/// Item 4: with `spec.upgrade.approval: Manual` a new version is previewed (the summary in
/// `status.pendingUpgrade`, `UpgradePending` in `kubectl get pi`) and waits for the approve
/// annotation naming it; every upgrade (approved, or Automatic) first copies the Pulumi state
/// aside, and a copy restored as docs/operations.md says brings the old version back.
#[tokio::test]
async fn a_manual_upgrade_waits_for_its_approval_and_the_state_copy_rolls_it_back() {
    let (cluster, fx, team, controller) = start(
        "approve",
        "{}\n",
        &["--install-platform=true", "--install-timeout=1200s"],
    )
    .await;
    let manual = "  upgrade: { approval: Manual }\n";
    apply(&cluster, &one_at(&team, "6.0.21", "", manual));
    installed(&cluster, &controller, &team, "6.0.21").await;

    // A new version: previewed, then waiting.
    apply(&cluster, &one_at(&team, "6.0.22", "", manual));
    let cc = (&cluster, &controller);
    let waiting = ("UpgradePending", "True", "UpgradePending");
    let found = reaches(cc, (&team, "one"), waiting, Duration::from_secs(600)).await;
    let pending = &found["status"]["pendingUpgrade"];
    assert_eq!(pending["version"], "6.0.22", "{found}");
    assert!(pending["update"].as_i64() >= Some(1), "{pending}");
    let names = pending["resources"].to_string();
    assert!(names.contains("platform-settings"), "{pending}");
    assert!(message(&found, "UpgradePending").contains("approve=6.0.22"));
    let table = cluster.kubectl_ok(&["-n", &team, "get", "pi", "one"], None);
    assert!(table.expect("get").contains("UpgradePending"));
    // Nothing upgraded over several polls, nor for an approval of another version.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let approve = |version: &str| {
        let annotation = format!("platform.di-framework.dev/approve={version}");
        let args = [
            "-n",
            &team,
            "annotate",
            "pi",
            "one",
            &annotation,
            "--overwrite",
        ];
        cluster.kubectl_ok(&args, None).expect("annotate");
    };
    approve("6.0.99");
    tokio::time::sleep(Duration::from_secs(15)).await;
    let pi = pi(&cluster, &team, "one");
    assert_eq!(pi["status"]["installedVersion"], "6.0.21", "{pi}");
    assert_eq!(deployed_version(&fx, &cluster), "6.0.21");
    assert_eq!(pi["status"]["history"].as_array().map(Vec::len), Some(1));
    assert!(pi["status"]["stateBackups"].is_null(), "{pi}");

    // Approved: a copy of the state, then the upgrade.
    approve("6.0.22");
    let pi = installed(&cluster, &controller, &team, "6.0.22").await;
    assert_eq!(deployed_version(&fx, &cluster), "6.0.22");
    assert!(pi["status"]["pendingUpgrade"].is_null(), "{pi}");
    assert!(condition(&pi, "UpgradePending").is_none(), "{pi}");
    let backups = pi["status"]["stateBackups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(backups.len(), 1, "{pi}");
    assert_eq!(
        (&backups[0]["version"], &backups[0]["upgradeTo"]),
        (&"6.0.21".into(), &"6.0.22".into())
    );
    let backup = std::path::PathBuf::from(backups[0]["path"].as_str().expect("path"));
    assert!(backup.join("state").is_dir() && backup.join("Pulumi.dev.yaml").is_file());

    // Rolled back as docs/operations.md says: suspended, the copy put back, the old version.
    apply(&cluster, &one_at(&team, "6.0.22", "", "  suspend: true\n"));
    let held = ("Suspended", "True", "Suspended");
    reaches(cc, (&team, "one"), held, Duration::from_secs(120)).await;
    let project = fx.dir.join("state").join(&team).join("one/platform");
    std::fs::remove_dir_all(project.join("state")).expect("remove the state");
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(backup.join("state"))
        .arg(backup.join("Pulumi.dev.yaml"))
        .arg(&project)
        .status();
    assert!(cp.expect("cp").success());
    let downgrade = "\"platform.di-framework.dev/allow-downgrade\": \"true\"";
    apply(&cluster, &one_at(&team, "6.0.21", downgrade, ""));
    installed(&cluster, &controller, &team, "6.0.21").await;
    assert_eq!(deployed_version(&fx, &cluster), "6.0.21");

    // Automatic (the default): the upgrade runs at once, after a copy of the state.
    apply(&cluster, &one_at(&team, "6.0.22", downgrade, ""));
    let pi = installed(&cluster, &controller, &team, "6.0.22").await;
    let backups = pi["status"]["stateBackups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(backups.len(), 3, "{pi}");
    assert_eq!(backups[0]["version"], "6.0.21");
    delete(&cluster, &controller, &team, "one").await;
}

/// Item 7: the health check shown in docs/operations.md is the file the tests run.
#[test]
fn the_health_check_in_the_operations_guide_is_the_shipped_file() {
    let read = |f: &str| std::fs::read_to_string(e2e::repo_root().join(f)).expect(f);
    let (script, guide) = (read("docs/argocd-health.lua"), read("docs/operations.md"));
    let indented: String = script
        .lines()
        .map(|l| match l.is_empty() {
            true => "\n".to_string(),
            false => format!("    {l}\n"),
        })
        .collect();
    let key = "resource.customizations.health.platform.di-framework.dev_PlatformInstance: |\n";
    assert!(
        guide.contains(&format!("{key}{indented}```")),
        "docs/operations.md"
    );
}

/// What `spec.resources` of the quota tests asks for.
const RESOURCES: &str = r#"{"quota": {"limits.cpu": "4", "count/pods": 30}, "limitRange": {"default": {"cpu": "500m"}, "max": {"memory": "2Gi"}}}"#;

/// The ResourceQuota and LimitRange `vc-vcluster` the chart in `chart` (a folder or archive)
/// renders for the controller's values with `RESOURCES`: `(spec.hard, spec.limits)`.
fn rendered_policies(chart: &std::path::Path) -> (Value, Value) {
    let r: common::crd::InstanceResources = serde_json::from_str(RESOURCES).expect("resources");
    let claim = controller::reconcile::objects::Claim {
        image: "ghcr.io/di-framework/platform-operator@sha256:00",
        uid: "u-1",
        instance: "team/one",
    };
    let host = "pi-team-one-0123456789abcdef";
    let values = controller::reconcile::vcluster_values(
        "/srv/instances",
        host,
        "team-one",
        controller::pod_security::Level::Baseline,
        None,
        &claim,
        Some(&r),
    );
    let dir = e2e::control_plane::base_dir().join(format!("quota-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("values.yaml");
    std::fs::write(&file, values).expect("values");
    let helm = e2e::chart::Helm::offline().expect("helm");
    let (chart, file) = (chart.display().to_string(), file.display().to_string());
    let args = ["template", "vcluster", &chart, "-n", host, "-f", &file];
    let out = helm
        .ok(&args)
        .unwrap_or_else(|e| panic!("helm template {chart}: {e}"));
    let rendered = e2e::chart::Rendered::parse(&out).expect("manifest");
    let quota = rendered.get("ResourceQuota", "vc-vcluster")["spec"]["hard"].clone();
    let limits = rendered.get("LimitRange", "vc-vcluster")["spec"]["limits"].clone();
    (quota, limits)
}

/// Item 6: the controller's `policies` values for `spec.resources` render, in the REAL vCluster
/// chart (the vendored 0.37 archive, its schema checked by helm), exactly the quota and limits
/// asked for (none of the chart's examples), and the stand-in chart renders the same.
#[test]
fn the_real_vcluster_chart_renders_exactly_the_quotas_asked_for() {
    let real = std::path::Path::new("/work/shared/vendor/vcluster/vcluster-0.37.0-rc.1.tgz");
    let real = match real.exists() {
        true => real.to_path_buf(),
        false => e2e::repo_root().join("../shared/vendor/vcluster/vcluster-0.37.0-rc.1.tgz"),
    };
    let (quota, limits) = rendered_policies(&real);
    assert_eq!(
        quota,
        serde_json::json!({"limits.cpu": "4", "count/pods": "30"})
    );
    assert_eq!(
        limits,
        serde_json::json!([{"type": "Container", "default": {"cpu": "500m"}, "defaultRequest": null, "max": {"memory": "2Gi"}}])
    );
    let standin = e2e::repo_root().join("e2e/standin-vcluster");
    assert_eq!(rendered_policies(&standin), (quota, limits));
}

/// Item 6 end to end: `spec.resources` (applied as a user would) becomes the host namespace's
/// ResourceQuota and LimitRange, a change to it upgrades the release, an instance without it
/// gets the fleet-wide default, and a bad quantity is refused by the schema.
#[tokio::test]
async fn spec_resources_set_the_host_namespaces_quota_and_the_default_applies_elsewhere() {
    let default = r#"--default-instance-resources={"quota": {"count/pods": "99"}}"#;
    let (cluster, _fx, team, controller) = start("quota", "{}\n", &[default]).await;
    let limit = Duration::from_secs(120);
    let yaml = |name: &str, extra: &str| instance(&team, name, extra);
    let asked = format!("  resources: {RESOURCES}\n");
    apply(&cluster, &yaml("sized", &asked));
    apply(&cluster, &yaml("plain", ""));
    let hard = |name: &str| {
        let pi = get(&cluster, &["-n", &team, "get", "pi", name])?;
        let host = pi["status"]["hostNamespace"].as_str()?.to_string();
        let quota = get(
            &cluster,
            &["-n", &host, "get", "resourcequota", "vc-vcluster"],
        )?;
        Some(quota["spec"]["hard"].clone())
    };
    let want = serde_json::json!({"limits.cpu": "4", "count/pods": "30"});
    wait_for("sized's quota", limit, &controller, || {
        (hard("sized")? == want).then_some(())
    })
    .await;
    let pi = pi(&cluster, &team, "sized");
    let host = pi["status"]["hostNamespace"].as_str().expect("host");
    let range = get(&cluster, &["-n", host, "get", "limitrange", "vc-vcluster"]).expect("limits");
    assert_eq!(range["spec"]["limits"][0]["max"]["memory"], "2Gi");
    let fleet = serde_json::json!({"count/pods": "99"});
    wait_for("plain's default quota", limit, &controller, || {
        (hard("plain")? == fleet).then_some(())
    })
    .await;

    // Changed: the release is upgraded with the new quota.
    apply(
        &cluster,
        &yaml("sized", "  resources: { quota: { count/pods: 7 } }\n"),
    );
    let seven = serde_json::json!({"count/pods": "7"});
    wait_for("sized's new quota", limit, &controller, || {
        (hard("sized")? == seven).then_some(())
    })
    .await;

    // A bad quantity never reaches the controller.
    let bad = yaml("bad", "  resources: { quota: { limits.cpu: lots } }\n");
    let refused = cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&bad))
        .expect_err("a bad quantity");
    assert!(refused.to_string().contains("quantity"), "{refused}");
}
