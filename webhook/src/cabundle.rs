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
        kind: String,
        /// Its name.
        name: String,
        /// Why.
        source: kube::Error,
    },
    /// Writing the caBundle failed.
    #[error("writing the caBundle of {kind} {name} failed: {source}")]
    Write {
        /// Kind of configuration.
        kind: String,
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

/// The webhook names and their current caBundles in one configuration.
type Entries = Vec<(String, Option<ByteString>)>;

/// A webhook configuration kind: both list webhooks with a name and a `clientConfig.caBundle`.
trait Configuration:
    kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
{
    /// Its webhooks' names and caBundles.
    fn entries(self) -> Entries;
}

impl Configuration for MutatingWebhookConfiguration {
    fn entries(self) -> Entries {
        let hooks = self.webhooks.unwrap_or_default().into_iter();
        hooks.map(|w| (w.name, w.client_config.ca_bundle)).collect()
    }
}

impl Configuration for ValidatingWebhookConfiguration {
    fn entries(self) -> Entries {
        let hooks = self.webhooks.unwrap_or_default().into_iter();
        hooks.map(|w| (w.name, w.client_config.ca_bundle)).collect()
    }
}

/// What [`ensure`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ensured {
    /// How many configurations it wrote.
    pub written: usize,
    /// Whether every webhook of both configurations now carries the bundle (a missing
    /// configuration has none to carry).
    pub published: bool,
}

/// Applies `bundle` to every webhook of both configurations that lacks it. A missing
/// configuration is skipped (it is retried on the next tick and whenever it appears, for example
/// while a chart is still installing): the API server calls no webhook of it.
pub async fn ensure(
    client: &kube::Client,
    configs: &Configurations,
    bundle: &str,
) -> Result<Ensured, BundleError> {
    let mutating =
        ensure_one::<MutatingWebhookConfiguration>(client, &configs.mutating, bundle).await?;
    let validating =
        ensure_one::<ValidatingWebhookConfiguration>(client, &configs.validating, bundle).await?;
    Ok(Ensured {
        written: mutating.written + validating.written,
        published: mutating.published && validating.published,
    })
}

/// [`ensure`] for the one configuration of kind `C` called `name`.
async fn ensure_one<C: Configuration>(
    client: &kube::Client,
    name: &str,
    bundle: &str,
) -> Result<Ensured, BundleError> {
    let kind = C::kind(&()).to_string();
    let api: Api<C> = Api::all(client.clone());
    let found = api
        .get_opt(name)
        .await
        .map_err(|source| BundleError::Read {
            kind: kind.clone(),
            name: name.into(),
            source,
        })?;
    let entries = found.map(C::entries);
    if carries(entries.as_deref(), bundle) {
        return Ok(Ensured {
            written: 0,
            published: true,
        });
    }
    let entries = entries.unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let patch = apply_patch(&kind, name, &entries, bundle);
    api.patch(name, &params, &Patch::Apply(&patch))
        .await
        .map_err(|source| BundleError::Write {
            kind,
            name: name.into(),
            source,
        })?;
    Ok(Ensured {
        written: 1,
        published: true,
    })
}

/// Whether a configuration's webhooks (`None`: it does not exist) all carry `bundle`.
fn carries(entries: Option<&[(String, Option<ByteString>)]>, bundle: &str) -> bool {
    entries.is_none_or(|e| !needs_write(e, bundle))
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
        // A configuration that is missing, or has no webhook, has nothing to carry: it never
        // holds a rotation back.
        assert!(carries(None, "PEM"));
        assert!(carries(Some(&[]), "PEM"));
        assert!(!carries(Some(&entries), "PEM"));
        let done = vec![("a.example".to_string(), Some(ByteString(b"PEM".to_vec())))];
        assert!(!needs_write(&done, "PEM"));
    }
}
