//! What the router tests share: the admission router with or without an API server, review
//! fixtures, and the checks every answer must pass.

#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;
use webhook::admission::{Admission, router};
use webhook::index::NodePortIndex;
use webhook::metrics::Metrics;
use webhook::rules::Settings;

pub struct Harness {
    pub app: axum::Router,
    pub metrics: Metrics,
    pub index: Arc<NodePortIndex>,
}

pub fn settings() -> Settings {
    Settings {
        default_version: "6.0.22".into(),
        min_version: (6, 0),
        max_version: (6, 0),
        node_port_range: (30000, 32767),
    }
}

/// The router with `client`, served as the webhook serves it (with the layers of
/// `common::server`, at their defaults but a large-body budget of `budget_mib`).
pub fn harness_with(client: kube::Client, budget_mib: u32) -> Harness {
    let limits = common::server::Limits {
        large_body_budget_mib: budget_mib,
        ..common::server::Limits::default()
    };
    harness_limited(client, &limits)
}

/// The router with `client`, served with the layers of `common::server` and `limits`.
pub fn harness_limited(client: kube::Client, limits: &common::server::Limits) -> Harness {
    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).expect("metrics");
    let index = Arc::new(NodePortIndex::default());
    let state = Arc::new(Admission {
        settings: settings(),
        index: index.clone(),
        client,
        metrics: metrics.clone(),
    });
    Harness {
        app: common::server::layers(router(state), limits),
        metrics,
        index,
    }
}

/// The router without an API server: its client points at a port nothing listens on, so a rule
/// that needs the API server (the SubjectAccessReview of a clientSecretRef) fails as it would
/// with the API server down, and is denied. For the rules that need none.
pub fn offline() -> Harness {
    harness_with(offline_client(), 24)
}

/// A current-thread runtime for a property test, whose cases each block on it.
pub fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// [`offline`], with NodePort 30080 held by the Service `default/web`, so that the node-port
/// checks (and the host namespace names they compute) run.
pub fn offline_with_a_held_port() -> Harness {
    let h = offline();
    h.index.set(
        webhook::index::Holder::Service {
            namespace: "default".into(),
            name: "web".into(),
        },
        vec![30080],
    );
    h
}

/// A client for an API server that is not there (nothing listens on 127.0.0.1:9).
pub fn offline_client() -> kube::Client {
    let config = kube::Config::new("https://127.0.0.1:9".parse().expect("uri"));
    kube::Client::try_from(config).expect("client")
}

pub fn instance(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "platform.di-framework.dev/v1alpha1",
        "kind": "PlatformInstance",
        "metadata": {"name": name, "namespace": namespace, "uid": "0b9a7bd6-4c4e-4b8e-9d61-0c1f6f0d2b11"},
        "spec": spec,
    })
}

pub fn review(uid: &str, operation: &str, object: Value, old: Option<Value>, user: Value) -> Value {
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

pub fn admin() -> Value {
    json!({"username": "admin", "groups": ["system:masters", "system:authenticated"]})
}

/// Sends `body` to `path`; the status, the `Content-Type` and the answer's bytes as sent.
pub async fn send_raw(
    h: &Harness,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Option<String>, axum::body::Bytes) {
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
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (status, content_type, bytes)
}

pub async fn send(h: &Harness, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let (status, _, bytes) = send_raw(h, path, body).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&bytes)}));
    (status, value)
}

/// Sends a review and checks the envelope every answer must have; returns the response part.
pub async fn answer(h: &Harness, path: &str, review: &Value) -> Value {
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

pub fn message(response: &Value) -> String {
    response["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn denied(response: &Value, words: &[&str]) {
    assert_eq!(response["allowed"], false, "{response}");
    let m = message(response);
    for w in words {
        assert!(m.contains(w), "{w:?} not in {m:?}");
    }
    assert!(!m.contains('\n'), "one line: {m:?}");
}

pub fn warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Prints a benchmark's gate line, `gate <name>: <figure> <op> <limit>: ok|over`, where `op` is
/// `<=`, `<` or `>=` and `over` means the figure is on the wrong side of the limit.
pub fn gate(name: &str, figure: f64, op: &str, limit: f64) {
    let ok = match op {
        "<=" => figure <= limit,
        "<" => figure < limit,
        ">=" => figure >= limit,
        _ => panic!("unknown gate operator {op:?}"),
    };
    let verdict = if ok { "ok" } else { "over" };
    println!("gate {name}: {figure:.2} {op} {limit}: {verdict}");
}
