//! Watch caches of what [`super::observe`] reads, so that an idle reconcile makes no API call.
//!
//! One watch per kind, each narrowed by a label or field selector to what the controller made or
//! the vCluster chart renders (host namespaces, `networkpolicy/vcluster-api`, the Helm release
//! records, `service/vcluster`, `deployment/vcluster`, the exported kubeconfig `vc-vcluster`, the
//! instances' kubeconfig Secrets), indexed by `namespace/name` in one ordered map per kind. What
//! observe does not read is dropped before it is stored: managed fields always, and per kind the
//! rest. Each kind is kept in the form observe reads, not as a whole object: a compact record of
//! its metadata ([`Kept`]: the UID, the deletion time, only the labels and annotations observe
//! looks at, the owners' UIDs, read back as an object of its kind) for objects whose existence,
//! UID or marks are all that matter; of the Deployment only whether it rolled
//! out ([`Rollout`]); of the exported kubeconfig Secret only the kubeconfig, with its SHA-256
//! computed once, when the event arrives ([`Exported`], shared with each reconcile that reads it);
//! of the instances' own
//! kubeconfig Secrets their UID mark, owner references and the kubeconfig's SHA-256. A whole
//! Deployment with an empty pod template still took over 2 KiB per instance (its structs are
//! inline), and a map per namespace per kind a B-tree node of about 370 bytes for one object.
//!
//! A cache may be stale. [`super::reconcile`] therefore believes it only to conclude that
//! nothing is to be done: any action or status change is decided again from a fresh read of the
//! API server, and every write or delete keeps its own ownership check (a UID mark read at the
//! time, or a UID precondition). Until every watch has listed once ([`Caches::ready`]) the
//! reconciler reads the API server.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use common::names::{
    APPLIED_HASH_ANNOTATION, EXPORTED_KUBECONFIG_KEY, EXPORTED_KUBECONFIG_SECRET,
    HOST_NAMESPACE_LABEL, INSTANCE_ANNOTATION, INSTANCE_UID_LABEL, KUBECONFIG_KEY,
    MANAGED_BY_SELECTOR, OWNER_SERVICE_ANNOTATION, VCLUSTER, VCLUSTER_NETWORK_POLICY,
};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use super::vclusters::Exported;
use crate::helm::{CHART_VERSION_LABEL, RELEASE};

/// Objects of one kind in their stored form, by `namespace/name` (`/name` for cluster-scoped
/// ones): one ordered map, so that a namespace's objects are one range of it.
type Objects<S> = BTreeMap<String, Arc<S>>;

/// The key of `name` in `namespace` (neither holds a `/`).
fn key_of(namespace: &str, name: &str) -> String {
    let mut key = String::with_capacity(namespace.len() + 1 + name.len());
    key.push_str(namespace);
    key.push('/');
    key.push_str(name);
    key
}

/// The key of `object`.
fn key<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    key_of(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// One watched kind, each object in the form `S` observe reads, indexed by namespace and name.
pub struct Index<S> {
    objects: RwLock<Objects<S>>,
    listed: AtomicBool,
    /// A re-list in progress, until it is complete.
    pending: Mutex<Option<Objects<S>>>,
}

impl<S> Default for Index<S> {
    fn default() -> Self {
        Self {
            objects: RwLock::new(BTreeMap::new()),
            listed: AtomicBool::new(false),
            pending: Mutex::new(None),
        }
    }
}

/// One watch event with its object keyed and in its stored form.
type Stored<S> = Event<(String, Arc<S>)>;

impl<S> Index<S> {
    /// The object `name` in `namespace` (`""` for a cluster-scoped kind).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<S>> {
        self.objects
            .read()
            .ok()?
            .get(&key_of(namespace, name))
            .cloned()
    }

    /// Every object in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<S>> {
        // The keys of `namespace` are those from `namespace/` up to `namespace0` ('0' follows '/').
        let (from, to) = (format!("{namespace}/"), format!("{namespace}0"));
        self.objects
            .read()
            .map(|o| o.range(from..to).map(|(_, v)| v.clone()).collect())
            .unwrap_or_default()
    }

    /// How many objects are held.
    pub fn len(&self) -> usize {
        self.objects.read().map(|o| o.len()).unwrap_or(0)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The watch has listed every object once and has not failed since.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Applies one watch event (a re-list is held apart until it is complete).
    fn apply(&self, event: Stored<S>) {
        let (Ok(mut objects), Ok(mut pending)) = (self.objects.write(), self.pending.lock()) else {
            return;
        };
        match event {
            Event::Apply((key, object)) => {
                objects.insert(key, object);
            }
            Event::Delete((key, _)) => {
                objects.remove(&key);
            }
            Event::Init => *pending = Some(BTreeMap::new()),
            Event::InitApply((key, object)) => {
                pending
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, object);
            }
            Event::InitDone => {
                *objects = pending.take().unwrap_or_default();
                self.listed.store(true, Ordering::Release);
            }
        }
    }

    /// One event from a watch: trimmed, applied in its stored form (`store`), and passed on.
    fn take<K: Resource>(
        &self,
        what: &str,
        event: Result<Event<K>, watcher::Error>,
        trim: fn(&mut K),
        store: fn(&K) -> S,
    ) -> Taken<K> {
        match event {
            Ok(event) => {
                let keyed = |mut object: K| {
                    trim(&mut object);
                    let stored = (key(&object), Arc::new(store(&object)));
                    (object, stored)
                };
                let (touched, stored) = match event {
                    Event::Apply(o) => {
                        let (o, s) = keyed(o);
                        (Some(o), Event::Apply(s))
                    }
                    Event::Delete(o) => {
                        let (o, s) = keyed(o);
                        (Some(o), Event::Delete(s))
                    }
                    Event::InitApply(o) => {
                        let (o, s) = keyed(o);
                        (Some(o), Event::InitApply(s))
                    }
                    Event::Init => (None, Event::Init),
                    Event::InitDone => (None, Event::InitDone),
                };
                self.apply(stored);
                touched.map(Ok)
            }
            Err(e) => {
                // Until it has listed again, the reconciler reads the API server.
                self.listed.store(false, Ordering::Release);
                tracing::warn!(cache = what, error = %e, "watch failed; retrying with backoff (reconciles read the API server meanwhile)");
                Some(Err(e))
            }
        }
    }

    /// Feeds the index from `events` until the stream ends.
    async fn feed<K, E>(self: Arc<Self>, what: &'static str, events: E, keep: Keep<K, S>)
    where
        K: Resource,
        E: Stream<Item = Result<Event<K>, watcher::Error>>,
    {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let _ = self.take(what, event, keep.0, keep.1);
        }
    }

    /// The objects `events` touches, each applied to the index before it is passed on (so that
    /// a reconcile it wakes reads the cache with it): the controller's trigger for this kind.
    fn tee<K, E>(self: Arc<Self>, what: &'static str, events: E, keep: Keep<K, S>) -> Trigger<K>
    where
        K: Resource + Send + 'static,
        S: Send + Sync + 'static,
        E: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    {
        events
            .filter_map(move |event| std::future::ready(self.take(what, event, keep.0, keep.1)))
            .boxed()
    }
}

/// How a kind is kept: what is dropped from each object (also from the object passed on to the
/// controller), and the form stored.
type Keep<K, S> = (fn(&mut K), fn(&K) -> S);

/// What [`Index::take`] passes on: the object an event touched, or the watch's error.
type Taken<K> = Option<Result<K, watcher::Error>>;

/// The objects a watch touched, as the controller takes its triggers.
pub type Trigger<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// Keeps of `meta` only what observe reads: the name, namespace, UID, generation and deletion
/// time, the `labels` and `annotations` named, and (`owners`) the owner references.
fn keep_meta(meta: &mut ObjectMeta, labels: &[&str], annotations: &[&str], owners: bool) {
    fn only(map: &mut Option<BTreeMap<String, String>>, keys: &[&str]) {
        if let Some(m) = map.as_mut() {
            m.retain(|k, _| keys.contains(&k.as_str()));
        }
        if map.as_ref().is_some_and(BTreeMap::is_empty) {
            *map = None;
        }
    }
    only(&mut meta.labels, labels);
    only(&mut meta.annotations, annotations);
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.generate_name = None;
    meta.self_link = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    if !owners {
        meta.owner_references = None;
    }
}

/// Keeps only what an existence or UID check needs.
fn trim_partial<K>(object: &mut PartialObjectMeta<K>) {
    keep_meta(&mut object.metadata, &[], &[], false);
}

/// Keeps of a Helm release record the labels that say its revision, state and chart version.
fn trim_release(object: &mut PartialObjectMeta<Secret>) {
    keep_meta(
        &mut object.metadata,
        &["version", "status", CHART_VERSION_LABEL],
        &[],
        false,
    );
}

/// Keeps of a host namespace its owner's marks, its applied hash and the Service record.
fn trim_namespace(namespace: &mut Namespace) {
    keep_meta(
        &mut namespace.metadata,
        &[INSTANCE_UID_LABEL],
        &[
            INSTANCE_ANNOTATION,
            APPLIED_HASH_ANNOTATION,
            OWNER_SERVICE_ANNOTATION,
        ],
        false,
    );
    namespace.spec = None;
    namespace.status = None;
}

/// Drops the pod template and the labels of a Deployment passed on to the controller (which
/// reads its namespace).
fn trim_deployment(deployment: &mut Deployment) {
    keep_meta(&mut deployment.metadata, &[], &[], false);
    if let Some(spec) = deployment.spec.as_mut() {
        spec.template = Default::default();
        spec.selector = Default::default();
    }
    if let Some(status) = deployment.status.as_mut() {
        status.conditions = None;
    }
}

/// What the cache keeps of the control plane's Deployment: whether it rolled out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// [`super::control_plane::ready`] of the Deployment.
    pub ready: bool,
}

impl Rollout {
    fn of(deployment: &Deployment) -> Self {
        Self {
            ready: super::control_plane::ready(deployment),
        }
    }
}

/// What the caches keep of an object whose metadata is all observe reads (host namespaces,
/// `networkpolicy/vcluster-api`, `service/vcluster`, the Helm release records, the instances'
/// kubeconfig Secrets), after its kind's trim: its UID, its deletion time, the labels and
/// annotations the trim left, its owners' UIDs and, of a kubeconfig Secret, the SHA-256 of its
/// key. Read back as an object of its kind ([`FromKept`]), rebuilt per read. Kept whole, the trimmed
/// objects were about 5 KB per instance in a heap profile of a 200-instance run (an `ObjectMeta`
/// is 360 bytes before its strings, and by its layout a B-tree map's node for `String` keys and
/// values is about 540 bytes, however few labels it holds); with these records the controller's
/// anonymous memory at 1,000 instances was 3.8 MiB less (docs/benchmarks.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    uid: Option<Box<str>>,
    deletion: Option<Box<Time>>,
    labels: Box<[(Box<str>, Box<str>)]>,
    annotations: Box<[(Box<str>, Box<str>)]>,
    owners: Box<[Box<str>]>,
    digest: Option<Box<super::vclusters::Digest>>,
}

impl Kept {
    /// The kept form of `object` (already trimmed).
    fn of<K: Resource>(object: &K) -> Self {
        Self::of_meta(object.meta(), None)
    }

    /// The kept form of an instance's kubeconfig Secret (already trimmed: its key holds the
    /// kubeconfig's SHA-256).
    fn of_kubeconfig(secret: &Secret) -> Self {
        let digest = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .and_then(|v| <super::vclusters::Digest>::try_from(v.0.as_slice()).ok())
            .map(Box::new);
        Self::of_meta(&secret.metadata, digest)
    }

    fn of_meta(meta: &ObjectMeta, digest: Option<Box<super::vclusters::Digest>>) -> Self {
        let pairs = |map: &Option<BTreeMap<String, String>>| {
            map.iter()
                .flatten()
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect()
        };
        Self {
            uid: meta.uid.as_deref().map(Into::into),
            deletion: meta.deletion_timestamp.clone().map(Box::new),
            labels: pairs(&meta.labels),
            annotations: pairs(&meta.annotations),
            owners: meta
                .owner_references
                .iter()
                .flatten()
                .map(|r| r.uid.as_str().into())
                .collect(),
            digest,
        }
    }

    /// The metadata kept, as `name` in `namespace`: of each owner reference only its UID.
    fn meta(&self, namespace: &str, name: &str) -> ObjectMeta {
        let map = |pairs: &[(Box<str>, Box<str>)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
        };
        ObjectMeta {
            name: (!name.is_empty()).then(|| name.to_string()),
            namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
            uid: self.uid.as_deref().map(str::to_string),
            deletion_timestamp: self.deletion.as_deref().cloned(),
            labels: map(&self.labels),
            annotations: map(&self.annotations),
            owner_references: (!self.owners.is_empty()).then(|| {
                self.owners
                    .iter()
                    .map(|uid| OwnerReference {
                        uid: uid.to_string(),
                        ..OwnerReference::default()
                    })
                    .collect()
            }),
            ..ObjectMeta::default()
        }
    }
}

/// A kind read back from its [`Kept`] form: an object with the kept metadata.
pub trait FromKept: Resource + Default {
    /// `kept` as object `name` in `namespace` (`""` for a cluster-scoped one).
    fn from_kept(kept: &Kept, namespace: &str, name: &str) -> Self {
        let mut object = Self::default();
        *object.meta_mut() = kept.meta(namespace, name);
        object
    }
}

impl FromKept for Namespace {}
impl FromKept for NetworkPolicy {}
impl FromKept for Service {}

/// A Secret read back: a kubeconfig Secret's key holds the kubeconfig's SHA-256, as the trim
/// left it ([`kubeconfig_matches`]).
impl FromKept for Secret {
    fn from_kept(kept: &Kept, namespace: &str, name: &str) -> Self {
        Secret {
            metadata: kept.meta(namespace, name),
            data: kept
                .digest
                .as_ref()
                .map(|d| BTreeMap::from([(KUBECONFIG_KEY.to_string(), ByteString(d.to_vec()))])),
            ..Secret::default()
        }
    }
}

/// Keeps one data key of a Secret, its UID mark and (`owners`) its owner references.
fn keep_key(secret: &mut Secret, key: &str, owners: bool) {
    keep_meta(&mut secret.metadata, &[INSTANCE_UID_LABEL], &[], owners);
    secret.string_data = None;
    if let Some(data) = secret.data.as_mut() {
        data.retain(|k, _| k == key);
    }
}

fn trim_exported(secret: &mut Secret) {
    keep_key(secret, EXPORTED_KUBECONFIG_KEY, false);
}

/// Keeps the SHA-256 of the instance's kubeconfig instead of the kubeconfig: a cached observation
/// only compares it with what the vCluster exported ([`kubeconfig_matches`]). The owner
/// references stay: the controller maps the Secret to its instance by them.
fn trim_kubeconfig(secret: &mut Secret) {
    keep_key(secret, KUBECONFIG_KEY, true);
    if let Some(value) = secret.data.as_mut().and_then(|d| d.get_mut(KUBECONFIG_KEY)) {
        value.0 = super::vclusters::digest(&value.0).to_vec();
    }
}

/// Whether a kubeconfig Secret from the cache (which keeps its key's SHA-256) holds `kubeconfig`.
pub fn kubeconfig_matches(cached: &Secret, kubeconfig: &Exported) -> bool {
    cached
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .is_some_and(|v| v.0 == kubeconfig.digest())
}

/// The watch caches observe reads.
#[derive(Default)]
pub struct Caches {
    /// Host namespaces (labelled `platform.di-framework.dev/host-namespace=true`).
    pub namespaces: Arc<Index<Kept>>,
    /// `networkpolicy/vcluster-api` of each host namespace (name, namespace and UID).
    pub network_policies: Arc<Index<Kept>>,
    /// The vCluster's Helm release records (`owner=helm,name=vcluster`; the labels of their
    /// revision, state and chart version).
    pub releases: Arc<Index<Kept>>,
    /// `service/vcluster` of each host namespace (name, namespace and UID).
    pub services: Arc<Index<Kept>>,
    /// Whether `deployment/vcluster` of each host namespace rolled out.
    pub deployments: Arc<Index<Rollout>>,
    /// The kubeconfig each vCluster exports (`secret/vc-vcluster`, its `config` key) with its
    /// SHA-256, `None` for a Secret without one.
    pub exported: Arc<Index<Option<Arc<Exported>>>>,
    /// The Secrets the operator manages (the instances' kubeconfigs: their UID mark, owner
    /// references and the SHA-256 of their `kubeconfig` key).
    pub kubeconfigs: Arc<Index<Kept>>,
}

/// A watch of `api` narrowed by `config`, with backoff.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, config.any_semantic()).default_backoff()
}

/// A metadata-only watch of every `K` narrowed by `config`, with backoff.
fn watch_meta<K>(
    client: kube::Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<PartialObjectMeta<K>>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watch(Api::<PartialObjectMeta<K>>::all(client), config)
}

/// The watches that also wake instances, for the controller to drive: each feeds its cache
/// before it passes an object on.
pub struct Triggers {
    /// The operator's Secrets (owned by instances).
    pub kubeconfigs: Trigger<Secret>,
    /// `service/vcluster` of each host namespace.
    pub services: Trigger<PartialObjectMeta<Service>>,
    /// `deployment/vcluster` of each host namespace (its rollout).
    pub deployments: Trigger<Deployment>,
    /// The exported kubeconfig of each host namespace.
    pub exported: Trigger<Secret>,
    /// The Helm release records of each host namespace.
    pub releases: Trigger<PartialObjectMeta<Secret>>,
}

impl Caches {
    /// Starts the watches that only feed a cache (each in a task of its own) and returns the
    /// caches with the watches that also wake instances ([`Triggers`]), which feed their caches
    /// while the controller runs them. `watch_namespace` narrows the instances' Secrets to the
    /// namespace the controller watches.
    pub fn start(client: &kube::Client, watch_namespace: Option<&str>) -> (Arc<Self>, Triggers) {
        let caches = Arc::new(Self::default());
        let by_name =
            |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        tokio::spawn(caches.namespaces.clone().feed(
            "namespaces",
            watch(
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default().labels(&format!("{HOST_NAMESPACE_LABEL}=true")),
            ),
            (trim_namespace, Kept::of),
        ));
        tokio::spawn(caches.network_policies.clone().feed(
            "networkpolicies",
            watch_meta::<NetworkPolicy>(client.clone(), by_name(VCLUSTER_NETWORK_POLICY)),
            (trim_partial, Kept::of),
        ));
        let secrets = match watch_namespace {
            Some(namespace) => Api::<Secret>::namespaced(client.clone(), namespace),
            None => Api::<Secret>::all(client.clone()),
        };
        let triggers = Triggers {
            kubeconfigs: caches.kubeconfigs.clone().tee(
                "kubeconfig secrets",
                watch(
                    secrets,
                    watcher::Config::default().labels(MANAGED_BY_SELECTOR),
                ),
                (trim_kubeconfig, Kept::of_kubeconfig),
            ),
            services: caches.services.clone().tee(
                "services",
                watch_meta::<Service>(client.clone(), by_name(VCLUSTER)),
                (trim_partial, Kept::of),
            ),
            deployments: caches.deployments.clone().tee(
                "deployments",
                watch(Api::<Deployment>::all(client.clone()), by_name(VCLUSTER)),
                (trim_deployment, Rollout::of),
            ),
            exported: caches.exported.clone().tee(
                "exported kubeconfigs",
                watch(
                    Api::<Secret>::all(client.clone()),
                    by_name(EXPORTED_KUBECONFIG_SECRET),
                ),
                (trim_exported, super::observe::exported_kubeconfig),
            ),
            releases: caches.releases.clone().tee(
                "helm releases",
                watch_meta::<Secret>(
                    client.clone(),
                    watcher::Config::default().labels(&format!("owner=helm,name={RELEASE}")),
                ),
                (trim_release, Kept::of),
            ),
        };
        (caches, triggers)
    }

    /// Every watch has listed and none has failed since: the caches may be read.
    pub fn ready(&self) -> bool {
        self.namespaces.listed()
            && self.network_policies.listed()
            && self.releases.listed()
            && self.services.listed()
            && self.deployments.listed()
            && self.exported.listed()
            && self.kubeconfigs.listed()
    }

    /// How many objects each cache holds, by cache name (for the cache-size gauge).
    pub fn sizes(&self) -> [(&'static str, usize); 7] {
        [
            ("namespaces", self.namespaces.len()),
            ("networkpolicies", self.network_policies.len()),
            ("releases", self.releases.len()),
            ("services", self.services.len()),
            ("deployments", self.deployments.len()),
            ("exported", self.exported.len()),
            ("kubeconfigs", self.kubeconfigs.len()),
        ]
    }
}

/// A full object of kind `K` with only the metadata a metadata watch gave.
#[cfg(test)]
fn from_meta<K: Resource + Default>(partial: &PartialObjectMeta<K>) -> K {
    let mut object = K::default();
    *object.meta_mut() = partial.metadata.clone();
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(namespace: &str, name: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        }
    }

    /// Applies `event` to `index` as a watch would, keeping kubeconfig Secrets.
    fn apply(index: &Index<Kept>, event: Event<Secret>) {
        let _ = index.take("test", Ok(event), trim_kubeconfig, Kept::of_kubeconfig);
    }

    #[test]
    fn a_relist_replaces_the_index_only_when_complete() {
        let index = Index::<Kept>::default();
        apply(&index, Event::Apply(secret("a", "one")));
        apply(&index, Event::Apply(secret("a", "two")));
        apply(&index, Event::Apply(secret("b", "one")));
        // Namespaces whose names begin alike are apart.
        apply(&index, Event::Apply(secret("a0", "one")));
        apply(&index, Event::Apply(secret("a-b", "one")));
        assert_eq!(index.in_namespace("a").len(), 2);
        assert_eq!(index.in_namespace("a0").len(), 1);
        assert_eq!(index.len(), 5);
        apply(&index, Event::Delete(secret("a0", "one")));
        apply(&index, Event::Delete(secret("a-b", "one")));
        assert!(!index.listed(), "not listed before the first InitDone");
        apply(&index, Event::Delete(secret("a", "two")));
        assert!(index.get("a", "two").is_none());
        assert!(index.get("a", "one").is_some());
        // A re-list: the old content stays readable until it is complete, then is replaced.
        apply(&index, Event::Init);
        apply(&index, Event::InitApply(secret("c", "one")));
        assert!(index.get("a", "one").is_some());
        assert!(index.get("c", "one").is_none());
        apply(&index, Event::InitDone);
        assert!(index.listed());
        assert!(index.get("a", "one").is_none(), "gone after the re-list");
        assert!(index.get("c", "one").is_some());
        assert_eq!(index.len(), 1);
        assert!(index.in_namespace("a").is_empty());
    }

    #[tokio::test]
    async fn a_trigger_passes_an_object_on_only_once_its_cache_holds_it() {
        let index = Arc::new(Index::<Kept>::default());
        let events = futures::stream::iter(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(secret("a", "one"))),
            Ok(Event::InitDone),
            Ok(Event::Delete(secret("a", "one"))),
        ]);
        let mut trigger = index
            .clone()
            .tee("test", events, (trim_kubeconfig, Kept::of_kubeconfig));
        let first = trigger.next().await.expect("one").expect("ok");
        assert_eq!(first.metadata.name.as_deref(), Some("one"));
        // InitDone comes with the next object: the re-list is complete once it is passed on.
        let deleted = trigger.next().await.expect("delete").expect("ok");
        assert_eq!(deleted.metadata.name.as_deref(), Some("one"));
        assert!(index.listed());
        assert!(
            index.get("a", "one").is_none(),
            "the deletion is in the cache when it wakes the instance"
        );
        assert!(trigger.next().await.is_none());
    }

    #[test]
    fn secrets_keep_only_the_kubeconfig_and_no_managed_fields() {
        let mut s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "k", "namespace": "a", "annotations": {"x": "y"},
                         "uid": "s", "labels": {INSTANCE_UID_LABEL: "u", "other": "o"},
                         "ownerReferences": [{"apiVersion": "v", "kind": "PlatformInstance",
                                              "name": "i", "uid": "u"}],
                         "managedFields": [{"manager": "m", "operation": "Apply"}]},
            "data": {"kubeconfig": "YQ==", "other": "Yg=="}
        }))
        .expect("secret");
        trim_kubeconfig(&mut s);
        // Read back from its kept form: the same UID mark, owners' UIDs and digest.
        let back = Secret::from_kept(&Kept::of_kubeconfig(&s), "a", "k");
        assert_eq!(back.metadata.labels, s.metadata.labels);
        assert_eq!(back.metadata.uid.as_deref(), Some("s"));
        let owners = |s: &Secret| -> Vec<String> {
            s.metadata
                .owner_references
                .iter()
                .flatten()
                .map(|r| r.uid.clone())
                .collect()
        };
        assert_eq!(owners(&back), owners(&s));
        assert_eq!(back.data, s.data);
        assert!(kubeconfig_matches(&back, &Exported::new("a".into())));
        assert!(!kubeconfig_matches(&back, &Exported::new("b".into())));
        assert!(s.metadata.managed_fields.is_none());
        assert!(s.metadata.annotations.is_none());
        let keys: Vec<_> = s.data.as_ref().expect("data").keys().cloned().collect();
        assert_eq!(keys, vec!["kubeconfig".to_string()]);
        // "YQ==" is "a": the cache keeps its digest, which matches "a" and nothing else.
        assert_eq!(s.data.as_ref().expect("data")["kubeconfig"].0.len(), 32);
        assert!(kubeconfig_matches(&s, &Exported::new("a".into())));
        assert!(!kubeconfig_matches(&s, &Exported::new("b".into())));
    }

    #[test]
    fn a_trimmed_deployment_still_says_whether_it_rolled_out() {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vcluster", "namespace": "h", "generation": 2},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vcluster"}},
                     "template": {"metadata": {"labels": {"app": "vcluster"}},
                                  "spec": {"containers": [{"name": "c", "image": "i"}]}}},
            "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                       "readyReplicas": 1, "availableReplicas": 1}
        }))
        .expect("deployment");
        assert!(super::super::control_plane::ready(&d));
        trim_deployment(&mut d);
        assert!(super::super::control_plane::ready(&d));
        assert!(d.spec.as_ref().is_some_and(|s| s.template.spec.is_none()));
        assert_eq!(Rollout::of(&d), Rollout { ready: true });
        let mut rolling = d.clone();
        if let Some(status) = rolling.status.as_mut() {
            status.ready_replicas = Some(0);
        }
        assert_eq!(Rollout::of(&rolling), Rollout { ready: false });
    }

    #[test]
    fn a_namespace_keeps_only_its_marks_and_what_observe_reads() {
        let mut n: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "h", "uid": "u", "resourceVersion": "7",
                         "deletionTimestamp": "2026-12-02T00:00:00Z",
                         "labels": {INSTANCE_UID_LABEL: "x", "kubernetes.io/metadata.name": "h",
                                    "pod-security.kubernetes.io/enforce": "baseline"},
                         "annotations": {INSTANCE_ANNOTATION: "t/a", APPLIED_HASH_ANNOTATION: "h1",
                                         OWNER_SERVICE_ANNOTATION: "s/h", "other": "o"},
                         "managedFields": [{"manager": "m", "operation": "Apply"}]},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Terminating"}
        }))
        .expect("namespace");
        let whole = n.clone();
        trim_namespace(&mut n);
        let keys = |map: &Option<BTreeMap<String, String>>| -> Vec<String> {
            map.iter().flatten().map(|(k, _)| k.clone()).collect()
        };
        assert_eq!(keys(&n.metadata.labels), vec![INSTANCE_UID_LABEL]);
        let annotations = keys(&n.metadata.annotations);
        assert_eq!(annotations.len(), 3);
        assert!(!annotations.iter().any(|a| a == "other"));
        assert!(n.metadata.deletion_timestamp.is_some());
        assert_eq!(n.metadata.uid.as_deref(), Some("u"));
        assert!(n.metadata.managed_fields.is_none() && n.spec.is_none() && n.status.is_none());
        // Read back from its kept form, observe concludes from it what it concludes from the
        // whole namespace.
        let back = Namespace::from_kept(&Kept::of(&n), "", "h");
        assert_eq!(back.metadata, n.metadata);
        for (key, uid) in [("t/a", "x"), ("t/a", "y"), ("t/b", "x")] {
            assert_eq!(
                super::super::control_plane::foreign_owner(&back, key, uid),
                super::super::control_plane::foreign_owner(&whole, key, uid)
            );
        }
    }

    #[test]
    fn a_release_record_keeps_the_labels_of_its_state() {
        let mut r: PartialObjectMeta<Secret> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "sh.helm.release.v1.vcluster.v2", "namespace": "h",
                         "labels": {"owner": "helm", "name": "vcluster", "version": "2",
                                    "status": "deployed", CHART_VERSION_LABEL: "0.37.3",
                                    "modifiedAt": "1"}}
        }))
        .expect("release");
        let whole = crate::helm::release_from_secrets(&[from_meta::<Secret>(&r)]);
        trim_release(&mut r);
        assert_eq!(r.metadata.labels.as_ref().map(BTreeMap::len), Some(3));
        let back = Secret::from_kept(&Kept::of(&r), "h", "");
        assert_eq!(crate::helm::release_from_secrets(&[back]), whole);
        assert_ne!(whole, crate::decide::model::Release::Missing);
    }
}
