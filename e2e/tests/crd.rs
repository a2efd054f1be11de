//! End-to-end: the generated PlatformInstance CRD on a real kube-apiserver. It installs and
//! becomes Established; the seed's example applies with `kubectl apply --server-side` and reads
//! back with its defaults; bad input is rejected by the schema alone (no webhook runs here), with
//! a message that names the field; `kubectl get pi -A` shows the printer columns.

use common::crd::{PlatformInstance, PlatformInstanceStatus};
use e2e::cmd::{Outcome, run};
use e2e::shared::Shared;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

const CRD_NAME: &str = "platforminstances.platform.di-framework.dev";
const DIGEST: &str = "@sha256:ee89fd4bce4f9f35f4cd09c63d3cbdd07bea3071b5d372f82c9f49b9741c3669";

fn repo_file(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The shared control plane with the CRD applied and Established.
fn cluster() -> Shared {
    let shared = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    shared.install_crd().unwrap_or_else(|e| panic!("{e}"));
    shared
}

/// A fresh namespace for one test.
fn namespace(cluster: &Shared, prefix: &str) -> String {
    cluster
        .create_namespace(prefix, &[])
        .unwrap_or_else(|e| panic!("{e}"))
}

fn apply(cluster: &Shared, manifest: &str) -> Outcome {
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "--server-side", "--field-manager=e2e", "-f", "-"]);
    run(cmd, Some(manifest)).expect("kubectl runs")
}

fn get_json(cluster: &Shared, namespace: &str, name: &str) -> Option<Value> {
    let mut cmd = cluster.kubectl();
    cmd.args([
        "get",
        "platforminstance",
        name,
        "-n",
        namespace,
        "-o",
        "json",
    ]);
    let out = run(cmd, None).expect("kubectl runs");
    out.success
        .then(|| serde_json::from_str(&out.stdout).expect("kubectl prints JSON"))
}

/// A minimal valid instance named `name` in `namespace`, with `spec_extra` (YAML lines under
/// `spec:`, indented by two spaces) appended.
fn instance(namespace: &str, name: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{spec_extra}"
    )
}

#[tokio::test]
async fn crd_is_established_with_its_names() {
    let cluster = cluster();
    let client = cluster.client().await.expect("client");
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client);
    let crd = crds.get(CRD_NAME).await.expect("CRD exists");
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True"),
        "{conditions:?}"
    );
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "NamesAccepted" && c.status == "True"),
        "{conditions:?}"
    );
    // The short name and the category resolve through discovery, and `kubectl explain` reads the
    // descriptions from the published OpenAPI; both lag Established by a moment.
    eventually(&cluster, &["get", "pi,di-framework", "-A"]).await;
    let out = eventually(&cluster, &["explain", "pi.spec.deletionPolicy"]).await;
    assert!(
        out.contains("Retain") && out.contains("nothing is lost"),
        "kubectl explain reads the description: {out}"
    );
}

/// Runs kubectl with `args` until it succeeds (at most 60 s) and returns its output.
async fn eventually(cluster: &Shared, args: &[&str]) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut cmd = cluster.kubectl();
        cmd.args(args);
        let out = run(cmd, None).expect("kubectl runs");
        if out.success {
            return out.stdout;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl {args:?}: {}",
            out.stderr
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn seed_example_applies_server_side_and_reads_back() {
    let cluster = cluster();
    let ns = namespace(&cluster, "seed");
    let manifest = repo_file("docs/examples/one.yaml")
        .replace("namespace: team-a", &format!("namespace: {ns}"));
    let out = apply(&cluster, &manifest);
    assert!(out.success, "the seed example must apply: {}", out.stderr);
    let got = get_json(&cluster, &ns, "one").expect("stored");
    let spec = &got["spec"];
    assert_eq!(spec["version"], "6.0.22");
    assert_eq!(spec["target"]["type"], "vcluster");
    assert_eq!(spec["deletionPolicy"], "Delete");
    assert_eq!(spec["platform"]["networkPolicyEngine"], "existing");
    assert_eq!(spec["platform"]["gateway"]["httpNodePort"], 30080);
    assert_eq!(
        spec["platform"]["gateway"]["httpEndpoint"],
        "http://apps.example:30080"
    );
    // It also deserializes into the operator's own types.
    let typed: PlatformInstance = serde_json::from_value(got).expect("matches the Rust types");
    assert_eq!(typed.spec.version.as_deref(), Some("6.0.22"));
}

#[tokio::test]
async fn schema_defaults_fill_what_is_left_out() {
    let cluster = cluster();
    let ns = namespace(&cluster, "defaults");
    let out = apply(
        &cluster,
        &instance(
            &ns,
            "minimal",
            "  version: 6.0.22\n  platform:\n    gateway: {}\n",
        ),
    );
    assert!(out.success, "{}", out.stderr);
    let got = get_json(&cluster, &ns, "minimal").expect("stored");
    assert_eq!(
        got["spec"]["target"]["type"], "vcluster",
        "target defaults to vcluster"
    );
    assert_eq!(
        got["spec"]["deletionPolicy"], "Retain",
        "the default loses no data"
    );
    assert_eq!(got["spec"]["platform"]["networkPolicyEngine"], "existing");
    assert_eq!(got["spec"]["platform"]["gateway"]["httpNodePort"], 0);
}

#[tokio::test]
async fn tenants_users_and_tenant_auth_are_accepted() {
    let cluster = cluster();
    let ns = namespace(&cluster, "tenants");
    let spec = format!(
        "  version: 6.1.0-rc.1\n  target: {{ type: vcluster }}\n  platform:\n    tenants:\n      - name: acme\n      - name: beta\n    users:\n      - name: dev\n        memberships: [{{ tenant: acme, role: developer }}, {{ tenant: beta, role: viewer }}]\n    tenantAuth:\n      image: ghcr.io/di-framework/tenant-auth{DIGEST}\n      issuer: https://id.example\n      clientId: console\n      clientSecretRef: {{ name: tenant-auth-oauth, key: clientSecret }}\n      registry: {{ component: ghcr.io/di-framework/oci-registry{DIGEST} }}\n    tenantHostImage: ghcr.io/di-framework/wash:2.8.0-wasi-tls{DIGEST}\n    tenantHostImagePullPolicy: IfNotPresent\n    egressAllowedDestinations: [api.example:443]\n    gateway:\n      httpEndpoint: https://apps.example\n      routeUrlPattern: \"https://{{route}}.{{tenant}}.apps.example/\"\n"
    );
    let out = apply(&cluster, &instance(&ns, "full", &spec));
    assert!(out.success, "{}", out.stderr);
    let got = get_json(&cluster, &ns, "full").expect("stored");
    assert_eq!(
        got["spec"]["platform"]["users"][0]["memberships"][1]["role"],
        "viewer"
    );
    assert_eq!(
        got["spec"]["platform"]["tenantAuth"]["clientSecretRef"]["key"],
        "clientSecret"
    );
    assert_eq!(
        got["spec"]["platform"]["gateway"]["routeUrlPattern"],
        "https://{route}.{tenant}.apps.example/"
    );
}

/// Each case: a name, the spec lines, and what the error must mention (the field path, then a
/// word from the reason).
const REJECTED: &[(&str, &str, &str, &str)] = &[
    (
        "range",
        "  version: ^6.0.0\n",
        "spec.version",
        "exact version",
    ),
    (
        "latest",
        "  version: latest\n",
        "spec.version",
        "exact version",
    ),
    (
        "port-80",
        "  version: 6.0.22\n  platform:\n    gateway:\n      httpNodePort: 80\n",
        "spec.platform.gateway.httpNodePort",
        "30000-32767",
    ),
    (
        "port-40000",
        "  version: 6.0.22\n  platform:\n    gateway:\n      httpNodePort: 40000\n",
        "spec.platform.gateway.httpNodePort",
        "32767",
    ),
    (
        "unknown-field",
        "  version: 6.0.22\n  colour: blue\n",
        "spec.colour",
        "field not declared in schema",
    ),
    (
        "undeclared-tenant",
        "  version: 6.0.22\n  platform:\n    tenants: [{ name: acme }]\n    users:\n      - name: dev\n        memberships: [{ tenant: other, role: developer }]\n",
        "spec.platform.users",
        "declared in spec.platform.tenants",
    ),
    (
        "duplicate-tenant",
        "  version: 6.0.22\n  platform:\n    tenants: [{ name: acme }, { name: acme }]\n",
        "spec.platform.tenants",
        "duplicate entries for key [name=\"acme\"]",
    ),
    (
        "image-by-tag",
        "  version: 6.0.22\n  platform:\n    tenantAuth:\n      image: ghcr.io/di-framework/tenant-auth:6.0.22\n      issuer: https://id.example\n      clientId: console\n      clientSecretRef: { name: s, key: k }\n",
        "spec.platform.tenantAuth.image",
        "digest",
    ),
    (
        "http-issuer",
        "  version: 6.0.22\n  platform:\n    tenantAuth:\n      image: ghcr.io/di-framework/tenant-auth@sha256:ee89fd4bce4f9f35f4cd09c63d3cbdd07bea3071b5d372f82c9f49b9741c3669\n      issuer: http://id.example\n      clientId: console\n      clientSecretRef: { name: s, key: k }\n",
        "spec.platform.tenantAuth.issuer",
        "https://",
    ),
    (
        "keep",
        "  version: 6.0.22\n  deletionPolicy: Keep\n",
        "spec.deletionPolicy",
        "Unsupported value",
    ),
    (
        "target-kind",
        "  version: 6.0.22\n  target: { type: kind }\n",
        "spec.target.type",
        "Unsupported value",
    ),
    (
        "endpoint-no-scheme",
        "  version: 6.0.22\n  platform:\n    gateway:\n      httpEndpoint: apps.example\n",
        "spec.platform.gateway.httpEndpoint",
        "absolute",
    ),
    (
        "route-pattern-without-tenant",
        "  version: 6.0.22\n  platform:\n    gateway:\n      routeUrlPattern: https://{route}.apps.example/\n",
        "spec.platform.gateway.routeUrlPattern",
        "holding {route} and {tenant}",
    ),
    (
        "route-pattern-no-scheme",
        "  version: 6.0.22\n  platform:\n    gateway:\n      routeUrlPattern: \"{route}.{tenant}.apps.example\"\n",
        "spec.platform.gateway.routeUrlPattern",
        "absolute http:// or https://",
    ),
    (
        "secret-ref-without-key",
        "  version: 6.0.22\n  platform:\n    tenantAuth:\n      image: ghcr.io/di-framework/tenant-auth@sha256:ee89fd4bce4f9f35f4cd09c63d3cbdd07bea3071b5d372f82c9f49b9741c3669\n      issuer: https://id.example\n      clientId: console\n      clientSecretRef: { name: s }\n",
        "spec.platform.tenantAuth.clientSecretRef.key",
        "Required value",
    ),
];

#[tokio::test]
async fn invalid_instances_are_rejected_naming_the_field() {
    let cluster = cluster();
    let ns = namespace(&cluster, "rejects");
    let mut failures = Vec::new();
    for (name, spec, field, reason) in REJECTED {
        let out = apply(&cluster, &instance(&ns, name, spec));
        if out.success {
            failures.push(format!("{name}: was accepted"));
        } else if !out.stderr.contains(field) || !out.stderr.contains(reason) {
            failures.push(format!(
                "{name}: expected {field:?} and {reason:?} in: {}",
                out.stderr.trim()
            ));
        } else if get_json(&cluster, &ns, name).is_some() {
            failures.push(format!("{name}: rejected but stored"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn names_too_long_for_their_kubeconfig_secrets_are_rejected() {
    let cluster = cluster();
    let ns = namespace(&cluster, "long-names");
    // `<name>-kubeconfig` is at most 253 characters.
    let out = apply(
        &cluster,
        &instance(&ns, &"n".repeat(243), "  version: 6.0.22\n"),
    );
    assert!(!out.success, "a 243-character name was accepted");
    assert!(
        out.stderr.contains("metadata.name") && out.stderr.contains("242"),
        "{}",
        out.stderr
    );
    // `<name>.<tenant>.<user>.kubeconfig` is at most 253 characters.
    let label = "l".repeat(40);
    let spec = format!(
        "  version: 6.0.22\n  platform:\n    tenants: [{{ name: {label} }}]\n    users:\n      - name: {label}\n        memberships: [{{ tenant: {label}, role: developer }}]\n"
    );
    let out = apply(&cluster, &instance(&ns, &"m".repeat(161), &spec));
    assert!(
        !out.success,
        "a membership Secret name over 253 was accepted"
    );
    assert!(
        out.stderr.contains("membership kubeconfig Secret"),
        "{}",
        out.stderr
    );
    let out = apply(&cluster, &instance(&ns, &"m".repeat(160), &spec));
    assert!(out.success, "the longest names that fit: {}", out.stderr);
}

#[tokio::test]
async fn target_type_cannot_change_and_the_stored_object_survives() {
    let cluster = cluster();
    let ns = namespace(&cluster, "immutable");
    let out = apply(
        &cluster,
        &instance(
            &ns,
            "fixed",
            "  version: 6.0.22\n  target: { type: vcluster }\n",
        ),
    );
    assert!(out.success, "{}", out.stderr);
    let out = apply(
        &cluster,
        &instance(
            &ns,
            "fixed",
            "  version: 6.0.22\n  target: { type: kind }\n",
        ),
    );
    assert!(!out.success, "changing target.type must be rejected");
    assert!(out.stderr.contains("spec.target.type"), "{}", out.stderr);
    let got = get_json(&cluster, &ns, "fixed").expect("still stored");
    assert_eq!(got["spec"]["target"]["type"], "vcluster");
    // Other fields stay editable.
    let out = apply(
        &cluster,
        &instance(
            &ns,
            "fixed",
            "  version: 6.0.23\n  target: { type: vcluster }\n",
        ),
    );
    assert!(out.success, "{}", out.stderr);
    assert_eq!(
        get_json(&cluster, &ns, "fixed").expect("stored")["spec"]["version"],
        "6.0.23"
    );
}

#[tokio::test]
async fn kubectl_get_shows_the_printer_columns() {
    let cluster = cluster();
    let ns = namespace(&cluster, "columns");
    let out = apply(&cluster, &instance(&ns, "shown", "  version: 6.0.22\n"));
    assert!(out.success, "{}", out.stderr);
    // Write a status through the status subresource, as the controller will.
    let client = cluster.client().await.expect("client");
    let api: Api<PlatformInstance> = Api::namespaced(client, &ns);
    let status = PlatformInstanceStatus {
        phase: Some(common::crd::Phase::Ready),
        installed_version: Some("6.0.21".into()),
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Installed".into(),
            message: "installed".into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ),
            observed_generation: Some(1),
        }],
        ..Default::default()
    };
    let patch = serde_json::json!({
        "apiVersion": "platform.di-framework.dev/v1alpha1",
        "kind": "PlatformInstance",
        "status": status,
    });
    api.patch_status(
        "shown",
        &PatchParams::apply("e2e-status").force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("status subresource accepts the status");

    let mut get = cluster.kubectl();
    get.args(["get", "pi", "-A"]);
    let table = run(get, None)
        .expect("kubectl runs")
        .ok("kubectl get pi -A")
        .expect("lists");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "PHASE",
            "VERSION",
            "INSTALLED",
            "READY",
            "SUSPENDED",
            "UPGRADE",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with(&ns))
        .unwrap_or_else(|| panic!("no row for {ns}: {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..6],
        [ns.as_str(), "shown", "Ready", "6.0.22", "6.0.21", "True"],
        "{table}"
    );
}

#[tokio::test]
async fn the_status_subresource_rejects_an_unknown_phase() {
    let cluster = cluster();
    let ns = namespace(&cluster, "status");
    let out = apply(&cluster, &instance(&ns, "s", "  version: 6.0.22\n"));
    assert!(out.success, "{}", out.stderr);
    let client = cluster.client().await.expect("client");
    let api: Api<PlatformInstance> = Api::namespaced(client, &ns);
    let patch = serde_json::json!({
        "apiVersion": "platform.di-framework.dev/v1alpha1",
        "kind": "PlatformInstance",
        "status": {"phase": "Sleeping"},
    });
    let err = api
        .patch_status(
            "s",
            &PatchParams::apply("e2e-status").force(),
            &Patch::Apply(&patch),
        )
        .await
        .expect_err("an unknown phase is rejected");
    assert!(err.to_string().contains("status.phase"), "{err}");
}
