//! `service/vcluster`, which vCluster makes the owner of everything it syncs into the host
//! namespace: restored, it never lets the garbage collector take what vCluster synced; the
//! admission policy that protects it lets the syncer through under the name the chart values in
//! force give its ServiceAccount. On the local control plane (with its garbage
//! collector) and the stand-in chart; the same steps hold for the real vCluster on the real node.

use std::time::Duration;

use common::names::HOST_NAMESPACE_LABEL;
use e2e::shared::Shared;

mod support;
use support::{Controller, LIMIT, fixture, get, serving, wait_for};

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
    // In force once another account is refused and the renamed syncer let through (a policy
    // another controller applied before this one may still be there for a moment).
    let renamed = || {
        let other = may_change(&cluster, &host, &account("other"));
        let syncer = may_change(&cluster, &host, &account("tenant-syncer"));
        (other.is_err() && syncer.is_ok()).then_some(())
    };
    wait_for(
        "the policy to let the renamed syncer through",
        limit,
        &controller,
        renamed,
    )
    .await;
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

/// What the real syncer writes into the host namespace, each owned by `service/vcluster` (UID
/// `owner`) as it stamps them (`pkg/util/translate`: `v1`/`Service`/`vcluster`, `controller:
/// false`): a pod, a Service, a claim, a Secret, a ConfigMap, an EndpointSlice, a NetworkPolicy.
fn synced(host: &str, owner: &str) -> (String, Vec<(&'static str, &'static str)>) {
    let objects = [
        (
            "Pod",
            "pods",
            "spec: { containers: [{ name: app, image: app }] }",
        ),
        ("Service", "services", "spec: { ports: [{ port: 80 }] }"),
        (
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            "spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Mi } } }",
        ),
        ("Secret", "secrets", "type: Opaque"),
        ("ConfigMap", "configmaps", "data: {}"),
        (
            "EndpointSlice",
            "endpointslices.discovery.k8s.io",
            "addressType: IPv4\nendpoints: []",
        ),
        (
            "NetworkPolicy",
            "networkpolicies.networking.k8s.io",
            "spec: { podSelector: {} }",
        ),
    ];
    let yaml = (objects.iter())
        .map(|(kind, _, body)| {
            let api = match *kind {
                "EndpointSlice" => "discovery.k8s.io/v1",
                "NetworkPolicy" => "networking.k8s.io/v1",
                _ => "v1",
            };
            format!(
                "apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: web-x-default-x-vcluster\n  namespace: {host}\n  labels: {{ app: synced }}\n  ownerReferences: [{{ apiVersion: v1, kind: Service, name: vcluster, uid: {owner}, controller: false }}]\n{body}\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n");
    (yaml, objects.iter().map(|(k, r, _)| (*k, *r)).collect())
}

/// Issue 29, defect 3: `service/vcluster` deleted (by a user the policy lets through) while the
/// garbage collector has not yet reached what it owned (here it is held back in the host
/// namespace by an admission policy of the test's, standing for a collector slower than the
/// controller). The controller recreates the Service without deleting anything, restarts the
/// control plane (so the syncer reads the new UID) and points every synced object's owner
/// reference at the new Service: once the collector runs, nothing is lost.
#[tokio::test]
async fn a_restored_service_vcluster_keeps_everything_synced() {
    let _serial = SERIAL.lock().await;
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let fx = fixture(&cluster, "restore").await;
    let (_, controller, host) = serving(&cluster, &fx).await;
    let uid = |kind: &str, name: &str| {
        let object = get(&cluster, &["-n", &host, "get", kind, name])?;
        object["metadata"]["uid"].as_str().map(String::from)
    };
    let old = uid("service", "vcluster").expect("service/vcluster");
    let pod = |cluster: &Shared| {
        let pods = get(cluster, &["-n", &host, "get", "pods", "-l", "app=vcluster"])?;
        pods["items"][0]["metadata"]["uid"]
            .as_str()
            .map(String::from)
    };
    let control_plane = pod(&cluster).expect("the control plane's pod");
    let (yaml, kinds) = synced(&host, &old);
    (cluster.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&yaml))).expect("synced");
    let hold = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {{ name: {host}-hold-gc }}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules: [{{ apiGroups: ['*'], apiVersions: ['*'], operations: [DELETE], resources: ['*'] }}]\n    namespaceSelector: {{ matchLabels: {{ kubernetes.io/metadata.name: {host} }} }}\n  validations:\n    - expression: \"!(request.userInfo.username in ['system:kube-controller-manager', 'system:serviceaccount:kube-system:generic-garbage-collector'])\"\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {{ name: {host}-hold-gc }}\nspec: {{ policyName: {host}-hold-gc, validationActions: [Deny] }}\n"
    );
    (cluster.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&hold))).expect("hold");
    // The policy takes a moment to be in force: a delete it must refuse.
    let probe = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: probe, namespace: {host} }}\n"
    );
    (cluster.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&probe))).expect("probe");
    wait_for("the collector to be held", LIMIT, &controller, || {
        let mut delete = cluster.kubectl();
        delete.args([
            "-n",
            &host,
            "delete",
            "configmap",
            "probe",
            "--dry-run=server",
        ]);
        delete.arg("--as=system:serviceaccount:kube-system:generic-garbage-collector");
        (!e2e::cmd::run(delete, None).expect("kubectl").success).then_some(())
    })
    .await;

    cluster
        .kubectl_ok(&["-n", &host, "delete", "service", "vcluster"], None)
        .expect("delete the service");
    let owners = |kind: &str| {
        let object = get(
            &cluster,
            &["-n", &host, "get", kind, "web-x-default-x-vcluster"],
        )?;
        let refs = object["metadata"]["ownerReferences"].as_array()?.clone();
        Some(
            refs.iter()
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect::<Vec<_>>(),
        )
    };
    // The record on the host namespace names the new UID once the relink is done.
    let recorded = || {
        let ns = get(&cluster, &["get", "namespace", &host])?;
        let record = &ns["metadata"]["annotations"]["platform.di-framework.dev/vcluster-service"];
        let new = uid("service", "vcluster").filter(|u| *u != old)?;
        record.as_str()?.starts_with(&new).then_some(new)
    };
    let new = wait_for(
        "the Service to be recreated and recorded",
        LIMIT,
        &controller,
        recorded,
    )
    .await;
    assert_ne!(
        pod(&cluster),
        Some(control_plane),
        "the syncer restarted with the restore"
    );

    // The collector runs again (and retries what it was refused): nothing synced is taken.
    let unhold = [
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
    ];
    cluster
        .kubectl_ok(&[&unhold[..], &[&format!("{host}-hold-gc")]].concat(), None)
        .expect("release the collector");
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    while std::time::Instant::now() < deadline {
        for (kind, resource) in &kinds {
            let object = get(
                &cluster,
                &["-n", &host, "get", resource, "web-x-default-x-vcluster"],
            );
            let object =
                object.unwrap_or_else(|| panic!("the {kind} vCluster synced was collected"));
            assert!(
                object["metadata"]["deletionTimestamp"].is_null(),
                "the {kind} is being deleted"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for (kind, resource) in &kinds {
        assert_eq!(
            owners(resource),
            Some(vec![new.clone()]),
            "the {kind} is relinked"
        );
    }
}
