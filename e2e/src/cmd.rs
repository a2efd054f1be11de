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
