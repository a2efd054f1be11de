//! The controller's own processes. The binary runs as two: a supervisor (PID 1 in its
//! container, a child subreaper wherever it runs) that starts the controller as its only child,
//! passes signals on to it, reaps every orphaned descendant of the tools (helm, npm, pulumi)
//! and, when the controller exits for whatever reason, kills everything left and exits with
//! the controller's status. The controller waits only for the tools it starts itself, so no
//! reaping of its own can take an exit status from the code waiting for it.

use std::ffi::OsString;
use std::process::ExitCode;

use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// Set in the controller's environment to the supervisor's pid.
pub const SUPERVISOR: &str = "PLATFORM_OPERATOR_SUPERVISOR";

/// One process: its pid, its parent's pid and its state letter (`R`, `S`, `Z`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    /// The process id.
    pub pid: i32,
    /// Its parent's process id.
    pub ppid: i32,
    /// Its state (`Z`: a zombie, exited and not yet reaped).
    pub state: char,
}

/// Parses `/proc/<pid>/stat` (the command name is in parentheses and may hold spaces and
/// parentheses: the fields are counted after the last `)`).
pub fn parse_stat(pid: i32, stat: &str) -> Option<Proc> {
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(Proc { pid, ppid, state })
}

/// Every live process (zombies included), from `/proc`.
pub fn processes() -> Vec<Proc> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let pids = entries.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok());
    let stat = |pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    pids.filter_map(|pid| parse_stat(pid, &stat(pid)?))
        .collect()
}

/// Every descendant of `root` in `table`, parents before their children.
pub fn descendants(table: &[Proc], root: i32) -> Vec<i32> {
    let mut tree = vec![root];
    let mut i = 0;
    while let Some(&parent) = tree.get(i) {
        for p in table {
            if p.ppid == parent && !tree.contains(&p.pid) {
                tree.push(p.pid);
            }
        }
        i += 1;
    }
    tree.split_off(1)
}

/// Kills every live descendant of this process at once, without waiting.
fn kill_descendants() {
    let table = processes();
    for pid in descendants(&table, std::process::id() as i32) {
        if table.iter().any(|p| p.pid == pid && p.state != 'Z') {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// In the controller started by [`supervise`], before any other thread starts: takes the
/// signals the supervisor waits for back (a spawned child inherits the signal mask), dies with
/// the supervisor (`PR_SET_PDEATHSIG`), and at once if the supervisor is already gone.
pub fn follow_supervisor(supervisor: &str) -> std::io::Result<()> {
    SigSet::all().thread_unblock()?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if nix::unistd::getppid().as_raw().to_string() != supervisor {
        return Err(std::io::Error::other("the supervisor exited"));
    }
    Ok(())
}

/// Runs this binary again with `args` as the supervised controller, and supervises it until it
/// exits; returns its exit status (128 + the signal that killed it).
pub fn supervise(args: impl IntoIterator<Item = OsString>) -> std::io::Result<ExitCode> {
    nix::sys::prctl::set_child_subreaper(true)?;
    let mask: SigSet = [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGCHLD,
    ]
    .into_iter()
    .collect();
    mask.thread_block()?;
    let controller = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .env(SUPERVISOR, std::process::id().to_string())
        .spawn()?;
    let controller = Pid::from_raw(controller.id() as i32);
    loop {
        let signal = mask.wait()?;
        if signal != Signal::SIGCHLD {
            let _ = kill(controller, signal);
            continue;
        }
        // Reap every child that has exited (signals coalesce); the controller's end ends all.
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            let code = match status {
                WaitStatus::Exited(pid, code) if pid == controller => code,
                WaitStatus::Signaled(pid, signal, _) if pid == controller => 128 + signal as i32,
                WaitStatus::StillAlive => break,
                _ => continue,
            };
            // Twice: a tool may have forked while the first pass ran.
            kill_descendants();
            kill_descendants();
            return Ok(ExitCode::from(code as u8));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, state: char) -> Proc {
        Proc { pid, ppid, state }
    }

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        assert_eq!(
            parse_stat(42, "42 (a (b) c) Z 7 42 42 0 -1"),
            Some(p(42, 7, 'Z'))
        );
        assert_eq!(parse_stat(1, "1 (init) S 0 1 1"), Some(p(1, 0, 'S')));
        assert_eq!(parse_stat(1, "garbage"), None);
    }

    #[test]
    fn descendants_are_every_child_and_theirs() {
        let table = [
            p(10, 1, 'S'),
            p(11, 10, 'Z'),
            p(12, 10, 'Z'),
            p(13, 10, 'S'),
            p(14, 13, 'Z'),
        ];
        assert_eq!(descendants(&table, 10), vec![11, 12, 13, 14]);
        assert_eq!(descendants(&table, 13), vec![14]);
    }
}
