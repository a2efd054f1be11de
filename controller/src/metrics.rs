//! The controller's Prometheus metrics, all in the binary's one registry.

use common::conditions::RECONCILING;
use common::crd::PlatformInstance;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Every metric the controller exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Reconciles by result (`ok`, `error`) and error category.
    pub reconciles: IntCounterVec,
    /// Reconcile duration in seconds.
    pub reconcile_duration: Histogram,
    /// Observations by source: `cache` (nothing to do) or `api` (read to act or write status).
    pub observed: IntCounterVec,
    /// Helm tasks running.
    pub tasks_running: IntGauge,
    /// Helm tasks waiting for a slot.
    pub tasks_queued: IntGauge,
    /// Helm operation durations in seconds, by operation and result.
    pub helm_duration: HistogramVec,
    /// Installer task durations in seconds (install, upgrade, reapply, repair, preview), by result.
    pub install_duration: HistogramVec,
    /// Seconds spent inside npm and pulumi, by tool and result (the operator's own overhead is
    /// an install's duration minus these).
    pub tool_seconds: HistogramVec,
    /// 1 while this replica is the leader.
    pub leader: IntGauge,
    /// Writes to the API server by kind of object (to show that an idle resync writes nothing).
    pub writes: IntCounterVec,
    /// vCluster API probes by outcome: `served` (a version answer) or `failed`.
    pub probes: IntCounterVec,
    /// `--install-timeout` in seconds, for alerts on work stuck past it.
    pub install_timeout: Gauge,
    /// Bytes used on the state volume (`--state-dir`'s filesystem).
    pub state_used: Gauge,
    /// Bytes the state volume holds in all.
    pub state_capacity: Gauge,
}

/// A histogram family with `buckets` (seconds).
fn histograms(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> Result<HistogramVec> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
}

fn counters(name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

type Result<T> = std::result::Result<T, prometheus::Error>;

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self> {
        let m = Self::new()?;
        for collector in m.collectors() {
            registry.register(collector)?;
        }
        Ok(m)
    }

    fn new() -> Result<Self> {
        Ok(Self {
            reconciles: counters(
                "platform_operator_controller_reconciles_total",
                "Reconciles by result and error category.",
                &["result", "category"],
            )?,
            reconcile_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "platform_operator_controller_reconcile_duration_seconds",
                    "Time one reconcile took.",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
            )?,
            observed: counters(
                "platform_operator_controller_observations_total",
                "Observations of an instance by source: cache (nothing to do) or api.",
                &["source"],
            )?,
            tasks_running: IntGauge::new(
                "platform_operator_controller_tasks_running",
                "Helm tasks running.",
            )?,
            tasks_queued: IntGauge::new(
                "platform_operator_controller_queue_depth",
                "Helm installs waiting for a slot.",
            )?,
            helm_duration: histograms(
                "platform_operator_controller_helm_duration_seconds",
                "Helm operation durations.",
                &[
                    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                ],
                &["operation", "result"],
            )?,
            install_duration: histograms(
                "platform_operator_controller_install_duration_seconds",
                "Installer task durations.",
                &[
                    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
                ],
                &["operation", "result"],
            )?,
            tool_seconds: histograms(
                "platform_operator_controller_tool_duration_seconds",
                "Time spent inside npm and pulumi.",
                &[
                    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                ],
                &["tool", "result"],
            )?,
            leader: IntGauge::new(
                "platform_operator_controller_leader",
                "1 while this replica leads.",
            )?,
            probes: counters(
                "platform_operator_controller_vcluster_probes_total",
                "vCluster API probes by outcome: served or failed.",
                &["outcome"],
            )?,
            writes: counters(
                "platform_operator_controller_api_writes_total",
                "Writes the controller made, by object kind.",
                &["kind"],
            )?,
            install_timeout: Gauge::new(
                "platform_operator_controller_install_timeout_seconds",
                "The --install-timeout: how long one install may run.",
            )?,
            state_used: Gauge::new(
                "platform_operator_controller_state_volume_used_bytes",
                "Bytes used on the filesystem of the state volume (--state-dir).",
            )?,
            state_capacity: Gauge::new(
                "platform_operator_controller_state_volume_capacity_bytes",
                "Size of the filesystem of the state volume (--state-dir).",
            )?,
        })
    }

    /// Every metric, each once: what [`Metrics::register`] registers and docs/metrics.md lists.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.reconciles.clone()),
            Box::new(self.reconcile_duration.clone()),
            Box::new(self.observed.clone()),
            Box::new(self.tasks_running.clone()),
            Box::new(self.tasks_queued.clone()),
            Box::new(self.helm_duration.clone()),
            Box::new(self.install_duration.clone()),
            Box::new(self.tool_seconds.clone()),
            Box::new(self.leader.clone()),
            Box::new(self.writes.clone()),
            Box::new(self.probes.clone()),
            Box::new(self.install_timeout.clone()),
            Box::new(self.state_used.clone()),
            Box::new(self.state_capacity.clone()),
        ]
    }

    /// Measures the filesystem holding `dir` into the state volume gauges; returns (used,
    /// capacity) in bytes.
    pub fn observe_state_volume(&self, dir: &std::path::Path) -> std::io::Result<(u64, u64)> {
        let (used, capacity) = volume_usage(dir)?;
        self.state_used.set(used as f64);
        self.state_capacity.set(capacity as f64);
        Ok((used, capacity))
    }
}

/// The instances by phase and condition and the age of work in progress, read at each scrape
/// from the cache of `PlatformInstance`s that only the leader holds (and registers this).
pub struct InstanceConditions {
    store: Store<PlatformInstance>,
    phases: IntGaugeVec,
    conditions: IntGaugeVec,
    reconciling_age: Gauge,
    info: IntGaugeVec,
    condition: IntGaugeVec,
}

impl InstanceConditions {
    /// The collector over `store`.
    pub fn new(store: Store<PlatformInstance>) -> Result<Self> {
        Ok(Self {
            store,
            phases: IntGaugeVec::new(
                Opts::new(
                    "platform_operator_controller_instances",
                    "PlatformInstances by the phase their status reports.",
                ),
                &["phase"],
            )?,
            conditions: IntGaugeVec::new(
                Opts::new(
                    "platform_operator_controller_instance_conditions",
                    "PlatformInstances by condition type, status and reason.",
                ),
                &["condition", "status", "reason"],
            )?,
            reconciling_age: Gauge::new(
                "platform_operator_controller_reconciling_max_age_seconds",
                "How long the instance Reconciling the longest has been so; 0 when none is.",
            )?,
            info: IntGaugeVec::new(
                Opts::new(
                    "platform_operator_instance_info",
                    "Always 1, one series per PlatformInstance: its versions and phase.",
                ),
                &["namespace", "name", "version", "installed_version", "phase"],
            )?,
            condition: IntGaugeVec::new(
                Opts::new(
                    "platform_operator_instance_condition",
                    "Always 1, one series per condition of each PlatformInstance, with its status.",
                ),
                &["namespace", "name", "type", "status"],
            )?,
        })
    }
}

impl Collector for InstanceConditions {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.phases.desc();
        descs.extend(self.conditions.desc());
        descs.extend(self.reconciling_age.desc());
        descs.extend(self.info.desc());
        descs.extend(self.condition.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // Only the instances in the cache now: one series each (and one per condition).
        for gauges in [&self.conditions, &self.info, &self.condition] {
            gauges.reset();
        }
        // Every phase is shown (at 0 until an instance reaches it).
        for phase in common::crd::Phase::ALL {
            self.phases.with_label_values(&[phase.as_str()]).set(0);
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut oldest: f64 = 0.0;
        for instance in self.store.state() {
            let none = Default::default();
            let status = instance.status.as_ref().unwrap_or(&none);
            let (namespace, name) = (
                instance.namespace().unwrap_or_default(),
                instance.name_any(),
            );
            let phase = status.phase.map_or("", |p| p.as_str());
            let version = instance.spec.version.as_deref().unwrap_or_default();
            let installed = status.installed_version.as_deref().unwrap_or_default();
            let info = [namespace.as_str(), &name, version, installed, phase];
            self.info.with_label_values(&info).set(1);
            if let Some(phase) = status.phase {
                self.phases.with_label_values(&[phase.as_str()]).inc();
            }
            for c in &status.conditions {
                self.conditions
                    .with_label_values(&[c.type_.as_str(), c.status.as_str(), c.reason.as_str()])
                    .inc();
                let labels = [namespace.as_str(), &name, &c.type_, &c.status];
                self.condition.with_label_values(&labels).set(1);
                if c.type_ == RECONCILING && c.status == "True" {
                    let age = now.duration_since(c.last_transition_time.0).as_secs_f64();
                    oldest = oldest.max(age);
                }
            }
        }
        self.reconciling_age.set(oldest);
        let mut families = self.phases.collect();
        families.extend(self.conditions.collect());
        families.extend(self.reconciling_age.collect());
        families.extend(self.info.collect());
        families.extend(self.condition.collect());
        families
    }
}
/// Bytes used and in all on the filesystem holding `dir` or its nearest existing ancestor
/// (`statvfs`; used counts what even root can no longer have, as `df` does).
pub fn volume_usage(dir: &std::path::Path) -> std::io::Result<(u64, u64)> {
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(dir);
    let v = rustix::fs::statvfs(existing)?;
    let capacity = v.f_blocks.saturating_mul(v.f_frsize);
    let free = v.f_bfree.saturating_mul(v.f_frsize);
    Ok((capacity.saturating_sub(free), capacity))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_documented_with_its_type_and_labels() {
        let metrics = Metrics::register(&Registry::new()).expect("metrics");
        let (store, _writer) = kube::runtime::reflector::store();
        let mut collectors = metrics.collectors();
        collectors.push(Box::new(InstanceConditions::new(store).expect("collector")));
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
                .expect("docs/metrics.md");
        let described = common::metrics::describe(&collectors);
        assert_eq!(described.len(), 19);
        common::metrics::check_doc(&doc, "Controller", &described)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn conditions_are_counted_and_the_oldest_reconciling_age_read_from_the_cache() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        use kube::runtime::watcher::Event;
        let (store, mut writer) = kube::runtime::reflector::store();
        let collector = InstanceConditions::new(store).expect("collector");
        let ago = |secs: i64| {
            Time(
                k8s_openapi::jiff::Timestamp::now()
                    - k8s_openapi::jiff::SignedDuration::from_secs(secs),
            )
        };
        let instance = |name: &str, conditions: Vec<(&str, &str, &str, i64)>| {
            let mut pi = PlatformInstance::new(name, Default::default());
            pi.metadata.namespace = Some("team".into());
            pi.status = Some(common::crd::PlatformInstanceStatus {
                conditions: conditions
                    .into_iter()
                    .map(|(t, s, r, age)| Condition {
                        type_: t.into(),
                        status: s.into(),
                        reason: r.into(),
                        message: String::new(),
                        last_transition_time: ago(age),
                        observed_generation: None,
                    })
                    .collect(),
                ..Default::default()
            });
            pi
        };
        writer.apply_watcher_event(&Event::Apply(instance(
            "a",
            vec![
                ("Ready", "True", "Idle", 900),
                ("Reconciling", "False", "Idle", 900),
            ],
        )));
        writer.apply_watcher_event(&Event::Apply(instance(
            "b",
            vec![
                ("Stalled", "True", "InstallFailed", 60),
                ("Reconciling", "True", "Installing", 600),
            ],
        )));
        writer.apply_watcher_event(&Event::Apply(instance(
            "c",
            vec![("Reconciling", "True", "Installing", 30)],
        )));
        let registry = Registry::new();
        registry.register(Box::new(collector)).expect("register");
        let families = registry.gather();
        let value = |name: &str, labels: &[(&str, &str)]| {
            families
                .iter()
                .filter(|f| f.name() == name)
                .flat_map(|f| f.get_metric())
                .find(|m| {
                    labels.iter().all(|(k, v)| {
                        m.get_label()
                            .iter()
                            .any(|l| l.name() == *k && l.value() == *v)
                    })
                })
                .map(|m| m.get_gauge().get_value())
        };
        let count = |c: &str, s: &str, r: &str| {
            value(
                "platform_operator_controller_instance_conditions",
                &[("condition", c), ("status", s), ("reason", r)],
            )
        };
        assert_eq!(count("Reconciling", "True", "Installing"), Some(2.0));
        assert_eq!(count("Stalled", "True", "InstallFailed"), Some(1.0));
        assert_eq!(count("Ready", "True", "Idle"), Some(1.0));
        assert_eq!(count("Ready", "False", "Idle"), None);
        let condition = |name: &str, type_: &str, status: &str| {
            value(
                "platform_operator_instance_condition",
                &[
                    ("namespace", "team"),
                    ("name", name),
                    ("type", type_),
                    ("status", status),
                ],
            )
        };
        assert_eq!(condition("b", "Stalled", "True"), Some(1.0));
        assert_eq!(condition("b", "Stalled", "False"), None);
        assert_eq!(condition("a", "Ready", "True"), Some(1.0));
        let info = |name: &str| {
            value(
                "platform_operator_instance_info",
                &[
                    ("namespace", "team"),
                    ("name", name),
                    ("version", ""),
                    ("phase", ""),
                ],
            )
        };
        assert_eq!((info("a"), info("c")), (Some(1.0), Some(1.0)));
        let age = value(
            "platform_operator_controller_reconciling_max_age_seconds",
            &[],
        )
        .expect("age");
        assert!((600.0..660.0).contains(&age), "{age}");
    }
}

#[cfg(test)]
mod volume_tests {
    #[test]
    fn the_state_volume_is_measured() {
        let m = super::Metrics::new().expect("metrics");
        let (used, capacity) = m
            .observe_state_volume(&std::env::temp_dir())
            .expect("statvfs");
        assert!(capacity > 0 && used <= capacity, "{used} of {capacity}");
        assert_eq!(m.state_capacity.get(), capacity as f64);
        // A state directory not created yet: the filesystem that will hold it.
        let later = std::env::temp_dir().join("not-yet/created");
        assert_eq!(
            m.observe_state_volume(&later).expect("its parent's").1,
            capacity
        );
        assert!(
            m.observe_state_volume(std::path::Path::new("relative"))
                .is_err()
        );
    }
}
