//! The metrics registry each binary owns, with the metrics every binary exports.

use prometheus::{IntGaugeVec, Opts, Registry};

/// A registry for `binary` holding `platform_operator_build_info{binary, version}` = 1.
pub fn registry(binary: &'static str) -> Registry {
    let registry = Registry::new();
    let info = IntGaugeVec::new(
        Opts::new(
            "platform_operator_build_info",
            "Build information of this binary; always 1.",
        ),
        &["binary", "version"],
    )
    .expect("static metric definition is valid");
    info.with_label_values(&[binary, env!("CARGO_PKG_VERSION")])
        .set(1);
    registry
        .register(Box::new(info))
        .expect("a new registry has no duplicate");
    registry
}
