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
use common::crd::PlatformInstance;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, TypeMeta};
use serde::Deserialize;
use serde_json::Value;

use crate::index::NodePortIndex;
use crate::metrics::Metrics;
use crate::rules::{self, Settings};

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

/// An `AdmissionReview` as sent, read in one pass (kube's own type flattens its type fields, which
/// makes serde buffer the whole body in a second tree first).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default, deserialize_with = "object_only")]
    request: Option<AdmissionRequest<PlatformInstance>>,
}

/// Just enough of a body that is not a valid review to say why, and under which uid: every field
/// is skipped without being kept.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    api_version: Option<Value>,
    kind: Option<Value>,
    #[serde(default, deserialize_with = "object_only")]
    request: Option<ProbeRequest>,
}

#[derive(Deserialize)]
struct ProbeRequest {
    uid: Option<Value>,
}

/// Reads `request` only from a JSON object (or null): serde's derived structs would also take a
/// positional array, and a uid read from one is not the request's.
fn object_only<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectOnly<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectOnly<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }
    deserializer.deserialize_any(ObjectOnly(std::marker::PhantomData))
}

/// Just `request.object.spec` of a review, read only for its JSON kind.
#[derive(Deserialize)]
struct SpecEnvelope {
    #[serde(default)]
    request: Option<SpecRequest>,
}

#[derive(Deserialize)]
struct SpecRequest {
    #[serde(default)]
    object: Option<SpecObject>,
}

#[derive(Deserialize)]
struct SpecObject {
    #[serde(default)]
    spec: JsonKind,
}

/// Whether a JSON value is an object; its content is skipped, never kept.
#[derive(Default, PartialEq)]
enum JsonKind {
    Object,
    #[default]
    Other,
}

impl<'de> Deserialize<'de> for JsonKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Kind;
        impl<'de> serde::de::Visitor<'de> for Kind {
            type Value = JsonKind;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<JsonKind, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(JsonKind::Object)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<JsonKind, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(JsonKind::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<JsonKind, E> {
                Ok(JsonKind::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<JsonKind, E> {
                Ok(JsonKind::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<JsonKind, E> {
                Ok(JsonKind::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<JsonKind, E> {
                Ok(JsonKind::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<JsonKind, E> {
                Ok(JsonKind::Other)
            }
            fn visit_unit<E>(self) -> Result<JsonKind, E> {
                Ok(JsonKind::Other)
            }
        }
        deserializer.deserialize_any(Kind)
    }
}

/// Whether the review's `request.object.spec` is a JSON object. The typed review also reads a
/// spec from an array (serde's derived structs take positional fields), and a defaults patch
/// that adds `/spec/version` does not apply to one; such an object is left to the API server's
/// schema validation, which refuses it naming the field.
fn spec_is_object(body: &[u8]) -> bool {
    serde_json::from_slice::<SpecEnvelope>(body).is_ok_and(|e| {
        e.request
            .and_then(|r| r.object)
            .is_some_and(|o| o.spec == JsonKind::Object)
    })
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

/// Reads a review of a PlatformInstance: the body is parsed once, straight into the typed review;
/// only a body that fails that is scanned again (keeping nothing but its type and uid) to say why.
fn parse(body: &[u8]) -> Result<AdmissionRequest<PlatformInstance>, Box<AdmissionResponse>> {
    let error = match serde_json::from_slice::<Envelope>(body) {
        Ok(envelope) => return accept(envelope),
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
/// [`common::server::bulk`], whose blocking threads run at the lowest CPU priority). Frees the
/// body before answering.
async fn read(body: Bytes) -> Result<AdmissionRequest<PlatformInstance>, Box<AdmissionResponse>> {
    if body.len() as u64 <= common::server::SMALL_BODY {
        return parse(&body);
    }
    match tokio::task::spawn_blocking(move || parse(&body)).await {
        Ok(parsed) => parsed,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(invalid("", "the webhook is shutting down; retry".into())),
        },
    }
}

/// Checks a review read whole: its type, and that it has a request.
fn accept(
    envelope: Envelope,
) -> Result<AdmissionRequest<PlatformInstance>, Box<AdmissionResponse>> {
    let uid = envelope
        .request
        .as_ref()
        .map(|r| r.uid.as_str())
        .unwrap_or_default();
    if envelope.api_version != API_VERSION || envelope.kind != KIND {
        return Err(wrong_type(uid, &envelope.api_version, &envelope.kind));
    }
    let Some(mut request) = envelope.request else {
        return Err(invalid(
            "",
            "the AdmissionReview has no request".to_string(),
        ));
    };
    request.types = TypeMeta {
        api_version: envelope.api_version,
        kind: envelope.kind,
    };
    Ok(request)
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
    let raw = body.clone();
    let request = match read(body).await {
        Ok(request) => request,
        Err(response) => {
            count(&state.metrics, "mutate", "unknown", "error", "parse");
            return Json(response.into_review());
        }
    };
    let op = operation_label(&request.operation);
    let response = AdmissionResponse::from(&request);
    let Some(object) = request
        .object
        .as_ref()
        .filter(|_| matches!(request.operation, Operation::Create | Operation::Update))
        .filter(|o| o.metadata.deletion_timestamp.is_none())
    else {
        count(&state.metrics, "mutate", op, "allowed", "none");
        return Json(response.into_review());
    };
    let ops = rules::defaults(&state.settings, object);
    // Read again only when there is a default to add (a create without a version), off the
    // runtime's workers for a large body as [`read`] does.
    let spec_ok = !ops.is_empty()
        && if raw.len() as u64 <= common::server::SMALL_BODY {
            spec_is_object(&raw)
        } else {
            tokio::task::spawn_blocking(move || spec_is_object(&raw))
                .await
                .unwrap_or(false)
        };
    if !spec_ok {
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
    let request = match read(body).await {
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
