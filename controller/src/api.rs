//! Small helpers over kube's `Api` that every writer of the controller uses: server-side apply
//! under the operator's field manager, merge patches under it, and delete where an object already
//! gone is fine.

use common::names::FIELD_MANAGER;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The API server answered 404 Not Found.
pub fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// `result`, with an object already gone counted as done.
pub fn gone_is_done<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(e) if !not_found(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Deletes `name` with `params` if `delete` says so of it, checked at the moment of the delete
/// and not only when the reconcile observed it: the object is read, and deleted with its own UID
/// as a precondition, so an object created again in between (by someone else) is never the one
/// deleted. An object already gone is not an error. Returns false when `delete` said no.
pub async fn delete_if<K>(
    api: &Api<K>,
    name: &str,
    params: DeleteParams,
    delete: impl FnOnce(&ObjectMeta) -> bool,
) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(object) = api.get_opt(name).await? else {
        return Ok(true);
    };
    if !delete(object.meta()) {
        return Ok(false);
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: object.uid(),
            resource_version: None,
        }),
        ..params
    };
    gone_is_done(api.delete(name, &params).await).map(|()| true)
}

/// Merge patches under the operator's field manager.
pub fn manager() -> PatchParams {
    // Unforced, `apply`'s params are a merge patch's too: its field manager alone.
    PatchParams::apply(FIELD_MANAGER)
}

/// Applies `object` as `name` with server-side apply, forcing the operator's field manager.
pub async fn apply<K>(
    api: &Api<K>,
    name: &str,
    object: &(impl Serialize + std::fmt::Debug),
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_404_is_not_found() {
        let api = |code| {
            kube::Error::Api(
                kube::core::Status {
                    code,
                    ..Default::default()
                }
                .boxed(),
            )
        };
        assert!(not_found(&api(404)));
        assert!(!not_found(&api(409)));
        assert!(!not_found(&api(403)));
    }
}
