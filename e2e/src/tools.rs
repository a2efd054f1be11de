//! Finds the binaries built from pinned Go modules by `e2e/tools/build.sh`, building them on
//! first use (kubectl, kube-apiserver, kube-controller-manager, kube-scheduler, etcd, helm, kwok,
//! and pulumi with its Node.js language host and dynamic-provider plugin; see
//! `e2e/tools/pulumi/NOTES.md`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::HarnessError;

const NEEDED: [&str; 10] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
    "pulumi",
    "pulumi-language-nodejs",
    "pulumi-resource-pulumi-nodejs",
];

/// The cache folder the build script writes to.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLATFORM_OPERATOR_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("platform-operator")
}

/// The built tools.
#[derive(Debug, Clone)]
pub struct Tools {
    bin: PathBuf,
    stages: PathBuf,
}

impl Tools {
    /// Locates the tools, running the build script when any is missing.
    pub fn locate() -> Result<Self, HarnessError> {
        let cache = cache_dir();
        let tools = Tools {
            bin: cache.join("bin"),
            stages: cache.join("kwok-stage"),
        };
        if NEEDED.iter().all(|b| tools.bin.join(b).exists()) && tools.stages.exists() {
            return Ok(tools);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/build.sh");
        let status = Command::new("bash")
            .arg(&script)
            .status()
            .map_err(|e| HarnessError::io(&script, e))?;
        if !status.success() {
            return Err(HarnessError::Tools(format!(
                "{} failed with {status}",
                script.display()
            )));
        }
        match NEEDED.iter().find(|b| !tools.bin.join(b).exists()) {
            Some(missing) => Err(HarnessError::Tools(format!(
                "{missing} is missing from {}",
                tools.bin.display()
            ))),
            None => Ok(tools),
        }
    }

    /// The path of binary `name`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// The etcd binary.
    pub fn etcd(&self) -> PathBuf {
        self.bin("etcd")
    }

    /// KWOK's stage files: fast node initialisation, node heartbeats with leases, and the fast pod
    /// lifecycle (ready, delete), so Deployments and StatefulSets progress. KWOK's `pod-complete`
    /// stage, which would mark every Job's pod `Succeeded` without running anything, is left out:
    /// a Job's pod on the KWOK node never ends, and Jobs run on a real node
    /// ([`crate::Options::real_node_for_jobs`]).
    pub fn kwok_stages(&self) -> Result<Vec<PathBuf>, HarnessError> {
        let mut files = Vec::new();
        for sub in ["node/fast", "node/heartbeat-with-lease", "pod/fast"] {
            let dir = self.stages.join(sub);
            let entries = std::fs::read_dir(&dir).map_err(|e| HarnessError::io(&dir, e))?;
            let mut here: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "yaml")
                        && p.file_name()
                            .is_some_and(|n| n != "kustomization.yaml" && n != "pod-complete.yaml")
                })
                .collect();
            here.sort();
            files.extend(here);
        }
        Ok(files)
    }
}
