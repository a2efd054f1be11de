//! An indexed cache of who uses which NodePort: PlatformInstances (`spec.platform.gateway.httpNodePort`)
//! and Services (`spec.ports[].nodePort`) in every namespace, kept current by watches, so a
//! review looks a port up without listing anything.

use std::collections::{BTreeSet, HashMap};
use std::sync::RwLock;

use common::crd::PlatformInstance;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

/// Something that holds NodePorts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Holder {
    /// A PlatformInstance.
    Instance {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A Service.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

impl Holder {
    fn kind(&self) -> Kind {
        match self {
            Holder::Instance { .. } => Kind::Instance,
            Holder::Service { .. } => Kind::Service,
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Instance { namespace, name } => {
                write!(f, "PlatformInstance {namespace}/{name}")
            }
            Holder::Service { namespace, name } => write!(f, "Service {namespace}/{name}"),
        }
    }
}

/// The two kinds the index watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// PlatformInstances.
    Instance,
    /// Services.
    Service,
}

#[derive(Default)]
struct Inner {
    by_port: HashMap<i32, BTreeSet<Holder>>,
    ports_of: HashMap<Holder, Vec<i32>>,
    synced: HashMap<Kind, bool>,
}

impl Inner {
    fn remove(&mut self, holder: &Holder) {
        if let Some(ports) = self.ports_of.remove(holder) {
            for port in ports {
                if let Some(set) = self.by_port.get_mut(&port) {
                    set.remove(holder);
                    if set.is_empty() {
                        self.by_port.remove(&port);
                    }
                }
            }
        }
    }

    fn set(&mut self, holder: Holder, ports: Vec<i32>) {
        self.remove(&holder);
        if ports.is_empty() {
            return;
        }
        for port in &ports {
            self.by_port
                .entry(*port)
                .or_default()
                .insert(holder.clone());
        }
        self.ports_of.insert(holder, ports);
    }
}

/// The NodePort index.
#[derive(Default)]
pub struct NodePortIndex {
    inner: RwLock<Inner>,
}

impl std::fmt::Debug for NodePortIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePortIndex")
            .field("holders", &self.len())
            .finish()
    }
}

/// The NodePorts an instance asks for (none when `httpNodePort` is 0 or unset).
pub fn instance_ports(pi: &PlatformInstance) -> Vec<i32> {
    pi.spec
        .platform
        .as_ref()
        .and_then(|p| p.gateway.as_ref())
        .map(|g| g.http_node_port)
        .filter(|p| *p != 0)
        .into_iter()
        .collect()
}

/// The NodePorts a Service holds.
pub fn service_ports(svc: &Service) -> Vec<i32> {
    let mut ports: Vec<i32> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| p.node_port)
                .filter(|p| *p != 0)
                .collect()
        })
        .unwrap_or_default();
    ports.sort_unstable();
    ports.dedup();
    ports
}

impl NodePortIndex {
    /// Records `holder`'s ports, replacing what it held before.
    pub fn set(&self, holder: Holder, ports: Vec<i32>) {
        if let Ok(mut inner) = self.inner.write() {
            inner.set(holder, ports);
        }
    }

    /// Forgets `holder`.
    pub fn remove(&self, holder: &Holder) {
        if let Ok(mut inner) = self.inner.write() {
            inner.remove(holder);
        }
    }

    /// Replaces every holder of `kind` with `holders` (after a watch (re)lists).
    pub fn replace_kind(&self, kind: Kind, holders: Vec<(Holder, Vec<i32>)>) {
        if let Ok(mut inner) = self.inner.write() {
            let stale: Vec<Holder> = inner
                .ports_of
                .keys()
                .filter(|h| h.kind() == kind)
                .cloned()
                .collect();
            for h in &stale {
                inner.remove(h);
            }
            for (h, ports) in holders {
                inner.set(h, ports);
            }
            inner.synced.insert(kind, true);
        }
    }

    /// Who holds `port`.
    pub fn holders(&self, port: i32) -> Vec<Holder> {
        self.inner
            .read()
            .map(|i| {
                i.by_port
                    .get(&port)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }

    /// How many holders of ports are known.
    pub fn len(&self) -> usize {
        self.inner.read().map(|i| i.ports_of.len()).unwrap_or(0)
    }

    /// Whether no holder is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many holders of `kind` are known.
    pub fn count(&self, kind: Kind) -> usize {
        self.inner
            .read()
            .map(|i| i.ports_of.keys().filter(|h| h.kind() == kind).count())
            .unwrap_or(0)
    }

    /// Whether both watches have listed everything once.
    pub fn synced(&self) -> bool {
        self.inner
            .read()
            .map(|i| {
                i.synced.get(&Kind::Instance).copied().unwrap_or(false)
                    && i.synced.get(&Kind::Service).copied().unwrap_or(false)
            })
            .unwrap_or(false)
    }
}

fn instance_holder(pi: &PlatformInstance) -> Holder {
    Holder::Instance {
        namespace: pi.namespace().unwrap_or_default(),
        name: pi.name_any(),
    }
}

fn service_holder(svc: &Service) -> Holder {
    Holder::Service {
        namespace: svc.namespace().unwrap_or_default(),
        name: svc.name_any(),
    }
}

/// Runs one watch into the index until the stream ends (it retries with backoff on errors).
async fn follow<K, F, H>(
    index: &NodePortIndex,
    api: Api<K>,
    kind: Kind,
    ports: F,
    holder: H,
    on_change: &(dyn Fn() + Sync),
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&K) -> Vec<i32>,
    H: Fn(&K) -> Holder,
{
    let mut staging: Vec<(Holder, Vec<i32>)> = Vec::new();
    let mut stream = watcher::watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(obj)) => index.set(holder(&obj), ports(&obj)),
            Ok(Event::Delete(obj)) => index.remove(&holder(&obj)),
            Ok(Event::Init) => staging.clear(),
            Ok(Event::InitApply(obj)) => staging.push((holder(&obj), ports(&obj))),
            Ok(Event::InitDone) => index.replace_kind(kind, std::mem::take(&mut staging)),
            Err(e) => tracing::warn!(error = %e, ?kind, "NodePort index watch failed; retrying"),
        }
        on_change();
    }
}

/// Keeps `index` current from watches on PlatformInstances and Services in every namespace.
/// `on_change` runs after every event (for the cache-size gauge).
pub async fn run(index: &NodePortIndex, client: kube::Client, on_change: &(dyn Fn() + Sync)) {
    let instances = follow(
        index,
        Api::<PlatformInstance>::all(client.clone()),
        Kind::Instance,
        instance_ports,
        instance_holder,
        on_change,
    );
    let services = follow(
        index,
        Api::<Service>::all(client),
        Kind::Service,
        service_ports,
        service_holder,
        on_change,
    );
    tokio::join!(instances, services);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str) -> Holder {
        Holder::Service {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn pi(ns: &str, name: &str) -> Holder {
        Holder::Instance {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn index_tracks_sets_moves_and_relists() {
        let index = NodePortIndex::default();
        assert!(!index.synced());
        index.set(pi("a", "one"), vec![30080]);
        index.set(svc("b", "web"), vec![30080, 30090]);
        assert_eq!(index.holders(30080), vec![pi("a", "one"), svc("b", "web")]);
        index.set(pi("a", "one"), vec![30081]);
        assert_eq!(index.holders(30080), vec![svc("b", "web")]);
        assert_eq!(index.holders(30081), vec![pi("a", "one")]);
        index.remove(&svc("b", "web"));
        assert!(index.holders(30090).is_empty());
        index.replace_kind(Kind::Instance, vec![(pi("c", "two"), vec![30100])]);
        assert!(
            index.holders(30081).is_empty(),
            "a relist drops holders that are gone"
        );
        assert_eq!(index.count(Kind::Instance), 1);
        index.replace_kind(Kind::Service, vec![]);
        assert!(index.synced());
        index.set(pi("c", "two"), vec![]);
        assert!(
            index.is_empty(),
            "an instance without a NodePort holds nothing"
        );
    }
}
