//! Drives the Helm CLI for the vCluster release of one host namespace: install or
//! upgrade from the shipped chart, recovery of a release an interrupted helm left `pending-*`,
//! and uninstall. Exit codes map onto typed errors; the release state is read from
//! Helm's release Secrets through the API, and only Helm's last error line is passed on to status.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::process::Command;

use crate::decide::model::Release;

/// The release name of every vCluster (one per host namespace).
pub const RELEASE: &str = common::names::VCLUSTER;
/// Label on the Helm release Secret naming the chart version installed.
pub const CHART_VERSION_LABEL: &str = "platform.di-framework.dev/chart-version";

/// The release state from the metadata of Helm's release Secrets (`owner=helm`,
/// `name=vcluster`): the newest revision's `status` label, and the chart version label the
/// controller set.
pub fn release_from_records<'a>(records: impl IntoIterator<Item = &'a ObjectMeta>) -> Release {
    let newest = records
        .into_iter()
        .filter_map(|meta| {
            let labels = meta.labels.as_ref()?;
            let version: u64 = labels.get("version")?.parse().ok()?;
            Some((version, labels))
        })
        .max_by_key(|(v, _)| *v);
    let Some((_, labels)) = newest else {
        return Release::Missing;
    };
    let status = labels.get("status").cloned().unwrap_or_default();
    match status.as_str() {
        "deployed" => Release::Deployed {
            chart_version: labels.get(CHART_VERSION_LABEL).cloned().unwrap_or_default(),
        },
        s if s.starts_with("pending-") || s == "uninstalling" => Release::Pending(status),
        _ => Release::Failed(status),
    }
}

/// Errors of the helm driver.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    /// The helm binary (`.0`) could not be run.
    #[error("running {0} failed: {1}; set --helm-binary to a Helm 3 executable")]
    Spawn(String, #[source] std::io::Error),
    /// Helm `.0` in host namespace `.1` exited non-zero; `.2`: its last error line.
    #[error("helm {0} in {1} failed: {2}")]
    Failed(&'static str, String, String),
    /// Helm `.0` in host namespace `.1` ran past its wall-clock limit `.2` and was killed.
    #[error(
        "helm {0} in {1} ran longer than {2:?} and was killed; look at the host namespace's pods and events, or raise --helm-timeout"
    )]
    TimedOut(&'static str, String, Duration),
    /// Writing the values file or helm's home `.0` failed.
    #[error("writing {0} for helm failed: {1}; check that the temporary folder is writable")]
    Values(PathBuf, #[source] std::io::Error),
}

/// The helm CLI with its binary and timeout (each run's wall-clock limit, also passed as
/// helm's own `--timeout`).
#[derive(Clone, Debug, clap::Args)]
pub struct Helm {
    /// The helm executable.
    #[arg(
        long = "helm-binary",
        value_name = "HELM_BINARY",
        default_value = "helm"
    )]
    pub binary: String,
    /// How long one helm run (install, upgrade, rollback, uninstall) may take before it is
    /// killed and reported as `HelmTimedOut`.
    #[arg(
        long = "helm-timeout",
        value_name = "HELM_TIMEOUT",
        default_value = "10m",
        value_parser = common::duration::parse
    )]
    pub timeout: Duration,
    /// Where values files are written.
    #[arg(skip = std::env::temp_dir().join("platform-operator-helm"))]
    pub work_dir: PathBuf,
    /// Helm's post-renderer: this binary's `post-render` ([`post_render`]).
    #[arg(skip = std::env::current_exe().ok())]
    pub post_renderer: Option<PathBuf>,
}

/// Helm's post-renderer (`controller post-render`, standard input to standard output): the
/// chart's manifest with its control plane, the Deployment `vcluster`, set to the `Recreate`
/// strategy. The chart rolls it with `maxSurge: 1`, and the syncer patches its own pod template
/// to rotate its certificates: that rollout would start a second pod on the same hostPath data.
/// With `Recreate` the Deployment controller starts the new pod only once the old one is gone,
/// whoever changes the template. That document is written back as JSON (plain YAML, read the
/// same by every parser); every other document passes as it came.
pub fn post_render(manifest: &str) -> Result<String, serde_saphyr::Error> {
    let mut docs = vec![String::new()];
    for line in manifest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            docs.push(String::new());
        }
        if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
        }
    }
    let mut out = String::with_capacity(manifest.len());
    for doc in docs {
        if doc.contains("Deployment") {
            let mut object: serde_json::Value = serde_saphyr::from_str(&doc)?;
            if object["kind"] == "Deployment" && object["metadata"]["name"] == RELEASE {
                object["spec"]["strategy"] = serde_json::json!({"type": "Recreate"});
                out.push_str(&format!("---\n{object}\n"));
                continue;
            }
        }
        out.push_str(&doc);
    }
    Ok(out)
}

impl Helm {
    /// Runs helm with `args` for `action` in `namespace` (what its errors name), within its
    /// timeout; its standard output.
    pub(crate) async fn run(
        &self,
        action: &'static str,
        namespace: &str,
        args: &[impl AsRef<std::ffi::OsStr>],
    ) -> Result<String, HelmError> {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args).stdin(Stdio::null()).kill_on_drop(true);
        // A home of its own, so helm never finds a `~/.kube/config` (or a helm config) that
        // something running as the controller's user wrote: it uses the KUBECONFIG the
        // controller was given, or else the pod's in-cluster configuration.
        let home = self.work_dir.join("home");
        std::fs::create_dir_all(&home).map_err(|source| HelmError::Values(home.clone(), source))?;
        cmd.env("HOME", &home);
        for xdg in ["XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"] {
            cmd.env_remove(xdg);
        }
        // `output` pipes stdout and stderr; dropping it on timeout kills helm (`kill_on_drop`),
        // and tokio reaps it.
        let out = tokio::time::timeout(self.timeout, cmd.output())
            .await
            .map_err(|_| HelmError::TimedOut(action, namespace.to_string(), self.timeout))?
            .map_err(|source| HelmError::Spawn(self.binary.clone(), source))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            let message = String::from_utf8_lossy(&out.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("no output")
                .to_string();
            Err(HelmError::Failed(action, namespace.to_string(), message))
        }
    }

    /// The arguments of `helm upgrade --install` of the release in `namespace` from `chart`, with
    /// the controller's values file `values` and then `extra_values`. `--disable-openapi-validation`
    /// skips only Helm's download of the server's OpenAPI documents (more than half of its CPU,
    /// `cargo bench -p controller --bench helm`): the API server validates fields itself, and the
    /// values are still checked against the chart's schema (`controller/tests/helm.rs`).
    pub fn upgrade_args(
        &self,
        namespace: &str,
        chart: &Path,
        chart_version: &str,
        values: &Path,
        extra_values: Option<&Path>,
    ) -> Vec<String> {
        let mut args = vec![
            "upgrade".to_string(),
            "--install".into(),
            RELEASE.into(),
            chart.display().to_string(),
            "-n".into(),
            namespace.into(),
            "--values".into(),
            values.display().to_string(),
            "--timeout".into(),
            format!("{}s", self.timeout.as_secs().max(1)),
            "--history-max".into(),
            "3".into(),
            "--labels".into(),
            format!("{CHART_VERSION_LABEL}={chart_version}"),
            "--disable-openapi-validation".into(),
        ];
        if let Some(renderer) = &self.post_renderer {
            args.push("--post-renderer".into());
            args.push(renderer.display().to_string());
            args.push("--post-renderer-args=post-render".into());
        }
        if let Some(extra) = extra_values {
            args.push("--values".into());
            args.push(extra.display().to_string());
        }
        args
    }

    /// Installs or upgrades the release from `chart` with `values` (YAML), waiting for nothing:
    /// the controller watches the workloads itself.
    pub async fn upgrade_install(
        &self,
        namespace: &str,
        chart: &Path,
        chart_version: &str,
        values: &str,
        extra_values: Option<&Path>,
    ) -> Result<(), HelmError> {
        let file = self.work_dir.join(format!("{namespace}-values.yaml"));
        std::fs::create_dir_all(&self.work_dir)
            .and_then(|()| std::fs::write(&file, values))
            .map_err(|source| HelmError::Values(file.clone(), source))?;
        let args = self.upgrade_args(namespace, chart, chart_version, &file, extra_values);
        let result = self.run("upgrade --install", namespace, &args).await;
        let _ = std::fs::remove_file(&file);
        result.map(|_| ())
    }

    /// Clears a release an interrupted helm left `pending-*`: a pending first install is
    /// uninstalled (nothing of it ever served), a pending upgrade or rollback is rolled back to
    /// the last deployed revision.
    pub async fn recover(&self, namespace: &str, status: &str) -> Result<(), HelmError> {
        if status == "pending-install" {
            return self.uninstall(namespace).await;
        }
        let timeout = format!("{}s", self.timeout.as_secs().max(1));
        let args = ["rollback", RELEASE, "-n", namespace, "--timeout", &timeout];
        self.run("rollback", namespace, &args).await.map(|_| ())
    }

    /// Uninstalls the release (a missing release is fine).
    pub async fn uninstall(&self, namespace: &str) -> Result<(), HelmError> {
        let args = [
            "uninstall",
            RELEASE,
            "-n",
            namespace,
            "--ignore-not-found",
            "--wait=false",
        ];
        self.run("uninstall", namespace, &args).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The install's command line: the release in its namespace, the chart-version label, the
    /// history bound, the flag that skips the OpenAPI download, the user's values after the
    /// controller's (Helm lets the later file win).
    #[test]
    fn the_upgrade_arguments_are_the_documented_ones() {
        let helm = Helm {
            binary: "helm".into(),
            timeout: Duration::from_secs(600),
            work_dir: PathBuf::from("/tmp/w"),
            post_renderer: Some(PathBuf::from("/usr/local/bin/controller")),
        };
        let args = helm.upgrade_args(
            "pi-a-b-1",
            Path::new("/charts/vcluster.tgz"),
            "0.37.3",
            Path::new("/tmp/w/values.yaml"),
            Some(Path::new("/etc/extra.yaml")),
        );
        assert_eq!(
            args.join(" "),
            "upgrade --install vcluster /charts/vcluster.tgz -n pi-a-b-1 \
             --values /tmp/w/values.yaml --timeout 600s --history-max 3 \
             --labels platform.di-framework.dev/chart-version=0.37.3 \
             --disable-openapi-validation --post-renderer /usr/local/bin/controller \
             --post-renderer-args=post-render --values /etc/extra.yaml"
        );
    }

    /// A helm that hangs (a shell script standing in for a helm stuck on an API server that
    /// never answers) is killed at the limit and reported as timed out.
    #[tokio::test]
    async fn a_hanging_helm_is_killed_at_the_limit() {
        let dir = std::env::temp_dir().join(format!("helm-timeout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let marker = dir.join("still-running");
        let script = dir.join("helm");
        std::fs::write(
            &script,
            format!("#!/bin/sh\nsleep 2\ntouch {}\nsleep 30\n", marker.display()),
        )
        .expect("script");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let helm = Helm {
            binary: script.display().to_string(),
            timeout: Duration::from_millis(500),
            work_dir: dir.clone(),
            post_renderer: None,
        };
        let started = std::time::Instant::now();
        let e = helm.uninstall("pi-a-b-1").await.expect_err("timed out");
        assert!(matches!(e, HelmError::TimedOut { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(e.to_string().contains("--helm-timeout"), "{e}");
        // Killed, not left running: it never reaches the line after its first sleep.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!marker.exists(), "helm was left running past its limit");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn helm_runs_with_a_home_of_its_own() {
        let work_dir = std::env::temp_dir().join(format!("helm-home-{}", std::process::id()));
        // `env` in helm's place prints the environment helm would get.
        let helm = Helm {
            binary: "env".into(),
            timeout: Duration::from_secs(10),
            work_dir: work_dir.clone(),
            post_renderer: None,
        };
        let env = helm.run("env", "ns", &[] as &[&str]).await.expect("env");
        let home = format!("HOME={}", work_dir.join("home").display());
        assert!(env.lines().any(|l| l == home), "{env}");
        let _ = std::fs::remove_dir_all(&work_dir);
    }
}
