//! Shared by the controller and the webhook: the `PlatformInstance` types and schema, and the
//! helpers both binaries use (logging, metrics, the health and metrics server).

pub mod conditions;
pub mod crd;
pub mod duration;
pub mod http;
pub mod metrics;
pub mod names;
pub mod schema;
pub mod secure_metrics;
pub mod server;
pub mod telemetry;
pub mod version;
