//! The metrics registry each binary owns, with the metrics every binary exports, and the
//! description of a set of metrics that docs/metrics.md is checked against.

use prometheus::core::Collector;
use prometheus::proto::MetricType;
use prometheus::{IntGaugeVec, Opts, Registry};

/// `platform_operator_build_info{binary, version}`, which every binary exports as 1.
pub fn build_info() -> IntGaugeVec {
    IntGaugeVec::new(
        Opts::new(
            "platform_operator_build_info",
            "Build information of this binary; always 1.",
        ),
        &["binary", "version"],
    )
    .expect("static metric definition is valid")
}

/// A registry for `binary` holding `platform_operator_build_info{binary, version}` = 1.
pub fn registry(binary: &'static str) -> Registry {
    let registry = Registry::new();
    let info = build_info();
    info.with_label_values(&[binary, env!("CARGO_PKG_VERSION")])
        .set(1);
    registry
        .register(Box::new(info))
        .expect("a new registry has no duplicate");
    registry
}

/// One metric as docs/metrics.md lists it: name, type and labels.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Described {
    /// The metric (family) name.
    pub name: String,
    /// `counter`, `gauge`, `histogram` or `summary`.
    pub kind: &'static str,
    /// Its labels, in order.
    pub labels: Vec<String>,
}

/// The metrics `collectors` export, each once, sorted by name (from their descriptions, so a
/// metric with no sample yet is listed too).
pub fn describe(collectors: &[Box<dyn Collector>]) -> Vec<Described> {
    let mut out = Vec::new();
    for collector in collectors {
        let kinds: Vec<MetricType> = collector
            .collect()
            .iter()
            .map(|f| f.get_field_type())
            .collect();
        for (i, desc) in collector.desc().into_iter().enumerate() {
            let kind = match kinds.get(i) {
                Some(MetricType::COUNTER) => "counter",
                Some(MetricType::GAUGE) => "gauge",
                Some(MetricType::HISTOGRAM) => "histogram",
                Some(MetricType::SUMMARY) => "summary",
                _ => "untyped",
            };
            let mut labels: Vec<String> = desc
                .const_label_pairs
                .iter()
                .map(|l| l.name().to_string())
                .collect();
            labels.extend(desc.variable_labels.iter().cloned());
            out.push(Described {
                name: desc.fq_name.clone(),
                kind,
                labels,
            });
        }
    }
    out.sort();
    out
}

/// The table row docs/metrics.md has for `metric`, without its meaning column.
fn row_prefix(metric: &Described) -> String {
    let labels = if metric.labels.is_empty() {
        "(none)".to_string()
    } else {
        metric
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("| `{}` | {} | {} |", metric.name, metric.kind, labels)
}

/// Where the metrics page disagrees with the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    /// The page has no such section.
    #[error("docs/metrics.md has no section {0:?}")]
    NoSection(String),
    /// Rows of the section to fix, one line each.
    #[error("docs/metrics.md, {heading}:\n{}", problems.join("\n"))]
    Rows {
        /// The section's heading.
        heading: String,
        /// What is wrong, one line per row.
        problems: Vec<String>,
    },
}

/// Checks that the section `## {section}` of the metrics page `doc` has one table row for each
/// of `metrics`, with its type and labels and a meaning, and no row for anything else. The
/// error lists the rows to fix.
pub fn check_doc(doc: &str, section: &str, metrics: &[Described]) -> Result<(), DocError> {
    let heading = format!("## {section}");
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    if lines.next().is_none() {
        return Err(DocError::NoSection(heading));
    }
    let rows: Vec<&str> = lines
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `"))
        .collect();
    let mut problems = Vec::new();
    for metric in metrics {
        let prefix = row_prefix(metric);
        match rows.iter().find(|r| r.starts_with(&prefix)) {
            Some(row)
                if row[prefix.len()..]
                    .trim()
                    .trim_end_matches('|')
                    .trim()
                    .len()
                    > 3 => {}
            Some(_) => problems.push(format!(
                "the row of {} says nothing in its meaning column",
                metric.name
            )),
            None => problems.push(format!(
                "missing or wrong row, expected: {prefix} <meaning> |"
            )),
        }
    }
    for row in &rows {
        if !metrics.iter().any(|m| row.starts_with(&row_prefix(m))) {
            problems.push(format!(
                "a row for a metric this binary does not export: {row}"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(DocError::Rows { heading, problems })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
            .expect("docs/metrics.md")
    }

    #[test]
    fn the_metrics_of_both_binaries_are_documented() {
        let metrics = describe(&[
            Box::new(build_info()),
            Box::new(crate::secure_metrics::auth_checks()),
        ]);
        assert_eq!(
            metrics,
            vec![
                Described {
                    name: "platform_operator_build_info".into(),
                    kind: "gauge",
                    labels: vec!["binary".into(), "version".into()],
                },
                Described {
                    name: "platform_operator_metrics_auth_checks_total".into(),
                    kind: "counter",
                    labels: vec!["answered_by".into()],
                },
            ]
        );
        check_doc(&doc(), "Both binaries", &metrics).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn the_check_finds_missing_wrong_and_extra_rows() {
        let metrics = vec![Described {
            name: "a_total".into(),
            kind: "counter",
            labels: vec!["x".into()],
        }];
        let ok = "# M\n\n## S\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n| `a_total` | counter | `x` | Things. |\n\n## T\n\n| `b` | gauge | (none) | Other. |\n";
        assert_eq!(check_doc(ok, "S", &metrics), Ok(()));
        let wrong_type = ok.replace("| counter |", "| gauge |");
        assert!(check_doc(&wrong_type, "S", &metrics).is_err());
        let extra = ok.replace("\n\n## T", "\n| `c` | gauge | (none) | More. |\n\n## T");
        assert!(check_doc(&extra, "S", &metrics).is_err());
        let empty = ok.replace("Things.", "");
        assert!(check_doc(&empty, "S", &metrics).is_err());
        assert!(check_doc(ok, "U", &metrics).is_err());
    }
}
