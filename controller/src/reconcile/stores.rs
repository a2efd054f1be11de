//! The watch caches [`super::reader`] reads first: one reflector store per kind, narrowed by a
//! selector to what the controller or the chart made, with what nothing reads dropped.
//!
//! A store may be stale, so it is believed only to conclude that nothing is to be done (see
//! [`super::reconcile`]); until every store has listed once the reconciler reads the API server.

use std::fmt::Debug;

use common::names::{
    EXPORTED_KUBECONFIG_KEY, EXPORTED_KUBECONFIG_SECRET, HOST_NAMESPACE_LABEL, KUBECONFIG_KEY,
    MANAGED_BY_SELECTOR, VCLUSTER, VCLUSTER_APP, VCLUSTER_NETWORK_POLICY,
};
use futures::future::FutureExt;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, reflector::Lookup};
use serde::de::DeserializeOwned;

use crate::helm::RELEASE;

/// The objects a watch touched (applied or deleted), as the controller takes its triggers.
pub type Trigger<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// The reflector stores the reader reads.
#[derive(Clone)]
pub struct Stores {
    /// Host namespaces (labelled `platform.di-framework.dev/host-namespace=true`).
    pub namespaces: Store<Namespace>,
    /// `networkpolicy/vcluster-api` of each host namespace (metadata).
    pub network_policies: Store<PartialObjectMeta<NetworkPolicy>>,
    /// The vCluster's Helm release records (`owner=helm,name=vcluster`; metadata only).
    pub releases: Store<PartialObjectMeta<Secret>>,
    /// `service/vcluster` of each host namespace (metadata).
    pub services: Store<PartialObjectMeta<Service>>,
    /// `deployment/vcluster` of each host namespace, of its pod template only the affinity.
    pub deployments: Store<Deployment>,
    /// The kubeconfig each vCluster exports (`secret/vc-vcluster`, its `config` key only).
    pub exported: Store<Secret>,
    /// The instances' kubeconfig Secrets (their `kubeconfig` key only).
    pub kubeconfigs: Store<Secret>,
}

/// The watches that also wake instances; each feeds its store before it passes an object on.
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
    /// The vCluster pods (`app=vcluster`, no store), each when its storage owner check starts or
    /// stops refusing: a control plane pod whose init container refuses the storage directory
    /// changes nothing the other watches see (and a pod's other changes wake nobody).
    pub pods: Trigger<Pod>,
}

/// A reflected watch of `api` narrowed by `config`, `trim` applied before an object is stored.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Lookup<DynamicType = ()>,
    K: Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher::watcher(api, config.any_semantic())
        .default_backoff()
        .modify(move |object| {
            object.meta_mut().managed_fields = None;
            trim(object);
        })
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

fn keep_key(secret: &mut Secret, key: &str) {
    secret.string_data = None;
    if let Some(data) = secret.data.as_mut() {
        data.retain(|k, _| k == key);
    }
}

impl Stores {
    /// Starts the watches that only feed a store and returns the stores with the [`Triggers`];
    /// `watch_namespace` narrows the instances' Secrets to the namespace the controller watches.
    pub fn start(client: &kube::Client, watch_namespace: Option<&str>) -> (Self, Triggers) {
        let by_name =
            |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (namespaces, namespace_events) = reflect(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().labels(&format!("{HOST_NAMESPACE_LABEL}=true")),
            |n| (n.spec, n.status) = (None, None),
        );
        let (network_policies, network_policy_events) = reflect(
            Api::<PartialObjectMeta<NetworkPolicy>>::all(client.clone()),
            by_name(VCLUSTER_NETWORK_POLICY),
            |_| {},
        );
        tokio::spawn(namespace_events.for_each(|_| async {}));
        tokio::spawn(network_policy_events.for_each(|_| async {}));
        let secrets = match watch_namespace {
            Some(namespace) => Api::<Secret>::namespaced(client.clone(), namespace),
            None => Api::<Secret>::all(client.clone()),
        };
        let (kubeconfigs, kubeconfig_events) = reflect(
            secrets,
            watcher::Config::default().labels(MANAGED_BY_SELECTOR),
            |s| keep_key(s, KUBECONFIG_KEY),
        );
        let (services, service_events) = reflect(
            Api::<PartialObjectMeta<Service>>::all(client.clone()),
            by_name(VCLUSTER),
            |_| {},
        );
        let (deployments, deployment_events) = reflect(
            Api::<Deployment>::all(client.clone()),
            by_name(VCLUSTER),
            |d: &mut Deployment| {
                // Of the pod template only the affinity (the pin to the storage node) and the
                // init containers' names (the storage owner check) are kept.
                if let Some(spec) = d.spec.as_mut() {
                    let pod = spec.template.spec.take().unwrap_or_default();
                    let init_containers = pod.init_containers.map(|i| {
                        let name = |c: Container| Container {
                            name: c.name,
                            ..Container::default()
                        };
                        i.into_iter().map(name).collect()
                    });
                    spec.template = Default::default();
                    spec.template.spec = Some(PodSpec {
                        affinity: pod.affinity,
                        init_containers,
                        ..PodSpec::default()
                    });
                }
            },
        );
        let (exported, exported_events) = reflect(
            Api::<Secret>::all(client.clone()),
            by_name(EXPORTED_KUBECONFIG_SECRET),
            |s| keep_key(s, EXPORTED_KUBECONFIG_KEY),
        );
        let (releases, release_events) = reflect(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            watcher::Config::default().labels(&format!("owner=helm,name={RELEASE}")),
            |_| {},
        );
        let stores = Self {
            namespaces,
            network_policies,
            releases,
            services,
            deployments,
            exported,
            kubeconfigs,
        };
        let refused = |p: &Pod| Some(u64::from(super::reader::storage_refusal(p).is_some()));
        let pods = watcher::watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default()
                .labels(&format!("app={VCLUSTER_APP}"))
                .any_semantic(),
        )
        .default_backoff()
        .touched_objects()
        .predicate_filter(refused, Default::default());
        let triggers = Triggers {
            pods: pods.boxed(),
            kubeconfigs: kubeconfig_events.boxed(),
            services: service_events.boxed(),
            deployments: deployment_events.boxed(),
            exported: exported_events.boxed(),
            releases: release_events.boxed(),
        };
        (stores, triggers)
    }

    /// Every store has listed once: the stores may be read.
    pub fn ready(&self) -> bool {
        fn listed<K: Lookup + Clone + 'static>(store: &Store<K>) -> bool
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
        }
        listed(&self.namespaces)
            && listed(&self.network_policies)
            && listed(&self.releases)
            && listed(&self.services)
            && listed(&self.deployments)
            && listed(&self.exported)
            && listed(&self.kubeconfigs)
    }
}
