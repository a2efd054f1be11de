//! The controller's async runtime: one thread, the main one, runs all of its async work.
//!
//! The controller waits on the network nearly all the time. On tokio's multi-threaded runtime
//! its work was spread over three threads (the controller's stream on the main thread,
//! reconciles and watches on two workers), and every hand-over between them cost a wake-up and
//! a context switch: about 13 % of the CPU of an idle resync at 1,000 instances
//! (docs/benchmarks.md, "Issue 13, 12-03 afternoon"). Blocking work (checking the state
//! passphrase; sealing, verifying, removing and linking dependency trees; writing the program's
//! config) goes to tokio's blocking pool, whose threads are named `controller-blocking`. Nothing
//! else holds the async thread for long: Helm, npm and Pulumi run as child processes, and the
//! file reads on the async thread are of small files on the state volume.

/// The runtime `main` runs the controller on.
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .thread_name("controller-blocking")
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use tokio::runtime::{Handle, RuntimeFlavor};

    #[test]
    fn the_async_work_runs_on_the_calling_thread_with_timers_and_io() {
        let runtime = super::build().expect("runtime");
        let main = std::thread::current().id();
        let (flavor, on) = runtime.block_on(async {
            // Timers and I/O are enabled: a sleep and a TCP listener work.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("I/O driver");
            drop(listener);
            let spawned = tokio::spawn(async { std::thread::current().id() })
                .await
                .expect("spawned task");
            (Handle::current().runtime_flavor(), spawned)
        });
        assert_eq!(flavor, RuntimeFlavor::CurrentThread);
        assert_eq!(on, main, "a spawned task ran on another thread");
        let blocking = runtime
            .block_on(async {
                tokio::task::spawn_blocking(|| std::thread::current().name().map(String::from))
                    .await
            })
            .expect("blocking task");
        assert_eq!(blocking.as_deref(), Some("controller-blocking"));
    }
}
