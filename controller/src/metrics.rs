//! The controller's Prometheus metrics, all in the binary's one registry.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Every metric the controller exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Reconciles by result (`ok`, `error`) and error category.
    pub reconciles: IntCounterVec,
    /// Reconcile duration in seconds.
    pub reconcile_duration: Histogram,
    /// Instances by phase, as of their last reconcile.
    pub instances: IntGaugeVec,
    /// Helm tasks running.
    pub tasks_running: IntGauge,
    /// Helm tasks waiting for a slot.
    pub tasks_queued: IntGauge,
    /// Helm operation durations in seconds, by operation and result.
    pub helm_duration: HistogramVec,
    /// Installer task durations in seconds (install, upgrade, reapply, repair, preview), by
    /// result.
    pub install_duration: HistogramVec,
    /// Seconds spent inside npm and pulumi, by tool and result (the operator's own overhead is
    /// an install's duration minus these).
    pub tool_seconds: HistogramVec,
    /// 1 while this replica is the leader.
    pub leader: IntGauge,
    /// Writes to the API server by kind of object (to show that an idle resync writes nothing).
    pub writes: IntCounterVec,
}

/// A histogram family with `buckets` (seconds).
fn histograms(
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> Result<HistogramVec, prometheus::Error> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::new()?;
        let collectors: [Box<dyn prometheus::core::Collector>; 10] = [
            Box::new(m.reconciles.clone()),
            Box::new(m.reconcile_duration.clone()),
            Box::new(m.instances.clone()),
            Box::new(m.tasks_running.clone()),
            Box::new(m.tasks_queued.clone()),
            Box::new(m.helm_duration.clone()),
            Box::new(m.install_duration.clone()),
            Box::new(m.tool_seconds.clone()),
            Box::new(m.leader.clone()),
            Box::new(m.writes.clone()),
        ];
        for collector in collectors {
            registry.register(collector)?;
        }
        Ok(m)
    }

    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            reconciles: IntCounterVec::new(
                Opts::new(
                    "platform_operator_controller_reconciles_total",
                    "Reconciles by result and error category.",
                ),
                &["result", "category"],
            )?,
            reconcile_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "platform_operator_controller_reconcile_duration_seconds",
                    "Time one reconcile took.",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
            )?,
            instances: IntGaugeVec::new(
                Opts::new(
                    "platform_operator_controller_instances",
                    "PlatformInstances by phase at their last reconcile.",
                ),
                &["phase"],
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
            writes: IntCounterVec::new(
                Opts::new(
                    "platform_operator_controller_api_writes_total",
                    "Writes the controller made, by object kind.",
                ),
                &["kind"],
            )?,
        })
    }
}
