//! The one rule of what is an instance's: everything the controller creates for an instance
//! carries its UID in the label `platform.di-framework.dev/instance-uid`, and is changed, believed
//! or deleted only while it does. Every other place asks here.

use common::names::{INSTANCE_ANNOTATION, INSTANCE_UID_LABEL};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn uid_mark(meta: &ObjectMeta) -> Option<&String> {
    meta.labels.as_ref()?.get(INSTANCE_UID_LABEL)
}

/// Whether `meta` carries the UID mark of instance `uid`: `Some(true)` marked with it,
/// `Some(false)` marked with another, `None` unmarked.
pub fn marked(meta: &ObjectMeta, uid: &str) -> Option<bool> {
    uid_mark(meta).map(|mark| mark == uid)
}

/// Whether an instance's kubeconfig Secret is instance `uid`'s: it carries its UID mark, or,
/// unmarked (written by an earlier release), an owner reference to it.
pub fn kubeconfig_secret(meta: &ObjectMeta, uid: &str) -> bool {
    marked(meta, uid)
        .unwrap_or_else(|| meta.owner_references.iter().flatten().any(|r| r.uid == uid))
}

/// Whom the host namespace belongs to when it is not instance `key`'s (UID `uid`): the
/// instance its annotation names when that is another; an earlier instance of the same name
/// when its mark is another UID; and someone else when it carries no mark at all. The controller
/// marks a namespace in the apply that creates it, so an unmarked one was made by someone else
/// (anyone who may create namespaces could pre-create an instance's): it is never adopted.
pub fn host_namespace(namespace: &Namespace, key: &str, uid: &str) -> Option<String> {
    let meta = &namespace.metadata;
    let named = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(INSTANCE_ANNOTATION));
    if let Some(other) = named.filter(|a| *a != key) {
        return Some(other.clone());
    }
    match uid_mark(meta) {
        Some(mark) if mark == uid => None,
        Some(theirs) => Some(format!(
            "{} (UID {theirs})",
            named.map_or("another instance", String::as_str)
        )),
        None => Some(format!(
            "someone else (it carries no {INSTANCE_UID_LABEL} label, so the controller did not create it; to hand it to this instance, label it {INSTANCE_UID_LABEL}={uid})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn foreign_owner(namespace: &Namespace, key: &str, uid: &str) -> Option<String> {
        host_namespace(namespace, key, uid)
    }

    fn namespace(labels: serde_json::Value, annotations: serde_json::Value) -> Namespace {
        serde_json::from_value(json!({
            "metadata": {"name": "pi-a-b-1", "labels": labels, "annotations": annotations}
        }))
        .expect("namespace")
    }

    #[test]
    fn only_a_namespace_marked_with_the_instance_uid_is_its_own() {
        let ours = namespace(
            json!({INSTANCE_UID_LABEL: "u-1"}),
            json!({INSTANCE_ANNOTATION: "a/b"}),
        );
        assert_eq!(foreign_owner(&ours, "a/b", "u-1"), None);
        // The same name, an earlier instance (deleted and created again).
        assert_eq!(
            foreign_owner(&ours, "a/b", "u-2").as_deref(),
            Some("a/b (UID u-1)")
        );
        // Another instance that maps to the same host namespace.
        assert_eq!(foreign_owner(&ours, "a/c", "u-3").as_deref(), Some("a/b"));
        // Unmarked: the controller did not create it (it marks every namespace in the apply
        // that creates it), whatever its annotation says; anyone who may create namespaces
        // could have made it, so it is never adopted.
        let annotated = namespace(json!({}), json!({INSTANCE_ANNOTATION: "a/b"}));
        let owner = foreign_owner(&annotated, "a/b", "u-1").expect("not adopted");
        assert!(
            owner.contains(INSTANCE_UID_LABEL) && owner.contains("u-1"),
            "{owner}"
        );
        assert_eq!(
            foreign_owner(&annotated, "a/c", "u-1").as_deref(),
            Some("a/b")
        );
        let bare = namespace(json!({}), json!({}));
        let owner = foreign_owner(&bare, "a/b", "u-1").expect("not adopted");
        assert!(owner.contains(INSTANCE_UID_LABEL), "{owner}");
    }
}
