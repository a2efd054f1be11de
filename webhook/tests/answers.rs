//! The router's answers against kube's own types, on generated reviews (proptest, no API
//! server): for every review, each endpoint's whole answer equals the answer built from the body
//! read whole into kube's typed `AdmissionReview<PlatformInstance>`, the rules run on that
//! instance, and the answer built with kube's `AdmissionResponse` and written as axum's `Json`
//! writes it (and reads back as the same `AdmissionReview`). `/mutate` reads less of the object
//! than the typed review (only what defaulting needs, as it is called before the API server's
//! schema check), so this also checks that it answers valid instances as the typed parse would.
//! The reviews are valid PlatformInstances as the API server sends them (what the schema admits)
//! with random names, annotations (the allow-downgrade one or others, strings with escapes),
//! versions, NodePorts, endpoints, route patterns, deletion policies, tenants and users (up to 40
//! and 160), tenant logins, deletion timestamps, installed versions, operations and old objects.
//!
//! `VIEW_CASES` sets the number of reviews (default 400; each is sent to both endpoints).

mod support;

use std::collections::BTreeMap;

use common::crd::{
    DeletionPolicy, Gateway, Membership, PlatformInstance, PlatformInstanceSpec,
    PlatformInstanceStatus, PlatformSettings, SecretKeyRef, Tenant, TenantAuth, User,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use support::*;

fn cases() -> u32 {
    std::env::var("VIEW_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// A string that JSON must escape now and then (quotes, backslashes, newlines, unicode).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z][a-z0-9-]{0,20}",
        1 => "\\PC{0,16}",
        1 => "[a-z]{0,4}[\"\\\\\n\té]{1,3}[a-z]{0,4}",
    ]
}

fn version() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        Just(Some("6.0.22".to_string())),
        Just(Some("6.0.21".to_string())),
        Just(Some("6.0.23".to_string())),
        Just(Some("7.0.0".to_string())),
        Just(Some("5.9.1".to_string())),
        Just(Some("^6.0.0".to_string())),
        Just(Some("6.0.22-rc.1".to_string())),
        text().prop_map(Some),
    ]
}

fn gateway() -> impl Strategy<Value = Gateway> {
    let port = prop_oneof![
        Just(0),
        Just(30080),
        Just(30081),
        Just(30999),
        Just(31000),
        Just(99),
        Just(32768),
        30000i32..32768,
    ];
    let endpoint = prop::option::of(prop_oneof![
        Just("http://127.0.0.1:30081".to_string()),
        Just("http://apps.example:30081".to_string()),
        Just("https://apps.example/".to_string()),
        Just("http://[::1]:8080/".to_string()),
        Just("http://localhost".to_string()),
        text(),
    ]);
    let pattern = prop::option::of(Just("http://{route}.{tenant}.apps.example/".to_string()));
    (port, endpoint, pattern).prop_map(|(http_node_port, http_endpoint, route_url_pattern)| {
        Gateway {
            http_node_port,
            http_endpoint,
            route_url_pattern,
        }
    })
}

fn tenant_auth() -> impl Strategy<Value = TenantAuth> {
    (text(), text()).prop_map(|(name, key)| TenantAuth {
        image: "registry.example/auth@sha256:0000000000000000000000000000000000000000000000000000000000000000".into(),
        issuer: "https://id.example".into(),
        client_id: "console".into(),
        client_secret_ref: SecretKeyRef { name, key },
        registry: None,
    })
}

fn platform() -> impl Strategy<Value = Option<PlatformSettings>> {
    let people = (0usize..40, 0usize..160).prop_map(|(tenants, users)| {
        let tenants: Vec<Tenant> = (0..tenants)
            .map(|i| Tenant {
                name: format!("tenant-{i}"),
            })
            .collect();
        let users: Vec<User> = (0..users)
            .map(|i| User {
                name: format!("user-{i}"),
                memberships: (!tenants.is_empty()).then(|| {
                    (0..4)
                        .map(|t| Membership {
                            tenant: tenants[(i + t) % tenants.len()].name.clone(),
                            role: "developer".into(),
                        })
                        .collect()
                }),
            })
            .collect();
        (tenants, users)
    });
    prop::option::of(
        (
            prop::option::of(gateway()),
            people,
            prop::option::weighted(0.2, tenant_auth()),
            prop::option::of(Just("registry.example/host:1".to_string())),
        )
            .prop_map(
                |(gateway, (tenants, users), tenant_auth, image)| PlatformSettings {
                    gateway,
                    tenants: (!tenants.is_empty()).then_some(tenants),
                    users: (!users.is_empty()).then_some(users),
                    tenant_auth,
                    tenant_host_image: image,
                    ..Default::default()
                },
            ),
    )
}

fn annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    let allow = prop::option::of(prop_oneof![
        Just("true".to_string()),
        Just("false".to_string()),
        text(),
    ]);
    prop::option::of(
        (allow, prop::collection::btree_map(text(), text(), 0..4)).prop_map(|(allow, mut map)| {
            if let Some(v) = allow {
                map.insert(common::names::ALLOW_DOWNGRADE_ANNOTATION.into(), v);
            }
            map
        }),
    )
}

fn instance() -> impl Strategy<Value = PlatformInstance> {
    (
        text(),
        prop::option::weighted(0.1, text()),
        "[a-z][a-z0-9-]{0,12}",
        annotations(),
        any::<bool>(),
        (version(), platform(), any::<bool>()),
        prop::option::of(version()),
    )
        .prop_map(
            |(name, generate_name, namespace, annotations, deleting, spec, installed)| {
                let (version, platform, delete) = spec;
                let mut pi = PlatformInstance::new(
                    &name,
                    PlatformInstanceSpec {
                        version,
                        platform,
                        deletion_policy: if delete {
                            DeletionPolicy::Delete
                        } else {
                            DeletionPolicy::Retain
                        },
                        ..Default::default()
                    },
                );
                if generate_name.is_some() {
                    pi.metadata.name = None;
                    pi.metadata.generate_name = generate_name;
                }
                pi.metadata.namespace = Some(namespace);
                pi.metadata.annotations = annotations;
                pi.metadata.deletion_timestamp =
                    deleting.then(|| Time("2026-11-30T00:00:00Z".parse().expect("timestamp")));
                pi.status = installed.map(|installed_version| PlatformInstanceStatus {
                    installed_version,
                    ..Default::default()
                });
                pi
            },
        )
}

/// A review: an operation, the object, the stored object (another instance, or the same one, on
/// UPDATE), a requester, a uid.
fn review_of() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            4 => Just("CREATE"),
            6 => Just("UPDATE"),
            1 => Just("DELETE"),
            1 => Just("CONNECT"),
        ],
        instance(),
        prop_oneof![Just(None), instance().prop_map(Some)],
        text(),
    )
        .prop_map(|(operation, new, other, uid)| {
            let old = (operation != "CREATE").then(|| {
                let mut old = other.unwrap_or_else(|| new.clone());
                old.metadata.name = new.metadata.name.clone();
                old.metadata.namespace = new.metadata.namespace.clone();
                old
            });
            let object = serde_json::to_value(&new).expect("json");
            let mut review = review(
                &uid,
                operation,
                object,
                old.map(|o| serde_json::to_value(o).expect("json")),
                json!({"username": "alice", "groups": ["team-a"], "uid": "u-1"}),
            );
            // The API server sends an empty name for an object named by generateName.
            if review["request"]["name"].is_null() {
                review["request"]["name"] = json!("");
            }
            review
        })
}

/// The answer of kube's types: the body read into kube's typed review, the rules run on the typed
/// instances, the answer built from the typed request with kube's `AdmissionResponse`, written as
/// axum's `Json` writes it.
async fn typed_answer(h: &Harness, path: &str, body: &[u8]) -> Result<Vec<u8>, TestCaseError> {
    let review: AdmissionReview<PlatformInstance> = serde_json::from_slice(body)
        .map_err(|e| TestCaseError::fail(format!("the typed parse refused a valid review: {e}")))?;
    let request: AdmissionRequest<PlatformInstance> = review
        .try_into()
        .map_err(|e| TestCaseError::fail(format!("no request: {e:?}")))?;
    let response = AdmissionResponse::from(&request);
    let written = request
        .object
        .as_ref()
        .filter(|_| matches!(request.operation, Operation::Create | Operation::Update));
    let answer = if path == "/mutate" {
        let ops = written
            .filter(|o| o.metadata.deletion_timestamp.is_none())
            .map(|o| webhook::rules::defaults(&settings(), o.spec.version.as_deref()))
            .unwrap_or_default();
        if ops.is_empty() {
            response
        } else {
            response
                .with_patch(json_patch::Patch(ops))
                .map_err(|e| TestCaseError::fail(e.to_string()))?
        }
    } else if let Some(new) = written {
        let verdict = webhook::rules::validate(
            &settings(),
            &h.index,
            &offline_client(),
            &request.operation,
            &request.user_info,
            new,
            request.old_object.as_ref(),
        )
        .await;
        match verdict.denial {
            Some(denial) => {
                let mut denied = response.deny(denial.message);
                denied.result.code = 403;
                denied.result.reason = "Forbidden".into();
                denied
            }
            None if verdict.warnings.is_empty() => response,
            None => {
                let mut warned = response;
                warned.warnings = Some(verdict.warnings.into_iter().map(|w| w.message).collect());
                warned
            }
        }
    } else {
        response
    };
    serde_json::to_vec(&answer.into_review()).map_err(|e| TestCaseError::fail(e.to_string()))
}

#[test]
fn the_router_answers_every_generated_review_as_kubes_typed_review_does() {
    // The composed strategies of an unoptimised build need more stack than a test thread has.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(compare)
        .expect("thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

fn compare() {
    let runtime = current_thread();
    let _entered = runtime.enter();
    let h = offline_with_a_held_port();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let outcomes: std::cell::RefCell<BTreeMap<String, u32>> = Default::default();
    let result = runner.run(&review_of(), |review| {
        let body = serde_json::to_vec(&review).expect("json");
        runtime.block_on(async {
            for path in ["/mutate", "/validate"] {
                let (status, content_type, bytes) = send_raw(&h, path, body.clone()).await;
                let text = String::from_utf8_lossy(&bytes);
                prop_assert_eq!(status.as_u16(), 200, "{}: {}", path, text);
                prop_assert_eq!(content_type.as_deref(), Some("application/json"));
                let expected = typed_answer(&h, path, &body).await?;
                prop_assert_eq!(
                    &text,
                    &String::from_utf8_lossy(&expected),
                    "{} answered differently",
                    path
                );
                // The bytes read back as the AdmissionReview kube's types answered.
                let read: AdmissionReview<DynamicObject> = serde_json::from_slice(&bytes)
                    .map_err(|e| TestCaseError::fail(format!("not an AdmissionReview: {e}")))?;
                let old: AdmissionReview<DynamicObject> =
                    serde_json::from_slice(&expected).expect("kube's own review");
                prop_assert_eq!(&read.types, &old.types);
                prop_assert_eq!(&read.response, &old.response);
                prop_assert!(read.request.is_none());
                let answer: Value = serde_json::from_slice(&bytes).expect("json");
                let response = &answer["response"];
                let outcome = if response["allowed"] == false {
                    "denied"
                } else if !response["patch"].is_null() {
                    "patched"
                } else if response["warnings"].is_array() {
                    "warned"
                } else {
                    "allowed"
                };
                *outcomes
                    .borrow_mut()
                    .entry(format!("{path} {outcome}"))
                    .or_default() += 1;
            }
            Ok(())
        })
    });
    let outcomes = outcomes.into_inner();
    println!("{} reviews, answers: {outcomes:?}", cases());
    if let Err(e) = result {
        panic!("{e}");
    }
    // The generator reaches every kind of answer on both endpoints.
    for kind in [
        "/mutate allowed",
        "/mutate patched",
        "/validate allowed",
        "/validate denied",
        "/validate warned",
    ] {
        assert!(
            outcomes.get(kind).is_some_and(|n| *n > 0),
            "no {kind} answer in {outcomes:?}"
        );
    }
}
