//! Running the webhook binary against a test control plane, and the webhook configurations
//! that point the API server at it (`clientConfig.url: https://127.0.0.1:<port>/...`, scoped to
//! namespaces labelled `e2e-webhook=<id>` for tests or to every namespace like the chart for the
//! demo, without a caBundle: the webhook fills it in).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::control_plane::{free_port, plain_get};
use crate::shared::Shared;

/// A running webhook process; killed on drop. Its log is printed when a test fails.
pub struct Webhook {
    child: Child,
    log: PathBuf,
    /// The operations port (/healthz, /readyz, /metrics).
    pub ops_port: u16,
}

impl Webhook {
    /// Starts the webhook binary `bin` for test `id`: its certificate Secret lives in `namespace`,
    /// it listens on 127.0.0.1:`admission_port` (a free one if `None`) and keeps the caBundle of
    /// the configurations named `e2e-<id>`.
    pub fn start(
        bin: &Path,
        cluster: &Shared,
        id: &str,
        namespace: &str,
        extra: &[&str],
        admission_port: Option<u16>,
    ) -> Self {
        let admission_port = admission_port.unwrap_or_else(|| free_port().expect("port"));
        let ops_port = free_port().expect("port");
        let log = std::env::temp_dir().join(format!(
            "webhook-{id}-{}-{ops_port}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin);
        cmd.env("KUBECONFIG", &cluster.kubeconfig)
            .args([
                "--namespace",
                namespace,
                "--admission-bind-address",
                &format!("127.0.0.1:{admission_port}"),
                "--metrics-bind-address",
                &format!("127.0.0.1:{ops_port}"),
                // Plain HTTP: these tests read /metrics directly (chart_install.rs tests the
                // secure port).
                "--metrics-secure=false",
                "--extra-san",
                "127.0.0.1",
                "--mutating-webhook-configuration",
                &format!("e2e-{id}"),
                "--validating-webhook-configuration",
                &format!("e2e-{id}"),
            ])
            .args(if extra.contains(&"--log-level") {
                &[][..]
            } else {
                &["--log-level", "info,webhook=debug"][..]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file);
        crate::process::die_with_parent(&mut cmd);
        let child = cmd.spawn().expect("webhook starts");
        Webhook {
            child,
            log,
            ops_port,
        }
    }

    /// Waits until /readyz answers 200 (certificates loaded, caches synced).
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((200, _)) = plain_get(self.ops_port, "/readyz").await {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "webhook exited with {status}: {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "webhook not ready: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The process id (for reading its memory from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The /metrics text.
    pub async fn metrics(&self) -> String {
        plain_get(self.ops_port, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// The reviews it has answered so far, by webhook: (mutate, validate), the sums of its
    /// `platform_operator_webhook_reviews_total` (which has no series before the first review).
    /// Panics when /metrics does not answer.
    pub async fn reviews_answered(&self) -> (u64, u64) {
        let text = self.metrics().await;
        assert!(
            text.contains("platform_operator_build_info"),
            "/metrics did not answer: {text}"
        );
        let sum = |which: &str| -> u64 {
            let label = format!("webhook=\"{which}\"");
            text.lines()
                .filter(|l| l.starts_with("platform_operator_webhook_reviews_total{"))
                .filter(|l| l.contains(&label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .map(|v| v as u64)
                .sum()
        };
        (sum("mutate"), sum("validate"))
    }

    /// Stops it with SIGTERM (SIGKILL after ten seconds).
    pub fn stop(&mut self) {
        crate::process::terminate(&mut self.child, Duration::from_secs(10));
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "--- webhook log {} ---\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Which namespaces the webhook configurations send to the webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Only namespaces labelled `e2e-webhook=<id>`, so tests sharing one control plane do not
    /// see each other's webhooks.
    Labelled,
    /// Every namespace, exactly as the chart registers them (the demo: an instance a user applies
    /// in a namespace of their own is defaulted and checked).
    LikeTheChart,
}

/// The webhook configurations for test `id`: both webhooks call 127.0.0.1:`port`, only for
/// namespaces labelled `e2e-webhook=<id>`, without a caBundle (the webhook fills it in).
pub fn configurations(id: &str, port: u16) -> String {
    configurations_in(id, port, Scope::Labelled)
}

/// The webhook configurations `e2e-<id>` calling 127.0.0.1:`port` for the namespaces of `scope`;
/// apart from their names, `clientConfig` and (for [`Scope::Labelled`]) the `namespaceSelector`,
/// they are the chart's (`e2e/tests/chart.rs` compares them).
pub fn configurations_in(id: &str, port: u16, scope: Scope) -> String {
    let mutate = common_part(port, "mutate", &scope_selector(id, scope), MUTATE_WHEN);
    let validate = common_part(port, "validate", &scope_selector(id, scope), VALIDATE_WHEN);
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata:\n  name: e2e-{id}\nwebhooks:\n  - name: default.platform.di-framework.dev\n    failurePolicy: Ignore\n    reinvocationPolicy: Never\n{mutate}---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: e2e-{id}\nwebhooks:\n  - name: validate.platform.di-framework.dev\n    failurePolicy: Fail\n{validate}",
    )
}

/// The mutating webhook's own matchCondition (name, CEL): it only fills a missing `spec.version`.
pub const MUTATE_WHEN: (&str, &str) = (
    "spec-version-missing",
    "!has(object.spec) || !has(object.spec.version) || object.spec.version == null",
);

/// The validating webhook's own matchCondition (name, CEL): a create, or an update that changes
/// what its rules read of the request (the spec, or the allow-downgrade annotation); see
/// docs/webhook.md.
pub const VALIDATE_WHEN: (&str, &str) = (
    "create-or-spec-or-downgrade-annotation-changed",
    "oldObject == null || has(object.spec) != has(oldObject.spec) || (has(object.spec) && object.spec != oldObject.spec) || (has(object.metadata.annotations) && 'platform.di-framework.dev/allow-downgrade' in object.metadata.annotations ? object.metadata.annotations['platform.di-framework.dev/allow-downgrade'] : '') != (has(oldObject.metadata.annotations) && 'platform.di-framework.dev/allow-downgrade' in oldObject.metadata.annotations ? oldObject.metadata.annotations['platform.di-framework.dev/allow-downgrade'] : '')",
);

/// The `namespaceSelector` lines of `scope` (none: every namespace, like the chart).
fn scope_selector(id: &str, scope: Scope) -> String {
    match scope {
        Scope::Labelled => {
            format!("    namespaceSelector:\n      matchLabels: {{ e2e-webhook: \"{id}\" }}\n")
        }
        Scope::LikeTheChart => String::new(),
    }
}

/// One webhook's entry apart from its name and failure policy, with its own matchCondition `when`.
fn common_part(port: u16, path: &str, selector: &str, when: (&str, &str)) -> String {
    let (when_name, when) = when;
    format!(
        r#"    clientConfig:
      url: https://127.0.0.1:{port}/{path}
    rules:
      - apiGroups: ["platform.di-framework.dev"]
        apiVersions: ["v1alpha1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["platforminstances"]
        scope: Namespaced
{selector}    matchConditions:
      - name: not-being-deleted-or-changing-version
        expression: "!has(object.metadata.deletionTimestamp) || has(object.spec.version) != has(oldObject.spec.version) || (has(object.spec.version) && object.spec.version != oldObject.spec.version)"
      - name: {when_name}
        expression: "{when}"
    admissionReviewVersions: ["v1"]
    sideEffects: None
    matchPolicy: Equivalent
    timeoutSeconds: 5
"#
    )
}

/// Applies the configurations of test `id` (as a chart would, with its own field manager).
pub fn register(cluster: &Shared, id: &str, port: u16) -> Result<(), crate::HarnessError> {
    register_in(cluster, id, port, Scope::Labelled)
}

/// Applies the configurations `e2e-<id>` for the namespaces of `scope`.
pub fn register_in(
    cluster: &Shared,
    id: &str,
    port: u16,
    scope: Scope,
) -> Result<(), crate::HarnessError> {
    cluster
        .kubectl_ok(
            &[
                "apply",
                "--server-side",
                "--field-manager=e2e-chart",
                "-f",
                "-",
            ],
            Some(&configurations_in(id, port, scope)),
        )
        .map(|_| ())
}

/// Deletes the configurations of test `id`.
pub fn unregister(cluster: &Shared, id: &str) {
    let name = format!("e2e-{id}");
    let _ = cluster.kubectl_ok(
        &[
            "delete",
            "mutatingwebhookconfiguration",
            &name,
            "validatingwebhookconfiguration",
            &name,
            "--ignore-not-found",
        ],
        None,
    );
}

/// The caBundle of the first webhook of configuration `e2e-<id>` of `kind` (base64, as stored).
pub fn ca_bundle(cluster: &Shared, kind: &str, id: &str) -> String {
    cluster
        .kubectl_ok(
            &[
                "get",
                kind,
                &format!("e2e-{id}"),
                "-o",
                "jsonpath={.webhooks[0].clientConfig.caBundle}",
            ],
            None,
        )
        .unwrap_or_default()
}

/// Waits until both configurations of test `id` carry the same, non-empty caBundle; returns it.
pub async fn wait_for_bundle(cluster: &Shared, id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = ca_bundle(cluster, "mutatingwebhookconfiguration", id);
        let v = ca_bundle(cluster, "validatingwebhookconfiguration", id);
        if !m.is_empty() && m == v {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook did not inject its caBundle"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
