//! Runs the installer's tools (npm, pulumi) as whole process trees: each in its own process
//! group, recorded in a pid file, killed when the run is dropped or found left over by a
//! controller that died (`reap`). Secrets go on standard input, never in arguments.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// The pid file's name in the instance's state directory.
pub const PID_FILE: &str = "tool.pid";

/// The only variables of the controller's environment a tool (and all it starts) inherits: path,
/// locale, home, temporary folder, and proxy and CA settings to reach a registry. Not the
/// in-cluster service variables, not `KUBECONFIG`, not the operator's own flags' variables.
pub const INHERITED_ENV: [&str; 16] = [
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
];

/// A command for a tool, with an environment of [`INHERITED_ENV`] only.
pub fn command(binary: &str) -> Command {
    let mut cmd = Command::new(binary);
    cmd.env_clear();
    cmd.envs(
        INHERITED_ENV
            .iter()
            .filter_map(|k| Some((k, std::env::var_os(k)?))),
    );
    cmd
}

/// What node prints when it dies at its heap limit (V8's fatal error).
const HEAP_EXHAUSTED: [&str; 2] = [
    "JavaScript heap out of memory",
    "Reached heap limit Allocation failed",
];

/// Caps the node heap of `cmd` and the node processes it starts (`NODE_OPTIONS`), so a runaway
/// tool fails alone instead of the kernel killing the whole container.
pub fn cap_node_heap(cmd: &mut Command, limit_mib: u32) {
    cmd.env("NODE_OPTIONS", format!("--max-old-space-size={limit_mib}"));
}

/// Whether any of `texts` holds node's fatal error at its heap limit.
pub fn heap_exhausted<'a>(texts: impl IntoIterator<Item = &'a str>) -> bool {
    texts
        .into_iter()
        .any(|t| HEAP_EXHAUSTED.iter().any(|m| t.contains(m)))
}

/// What a finished tool left (`code` `None`: killed by a signal).
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// It exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// The last non-empty line of its standard error (what a status message may quote).
    pub fn last_error_line(&self) -> String {
        self.stderr
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no output")
            .chars()
            .take(400)
            .collect()
    }
}

/// Owns a running tool: dropped, it kills the tool's tree (`pgid`, if still set) and removes
/// the pid file; the child (a field) drops only after that, and tokio then reaps it.
struct Running {
    child: tokio::process::Child,
    pgid: Option<i32>,
    pid_file: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            kill_group(pgid);
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Kills the process group `pgid` and every descendant of its leader (Pulumi starts its plugins
/// in groups of their own), collected first, while the parent links still hold.
fn kill_group(pgid: i32) {
    if pgid <= 1 {
        return;
    }
    let tree = crate::reaper::descendants(&crate::reaper::processes(), pgid);
    // Nothing to wait for: the next run clears the state lock a killed pulumi leaves.
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    for pid in tree {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// The start time (clock ticks since boot) of process `pid`, from `/proc/<pid>/stat`.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count fields after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Kills a process group a previous controller left running in `dir` (the pid file's start
/// time rules out a reused pid) and removes the pid file; returns whether it killed one.
pub fn reap(dir: &Path) -> bool {
    let file = dir.join(PID_FILE);
    let Ok(text) = std::fs::read_to_string(&file) else {
        return false;
    };
    let _ = std::fs::remove_file(&file);
    let mut parts = text.split_whitespace();
    let (Some(Ok(pgid)), Some(Ok(started))) = (
        parts.next().map(str::parse::<i32>),
        parts.next().map(str::parse::<u64>),
    ) else {
        return false;
    };
    if pgid == std::process::id() as i32 || start_time(pgid) != Some(started) {
        return false;
    }
    tracing::warn!(dir = %dir.display(), pgid, "stopping tools a previous controller left running");
    kill_group(pgid);
    true
}

async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if let Some(mut p) = pipe {
        p.read_to_end(&mut buf).await?;
    }
    Ok(buf)
}

/// Runs `cmd` to completion as the leader of a new process group, feeding `stdin`, recording
/// the group in `dir`'s pid file while it runs. Dropping the returned future kills the group.
pub async fn run(mut cmd: Command, stdin: Option<&[u8]>, dir: &Path) -> std::io::Result<Output> {
    cmd.process_group(0)
        .stdin(stdin.map_or_else(Stdio::null, |_| Stdio::piped()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let pid = child.id().map(|p| p as i32);
    let pid_file = dir.join(PID_FILE);
    if let Some(pid) = pid
        && let Some(started) = start_time(pid)
    {
        let _ = std::fs::write(&pid_file, format!("{pid} {started}\n"));
    }
    let (input, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let mut running = Running {
        child,
        pgid: pid,
        pid_file,
    };
    if let (Some(data), Some(mut pipe)) = (stdin, input) {
        // A tool that ends without reading its input says why in its exit and its stderr.
        let written = pipe.write_all(data).await;
        if let Err(e) = written
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(e);
        }
        drop(pipe);
    }
    let waited = running.child.wait();
    let (status, out, err) = tokio::try_join!(waited, read_all(stdout), read_all(stderr))?;
    // The leader is gone; stop anything it left in its group (a plugin it did not reap).
    if let Some(pgid) = running.pgid.take() {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    Ok(Output {
        code: status.code(),
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
    })
}

/// The value `cmd` sets for variable `key` in its tool's environment (`None`: not set).
#[cfg(test)]
pub fn env_of(cmd: &Command, key: &str) -> Option<String> {
    cmd.as_std()
        .get_envs()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("installer-process-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    fn alive(pid: i32) -> bool {
        // A zombie still answers signal 0; read its state instead.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s[s.rfind(')')? + 2..].chars().next())
            .is_some_and(|state| state != 'Z')
    }

    #[tokio::test]
    async fn a_tool_inherits_no_in_cluster_environment() {
        let d = dir("env");
        // The test's own environment (cargo's CARGO_* and RUST_* variables, and in a pod the
        // KUBERNETES_SERVICE_* ones) stands for the controller's: only INHERITED_ENV passes.
        assert!(
            std::env::var_os("CARGO_PKG_NAME").is_some() || std::env::var_os("CARGO").is_some()
        );
        let keys = [
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT",
            "KUBECONFIG",
            "NPM_REGISTRY",
            "PULUMI_CONFIG_PASSPHRASE",
        ];
        let mut cmd = command("sh");
        for key in keys {
            cmd.env(key, "set-by-the-caller");
        }
        let mut scrubbed = command("sh");
        scrubbed.arg("-c").arg("env");
        let out = run(scrubbed, None, &d).await.expect("run");
        assert!(out.success());
        for line in out.stdout.lines() {
            let key = line.split('=').next().unwrap_or_default();
            assert!(
                INHERITED_ENV.contains(&key) || key == "PWD" || key == "SHLVL" || key == "_",
                "{key} passed to a tool"
            );
        }
        assert!(out.stdout.lines().any(|l| l.starts_with("PATH=")));
        // What a caller sets explicitly does reach the tool.
        cmd.arg("-c").arg("echo $KUBECONFIG");
        let out = run(cmd, None, &d).await.expect("run");
        assert_eq!(out.stdout.trim(), "set-by-the-caller");
    }

    #[tokio::test]
    async fn a_tool_that_ends_without_reading_its_input_is_its_own_failure() {
        let d = dir("unread");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exec 0<&-; echo refused >&2; exit 4"]);
        let out = (run(cmd, Some(&[b'x'; 1 << 20]), &d).await).expect("no spawn error");
        assert_eq!(out.code, Some(4));
        assert_eq!(out.last_error_line(), "refused");
    }

    #[tokio::test]
    async fn feeds_stdin_and_captures_output() {
        let d = dir("stdin");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "read v; echo got:$v; echo oops >&2; exit 3"]);
        let out = run(cmd, Some(b"hidden\n"), &d).await.expect("run");
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout.trim(), "got:hidden");
        assert_eq!(out.last_error_line(), "oops");
        assert!(!d.join(PID_FILE).exists(), "the pid file goes with the run");
    }

    #[tokio::test]
    async fn dropping_a_run_kills_the_whole_tree() {
        let d = dir("drop");
        let marker = d.join("grandchild.pid");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("sleep 300 & echo $! > {}; wait", marker.display()));
        let run = run(cmd, None, &d);
        let _ = tokio::time::timeout(Duration::from_millis(500), run).await;
        let grandchild: i32 = std::fs::read_to_string(&marker)
            .expect("grandchild started")
            .trim()
            .parse()
            .expect("pid");
        for _ in 0..50 {
            if !alive(grandchild) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!alive(grandchild), "the grandchild died with its group");
        assert!(!d.join(PID_FILE).exists());
    }

    #[tokio::test]
    async fn a_timeout_kills_children_that_left_the_group() {
        let d = dir("setsid");
        let marker = d.join("escaped.pid");
        // The child starts a grandchild in a process group of its own (as pulumi does with its
        // plugins), then waits.
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(format!(
            "import subprocess, time\np = subprocess.Popen(['sleep', '300'], start_new_session=True)\nopen('{}', 'w').write(str(p.pid))\ntime.sleep(300)",
            marker.display()
        ));
        let mut run = Box::pin(run(cmd, None, &d));
        // The run is dropped once the grandchild has started (python may take seconds to start
        // on a busy machine), as a timeout would drop it.
        let started = async {
            loop {
                if let Some(pid) = std::fs::read_to_string(&marker)
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok())
                {
                    return pid;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let escaped = tokio::select! {
            out = &mut run => panic!("the run ended on its own: {out:?}"),
            pid = tokio::time::timeout(Duration::from_secs(60), started) => {
                pid.expect("the grandchild started within 60 s")
            }
        };
        drop(run);
        // A killed process still has to be scheduled to exit: allow for a busy machine.
        for _ in 0..600 {
            if !alive(escaped) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!alive(escaped), "a descendant in its own group died too");
    }

    #[tokio::test]
    async fn reaps_a_group_left_by_a_dead_controller_but_not_a_reused_pid() {
        let d = dir("reap");
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .expect("spawn");
        let pid = child.id() as i32;
        let started = start_time(pid).expect("start time");
        std::fs::write(d.join(PID_FILE), format!("{pid} {}\n", started + 1)).expect("pid file");
        assert!(!reap(&d), "another start time: a reused pid, left alone");
        assert!(alive(pid));
        std::fs::write(d.join(PID_FILE), format!("{pid} {started}\n")).expect("pid file");
        assert!(reap(&d));
        let status = child.wait().expect("wait");
        assert!(!status.success(), "killed");
        assert!(!d.join(PID_FILE).exists());
        assert!(!reap(&d), "nothing left");
    }
}
