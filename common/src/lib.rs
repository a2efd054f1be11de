//! Shared by the controller and the webhook: the `PlatformInstance` types and schema, and the
//! helpers both binaries use (telemetry, the health and metrics server).

pub mod crd;
pub mod schema;
