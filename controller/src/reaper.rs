//! The controller's own processes: it is PID 1 in its container and a child subreaper wherever
//! it runs, so orphaned descendants of helm, npm and pulumi are re-parented to it; it reaps the
//! zombies of those orphans, and only those: the tools it starts itself are registered while
//! they run, and their exit status stays with the code that waits for them (tokio waits on its
//! own pids; a blanket `waitpid(-1)` would steal them). It also stops every descendant at once
//! when the controller must stop working (a lost leader lease).

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// Errors of the process housekeeping.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    #[error(
        "becoming a child subreaper failed: {0}; the controller needs Linux 3.4 or later (orphaned tool processes would otherwise be left as zombies)"
    )]
    Subreaper(nix::Error),
}

/// How often the children are looked at without a `SIGCHLD` (a signal can coalesce).
const SWEEP: Duration = Duration::from_secs(10);

/// The pids of children this process started and waits for itself. A spawn holds it until the
/// new pid is in, and a sweep while it reaps: a sweep never sees a fresh child of ours unlisted.
static OURS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn ours() -> MutexGuard<'static, BTreeSet<i32>> {
    OURS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

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

/// The processes of `pids` that still exist, from `/proc/<pid>/stat`.
fn read(pids: impl IntoIterator<Item = i32>) -> Vec<Proc> {
    let stat = |pid| {
        parse_stat(
            pid,
            &std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?,
        )
    };
    pids.into_iter().filter_map(stat).collect()
}

/// Every live process (zombies included), from `/proc`.
pub fn processes() -> Vec<Proc> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    read(entries.filter_map(|e| e.file_name().to_str()?.parse().ok()))
}

/// The children of this process (of any of its threads, adopted orphans and zombies included),
/// from each thread's `/proc/self/task/<tid>/children`: a sweep need not read every process of
/// the machine. `None` when a thread's list cannot be read (a kernel without
/// `CONFIG_PROC_CHILDREN`, or a thread that just ended); the caller then reads every process.
pub fn children() -> Option<Vec<Proc>> {
    let mut pids = BTreeSet::new();
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).ok()?;
        pids.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    Some(read(pids))
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

/// The zombies among `table` that are children of `me` and not one of `ours`: what the sweep
/// reaps.
pub fn orphan_zombies(table: &[Proc], me: i32, ours: &BTreeSet<i32>) -> Vec<i32> {
    let orphan = |p: &&Proc| p.ppid == me && p.state == 'Z' && !ours.contains(&p.pid);
    table.iter().filter(orphan).map(|p| p.pid).collect()
}

/// Makes this process the reaper of its orphaned descendants.
pub fn become_subreaper() -> Result<(), ReaperError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(ReaperError::Subreaper)
}

/// A registered child: its pid leaves the registry when this is dropped (after it was waited
/// for, or handed to tokio's own reaping when a run is dropped).
#[derive(Debug)]
pub struct Registered(Option<i32>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            ours().remove(&pid);
        }
    }
}

/// Spawns `cmd` and registers its pid before any sweep can see it; keep the returned guard
/// until the child has been waited for.
pub fn spawn(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<(tokio::process::Child, Registered)> {
    let mut ours = ours();
    let child = cmd.spawn()?;
    let pid = child.id().map(|p| p as i32);
    ours.extend(pid);
    Ok((child, Registered(pid)))
}

/// Reaps the orphaned zombies now; returns their pids.
pub fn sweep() -> Vec<i32> {
    let ours = ours();
    let table = children().unwrap_or_else(processes);
    let mut reaped = orphan_zombies(&table, std::process::id() as i32, &ours);
    // Each is a zombie child of ours: its pid cannot be reused until it is reaped here.
    reaped.retain(|pid| waitpid(Pid::from_raw(*pid), Some(WaitPidFlag::WNOHANG)).is_ok());
    if !reaped.is_empty() {
        tracing::debug!(?reaped, "reaped orphaned tool processes");
    }
    reaped
}

/// Reaps orphaned zombies whenever a child exits (and every few seconds), for ever.
pub async fn run() {
    let mut exits = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        .inspect_err(
            |e| tracing::warn!(error = %e, "cannot listen for SIGCHLD; sweeping on a timer only"),
        )
        .ok();
    loop {
        sweep();
        match exits.as_mut() {
            Some(exits) => drop(tokio::time::timeout(SWEEP, exits.recv()).await),
            None => tokio::time::sleep(SWEEP).await,
        }
    }
}

/// Kills every descendant of this process (helm, npm, pulumi and whatever they started, in any
/// process group), at once and without waiting: the controller stops working. Returns how many
/// were signalled.
pub fn kill_descendants() -> usize {
    let table = processes();
    let live = |pid: &&i32| table.iter().any(|p| p.pid == **pid && p.state != 'Z');
    let tree = descendants(&table, std::process::id() as i32);
    let killed = tree.iter().filter(live);
    killed
        .filter(|pid| kill(Pid::from_raw(**pid), Signal::SIGKILL).is_ok())
        .count()
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
    fn only_zombie_children_that_are_not_ours_are_reaped() {
        let table = [
            p(10, 1, 'S'),
            p(11, 10, 'Z'), // an orphan, re-parented and dead: reaped
            p(12, 10, 'Z'), // our own tool, waited for by its runner: left alone
            p(13, 10, 'S'), // alive
            p(14, 13, 'Z'), // a grandchild: its own parent reaps it
        ];
        let ours = BTreeSet::from([12]);
        assert_eq!(orphan_zombies(&table, 10, &ours), vec![11]);
        assert_eq!(descendants(&table, 10), vec![11, 12, 13, 14]);
        assert_eq!(descendants(&table, 13), vec![14]);
    }
}
