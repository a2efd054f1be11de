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

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::admission::Operation;
use serde::Deserialize;
use serde_json::Value;

use crate::index::NodePortIndex;
use crate::metrics::{Metrics, Webhook};
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

/// The answer to one review: an `admission.k8s.io/v1` `AdmissionReview` with only a `response`,
/// written straight from borrowed parts into one buffer ([`Answer::to_json`]; no typed review, no
/// copies of the uid). Its JSON is the JSON kube's `AdmissionResponse::into_review` writes, field
/// for field and in the same order (`webhook/tests/views.rs` and the unit tests below compare
/// both on generated reviews): `apiVersion`, `kind`, then `response` with `uid`, `allowed`,
/// `status` (a `Status` with only its set fields), `patch` (the JSON Patch's bytes as a list of
/// numbers, as kube writes a `Vec<u8>`; the API server reads either form), `patchType`,
/// `warnings`.
struct Answer<'a> {
    uid: Cow<'a, str>,
    allowed: bool,
    status: Outcome,
    patch: Option<Vec<u8>>,
    patch_type: Option<&'static str>,
    warnings: Option<Vec<String>>,
}

/// The `status` of an answer (a `metav1.Status` with only the fields this webhook sets; a field
/// at its zero value is left out, as kube's `Status` leaves it out).
#[derive(Default)]
struct Outcome {
    status: Option<&'static str>,
    code: u16,
    message: String,
    reason: &'static str,
}

/// The answer to a body that is not a PlatformInstance review: it owns its strings (a large
/// body is read on another thread).
type Refusal = Box<Answer<'static>>;

/// How every answer begins: the envelope's type, then the response's `uid` key.
const ANSWER_START: &[u8] =
    br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;

/// Writes `value` as a JSON string (quoted and escaped as serde_json escapes it).
fn json_string(json: &mut Vec<u8>, value: &str) -> serde_json::Result<()> {
    serde_json::to_writer(json, value)
}

impl<'a> Answer<'a> {
    /// An empty admitting answer to the request `uid`.
    fn admit(uid: &'a str) -> Self {
        Self {
            uid: Cow::Borrowed(uid),
            allowed: true,
            status: Outcome::default(),
            patch: None,
            patch_type: None,
            warnings: None,
        }
    }

    /// A denial for a body that is not a PlatformInstance review, keeping its uid when it has
    /// one (as kube's `AdmissionResponse::invalid`).
    fn invalid(uid: &str, message: String) -> Refusal {
        Box::new(Answer {
            uid: Cow::Owned(uid.to_string()),
            allowed: false,
            status: Outcome {
                status: Some("Failure"),
                message,
                reason: "InvalidRequest",
                ..Outcome::default()
            },
            patch: None,
            patch_type: None,
            warnings: None,
        })
    }

    /// This answer, refusing with `message` (as kube's `AdmissionResponse::deny`).
    fn deny(mut self, message: String) -> Self {
        self.allowed = false;
        self.status.message = message;
        self
    }
}

impl Answer<'_> {
    /// The answer's JSON, written in one pass into one buffer sized for it (a string may grow
    /// when escaped; the patch's bytes are written as numbers of up to three digits and a comma
    /// each): the constant parts as they are, the strings escaped.
    fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        let warnings: usize = self.warnings.iter().flatten().map(|w| w.len() + 3).sum();
        let patch = self.patch.as_ref().map_or(0, |p| 4 * p.len() + 40);
        let mut json = Vec::with_capacity(
            ANSWER_START.len() + 64 + self.uid.len() + self.status.message.len() + warnings + patch,
        );
        json.extend_from_slice(ANSWER_START);
        json_string(&mut json, &self.uid)?;
        json.extend_from_slice(if self.allowed {
            br#","allowed":true,"status":{"#
        } else {
            br#","allowed":false,"status":{"#
        });
        let outcome = &self.status;
        let mut first = true;
        let mut key = |json: &mut Vec<u8>, name: &[u8]| {
            if !std::mem::take(&mut first) {
                json.push(b',');
            }
            json.extend_from_slice(name);
        };
        if let Some(status) = outcome.status {
            key(&mut json, br#""status":"#);
            json_string(&mut json, status)?;
        }
        if outcome.code != 0 {
            key(&mut json, br#""code":"#);
            serde_json::to_writer(&mut json, &outcome.code)?;
        }
        if !outcome.message.is_empty() {
            key(&mut json, br#""message":"#);
            json_string(&mut json, &outcome.message)?;
        }
        if !outcome.reason.is_empty() {
            key(&mut json, br#""reason":"#);
            json_string(&mut json, outcome.reason)?;
        }
        json.push(b'}');
        if let Some(patch) = &self.patch {
            json.extend_from_slice(br#","patch":"#);
            serde_json::to_writer(&mut json, patch)?;
        }
        if let Some(patch_type) = self.patch_type {
            json.extend_from_slice(br#","patchType":"#);
            json_string(&mut json, patch_type)?;
        }
        if let Some(warnings) = &self.warnings {
            json.extend_from_slice(br#","warnings":"#);
            serde_json::to_writer(&mut json, warnings)?;
        }
        json.extend_from_slice(b"}}");
        Ok(json)
    }
}

impl IntoResponse for &Answer<'_> {
    fn into_response(self) -> Response {
        match self.to_json() {
            Ok(json) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                Bytes::from(json),
            )
                .into_response(),
            // Strings, numbers and lists of them always serialise; this is never reached.
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("writing the answer failed: {e}"),
            )
                .into_response(),
        }
    }
}

impl IntoResponse for Answer<'_> {
    fn into_response(self) -> Response {
        (&self).into_response()
    }
}

impl IntoResponse for Box<Answer<'_>> {
    fn into_response(self) -> Response {
        (&*self).into_response()
    }
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

fn wrong_type(uid: &str, api_version: &str, kind: &str) -> Refusal {
    Answer::invalid(
        uid,
        format!(
            "expected an {API_VERSION} {KIND}, got {api_version:?} {kind:?}; register this webhook with admissionReviewVersions [v1]"
        ),
    )
}

/// Reads a review of a PlatformInstance: the body is parsed once, into the borrowed views of
/// [`view`] (only what the rules read is kept); only a body that fails that is scanned again
/// (keeping nothing but its type and uid) to say why.
fn parse(body: &[u8]) -> Result<Request<'_>, Refusal> {
    let error = match serde_json::from_slice::<Review<'_>>(body) {
        Ok(review) => return accept(review),
        Err(e) if !e.is_data() => {
            return Err(Answer::invalid(
                "",
                format!("the request body is not JSON ({e}); send an {API_VERSION} {KIND}"),
            ));
        }
        Err(e) => e,
    };
    let Ok(probe) = serde_json::from_slice::<Probe>(body) else {
        return Err(Answer::invalid(
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
    Err(Answer::invalid(
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
async fn read(body: &Bytes) -> Result<Request<'_>, Refusal> {
    if body.len() as u64 <= common::server::SMALL_BODY {
        return parse(body);
    }
    let body = body.clone();
    match tokio::task::spawn_blocking(move || parse(&body).map(Request::into_owned)).await {
        Ok(parsed) => parsed,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(Answer::invalid(
                "",
                "the webhook is shutting down; retry".into(),
            )),
        },
    }
}

/// Checks a review read whole: its type, and that it has a request.
fn accept(review: Review<'_>) -> Result<Request<'_>, Refusal> {
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
        .ok_or_else(|| Answer::invalid("", "the AdmissionReview has no request".to_string()))
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

async fn mutate(State(state): State<Arc<Admission>>, body: Bytes) -> Response {
    let _timer = state.metrics.timer(Webhook::Mutate).start_timer();
    let request = match read(&body).await {
        Ok(request) => request,
        Err(refusal) => {
            count(&state.metrics, "mutate", "unknown", "error", "parse");
            return refusal.into_response();
        }
    };
    let op = operation_label(&request.operation);
    let mut answer = Answer::admit(request.uid.as_str());
    // A spec that is no JSON object (serde reads a struct from a positional array too) gets no
    // patch: one adding `/spec/version` would not apply. The API server's schema validation
    // refuses such an object, naming the field.
    let ops = written(&request)
        .filter(|o| o.metadata.deletion_timestamp.is_none() && o.spec.is_object)
        .map(|o| rules::defaults(&state.settings, o))
        .unwrap_or_default();
    if ops.is_empty() {
        count(&state.metrics, "mutate", op, "allowed", "none");
        return answer.into_response();
    }
    match serde_json::to_vec(&json_patch::Patch(ops)) {
        Ok(patch) => {
            count(&state.metrics, "mutate", op, "allowed", "default-version");
            answer.patch = Some(patch);
            answer.patch_type = Some("JSONPatch");
            answer.into_response()
        }
        Err(e) => {
            count(&state.metrics, "mutate", op, "error", "patch");
            answer
                .deny(format!(
                    "building the defaults patch failed: failed to serialize patch: {e}"
                ))
                .into_response()
        }
    }
}

async fn validate(State(state): State<Arc<Admission>>, body: Bytes) -> Response {
    let _timer = state.metrics.timer(Webhook::Validate).start_timer();
    let request = match read(&body).await {
        Ok(parsed) => parsed,
        Err(refusal) => {
            count(&state.metrics, "validate", "unknown", "error", "parse");
            return refusal.into_response();
        }
    };
    let op = operation_label(&request.operation);
    let mut answer = Answer::admit(request.uid.as_str());
    let Some(new) = written(&request) else {
        count(&state.metrics, "validate", op, "allowed", "none");
        return answer.into_response();
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
        let mut denied = answer.deny(denial.message);
        denied.status.code = 403;
        denied.status.reason = "Forbidden";
        return denied.into_response();
    }
    if verdict.warnings.is_empty() {
        count(&state.metrics, "validate", op, "allowed", "none");
    } else {
        for w in &verdict.warnings {
            count(&state.metrics, "validate", op, "warned", w.rule);
        }
        answer.warnings = Some(verdict.warnings.into_iter().map(|w| w.message).collect());
    }
    answer.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::DynamicObject;
    use kube::core::admission::{AdmissionResponse, AdmissionReview};
    use proptest::prelude::*;

    /// The bytes an answer is sent as.
    fn written(answer: &Answer<'_>) -> Vec<u8> {
        answer.to_json().expect("json")
    }

    /// The bytes kube's `AdmissionReview` of `response` is written as (what axum's `Json` sent).
    fn kube_bytes(response: AdmissionResponse) -> Vec<u8> {
        serde_json::to_vec(&response.into_review()).expect("json")
    }

    /// kube's empty admitting answer, as the handlers built it before.
    fn kube_admit(uid: &str) -> AdmissionResponse {
        let mut response = AdmissionResponse::invalid("");
        response.uid = uid.to_string();
        response.allowed = true;
        response.result = Default::default();
        response
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9-]{0,12}",
            "\\PC{0,24}",
            "[a-z]{0,3}[\"\\\\\n\t\u{0}\u{1f}é\u{2028}]{1,4}",
        ]
    }

    proptest! {
        /// Every kind of answer the handlers write is byte for byte what kube's
        /// `AdmissionResponse` wrote, and reads back as the same `AdmissionReview`.
        #[test]
        fn answers_are_the_bytes_kube_wrote(
            uid in text(),
            message in text(),
            warnings in prop::collection::vec(text(), 1..4),
            version in text(),
        ) {
            let ops = vec![json_patch::PatchOperation::Add(json_patch::AddOperation {
                path: json_patch::jsonptr::PointerBuf::from_tokens(["spec", "version"]),
                value: serde_json::Value::String(version),
            })];
            let patch = serde_json::to_vec(&json_patch::Patch(ops.clone())).expect("patch");

            let mut patched = Answer::admit(&uid);
            patched.patch = Some(patch);
            patched.patch_type = Some("JSONPatch");
            let mut forbidden = Answer::admit(&uid).deny(message.clone());
            forbidden.status.code = 403;
            forbidden.status.reason = "Forbidden";
            let mut warned = Answer::admit(&uid);
            warned.warnings = Some(warnings.clone());

            let mut kube_forbidden = kube_admit(&uid).deny(message.clone());
            kube_forbidden.result.code = 403;
            kube_forbidden.result.reason = "Forbidden".into();
            let mut kube_warned = kube_admit(&uid);
            kube_warned.warnings = Some(warnings);
            let mut kube_invalid = AdmissionResponse::invalid(message.clone());
            kube_invalid.uid = uid.clone();

            let cases = [
                ("admit", written(&Answer::admit(&uid)), kube_bytes(kube_admit(&uid))),
                (
                    "patch",
                    written(&patched),
                    kube_bytes(kube_admit(&uid).with_patch(json_patch::Patch(ops)).expect("patch")),
                ),
                (
                    "deny",
                    written(&Answer::admit(&uid).deny(message.clone())),
                    kube_bytes(kube_admit(&uid).deny(message.clone())),
                ),
                ("forbidden", written(&forbidden), kube_bytes(kube_forbidden)),
                ("warned", written(&warned), kube_bytes(kube_warned)),
                ("invalid", written(&Answer::invalid(&uid, message)), kube_bytes(kube_invalid)),
            ];
            for (kind, ours, theirs) in cases {
                prop_assert_eq!(
                    String::from_utf8_lossy(&ours),
                    String::from_utf8_lossy(&theirs),
                    "{} answer",
                    kind
                );
                let read: AdmissionReview<DynamicObject> =
                    serde_json::from_slice(&ours).expect("an AdmissionReview");
                let expected: AdmissionReview<DynamicObject> =
                    serde_json::from_slice(&theirs).expect("an AdmissionReview");
                prop_assert_eq!(read.types, expected.types);
                prop_assert_eq!(read.response, expected.response);
                prop_assert!(read.request.is_none());
            }
        }
    }

    #[tokio::test]
    async fn an_answer_is_sent_as_json() {
        let response = Answer::admit("x").into_response();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE),
            Some(&HeaderValue::from_static("application/json"))
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        assert_eq!(
            &body[..],
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true,"status":{}}}"#
        );
    }
}
