//! The objects the reconciler applies for an instance (host namespace, NetworkPolicy, kubeconfig
//! Secret, cleanup Job) and the vCluster chart's values. Pure.

use std::collections::BTreeMap;

use common::names::{
    HOST_NAMESPACE_LABEL, INSTANCE_ANNOTATION, INSTANCE_UID_LABEL, KUBECONFIG_KEY, MANAGED_BY,
    MANAGED_BY_LABEL, VCLUSTER_APP, VCLUSTER_NETWORK_POLICY, kubeconfig_secret,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::json;

use super::Settings;
use crate::pod_security::{Level, host_namespace_labels};

/// `app.kubernetes.io/managed-by: platform-operator`, and `extra`.
fn labels<'a>(extra: impl IntoIterator<Item = (&'a str, &'a str)>) -> BTreeMap<String, String> {
    std::iter::once((MANAGED_BY_LABEL, MANAGED_BY))
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn one(key: &str, value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(key.to_string(), value.to_string())])
}

/// The host namespace of instance `instance` (UID `uid`), with the Pod Security labels of a
/// vCluster enforcing `pod_security` inside.
pub fn namespace(instance: &str, uid: &str, host_ns: &str, pod_security: Level) -> Namespace {
    let mut labels = labels([(HOST_NAMESPACE_LABEL, "true"), (INSTANCE_UID_LABEL, uid)]);
    labels.extend(host_namespace_labels(pod_security));
    Namespace {
        metadata: ObjectMeta {
            name: Some(host_ns.to_string()),
            labels: Some(labels),
            annotations: Some(one(INSTANCE_ANNOTATION, instance)),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// The NetworkPolicy `vcluster-api`: the vCluster's pods take traffic from the operator's
/// namespace and their own only.
pub fn network_policy(host_ns: &str, uid: &str, operator_ns: &str) -> NetworkPolicy {
    let operator = json!({"kubernetes.io/metadata.name": operator_ns});
    let policy = json!({
        "metadata": {
            "name": VCLUSTER_NETWORK_POLICY,
            "namespace": host_ns,
            "labels": labels([(INSTANCE_UID_LABEL, uid)]),
        },
        "spec": {
            "podSelector": {"matchLabels": {"app": VCLUSTER_APP}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"namespaceSelector": {"matchLabels": operator}}]},
                {"from": [{"podSelector": {}}]},
            ],
        },
    });
    serde_json::from_value(policy).expect("a NetworkPolicy")
}

/// The hash of the namespace and NetworkPolicy, annotated so that an idle reconcile writes nothing.
pub fn namespace_hash(namespace: &Namespace, policy: &NetworkPolicy) -> String {
    hash(&json!([namespace, policy]))
}

/// The instance's kubeconfig Secret `<name>-kubeconfig`, owned by the instance.
pub fn kubeconfig_secret_object(
    namespace: &str,
    name: &str,
    uid: &str,
    owner: Option<OwnerReference>,
    kubeconfig: &str,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(kubeconfig_secret(name)),
            namespace: Some(namespace.to_string()),
            owner_references: Some(owner.into_iter().collect()),
            labels: Some(labels([(INSTANCE_UID_LABEL, uid)])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

/// Where the cleanup Job mounts `--storage-root-base`.
pub const CLEANUP_MOUNT: &str = "/storage";

/// The controller binary in the operator image (its Dockerfile's ENTRYPOINT).
pub const IMAGE_CONTROLLER: &str = "/usr/local/bin/controller";

/// The storage cleanup Job: `controller cleanup` from `--cleanup-image` removes only this
/// instance's directory `storage_dir` under `--storage-root-base` (`crate::cleanup`), and none
/// whose owner marker names another (which fails the Job at once: its pod failure policy), as
/// root with only the capabilities to remove any file; pinned to `node`, bounded by
/// `--cleanup-deadline`.
pub fn cleanup_job(
    settings: &Settings,
    (host_ns, storage_dir): (&str, &str),
    instance: &str,
    uid: &str,
    node: &str,
) -> Job {
    let command = [IMAGE_CONTROLLER, "cleanup", "--root", CLEANUP_MOUNT];
    let command = command
        .into_iter()
        .chain(["--dir", storage_dir, "--uid", uid]);
    let container = json!({
        "name": "cleanup",
        "image": settings.cleanup_image,
        "command": command.collect::<Vec<_>>(),
        "securityContext": {
            "privileged": false,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsUser": 0,
            "runAsNonRoot": false,
            "capabilities": {"drop": ["ALL"], "add": ["DAC_OVERRIDE", "FOWNER"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "storage", "mountPath": CLEANUP_MOUNT}],
    });
    let volume = json!({
        "name": "storage",
        "hostPath": {"path": settings.storage_root_base, "type": "DirectoryOrCreate"},
    });
    let conflict = json!({
        "action": "FailJob",
        "onExitCodes": {
            "containerName": "cleanup",
            "operator": "In",
            "values": [crate::marker::CONFLICT_EXIT],
        },
    });
    let job = json!({
        "metadata": {
            "name": host_ns,
            "namespace": settings.cleanup_namespace,
            "labels": labels([(INSTANCE_UID_LABEL, uid)]),
            "annotations": one(INSTANCE_ANNOTATION, instance),
        },
        "spec": {
            "activeDeadlineSeconds": settings.cleanup_deadline.as_secs().max(1),
            "backoffLimit": settings.cleanup_backoff_limit,
            "podFailurePolicy": {"rules": [conflict]},
            "ttlSecondsAfterFinished": settings.cleanup_ttl.as_secs().min(i32::MAX as u64),
            "template": {"spec": {
                "restartPolicy": "Never",
                "nodeName": node,
                "automountServiceAccountToken": false,
                "containers": [container],
                "volumes": [volume],
            }},
        },
    });
    serde_json::from_value(job).expect("a cleanup Job is a Job")
}

/// The control plane's affinity to `node`, which holds its hostPath storage: the node by name
/// (`metadata.name`, as the DaemonSet controller pins its pods), not by a label that may differ.
pub fn pin(node: &str) -> serde_json::Value {
    let by_name = json!({"key": "metadata.name", "operator": "In", "values": [node]});
    let terms = json!({"nodeSelectorTerms": [{"matchFields": [by_name]}]});
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}})
}

/// Who the control plane's init container `storage-owner` claims the storage directory for:
/// `controller claim-storage` from `image`, for the instance `<ns>/<name>` of `uid`.
pub struct Claim<'a> {
    /// `--cleanup-image`.
    pub image: &'a str,
    /// The instance's UID.
    pub uid: &'a str,
    /// `<ns>/<name>`.
    pub instance: &'a str,
}

/// The init container that checks and writes the storage directory's owner marker
/// ([`crate::marker`]) before the control plane starts: root (the directory's owner) with only
/// `DAC_OVERRIDE`, exiting [`crate::marker::CONFLICT_EXIT`] when the marker names another.
fn storage_owner(claim: &Claim<'_>) -> serde_json::Value {
    json!({
        "name": STORAGE_OWNER_CONTAINER,
        "image": claim.image,
        "command": [IMAGE_CONTROLLER, "claim-storage", "--dir", "/data", "--uid", claim.uid, "--instance", claim.instance],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "securityContext": {
            "runAsUser": 0, "runAsNonRoot": false, "privileged": false,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "terminationMessagePolicy": "FallbackToLogsOnError"
    })
}

/// The name of the control plane's init container that claims the storage directory.
pub const STORAGE_OWNER_CONTAINER: &str = "storage-owner";

/// The vCluster chart's values for one instance (only keys of the chart's `values.schema.json`,
/// which refuses any other): its storage `<storage_root_base>/<storage_dir>`, claimed by
/// `claim` before the control plane starts, which is pinned to `node` once one holds it.
pub fn vcluster_values(
    storage_root_base: &str,
    host_ns: &str,
    storage_dir: &str,
    pod_security: Level,
    node: Option<&str>,
    claim: &Claim<'_>,
    resources: Option<&common::crd::InstanceResources>,
) -> String {
    let mut values = json!({
        "exportKubeConfig": {"server": format!("https://vcluster.{host_ns}.svc:443")},
        "controlPlane": {
            // vCluster's serving certificate names `vcluster`, `vcluster.<namespace>`, its IPs,
            // localhost and the kubernetes.default names, not `vcluster.<namespace>.svc`: the
            // exported server's name must be added for any TLS client to accept it.
            "proxy": {"extraSANs": [format!("vcluster.{host_ns}.svc")]},
            "statefulSet": {
                "persistence": {
                    "volumeClaim": {"enabled": false},
                    "dataVolume": [{"name": "data", "hostPath": {"path": format!("{}/{storage_dir}", storage_root_base.trim_end_matches('/')), "type": "DirectoryOrCreate"}}]
                },
                "initContainers": [storage_owner(claim)]
            }
        },
        "policies": {"networkPolicy": {"enabled": false}, "podSecurityStandard": pod_security.to_string()},
        // The platform writes its tenant isolation and egress policies inside the vCluster; the
        // host's CNI enforces only what vCluster syncs to the host namespace (off by default).
        "sync": {"toHost": {"networkPolicies": {"enabled": true}}},
        // No owner reference to `service/vcluster` on what the syncer writes to the host: with
        // one, a deleted Service let the garbage collector delete every synced object within a
        // second, and the running syncer then deleted their virtual originals (a host copy that
        // vanished is taken for a deletion), before any restore could act. The host namespace,
        // deleted with the instance, still removes them all.
        "experimental": {"syncSettings": {"setOwner": false}}
    });
    if let Some(node) = node {
        values["controlPlane"]["statefulSet"]["scheduling"] = json!({"affinity": pin(node)});
    }
    super::quota::add(&mut values, resources);
    serde_saphyr::to_string(&values).unwrap_or_default()
}

/// A hash of what identifies `service/vcluster`: its UID, nothing the chart sets (hashing its
/// labels and spec once made a chart upgrade delete it, and with it all vCluster synced).
pub fn service_hash(svc: &Service) -> String {
    hash(&json!({"uid": svc.metadata.uid}))
}

/// The first 8 bytes of the SHA-256 of `value`'s JSON, in hex.
fn hash(value: &serde_json::Value) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, value.to_string().as_bytes());
    crate::chart::hex(&digest.as_ref()[..8])
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    fn settings() -> Settings {
        Settings {
            storage_root_base: "/var/lib/kubesolo/instances".into(),
            target_poll: Duration::from_secs(10),
            repair_interval: Duration::from_secs(1800),
            cleanup_namespace: "platform-operator".into(),
            cleanup_image: "ghcr.io/di-framework/platform-operator@sha256:00".into(),
            cleanup_backoff_limit: 3,
            cleanup_ttl: Duration::from_secs(86400),
            cleanup_deadline: Duration::from_secs(1800),
            api_probe_timeout: Duration::from_secs(5),
            state_dir: PathBuf::from("/state"),
            operator_namespace: "platform-operator".into(),
            chart: PathBuf::from("/chart.tgz"),
            chart_version: "0.37.3".into(),
            extra_values: None,
            operator_user: "op".into(),
            max_retries: 5,
            syncer_account: "vc-vcluster".into(),
            install_platform: true,
            pod_security: Level::Baseline,
            default_resources: None,
            supported_versions: ((6, 0), (6, 0)),
        }
    }

    fn value(object: impl serde::Serialize) -> serde_json::Value {
        serde_json::to_value(object).expect("json")
    }

    /// What the controller applied before its objects were typed: the same JSON, so the same
    /// fields are owned and the applied-hash of existing host namespaces still matches.
    #[test]
    fn typed_objects_serialize_as_the_literals_they_replace() {
        let host_ns = "pi-team-a-one-12345678";
        assert_eq!(
            value(namespace("team-a/one", "u-1", host_ns, Level::Baseline)),
            json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": host_ns,
                    "labels": {
                        HOST_NAMESPACE_LABEL: "true", INSTANCE_UID_LABEL: "u-1", "app.kubernetes.io/managed-by": "platform-operator",
                        "pod-security.kubernetes.io/enforce": "privileged",
                        "pod-security.kubernetes.io/enforce-version": "latest",
                        "pod-security.kubernetes.io/warn": "baseline",
                        "pod-security.kubernetes.io/warn-version": "latest",
                        "pod-security.kubernetes.io/audit": "baseline",
                        "pod-security.kubernetes.io/audit-version": "latest"
                    },
                    "annotations": {INSTANCE_ANNOTATION: "team-a/one"}
                }
            })
        );
        assert_eq!(
            value(network_policy(host_ns, "u-1", "platform-operator")),
            json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "vcluster-api", "namespace": host_ns, "labels": {INSTANCE_UID_LABEL: "u-1", "app.kubernetes.io/managed-by": "platform-operator"}},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "vcluster"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "platform-operator"}}}]},
                        {"from": [{"podSelector": {}}]}
                    ]
                }
            })
        );
        let settings = settings();
        assert_eq!(
            value(cleanup_job(
                &settings,
                (host_ns, "pi-team-a-one-full"),
                "team-a/one",
                "u-1",
                "node-1"
            )),
            json!({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": host_ns, "namespace": settings.cleanup_namespace,
                             "labels": {INSTANCE_UID_LABEL: "u-1", "app.kubernetes.io/managed-by": "platform-operator"},
                             "annotations": {INSTANCE_ANNOTATION: "team-a/one"}},
                "spec": {
                    "activeDeadlineSeconds": 1800,
                    "backoffLimit": 3,
                    "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"containerName": "cleanup", "operator": "In", "values": [3]}}]},
                    "ttlSecondsAfterFinished": 86400,
                    "template": {"spec": {
                        "restartPolicy": "Never",
                        "nodeName": "node-1",
                        "automountServiceAccountToken": false,
                        "containers": [{
                            "name": "cleanup",
                            "image": settings.cleanup_image,
                            "command": ["/usr/local/bin/controller", "cleanup", "--root", "/storage", "--dir", "pi-team-a-one-full", "--uid", "u-1"],
                            "securityContext": {
                                "privileged": false,
                                "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "runAsUser": 0,
                                "runAsNonRoot": false,
                                "capabilities": {"drop": ["ALL"], "add": ["DAC_OVERRIDE", "FOWNER"]},
                                "seccompProfile": {"type": "RuntimeDefault"}
                            },
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "volumeMounts": [{"name": "storage", "mountPath": "/storage"}]
                        }],
                        "volumes": [{"name": "storage", "hostPath": {"path": settings.storage_root_base, "type": "DirectoryOrCreate"}}]
                    }}
                }
            })
        );
        assert_eq!(
            value(kubeconfig_secret_object("team-a", "one", "u-1", None, "kc")),
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "one-kubeconfig", "namespace": "team-a", "ownerReferences": [],
                             "labels": {INSTANCE_UID_LABEL: "u-1", "app.kubernetes.io/managed-by": "platform-operator"}},
                "type": "Opaque",
                "data": {"kubeconfig": ByteString(b"kc".to_vec())}
            })
        );
    }

    #[test]
    fn the_values_carry_only_keys_of_the_chart() {
        let claim = Claim {
            image: "ghcr.io/di-framework/platform-operator@sha256:00",
            uid: "u-1",
            instance: "a/b",
        };
        let values: serde_json::Value = serde_saphyr::from_str(&vcluster_values(
            "/srv/instances/",
            "pi-a-b-1234",
            "pi-a-b-12345678",
            Level::Restricted,
            Some("node-7"),
            &claim,
            None,
        ))
        .expect("yaml");
        let mut roots: Vec<&str> = values
            .as_object()
            .expect("mapping")
            .keys()
            .map(String::as_str)
            .collect();
        roots.sort_unstable();
        assert_eq!(
            roots,
            [
                "controlPlane",
                "experimental",
                "exportKubeConfig",
                "policies",
                "sync"
            ]
        );
        assert_eq!(
            values["experimental"]["syncSettings"]["setOwner"], false,
            "nothing synced is owned by service/vcluster"
        );
        assert_eq!(
            values["exportKubeConfig"]["server"],
            "https://vcluster.pi-a-b-1234.svc:443"
        );
        assert_eq!(
            values["controlPlane"]["proxy"]["extraSANs"],
            json!(["vcluster.pi-a-b-1234.svc"])
        );
        assert_eq!(values["sync"]["toHost"]["networkPolicies"]["enabled"], true);
        assert_eq!(values["policies"]["podSecurityStandard"], "restricted");
        let persistence = &values["controlPlane"]["statefulSet"]["persistence"];
        assert_eq!(persistence["volumeClaim"]["enabled"], false);
        assert_eq!(
            persistence["dataVolume"][0]["hostPath"]["path"],
            "/srv/instances/pi-a-b-12345678"
        );
        // The storage owner check runs first, on the data volume, from the operator's image.
        let init = &values["controlPlane"]["statefulSet"]["initContainers"][0];
        assert_eq!(init["name"], STORAGE_OWNER_CONTAINER);
        assert_eq!(init["image"], claim.image);
        assert_eq!(
            init["command"],
            json!([
                IMAGE_CONTROLLER,
                "claim-storage",
                "--dir",
                "/data",
                "--uid",
                "u-1",
                "--instance",
                "a/b"
            ])
        );
        assert_eq!(
            init["volumeMounts"],
            json!([{"name": "data", "mountPath": "/data"}])
        );
        assert_eq!(
            init["securityContext"]["capabilities"]["drop"],
            json!(["ALL"])
        );
        let term = &values["controlPlane"]["statefulSet"]["scheduling"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0];
        assert_eq!(
            term["matchFields"],
            json!([{"key": "metadata.name", "operator": "In", "values": ["node-7"]}])
        );
    }

    #[test]
    fn the_cleanup_job_takes_its_backoff_and_ttl_from_the_flags() {
        let settings = Settings {
            cleanup_backoff_limit: 0,
            cleanup_ttl: Duration::from_secs(600),
            ..settings()
        };
        let job = value(cleanup_job(
            &settings,
            ("pi-x", "pi-x-full"),
            "a/b",
            "u-2",
            "node-7",
        ));
        assert_eq!(job["spec"]["backoffLimit"], 0);
        assert_eq!(job["spec"]["ttlSecondsAfterFinished"], 600);
        assert_eq!(job["spec"]["activeDeadlineSeconds"], 1800);
        assert_eq!(job["metadata"]["labels"][INSTANCE_UID_LABEL], "u-2");
        assert_eq!(
            job["spec"]["template"]["spec"]["nodeName"], "node-7",
            "pinned to the node that holds the data"
        );
    }
}
