//! The platform-operator admission webhook: defaulting and validation of `PlatformInstance`
//! beyond what the CRD schema can check, served over TLS with self-issued certificates.

pub mod admission;
pub mod cabundle;
pub mod certs;
pub mod index;
pub mod keeper;
pub mod metrics;
pub mod rules;
pub mod tls;
