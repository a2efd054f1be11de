//! The end-to-end harness: a real local Kubernetes control plane built from pinned Go modules,
//! usable from Rust tests ([`ControlPlane`], [`shared`]) and from the `local-cluster` command.

pub mod chart;
pub mod cluster_dns;
pub mod cmd;
pub mod control_plane;
pub mod dockerfile;
pub mod https;
pub mod images;
pub mod node_net;
pub mod npm;
pub mod operator_on_node;
pub mod pki;
pub mod process;
pub mod prometheus;
pub mod real_node;
pub mod real_vcluster;
pub mod shared;
pub mod standin_vcluster;
pub mod tools;
pub mod webhook;

pub use control_plane::{ControlPlane, Options};
pub use shared::{shared, shared_with_real_node};

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What can go wrong while running a control plane.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A file or process operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file, folder or program.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Issuing certificates failed.
    #[error("issuing certificates: {0}")]
    Pki(String),
    /// The Go-built tools could not be built or found.
    #[error("test tools: {0}; run e2e/tools/build.sh and read its output")]
    Tools(String),
    /// A client could not be built from the kubeconfig.
    #[error("kube client: {0}")]
    Client(String),
    /// A process exited while the control plane was starting.
    #[error("{name} exited early with {status}")]
    Exited {
        /// Which process.
        name: &'static str,
        /// Its exit status.
        status: String,
    },
    /// Something did not become healthy in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The limit.
        after: Duration,
    },
    /// A command such as kubectl failed.
    #[error("{what} failed: {stderr}")]
    Command {
        /// What was run.
        what: String,
        /// Its standard error.
        stderr: String,
    },
    /// The real node ([`real_node`]) could not be prepared or started: what the machine lacks,
    /// or which part failed.
    #[error("real node: {0}")]
    Node(String),
    /// Starting failed; the logs were kept.
    #[error("control plane did not start: {message}; logs kept in {}", logs.display())]
    Start {
        /// The underlying failure.
        message: String,
        /// The folder with every process's log.
        logs: PathBuf,
    },
}

impl HarnessError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        HarnessError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
