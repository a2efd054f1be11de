//! Keeps the webhook's CA bundle in the `caBundle` of every webhook in its
//! `MutatingWebhookConfiguration` and `ValidatingWebhookConfiguration`, by server-side apply of
//! that one field with the webhook's own field manager, so a `helm upgrade` (whose manifests carry
//! no `caBundle`) never clears it, and someone resetting it gets it put back.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The field manager of the caBundle writes.
pub const FIELD_MANAGER: &str = "platform-operator-webhook";

/// Errors of caBundle upkeep.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Reading a webhook configuration failed.
    #[error(
        "reading {kind} {name} failed: {source}; check the webhook's RBAC on admissionregistration.k8s.io"
    )]
    Read {
        /// Kind of configuration.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Why.
        source: kube::Error,
    },
    /// Writing the caBundle failed.
    #[error("writing the caBundle of {kind} {name} failed: {source}")]
    Write {
        /// Kind of configuration.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Why.
        source: kube::Error,
    },
}

/// The two configurations, by name.
#[derive(Clone, Debug)]
pub struct Configurations {
    /// The MutatingWebhookConfiguration's name.
    pub mutating: String,
    /// The ValidatingWebhookConfiguration's name.
    pub validating: String,
}

/// The webhook names and their current caBundles in one configuration; `None` when it does not exist.
type Entries = Option<Vec<(String, Option<ByteString>)>>;

async fn mutating_entries(client: &kube::Client, name: &str) -> Result<Entries, BundleError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let found = api
        .get_opt(name)
        .await
        .map_err(|source| BundleError::Read {
            kind: "MutatingWebhookConfiguration",
            name: name.into(),
            source,
        })?;
    Ok(found.map(|c| {
        c.webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| (w.name, w.client_config.ca_bundle))
            .collect()
    }))
}

async fn validating_entries(client: &kube::Client, name: &str) -> Result<Entries, BundleError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let found = api
        .get_opt(name)
        .await
        .map_err(|source| BundleError::Read {
            kind: "ValidatingWebhookConfiguration",
            name: name.into(),
            source,
        })?;
    Ok(found.map(|c| {
        c.webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| (w.name, w.client_config.ca_bundle))
            .collect()
    }))
}

/// What [`ensure`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ensured {
    /// How many configurations it wrote.
    pub written: usize,
    /// Whether both configurations exist and every webhook in them now carries the bundle.
    pub published: bool,
}

/// Applies `bundle` to every webhook of both configurations that lacks it. A missing
/// configuration is skipped (it is retried on the next tick, for example while a chart is still
/// installing) and leaves the bundle unpublished.
pub async fn ensure(
    client: &kube::Client,
    configs: &Configurations,
    bundle: &str,
) -> Result<Ensured, BundleError> {
    let mut written = 0;
    let mut published = true;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mutating = mutating_entries(client, &configs.mutating).await?;
    published &= mutating.as_ref().is_some_and(|e| !e.is_empty());
    if let Some(entries) = mutating
        && needs_write(&entries, bundle)
    {
        let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let patch = apply_patch(
            "MutatingWebhookConfiguration",
            &configs.mutating,
            &entries,
            bundle,
        );
        api.patch(&configs.mutating, &params, &Patch::Apply(&patch))
            .await
            .map_err(|source| BundleError::Write {
                kind: "MutatingWebhookConfiguration",
                name: configs.mutating.clone(),
                source,
            })?;
        written += 1;
    }
    let validating = validating_entries(client, &configs.validating).await?;
    published &= validating.as_ref().is_some_and(|e| !e.is_empty());
    if let Some(entries) = validating
        && needs_write(&entries, bundle)
    {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let patch = apply_patch(
            "ValidatingWebhookConfiguration",
            &configs.validating,
            &entries,
            bundle,
        );
        api.patch(&configs.validating, &params, &Patch::Apply(&patch))
            .await
            .map_err(|source| BundleError::Write {
                kind: "ValidatingWebhookConfiguration",
                name: configs.validating.clone(),
                source,
            })?;
        written += 1;
    }
    Ok(Ensured { written, published })
}

fn needs_write(entries: &[(String, Option<ByteString>)], bundle: &str) -> bool {
    entries
        .iter()
        .any(|(_, b)| b.as_ref().map(|b| b.0.as_slice()) != Some(bundle.as_bytes()))
}

/// The server-side apply patch that owns only `webhooks[*].clientConfig.caBundle`.
fn apply_patch(
    kind: &str,
    name: &str,
    entries: &[(String, Option<ByteString>)],
    bundle: &str,
) -> serde_json::Value {
    let ca = ByteString(bundle.as_bytes().to_vec());
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": { "name": name },
        "webhooks": entries.iter().map(|(n, _)| json!({ "name": n, "clientConfig": { "caBundle": ca } })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_touches_only_the_ca_bundle_of_each_webhook() {
        let entries = vec![
            ("a.example".to_string(), None),
            ("b.example".to_string(), Some(ByteString(b"old".to_vec()))),
        ];
        let patch = apply_patch("ValidatingWebhookConfiguration", "cfg", &entries, "PEM");
        let hooks = patch["webhooks"].as_array().expect("list");
        assert_eq!(hooks.len(), 2);
        for hook in hooks {
            let keys: Vec<&String> = hook.as_object().expect("object").keys().collect();
            assert_eq!(keys, ["clientConfig", "name"]);
            assert_eq!(hook["clientConfig"].as_object().expect("object").len(), 1);
            assert_eq!(
                hook["clientConfig"]["caBundle"], "UEVN",
                "base64 of the bundle"
            );
        }
        assert!(needs_write(&entries, "PEM"));
        let done = vec![("a.example".to_string(), Some(ByteString(b"PEM".to_vec())))];
        assert!(!needs_write(&done, "PEM"));
    }
}
