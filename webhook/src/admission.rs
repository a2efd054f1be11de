//! The admission HTTP API: `POST /mutate` (defaults as a JSON Patch) and `POST /validate`.
//!
//! Every request that arrives within the body limit gets HTTP 200 with an `admission.k8s.io/v1`
//! `AdmissionReview` carrying the request's `uid`; a body that cannot be read as one gets a clear
//! denial. The body limit admits an UPDATE review of the largest object the API server accepts:
//! the API server takes request bodies up to 3 MiB, and an UPDATE review carries the object and
//! the old object, so 2 × 3 MiB plus 1 MiB for the review's own fields and JSON escaping. A body
//! is parsed once. How many bodies are read and answered at once (small ones, such as every
//! ordinary review, and large ones, over 256 KiB, each with a budget of their own) is decided
//! before the body is read, by [`common::server`], which serves this router.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::post;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize;
use serde_json::Value;

use crate::index::NodePortIndex;
use crate::metrics::Metrics;
use crate::rules::{self, Settings};
use crate::view::{self, Instance, Request, Review, Text};

/// The largest request body accepted, in bytes ([`common::server::MAX_BODY`]).
pub const BODY_LIMIT: usize = common::server::MAX_BODY as usize;

/// What the handlers share.
#[derive(Clone)]
pub struct Admission {
    /// Configuration the rules depend on.
    pub settings: Settings,
    /// The NodePort cache.
    pub index: Arc<NodePortIndex>,
    /// A client for SubjectAccessReviews.
    pub client: kube::Client,
    /// Metrics.
    pub metrics: Metrics,
}

/// The admission router (served with [`common::server::layers`], which bounds the bodies it
/// reads).
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

/// An empty admitting answer to the request `uid` (of an `admission.k8s.io/v1` review, the only
/// kind read).
fn admit(uid: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.uid = uid.to_string();
    response.allowed = true;
    response.result = Default::default();
    response
}

/// Just enough of a body that is not a valid review to say why, and under which uid: every field
/// is skipped without being kept.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    api_version: Option<Value>,
    kind: Option<Value>,
    #[serde(default, deserialize_with = "view::object_only")]
    request: Option<ProbeRequest>,
}

#[derive(Deserialize)]
struct ProbeRequest {
    uid: Option<Value>,
}

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

fn wrong_type(uid: &str, api_version: &str, kind: &str) -> Box<AdmissionResponse> {
    invalid(
        uid,
        format!(
            "expected an {API_VERSION} {KIND}, got {api_version:?} {kind:?}; register this webhook with admissionReviewVersions [v1]"
        ),
    )
}

/// Reads a review of a PlatformInstance: the body is parsed once, into the borrowed views of
/// [`view`] (only what the rules read is kept); only a body that fails that is scanned again
/// (keeping nothing but its type and uid) to say why.
fn parse(body: &[u8]) -> Result<Request<'_>, Box<AdmissionResponse>> {
    let error = match serde_json::from_slice::<Review<'_>>(body) {
        Ok(review) => return accept(review),
        Err(e) if !e.is_data() => {
            return Err(invalid(
                "",
                format!("the request body is not JSON ({e}); send an {API_VERSION} {KIND}"),
            ));
        }
        Err(e) => e,
    };
    let Ok(probe) = serde_json::from_slice::<Probe>(body) else {
        return Err(invalid(
            "",
            format!("the request body is not an {API_VERSION} {KIND} ({error})"),
        ));
    };
    let text = |v: Option<Value>| {
        v.as_ref()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let uid = text(probe.request.and_then(|r| r.uid));
    let (api_version, kind) = (text(probe.api_version), text(probe.kind));
    if api_version != API_VERSION || kind != KIND {
        return Err(wrong_type(&uid, &api_version, &kind));
    }
    Err(invalid(
        &uid,
        format!(
            "the review does not carry a valid PlatformInstance ({error}); this webhook only reviews platforminstances"
        ),
    ))
}

/// [`parse`], on a blocking thread for a large body, so that parsing megabytes never holds up
/// the runtime's workers while ordinary reviews wait (a large body is answered on
/// [`common::server::bulk`], whose blocking threads run at the lowest CPU priority). The request
/// of a large body keeps copies of the few strings the rules read; a small body's borrows them.
async fn read(body: &Bytes) -> Result<Request<'_>, Box<AdmissionResponse>> {
    if body.len() as u64 <= common::server::SMALL_BODY {
        return parse(body);
    }
    let body = body.clone();
    match tokio::task::spawn_blocking(move || parse(&body).map(Request::into_owned)).await {
        Ok(parsed) => parsed,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(invalid("", "the webhook is shutting down; retry".into())),
        },
    }
}

/// Checks a review read whole: its type, and that it has a request.
fn accept(review: Review<'_>) -> Result<Request<'_>, Box<AdmissionResponse>> {
    let uid = review
        .request
        .as_ref()
        .map(|r| r.uid.as_str())
        .unwrap_or_default();
    if review.api_version.as_str() != API_VERSION || review.kind.as_str() != KIND {
        return Err(wrong_type(
            uid,
            review.api_version.as_str(),
            review.kind.as_str(),
        ));
    }
    review
        .request
        .ok_or_else(|| invalid("", "the AdmissionReview has no request".to_string()))
}

/// The object of a CREATE or UPDATE.
fn written<'r>(request: &'r Request<'_>) -> Option<&'r Instance<'r>> {
    request
        .object
        .as_ref()
        .filter(|_| matches!(request.operation, Operation::Create | Operation::Update))
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
    let request = match read(&body).await {
        Ok(request) => request,
        Err(response) => {
            count(&state.metrics, "mutate", "unknown", "error", "parse");
            return Json(response.into_review());
        }
    };
    let op = operation_label(&request.operation);
    let response = admit(request.uid.as_str());
    // A spec that is no JSON object (serde reads a struct from a positional array too) gets no
    // patch: one adding `/spec/version` would not apply. The API server's schema validation
    // refuses such an object, naming the field.
    let ops = written(&request)
        .filter(|o| o.metadata.deletion_timestamp.is_none() && o.spec.is_object)
        .map(|o| rules::defaults(&state.settings, o))
        .unwrap_or_default();
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
                admit(request.uid.as_str())
                    .deny(format!("building the defaults patch failed: {e}"))
                    .into_review(),
            )
        }
    }
}

async fn validate(State(state): State<Arc<Admission>>, body: Bytes) -> Reply {
    let _timer = state.metrics.timer("validate").start_timer();
    let request = match read(&body).await {
        Ok(parsed) => parsed,
        Err(response) => {
            count(&state.metrics, "validate", "unknown", "error", "parse");
            return Json(response.into_review());
        }
    };
    let op = operation_label(&request.operation);
    let mut response = admit(request.uid.as_str());
    let Some(new) = written(&request) else {
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
        tracing::info!(uid = request.uid.as_str(), name = request.name.as_str(), namespace = ?request.namespace.as_ref().map(Text::as_str), rule = denial.rule, message = %denial.message, "denied");
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
