//! The cluster-wide `ValidatingAdmissionPolicy` `platform-operator-protect-vcluster-service` and
//! its binding: in host namespaces, only the operator (and the vCluster's own service accounts)
//! may change or delete `service/vcluster`. The namespace controller and the garbage collector
//! are never stopped, so deleting a host namespace cannot hang. Where the API server has no
//! admission policies, the controller carries on and reports it.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::decide::Protection;
use common::names::{FIELD_MANAGER, HOST_NAMESPACE_LABEL};

/// The policy's (and its binding's) name.
pub const NAME: &str = "platform-operator-protect-vcluster-service";

/// Identities that must always pass: the namespace controller and the garbage collector, whether
/// the controller-manager runs them under its own user or per-controller service accounts.
pub const SYSTEM_USERS: [&str; 3] = [
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:serviceaccount:kube-system:generic-garbage-collector",
];

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    )
}

/// The policy object for an operator running as `operator_user`.
pub fn policy(operator_user: &str) -> serde_json::Value {
    let system = SYSTEM_USERS
        .iter()
        .map(|u| format!("'{u}'"))
        .collect::<Vec<_>>()
        .join(", ");
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "platform-operator"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["UPDATE", "DELETE"], "resources": ["services"]
                }],
                "namespaceSelector": {"matchExpressions": [{"key": HOST_NAMESPACE_LABEL, "operator": "Exists"}]}
            },
            "matchConditions": [
                {"name": "is-vcluster-service", "expression": "(request.operation == 'DELETE' ? oldObject.metadata.name : object.metadata.name) == 'vcluster'"},
                {"name": "not-namespace-controller-or-gc", "expression": format!("!(request.userInfo.username in [{system}])")}
            ],
            "validations": [{
                "expression": format!("request.userInfo.username == '{operator_user}' || request.userInfo.username.startsWith('system:serviceaccount:' + request.namespace + ':vc-')"),
                "message": "service/vcluster of a PlatformInstance host namespace is managed by the platform operator; change the PlatformInstance instead",
                "reason": "Forbidden"
            }]
        }
    })
}

/// The binding that turns the policy on (deny) in every host namespace.
pub fn binding() -> serde_json::Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "platform-operator"}},
        "spec": {"policyName": NAME, "validationActions": ["Deny"]}
    })
}

/// Applies the policy and its binding; reports whether the API server has admission policies.
pub async fn ensure(client: &kube::Client, operator_user: &str) -> Protection {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    );
    match policies
        .patch(NAME, &params, &Patch::Apply(&policy(operator_user)))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Protection::Unsupported,
        Err(e) => return Protection::Failed(e.to_string()),
    }
    let bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
        ),
    );
    match bindings
        .patch(NAME, &params, &Patch::Apply(&binding()))
        .await
    {
        Ok(_) => Protection::Protected,
        Err(kube::Error::Api(s)) if s.code == 404 => Protection::Unsupported,
        Err(e) => Protection::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_spares_system_controllers_and_names_the_operator() {
        let p = policy("system:serviceaccount:platform-operator:platform-operator");
        let conditions = p["spec"]["matchConditions"].to_string();
        for user in SYSTEM_USERS {
            assert!(conditions.contains(user), "{user} must be exempt");
        }
        let rule = p["spec"]["validations"][0]["expression"]
            .as_str()
            .expect("expression");
        assert!(rule.contains("system:serviceaccount:platform-operator:platform-operator"));
        assert_eq!(
            p["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
            json!(["UPDATE", "DELETE"])
        );
        assert_eq!(binding()["spec"]["validationActions"], json!(["Deny"]));
    }
}
