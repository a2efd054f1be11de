//! The `PlatformInstance` custom resource (`platform.di-framework.dev/v1alpha1`): its Rust types
//! and, through them, its OpenAPI schema with every structural and CEL rule, so that
//! `kubectl apply --server-side` rejects bad input even when the webhook is down.
//!
//! The doc comment of each field is its schema `description` (what `kubectl explain` prints).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Regular expression (RE2 and Rust `regex` compatible) for an exact semantic version:
/// `MAJOR.MINOR.PATCH` with an optional pre-release, no ranges, tags or build metadata.
pub const EXACT_VERSION_PATTERN: &str = r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?$";

/// Regular expression for an image reference pinned by digest: `<repository>[:tag]@sha256:<64 hex>`.
pub const DIGEST_IMAGE_PATTERN: &str = r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}$";

/// Regular expression for a DNS label (RFC 1123), used for tenant, user and role names.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A request for one isolated copy of the di-framework platform, at one exact version, on one target.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "platform.di-framework.dev",
    version = "v1alpha1",
    kind = "PlatformInstance",
    plural = "platforminstances",
    shortname = "pi",
    namespaced,
    status = "PlatformInstanceStatus",
    category = "di-framework",
    doc = "PlatformInstance asks the platform operator for one isolated copy of the di-framework platform (a vCluster with the platform installed into it) at one exact version.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Where the instance is in its lifecycle."}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version","description":"The requested @di-framework/platform version."}"#,
    printcolumn = r#"{"name":"Installed","type":"string","jsonPath":".status.installedVersion","description":"The version the last successful install applied."}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the instance is installed and serving."}"#,
    printcolumn = r#"{"name":"Suspended","type":"boolean","jsonPath":".spec.suspend","description":"Whether installs, upgrades, repairs and Helm runs are held (spec.suspend)."}"#,
    printcolumn = r#"{"name":"Upgrade","type":"string","jsonPath":".status.conditions[?(@.type==\"UpgradePending\")].reason","description":"UpgradePending while an upgrade waits for approval (spec.upgrade.approval: Manual), PreviewingUpgrade while it is previewed."}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.metadata.name.size() <= 242").message(
        "metadata.name must be at most 242 characters: the instance's kubeconfig Secret <name>-kubeconfig must fit in 253"
    ),
    validation = Rule::new(
        "!has(self.spec.platform) || !has(self.spec.platform.users) || self.spec.platform.users.all(u, !has(u.memberships) || u.memberships.all(m, self.metadata.name.size() + m.tenant.size() + u.name.size() <= 240))"
    ).message(
        "the membership kubeconfig Secret <name>.<tenant>.<user>.kubeconfig of some membership is longer than 253 characters: shorten metadata.name, the tenant or the user name"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PlatformInstanceSpec {
    /// The exact `@di-framework/platform` npm version to install, `MAJOR.MINOR.PATCH` with an
    /// optional pre-release (for example `6.0.22` or `6.1.0-rc.1`). Ranges and tags (`^6.0.0`,
    /// `~6`, `6.x`, `>=6`, `latest`) are rejected. Left out, the admission webhook sets the
    /// operator's default platform version. Changing it upgrades the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 5, max = 64))]
    #[x_kube(validation = Rule::new(format!("self.matches('{}')", cel_quote(EXACT_VERSION_PATTERN)))
        .message("must be an exact version MAJOR.MINOR.PATCH[-PRERELEASE], such as 6.0.22; ranges and tags (^6.0.0, ~6, 6.x, >=6, latest) are not allowed"))]
    pub version: Option<String>,

    /// Where the instance runs. v1alpha1 has one target type, `vcluster`.
    #[serde(default)]
    pub target: Target,

    /// Settings passed to the platform's existing-cluster program. Optional: left out, the
    /// platform's own defaults apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformSettings>,

    /// What happens to the instance's vCluster data and Pulumi state when the instance is
    /// deleted. `Retain` (the default) keeps the host namespace's storage and the state so nothing
    /// is lost by an accidental delete; `Delete` removes them, running a storage cleanup Job.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// `true` holds the instance as it is: no install, upgrade, repair or Helm run starts (one
    /// already running finishes) and work waiting for an install slot leaves the queue; deleting
    /// the instance is still honoured. The status reports `Suspended=True`. Setting it back to
    /// `false` (or removing it) resumes where the instance stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// What the repair tick (every `repairInterval`, a refreshing Pulumi preview of the installed
    /// version) does with the drift it finds. Left out: `mode: Repair`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<Repair>,

    /// Quotas for everything the instance's vCluster runs on the host (its control plane and
    /// every pod it syncs there): a ResourceQuota and a LimitRange `vc-vcluster` in the host
    /// namespace, set through the vCluster chart's own `policies` values. Left out, the operator's
    /// fleet-wide default applies (the chart value `defaultInstanceResources`), and
    /// with none, no quota. Changing it upgrades the vCluster's Helm release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<InstanceResources>,

    /// How a new `spec.version` is rolled out. Left out: `approval: Automatic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<Upgrade>,
}

/// How upgrades are rolled out.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Upgrade {
    /// `Automatic` (the default) upgrades as soon as `spec.version` changes; `Manual` first
    /// previews the new version against the running instance (`status.pendingUpgrade`, condition
    /// `UpgradePending`) and upgrades only once the annotation
    /// `platform.di-framework.dev/approve` equals the new version. Either way the Pulumi state
    /// is copied aside before the upgrade runs (`status.stateBackups`).
    #[serde(default)]
    pub approval: Approval,
}

/// Who starts an upgrade.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum Approval {
    /// Upgrade when `spec.version` changes.
    #[default]
    Automatic,
    /// Preview, then wait for the approve annotation.
    Manual,
}

/// What an upgrade waiting for approval would change, from a Pulumi preview of the new version
/// against the running instance.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PendingUpgrade {
    /// The version previewed; approve it with the annotation
    /// `platform.di-framework.dev/approve: <version>`.
    #[schemars(length(max = 64))]
    pub version: String,
    /// Resources the upgrade would create.
    pub create: i64,
    /// Resources it would update (or replace).
    pub update: i64,
    /// Resources it would delete.
    pub delete: i64,
    /// The first ten resources it would change, as `<operation> <type> <name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub resources: Vec<String>,
    /// Why the preview failed, when it did (the upgrade can still be approved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the preview finished.
    pub previewed_at: Time,
}

/// The most state backups kept (`status.stateBackups`).
pub const STATE_BACKUP_LIMIT: usize = 3;

/// A copy of the instance's Pulumi state taken before an upgrade.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StateBackup {
    /// The copy's folder on the operator's state volume (the project's `Pulumi.dev.yaml` and the
    /// backend folder `state/`), restored as `docs/operations.md` shows.
    #[schemars(length(max = 512))]
    pub path: String,
    /// The version installed when it was taken (the version it rolls back to).
    #[schemars(length(max = 64))]
    pub version: String,
    /// The version the upgrade that followed installed.
    #[schemars(length(max = 64))]
    pub upgrade_to: String,
    /// When it was taken.
    pub taken_at: Time,
}

/// Resource name to quantity (`cpu: 500m`, `count/pods: 50`), as a ResourceQuota or LimitRange
/// takes them; a quantity may be written as a number or a string.
pub type Quantities = BTreeMap<String, Amount>;

/// A Kubernetes quantity, such as `500m`, `4` or `16Gi` (a number or a string).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(transparent)]
pub struct Amount(pub Quantity);

impl schemars::JsonSchema for Amount {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Amount".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A quantity, such as 500m, 4 or 16Gi.",
            "x-kubernetes-int-or-string": true,
            "maxLength": 64,
        })
    }
}

/// A ResourceQuota and a LimitRange for what an instance's vCluster runs on the host.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceResources {
    /// The ResourceQuota's `spec.hard`: resource name to quantity, such as `requests.cpu: 4`,
    /// `limits.memory: 16Gi`, `count/pods: 50`. Exactly these (none of the chart's example
    /// quota). Left out, no ResourceQuota. A quota on `requests.*` or `limits.*` refuses pods
    /// that set none: give `limitRange.defaultRequest` and `limitRange.default` with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = quantities_rule(), validation = names_rule())]
    #[schemars(extend("maxProperties" = 32, "minProperties" = 1))]
    pub quota: Option<Quantities>,

    /// The LimitRange for containers. Left out, no LimitRange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_range: Option<LimitRange>,
}

/// A LimitRange for containers: each a map of resource name (`cpu`, `memory`,
/// `ephemeral-storage`) to quantity; exactly these are set (none of the chart's examples).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LimitRange {
    /// The limits a container gets when it sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = quantities_rule(), validation = names_rule())]
    #[schemars(extend("maxProperties" = 8))]
    pub default: Option<Quantities>,
    /// The requests a container gets when it sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = quantities_rule(), validation = names_rule())]
    #[schemars(extend("maxProperties" = 8))]
    pub default_request: Option<Quantities>,
    /// The least a container may ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = quantities_rule(), validation = names_rule())]
    #[schemars(extend("maxProperties" = 8))]
    pub min: Option<Quantities>,
    /// The most a container may ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = quantities_rule(), validation = names_rule())]
    #[schemars(extend("maxProperties" = 8))]
    pub max: Option<Quantities>,
}

/// What the repair tick does.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Repair {
    /// `Repair` (the default) previews and puts drift back with an install at the installed
    /// version; `Warn` previews only: `DriftDetected=True` names how many resources would change
    /// and which, with a Warning Event, and nothing is changed; `Off` runs no preview.
    #[serde(default)]
    pub mode: RepairMode,
}

/// What the repair tick does with drift.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum RepairMode {
    /// Preview, and put drift back.
    #[default]
    Repair,
    /// Preview and report drift; change nothing.
    Warn,
    /// No preview.
    Off,
}

/// Where an instance runs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The target type: `vcluster`, a vCluster in a host namespace of the operator's own cluster.
    /// Immutable once set.
    #[serde(rename = "type", default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("is immutable: delete and re-create the instance to change it"))]
    pub type_: TargetType,
}

/// The kinds of target an instance can run on.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum TargetType {
    /// A vCluster in a host namespace of the operator's own cluster.
    #[default]
    #[serde(rename = "vcluster")]
    VCluster,
}

/// What deleting an instance does to its data.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum DeletionPolicy {
    /// Keep storage and state.
    #[default]
    Retain,
    /// Remove storage and state.
    Delete,
}

/// The platform program's settings for one instance.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.users) || self.users.all(u, !has(u.memberships) || u.memberships.all(m, has(self.tenants) && self.tenants.exists(t, t.name == m.tenant)))"
).message("every users[].memberships[].tenant must name a tenant declared in spec.platform.tenants: add the tenant or fix the membership").field_path(".users"))]
pub struct PlatformSettings {
    /// Which NetworkPolicy engine the platform relies on: `existing` (the default) uses the one the
    /// host cluster already enforces; `kube-router` installs the platform's policy-only controller.
    #[serde(default)]
    pub network_policy_engine: NetworkPolicyEngine,

    /// How the platform's HTTP gateway is published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Gateway>,

    /// Tenants to provision: each gets its namespaces, runtime and backing services. Names are unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub tenants: Option<Vec<Tenant>>,

    /// Users and their tenant memberships; the platform issues one kubeconfig per membership.
    /// Names are unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub users: Option<Vec<User>>,

    /// The tenant console's OAuth login. The client secret is never inline: `clientSecretRef`
    /// names a Secret and key in the instance's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_auth: Option<TenantAuth>,

    /// Runtime image for tenant hosts, pinned by digest (`<repository>@sha256:<64 hex>`). Left
    /// out, the platform's own pinned image for its version applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = digest_rule())]
    pub tenant_host_image: Option<String>,

    /// Kubernetes pull policy for the tenant host image: `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_host_image_pull_policy: Option<PullPolicy>,

    /// Outbound destinations tenants may reach (host names, `host:port` or CIDRs, as the platform
    /// accepts them). Empty approves nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 253), regex(pattern = r"^\S+$"))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub egress_allowed_destinations: Option<Vec<String>>,
}

/// NetworkPolicy engines the platform supports.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum NetworkPolicyEngine {
    /// Use the NetworkPolicy engine the cluster already has.
    #[default]
    #[serde(rename = "existing")]
    Existing,
    /// Install kube-router in policy-only mode.
    #[serde(rename = "kube-router")]
    KubeRouter,
}

/// Kubernetes image pull policies.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when the node lacks the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// The platform's HTTP gateway.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Gateway {
    /// NodePort that publishes the gateway on the host cluster: 0 (the default) keeps it inside
    /// the instance; otherwise a port in 30000-32767 not used by any other Service.
    #[serde(default)]
    #[schemars(range(min = 0, max = 32767))]
    #[x_kube(validation = Rule::new("self == 0 || (self >= 30000 && self <= 32767)")
        .message("must be 0 (not published) or a NodePort in 30000-32767"))]
    pub http_node_port: i32,

    /// Public base URL of the gateway, an absolute `http://` or `https://` URL such as
    /// `http://apps.example:30080`. Reported in `status.endpoints.http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = url_rule(&["http", "https"]))]
    pub http_endpoint: Option<String>,

    /// The URL template of tenant routes, passed to the platform as its `routeUrlPattern`
    /// setting: an absolute `http://` or `https://` URL holding both `{route}` and `{tenant}`,
    /// such as `https://{route}.{tenant}.apps.example/`. The platform derives it from a loopback
    /// `httpEndpoint`; set it when `httpEndpoint` is not a loopback URL. Reported in
    /// `status.endpoints.routeUrlPattern`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new(
        "self.matches('^https?://[^/?#]+') && self.contains('{route}') && self.contains('{tenant}')"
    )
    .message("must be an absolute http:// or https:// URL holding {route} and {tenant}, such as https://{route}.{tenant}.apps.example/"))]
    pub route_url_pattern: Option<String>,
}

/// A tenant of the platform.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Tenant {
    /// The tenant's name, a DNS label (lower-case letters, digits and `-`, at most 40 characters).
    #[schemars(length(min = 1, max = 40), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
}

/// A user of the platform and the tenants they belong to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// The user's name, a DNS label (at most 40 characters).
    #[schemars(length(min = 1, max = 40), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,

    /// The tenants this user belongs to, each with one role; each must name a tenant declared
    /// in `spec.platform.tenants`. One membership per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["tenant".into()]))]
    pub memberships: Option<Vec<Membership>>,
}

/// A user's role in one tenant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Membership {
    /// The tenant, by name; it must be declared in `spec.platform.tenants`.
    #[schemars(length(min = 1, max = 40), regex(pattern = DNS_LABEL_PATTERN))]
    pub tenant: String,

    /// The user's role in that tenant, as the platform names roles (for example `developer`).
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub role: String,
}

/// The tenant console's OAuth login.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantAuth {
    /// The tenant-auth image, pinned by digest (`<repository>@sha256:<64 hex>`).
    #[schemars(length(max = 512))]
    #[x_kube(validation = digest_rule())]
    pub image: String,

    /// The OpenID Connect issuer, an absolute `https://` URL such as `https://id.example`.
    #[schemars(length(max = 2048))]
    #[x_kube(validation = url_rule(&["https"]))]
    pub issuer: String,

    /// The console's OAuth client ID at the issuer.
    #[schemars(length(min = 1, max = 256))]
    pub client_id: String,

    /// The Secret and key, in the instance's namespace, that hold the OAuth client secret. The
    /// requester must be allowed to read that Secret.
    pub client_secret_ref: SecretKeyRef,

    /// The tenant OCI registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<Registry>,
}

/// The tenant OCI registry.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Registry {
    /// The registry component image, pinned by digest (`<repository>@sha256:<64 hex>`).
    #[schemars(length(max = 512))]
    #[x_kube(validation = digest_rule())]
    pub component: String,
}

/// A key of a Secret in the instance's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name, in the instance's namespace.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,

    /// The key inside the Secret's data.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// Where an instance is in its lifecycle.
#[derive(
    schemars::JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
pub enum Phase {
    /// Accepted, not yet worked on (or queued).
    Pending,
    /// Host namespace and vCluster coming up.
    Provisioning,
    /// The platform program is being installed.
    Installing,
    /// Installed and serving.
    Ready,
    /// A new version is being installed.
    Upgrading,
    /// Stopped on an error that needs a change.
    Failed,
    /// Being deleted.
    Deleting,
}

impl Phase {
    /// Every phase, in lifecycle order (the variants, as strum lists them).
    pub const ALL: &'static [Phase] = <Phase as strum::VariantArray>::VARIANTS;

    /// The phase as `status.phase` spells it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The observed state of an instance, written by the controller only.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PlatformInstanceStatus {
    /// Where the instance is in its lifecycle: `Pending`, `Provisioning`, `Installing`, `Ready`,
    /// `Upgrading`, `Failed` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The platform version requested by the spec the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// The platform version of the last successful install; kept at the old version while an
    /// upgrade runs or after it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_version: Option<String>,

    /// The host namespace holding the instance's vCluster, `pi-<namespace>-<name>-<hash>` (a
    /// 64-bit hash; an instance created by an earlier release keeps its 32-bit one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_namespace: Option<String>,

    /// The Secret, in the instance's namespace, holding the instance's admin kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<SecretKeyRef>,

    /// The instance's published endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,

    /// Conditions: kstatus `Ready`, `Reconciling` and `Stalled`, and detail conditions, one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// What the last install applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_install: Option<LastInstall>,

    /// The value of the `platform.di-framework.dev/retry` annotation the controller last acted on:
    /// setting that annotation to a new value asks for an immediate retry, and this field
    /// acknowledges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub acknowledged_retry: Option<String>,

    /// Failed runs in a row (installs, upgrades, repairs or Helm runs) of the failure the
    /// conditions report, at `observedGeneration`; absent once a run succeeds. At the controller's
    /// `--max-retries` the instance stops retrying (`Stalled=True`, reason `RetriesExhausted`)
    /// until the spec changes or the retry annotation is set to a new value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u32>,

    /// The last five installs, upgrades, re-applies and repairs, newest first (what each ran, how
    /// it ended and what it applied), kept in the installer's record on the state volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub history: Vec<HistoryEntry>,

    /// When the controller runs the failed install, upgrade, repair or Helm run again (capped
    /// exponential backoff: 5 s doubling to 5 min); absent when no retry waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry_at: Option<Time>,

    /// The upgrade waiting for approval (`spec.upgrade.approval: Manual`): what a preview of the
    /// new version found. Absent when none waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_upgrade: Option<PendingUpgrade>,

    /// The copies of the Pulumi state taken before each upgrade, newest first (the last three).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub state_backups: Vec<StateBackup>,
}

/// The instance's published endpoints.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    /// The gateway's public base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,

    /// The platform's URL template for tenant routes, such as `http://<route-host>.<tenant>.localhost:28080/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_url_pattern: Option<String>,
}

/// The outcome of an install.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstallResult {
    /// Still running.
    Running,
    /// Applied without error.
    Succeeded,
    /// Stopped on an error.
    Failed,
    /// Stopped after the install timeout.
    TimedOut,
}

/// What the last install applied.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastInstall {
    /// The platform version the install ran.
    pub version: String,

    /// When the install started.
    pub started_at: Time,

    /// When the install finished; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,

    /// The outcome: `Running`, `Succeeded`, `Failed` or `TimedOut`.
    pub result: InstallResult,

    /// A one-line account of the outcome, or of the error and how to fix it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// A summary of the resources the install applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<InstallSummary>,
}

/// The most runs `status.history` keeps.
pub const HISTORY_LIMIT: usize = 5;

/// Why an install ran.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstallKind {
    /// The first install.
    Install,
    /// A new `spec.version`.
    Upgrade,
    /// Changed settings at the installed version.
    Reapply,
    /// Drift, an interrupted run or a request put back at the installed version.
    Repair,
}

/// One run of the platform program, as `status.history` keeps it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// Why it ran: `Install`, `Upgrade`, `Reapply` or `Repair`.
    pub kind: InstallKind,

    /// The platform version it ran.
    #[schemars(length(max = 64))]
    pub version: String,

    /// How it ended: `Succeeded`, `Failed` or `TimedOut`.
    pub result: InstallResult,

    /// When it started.
    pub started_at: Time,

    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,

    /// SHA-256 of the configuration it was given (secret values excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 80))]
    pub config_hash: Option<String>,

    /// The resources it created, updated, deleted and left unchanged (when it succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<InstallSummary>,
}

/// Resource counts and the configuration of one install.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstallSummary {
    /// Resources created.
    #[serde(default)]
    pub created: i64,
    /// Resources updated.
    #[serde(default)]
    pub updated: i64,
    /// Resources deleted.
    #[serde(default)]
    pub deleted: i64,
    /// Resources left unchanged.
    #[serde(default)]
    pub unchanged: i64,
    /// SHA-256 of the applied configuration (secret values excluded), to tell installs apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
}

/// The CEL rule that each value of a map is a Kubernetes quantity (`500m`, `4`, `16Gi`).
fn quantities_rule() -> kube::core::Rule {
    kube::core::Rule::new("self.all(k, isQuantity(string(self[k])))")
        .message("each value must be a quantity, such as 500m, 4 or 16Gi")
}

/// The CEL rule that each key of a map is a resource name (`requests.cpu`, `count/pods`).
fn names_rule() -> kube::core::Rule {
    kube::core::Rule::new(
        "self.all(k, k.matches('^[A-Za-z0-9]([-A-Za-z0-9_./]{0,61}[A-Za-z0-9])?$'))",
    )
    .message(
        "each key must be a resource name, such as requests.cpu, limits.memory, count/pods or cpu",
    )
}

/// Quotes a regular expression for use inside a single-quoted CEL string literal.
fn cel_quote(pattern: &str) -> String {
    pattern.replace('\\', "\\\\").replace('\'', "\\'")
}

/// The CEL rule that an image string is pinned by digest.
fn digest_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "self.matches('{}')",
        cel_quote(DIGEST_IMAGE_PATTERN)
    ))
    .message(
        "must pin the image by digest, <repository>@sha256:<64 hex>; a tag alone is not allowed",
    )
}

/// The CEL rule that a string is an absolute URL with one of `schemes` and a host.
fn url_rule(schemes: &[&str]) -> kube::core::Rule {
    let list = schemes
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let shown = schemes
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(" or ");
    kube::core::Rule::new(format!(
        "isURL(self) && url(self).getScheme() in [{list}] && url(self).getHostname() != ''"
    ))
    .message(kube::core::Message::Message(format!(
        "must be an absolute {shown} URL with a host, such as {}://apps.example",
        schemes[0]
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_names_are_the_serialized_ones() {
        for phase in Phase::ALL {
            assert_eq!(
                serde_json::to_value(phase).expect("json"),
                phase.as_str(),
                "{phase:?}"
            );
        }
    }
}
