//! The report step: writes the status when it changed, an Event for every condition that
//! changed, and keeps the instances-by-phase gauge.

use common::conditions::{self as c, merge};
use common::crd::{PlatformInstance, PlatformInstanceStatus, SecretKeyRef};
use common::names::{
    FIELD_MANAGER, KUBECONFIG_KEY, host_namespace, kubeconfig_secret, legacy_host_namespace,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::error::ReconcileError;
use super::observe::Found;
use crate::decide::Plan;

/// Writes the status when it differs, and an Event for every condition that changed.
pub async fn report(
    ctx: &Context,
    pi: &PlatformInstance,
    plan: &Plan,
    retry: Option<String>,
    found: &Found,
) -> Result<(), ReconcileError> {
    let old = pi.status.clone().unwrap_or_default();
    let status = status(pi, plan, retry, found, &old);
    if status == old {
        return Ok(());
    }
    let namespace = pi.namespace().unwrap_or_default();
    let instances: Api<PlatformInstance> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = json!({"apiVersion": PlatformInstance::api_version(&()), "kind": PlatformInstance::kind(&()), "status": status});
    instances
        .patch_status(
            &pi.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(ReconcileError::WriteStatus)?;
    ctx.metrics.writes.with_label_values(&["status"]).inc();
    publish_events(ctx, pi, plan, &old).await;
    Ok(())
}

/// Whether the status the plan describes is the one the instance shows (nothing to write).
pub fn unchanged(pi: &PlatformInstance, plan: &Plan, retry: Option<String>, found: &Found) -> bool {
    let none = PlatformInstanceStatus::default();
    let old = pi.status.as_ref().unwrap_or(&none);
    status(pi, plan, retry, found, old) == *old
}

fn status(
    pi: &PlatformInstance,
    plan: &Plan,
    retry: Option<String>,
    found: &Found,
    old: &PlatformInstanceStatus,
) -> PlatformInstanceStatus {
    let (name, record) = (pi.name_any(), &found.record);
    let version = pi.spec.version.clone().unwrap_or_default();
    let generation = pi.meta().generation.unwrap_or(0);
    let wanted: Vec<_> = plan.conditions.iter().map(|w| w.want()).collect();
    let conditions = merge(
        &old.conditions,
        &wanted,
        generation,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let kubeconfig_ready = conditions
        .iter()
        .any(|c| c.type_ == c::KUBECONFIG_READY && c.status == "True");
    PlatformInstanceStatus {
        phase: Some(plan.phase),
        observed_generation: Some(generation),
        version: pi.spec.version.clone(),
        host_namespace: Some(found.host_ns.clone()),
        kubeconfig_secret_ref: kubeconfig_ready.then(|| SecretKeyRef {
            name: kubeconfig_secret(&name),
            key: KUBECONFIG_KEY.into(),
        }),
        conditions,
        acknowledged_retry: retry.or(old.acknowledged_retry.clone()),
        installed_version: record
            .installed_version
            .clone()
            .or(old.installed_version.clone()),
        endpoints: record.endpoints.clone().or(old.endpoints.clone()),
        last_install: record.last_install.clone().or(old.last_install.clone()),
        history: match record.history.is_empty() {
            true => old.history.clone(),
            false => record.history.clone(),
        },
        failures: Some(plan.retry.failures).filter(|f| *f > 0),
        next_retry_at: plan.retry.at.clone().filter(|_| !plan.retry.exhausted()),
        pending_upgrade: super::observe::pending_upgrade(record, &version).cloned(),
        state_backups: match record.state_backups.is_empty() {
            true => old.state_backups.clone(),
            false => record.state_backups.clone(),
        },
    }
}

/// An Event for every condition (but `Reconciling`) whose status or reason changed from `old`.
pub async fn publish_events(
    ctx: &Context,
    pi: &PlatformInstance,
    plan: &Plan,
    old: &PlatformInstanceStatus,
) {
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let reference = pi.object_ref(&());
    for want in &plan.conditions {
        let before = old.conditions.iter().find(|c| c.type_ == want.type_);
        let status = if want.status { "True" } else { "False" };
        let changed = before.is_none_or(|b| b.status != status || b.reason != want.reason.as_str());
        if !changed || want.type_ == c::RECONCILING {
            continue;
        }
        let event = Event {
            type_: want.severity(),
            reason: want.reason.as_str().to_string(),
            note: Some(
                format!("{}={status}: {}", want.type_, want.message)
                    .chars()
                    .take(1000)
                    .collect(),
            ),
            action: want.type_.to_string(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "publishing an event failed");
        }
    }
}

/// Forgets an instance that is gone: its backoff and its vCluster probe.
pub fn forget(ctx: &Context, key: &str) {
    ctx.backoff.succeeded(key);
    if let Some((namespace, name)) = key.split_once('/') {
        ctx.probes.forget(&host_namespace(namespace, name));
        ctx.probes.forget(&legacy_host_namespace(namespace, name));
    }
}
