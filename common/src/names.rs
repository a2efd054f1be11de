//! Names, labels and annotations the operator gives to what it creates.

/// The finalizer every instance carries until the operator has cleaned up after it.
pub const FINALIZER: &str = "platform.di-framework.dev/instance";
/// Annotation on a host namespace naming its instance as `<namespace>/<name>`.
pub const INSTANCE_ANNOTATION: &str = "platform.di-framework.dev/instance";
/// Label on everything the controller creates or changes for an instance (the host namespace,
/// its NetworkPolicy, the kubeconfig Secret, the storage cleanup Job), holding the instance's
/// `metadata.uid`. The controller checks it before it changes, believes or deletes the object: two
/// instances can map to one host namespace, and an instance deleted and created again under the
/// same name has a new UID, so a name alone never proves ownership.
pub const INSTANCE_UID_LABEL: &str = "platform.di-framework.dev/instance-uid";
/// Label on every host namespace.
pub const HOST_NAMESPACE_LABEL: &str = "platform.di-framework.dev/host-namespace";
/// Annotation on an instance that allows `spec.version` to go below `status.installedVersion`.
pub const ALLOW_DOWNGRADE_ANNOTATION: &str = "platform.di-framework.dev/allow-downgrade";
/// Annotation on an instance asking for an immediate retry: set it to a new value (such as the
/// current time); `status.acknowledgedRetry` shows the value acted on.
pub const RETRY_ANNOTATION: &str = "platform.di-framework.dev/retry";
/// Annotation on an instance approving the upgrade to the version it holds
/// (`spec.upgrade.approval: Manual`).
pub const APPROVE_ANNOTATION: &str = "platform.di-framework.dev/approve";
/// Annotation on objects the controller applies, holding a hash of what it applied, so a
/// reconcile that finds nothing changed writes nothing.
pub const APPLIED_HASH_ANNOTATION: &str = "platform.di-framework.dev/applied-hash";
/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "platform-operator";
/// The standard label naming who manages an object; the operator sets it to [`MANAGED_BY`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on everything the operator creates.
pub const MANAGED_BY: &str = "platform-operator";
/// The label selector of everything the operator creates (the controller watches its Secrets
/// with it).
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=platform-operator";
/// Annotation on a host namespace recording `service/vcluster` as `<uid>/<hash of its UID>`.
pub const OWNER_SERVICE_ANNOTATION: &str = "platform.di-framework.dev/vcluster-service";
/// The name of the vCluster's Helm release, its Service and its control plane Deployment in every
/// host namespace.
pub const VCLUSTER: &str = "vcluster";
/// Helm's annotation naming the release an object belongs to (checked before the controller
/// scales the control plane Deployment).
pub const HELM_RELEASE_ANNOTATION: &str = "meta.helm.sh/release-name";
/// The pod label value (`app`) of the vCluster's pods.
pub const VCLUSTER_APP: &str = "vcluster";
/// The NetworkPolicy in every host namespace admitting the operator to the vCluster's API.
pub const VCLUSTER_NETWORK_POLICY: &str = "vcluster-api";
/// The Secret in the host namespace where the vCluster exports its kubeconfig.
pub const EXPORTED_KUBECONFIG_SECRET: &str = "vc-vcluster";
/// The key of that Secret holding the kubeconfig.
pub const EXPORTED_KUBECONFIG_KEY: &str = "config";
/// The key of the instance's kubeconfig Secret (and each membership Secret) holding the
/// kubeconfig.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// The controller's leader Lease in the operator's namespace.
pub const LEADER_LEASE: &str = "platform-operator-controller";

const MAX_NAMESPACE: usize = 63;
/// Hex digits of the digest in a host namespace name: 64 bits.
const HASH_LEN: usize = 16;
/// Hex digits of the digest in the host namespace names of earlier releases: 32 bits.
const LEGACY_HASH_LEN: usize = 8;
/// The longest storage directory name: a readable prefix and the whole digest.
const MAX_STORAGE_DIR: usize = 127;

/// The hex SHA-256 of `<namespace>/<name>` (unambiguous: a namespace holds no `/`).
fn digest_hex(namespace: &str, name: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}/{name}").as_bytes(),
    );
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `pi-<namespace>-<name>-<hash>` in at most `max` bytes, `hash` being the first `hash_len` hex
/// digits of [`digest_hex`]; the readable parts are cut to fit (the hash covers them whole).
fn readable(namespace: &str, name: &str, hash_len: usize, max: usize) -> String {
    let hash = &digest_hex(namespace, name)[..hash_len];
    let budget = max - "pi-".len() - 2 - hash_len;
    let (ns_len, name_len) = split_budget(namespace.len(), name.len(), budget);
    let ns_part = prefix(namespace, ns_len).trim_end_matches('-');
    let name_part = prefix(name, name_len)
        .trim_end_matches(['-', '.'])
        .replace('.', "-");
    format!("pi-{ns_part}-{name_part}-{hash}")
}

/// The host namespace of instance `name` in `namespace`: `pi-<namespace>-<name>-<hash>`, at most
/// 63 characters whatever the lengths of both, stable for the same instance, and distinct for
/// distinct instances: the hash is 64 bits of the SHA-256 of the full `<namespace>/<name>`,
/// which truncation may cut.
pub fn host_namespace(namespace: &str, name: &str) -> String {
    readable(namespace, name, HASH_LEN, MAX_NAMESPACE)
}

/// The host namespace name earlier releases gave (a 32-bit hash). An instance whose namespace of
/// this name carries its UID keeps it, and its storage directory with it.
pub fn legacy_host_namespace(namespace: &str, name: &str) -> String {
    readable(namespace, name, LEGACY_HASH_LEN, MAX_NAMESPACE)
}

/// The instance's storage directory under the storage root, for host namespace `host`: the
/// legacy host namespace's own name when the instance kept one (where its data already is),
/// else `pi-<namespace>-<name>-<the whole 64-digit digest>`.
pub fn storage_dir(namespace: &str, name: &str, host: &str) -> String {
    if host == legacy_host_namespace(namespace, name) {
        host.to_string()
    } else {
        readable(namespace, name, 64, MAX_STORAGE_DIR)
    }
}

/// The longest prefix of `s` of at most `len` bytes that ends on a character boundary: the whole
/// cut for ASCII, one character shorter when `len` falls inside a multi-byte character (names
/// come from admission reviews too, where nothing has checked them yet).
fn prefix(s: &str, len: usize) -> &str {
    let mut end = len.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Shares `budget` characters between two parts, giving each at least half when both need it.
fn split_budget(a: usize, b: usize, budget: usize) -> (usize, usize) {
    if a + b <= budget {
        return (a, b);
    }
    let half = budget / 2;
    if a <= half {
        (a, budget - a)
    } else if b <= budget - half {
        (budget - b, b)
    } else {
        (half, budget - half)
    }
}

/// The Secret holding an instance's admin kubeconfig.
pub fn kubeconfig_secret(name: &str) -> String {
    format!("{name}-kubeconfig")
}

/// The Secret holding the kubeconfig of one membership (`tenant`, `user`) of instance `name`.
/// Tenant and user are DNS labels (no `.`), so no two memberships of any instances share a
/// name, and none ends like an admin Secret (`-kubeconfig`). The CRD admits only names for
/// which it fits in 253 characters.
pub fn membership_kubeconfig_secret(name: &str, tenant: &str, user: &str) -> String {
    format!("{name}.{tenant}.{user}.kubeconfig")
}

/// Whether `s` is a DNS label (RFC 1123), as namespace names are: lower-case letters, digits and
/// `-`, at most 63 characters, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    is_label_of(s, MAX_NAMESPACE)
}

/// Whether `s` can be a storage directory's name ([`storage_dir`]): as a DNS label, but of at
/// most 127 characters.
pub fn is_storage_dir(s: &str) -> bool {
    is_label_of(s, MAX_STORAGE_DIR)
}

fn is_label_of(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_namespace_is_stable_bounded_and_distinct() {
        let short = host_namespace("team-a", "one");
        assert!(short.starts_with("pi-team-a-one-"), "{short}");
        assert_eq!(short, host_namespace("team-a", "one"));
        let long_ns = "n".repeat(63);
        let long_name = format!("{}.x", "m".repeat(250));
        let mut seen = std::collections::HashSet::new();
        for (ns, name) in [
            ("team-a", "one"),
            ("team-a", "two"),
            ("team", "a-one"),
            (long_ns.as_str(), long_name.as_str()),
            (long_ns.as_str(), "m"),
            ("a", long_name.as_str()),
            (long_ns.as_str(), &long_name[..200]),
            ("ns-with-trailing-", "name-"),
        ] {
            let host = host_namespace(ns, name);
            assert!(
                is_dns_label(&host),
                "{ns}/{name} -> {host:?} ({} chars)",
                host.len()
            );
            assert!(seen.insert(host.clone()), "{ns}/{name} collides: {host}");
        }
    }

    #[test]
    fn ascii_names_keep_their_host_namespace() {
        // Pinned: the controller finds existing host namespaces by these names.
        assert_eq!(
            host_namespace("team-a", "one"),
            "pi-team-a-one-45f59575f46826b4"
        );
        assert_eq!(
            legacy_host_namespace("team-a", "one"),
            "pi-team-a-one-45f59575"
        );
    }

    #[test]
    fn storage_directories_are_keyed_by_the_whole_digest_or_kept() {
        let host = host_namespace("team-a", "one");
        let dir = storage_dir("team-a", "one", &host);
        assert_eq!(dir.len(), "pi-team-a-one-".len() + 64, "{dir}");
        assert!(dir.starts_with(&host), "{dir}");
        let legacy = legacy_host_namespace("team-a", "one");
        assert_eq!(storage_dir("team-a", "one", &legacy), legacy);
        let long = storage_dir(&"n".repeat(63), &"m".repeat(253), &host);
        assert!(is_storage_dir(&long) && is_storage_dir(&dir), "{long}");
        assert!(!is_storage_dir("../x") && !is_storage_dir(&"a".repeat(128)));
        assert!(
            long.len() <= MAX_STORAGE_DIR && !long.contains('/'),
            "{long}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any strings at all (reviews carry names nothing has validated yet): no panic, at most
        /// 63 bytes, and the same answer twice.
        #[test]
        fn any_names_give_a_bounded_name_without_panicking(ns in "\\PC{0,80}", name in "\\PC{0,300}") {
            let host = host_namespace(&ns, &name);
            proptest::prop_assert!(host.len() <= 63, "{host:?}");
            proptest::prop_assert_eq!(host, host_namespace(&ns, &name));
        }

        /// Valid Kubernetes names always give a DNS label.
        #[test]
        fn valid_names_give_a_dns_label(ns in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name in "[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?") {
            let host = host_namespace(&ns, &name);
            proptest::prop_assert!(is_dns_label(&host), "{ns}/{name} -> {host:?}");
        }
    }
}
