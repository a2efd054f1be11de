//! Router tests without an API server: AdmissionReview fixtures sent with
//! `tower::ServiceExt::oneshot` to the admission router for every rule that needs none, plus
//! garbage, oversized and wrong-version bodies and the large-body budget. (The rule that asks the
//! API server is in `router_api.rs`.)

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use serde_json::{Value, json};
use support::*;
use tower::ServiceExt;
use webhook::admission::BODY_LIMIT;
use webhook::index::Holder;

#[tokio::test]
async fn unreadable_bodies_get_a_clear_denial() {
    let h = offline();
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
    let h = offline();
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
    let h = offline();
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

    // A spec that is no object reads as an empty one, but a patch adding /spec/version would
    // not apply to it: no patch, and the API server's schema validation refuses the object.
    for spec in [json!([]), json!(["6.0.22"]), json!("x")] {
        let mut odd = instance("a", "x", json!({}));
        odd["spec"] = spec.clone();
        let response = answer(&h, "/mutate", &review("u-m4", "CREATE", odd, None, admin())).await;
        assert!(
            response.get("patch").is_none_or(Value::is_null),
            "spec {spec}: no patch that cannot apply: {response}"
        );
    }
}

#[tokio::test]
async fn versions_downgrades_and_deletion() {
    let h = offline();
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
    let h = offline();
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
async fn large_bodies_share_a_budget_and_small_ones_never_wait_on_it() {
    // 8 MiB: one body of unknown length reserves the whole 7 MiB body limit.
    let h = harness_with(offline_client(), 8);
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, std::io::Error>>();
    let streaming = Request::post("/validate")
        .body(Body::from_stream(rx))
        .expect("request");
    let first = tokio::spawn(h.app.clone().oneshot(streaming));
    tx.unbounded_send(Ok(Bytes::from_static(b"{\"apiVersion\":")))
        .expect("send");
    // Let the first request reserve its share and wait for the rest of its body (the test runs
    // on one thread: the spawned request runs while this one sleeps).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!first.is_finished(), "the first body is still being read");
    // A second large body is refused at once, with Retry-After.
    let second = Request::post("/validate")
        .body(Body::from(vec![b' '; 2 * 1024 * 1024]))
        .expect("request");
    let refused = h.app.clone().oneshot(second).await.expect("answer");
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        refused.headers()["connection"],
        "close",
        "its body is never read"
    );
    // An ordinary review is answered as usual.
    let small = review(
        "u-small",
        "CREATE",
        instance("a", "x", json!({"version": "6.0.22"})),
        None,
        admin(),
    );
    assert_eq!(answer(&h, "/validate", &small).await["allowed"], true);
    // Once the first body ends, its share comes back.
    tx.unbounded_send(Ok(Bytes::from_static(b"1}")))
        .expect("send");
    drop(tx);
    let first = first.await.expect("join").expect("answer");
    assert_eq!(
        first.status(),
        StatusCode::OK,
        "a finished body is answered"
    );
    let (status, body) = send(&h, "/validate", vec![b' '; 2 * 1024 * 1024]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["response"]["allowed"], false,
        "blank is not a review: {body}"
    );
}

/// A request body that declares `declared` bytes up front (as a `Content-Length` does) and then
/// sends whatever arrives on its channel, however much that is.
struct Declared {
    declared: u64,
    chunks: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
}

impl http_body::Body for Declared {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.declared)
    }
}

/// A POST to `/validate` declaring `declared` bytes, and where to send them.
fn declared(declared: u64) -> (Request<Body>, tokio::sync::mpsc::UnboundedSender<Bytes>) {
    let (tx, chunks) = tokio::sync::mpsc::unbounded_channel();
    let request = Request::post("/validate")
        .body(Body::new(Declared { declared, chunks }))
        .expect("request");
    (request, tx)
}

#[tokio::test]
async fn an_ordinary_review_is_answered_while_large_and_slow_bodies_hold_everything_they_can() {
    let limits = common::server::Limits {
        max_requests_in_flight: 1,
        large_body_budget_mib: 8,
        ..common::server::Limits::default()
    };
    let h = harness_limited(offline_client(), &limits);
    // The whole large-body budget: a body of unknown length (7 MiB) and one declaring 1 MiB,
    // both still arriving.
    let (unknown_tx, unknown_rx) =
        futures::channel::mpsc::unbounded::<Result<Bytes, std::io::Error>>();
    let unknown = Request::post("/validate")
        .body(Body::from_stream(unknown_rx))
        .expect("request");
    let (mib, mib_tx) = declared(1024 * 1024);
    mib_tx.send(Bytes::from_static(b"{")).expect("send");
    // Two ordinary-sized reviews whose bodies arrive slowly: more than the one slot.
    let (slow_a, slow_a_tx) = declared(100 * 1024);
    let (slow_b, slow_b_tx) = declared(100 * 1024);
    slow_a_tx.send(Bytes::from_static(b"{")).expect("send");
    let held: Vec<_> = [unknown, mib, slow_a, slow_b]
        .into_iter()
        .map(|request| tokio::spawn(h.app.clone().oneshot(request)))
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        held.iter().all(|task| !task.is_finished()),
        "all still held"
    );
    // Another large body is refused at once, unread.
    let (status, _) = send(&h, "/validate", vec![b' '; 300 * 1024]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    // An ordinary review is answered: large bodies and slow small ones hold no slot.
    let small = review(
        "u-ordinary",
        "CREATE",
        instance("a", "x", json!({"version": "6.0.22"})),
        None,
        admin(),
    );
    let response = answer(&h, "/validate", &small).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["uid"], "u-ordinary");
    // A body that sends more than it declared is cut off at what it declared: HTTP 413.
    let (liar, liar_tx) = declared(10);
    liar_tx
        .send(Bytes::from(serde_json::to_vec(&small).expect("json")))
        .expect("send");
    drop(liar_tx);
    let refused = h.app.clone().oneshot(liar).await.expect("answer");
    assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    drop((unknown_tx, mib_tx, slow_a_tx, slow_b_tx));
    for task in held {
        let _ = task.await.expect("join");
    }
}
