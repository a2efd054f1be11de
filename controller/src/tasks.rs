//! Tracked long-running work (Helm), so a reconcile never holds a worker for minutes: one task per
//! instance at most, installs bounded by `--max-concurrent-installs` and queued in order (with
//! their position reported), and failures remembered with a capped backoff. Reconciles poll the
//! registry every `--target-poll`; a task's end also wakes its instance at once
//! ([`Tasks::finished`]), so the next step does not wait for the poll.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{AbortHandle, Abortable, BoxFuture};

use crate::decide::model::{TaskError, TaskState};

/// The first retry delay; it doubles per consecutive failure.
const BACKOFF_BASE: Duration = Duration::from_secs(5);
/// The longest retry delay.
const BACKOFF_CAP: Duration = Duration::from_secs(300);

/// Which instance a task belongs to: `<namespace>/<name>`.
pub type Key = String;

struct Failure {
    error: TaskError,
    attempts: u32,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    running: HashMap<Key, AbortHandle>,
    queue: VecDeque<(Key, BoxFuture<'static, Result<(), TaskError>>)>,
    failed: HashMap<Key, Failure>,
}

/// The task registry.
pub struct Tasks {
    inner: Mutex<Inner>,
    limit: usize,
    running_gauge: prometheus::IntGauge,
    queued_gauge: prometheus::IntGauge,
    finished: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Key>>>,
}

/// The delay before retry number `attempts` (1-based).
pub fn backoff(attempts: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempts.saturating_sub(1).min(16));
    (BACKOFF_BASE * factor).min(BACKOFF_CAP)
}

impl Tasks {
    /// A registry running at most `limit` bounded tasks at once.
    pub fn new(
        limit: usize,
        running_gauge: prometheus::IntGauge,
        queued_gauge: prometheus::IntGauge,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            limit: limit.max(1),
            running_gauge,
            queued_gauge,
            finished: Mutex::new(None),
        })
    }

    /// What the task of `key` is doing.
    pub fn state(&self, key: &str) -> TaskState {
        let Ok(inner) = self.inner.lock() else {
            return TaskState::Idle;
        };
        if inner.running.contains_key(key) {
            return TaskState::Running;
        }
        if let Some(position) = inner.queue.iter().position(|(k, _)| k == key) {
            return TaskState::Queued(position + 1);
        }
        match inner.failed.get(key) {
            Some(f) => TaskState::Failed(f.error.clone()),
            None => TaskState::Idle,
        }
    }

    /// How long until `key` may retry after a failure (zero when it may now).
    pub fn retry_in(&self, key: &str) -> Duration {
        let Ok(inner) = self.inner.lock() else {
            return Duration::ZERO;
        };
        inner
            .failed
            .get(key)
            .map(|f| backoff(f.attempts).saturating_sub(f.at.elapsed()))
            .unwrap_or(Duration::ZERO)
    }

    /// Forgets the backoff of `key` (a person asked for an immediate retry).
    pub fn clear_backoff(&self, key: &str) {
        if let Ok(mut inner) = self.inner.lock()
            && let Some(f) = inner.failed.get_mut(key)
        {
            f.at = Instant::now() - BACKOFF_CAP;
        }
    }

    /// The keys of tasks as they end (done or failed; not cancelled ones), for the reconcile
    /// loop to wake their instances. One receiver: a later call replaces the earlier one.
    pub fn finished(&self) -> tokio::sync::mpsc::UnboundedReceiver<Key> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if let Ok(mut finished) = self.finished.lock() {
            *finished = Some(tx);
        }
        rx
    }

    /// Submits `work` for `key`. Returns false (and drops `work`) when the key already has a task
    /// or is still backing off. A `bounded` task waits for a slot; an unbounded one (uninstalls)
    /// starts at once.
    pub fn submit(
        self: &Arc<Self>,
        key: &str,
        bounded: bool,
        work: BoxFuture<'static, Result<(), TaskError>>,
    ) -> bool {
        {
            let Ok(mut inner) = self.inner.lock() else {
                return false;
            };
            if inner.running.contains_key(key) || inner.queue.iter().any(|(k, _)| k == key) {
                return false;
            }
            if let Some(f) = inner.failed.get(key)
                && f.at.elapsed() < backoff(f.attempts)
            {
                return false;
            }
            if bounded {
                inner.queue.push_back((key.to_string(), work));
            } else {
                let handle = self.spawn(key.to_string(), work);
                inner.running.insert(key.to_string(), handle);
            }
        }
        self.dispatch();
        true
    }

    fn spawn(
        self: &Arc<Self>,
        key: Key,
        work: BoxFuture<'static, Result<(), TaskError>>,
    ) -> AbortHandle {
        let this = self.clone();
        let (handle, registration) = AbortHandle::new_pair();
        let work = Abortable::new(work, registration);
        tokio::spawn(async move {
            let result = work.await;
            if let Ok(mut inner) = this.inner.lock() {
                // Cancelled: `cancel` already forgot it (and the key may run a new task now).
                let Ok(result) = result else {
                    return;
                };
                inner.running.remove(&key);
                match result {
                    Ok(()) => {
                        inner.failed.remove(&key);
                    }
                    Err(error) => {
                        let attempts = inner.failed.get(&key).map(|f| f.attempts + 1).unwrap_or(1);
                        inner.failed.insert(
                            key.clone(),
                            Failure {
                                error,
                                attempts,
                                at: Instant::now(),
                            },
                        );
                    }
                }
            }
            this.dispatch();
            if let Ok(finished) = this.finished.lock()
                && let Some(tx) = finished.as_ref()
            {
                let _ = tx.send(key);
            }
        });
        handle
    }

    /// Starts queued tasks while slots are free, oldest first.
    fn dispatch(self: &Arc<Self>) {
        if let Ok(mut inner) = self.inner.lock() {
            while inner.running.len() < self.limit {
                let Some((key, work)) = inner.queue.pop_front() else {
                    break;
                };
                // Spawned under the lock: the task cannot finish (and remove itself) before
                // it is recorded as running.
                let handle = self.spawn(key.clone(), work);
                inner.running.insert(key, handle);
            }
            self.running_gauge.set(inner.running.len() as i64);
            self.queued_gauge.set(inner.queue.len() as i64);
        }
    }

    /// Stops the task of `key`, queued or running: a running one is dropped where it waits,
    /// which kills the processes it started. Returns whether there was one.
    pub fn cancel(self: &Arc<Self>, key: &str) -> bool {
        let found = {
            let Ok(mut inner) = self.inner.lock() else {
                return false;
            };
            let queued = inner.queue.len();
            inner.queue.retain(|(k, _)| k != key);
            let running = inner.running.remove(key);
            if let Some(handle) = &running {
                handle.abort();
            }
            inner.failed.remove(key);
            running.is_some() || inner.queue.len() != queued
        };
        self.dispatch();
        found
    }

    /// Drops the record of `key` (the instance is gone).
    pub fn forget(&self, key: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.failed.remove(key);
            inner.queue.retain(|(k, _)| k != key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn registry(limit: usize) -> Arc<Tasks> {
        Tasks::new(
            limit,
            prometheus::IntGauge::new("r", "r").expect("g"),
            prometheus::IntGauge::new("q", "q").expect("g"),
        )
    }

    async fn until(tasks: &Tasks, key: &str, want: TaskState) {
        for _ in 0..200 {
            if tasks.state(key) == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{key} never reached {want:?}: {:?}", tasks.state(key));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(2), Duration::from_secs(10));
        assert_eq!(backoff(4), Duration::from_secs(40));
        assert_eq!(backoff(30), BACKOFF_CAP);
    }

    #[tokio::test]
    async fn a_task_that_ends_wakes_its_key_and_a_cancelled_one_does_not() {
        let tasks = registry(2);
        let mut finished = tasks.finished();
        assert!(tasks.submit("ns/ok", true, async { Ok(()) }.boxed()));
        assert!(tasks.submit(
            "ns/failed",
            false,
            async { Err(TaskError::from("boom".to_string())) }.boxed()
        ));
        let (_keep, never) = tokio::sync::oneshot::channel::<()>();
        assert!(
            tasks.submit(
                "ns/cancelled",
                true,
                async move {
                    let _ = never.await;
                    Ok(())
                }
                .boxed()
            )
        );
        let mut woken = Vec::new();
        for _ in 0..2 {
            let key = tokio::time::timeout(Duration::from_secs(5), finished.recv())
                .await
                .expect("a wake-up")
                .expect("open");
            woken.push(key);
        }
        woken.sort();
        assert_eq!(woken, ["ns/failed", "ns/ok"]);
        assert!(tasks.cancel("ns/cancelled"));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), finished.recv())
                .await
                .is_err(),
            "a cancelled task wakes nothing"
        );
    }

    #[tokio::test]
    async fn bounded_tasks_queue_in_order_and_report_positions() {
        let tasks = registry(1);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release_a, wait_a) = tokio::sync::oneshot::channel::<()>();
        let o = order.clone();
        assert!(
            tasks.submit(
                "ns/a",
                true,
                async move {
                    let r = wait_a.await.map_err(|e| TaskError::from(e.to_string()));
                    o.lock().expect("lock").push("a");
                    r
                }
                .boxed()
            )
        );
        let o = order.clone();
        assert!(
            tasks.submit(
                "ns/b",
                true,
                async move {
                    o.lock().expect("lock").push("b");
                    Ok(())
                }
                .boxed()
            )
        );
        let o = order.clone();
        assert!(
            tasks.submit(
                "ns/c",
                true,
                async move {
                    o.lock().expect("lock").push("c");
                    Err("boom".into())
                }
                .boxed()
            )
        );
        assert_eq!(tasks.state("ns/a"), TaskState::Running);
        assert_eq!(tasks.state("ns/b"), TaskState::Queued(1));
        assert_eq!(tasks.state("ns/c"), TaskState::Queued(2));
        assert!(
            !tasks.submit("ns/b", true, async { Ok(()) }.boxed()),
            "one task per instance"
        );
        let _ = release_a.send(());
        until(&tasks, "ns/c", TaskState::Failed("boom".into())).await;
        assert_eq!(
            *order.lock().expect("lock"),
            ["a", "b", "c"],
            "oldest first, one at a time"
        );
        assert_eq!(tasks.state("ns/b"), TaskState::Idle);
        assert!(
            !tasks.submit("ns/c", true, async { Ok(()) }.boxed()),
            "a failure backs off"
        );
        assert!(tasks.retry_in("ns/c") > Duration::ZERO);
        tasks.clear_backoff("ns/c");
        assert!(
            tasks.submit("ns/c", true, async { Ok(()) }.boxed()),
            "a retry request skips the backoff"
        );
        until(&tasks, "ns/c", TaskState::Idle).await;
    }

    #[tokio::test]
    async fn cancelling_drops_the_running_task_and_frees_its_slot() {
        let tasks = registry(1);
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        struct OnDrop(Option<tokio::sync::oneshot::Sender<()>>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(());
                }
            }
        }
        let guard = OnDrop(Some(dropped_tx));
        assert!(
            tasks.submit(
                "ns/a",
                true,
                async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                    Ok(())
                }
                .boxed()
            )
        );
        assert!(tasks.submit("ns/b", true, async { Ok(()) }.boxed()));
        assert_eq!(tasks.state("ns/b"), TaskState::Queued(1));
        until(&tasks, "ns/a", TaskState::Running).await;
        assert!(tasks.cancel("ns/a"));
        tokio::time::timeout(Duration::from_secs(5), dropped_rx)
            .await
            .expect("the running future is dropped")
            .expect("dropped, not leaked");
        assert_eq!(
            tasks.state("ns/a"),
            TaskState::Idle,
            "cancelled is not failed"
        );
        until(&tasks, "ns/b", TaskState::Idle).await;
        assert!(!tasks.cancel("ns/a"), "nothing left to cancel");
    }

    #[tokio::test]
    async fn unbounded_tasks_start_at_once() {
        let tasks = registry(1);
        let (_hold, wait) = tokio::sync::oneshot::channel::<()>();
        assert!(tasks.submit(
            "ns/a",
            true,
            async move { wait.await.map_err(|e| TaskError::from(e.to_string())) }.boxed()
        ));
        assert!(tasks.submit("ns/z", false, async { Ok(()) }.boxed()));
        until(&tasks, "ns/z", TaskState::Idle).await;
        assert_eq!(
            tasks.state("ns/a"),
            TaskState::Running,
            "an uninstall does not wait for an install slot"
        );
    }
}
