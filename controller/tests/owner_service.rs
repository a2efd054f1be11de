//! `service/vcluster`, which vCluster makes the owner of everything it syncs into the host
//! namespace: the admission policy that protects it lets the syncer through under the name the
//! chart values in force give its ServiceAccount. On the local control plane (with its garbage
//! collector) and the stand-in chart; the same steps hold for the real vCluster on the real node.

use std::time::Duration;

use common::names::HOST_NAMESPACE_LABEL;
use e2e::shared::Shared;

mod support;
use support::{Controller, fixture, wait_for};

/// The instance tests of this file each start a controller, which applies the one cluster-wide
/// policy with its own values: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether `user` may annotate `service/vcluster` in `ns` (a server-side dry run); the refusal.
fn may_change(cluster: &Shared, ns: &str, user: &str) -> Result<(), String> {
    let mut annotate = cluster.kubectl();
    annotate.args(["-n", ns, "annotate", "service", "vcluster", "--overwrite"]);
    annotate.args(["probe=1", "--dry-run=server", &format!("--as={user}")]);
    let out = e2e::cmd::run(annotate, None).expect("kubectl");
    if out.success { Ok(()) } else { Err(out.stderr) }
}

/// Issue 29, defect 4: with `controlPlane.advanced.serviceAccount.name` among the extra values,
/// the syncer runs as that ServiceAccount and writes `service/vcluster` at its first start; the
/// policy lets exactly that account through (not every `vc-` account).
#[tokio::test]
async fn the_policy_lets_the_syncer_through_under_the_name_the_values_give_it() {
    let _serial = SERIAL.lock().await;
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let fx = fixture(&cluster, "syncer-name").await;
    let renamed = "controlPlane:\n  advanced:\n    serviceAccount:\n      name: tenant-syncer\n";
    std::fs::write(&fx.values, renamed).expect("extra values");
    let team = cluster.create_namespace("team", &[]).expect("namespace");
    let controller = Controller::start(&cluster, &fx, &["--watch-namespace", &team]);
    // A host namespace with its service/vcluster, and the rights to change it for three accounts:
    // the policy alone decides.
    let host =
        (cluster.create_namespace("host", &[(HOST_NAMESPACE_LABEL, "true")])).expect("namespace");
    let account = |name: &str| format!("system:serviceaccount:{host}:{name}");
    let accounts = ["tenant-syncer", "vc-vcluster", "other"];
    let subjects: Vec<String> = (accounts.iter())
        .map(|a| format!("{{kind: ServiceAccount, name: {a}, namespace: {host}}}"))
        .collect();
    let yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: vcluster, namespace: {host} }}\nspec: {{ ports: [{{ port: 443 }}] }}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{ name: services, namespace: {host} }}\nrules: [{{ apiGroups: [\"\"], resources: [services], verbs: [get, update, patch] }}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{ name: services, namespace: {host} }}\nroleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: services }}\nsubjects: [{}]\n",
        subjects.join(", ")
    );
    (cluster.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&yaml))).expect("apply");
    let limit = Duration::from_secs(60);
    wait_for(
        "the policy to refuse another account",
        limit,
        &controller,
        || may_change(&cluster, &host, &account("other")).err(),
    )
    .await;
    may_change(&cluster, &host, &account("tenant-syncer"))
        .expect("the syncer's ServiceAccount, as the values name it, may write service/vcluster");
    let refused = may_change(&cluster, &host, &account("vc-vcluster"))
        .expect_err("the chart's default name is not the syncer's with these values");
    assert!(
        refused.contains("managed by the platform operator"),
        "{refused}"
    );
}

/// The syncer's ServiceAccount as the controller names it in the policy is the one the real chart
/// runs the control plane as, with and without the name among the values.
#[test]
fn the_policy_names_the_account_the_real_chart_runs_the_syncer_as() {
    let dir = e2e::control_plane::base_dir().join(format!("syncer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let chart = e2e::chart::vendored_vcluster_chart();
    for values in [
        "{}\n",
        "controlPlane:\n  advanced:\n    serviceAccount:\n      name: tenant-syncer\n",
    ] {
        let rendered = e2e::chart::render_vcluster(&chart, "host", values, &dir).expect("render");
        let control_plane = (rendered.objects.iter())
            .find(|o| o["metadata"]["name"] == "vcluster" && o["spec"]["template"].is_object())
            .expect("the control plane");
        let parsed: serde_json::Value = serde_saphyr::from_str(values).expect("yaml");
        assert_eq!(
            control_plane["spec"]["template"]["spec"]["serviceAccountName"],
            controller::policy::syncer_account(Some(&parsed))
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
