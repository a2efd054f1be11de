//! Borrowed views of an admission review: only the fields the rules read, with their strings
//! borrowed from the request body where they carry no escapes, and everything else skipped
//! (`IgnoredAny`: scanned for well-formed JSON, never kept).
//!
//! A review of a PlatformInstance with 32 tenants and 128 users is mostly tenants and users, which
//! no rule reads; reading them into typed values cost one heap allocation per string and list.
//! Each view mirrors its typed counterpart in `common::crd` (the same JSON names, in the same
//! order, with the same defaults and required fields), so a review is read the same way: the
//! fields the rules read have the same types and the same error messages, and a field the typed
//! `PlatformInstance` requires is required here too. What a view does not check is the type of a
//! field no rule reads (the tenants, users, images, the status beyond `installedVersion`): the API
//! server's schema validation checks those, before the validating webhook is called and right
//! after the mutating one. [`Instance::from`] builds the view of a typed instance, which the tests
//! use to compare this path with the typed one.

use std::borrow::Cow;

use common::crd::{DeletionPolicy, PlatformInstance};
use common::names::ALLOW_DOWNGRADE_ANNOTATION;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::admission::Operation;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// A JSON string, borrowed from the body unless it had to be unescaped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Text<'_> {
    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same string, owning its bytes.
    pub fn into_owned(self) -> Text<'static> {
        Text(Cow::Owned(self.0.into_owned()))
    }
}

impl<'a> From<&'a str> for Text<'a> {
    fn from(s: &'a str) -> Self {
        Text(Cow::Borrowed(s))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            // As `String`'s, so that a wrong type is reported in the same words.
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

fn owned(text: Option<Text<'_>>) -> Option<Text<'static>> {
    text.map(Text::into_owned)
}

fn borrowed(text: Option<&String>) -> Option<Text<'_>> {
    text.map(|s| Text::from(s.as_str()))
}

/// An `AdmissionReview` as sent: its type and its request.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Review<'a> {
    /// `apiVersion` (empty when absent).
    #[serde(default, borrow)]
    pub api_version: Text<'a>,
    /// `kind` (empty when absent).
    #[serde(default, borrow)]
    pub kind: Text<'a>,
    /// The request (only read from a JSON object or null).
    #[serde(default, borrow, deserialize_with = "object_only")]
    pub request: Option<Request<'a>>,
}

impl Default for Text<'_> {
    fn default() -> Self {
        Text(Cow::Borrowed(""))
    }
}

/// Reads a value only from a JSON object (or null, as `None`): serde's derived structs would also
/// take a positional array, and a uid read from one is not the request's.
pub fn object_only<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
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

/// The `request` of a review, as `kube::core::admission::AdmissionRequest` reads it, with views
/// of the objects.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    /// The request's uid, copied into the answer.
    #[serde(borrow)]
    pub uid: Text<'a>,
    #[serde(borrow, rename = "kind")]
    _kind: Gvk<'a>,
    #[serde(borrow, rename = "resource")]
    _resource: Gvr<'a>,
    #[serde(default, borrow, rename = "subResource")]
    _sub_resource: Option<Text<'a>>,
    #[serde(default, borrow, rename = "requestKind")]
    _request_kind: Option<Gvk<'a>>,
    #[serde(default, borrow, rename = "requestResource")]
    _request_resource: Option<Gvr<'a>>,
    #[serde(default, borrow, rename = "requestSubResource")]
    _request_sub_resource: Option<Text<'a>>,
    /// The object's name (for logs).
    #[serde(default, borrow)]
    pub name: Text<'a>,
    /// The object's namespace (for logs).
    #[serde(default, borrow)]
    pub namespace: Option<Text<'a>>,
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: Operation,
    /// Who asks (for the SubjectAccessReview of the Secret rule).
    pub user_info: UserInfo,
    /// The object as it would be stored.
    #[serde(borrow)]
    pub object: Option<Instance<'a>>,
    /// The stored object, on UPDATE.
    #[serde(borrow)]
    pub old_object: Option<Instance<'a>>,
    #[serde(default, rename = "dryRun")]
    _dry_run: bool,
    #[serde(default, rename = "options")]
    _options: Option<IgnoredAny>,
}

impl Request<'_> {
    /// The same request, owning its strings (a few: only the fields the rules read are kept).
    pub fn into_owned(self) -> Request<'static> {
        Request {
            uid: self.uid.into_owned(),
            _kind: self._kind.into_owned(),
            _resource: self._resource.into_owned(),
            _sub_resource: owned(self._sub_resource),
            _request_kind: self._request_kind.map(Gvk::into_owned),
            _request_resource: self._request_resource.map(Gvr::into_owned),
            _request_sub_resource: owned(self._request_sub_resource),
            name: self.name.into_owned(),
            namespace: owned(self.namespace),
            operation: self.operation,
            user_info: self.user_info,
            object: self.object.map(Instance::into_owned),
            old_object: self.old_object.map(Instance::into_owned),
            _dry_run: self._dry_run,
            _options: self._options,
        }
    }
}

/// A group, version and kind (`request.kind`, `request.requestKind`), read as kube's
/// `GroupVersionKind` reads it (the same fields, all required, and the same messages), with its
/// strings borrowed; no rule reads it.
#[derive(Deserialize)]
#[serde(rename = "GroupVersionKind")]
struct Gvk<'a> {
    #[serde(borrow, rename = "group")]
    _group: Text<'a>,
    #[serde(borrow, rename = "version")]
    _version: Text<'a>,
    #[serde(borrow, rename = "kind")]
    _kind: Text<'a>,
}

impl Gvk<'_> {
    fn into_owned(self) -> Gvk<'static> {
        Gvk {
            _group: self._group.into_owned(),
            _version: self._version.into_owned(),
            _kind: self._kind.into_owned(),
        }
    }
}

/// A group, version and resource (`request.resource`, `request.requestResource`), read as kube's
/// `GroupVersionResource` reads it (its three required fields and its optional `api_version`),
/// with its strings borrowed; no rule reads it.
#[derive(Deserialize)]
#[serde(rename = "GroupVersionResource")]
struct Gvr<'a> {
    #[serde(borrow, rename = "group")]
    _group: Text<'a>,
    #[serde(borrow, rename = "version")]
    _version: Text<'a>,
    #[serde(borrow, rename = "resource")]
    _resource: Text<'a>,
    #[serde(default, borrow, rename = "api_version")]
    _api_version: Text<'a>,
}

impl Gvr<'_> {
    fn into_owned(self) -> Gvr<'static> {
        Gvr {
            _group: self._group.into_owned(),
            _version: self._version.into_owned(),
            _resource: self._resource.into_owned(),
            _api_version: self._api_version.into_owned(),
        }
    }
}

/// What the rules read of a PlatformInstance.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Instance<'a> {
    /// Its metadata.
    #[serde(borrow)]
    pub metadata: Meta<'a>,
    /// Its spec.
    #[serde(borrow, deserialize_with = "spec")]
    pub spec: Spec<'a>,
    /// Its status.
    #[serde(default, borrow)]
    pub status: Option<Status<'a>>,
}

impl Instance<'_> {
    /// The same view, owning its strings.
    pub fn into_owned(self) -> Instance<'static> {
        Instance {
            metadata: Meta {
                name: owned(self.metadata.name),
                generate_name: owned(self.metadata.generate_name),
                namespace: owned(self.metadata.namespace),
                annotations: self.metadata.annotations.map(|a| Annotations {
                    allow_downgrade: owned(a.allow_downgrade),
                }),
                deletion_timestamp: self.metadata.deletion_timestamp,
            },
            spec: Spec {
                version: owned(self.spec.version),
                _target: IgnoredAny,
                platform: self.spec.platform.map(|p| Platform {
                    _network_policy_engine: IgnoredAny,
                    gateway: p.gateway.map(|g| Gateway {
                        http_node_port: g.http_node_port,
                        http_endpoint: owned(g.http_endpoint),
                        route_url_pattern: owned(g.route_url_pattern),
                    }),
                    _tenants: IgnoredAny,
                    _users: IgnoredAny,
                    tenant_auth: p.tenant_auth.map(|t| TenantAuth {
                        _image: IgnoredAny,
                        _issuer: IgnoredAny,
                        _client_id: IgnoredAny,
                        client_secret_ref: SecretRef {
                            name: t.client_secret_ref.name.into_owned(),
                            key: t.client_secret_ref.key.into_owned(),
                        },
                        _registry: IgnoredAny,
                    }),
                    _tenant_host_image: IgnoredAny,
                    _tenant_host_image_pull_policy: IgnoredAny,
                    _egress_allowed_destinations: IgnoredAny,
                }),
                deletion_policy: self.spec.deletion_policy,
                is_object: self.spec.is_object,
            },
            status: self.status.map(|s| Status {
                installed_version: owned(s.installed_version),
                ..Status::default()
            }),
        }
    }

    /// `metadata.namespace`, or empty.
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_ref().map_or("", Text::as_str)
    }

    /// `metadata.name`, else `metadata.generateName`, else empty (as `ResourceExt::name_any`).
    pub fn name_any(&self) -> &str {
        self.metadata
            .name
            .as_ref()
            .or(self.metadata.generate_name.as_ref())
            .map_or("", Text::as_str)
    }

    /// The value of the allow-downgrade annotation, if set.
    pub fn allow_downgrade(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.allow_downgrade.as_ref())
            .map(Text::as_str)
    }

    /// `status.installedVersion`, if set.
    pub fn installed_version(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.installed_version.as_ref())
            .map(Text::as_str)
    }
}

impl<'a> From<&'a PlatformInstance> for Instance<'a> {
    fn from(pi: &'a PlatformInstance) -> Self {
        let meta = &pi.metadata;
        let spec = &pi.spec;
        Instance {
            metadata: Meta {
                name: borrowed(meta.name.as_ref()),
                generate_name: borrowed(meta.generate_name.as_ref()),
                namespace: borrowed(meta.namespace.as_ref()),
                annotations: meta.annotations.as_ref().map(|a| Annotations {
                    allow_downgrade: borrowed(a.get(ALLOW_DOWNGRADE_ANNOTATION)),
                }),
                deletion_timestamp: meta.deletion_timestamp.clone(),
            },
            spec: Spec {
                version: borrowed(spec.version.as_ref()),
                _target: IgnoredAny,
                platform: spec.platform.as_ref().map(|p| Platform {
                    _network_policy_engine: IgnoredAny,
                    gateway: p.gateway.as_ref().map(|g| Gateway {
                        http_node_port: g.http_node_port,
                        http_endpoint: borrowed(g.http_endpoint.as_ref()),
                        route_url_pattern: borrowed(g.route_url_pattern.as_ref()),
                    }),
                    _tenants: IgnoredAny,
                    _users: IgnoredAny,
                    tenant_auth: p.tenant_auth.as_ref().map(|t| TenantAuth {
                        _image: IgnoredAny,
                        _issuer: IgnoredAny,
                        _client_id: IgnoredAny,
                        client_secret_ref: SecretRef {
                            name: Text::from(t.client_secret_ref.name.as_str()),
                            key: Text::from(t.client_secret_ref.key.as_str()),
                        },
                        _registry: IgnoredAny,
                    }),
                    _tenant_host_image: IgnoredAny,
                    _tenant_host_image_pull_policy: IgnoredAny,
                    _egress_allowed_destinations: IgnoredAny,
                }),
                deletion_policy: spec.deletion_policy,
                is_object: true,
            },
            status: pi.status.as_ref().map(|s| Status {
                installed_version: borrowed(s.installed_version.as_ref()),
                ..Status::default()
            }),
        }
    }
}

/// What the rules read of `metadata` (`ObjectMeta`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta<'a> {
    /// `name`.
    #[serde(default, borrow)]
    pub name: Option<Text<'a>>,
    /// `generateName`.
    #[serde(default, borrow)]
    pub generate_name: Option<Text<'a>>,
    /// `namespace`.
    #[serde(default, borrow)]
    pub namespace: Option<Text<'a>>,
    /// `annotations`, of which only the allow-downgrade one is kept.
    #[serde(default, borrow)]
    pub annotations: Option<Annotations<'a>>,
    /// `deletionTimestamp`.
    #[serde(default)]
    pub deletion_timestamp: Option<Time>,
}

/// `metadata.annotations`: a map of strings, of which only the allow-downgrade value is kept
/// (the last one, where a key repeats, as a map keeps it).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Annotations<'a> {
    /// The value of `platform.di-framework.dev/allow-downgrade`.
    pub allow_downgrade: Option<Text<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Annotations<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Annotations<'de>;
            // As `BTreeMap`'s, so that a wrong type is reported in the same words.
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Annotations<'de>, A::Error> {
                let mut found = Annotations::default();
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    let value = map.next_value::<Text<'de>>()?;
                    if key.as_str() == ALLOW_DOWNGRADE_ANNOTATION {
                        found.allow_downgrade = Some(value);
                    }
                }
                Ok(found)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// What the rules read of `spec`, in the order of `PlatformInstanceSpec`'s fields.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec<'a> {
    /// `version`.
    #[serde(default, borrow)]
    pub version: Option<Text<'a>>,
    #[serde(default, rename = "target")]
    _target: IgnoredAny,
    /// `platform`.
    #[serde(default, borrow)]
    pub platform: Option<Platform<'a>>,
    /// `deletionPolicy`.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Whether `spec` was a JSON object (serde also reads a struct from a positional array, to
    /// which a JSON Patch adding `/spec/version` would not apply).
    #[serde(skip)]
    pub is_object: bool,
}

impl Spec<'_> {
    /// `version`, if set.
    pub fn version(&self) -> Option<&str> {
        self.version.as_ref().map(Text::as_str)
    }
}

/// Reads `spec` from an object (or, as serde's derived structs do, a positional array), noting
/// which.
fn spec<'de: 'a, 'a, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Spec<'a>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Spec<'de>;
        // As the derived `PlatformInstanceSpec`'s.
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("struct PlatformInstanceSpec")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Spec<'de>, A::Error> {
            let mut spec = Spec::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
            spec.is_object = true;
            Ok(spec)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Spec<'de>, A::Error> {
            Spec::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
        }
    }
    deserializer.deserialize_any(Visitor)
}

/// What the rules read of `spec.platform`, in the order of `PlatformSettings`' fields.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Platform<'a> {
    #[serde(default, rename = "networkPolicyEngine")]
    _network_policy_engine: IgnoredAny,
    /// `gateway`.
    #[serde(default, borrow)]
    pub gateway: Option<Gateway<'a>>,
    #[serde(default, rename = "tenants")]
    _tenants: IgnoredAny,
    #[serde(default, rename = "users")]
    _users: IgnoredAny,
    /// `tenantAuth`.
    #[serde(default, borrow)]
    pub tenant_auth: Option<TenantAuth<'a>>,
    #[serde(default, rename = "tenantHostImage")]
    _tenant_host_image: IgnoredAny,
    #[serde(default, rename = "tenantHostImagePullPolicy")]
    _tenant_host_image_pull_policy: IgnoredAny,
    #[serde(default, rename = "egressAllowedDestinations")]
    _egress_allowed_destinations: IgnoredAny,
}

/// `spec.platform.gateway`, in the order of `Gateway`'s fields.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gateway<'a> {
    /// `httpNodePort` (0 when absent).
    #[serde(default)]
    pub http_node_port: i32,
    /// `httpEndpoint`.
    #[serde(default, borrow)]
    pub http_endpoint: Option<Text<'a>>,
    /// `routeUrlPattern`.
    #[serde(default, borrow)]
    pub route_url_pattern: Option<Text<'a>>,
}

/// What the rules read of `spec.platform.tenantAuth`, in the order of `TenantAuth`'s fields (the
/// required ones are required here too).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantAuth<'a> {
    #[serde(rename = "image")]
    _image: IgnoredAny,
    #[serde(rename = "issuer")]
    _issuer: IgnoredAny,
    #[serde(rename = "clientId")]
    _client_id: IgnoredAny,
    /// `clientSecretRef`.
    #[serde(borrow)]
    pub client_secret_ref: SecretRef<'a>,
    #[serde(default, rename = "registry")]
    _registry: IgnoredAny,
}

/// A Secret key reference (`SecretKeyRef`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SecretRef<'a> {
    /// The Secret's name.
    #[serde(borrow)]
    pub name: Text<'a>,
    /// The key.
    #[serde(borrow)]
    pub key: Text<'a>,
}

/// What the rules read of `status`, in the order of `PlatformInstanceStatus`' fields.
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status<'a> {
    #[serde(default, rename = "phase")]
    _phase: IgnoredAny,
    #[serde(default, rename = "observedGeneration")]
    _observed_generation: IgnoredAny,
    #[serde(default, rename = "version")]
    _version: IgnoredAny,
    /// `installedVersion`.
    #[serde(default, borrow)]
    pub installed_version: Option<Text<'a>>,
    #[serde(default, rename = "hostNamespace")]
    _host_namespace: IgnoredAny,
    #[serde(default, rename = "kubeconfigSecretRef")]
    _kubeconfig_secret_ref: IgnoredAny,
    #[serde(default, rename = "endpoints")]
    _endpoints: IgnoredAny,
    #[serde(default, rename = "conditions")]
    _conditions: IgnoredAny,
    #[serde(default, rename = "lastInstall")]
    _last_install: IgnoredAny,
    #[serde(default, rename = "acknowledgedRetry")]
    _acknowledged_retry: IgnoredAny,
}
