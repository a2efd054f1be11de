//! The admission HTTP API: `POST /mutate` (defaults as a JSON Patch) and `POST /validate`.
//!
//! Every request that arrives within the body limit gets HTTP 200 with an `admission.k8s.io/v1`
//! `AdmissionReview` carrying the request's `uid`; a body that cannot be read as one gets a clear
//! denial. The body limit admits an UPDATE review of the largest object the API server accepts:
//! the API server takes request bodies up to 3 MiB, and an UPDATE review carries the object and
//! the old object, so 2 × 3 MiB plus 1 MiB for the review's own fields and JSON escaping.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::post;
use common::crd::PlatformInstance;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize;
use serde_json::Value;

use crate::index::NodePortIndex;
use crate::metrics::Metrics;
use crate::rules::{self, Settings};

/// The largest request body accepted, in bytes.
pub const BODY_LIMIT: usize = 7 * 1024 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct Admission {
    /// Configuration the rules depend on.
    pub settings: Settings,
    /// The NodePort cache.
    pub index: Arc<NodePortIndex>,
    /// A client for SubjectAccessReviews and Secret lookups.
    pub client: kube::Client,
    /// Metrics.
    pub metrics: Metrics,
}

/// The admission router.
pub fn router(state: Arc<Admission>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

type Reply = Json<AdmissionReview<DynamicObject>>;

/// A denial for a body that is not a PlatformInstance review, keeping its uid when it has one.
fn invalid(uid: &str, message: String) -> Box<AdmissionResponse> {
    let mut response = AdmissionResponse::invalid(message);
    response.uid = uid.to_string();
    Box::new(response)
}

/// Reads a review of a PlatformInstance in one pass, straight into the typed review; only a body
/// that fails that is read again, as plain JSON, to say why (keeping its uid).
fn parse(body: &[u8]) -> Result<AdmissionRequest<PlatformInstance>, Box<AdmissionResponse>> {
    if let Ok(review) = serde_json::from_slice::<AdmissionReview<PlatformInstance>>(body)
        && review.types.api_version == "admission.k8s.io/v1"
        && review.types.kind == "AdmissionReview"
        && let Ok(request) = TryInto::<AdmissionRequest<PlatformInstance>>::try_into(review)
    {
        return Ok(request);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(value) => Err(parse_value(&value)
            .err()
            .unwrap_or_else(|| invalid("", "the AdmissionReview could not be read".into()))),
        Err(e) => Err(invalid(
            "",
            format!(
                "the request body is not JSON ({e}); send an admission.k8s.io/v1 AdmissionReview"
            ),
        )),
    }
}

/// Reads a review from JSON already parsed (the mutating path keeps the raw object for its patch).
fn parse_value(
    value: &Value,
) -> Result<AdmissionRequest<PlatformInstance>, Box<AdmissionResponse>> {
    let uid = value
        .pointer("/request/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(invalid(
            uid,
            format!(
                "expected an admission.k8s.io/v1 AdmissionReview, got {api_version:?} {kind:?}; register this webhook with admissionReviewVersions [v1]"
            ),
        ));
    }
    let review = AdmissionReview::<PlatformInstance>::deserialize(value)
        .map_err(|e| invalid(uid, format!("the review does not carry a valid PlatformInstance ({e}); this webhook only reviews platforminstances")))?;
    TryInto::<AdmissionRequest<PlatformInstance>>::try_into(review)
        .map_err(|_| invalid(uid, "the AdmissionReview has no request".to_string()))
}

fn operation_label(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

fn count(metrics: &Metrics, webhook: &str, op: &str, result: &str, rule: &str) {
    metrics
        .reviews
        .with_label_values(&[webhook, op, result, rule])
        .inc();
}

async fn mutate(State(state): State<Arc<Admission>>, body: Bytes) -> Reply {
    let _timer = state.metrics.timer("mutate").start_timer();
    let parsed = serde_json::from_slice::<Value>(&body)
        .map_err(|e| invalid("", format!("the request body is not JSON ({e}); send an admission.k8s.io/v1 AdmissionReview")))
        .and_then(|value| parse_value(&value).map(|request| (request, value)));
    let (request, value) = match parsed {
        Ok(parsed) => parsed,
        Err(response) => {
            count(&state.metrics, "mutate", "unknown", "error", "parse");
            return Json(response.into_review());
        }
    };
    let op = operation_label(&request.operation);
    let response = AdmissionResponse::from(&request);
    let raw = value.pointer("/request/object").unwrap_or(&Value::Null);
    let deleting = raw
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    if !matches!(request.operation, Operation::Create | Operation::Update) || deleting {
        count(&state.metrics, "mutate", op, "allowed", "none");
        return Json(response.into_review());
    }
    let ops = rules::defaults(&state.settings, raw);
    if ops.is_empty() {
        count(&state.metrics, "mutate", op, "allowed", "none");
        return Json(response.into_review());
    }
    match response.with_patch(json_patch::Patch(ops)) {
        Ok(patched) => {
            count(&state.metrics, "mutate", op, "allowed", "default-version");
            Json(patched.into_review())
        }
        Err(e) => {
            count(&state.metrics, "mutate", op, "error", "patch");
            Json(
                AdmissionResponse::from(&request)
                    .deny(format!("building the defaults patch failed: {e}"))
                    .into_review(),
            )
        }
    }
}

async fn validate(State(state): State<Arc<Admission>>, body: Bytes) -> Reply {
    let _timer = state.metrics.timer("validate").start_timer();
    let request = match parse(&body) {
        Ok(parsed) => parsed,
        Err(response) => {
            count(&state.metrics, "validate", "unknown", "error", "parse");
            return Json(response.into_review());
        }
    };
    let op = operation_label(&request.operation);
    let mut response = AdmissionResponse::from(&request);
    let Some(new) = request
        .object
        .as_ref()
        .filter(|_| matches!(request.operation, Operation::Create | Operation::Update))
    else {
        count(&state.metrics, "validate", op, "allowed", "none");
        return Json(response.into_review());
    };
    let verdict = rules::validate(
        &state.settings,
        &state.index,
        &state.client,
        &request.operation,
        &request.user_info,
        new,
        request.old_object.as_ref(),
    )
    .await;
    if let Some(denial) = verdict.denial {
        tracing::info!(uid = %request.uid, name = %request.name, namespace = ?request.namespace, rule = denial.rule, message = %denial.message, "denied");
        count(&state.metrics, "validate", op, "denied", denial.rule);
        let mut denied = response.deny(denial.message);
        denied.result.code = 403;
        denied.result.reason = "Forbidden".into();
        return Json(denied.into_review());
    }
    if verdict.warnings.is_empty() {
        count(&state.metrics, "validate", op, "allowed", "none");
    } else {
        for w in &verdict.warnings {
            count(&state.metrics, "validate", op, "warned", w.rule);
        }
        response.warnings = Some(verdict.warnings.into_iter().map(|w| w.message).collect());
    }
    Json(response.into_review())
}
