//! Quotas per instance: `spec.resources` (or the fleet-wide `--default-instance-resources`) as
//! the vCluster chart's own `policies.resourceQuota` and `policies.limitRange` values, so the
//! chart renders the ResourceQuota and LimitRange `vc-vcluster` in the host namespace with
//! exactly what was asked (the chart's example quota and limits, which Helm would merge in, are
//! removed with `null`), and an annotation on the control plane that tells the release current.

use common::crd::{InstanceResources, PlatformInstance, Quantities};

use super::Settings;
use serde_json::{Map, Value, json};

/// The control plane's annotation holding a hash of the policies its release was given.
pub const POLICIES_ANNOTATION: &str = "platform.di-framework.dev/policies-hash";

/// The chart's example `policies.resourceQuota.quota` keys (vCluster 0.37 `values.yaml`).
const CHART_QUOTA: [&str; 15] = [
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "services.nodeports",
    "services.loadbalancers",
    "count/endpoints",
    "count/pods",
    "count/services",
    "count/secrets",
    "count/configmaps",
    "count/persistentvolumeclaims",
];

/// The chart's example `policies.limitRange.default` and `defaultRequest` keys.
const CHART_LIMITS: [&str; 3] = ["ephemeral-storage", "memory", "cpu"];

/// `given`, with each of the chart's `examples` it does not name set to `null` (removed).
fn exactly(given: Option<&Quantities>, examples: &[&str]) -> Value {
    let mut out: Map<String, Value> = examples
        .iter()
        .map(|k| (k.to_string(), Value::Null))
        .collect();
    for (k, v) in given.into_iter().flatten() {
        out.insert(k.clone(), Value::String(v.0.0.clone()));
    }
    Value::Object(out)
}

/// The chart's `policies` values for `r` (merged beside the operator's other `policies`).
pub fn policies(r: &InstanceResources) -> Value {
    let quota = match &r.quota {
        Some(q) => json!({"enabled": true, "quota": exactly(Some(q), &CHART_QUOTA)}),
        None => json!({"enabled": false}),
    };
    let limits = match &r.limit_range {
        Some(l) => json!({
            "enabled": true,
            "default": exactly(l.default.as_ref(), &CHART_LIMITS),
            "defaultRequest": exactly(l.default_request.as_ref(), &CHART_LIMITS),
            "min": exactly(l.min.as_ref(), &[]),
            "max": exactly(l.max.as_ref(), &[]),
        }),
        None => json!({"enabled": false}),
    };
    json!({"resourceQuota": quota, "limitRange": limits})
}

/// The quotas instance `pi` asks for: its `spec.resources`, else the fleet-wide default.
pub fn wanted<'a>(
    pi: &'a PlatformInstance,
    settings: &'a Settings,
) -> Option<&'a InstanceResources> {
    pi.spec
        .resources
        .as_ref()
        .or(settings.default_resources.as_ref())
}

/// Adds the policies for `r` and their hash annotation to the chart's `values` (nothing for none).
pub fn add(values: &mut Value, r: Option<&InstanceResources>) {
    let (Some(r), Some(hash)) = (r, policies_hash(r)) else {
        return;
    };
    if let (Some(to), Value::Object(from)) = (values["policies"].as_object_mut(), policies(r)) {
        to.extend(from);
    }
    values["controlPlane"]["statefulSet"]["annotations"] = json!({POLICIES_ANNOTATION: hash});
}

/// The hash the control plane's [`POLICIES_ANNOTATION`] carries for `r` (none: no annotation).
pub fn policies_hash(r: Option<&InstanceResources>) -> Option<String> {
    let digest = |v: &Value| ring::digest::digest(&ring::digest::SHA256, v.to_string().as_bytes());
    r.map(|r| crate::chart::hex(&digest(&policies(r)).as_ref()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_was_asked_is_set_and_the_rest_switched_off() {
        let r: InstanceResources = serde_json::from_value(json!({
            "quota": {"limits.cpu": 4, "count/pods": "50"},
        }))
        .expect("resources");
        let p = policies(&r);
        assert_eq!(p["resourceQuota"]["quota"]["limits.cpu"], "4");
        assert_eq!(p["resourceQuota"]["quota"]["count/pods"], "50");
        assert_eq!(p["resourceQuota"]["quota"]["requests.memory"], Value::Null);
        assert_eq!(p["limitRange"], json!({"enabled": false}));
        assert_ne!(
            policies_hash(Some(&r)),
            policies_hash(Some(&InstanceResources::default()))
        );
        assert_eq!(policies_hash(None), None);
    }
}
