//! The one rule of what is an instance's: everything the controller creates for an instance
//! carries its UID in the label `platform.di-framework.dev/instance-uid`, and is changed, believed
//! or deleted only while it does. Every other place asks here.

use common::names::{INSTANCE_ANNOTATION, INSTANCE_UID_LABEL};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The UID mark `meta` carries.
fn uid_mark(meta: &ObjectMeta) -> Option<&String> {
    meta.labels.as_ref()?.get(INSTANCE_UID_LABEL)
}

/// Whether `meta` carries the UID mark of instance `uid`: `Some(true)` marked with it,
/// `Some(false)` marked with another, `None` unmarked.
pub fn marked(meta: &ObjectMeta, uid: &str) -> Option<bool> {
    uid_mark(meta).map(|mark| mark == uid)
}

/// Whether an object may be deleted as instance `uid`'s: it carries no other instance's mark.
pub fn deletable(meta: &ObjectMeta, uid: &str) -> bool {
    marked(meta, uid) != Some(false)
}

/// Whether an instance's kubeconfig Secret is instance `uid`'s: it carries its UID mark, or,
/// unmarked (written by an earlier release), an owner reference to it.
pub fn kubeconfig_secret(meta: &ObjectMeta, uid: &str) -> bool {
    marked(meta, uid)
        .unwrap_or_else(|| meta.owner_references.iter().flatten().any(|r| r.uid == uid))
}

/// Whom the host namespace belongs to when it is not instance `key`'s (UID `uid`): the
/// instance its annotation names when that is another; with the same name, another UID in its
/// mark (an earlier instance of the same name). An unmarked namespace (an earlier release created
/// it; the next apply marks it) belongs to the instance its annotation names; one with neither
/// names nobody else, and the instance adopts it (a crash before the first apply leaves such a
/// namespace).
pub fn host_namespace(namespace: &Namespace, key: &str, uid: &str) -> Option<String> {
    let meta = &namespace.metadata;
    let named = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(INSTANCE_ANNOTATION));
    if let Some(other) = named.filter(|a| *a != key) {
        return Some(other.clone());
    }
    let theirs = uid_mark(meta).filter(|mark| *mark != uid)?;
    let named = named.map_or("another instance", String::as_str);
    Some(format!("{named} (UID {theirs})"))
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
        // Unmarked (an earlier release made it): the annotation decides.
        let legacy = namespace(json!({}), json!({INSTANCE_ANNOTATION: "a/b"}));
        assert_eq!(foreign_owner(&legacy, "a/b", "u-1"), None);
        assert_eq!(foreign_owner(&legacy, "a/c", "u-1").as_deref(), Some("a/b"));
        // Neither: it names nobody else, and is adopted.
        let bare = namespace(json!({}), json!({}));
        assert_eq!(foreign_owner(&bare, "a/b", "u-1"), None);
    }
}
