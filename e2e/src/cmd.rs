//! Running a command (kubectl, helm) with optional standard input and capturing its output.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::HarnessError;

/// The captured result of a command.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Whether it exited with status 0.
    pub success: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Outcome {
    /// The standard output, or an error carrying standard error when the command failed.
    pub fn ok(self, what: &str) -> Result<String, HarnessError> {
        if self.success {
            Ok(self.stdout)
        } else {
            Err(HarnessError::Command {
                what: what.to_string(),
                stderr: self.stderr.trim().to_string(),
            })
        }
    }
}

/// Runs `cmd`, feeding it `stdin` when given.
pub fn run(mut cmd: Command, stdin: Option<&str>) -> Result<Outcome, HarnessError> {
    let program = std::path::PathBuf::from(cmd.get_program());
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| HarnessError::io(&program, e))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|e| HarnessError::io(&program, e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| HarnessError::io(&program, e))?;
    Ok(Outcome {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A `cargo` command in the repository's root for building this workspace from a test. The
/// variables `cargo test` sets for the running test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`,
/// `CARGO_BIN_EXE_*`, `LD_LIBRARY_PATH`, ...) are removed: build scripts track some of them
/// (`ring`'s, `CARGO_MANIFEST_DIR`), so inheriting them made every build from a test rebuild
/// half the dependency tree, and the next build outside a test rebuild it back.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(crate::repo_root());
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_by_cargo_test = key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_EXE_")
            || matches!(
                &*key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "LD_LIBRARY_PATH"
            );
        if set_by_cargo_test {
            cmd.env_remove(&*key);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    #[test]
    fn cargo_from_a_test_drops_what_cargo_test_set() {
        // `cargo test` sets CARGO_MANIFEST_DIR for this very test.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let cmd = super::cargo();
        let removed: Vec<_> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for key in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME"] {
            assert!(removed.iter().any(|k| k == key), "{key}: {removed:?}");
        }
        assert!(!removed.iter().any(|k| k == "CARGO_HOME" || k == "PATH"));
    }
}
