//! The cluster-wide `ValidatingAdmissionPolicy` `platform-operator-protect-vcluster-service` and
//! its binding: in host namespaces, only the operator (and the vCluster syncer's ServiceAccount,
//! named as the chart values in force name it) may change or delete `service/vcluster`. The namespace controller and the garbage collector
//! are never stopped, so deleting a host namespace cannot hang. Where the API server has no
//! admission policies, the controller carries on and reports it.

use std::sync::Arc;
use std::time::Duration;

use common::names::{HOST_NAMESPACE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, VCLUSTER};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::Api;
use serde_json::{Value, json};

use crate::api::{apply, not_found};
use crate::decide::model::Protection;
use crate::reconcile::Context;

/// The policy's (and its binding's) name.
pub const NAME: &str = "platform-operator-protect-vcluster-service";

/// Identities that must always pass: the namespace controller and the garbage collector, whether
/// the controller-manager runs them under its own user or per-controller service accounts.
pub const SYSTEM_USERS: [&str; 3] = [
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:serviceaccount:kube-system:generic-garbage-collector",
];

fn metadata() -> Value {
    json!({"name": NAME, "labels": {MANAGED_BY_LABEL: MANAGED_BY}})
}

/// The ServiceAccount the vCluster syncer runs as (and writes `service/vcluster` as, at its first
/// start) with the chart values `extra` in force: as the chart names it, its
/// `controlPlane.advanced.serviceAccount.name` when set, else `vc-<release>`.
pub fn syncer_account(extra: Option<&Value>) -> String {
    let name = extra.and_then(|v| v.pointer("/controlPlane/advanced/serviceAccount/name"));
    match name.and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => format!("vc-{VCLUSTER}"),
    }
}

/// The policy object for an operator running as `operator_user`, the syncer as ServiceAccount
/// `syncer` of each host namespace.
pub fn policy(operator_user: &str, syncer: &str) -> ValidatingAdmissionPolicy {
    let system = SYSTEM_USERS.map(|u| format!("'{u}'")).join(", ");
    let name = "(request.operation == 'DELETE' ? oldObject.metadata.name : object.metadata.name)";
    let syncer = format!("'system:serviceaccount:' + request.namespace + ':{syncer}'");
    let policy = json!({
        "metadata": metadata(),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE", "DELETE"],
                    "resources": ["services"],
                }],
                "namespaceSelector": {
                    "matchExpressions": [{"key": HOST_NAMESPACE_LABEL, "operator": "Exists"}],
                },
            },
            "matchConditions": [
                {"name": "is-vcluster-service", "expression": format!("{name} == '{VCLUSTER}'")},
                {
                    "name": "not-namespace-controller-or-gc",
                    "expression": format!("!(request.userInfo.username in [{system}])"),
                },
            ],
            "validations": [{
                "expression": format!("request.userInfo.username == '{operator_user}' || request.userInfo.username == {syncer}"),
                "message": "service/vcluster of a PlatformInstance host namespace is managed by the platform operator; change the PlatformInstance instead",
                "reason": "Forbidden",
            }],
        },
    });
    serde_json::from_value(policy).expect("a ValidatingAdmissionPolicy")
}

/// The binding that turns the policy on (deny) in every host namespace.
pub fn binding() -> ValidatingAdmissionPolicyBinding {
    let binding = json!({
        "metadata": metadata(),
        "spec": {"policyName": NAME, "validationActions": ["Deny"]},
    });
    serde_json::from_value(binding).expect("a ValidatingAdmissionPolicyBinding")
}

/// Keeps the policy and its binding applied, every `interval` (`--policy-interval`), and records
/// in the context whether the API server has admission policies, for the decision.
pub async fn keep(ctx: Arc<Context>, interval: Duration) {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(ctx.client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(ctx.client.clone());
    let policy = policy(&ctx.settings.operator_user, &ctx.settings.syncer_account);
    loop {
        let applied = async {
            apply(&policies, NAME, &policy).await?;
            apply(&bindings, NAME, &binding()).await
        };
        let state = match applied.await {
            Ok(()) => Protection::Protected,
            Err(e) if not_found(&e) => Protection::Unsupported,
            Err(e) => {
                tracing::warn!(error = %e, "keeping the admission policy failed");
                Protection::Failed(e.to_string())
            }
        };
        if let Ok(mut p) = ctx.protection.write() {
            *p = state;
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_policy_spares_system_controllers_and_names_the_operator() {
        let p = serde_json::to_value(policy(
            "system:serviceaccount:platform-operator:platform-operator",
            "vc-vcluster",
        ))
        .expect("json");
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
        let binding = serde_json::to_value(binding()).expect("json");
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }

    /// The policy as the controller applied it before it was typed: the same JSON, so server-side
    /// apply owns the same fields.
    #[test]
    fn the_typed_policy_serializes_as_the_literal_it_replaces() {
        let user = "system:serviceaccount:platform-operator:platform-operator";
        let system = SYSTEM_USERS
            .iter()
            .map(|u| format!("'{u}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let literal = json!({
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
                    "expression": format!("request.userInfo.username == '{user}' || request.userInfo.username == 'system:serviceaccount:' + request.namespace + ':vc-vcluster'"),
                    "message": "service/vcluster of a PlatformInstance host namespace is managed by the platform operator; change the PlatformInstance instead",
                    "reason": "Forbidden"
                }]
            }
        });
        let typed = policy(user, &syncer_account(None));
        assert_eq!(serde_json::to_value(typed).expect("json"), literal);
        assert_eq!(
            serde_json::to_value(binding()).expect("json"),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "platform-operator"}},
                "spec": {"policyName": NAME, "validationActions": ["Deny"]}
            })
        );
    }

    /// The syncer's ServiceAccount is named as the real chart names it (`serviceaccount.yaml`,
    /// `statefulset.yaml`: the name value when set, else `vc-<release>`).
    #[test]
    fn the_syncer_is_named_as_the_values_in_force_name_it() {
        assert_eq!(syncer_account(None), "vc-vcluster");
        let named =
            |name: &str| json!({"controlPlane": {"advanced": {"serviceAccount": {"name": name}}}});
        assert_eq!(syncer_account(Some(&named(""))), "vc-vcluster");
        assert_eq!(syncer_account(Some(&named("syncer"))), "syncer");
        let rule = serde_json::to_value(policy("op", "syncer")).expect("json")["spec"]["validations"][0]
            ["expression"]
            .to_string();
        assert!(
            rule.contains("request.namespace + ':syncer'") && !rule.contains(":vc-"),
            "{rule}"
        );
    }
}
