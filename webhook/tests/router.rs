//! Router tests: AdmissionReview fixtures sent with `tower::ServiceExt::oneshot` to the admission
//! router, for every rule, plus garbage, oversized and wrong-version bodies. The router's client
//! talks to the real local API server (SubjectAccessReviews and Secret lookups are real).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;
use webhook::admission::{Admission, BODY_LIMIT, router};
use webhook::index::{Holder, NodePortIndex};
use webhook::metrics::Metrics;
use webhook::rules::Settings;

struct Harness {
    app: axum::Router,
    metrics: Metrics,
    index: Arc<NodePortIndex>,
    cluster: e2e::shared::Shared,
}

async fn harness() -> Harness {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let client = cluster.client().await.expect("client");
    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).expect("metrics");
    let index = Arc::new(NodePortIndex::default());
    let state = Arc::new(Admission {
        settings: Settings {
            default_version: "6.0.22".into(),
            min_version: (6, 0),
            max_version: (6, 0),
            node_port_range: (30000, 32767),
        },
        index: index.clone(),
        client,
        metrics: metrics.clone(),
    });
    Harness {
        app: router(state),
        metrics,
        index,
        cluster,
    }
}

fn instance(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "platform.di-framework.dev/v1alpha1",
        "kind": "PlatformInstance",
        "metadata": {"name": name, "namespace": namespace, "uid": "0b9a7bd6-4c4e-4b8e-9d61-0c1f6f0d2b11"},
        "spec": spec,
    })
}

fn review(uid: &str, operation: &str, object: Value, old: Option<Value>, user: Value) -> Value {
    let name = object
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::Null);
    let namespace = object
        .pointer("/metadata/namespace")
        .cloned()
        .unwrap_or(Value::Null);
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "platform.di-framework.dev", "version": "v1alpha1", "kind": "PlatformInstance"},
            "resource": {"group": "platform.di-framework.dev", "version": "v1alpha1", "resource": "platforminstances"},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": user,
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    })
}

fn admin() -> Value {
    json!({"username": "admin", "groups": ["system:masters", "system:authenticated"]})
}

async fn send(h: &Harness, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("request");
    let response = h
        .app
        .clone()
        .oneshot(request)
        .await
        .expect("router answers");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&bytes)}));
    (status, value)
}

/// Sends a review and checks the envelope every answer must have; returns the response part.
async fn answer(h: &Harness, path: &str, review: &Value) -> Value {
    let (status, body) = send(h, path, serde_json::to_vec(review).expect("json")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1", "{body}");
    assert_eq!(body["kind"], "AdmissionReview", "{body}");
    assert_eq!(
        body["response"]["uid"], review["request"]["uid"],
        "the uid is echoed: {body}"
    );
    body["response"].clone()
}

fn message(response: &Value) -> String {
    response["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn denied(response: &Value, words: &[&str]) {
    assert_eq!(response["allowed"], false, "{response}");
    let m = message(response);
    for w in words {
        assert!(m.contains(w), "{w:?} not in {m:?}");
    }
    assert!(!m.contains('\n'), "one line: {m:?}");
}

fn warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn unreadable_bodies_get_a_clear_denial() {
    let h = harness().await;
    let (status, body) = send(&h, "/validate", b"{not json".to_vec()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response"]["allowed"], false);
    assert!(message(&body["response"]).contains("not JSON"), "{body}");

    let mut old_version = review(
        "u-v1beta1",
        "CREATE",
        instance("a", "x", json!({"version": "6.0.22"})),
        None,
        admin(),
    );
    old_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let response = answer(&h, "/validate", &old_version).await;
    denied(&response, &["admission.k8s.io/v1 AdmissionReview"]);

    let wrong_type = review(
        "u-type",
        "CREATE",
        instance("a", "x", json!({"version": 6})),
        None,
        admin(),
    );
    let response = answer(&h, "/mutate", &wrong_type).await;
    denied(&response, &["valid PlatformInstance"]);

    let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let (status, body) = send(
        &h,
        "/validate",
        serde_json::to_vec(&no_request).expect("json"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response"]["allowed"], false, "{body}");

    let errors = h
        .metrics
        .reviews
        .with_label_values(&["validate", "unknown", "error", "parse"])
        .get();
    assert!(errors >= 2, "parse errors are counted: {errors}");
}

#[tokio::test]
async fn body_limit_admits_the_largest_update_and_refuses_more() {
    let h = harness().await;
    // The API server accepts request bodies up to 3 MiB: an UPDATE carries two such objects.
    let big = "x".repeat(3 * 1024 * 1024 - 4096);
    let mut object = instance("a", "big", json!({"version": "6.0.22"}));
    object["metadata"]["annotations"] = json!({"example.com/big": big});
    let update = review("u-big", "UPDATE", object.clone(), Some(object), admin());
    let size = serde_json::to_vec(&update).expect("json").len();
    assert!(size < BODY_LIMIT, "{size} must fit the limit {BODY_LIMIT}");
    let response = answer(&h, "/validate", &update).await;
    assert_eq!(response["allowed"], true, "{response}");

    let (status, _) = send(&h, "/validate", vec![b' '; BODY_LIMIT + 1]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn mutate_defaults_the_version_only_when_missing() {
    let h = harness().await;
    let response = answer(
        &h,
        "/mutate",
        &review(
            "u-m1",
            "CREATE",
            instance("a", "x", json!({})),
            None,
            admin(),
        ),
    )
    .await;
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    // kube serializes the patch bytes as a JSON array of numbers, which the API server's decoder
    // accepts for a []byte field as well as base64.
    let patch: Vec<u8> = serde_json::from_value(response["patch"].clone()).expect("patch bytes");
    let patch: Value = serde_json::from_slice(&patch).expect("json patch");
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec/version", "value": "6.0.22"}])
    );

    let given = answer(
        &h,
        "/mutate",
        &review(
            "u-m2",
            "UPDATE",
            instance("a", "x", json!({"version": "6.0.3"})),
            None,
            admin(),
        ),
    )
    .await;
    assert_eq!(given["allowed"], true);
    assert!(
        given.get("patch").is_none_or(Value::is_null),
        "nothing to default: {given}"
    );

    let mut deleting = instance("a", "x", json!({}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-30T00:00:00Z");
    let response = answer(
        &h,
        "/mutate",
        &review("u-m3", "UPDATE", deleting.clone(), Some(deleting), admin()),
    )
    .await;
    assert!(
        response.get("patch").is_none_or(Value::is_null),
        "a deleting instance is left alone: {response}"
    );
}

#[tokio::test]
async fn versions_downgrades_and_deletion() {
    let h = harness().await;
    let v = |version: &str| instance("a", "x", json!({"version": version}));
    denied(
        &answer(
            &h,
            "/validate",
            &review("u-1", "CREATE", v("6.1.0"), None, admin()),
        )
        .await,
        &["spec.version 6.1.0", "6.0.x"],
    );
    let ok = answer(
        &h,
        "/validate",
        &review("u-2", "CREATE", v("6.0.22"), None, admin()),
    )
    .await;
    assert_eq!(ok["allowed"], true, "{ok}");

    let mut installed = v("6.0.22");
    installed["status"] = json!({"installedVersion": "6.0.22"});
    denied(
        &answer(
            &h,
            "/validate",
            &review(
                "u-3",
                "UPDATE",
                v("6.0.20"),
                Some(installed.clone()),
                admin(),
            ),
        )
        .await,
        &[
            "spec.version 6.0.20",
            "installed version 6.0.22",
            "allow-downgrade",
        ],
    );
    let mut opted = v("6.0.20");
    opted["metadata"]["annotations"] = json!({"platform.di-framework.dev/allow-downgrade": "true"});
    let response = answer(
        &h,
        "/validate",
        &review("u-4", "UPDATE", opted, Some(installed), admin()),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(
        warnings(&response)
            .iter()
            .any(|w| w.contains("downgrading from 6.0.22 to 6.0.20")),
        "{response}"
    );

    let mut deleting = v("6.0.22");
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-30T00:00:00Z");
    deleting["metadata"]["finalizers"] = json!(["platform.di-framework.dev/instance"]);
    let mut released = deleting.clone();
    released["metadata"]["finalizers"] = json!([]);
    released["spec"]["platform"] = json!({"gateway": {"httpNodePort": 99}});
    let response = answer(
        &h,
        "/validate",
        &review("u-5", "UPDATE", released, Some(deleting.clone()), admin()),
    )
    .await;
    assert_eq!(
        response["allowed"], true,
        "removing the finalizer is always admitted: {response}"
    );
    let mut changed = deleting.clone();
    changed["spec"]["version"] = json!("6.0.23");
    denied(
        &answer(
            &h,
            "/validate",
            &review("u-6", "UPDATE", changed, Some(deleting), admin()),
        )
        .await,
        &["being deleted"],
    );
    assert!(
        h.metrics
            .reviews
            .with_label_values(&["validate", "UPDATE", "denied", "downgrade"])
            .get()
            >= 1
    );
}

#[tokio::test]
async fn node_ports() {
    let h = harness().await;
    let with_port = |name: &str, port: i64| {
        instance(
            "a",
            name,
            json!({"version": "6.0.22", "platform": {"gateway": {"httpNodePort": port}}}),
        )
    };
    h.index.set(
        Holder::Instance {
            namespace: "b".into(),
            name: "other".into(),
        },
        vec![30111],
    );
    h.index.set(
        Holder::Service {
            namespace: "default".into(),
            name: "web".into(),
        },
        vec![30112],
    );
    denied(
        &answer(
            &h,
            "/validate",
            &review("u-p1", "CREATE", with_port("x", 30111), None, admin()),
        )
        .await,
        &[
            "spec.platform.gateway.httpNodePort 30111",
            "PlatformInstance b/other",
        ],
    );
    denied(
        &answer(
            &h,
            "/validate",
            &review("u-p2", "CREATE", with_port("x", 30112), None, admin()),
        )
        .await,
        &["Service default/web"],
    );
    let free = answer(
        &h,
        "/validate",
        &review("u-p3", "CREATE", with_port("x", 30113), None, admin()),
    )
    .await;
    assert_eq!(free["allowed"], true, "{free}");
    h.index.set(
        Holder::Instance {
            namespace: "a".into(),
            name: "x".into(),
        },
        vec![30113],
    );
    let own = answer(
        &h,
        "/validate",
        &review(
            "u-p4",
            "UPDATE",
            with_port("x", 30113),
            Some(with_port("x", 30113)),
            admin(),
        ),
    )
    .await;
    assert_eq!(
        own["allowed"], true,
        "an instance does not collide with itself: {own}"
    );
}

#[tokio::test]
async fn secret_references_need_read_access_and_missing_secrets_warn() {
    let h = harness().await;
    let ns = format!("router-secrets-{}", std::process::id());
    let mut create = h.cluster.kubectl();
    create.args(["create", "namespace", &ns]);
    e2e::cmd::run(create, None)
        .expect("kubectl")
        .ok("create namespace")
        .expect("namespace");
    let with_ref = |secret: &str| {
        instance(
            &ns,
            "auth",
            json!({"version": "6.0.22", "platform": {"tenantAuth": {
                "image": format!("ghcr.io/di-framework/tenant-auth@sha256:{}", "a".repeat(64)),
                "issuer": "https://id.example",
                "clientId": "console",
                "clientSecretRef": {"name": secret, "key": "clientSecret"}
            }}}),
        )
    };
    let nobody = json!({"username": "nobody", "groups": ["system:authenticated"]});
    denied(
        &answer(
            &h,
            "/validate",
            &review("u-s1", "CREATE", with_ref("oauth"), None, nobody.clone()),
        )
        .await,
        &[
            "spec.platform.tenantAuth.clientSecretRef",
            "nobody may not get Secret",
            "oauth",
        ],
    );
    // An unchanged reference on UPDATE is not re-checked: editing the version needs no Secret access.
    let kept = answer(
        &h,
        "/validate",
        &review(
            "u-s2",
            "UPDATE",
            with_ref("oauth"),
            Some(with_ref("oauth")),
            nobody,
        ),
    )
    .await;
    assert_eq!(kept["allowed"], true, "{kept}");

    let missing = answer(
        &h,
        "/validate",
        &review("u-s3", "CREATE", with_ref("oauth"), None, admin()),
    )
    .await;
    assert_eq!(
        missing["allowed"], true,
        "a missing Secret is a warning: {missing}"
    );
    assert!(
        warnings(&missing)
            .iter()
            .any(|w| w.contains("does not exist yet")),
        "{missing}"
    );

    let mut secret = h.cluster.kubectl();
    secret.args([
        "-n",
        &ns,
        "create",
        "secret",
        "generic",
        "oauth",
        "--from-literal=clientSecret=s3cret",
    ]);
    e2e::cmd::run(secret, None)
        .expect("kubectl")
        .ok("create secret")
        .expect("secret");
    let present = answer(
        &h,
        "/validate",
        &review("u-s4", "CREATE", with_ref("oauth"), None, admin()),
    )
    .await;
    assert_eq!(present["allowed"], true, "{present}");
    assert!(warnings(&present).is_empty(), "{present}");
    assert!(
        !present.to_string().contains("s3cret"),
        "secret values never leave the webhook"
    );
}
