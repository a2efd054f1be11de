//! The controller binary's supervisor (controller::reaper), run as it ships: the binary started
//! supervises the controller it starts, and whatever way the controller ends, the tools it left
//! (here a stand-in helm's orphan, and a helm still running) are killed with it and its status
//! is passed on. The controller is made to stop at its start-up check of the vCluster chart
//! (`helm show chart`), so no cluster is needed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use controller::reaper;

/// Runs (present and not a zombie).
fn alive(pid: i32) -> bool {
    reaper::processes()
        .iter()
        .any(|p| p.pid == pid && p.state != 'Z')
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(found) = f() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The controller binary with a chart that passes its digest check and a stand-in helm that
/// runs `helm` (a shell script body), in a fresh folder.
fn controller(name: &str, helm: &str) -> (Child, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("reaper-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let chart = dir.join("chart.tgz");
    std::fs::write(&chart, "not a chart").expect("chart");
    let digest = controller::chart::sha256_file(&chart).expect("digest");
    let script = dir.join("helm");
    std::fs::write(&script, format!("#!/bin/sh\n{helm}\n")).expect("helm");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_controller"));
    cmd.env_remove(reaper::SUPERVISOR)
        .env("DIR", &dir)
        .arg(format!("--vcluster-chart={}", chart.display()))
        .arg(format!("--vcluster-chart-sha256=sha256:{digest}"))
        .arg(format!("--helm-binary={}", script.display()))
        .arg("--cleanup-image=x@sha256:00")
        .arg("--install-platform=false")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    e2e::process::die_with_parent(&mut cmd);
    (cmd.spawn().expect("controller starts"), dir)
}

fn pid_in(dir: &Path, file: &str) -> i32 {
    wait_for(file, || {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn a_tools_orphan_dies_with_the_controller_whose_status_is_passed_on() {
    // helm leaves an orphan and fails: the controller stops with an error (status 1).
    let (mut supervisor, dir) = controller(
        "orphan",
        "sleep 600 >/dev/null 2>&1 & echo $! > \"$DIR/orphan\"; echo no chart >&2; exit 3",
    );
    let orphan = pid_in(&dir, "orphan");
    let status = wait_for("the supervisor to exit", || supervisor.try_wait().ok()?);
    assert_eq!(
        status.code(),
        Some(1),
        "the controller's status is passed on"
    );
    wait_for("the orphan to be killed", || (!alive(orphan)).then_some(()));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_signal_reaches_the_controller_and_its_running_tools_die_with_it() {
    // helm hangs: the controller waits for it at its start-up check.
    let (mut supervisor, dir) = controller("term", "echo $$ > \"$DIR/helm.pid\"; exec sleep 600");
    let helm = pid_in(&dir, "helm.pid");
    let controller = wait_for("the supervised controller", || {
        let table = reaper::processes();
        let tree = reaper::descendants(&table, supervisor.id() as i32);
        (tree.len() == 2 && tree[1] == helm).then_some(tree[0])
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = wait_for("the supervisor to exit", || supervisor.try_wait().ok()?);
    // Before its runtime runs, the controller takes SIGTERM's default action.
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the controller ended by SIGTERM"
    );
    wait_for("the controller and helm to be gone", || {
        (!alive(controller) && !alive(helm)).then_some(())
    });
    let _ = std::fs::remove_dir_all(dir);
}
