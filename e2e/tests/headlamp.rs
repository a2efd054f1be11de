//! End-to-end: the Headlamp plugin `di-framework-platform` in a real headless Chromium, against the
//! real local API server. This test starts a control plane of its own (etcd and kube-apiserver with
//! RBAC and service-account tokens: the plugin needs nothing more), applies the CRD, creates
//! three ServiceAccounts with their RBAC (alice may read the instance's kubeconfig Secret, bob may
//! not, a status writer writes status and Events as the controller would) and runs the node
//! browser test `headlamp-plugin/test/browser/` with their tokens. That test serves the released
//! plugin and a page of Headlamp's own frontend components through a **stand-in** for Headlamp's
//! backend (its Go module cannot be had here) and drives Debian's Chromium with playwright-core.
//!
//! Screenshots go to `$PLATFORM_OPERATOR_SCREENSHOTS` when set (`docs/headlamp/` to regenerate
//! the docs' images), else to a scratch folder. Needs `npm ci` in `headlamp-plugin/` (done here
//! when `node_modules` is missing) and `/usr/bin/chromium` (`e2e/run-tests.sh` installs both).

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use e2e::cmd::run;
use e2e::{ControlPlane, Options};
use serde_json::Value;

/// The screenshots the browser test writes, which docs/headlamp.md shows.
const SCREENSHOTS: [&str; 4] = [
    "list.png",
    "form-validation-error.png",
    "patch.png",
    "detail.png",
];

fn plugin_dir() -> PathBuf {
    e2e::repo_root().join("headlamp-plugin")
}

fn rbac(ns: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{ name: alice, namespace: {ns} }}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{ name: bob, namespace: {ns} }}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{ name: status-writer, namespace: {ns} }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{ name: headlamp-e2e-viewer-{ns} }}
rules:
  - apiGroups: [platform.di-framework.dev]
    resources: [platforminstances]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [namespaces]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{ name: headlamp-e2e-viewer-{ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: headlamp-e2e-viewer-{ns} }}
subjects:
  - {{ kind: ServiceAccount, name: alice, namespace: {ns} }}
  - {{ kind: ServiceAccount, name: bob, namespace: {ns} }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: instance-editor, namespace: {ns} }}
rules:
  - apiGroups: [platform.di-framework.dev]
    resources: [platforminstances]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [events]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: secret-reader, namespace: {ns} }}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: status-writer, namespace: {ns} }}
rules:
  - apiGroups: [platform.di-framework.dev]
    resources: [platforminstances, platforminstances/status]
    verbs: [get, patch]
  - apiGroups: [""]
    resources: [events]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: alice-edits, namespace: {ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: instance-editor }}
subjects: [{{ kind: ServiceAccount, name: alice, namespace: {ns} }}, {{ kind: ServiceAccount, name: bob, namespace: {ns} }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: alice-reads-secrets, namespace: {ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: secret-reader }}
subjects: [{{ kind: ServiceAccount, name: alice, namespace: {ns} }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: status-writer, namespace: {ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: status-writer }}
subjects: [{{ kind: ServiceAccount, name: status-writer, namespace: {ns} }}]
---
apiVersion: v1
kind: Secret
metadata: {{ name: tenant-auth-oauth, namespace: {ns} }}
stringData: {{ clientSecret: not-a-real-secret }}
---
apiVersion: v1
kind: Secret
metadata: {{ name: one-kubeconfig, namespace: {ns} }}
stringData:
  kubeconfig: |
    apiVersion: v1
    kind: Config
    clusters: [{{ name: one, cluster: {{ server: "https://vcluster.pi-{ns}-one.svc:443" }} }}]
    users: [{{ name: one-admin, user: {{ token: instance-admin-token }} }}]
    contexts: [{{ name: one-admin, context: {{ cluster: one, user: one-admin }} }}]
    current-context: one-admin
"#
    )
}

/// Installs the plugin's npm packages (from the lockfile) when they are missing.
fn ensure_node_modules(dir: &Path) {
    if dir.join("node_modules/.bin/headlamp-plugin").exists() {
        return;
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .status()
        .expect("npm runs (Node.js 20 or later with npm)");
    assert!(status.success(), "npm ci in {} failed", dir.display());
}

#[tokio::test]
async fn the_plugin_in_a_real_browser_against_the_real_api_server() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: install Debian's chromium (apt-get install -y chromium), as e2e/run-tests.sh does"
    );
    let dir = plugin_dir();
    ensure_node_modules(&dir);

    let control_plane = ControlPlane::start(Options::new("headlamp").api_only())
        .await
        .unwrap_or_else(|e| panic!("control plane: {e}"));
    let cluster = control_plane.handle();
    cluster.install_crd().unwrap_or_else(|e| panic!("{e}"));
    let ns = cluster
        .create_namespace("headlamp", &[])
        .unwrap_or_else(|e| panic!("{e}"));
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rbac(&ns)))
        .unwrap_or_else(|e| panic!("{e}"));
    let token = |account: &str| {
        cluster
            .kubectl_ok(
                &["create", "token", account, "-n", &ns, "--duration=1h"],
                None,
            )
            .unwrap_or_else(|e| panic!("{e}"))
            .trim()
            .to_string()
    };

    let admin: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(&cluster.kubeconfig).expect("admin kubeconfig"),
    )
    .expect("kubeconfig is YAML");
    let entry = &admin["clusters"][0]["cluster"];
    let server = entry["server"].as_str().expect("server").to_string();
    let ca = base64::engine::general_purpose::STANDARD
        .decode(
            entry["certificate-authority-data"]
                .as_str()
                .expect("CA data"),
        )
        .expect("CA is base64");
    let scratch = cluster.dir.join(format!("headlamp-{ns}"));
    std::fs::create_dir_all(&scratch).expect("scratch folder");
    let ca_file = scratch.join("ca.crt");
    std::fs::write(&ca_file, ca).expect("write CA");
    let shots = std::env::var_os("PLATFORM_OPERATOR_SCREENSHOTS")
        .map(|p| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                e2e::repo_root().join(p)
            }
        })
        .unwrap_or_else(|| scratch.join("screenshots"));

    let mut cmd = Command::new("node");
    cmd.args([
        "--test",
        "--test-reporter=spec",
        "test/browser/plugin-in-chromium.mjs",
    ])
    .current_dir(&dir)
    .env("PO_API_SERVER", &server)
    .env("PO_CA_FILE", &ca_file)
    .env("PO_NAMESPACE", &ns)
    .env("PO_TOKEN_ALICE", token("alice"))
    .env("PO_TOKEN_BOB", token("bob"))
    .env("PO_TOKEN_STATUS", token("status-writer"))
    .env("PO_SCREENSHOTS", &shots)
    .env("CHROMIUM", &chromium);
    let started = std::time::Instant::now();
    let out = run(cmd, None).expect("node runs");
    eprintln!(
        "browser test ({:.0?}):\n{}\n{}",
        started.elapsed(),
        out.stdout,
        out.stderr
    );
    assert!(out.success, "the browser test failed (output above)");
    for name in SCREENSHOTS {
        let len = std::fs::metadata(shots.join(name))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(
            len > 10_000,
            "screenshot {name} missing or empty in {}",
            shots.display()
        );
    }
    // The instance was deleted through the plugin.
    let left = cluster
        .kubectl_ok(&["get", "platforminstances", "-n", &ns, "-o", "name"], None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(left.trim().is_empty(), "left behind: {left}");
    let _ = std::fs::remove_dir_all(&scratch);
}
