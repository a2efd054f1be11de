//! The observe step: what [`super::reader`] read, the settings and the clock, turned (purely)
//! into [`Observed`] for the decision and [`Found`] for the actions.

use common::crd::{Approval, PendingUpgrade, PlatformInstance, RepairMode};
use common::names::{
    ALLOW_DOWNGRADE_ANNOTATION, APPLIED_HASH_ANNOTATION, APPROVE_ANNOTATION, FINALIZER,
    KUBECONFIG_KEY, OWNER_SERVICE_ANNOTATION, RETRY_ANNOTATION, kubeconfig_secret, storage_dir,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::error::ConfigError;
use super::reader::Read;
use super::{Settings, key, objects};
use crate::decide::model::{
    Cleanup, Exported, HostNamespace, InstallObserved, InstallOutcome, KubeconfigSecret, Observed,
    OwnerService, Release, Retry, StorageNode,
};
use crate::decide::ownership;
use crate::installer::config::{self as program, ProgramConfig};
use crate::installer::record::Record;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What observe found besides [`Observed`]: what the actions need.
pub struct Found {
    /// The host namespace (see [`super::reader::Read::host_ns`]).
    pub host_ns: String,
    /// The storage directory's name under `--storage-root-base`.
    pub storage_dir: String,
    /// The kubeconfig the vCluster exported (when it was not refused).
    pub exported: Option<String>,
    /// What the program would get now.
    pub config: Option<ProgramConfig>,
    /// The installer's record.
    pub record: Record,
    /// The node that holds the storage (recorded, or to be recorded), to pin the control plane to.
    pub storage_node: Option<String>,
}

/// Observes one instance from what was `read`, at `now`.
pub fn observe(
    pi: &PlatformInstance,
    settings: &Settings,
    mut read: Read,
    now: Timestamp,
) -> (Observed, Found) {
    let host_ns = read.host_ns.clone();
    let storage_dir = storage_dir(
        &pi.namespace().unwrap_or_default(),
        &pi.name_any(),
        &host_ns,
    );
    let uid = pi.uid().unwrap_or_default();
    let deleting = pi.meta().deletion_timestamp.is_some();
    let namespace = read.namespace.as_deref();
    let conflict = namespace.and_then(|n| ownership::host_namespace(n, &key(pi), &uid));
    let desired = || {
        objects::namespace_hash(
            &objects::namespace(&key(pi), &uid, &host_ns, settings.pod_security),
            &objects::network_policy(&host_ns, &uid, &settings.operator_namespace),
        )
    };
    let ours = namespace.filter(|_| conflict.is_none());
    let current = ours.is_some_and(|n| {
        read.network_policy && n.annotations().get(APPLIED_HASH_ANNOTATION) == Some(&desired())
    });
    let refused = read
        .exported
        .as_deref()
        .and_then(|k| super::kubeconfig::vet(k).err())
        .map(|refused| {
            tracing::warn!(namespace = %host_ns, reason = %refused, "refusing the exported kubeconfig");
            refused.to_string()
        });
    let exported = read.exported.clone().filter(|_| refused.is_none());
    let kubeconfig = kubeconfig_state(pi, &read, exported.as_deref());
    let platform = read.serves == Some(true) && !deleting && settings.install_platform;
    let config = (exported.as_deref())
        .filter(|_| platform)
        .map(|k| program_config(pi, settings, &storage_dir, k, read.client_secret.take()));
    let install = install_observed(pi, settings, &read, config.as_ref(), now);
    let observed = Observed {
        uid: uid.clone(),
        deleting,
        suspended: pi.spec.suspend,
        has_finalizer: pi.finalizers().iter().any(|f| f == FINALIZER),
        deletion_policy: pi.spec.deletion_policy,
        invalid_spec: invalid_spec(pi, settings.supported_versions),
        host: match (namespace, conflict) {
            (None, _) => HostNamespace::Missing,
            (Some(_), Some(owner)) => HostNamespace::Foreign(owner),
            (Some(n), None) if n.metadata.deletion_timestamp.is_some() => {
                HostNamespace::Terminating
            }
            (Some(_), None) => HostNamespace::Ours { current },
        },
        release: ours.and(read.release).unwrap_or(Release::Missing),
        chart_version: settings.chart_version.clone(),
        task: read.tasks[0].clone(),
        helm_retry: retry(settings, read.retries[0]),
        statefulset_ready: ours.is_some()
            && read
                .deployment
                .as_deref()
                .is_some_and(super::control_plane::ready),
        exported: match (refused, &exported) {
            (Some(why), _) => Exported::Refused(why),
            (None, Some(_)) => Exported::Accepted {
                serves: read.serves,
            },
            (None, None) => Exported::Missing,
        },
        kubeconfig,
        protection: read.protection,
        cleanup: read.cleanup,
        pinned: match (&read.storage_node, read.deployment.as_deref()) {
            (Some(node), Some(d)) => {
                let template = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
                let affinity = template.and_then(|t| serde_json::to_value(&t.affinity).ok());
                affinity == Some(objects::pin(node))
            }
            _ => true,
        },
        storage_node: match (read.storage_node.clone(), read.scheduled_on.clone()) {
            (Some(node), _) => StorageNode::Recorded {
                node,
                gone: read.storage_node_gone,
            },
            (None, Some(node)) => StorageNode::Scheduled(node),
            (None, None) => StorageNode::Unknown,
        },
        storage_conflict: read.storage_conflict,
        claims_storage: read.deployment.as_deref().is_none_or(|d| {
            let template = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            let inits = template.and_then(|t| t.init_containers.as_deref());
            let name = objects::STORAGE_OWNER_CONTAINER;
            inits.is_some_and(|i| i.iter().any(|c| c.name == name))
        }),
        recreates: read.deployment.as_deref().is_none_or(|d| {
            let strategy = d.spec.as_ref().and_then(|s| s.strategy.as_ref());
            strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate")
        }),
        policies_current: read.deployment.as_deref().is_none_or(|d| {
            let applied = d.annotations().get(super::quota::POLICIES_ANNOTATION);
            let wanted = super::quota::policies_hash(super::quota::wanted(pi, settings));
            applied == wanted.as_ref()
        }),
        state_exists: read.state_exists,
        volumes: read.volumes,
        owner_service: match ours {
            Some(n) => owner_service(
                n.annotations().get(OWNER_SERVICE_ANNOTATION),
                read.service.as_ref(),
            ),
            None => OwnerService::Unrecorded,
        },
        install,
        host_namespace: host_ns.clone(),
    };
    let found = Found {
        host_ns,
        storage_dir,
        exported,
        config: config.and_then(Result::ok),
        record: read.record,
        storage_node: read.storage_node.or(read.scheduled_on),
    };
    (observed, found)
}

/// Why the spec cannot be acted on: `spec.version` missing, not exact, or outside the
/// `supported` versions (enforced here too, not only by the admission webhook).
fn invalid_spec(
    pi: &PlatformInstance,
    supported: (common::version::Minor, common::version::Minor),
) -> Option<String> {
    let Some(v) = pi.spec.version.as_deref() else {
        return Some("spec.version is not set (the admission webhook sets it when it runs); set spec.version".to_string());
    };
    match common::version::parse_exact(v) {
        Ok(version) => common::version::check_supported("spec.version", &version, supported).err(),
        Err(e) => Some(format!("spec.version: {e}")),
    }
}

/// `service/vcluster` against the record `<uid>/<hash>` on the host namespace, by UID only, so a
/// chart upgrade (or a record of an earlier release) never makes it look changed.
fn owner_service(recorded: Option<&String>, svc: Option<&ObjectMeta>) -> OwnerService {
    let Some((uid, _)) = recorded.and_then(|r| r.split_once('/')) else {
        return OwnerService::Unrecorded;
    };
    match svc {
        None => OwnerService::Missing,
        Some(s) if s.uid.as_deref() != Some(uid) => OwnerService::Recreated {
            old_uid: uid.to_string(),
        },
        Some(_) => OwnerService::Matches,
    }
}

/// Whether the instance's kubeconfig Secret holds what was exported (or exists, when nothing
/// was), or is not this instance's.
fn kubeconfig_state(
    pi: &PlatformInstance,
    read: &Read,
    exported: Option<&str>,
) -> KubeconfigSecret {
    let uid = pi.uid().unwrap_or_default();
    let current = read.kubeconfig.as_deref();
    if current.is_some_and(|s| !ownership::kubeconfig_secret(&s.metadata, &uid)) {
        return KubeconfigSecret::Foreign(kubeconfig_secret(&pi.name_any()));
    }
    let holds = |k: &str| {
        current
            .and_then(|s| s.data.as_ref()?.get(KUBECONFIG_KEY))
            .is_some_and(|b| b.0 == k.as_bytes())
    };
    if exported.map_or(current.is_some(), holds) {
        KubeconfigSecret::Current
    } else {
        KubeconfigSecret::Stale
    }
}

/// What a cleanup Job's conditions say: complete, failed (past its deadline or not), or running.
pub(crate) fn job_outcome(job: &Job) -> Cleanup {
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let holds = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if holds("Complete").is_some() {
        Cleanup::Complete
    } else if let Some(f) = holds("Failed") {
        let message = f.message.clone().unwrap_or_else(|| "the Job failed".into());
        if f.reason.as_deref() == Some("DeadlineExceeded") {
            Cleanup::TimedOut(message)
        } else if f.reason.as_deref() == Some("PodFailurePolicy") {
            Cleanup::Conflict(message)
        } else {
            Cleanup::Failed(message)
        }
    } else {
        Cleanup::Running
    }
}

/// What the program gets (settings, the vCluster's kubeconfig and endpoint, tenant auth's client
/// secret); `Err` says what is missing.
fn program_config(
    pi: &PlatformInstance,
    settings: &Settings,
    storage_dir: &str,
    kubeconfig: &str,
    client_secret: Option<Result<String, ConfigError>>,
) -> Result<ProgramConfig, ConfigError> {
    let endpoint =
        program::kubeconfig_server(kubeconfig).ok_or(ConfigError::KubeconfigWithoutServer)?;
    Ok(program::program_config(&program::Inputs {
        platform: pi.spec.platform.as_ref(),
        storage_root: format!(
            "{}/{storage_dir}",
            settings.storage_root_base.trim_end_matches('/')
        ),
        kubernetes_endpoint: endpoint,
        kubeconfig: kubeconfig.to_string(),
        client_secret: client_secret.transpose()?,
        uid: pi.uid().unwrap_or_default(),
    }))
}

/// The installer's view of one instance: its record (or why it cannot be read), its install and
/// preview tasks, and the membership Secrets that are gone.
fn install_observed(
    pi: &PlatformInstance,
    settings: &Settings,
    read: &Read,
    config: Option<&Result<ProgramConfig, ConfigError>>,
    now: Timestamp,
) -> InstallObserved {
    let record = &read.record;
    let repair_mode = pi.spec.repair.as_ref().map(|r| r.mode).unwrap_or_default();
    let repair_due = record.installed_version.is_some()
        && repair_mode != RepairMode::Off
        && record.last_checked().is_none_or(|t| {
            now.duration_since(t.0).as_secs() >= settings.repair_interval.as_secs() as i64
        });
    let requested = pi.spec.version.clone().unwrap_or_default();
    InstallObserved {
        outcome: InstallOutcome::fold(read.tasks[1].clone(), record, &requested),
        installed: record.installed_version.clone(),
        desired_hash: config.and_then(|c| c.as_ref().ok()).map(|c| c.hash.clone()),
        applied_hash: record.installed_config_hash.clone(),
        config_error: config
            .and_then(|c| c.as_ref().err())
            .map(ToString::to_string),
        record_error: read.record_error.clone(),
        preview_task: read.tasks[2].clone(),
        drift: record
            .preview
            .as_ref()
            .filter(|p| p.changes > 0)
            .map(|p| p.message.clone()),
        preview_failed: record.preview_failure.as_ref().map(|(_, m)| m.clone()),
        repair_due,
        repair_mode,
        needs_approval: pi.spec.upgrade.as_ref().map(|u| u.approval) == Some(Approval::Manual)
            && pi.annotations().get(APPROVE_ANNOTATION) != Some(&requested),
        upgrade_preview: pending_upgrade(record, &requested).map(|p| match &p.error {
            Some(e) => format!("nothing: it failed ({e})"),
            None => format!(
                "create {}, update {} and delete {} resources{}",
                p.create,
                p.update,
                p.delete,
                crate::installer::named(&p.resources, p.create + p.update + p.delete)
            ),
        }),
        missing_memberships: read.missing_memberships.clone(),
        disabled: !settings.install_platform,
        downgrade_allowed: pi
            .annotations()
            .get(ALLOW_DOWNGRADE_ANNOTATION)
            .is_some_and(|v| v == "true"),
        retry_requested: retry_request(pi).is_some(),
        retry: retry(settings, read.retries[1]),
        requested,
    }
}

/// The recorded preview of an upgrade to `version`, while `version` is not installed.
pub fn pending_upgrade<'a>(record: &'a Record, version: &str) -> Option<&'a PendingUpgrade> {
    let pending = record.pending_upgrade.as_ref()?;
    (pending.version == version && record.installed_version.as_deref() != Some(version))
        .then_some(pending)
}

/// A task's failures in a row and when it retries, against `--max-retries`.
fn retry(settings: &Settings, (failures, at): (u32, Option<std::time::SystemTime>)) -> Retry {
    let at = at.and_then(|t| Timestamp::try_from(t).ok());
    Retry {
        failures,
        // To the second: the status shows no more.
        at: at
            .and_then(|t| Timestamp::from_second(t.as_second() + 1).ok())
            .map(Time),
        max: settings.max_retries,
    }
}

/// The retry annotation's value when the status has not acknowledged it yet.
pub fn retry_request(pi: &PlatformInstance) -> Option<&String> {
    let acknowledged = pi
        .status
        .as_ref()
        .and_then(|s| s.acknowledged_retry.as_ref());
    pi.annotations()
        .get(RETRY_ANNOTATION)
        .filter(|r| Some(*r) != acknowledged)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use k8s_openapi::api::core::v1::Service;

    use super::*;
    use crate::reconcile::service_hash;

    fn service(uid: &str, chart: &str, port: i32) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "vcluster", "uid": uid,
                         "labels": {"app": "vcluster", "chart": chart, "release": "vcluster", "heritage": "Helm"}},
            "spec": {"type": "ClusterIP", "selector": {"app": "vcluster", "release": "vcluster"},
                     "ports": [{"name": "https", "port": port, "targetPort": 8443, "protocol": "TCP"}]}
        }))
        .expect("service")
    }

    #[test]
    fn a_chart_upgrade_is_not_a_changed_owner_service() {
        let before = service("u-1", "vcluster-0.37.3", 443);
        // What a newer chart rewrites: the chart label, even the ports.
        let after = service("u-1", "vcluster-0.37.4", 8443);
        assert_eq!(service_hash(&before), service_hash(&after));
        let record = format!("u-1/{}", service_hash(&before));
        assert_eq!(
            owner_service(Some(&record), Some(&after.metadata)),
            OwnerService::Matches
        );
        // A record written by an earlier release (its hash covered labels and spec) still
        // matches while the UID does.
        let legacy = "u-1/0123456789abcdef".to_string();
        assert_eq!(
            owner_service(Some(&legacy), Some(&after.metadata)),
            OwnerService::Matches
        );
    }

    #[test]
    fn only_a_new_uid_or_no_service_is_drift() {
        let record = format!("u-1/{}", service_hash(&service("u-1", "c", 443)));
        assert_eq!(
            owner_service(Some(&record), Some(&service("u-2", "c", 443).metadata)),
            OwnerService::Recreated {
                old_uid: "u-1".into()
            }
        );
        assert_eq!(owner_service(Some(&record), None), OwnerService::Missing);
        assert_eq!(
            owner_service(None, Some(&service("u-1", "c", 443).metadata)),
            OwnerService::Unrecorded
        );
        assert_ne!(
            service_hash(&service("u-1", "c", 443)),
            service_hash(&service("u-2", "c", 443))
        );
    }

    #[test]
    fn a_version_outside_the_supported_range_is_an_invalid_spec() {
        let pi = |version: Option<&str>| {
            let mut pi = PlatformInstance::new("one", Default::default());
            pi.spec.version = version.map(String::from);
            pi
        };
        let range = ((6, 0), (6, 1));
        assert_eq!(invalid_spec(&pi(Some("6.1.3")), range), None);
        let refused = invalid_spec(&pi(Some("7.0.0")), range).expect("refused");
        assert!(
            refused.contains(
                "spec.version 7.0.0 is outside the versions this operator supports (6.0.x to 6.1.x)"
            ),
            "{refused}"
        );
        assert!(invalid_spec(&pi(Some("5.2.0")), range).is_some());
        assert!(
            invalid_spec(&pi(Some("^6.0.0")), range)
                .is_some_and(|r| r.starts_with("spec.version: "))
        );
        assert!(invalid_spec(&pi(None), range).is_some());
    }
}
