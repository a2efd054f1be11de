//! The webhook's Prometheus metrics, all in the binary's one registry.

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Every metric the webhook exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Reviews by webhook (`mutate`, `validate`), operation, result (`allowed`, `denied`,
    /// `warned`, `error`) and rule.
    pub reviews: IntCounterVec,
    /// Review latency in seconds, by webhook.
    pub duration: prometheus::HistogramVec,
    /// TLS handshakes that failed.
    pub tls_handshake_failures: IntCounter,
    /// When the serving certificate expires (Unix seconds).
    pub certificate_expiry: IntGauge,
    /// Certificate rotation steps taken, by step.
    pub rotations: IntCounterVec,
    /// Objects in the NodePort cache, by kind.
    pub cache_objects: IntGaugeVec,
    /// caBundle writes to the webhook configurations.
    pub ca_bundle_writes: IntCounter,
    /// The latency histograms of `mutate` and `validate`, looked up once.
    timers: [Histogram; 2],
}

/// The two admission endpoints, as the `webhook` label of the review metrics names them (the
/// variant in lower case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Webhook {
    /// `POST /mutate`.
    Mutate,
    /// `POST /validate`.
    Validate,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let reviews = IntCounterVec::new(
            Opts::new(
                "platform_operator_webhook_reviews_total",
                "Admission reviews by webhook, operation, result and rule.",
            ),
            &["webhook", "operation", "result", "rule"],
        )?;
        let duration = prometheus::HistogramVec::new(
            HistogramOpts::new(
                "platform_operator_webhook_review_duration_seconds",
                "Time to answer one admission review.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["webhook"],
        )?;
        let tls_handshake_failures = IntCounter::new(
            "platform_operator_webhook_tls_handshake_failures_total",
            "TLS handshakes on the admission port that failed.",
        )?;
        let certificate_expiry = IntGauge::new(
            "platform_operator_webhook_certificate_expiry_timestamp_seconds",
            "When the serving certificate expires, in Unix seconds.",
        )?;
        let rotations = IntCounterVec::new(
            Opts::new(
                "platform_operator_webhook_certificate_rotations_total",
                "Certificate rotation steps this replica wrote, by step.",
            ),
            &["step"],
        )?;
        let cache_objects = IntGaugeVec::new(
            Opts::new(
                "platform_operator_webhook_cache_objects",
                "NodePort holders in the webhook's cache, by kind.",
            ),
            &["kind"],
        )?;
        let ca_bundle_writes = IntCounter::new(
            "platform_operator_webhook_ca_bundle_writes_total",
            "Writes of the caBundle into the webhook configurations.",
        )?;
        let timers = [Webhook::Mutate, Webhook::Validate]
            .map(|webhook| duration.with_label_values(&[<&str>::from(webhook)]));
        let metrics = Self {
            reviews,
            duration,
            timers,
            tls_handshake_failures,
            certificate_expiry,
            rotations,
            cache_objects,
            ca_bundle_writes,
        };
        for collector in metrics.collectors() {
            registry.register(collector)?;
        }
        Ok(metrics)
    }

    /// Every metric, each once: what [`Metrics::register`] registers and docs/metrics.md lists.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.reviews.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.tls_handshake_failures.clone()),
            Box::new(self.certificate_expiry.clone()),
            Box::new(self.rotations.clone()),
            Box::new(self.cache_objects.clone()),
            Box::new(self.ca_bundle_writes.clone()),
        ]
    }

    /// The latency histogram of `webhook` (looked up once, at registration).
    pub fn timer(&self, webhook: Webhook) -> &Histogram {
        &self.timers[webhook as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_documented_with_its_type_and_labels() {
        let metrics = Metrics::register(&Registry::new()).expect("metrics");
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
                .expect("docs/metrics.md");
        let described = common::metrics::describe(&metrics.collectors());
        assert_eq!(described.len(), 7);
        common::metrics::check_doc(&doc, "Webhook", &described).unwrap_or_else(|e| panic!("{e}"));
    }
}
