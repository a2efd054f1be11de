//! Tracked long-running work (Helm), so a reconcile never holds a worker for minutes: one task per
//! instance at most, installs bounded by `--max-concurrent-installs` and queued in order, and
//! failures remembered with a capped backoff (`backon`'s, without jitter: one retry per failed
//! task, held back here) and counted in a row per key, until a success or [`Tasks::start_over`]. Reconciles poll a running task every `--target-poll`; the registry
//! wakes an instance itself ([`Tasks::woken`]) when its task ends, when a queued task starts, and
//! when a queued task's place, as the status words it ([`queue_place`]), changes: a queued
//! instance is not polled, so n queued instances cost O(n log n) reconciles, not n² per queue.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::future::{AbortHandle, Abortable, BoxFuture};

#[cfg(doc)]
use crate::decide::model::queue_place;
use crate::decide::model::{TaskError, TaskState, place_bound};
use crate::lock;

const BACKOFF_BASE: Duration = Duration::from_secs(5);
const BACKOFF_CAP: Duration = Duration::from_secs(300);

type Work = BoxFuture<'static, Result<(), TaskError>>;

struct Failure {
    error: TaskError,
    /// When the key may run again.
    until: Instant,
    /// The same, on the wall clock (what the status shows).
    at: SystemTime,
    /// The waits of the next failures in a row.
    waits: ExponentialBackoff,
}

/// The waits after failures in a row: [`BACKOFF_BASE`], doubling up to [`BACKOFF_CAP`].
fn waits() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(BACKOFF_BASE)
        .with_max_delay(BACKOFF_CAP)
        .without_max_times()
        .build()
}

struct Waiting {
    key: String,
    work: Work,
    /// The [`place_bound`] of the place its instance was last woken (or submitted) at.
    bound: usize,
}

#[derive(Default)]
struct Inner {
    running: HashMap<String, AbortHandle>,
    queue: VecDeque<Waiting>,
    failed: HashMap<String, Failure>,
    /// Failed runs in a row, by key (0 after a success).
    failures: HashMap<String, u32>,
}

/// The task registry.
pub struct Tasks {
    inner: Mutex<Inner>,
    limit: usize,
    running_gauge: prometheus::IntGauge,
    queued_gauge: prometheus::IntGauge,
    woken: Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>,
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
            woken: Mutex::new(None),
        })
    }

    /// What the task of `key` is doing.
    pub fn state(&self, key: &str) -> TaskState {
        let inner = lock(&self.inner);
        if inner.running.contains_key(key) {
            return TaskState::Running;
        }
        if let Some(position) = inner.queue.iter().position(|w| w.key == key) {
            return TaskState::Queued(position + 1);
        }
        match inner.failed.get(key) {
            Some(f) => TaskState::Failed(f.error.clone()),
            None => TaskState::Idle,
        }
    }

    /// How long until `key` may retry after a failure (zero when it may now).
    pub fn retry_in(&self, key: &str) -> Duration {
        lock(&self.inner)
            .failed
            .get(key)
            .map_or(Duration::ZERO, |f| {
                f.until.saturating_duration_since(Instant::now())
            })
    }

    /// Failed runs of `key` in a row, and when its retry may run (`None`: now, or no failure).
    pub fn retry(&self, key: &str) -> (u32, Option<SystemTime>) {
        let inner = lock(&self.inner);
        let failures = inner.failures.get(key).copied().unwrap_or(0);
        let failed = inner.failed.get(key);
        let at = failed.filter(|f| f.until > Instant::now()).map(|f| f.at);
        (failures, at)
    }

    /// Starts the retries of `key` over: no backoff, no failures counted (a person asked for a
    /// retry, or the spec changed).
    pub fn start_over(&self, key: &str) {
        let mut inner = lock(&self.inner);
        if let Some(f) = inner.failed.get_mut(key) {
            (f.until, f.waits) = (Instant::now(), waits());
        }
        inner.failures.insert(key.to_string(), 0);
    }

    /// Counts `failures` for `key` unless this registry counts it already (after a restart: the
    /// count the status kept).
    pub fn resume(&self, key: &str, failures: u32) {
        lock(&self.inner)
            .failures
            .entry(key.to_string())
            .or_insert(failures);
    }

    /// The keys whose instances the reconcile loop must look at again (a cancelled task's is not
    /// sent). One receiver: a later call replaces the earlier one.
    pub fn woken(&self) -> tokio::sync::mpsc::UnboundedReceiver<String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *lock(&self.woken) = Some(tx);
        rx
    }

    /// Sends `keys` to the receiver of [`Tasks::woken`], if there is one.
    fn wake(&self, keys: impl IntoIterator<Item = String>) {
        if let Some(tx) = lock(&self.woken).as_ref() {
            for key in keys {
                let _ = tx.send(key);
            }
        }
    }

    /// Submits `work` for `key`. Returns false (and drops `work`) when the key already has a task
    /// or is still backing off. A `bounded` task waits for a slot; an unbounded one (uninstalls)
    /// starts at once.
    pub fn submit(self: &Arc<Self>, key: &str, bounded: bool, work: Work) -> bool {
        {
            let mut inner = lock(&self.inner);
            let busy = inner.running.contains_key(key) || inner.queue.iter().any(|w| w.key == key);
            let until = inner.failed.get(key).map(|f| f.until);
            if busy || until.is_some_and(|until| Instant::now() < until) {
                return false;
            }
            if bounded {
                let bound = place_bound(inner.queue.len() + 1);
                inner.queue.push_back(Waiting {
                    key: key.to_string(),
                    work,
                    bound,
                });
            } else {
                let handle = self.spawn(key.to_string(), work);
                inner.running.insert(key.to_string(), handle);
            }
        }
        self.dispatch();
        true
    }

    fn spawn(self: &Arc<Self>, key: String, work: Work) -> AbortHandle {
        let this = self.clone();
        let (handle, registration) = AbortHandle::new_pair();
        let work = Abortable::new(work, registration);
        tokio::spawn(async move {
            // Cancelled: `cancel` already forgot it (and the key may run a new task now).
            let Ok(result) = work.await else { return };
            {
                let mut inner = lock(&this.inner);
                inner.running.remove(&key);
                let failed = inner.failed.remove(&key);
                let count = inner.failures.entry(key.clone()).or_default();
                *count = if result.is_ok() { 0 } else { *count + 1 };
                if let Err(error) = result {
                    let mut waits = failed.map_or_else(waits, |f| f.waits);
                    let wait = waits.next().unwrap_or(BACKOFF_CAP);
                    let failure = Failure {
                        error,
                        until: Instant::now() + wait,
                        at: SystemTime::now() + wait,
                        waits,
                    };
                    inner.failed.insert(key.clone(), failure);
                }
            }
            this.dispatch();
            this.wake([key]);
        });
        handle
    }

    /// Starts queued tasks while slots are free, oldest first, and wakes the instances whose
    /// task started or whose place changed (also after a queued task was cancelled or forgotten).
    fn dispatch(self: &Arc<Self>) {
        let mut woken = Vec::new();
        {
            let mut inner = lock(&self.inner);
            while inner.running.len() < self.limit {
                let Some(Waiting { key, work, .. }) = inner.queue.pop_front() else {
                    break;
                };
                // Spawned under the lock: the task cannot finish (and remove itself) before
                // it is recorded as running.
                let handle = self.spawn(key.clone(), work);
                inner.running.insert(key.clone(), handle);
                woken.push(key);
            }
            // The queued whose place, as the status words it, changed since they were last woken.
            for (index, waiting) in inner.queue.iter_mut().enumerate() {
                let bound = place_bound(index + 1);
                if waiting.bound != bound {
                    waiting.bound = bound;
                    woken.push(waiting.key.clone());
                }
            }
            self.running_gauge.set(inner.running.len() as i64);
            self.queued_gauge.set(inner.queue.len() as i64);
        }
        self.wake(woken);
    }

    /// Takes `key` out of the queue and lets `also` drop more of it under the same lock, then
    /// starts what may start now. Returns whether it was queued or `also` found something.
    fn drop_task(self: &Arc<Self>, key: &str, also: impl FnOnce(&mut Inner) -> bool) -> bool {
        let found = {
            let mut inner = lock(&self.inner);
            let queued = inner.queue.len();
            inner.queue.retain(|w| w.key != key);
            let dequeued = inner.queue.len() != queued;
            also(&mut inner) || dequeued
        };
        // The tasks behind it moved up.
        self.dispatch();
        found
    }

    /// Stops the task of `key`, queued or running: a running one is dropped where it waits,
    /// which kills the processes it started. Returns whether there was one.
    pub fn cancel(self: &Arc<Self>, key: &str) -> bool {
        self.drop_task(key, |inner| {
            inner.failed.remove(key);
            inner.failures.remove(key);
            inner.running.remove(key).map(|h| h.abort()).is_some()
        })
    }

    /// Drops the task of `key` only while it waits for a slot (one that has started is left to
    /// finish). Returns whether it was queued.
    pub fn dequeue(self: &Arc<Self>, key: &str) -> bool {
        self.drop_task(key, |_| false)
    }

    /// Drops the record of `key` (the instance is gone).
    pub fn forget(self: &Arc<Self>, key: &str) {
        self.drop_task(key, |inner| {
            inner.failures.remove(key);
            inner.failed.remove(key).is_some()
        });
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
        let backoff: Vec<Duration> = waits().take(30).collect();
        assert_eq!(backoff[0], Duration::from_secs(5));
        assert_eq!(backoff[1], Duration::from_secs(10));
        assert_eq!(backoff[3], Duration::from_secs(40));
        assert_eq!(backoff[29], BACKOFF_CAP);
    }

    #[tokio::test]
    async fn a_task_that_ends_wakes_its_key_and_a_cancelled_one_does_not() {
        let tasks = registry(2);
        let mut finished = tasks.woken();
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
        // Starts wake their keys too; wait until both ends were seen.
        let mut ended = Vec::new();
        while ended.len() < 2 {
            let key = tokio::time::timeout(Duration::from_secs(5), finished.recv())
                .await
                .expect("a wake-up")
                .expect("open");
            if tasks.state(&key) != TaskState::Running && !ended.contains(&key) {
                ended.push(key);
            }
        }
        ended.sort();
        assert_eq!(ended, ["ns/failed", "ns/ok"]);
        // Whatever start the cancelled task's key was woken for is already sent.
        while finished.try_recv().is_ok() {}
        until(&tasks, "ns/cancelled", TaskState::Running).await;
        while finished.try_recv().is_ok() {}
        assert!(tasks.cancel("ns/cancelled"));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), finished.recv())
                .await
                .is_err(),
            "a cancelled task wakes nothing"
        );
    }

    /// What `woken` has sent so far, sorted.
    fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Vec<String> {
        let mut keys = Vec::new();
        while let Ok(key) = rx.try_recv() {
            keys.push(key);
        }
        keys.sort();
        keys
    }

    #[tokio::test]
    async fn the_queue_wakes_a_start_an_end_and_a_changed_place_and_nothing_else() {
        let tasks = registry(1);
        let mut woken = tasks.woken();
        let mut releases = Vec::new();
        let mut held = |tasks: &Arc<Tasks>, key: &str| {
            let (release, wait) = tokio::sync::oneshot::channel::<()>();
            releases.push(release);
            assert!(tasks.submit(
                key,
                true,
                async move { wait.await.map_err(|e| TaskError::from(e.to_string())) }.boxed()
            ));
        };
        held(&tasks, "ns/a");
        assert_eq!(drain(&mut woken), ["ns/a"], "a task that starts at once");
        let queued: Vec<String> = (1..=10).map(|i| format!("ns/q{i:02}")).collect();
        for key in &queued {
            held(&tasks, key);
        }
        assert_eq!(tasks.state("ns/q10"), TaskState::Queued(10));
        assert!(drain(&mut woken).is_empty(), "queueing moves no one");
        // `a` ends: q01 starts; q02..q09 move to places the status words differently (2..8
        // exactly, and 9 of "9 to 16" becomes 8); q10 moves from 10 to 9, still "9 to 16".
        let _ = releases.remove(0).send(());
        let mut seen = tokio::time::timeout(Duration::from_secs(5), async {
            let mut seen = Vec::new();
            loop {
                let key = woken.recv().await.expect("open");
                seen.push(key.clone());
                if key == "ns/a" {
                    return seen;
                }
            }
        })
        .await
        .expect("the end of a wakes it");
        seen.sort();
        let mut want = vec!["ns/a".to_string()];
        want.extend(queued[..9].iter().cloned());
        assert_eq!(seen, want, "the end, the start of q01, and q02..q09 moved");
        assert!(
            drain(&mut woken).is_empty(),
            "the end's wake-up is the last"
        );
        assert_eq!(tasks.state("ns/q01"), TaskState::Running);
        assert_eq!(tasks.state("ns/q10"), TaskState::Queued(9));
        // Cancelling q05 (place 4) moves q06..q10 up one: q06..q09 change their words (5..8
        // become 4..7) and q10 goes from "9 to 16" to 8; q02..q04 stay.
        assert!(tasks.cancel("ns/q05"));
        assert_eq!(
            drain(&mut woken),
            ["ns/q06", "ns/q07", "ns/q08", "ns/q09", "ns/q10"]
        );
        // Forgetting q02 (place 1) moves everyone behind it.
        tasks.forget("ns/q02");
        assert_eq!(
            drain(&mut woken),
            [
                "ns/q03", "ns/q04", "ns/q06", "ns/q07", "ns/q08", "ns/q09", "ns/q10"
            ]
        );
        assert!(tasks.cancel("ns/q10"), "the last moves no one");
        assert!(drain(&mut woken).is_empty());
    }

    #[tokio::test]
    async fn a_long_queue_wakes_each_instance_about_log_n_times() {
        // 1,000 queued: every instance is woken for its start and for each change of its
        // place's words (8 exact places and a range per power of two): O(n log n), where a
        // poll of every queued instance at each move of the queue was O(n²).
        let n = 1000;
        let tasks = registry(1);
        let mut woken = tasks.woken();
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        assert!(tasks.submit(
            "ns/first",
            true,
            async move { wait.await.map_err(|e| TaskError::from(e.to_string())) }.boxed()
        ));
        for i in 0..n {
            assert!(tasks.submit(&format!("ns/{i}"), true, async { Ok(()) }.boxed()));
        }
        let _ = release.send(());
        until(&tasks, &format!("ns/{}", n - 1), TaskState::Idle).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let wakes = drain(&mut woken).len();
        // Per instance at most: start + end + 7 exact places + 7 ranges (see queue_place).
        assert!(
            wakes <= (n + 1) * (2 + 14),
            "{wakes} wake-ups for {n} queued"
        );
        assert!(
            wakes >= 2 * n,
            "{wakes} wake-ups: every start and end is one"
        );
        let polled = n * (n + 1) / 2;
        assert!(
            wakes * 20 < polled,
            "{wakes} wake-ups against {polled} looks had each queued instance been looked at per move"
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
                    Err("boom".to_string().into())
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
        until(&tasks, "ns/c", TaskState::Failed("boom".to_string().into())).await;
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
        let (failures, at) = tasks.retry("ns/c");
        assert_eq!(failures, 1);
        let wait = at.expect("a retry time").duration_since(SystemTime::now());
        assert!(wait.clone().expect("later") <= BACKOFF_BASE, "{wait:?}");
        tasks.resume("ns/c", 4);
        assert_eq!(
            tasks.retry("ns/c").0,
            1,
            "a count kept here wins over the status's"
        );
        tasks.start_over("ns/c");
        assert_eq!(tasks.retry("ns/c"), (0, None));
        assert!(
            tasks.submit("ns/c", true, async { Ok(()) }.boxed()),
            "a retry request skips the backoff"
        );
        until(&tasks, "ns/c", TaskState::Idle).await;
        tasks.resume("ns/new", 3);
        assert_eq!(
            tasks.retry("ns/new"),
            (3, None),
            "after a restart: the status's count"
        );
        tasks.forget("ns/new");
        assert_eq!(tasks.retry("ns/new"), (0, None));
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
    async fn dequeue_drops_only_a_task_that_has_not_started() {
        let tasks = registry(1);
        let (_hold, wait) = tokio::sync::oneshot::channel::<()>();
        let held = async move { wait.await.map_err(|e| TaskError::from(e.to_string())) };
        assert!(tasks.submit("ns/a", true, held.boxed()));
        assert!(tasks.submit("ns/b", true, async { Ok(()) }.boxed()));
        assert_eq!(tasks.state("ns/b"), TaskState::Queued(1));
        assert!(!tasks.dequeue("ns/a"), "a running task is left to finish");
        assert_eq!(tasks.state("ns/a"), TaskState::Running);
        assert!(tasks.dequeue("ns/b"));
        assert_eq!(tasks.state("ns/b"), TaskState::Idle);
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
