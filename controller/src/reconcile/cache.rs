//! Watch caches of what [`super::observe`] reads, so that an idle reconcile makes no API call.
//!
//! One watch per kind, each narrowed by a label or field selector to what the controller made or
//! the vCluster chart renders (host namespaces, `networkpolicy/vcluster-api`, the Helm release
//! records, `service/vcluster`, `deployment/vcluster`, the exported kubeconfig `vc-vcluster`, the
//! instances' kubeconfig Secrets), indexed by namespace and name. What observe does not read is
//! dropped before it is stored: managed fields always, and per kind the rest (metadata only for
//! objects whose existence, labels or UID are all that matter; the pod template of the
//! Deployment; every data key of a Secret but the kubeconfig, and of the instances' own
//! kubeconfig Secrets only its SHA-256).
//!
//! A cache may be stale. [`super::reconcile`] therefore believes it only to conclude that
//! nothing is to be done: any action or status change is decided again from a fresh read of the
//! API server, and every write or delete keeps its own ownership check (a UID mark read at the
//! time, or a UID precondition). Until every watch has listed once ([`Caches::ready`]) the
//! reconciler reads the API server.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use common::names::{
    EXPORTED_KUBECONFIG_KEY, EXPORTED_KUBECONFIG_SECRET, HOST_NAMESPACE_LABEL, KUBECONFIG_KEY,
    MANAGED_BY_SELECTOR, VCLUSTER, VCLUSTER_NETWORK_POLICY,
};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use crate::helm::RELEASE;

/// Objects of one kind by namespace (`""` for cluster-scoped ones) and name.
type Objects<K> = HashMap<String, BTreeMap<String, Arc<K>>>;

/// One watched kind, indexed by namespace and name.
pub struct Index<K> {
    objects: RwLock<Objects<K>>,
    listed: AtomicBool,
    /// A re-list in progress, until it is complete.
    pending: Mutex<Option<Objects<K>>>,
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Self {
            objects: RwLock::new(HashMap::new()),
            listed: AtomicBool::new(false),
            pending: Mutex::new(None),
        }
    }
}

impl<K: Resource> Index<K> {
    /// The object `name` in `namespace` (`""` for a cluster-scoped kind).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.objects
            .read()
            .ok()?
            .get(namespace)
            .and_then(|n| n.get(name))
            .cloned()
    }

    /// Every object in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.objects
            .read()
            .ok()
            .and_then(|o| o.get(namespace).map(|n| n.values().cloned().collect()))
            .unwrap_or_default()
    }

    /// How many objects are held.
    pub fn len(&self) -> usize {
        self.objects
            .read()
            .map(|o| o.values().map(BTreeMap::len).sum())
            .unwrap_or(0)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The watch has listed every object once and has not failed since.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    fn key(object: &K) -> (String, String) {
        let meta = object.meta();
        (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }

    fn insert(objects: &mut Objects<K>, object: K) {
        let (namespace, name) = Self::key(&object);
        objects
            .entry(namespace)
            .or_default()
            .insert(name, Arc::new(object));
    }

    /// Applies one watch event (a re-list is held apart until it is complete).
    fn apply(&self, event: Event<K>) {
        let (Ok(mut objects), Ok(mut pending)) = (self.objects.write(), self.pending.lock()) else {
            return;
        };
        match event {
            Event::Apply(object) => Self::insert(&mut objects, object),
            Event::Delete(object) => {
                let (namespace, name) = Self::key(&object);
                if let Some(n) = objects.get_mut(&namespace) {
                    n.remove(&name);
                    if n.is_empty() {
                        objects.remove(&namespace);
                    }
                }
            }
            Event::Init => *pending = Some(HashMap::new()),
            Event::InitApply(object) => {
                Self::insert(pending.get_or_insert_with(HashMap::new), object);
            }
            Event::InitDone => {
                *objects = pending.take().unwrap_or_default();
                self.listed.store(true, Ordering::Release);
            }
        }
    }

    /// One event from a watch: trimmed, applied, and passed on.
    fn take(
        &self,
        what: &str,
        event: Result<Event<K>, watcher::Error>,
        trim: fn(&mut K),
    ) -> Taken<K>
    where
        K: Clone,
    {
        match event {
            Ok(mut event) => {
                let touched = match &mut event {
                    Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                        trim(o);
                        Some(o.clone())
                    }
                    Event::Init | Event::InitDone => None,
                };
                self.apply(event);
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
    async fn feed<S>(self: Arc<Self>, what: &'static str, events: S, trim: fn(&mut K))
    where
        K: Clone,
        S: Stream<Item = Result<Event<K>, watcher::Error>>,
    {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let _ = self.take(what, event, trim);
        }
    }

    /// The objects `events` touches, each applied to the index before it is passed on (so that
    /// a reconcile it wakes reads the cache with it): the controller's trigger for this kind.
    fn tee<S>(self: Arc<Self>, what: &'static str, events: S, trim: fn(&mut K)) -> Trigger<K>
    where
        K: Clone + Send + Sync + 'static,
        S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    {
        events
            .filter_map(move |event| std::future::ready(self.take(what, event, trim)))
            .boxed()
    }
}

/// What [`Index::take`] passes on: the object an event touched, or the watch's error.
type Taken<K> = Option<Result<K, watcher::Error>>;

/// The objects a watch touched, as the controller takes its triggers.
pub type Trigger<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// Drops what no reader of the controller looks at from any object's metadata.
fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
}

/// Keeps only the metadata an existence, UID or label check needs.
fn trim_partial<K>(object: &mut PartialObjectMeta<K>) {
    trim_meta(&mut object.metadata);
    object.metadata.annotations = None;
}

fn trim_namespace(namespace: &mut Namespace) {
    trim_meta(&mut namespace.metadata);
}

fn trim_deployment(deployment: &mut Deployment) {
    trim_meta(&mut deployment.metadata);
    deployment.metadata.annotations = None;
    if let Some(spec) = deployment.spec.as_mut() {
        spec.template = Default::default();
        spec.selector = Default::default();
    }
    if let Some(status) = deployment.status.as_mut() {
        status.conditions = None;
    }
}

/// Keeps one data key of a Secret.
fn keep_key(secret: &mut Secret, key: &str) {
    trim_meta(&mut secret.metadata);
    secret.metadata.annotations = None;
    secret.string_data = None;
    if let Some(data) = secret.data.as_mut() {
        data.retain(|k, _| k == key);
    }
}

fn trim_exported(secret: &mut Secret) {
    keep_key(secret, EXPORTED_KUBECONFIG_KEY);
}

/// Keeps the SHA-256 of the instance's kubeconfig instead of the kubeconfig: a cached observation
/// only compares it with what the vCluster exported ([`kubeconfig_matches`]).
fn trim_kubeconfig(secret: &mut Secret) {
    keep_key(secret, KUBECONFIG_KEY);
    if let Some(value) = secret.data.as_mut().and_then(|d| d.get_mut(KUBECONFIG_KEY)) {
        value.0 = super::vclusters::digest(&value.0).to_vec();
    }
}

/// Whether a kubeconfig Secret from the cache (which keeps its key's SHA-256) holds `kubeconfig`.
pub fn kubeconfig_matches(cached: &Secret, kubeconfig: &str) -> bool {
    cached
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .is_some_and(|v| v.0 == super::vclusters::digest(kubeconfig.as_bytes()))
}

/// The watch caches observe reads.
#[derive(Default)]
pub struct Caches {
    /// Host namespaces (labelled `platform.di-framework.dev/host-namespace=true`).
    pub namespaces: Arc<Index<Namespace>>,
    /// `networkpolicy/vcluster-api` of each host namespace (metadata only).
    pub network_policies: Arc<Index<PartialObjectMeta<NetworkPolicy>>>,
    /// The vCluster's Helm release records (`owner=helm,name=vcluster`; metadata only).
    pub releases: Arc<Index<PartialObjectMeta<Secret>>>,
    /// `service/vcluster` of each host namespace (metadata only).
    pub services: Arc<Index<PartialObjectMeta<Service>>>,
    /// `deployment/vcluster` of each host namespace (without its pod template).
    pub deployments: Arc<Index<Deployment>>,
    /// The kubeconfig each vCluster exports (`secret/vc-vcluster`, its `config` key only).
    pub exported: Arc<Index<Secret>>,
    /// The Secrets the operator manages (the instances' kubeconfigs; the SHA-256 of their
    /// `kubeconfig` key only).
    pub kubeconfigs: Arc<Index<Secret>>,
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
            trim_namespace,
        ));
        tokio::spawn(caches.network_policies.clone().feed(
            "networkpolicies",
            watch_meta::<NetworkPolicy>(client.clone(), by_name(VCLUSTER_NETWORK_POLICY)),
            trim_partial,
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
                trim_kubeconfig,
            ),
            services: caches.services.clone().tee(
                "services",
                watch_meta::<Service>(client.clone(), by_name(VCLUSTER)),
                trim_partial,
            ),
            deployments: caches.deployments.clone().tee(
                "deployments",
                watch(Api::<Deployment>::all(client.clone()), by_name(VCLUSTER)),
                trim_deployment,
            ),
            exported: caches.exported.clone().tee(
                "exported kubeconfigs",
                watch(
                    Api::<Secret>::all(client.clone()),
                    by_name(EXPORTED_KUBECONFIG_SECRET),
                ),
                trim_exported,
            ),
            releases: caches.releases.clone().tee(
                "helm releases",
                watch_meta::<Secret>(
                    client.clone(),
                    watcher::Config::default().labels(&format!("owner=helm,name={RELEASE}")),
                ),
                trim_partial,
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
pub fn from_meta<K: Resource + Default>(partial: &PartialObjectMeta<K>) -> K {
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

    #[test]
    fn a_relist_replaces_the_index_only_when_complete() {
        let index = Index::<Secret>::default();
        index.apply(Event::Apply(secret("a", "one")));
        index.apply(Event::Apply(secret("a", "two")));
        index.apply(Event::Apply(secret("b", "one")));
        assert_eq!(index.in_namespace("a").len(), 2);
        assert!(!index.listed(), "not listed before the first InitDone");
        index.apply(Event::Delete(secret("a", "two")));
        assert!(index.get("a", "two").is_none());
        assert!(index.get("a", "one").is_some());
        // A re-list: the old content stays readable until it is complete, then is replaced.
        index.apply(Event::Init);
        index.apply(Event::InitApply(secret("c", "one")));
        assert!(index.get("a", "one").is_some());
        assert!(index.get("c", "one").is_none());
        index.apply(Event::InitDone);
        assert!(index.listed());
        assert!(index.get("a", "one").is_none(), "gone after the re-list");
        assert!(index.get("c", "one").is_some());
        assert_eq!(index.len(), 1);
        assert!(index.in_namespace("a").is_empty());
    }

    #[tokio::test]
    async fn a_trigger_passes_an_object_on_only_once_its_cache_holds_it() {
        let index = Arc::new(Index::<Secret>::default());
        let events = futures::stream::iter(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(secret("a", "one"))),
            Ok(Event::InitDone),
            Ok(Event::Delete(secret("a", "one"))),
        ]);
        let mut trigger = index.clone().tee("test", events, trim_kubeconfig);
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
                         "managedFields": [{"manager": "m", "operation": "Apply"}]},
            "data": {"kubeconfig": "YQ==", "other": "Yg=="}
        }))
        .expect("secret");
        trim_kubeconfig(&mut s);
        assert!(s.metadata.managed_fields.is_none());
        assert!(s.metadata.annotations.is_none());
        let keys: Vec<_> = s.data.as_ref().expect("data").keys().cloned().collect();
        assert_eq!(keys, vec!["kubeconfig".to_string()]);
        // "YQ==" is "a": the cache keeps its digest, which matches "a" and nothing else.
        assert_eq!(s.data.as_ref().expect("data")["kubeconfig"].0.len(), 32);
        assert!(kubeconfig_matches(&s, "a"));
        assert!(!kubeconfig_matches(&s, "b"));
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
    }
}
