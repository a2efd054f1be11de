//! Pod Security, on two layers: what users create **inside** a vCluster is held to
//! `--pod-security-standard` by vCluster itself (its `policies.podSecurityStandard`: the syncer
//! refuses to copy a pod that breaks it to the host), and each host namespace is labelled for the
//! host's Pod Security admission ([`host_namespace_labels`]).

/// A Pod Security Standards level, named as Kubernetes and vCluster spell it.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "lowercase")]
pub enum Level {
    /// No restriction.
    Privileged,
    /// Prevents known privilege escalations (no privileged containers, host namespaces,
    /// hostPath volumes, host ports or added capabilities beyond the default set).
    #[default]
    Baseline,
    /// Baseline, and current hardening practice (non-root, no privilege escalation, seccomp,
    /// all capabilities dropped).
    Restricted,
}

/// The host's Pod Security admission label prefix.
pub const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// The Pod Security labels of a host namespace whose vCluster enforces `inside`: `enforce` at
/// `privileged` (the control plane mounts the instance's storage as a hostPath volume), `warn`
/// and `audit` at `inside` (the syncer already checks the pods it copies; these show anything
/// else that breaks it), each pinned to `latest`.
pub fn host_namespace_labels(inside: Level) -> [(String, String); 6] {
    let label = |mode: &str, value: &str| (format!("{LABEL_PREFIX}{mode}"), value.to_string());
    [
        label("enforce", Level::Privileged.into()),
        label("enforce-version", "latest"),
        label("warn", inside.into()),
        label("warn-version", "latest"),
        label("audit", inside.into()),
        label("audit-version", "latest"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_namespaces_admit_the_control_plane_and_warn_at_the_inside_level() {
        let labels = host_namespace_labels(Level::Restricted);
        let get = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| k == &format!("{LABEL_PREFIX}{key}"))
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("enforce"), Some("privileged"));
        assert_eq!(get("warn"), Some("restricted"));
        assert_eq!(get("audit"), Some("restricted"));
        assert_eq!(get("enforce-version"), Some("latest"));
        assert_eq!(Level::default(), Level::Baseline);
        assert_eq!(Level::Baseline.to_string(), "baseline");
    }
}
