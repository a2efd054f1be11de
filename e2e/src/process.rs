//! Child processes that never outlive the test that started them.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Makes the child receive SIGKILL when the thread that spawned it exits, so that a test
/// process killed or aborted mid-run leaves no control plane behind.
#[allow(unsafe_code)]
pub fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2), which is
    // async-signal-safe; it touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends SIGTERM, waits up to `grace`, then SIGKILLs and reaps the child.
pub fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY-free: kill(2) through libc on a pid we own and have not reaped yet.
        signal(pid, libc::SIGTERM);
    }
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[allow(unsafe_code)]
fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Removes the folders `<prefix><pid>-…` under `base` whose test process has ended (shared
/// fixtures keep their folders while the process runs, for their logs, and would otherwise pile
/// up run after run).
pub fn sweep_ended(base: &std::path::Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('-').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Starts a fixture on a keeper thread that lives as long as the test process (processes
/// spawned with a parent-death signal die with the thread that spawned them), and returns the
/// handle `handle` makes of it. Blocks while it starts.
pub fn keep_for_process<T, H>(
    name: &str,
    start: impl FnOnce() -> Result<T, String> + Send + 'static,
    handle: impl FnOnce(&T) -> H + Send + 'static,
) -> Result<H, String>
where
    H: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || match start() {
            Ok(fixture) => {
                let _ = tx.send(Ok(handle(&fixture)));
                let _keep = fixture;
                loop {
                    std::thread::park();
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        });
    match spawned {
        Ok(_) => rx.recv().unwrap_or_else(|e| Err(e.to_string())),
        Err(e) => Err(e.to_string()),
    }
}

/// As [`keep_for_process`], and the fixture is dropped when the test process exits (an `atexit`
/// handler asks the keeper thread to drop it and waits up to a minute), for a fixture whose
/// drop removes what a parent-death signal would leave (a real node's containers, mounts,
/// cgroups and network namespace). A process killed by a signal runs no handler:
/// [`crate::real_node::sweep_ended`] removes what it left, at the next real node's start.
pub fn keep_until_exit<T, H>(
    name: &str,
    start: impl FnOnce() -> Result<T, String> + Send + 'static,
    handle: impl FnOnce(&T) -> H + Send + 'static,
) -> Result<H, String>
where
    H: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || match start() {
            Ok(fixture) => {
                let _ = tx.send(Ok(handle(&fixture)));
                // Until the process exits (or the handler is gone).
                let _ = stopped.recv();
                drop(fixture);
                let _ = done.send(());
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        });
    if let Err(e) = spawned {
        return Err(e.to_string());
    }
    AT_EXIT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((stop, finished));
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(register_at_exit);
    rx.recv().unwrap_or_else(|e| Err(e.to_string()))
}

#[allow(unsafe_code)]
fn register_at_exit() {
    // SAFETY: atexit(3) with a function that never unwinds (it catches panics).
    unsafe {
        libc::atexit(drop_kept_fixtures);
    }
}

type Kept = (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>);

/// The fixtures [`keep_until_exit`] keeps: how to stop each, and how to hear that it stopped.
static AT_EXIT: std::sync::Mutex<Vec<Kept>> = std::sync::Mutex::new(Vec::new());

extern "C" fn drop_kept_fixtures() {
    let _ = std::panic::catch_unwind(|| {
        let kept = std::mem::take(
            &mut *AT_EXIT
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (stop, _) in &kept {
            let _ = stop.send(());
        }
        for (_, finished) in kept {
            let _ = finished.recv_timeout(Duration::from_secs(60));
        }
    });
}

/// Runs the future `make` builds on a new thread named `name`, with a current-thread runtime of
/// its own, so that a test blocking on kubectl does not stall it.
pub fn spawn_on_own_runtime<F, Fut>(
    name: &str,
    make: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(make());
        })
}
