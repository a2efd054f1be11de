//! The admission rules the CRD schema cannot express: defaults that depend on operator
//! configuration, supported version range, downgrades, version changes during deletion, who may
//! make the operator read a Secret, NodePort collisions, and warnings for risky but legal choices.
//!
//! Denials are one line: the field, what is wrong, and how to fix it.

use std::sync::Arc;

use common::names::{ALLOW_DOWNGRADE_ANNOTATION, host_namespace, legacy_host_namespace};
use json_patch::{AddOperation, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::core::admission::Operation;
use serde_json::Value;

use common::crd::{PlatformInstance, SecretKeyRef, TenantAuth};

use crate::index::{Holder, NodePortIndex};

/// What the rules depend on from the operator's configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The platform version set when `spec.version` is left out.
    pub default_version: String,
    /// The lowest supported `MAJOR.MINOR`.
    pub min_version: (u64, u64),
    /// The highest supported `MAJOR.MINOR`.
    pub max_version: (u64, u64),
    /// The API server's NodePort range, inclusive.
    pub node_port_range: (i32, i32),
}

/// One finding of a rule: its name (a bounded metric label) and a one-line message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The rule.
    pub rule: &'static str,
    /// What to tell the requester.
    pub message: String,
}

impl Finding {
    fn new(rule: &'static str, message: impl Into<String>) -> Self {
        Self {
            rule,
            message: message.into(),
        }
    }
}

/// The outcome of validation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Why the request is denied, if it is.
    pub denial: Option<Finding>,
    /// Warnings for an admitted request.
    pub warnings: Vec<Finding>,
}

impl Verdict {
    fn deny(finding: Finding) -> Self {
        Self {
            denial: Some(finding),
            warnings: Vec::new(),
        }
    }
}

/// The JSON Patch operations that apply the defaults to an object whose `spec.version` is
/// `version`: only what is missing, so applying the result and asking again yields no operation.
pub fn defaults(settings: &Settings, version: Option<&str>) -> Vec<PatchOperation> {
    if version.is_some() {
        return Vec::new();
    }
    vec![PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["spec", "version"]),
        value: Value::String(settings.default_version.clone()),
    })]
}

/// `metadata.namespace`, or empty.
fn namespace_of(pi: &PlatformInstance) -> &str {
    pi.metadata.namespace.as_deref().unwrap_or_default()
}

/// `metadata.name`, else `metadata.generateName`, else empty (as `ResourceExt::name_any`).
fn name_any(pi: &PlatformInstance) -> &str {
    let meta = &pi.metadata;
    meta.name
        .as_deref()
        .or(meta.generate_name.as_deref())
        .unwrap_or_default()
}

/// The rules that need no API call, for CREATE and UPDATE. `old` is the stored object on UPDATE.
pub fn check_local(
    settings: &Settings,
    index: &NodePortIndex,
    operation: &Operation,
    new: &PlatformInstance,
    old: Option<&PlatformInstance>,
) -> Verdict {
    if let Some(old) = old.filter(|o| o.metadata.deletion_timestamp.is_some()) {
        if new.spec.version != old.spec.version {
            return Verdict::deny(Finding::new(
                "deleting",
                format!(
                    "spec.version cannot change while the instance is being deleted (from {} to {}); wait for the deletion to finish, then create it again",
                    old.spec.version.as_deref().unwrap_or("unset"),
                    new.spec.version.as_deref().unwrap_or("unset")
                ),
            ));
        }
        // The controller removing its finalizer, or any other edit of a deleting instance, is
        // always admitted so deletion can never hang on this webhook.
        return Verdict::default();
    }
    let checked = check_version(settings, operation, new, old).and_then(|mut warnings| {
        warnings.extend(check_node_port(settings, index, new)?);
        Ok(warnings)
    });
    let mut warnings = match checked {
        Ok(warnings) => warnings,
        Err(denial) => return Verdict::deny(denial),
    };
    warnings.extend(check_route_pattern(new));
    let policy_changed = old.is_none_or(|o| o.spec.deletion_policy != new.spec.deletion_policy);
    if new.spec.deletion_policy == common::crd::DeletionPolicy::Delete && policy_changed {
        warnings.push(Finding::new(
            "deletion-policy",
            "spec.deletionPolicy is Delete: deleting this instance removes its storage and Pulumi state for good",
        ));
    }
    Verdict {
        denial: None,
        warnings,
    }
}

/// `spec.version`: exact, in the supported range, not below the installed version unless opted
/// in. Gives the warnings, or the denial.
fn check_version(
    settings: &Settings,
    operation: &Operation,
    new: &PlatformInstance,
    old: Option<&PlatformInstance>,
) -> Result<Vec<Finding>, Finding> {
    let Some(version) = new.spec.version.as_deref() else {
        return Ok(matches!(operation, Operation::Create)
            .then(|| {
                Finding::new(
                    "default-version",
                    format!(
                        "spec.version is not set; the controller installs its default {}",
                        settings.default_version
                    ),
                )
            })
            .into_iter()
            .collect());
    };
    let parsed = common::version::parse_exact(version)
        .map_err(|e| Finding::new("version", format!("spec.version: {e}")))?;
    let range = (settings.min_version, settings.max_version);
    common::version::check_supported("spec.version", &parsed, range)
        .map_err(|message| Finding::new("version-range", message))?;
    let installed = old
        .and_then(|o| o.status.as_ref())
        .and_then(|s| s.installed_version.as_deref());
    let Some(installed) = installed
        .filter(|i| semver::Version::parse(i).is_ok_and(|installed_v| parsed < installed_v))
    else {
        return Ok(Vec::new());
    };
    let opted_in = new
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOW_DOWNGRADE_ANNOTATION))
        .is_some_and(|v| v == "true");
    if !opted_in {
        return Err(Finding::new(
            "downgrade",
            format!(
                "spec.version {version} is below the installed version {installed}; set the annotation {ALLOW_DOWNGRADE_ANNOTATION}=true to downgrade on purpose"
            ),
        ));
    }
    Ok(vec![Finding::new(
        "downgrade",
        format!(
            "downgrading from {installed} to {version} because {ALLOW_DOWNGRADE_ANNOTATION}=true; the platform's state may not support it"
        ),
    )])
}

/// `spec.platform.gateway.httpNodePort`: in the API server's range, and held by nobody else.
/// Gives the warnings, or the denial.
fn check_node_port(
    settings: &Settings,
    index: &NodePortIndex,
    new: &PlatformInstance,
) -> Result<Vec<Finding>, Finding> {
    let Some(gateway) = new.spec.platform.as_ref().and_then(|p| p.gateway.as_ref()) else {
        return Ok(Vec::new());
    };
    let port = gateway.http_node_port;
    if port == 0 {
        return Ok(Vec::new());
    }
    let (lo, hi) = settings.node_port_range;
    if port < lo || port > hi {
        return Err(Finding::new(
            "node-port-range",
            format!(
                "spec.platform.gateway.httpNodePort {port} is outside the API server's NodePort range {lo}-{hi}; choose a port in it, or 0 to keep the gateway in-instance"
            ),
        ));
    }
    let (namespace, name) = (namespace_of(new), name_any(new));
    // Its own Service lives in its host namespace, of this release's name or a kept earlier one.
    let taken = index.holders(port).into_iter().find(|h| match h {
        Holder::Instance {
            namespace: ns,
            name: n,
        } => !(ns == namespace && n == name),
        Holder::Service { namespace: ns, .. } => {
            *ns != host_namespace(namespace, name) && *ns != legacy_host_namespace(namespace, name)
        }
    });
    if let Some(holder) = taken {
        return Err(Finding::new(
            "node-port-conflict",
            format!(
                "spec.platform.gateway.httpNodePort {port} is already used by {holder}; choose a free NodePort, or 0 to keep the gateway in-instance"
            ),
        ));
    }
    Ok(gateway
        .http_endpoint
        .as_deref()
        .and_then(endpoint_port)
        .filter(|p| *p != port)
        .map(|p| {
            Finding::new(
                "endpoint-port",
                format!("spec.platform.gateway.httpEndpoint names port {p} but httpNodePort is {port}; make sure something forwards {p} to the NodePort"),
            )
        })
        .into_iter()
        .collect())
}

/// `spec.platform.gateway.routeUrlPattern`: the platform derives it only from a loopback
/// `httpEndpoint` (seed 003), so a public endpoint without it gets a warning.
fn check_route_pattern(new: &PlatformInstance) -> Option<Finding> {
    let gateway = new.spec.platform.as_ref()?.gateway.as_ref()?;
    let endpoint = gateway.http_endpoint.as_deref()?;
    if gateway.route_url_pattern.is_some() || is_loopback(endpoint) {
        return None;
    }
    Some(Finding::new(
        "route-pattern",
        format!(
            "spec.platform.gateway.httpEndpoint {endpoint} is not a loopback URL, so the platform cannot derive tenant route URLs from it; set spec.platform.gateway.routeUrlPattern, such as http://{{route}}.{{tenant}}.apps.example/"
        ),
    ))
}

/// A URL split at its first `://`: the scheme, and the rest.
fn split_scheme(url: &str) -> Option<(&str, &str)> {
    url.split_once("://")
}

/// Whether an http(s) URL's host is this machine (127.0.0.0/8, `::1`, `localhost`).
fn is_loopback(url: &str) -> bool {
    let Some((_, rest)) = split_scheme(url) else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let host = match host_port.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    // Compared without regard to ASCII case, in place (no lowercased copy per review).
    const SUFFIX: &[u8] = b".localhost";
    let bytes = host.as_bytes();
    host.eq_ignore_ascii_case("localhost")
        || (bytes.len() >= SUFFIX.len()
            && bytes[bytes.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX))
        || host == "::1"
        || host.strip_prefix("127.").is_some_and(|r| {
            r.split('.').count() == 3 && r.split('.').all(|o| o.parse::<u8>().is_ok())
        })
}

/// The port an http(s) URL names, explicitly or by its scheme.
fn endpoint_port(url: &str) -> Option<i32> {
    let (scheme, rest) = split_scheme(url)?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let port = match host_port.strip_prefix('[') {
        Some(bracketed) => bracketed
            .split_once(']')
            .and_then(|(_, after)| after.strip_prefix(':')),
        None => host_port.rsplit_once(':').map(|(_, p)| p),
    };
    match (port, scheme) {
        (Some(p), _) => p.parse().ok(),
        (None, "http") => Some(80),
        (None, "https") => Some(443),
        _ => None,
    }
}

/// The Secret reference the Secret rule must check: `new`'s, when it has one and anything under
/// `tenantAuth` is new or changed against `old` (the issuer, the image and the registry decide
/// where the secret goes and what runs with it, so a change to any of them is checked as a new
/// reference would be).
fn secret_ref_to_check<'v>(
    new: &'v PlatformInstance,
    old: Option<&PlatformInstance>,
) -> Option<&'v SecretKeyRef> {
    fn tenant_auth(pi: &PlatformInstance) -> Option<&TenantAuth> {
        pi.spec.platform.as_ref()?.tenant_auth.as_ref()
    }
    let auth = tenant_auth(new)?;
    if old.is_some_and(|o| tenant_auth(o) == Some(auth)) {
        return None;
    }
    Some(&auth.client_secret_ref)
}

/// The Secret rule: whoever names `tenantAuth.clientSecretRef` (on create, or when changing
/// anything under `tenantAuth`) must be allowed to `get` that Secret themselves, checked with a
/// SubjectAccessReview for the request's user and groups. The webhook itself never reads the Secret (it holds no Secret read
/// outside its own namespace): whether it exists, and has the key, the controller reports in a
/// condition, so a folder of manifests applies in any order.
pub async fn check_secret_ref(
    client: &kube::Client,
    user: &UserInfo,
    new: &PlatformInstance,
    old: Option<&PlatformInstance>,
) -> Verdict {
    let Some(reference) = secret_ref_to_check(new, old) else {
        return Verdict::default();
    };
    let namespace = namespace_of(new);
    let field = "spec.platform.tenantAuth.clientSecretRef";
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("get".into()),
                resource: Some("secrets".into()),
                group: Some(String::new()),
                version: Some("v1".into()),
                name: Some(reference.name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let allowed = match reviews.create(&PostParams::default(), &review).await {
        Ok(r) => r
            .status
            .is_some_and(|s| s.allowed && !s.denied.unwrap_or(false)),
        Err(e) => {
            return Verdict::deny(Finding::new(
                "secret-access",
                format!(
                    "{field}: could not check whether you may read Secret {namespace}/{} ({e}); retry, and check the webhook's permission to create SubjectAccessReviews",
                    reference.name
                ),
            ));
        }
    };
    if !allowed {
        return Verdict::deny(Finding::new(
            "secret-access",
            format!(
                "{field}: {} may not get Secret {namespace}/{}, so cannot make the operator read it; ask for read access to that Secret or name one you can read",
                user.username.as_deref().unwrap_or("the requester"),
                reference.name
            ),
        ));
    }
    Verdict::default()
}

/// Everything the validating webhook checks for one request.
pub async fn validate(
    settings: &Settings,
    index: &Arc<NodePortIndex>,
    client: &kube::Client,
    operation: &Operation,
    user: &UserInfo,
    new: &PlatformInstance,
    old: Option<&PlatformInstance>,
) -> Verdict {
    let local = check_local(settings, index, operation, new, old);
    if local.denial.is_some() || old.is_some_and(|o| o.metadata.deletion_timestamp.is_some()) {
        return local;
    }
    // The API call's future (kube's request and the SubjectAccessReview) is boxed, and only
    // built when there is a reference to check: every review's future, which the router boxes
    // and moves, stays small.
    if secret_ref_to_check(new, old).is_none() {
        return local;
    }
    let secret = Box::pin(check_secret_ref(client, user, new, old)).await;
    if secret.denial.is_some() {
        return secret;
    }
    let mut warnings = local.warnings;
    warnings.extend(secret.warnings);
    Verdict {
        denial: None,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::crd::{
        DeletionPolicy, Gateway, PlatformInstanceSpec, PlatformInstanceStatus, PlatformSettings,
    };
    use kube::ResourceExt;

    use check_local as local;

    /// [`defaults`] for a typed instance.
    fn defaults_of(s: &Settings, object: &PlatformInstance) -> Vec<PatchOperation> {
        defaults(s, object.spec.version.as_deref())
    }

    fn settings() -> Settings {
        Settings {
            default_version: "6.0.22".into(),
            min_version: (6, 0),
            max_version: (6, 0),
            node_port_range: (30000, 32767),
        }
    }

    fn instance(version: Option<&str>, port: i32) -> PlatformInstance {
        let mut pi = PlatformInstance::new(
            "one",
            PlatformInstanceSpec {
                version: version.map(Into::into),
                platform: Some(PlatformSettings {
                    gateway: Some(Gateway {
                        http_node_port: port,
                        http_endpoint: None,
                        route_url_pattern: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        pi.metadata.namespace = Some("team-a".into());
        pi
    }

    fn installed(mut pi: PlatformInstance, version: &str) -> PlatformInstance {
        pi.status = Some(PlatformInstanceStatus {
            installed_version: Some(version.into()),
            ..Default::default()
        });
        pi
    }

    fn denied_by(v: &Verdict) -> Option<&'static str> {
        v.denial.as_ref().map(|d| d.rule)
    }

    #[test]
    fn defaults_are_minimal_and_idempotent() {
        let s = settings();
        let mut obj = serde_json::to_value(instance(None, 0)).expect("json");
        let typed = |v: &Value| serde_json::from_value::<PlatformInstance>(v.clone()).expect("pi");
        let ops = defaults_of(&s, &typed(&obj));
        assert_eq!(ops.len(), 1);
        json_patch::patch(&mut obj, &ops).expect("applies");
        assert_eq!(obj["spec"]["version"], "6.0.22");
        assert!(
            defaults_of(&s, &typed(&obj)).is_empty(),
            "a second pass changes nothing"
        );
        assert!(
            defaults_of(&s, &instance(Some("6.0.3"), 0)).is_empty(),
            "a given version is kept"
        );
        // A null version is replaced too (add on an existing member replaces it).
        obj["spec"]["version"] = Value::Null;
        let ops = defaults_of(&s, &typed(&obj));
        json_patch::patch(&mut obj, &ops).expect("applies");
        assert_eq!(obj["spec"]["version"], "6.0.22");
    }

    #[test]
    fn version_range_and_downgrade() {
        let s = settings();
        let index = NodePortIndex::default();
        let ok = local(
            &s,
            &index,
            &Operation::Create,
            &instance(Some("6.0.22"), 0),
            None,
        );
        assert_eq!(ok, Verdict::default());
        let v = local(
            &s,
            &index,
            &Operation::Create,
            &instance(Some("7.0.0"), 0),
            None,
        );
        assert_eq!(denied_by(&v), Some("version-range"));
        assert!(v.denial.as_ref().is_some_and(
            |d| d.message.starts_with("spec.version 7.0.0") && d.message.contains("6.0.x")
        ));
        let v = local(
            &s,
            &index,
            &Operation::Create,
            &instance(Some("^6.0.0"), 0),
            None,
        );
        assert_eq!(denied_by(&v), Some("version"));

        let old = installed(instance(Some("6.0.22"), 0), "6.0.22");
        let v = local(
            &s,
            &index,
            &Operation::Update,
            &instance(Some("6.0.21"), 0),
            Some(&old),
        );
        assert_eq!(denied_by(&v), Some("downgrade"));
        let mut opted = instance(Some("6.0.21"), 0);
        opted
            .annotations_mut()
            .insert(ALLOW_DOWNGRADE_ANNOTATION.into(), "true".into());
        let v = local(&s, &index, &Operation::Update, &opted, Some(&old));
        assert_eq!(v.denial, None);
        assert_eq!(
            v.warnings.iter().map(|w| w.rule).collect::<Vec<_>>(),
            ["downgrade"]
        );
        let v = local(
            &s,
            &index,
            &Operation::Update,
            &instance(Some("6.0.23"), 0),
            Some(&old),
        );
        assert_eq!(v, Verdict::default(), "an upgrade is fine");
        let v = local(&s, &index, &Operation::Create, &instance(None, 0), None);
        assert_eq!(
            v.warnings.iter().map(|w| w.rule).collect::<Vec<_>>(),
            ["default-version"]
        );
    }

    #[test]
    fn deleting_instances_admit_everything_but_a_version_change() {
        let s = settings();
        let index = NodePortIndex::default();
        let mut old = instance(Some("6.0.22"), 0);
        old.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        old.metadata.finalizers = Some(vec![common::names::FINALIZER.into()]);
        let mut new = old.clone();
        new.metadata.finalizers = None;
        assert_eq!(
            local(&s, &index, &Operation::Update, &new, Some(&old)),
            Verdict::default()
        );
        // Even an otherwise invalid edit passes: deletion must never hang here.
        new.spec.platform = Some(PlatformSettings {
            gateway: Some(Gateway {
                http_node_port: 99,
                http_endpoint: None,
                route_url_pattern: None,
            }),
            ..Default::default()
        });
        assert_eq!(
            local(&s, &index, &Operation::Update, &new, Some(&old)),
            Verdict::default()
        );
        new.spec.version = Some("6.0.23".into());
        assert_eq!(
            denied_by(&local(&s, &index, &Operation::Update, &new, Some(&old))),
            Some("deleting")
        );
    }

    #[test]
    fn node_ports_must_be_in_range_and_free() {
        let s = Settings {
            node_port_range: (30000, 30999),
            ..settings()
        };
        let index = NodePortIndex::default();
        let v = local(
            &s,
            &index,
            &Operation::Create,
            &instance(Some("6.0.22"), 31000),
            None,
        );
        assert_eq!(denied_by(&v), Some("node-port-range"));

        index.set(
            Holder::Instance {
                namespace: "team-b".into(),
                name: "two".into(),
            },
            vec![30080],
        );
        let v = local(
            &s,
            &index,
            &Operation::Create,
            &instance(Some("6.0.22"), 30080),
            None,
        );
        assert_eq!(denied_by(&v), Some("node-port-conflict"));
        assert!(
            v.denial
                .is_some_and(|d| d.message.contains("PlatformInstance team-b/two"))
        );

        // Its own entry and the Services in its own host namespace do not conflict.
        index.set(
            Holder::Instance {
                namespace: "team-a".into(),
                name: "one".into(),
            },
            vec![30090],
        );
        // Nor one in the host namespace it kept from an earlier release.
        for host in [
            host_namespace("team-a", "one"),
            legacy_host_namespace("team-a", "one"),
        ] {
            index.set(
                Holder::Service {
                    namespace: host,
                    name: "gateway".into(),
                },
                vec![30090],
            );
            let v = local(
                &s,
                &index,
                &Operation::Update,
                &instance(Some("6.0.22"), 30090),
                Some(&instance(Some("6.0.22"), 30090)),
            );
            assert_eq!(v.denial, None);
        }
        index.set(
            Holder::Service {
                namespace: "default".into(),
                name: "web".into(),
            },
            vec![30091],
        );
        let v = local(
            &s,
            &index,
            &Operation::Create,
            &instance(Some("6.0.22"), 30091),
            None,
        );
        assert!(
            v.denial
                .is_some_and(|d| d.message.contains("Service default/web"))
        );
    }

    #[test]
    fn warnings_for_risky_choices() {
        let s = settings();
        let index = NodePortIndex::default();
        let mut pi = instance(Some("6.0.22"), 30080);
        pi.spec.deletion_policy = DeletionPolicy::Delete;
        if let Some(g) = pi.spec.platform.as_mut().and_then(|p| p.gateway.as_mut()) {
            g.http_endpoint = Some("http://apps.example:8080".into());
        }
        let v = local(&s, &index, &Operation::Create, &pi, None);
        let rules: Vec<&str> = v.warnings.iter().map(|w| w.rule).collect();
        assert_eq!(rules, ["endpoint-port", "route-pattern", "deletion-policy"]);
        let again = local(&s, &index, &Operation::Update, &pi, Some(&pi));
        let rules: Vec<&str> = again.warnings.iter().map(|w| w.rule).collect();
        assert_eq!(
            rules,
            ["endpoint-port", "route-pattern"],
            "an unchanged Delete policy is not re-warned"
        );
        if let Some(g) = pi.spec.platform.as_mut().and_then(|p| p.gateway.as_mut()) {
            g.route_url_pattern = Some("http://{route}.{tenant}.apps.example:8080/".into());
        }
        let given = local(&s, &index, &Operation::Update, &pi, Some(&pi));
        let rules: Vec<&str> = given.warnings.iter().map(|w| w.rule).collect();
        assert_eq!(
            rules,
            ["endpoint-port"],
            "a given pattern is not warned about"
        );
    }

    #[test]
    fn loopback_endpoints() {
        for url in [
            "http://127.0.0.1:28080",
            "http://127.1.2.3/",
            "http://localhost:8080",
            "https://apps.localhost",
            "http://[::1]:28080/",
            "HTTP://LOCALHOST:8080",
            "http://Apps.LocalHost/",
            "http://u@localhost",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "http://apps.example:30080",
            "http://127.example/",
            "http://10.0.0.1",
            "apps.example",
            "http://u@localhost.example/",
            "http://localhost.example",
            "http://xlocalhost/",
            "http://é.localhosté/",
            "http://ɫocalhost/",
            "http://[::2]/",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }

    #[test]
    fn a_url_splits_at_its_first_scheme_separator() {
        for url in [
            "http://a",
            "://",
            "x://y://z",
            "é://ü",
            "no scheme",
            "",
            ":/",
            "a:/b://c",
        ] {
            assert_eq!(split_scheme(url), url.split_once("://"), "{url}");
        }
    }

    #[test]
    fn endpoint_ports() {
        assert_eq!(endpoint_port("http://apps.example:30080"), Some(30080));
        assert_eq!(endpoint_port("http://apps.example"), Some(80));
        assert_eq!(endpoint_port("https://apps.example/x:1"), Some(443));
        assert_eq!(endpoint_port("https://u:p@apps.example:8443/"), Some(8443));
        assert_eq!(endpoint_port("apps.example"), None);
        assert_eq!(endpoint_port("http://[::1]:30080/"), Some(30080));
        assert_eq!(endpoint_port("https://[::1]/"), Some(443));
    }
}
