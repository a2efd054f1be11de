//! The admission HTTP API: `POST /mutate` (defaults as a JSON Patch) and `POST /validate`.
//!
//! Every request that arrives within the body limit gets HTTP 200 with an `admission.k8s.io/v1`
//! `AdmissionReview` carrying the request's `uid` (kube's `AdmissionResponse`); a body that cannot
//! be read as one gets a clear denial. The body limit admits an UPDATE review of the largest object
//! the API server accepts: the API server takes request bodies up to 3 MiB, and an UPDATE review
//! carries the object and the old object, so 2 × 3 MiB plus 1 MiB for the review's own fields and
//! JSON escaping. A body is parsed once, into kube's typed `AdmissionReview`: for `/validate` of a
//! [`PlatformInstance`], for `/mutate` of an [`Unvalidated`] object (the mutating webhook is called
//! before the API server checks the object against the CRD's schema, so it reads only what
//! defaulting needs). How many bodies are read and answered at once is decided before the body is
//! read, by [`common::server`], which serves this router.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use common::crd::PlatformInstance;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use crate::index::NodePortIndex;
use crate::metrics::{Metrics, Webhook};
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

/// A PlatformInstance as `/mutate` reads it: its metadata and `spec.version`. The mutating
/// webhook is called before the API server checks the object against the CRD's schema, so a
/// wrong type in a field defaulting does not read is left for that check to name.
#[derive(Clone, Debug, Deserialize)]
pub struct Unvalidated {
    /// Its metadata.
    pub metadata: ObjectMeta,
    /// Its spec, of which only the version is read.
    pub spec: VersionOnly,
}

/// `spec.version`, read from a `spec` that is a JSON object; every other member is skipped unread.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionOnly {
    /// `spec.version`.
    pub version: Option<String>,
    /// Whether `spec` was a JSON object (serde also reads a struct from a positional array, to
    /// which a JSON Patch adding `/spec/version` would not apply).
    pub is_object: bool,
}

impl<'de> Deserialize<'de> for VersionOnly {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = VersionOnly;
            // As the derived `PlatformInstanceSpec`'s, so a wrong type is reported in its words.
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("struct PlatformInstanceSpec")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<VersionOnly, A::Error> {
                let mut version = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "version" {
                        map.next_value::<IgnoredAny>()?;
                    } else if version.is_some() {
                        return Err(serde::de::Error::duplicate_field("version"));
                    } else {
                        version = Some(map.next_value::<Option<String>>()?);
                    }
                }
                Ok(VersionOnly {
                    version: version.flatten(),
                    is_object: true,
                })
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<VersionOnly, A::Error> {
                let version = seq.next_element::<Option<String>>()?.flatten();
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(VersionOnly {
                    version,
                    is_object: false,
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Resource for Unvalidated {
    type DynamicType = ();
    type Scope = <PlatformInstance as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        PlatformInstance::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        PlatformInstance::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        PlatformInstance::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        PlatformInstance::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
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

/// Reads a value only from a JSON object (or null, as `None`): serde's derived structs would also
/// take a positional array, and a uid read from one is not the request's.
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

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

/// The answer to a body that is not a PlatformInstance review (boxed: it is large, and rare).
type Refusal = Box<AdmissionResponse>;

/// A denial for a body that is not a PlatformInstance review, keeping its uid when it has one.
fn invalid(uid: &str, message: String) -> Refusal {
    let mut response = AdmissionResponse::invalid(message);
    response.uid = uid.to_string();
    Box::new(response)
}

fn wrong_type(uid: &str, api_version: &str, kind: &str) -> Refusal {
    invalid(
        uid,
        format!(
            "expected an {API_VERSION} {KIND}, got {api_version:?} {kind:?}; register this webhook with admissionReviewVersions [v1]"
        ),
    )
}

/// Reads a review of a PlatformInstance: the body is parsed once, into kube's typed review; only
/// a body that fails that is scanned again (keeping nothing but its type and uid) to say why.
fn parse<K: Resource + DeserializeOwned>(body: &[u8]) -> Result<AdmissionRequest<K>, Refusal> {
    let error = match serde_json::from_slice::<AdmissionReview<K>>(body) {
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
/// [`common::server::bulk`], whose blocking threads run at the lowest CPU priority).
async fn read<K>(body: Bytes) -> Result<AdmissionRequest<K>, Refusal>
where
    K: Resource + DeserializeOwned + Send + 'static,
{
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
fn accept<K: Resource>(review: AdmissionReview<K>) -> Result<AdmissionRequest<K>, Refusal> {
    if review.types.api_version != API_VERSION || review.types.kind != KIND {
        let uid = review.request.as_ref().map(|r| r.uid.as_str());
        return Err(wrong_type(
            uid.unwrap_or_default(),
            &review.types.api_version,
            &review.types.kind,
        ));
    }
    review
        .try_into()
        .map_err(|_| invalid("", "the AdmissionReview has no request".to_string()))
}

/// The answer, as JSON.
fn answer(response: AdmissionResponse) -> Response {
    Json(response.into_review()).into_response()
}

/// The object of a CREATE or UPDATE.
fn written<K: Resource>(request: &AdmissionRequest<K>) -> Option<&K> {
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
    let request = match read::<Unvalidated>(body).await {
        Ok(request) => request,
        Err(refusal) => {
            count(&state.metrics, "mutate", "unknown", "error", "parse");
            return answer(*refusal);
        }
    };
    let op = operation_label(&request.operation);
    // A spec that is no JSON object gets no patch: one adding `/spec/version` would not apply.
    // The API server's schema validation refuses such an object, naming the field.
    let ops = written(&request)
        .filter(|o| o.metadata.deletion_timestamp.is_none() && o.spec.is_object)
        .map(|o| rules::defaults(&state.settings, o.spec.version.as_deref()))
        .unwrap_or_default();
    let response = AdmissionResponse::from(&request);
    if ops.is_empty() {
        count(&state.metrics, "mutate", op, "allowed", "none");
        return answer(response);
    }
    match response.with_patch(json_patch::Patch(ops)) {
        Ok(patched) => {
            count(&state.metrics, "mutate", op, "allowed", "default-version");
            answer(patched)
        }
        Err(e) => {
            count(&state.metrics, "mutate", op, "error", "patch");
            answer(
                AdmissionResponse::from(&request)
                    .deny(format!("building the defaults patch failed: {e}")),
            )
        }
    }
}

async fn validate(State(state): State<Arc<Admission>>, body: Bytes) -> Response {
    let _timer = state.metrics.timer(Webhook::Validate).start_timer();
    let request = match read::<PlatformInstance>(body).await {
        Ok(parsed) => parsed,
        Err(refusal) => {
            count(&state.metrics, "validate", "unknown", "error", "parse");
            return answer(*refusal);
        }
    };
    let op = operation_label(&request.operation);
    let mut response = AdmissionResponse::from(&request);
    let Some(new) = written(&request) else {
        count(&state.metrics, "validate", op, "allowed", "none");
        return answer(response);
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
        tracing::info!(uid = request.uid, name = request.name, namespace = ?request.namespace, rule = denial.rule, message = %denial.message, "denied");
        count(&state.metrics, "validate", op, "denied", denial.rule);
        let mut denied = response.deny(denial.message);
        denied.result.code = 403;
        denied.result.reason = "Forbidden".into();
        return answer(denied);
    }
    if verdict.warnings.is_empty() {
        count(&state.metrics, "validate", op, "allowed", "none");
    } else {
        for w in &verdict.warnings {
            count(&state.metrics, "validate", op, "warned", w.rule);
        }
        response.warnings = Some(verdict.warnings.into_iter().map(|w| w.message).collect());
    }
    answer(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode, header};

    #[tokio::test]
    async fn an_answer_is_sent_as_json() {
        let mut admit = AdmissionResponse::invalid("");
        admit.uid = "x".into();
        admit.allowed = true;
        admit.result = Default::default();
        let response = answer(admit);
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

    #[test]
    fn the_mutating_webhook_reads_only_the_version_of_an_object_spec() {
        let read =
            |spec: &str| serde_json::from_str::<VersionOnly>(spec).map_err(|e| e.to_string());
        let version = |v: &str| VersionOnly {
            version: Some(v.into()),
            is_object: true,
        };
        assert_eq!(
            read(r#"{"version":"6.0.22","platform":[[[1]]]}"#),
            Ok(version("6.0.22"))
        );
        assert_eq!(
            read(r#"{"version":null}"#),
            Ok(VersionOnly {
                version: None,
                is_object: true
            })
        );
        assert_eq!(read(r#"["6.0.22"]"#).map(|s| s.is_object), Ok(false));
        assert!(read(r#"{"version":6}"#).is_err());
        assert!(read(r#"{"version":"a","version":"b"}"#).is_err());
        assert!(read(r#""x""#).is_err_and(|e| e.contains("struct PlatformInstanceSpec")));
    }
}
