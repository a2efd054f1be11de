//! Leader election on a `coordination.k8s.io` Lease, written here against kube 5 (no second kube
//! in the tree), with client-go's guarantees: a lease is judged expired by the time *this*
//! replica last saw its record change (never by comparing the holder's `renewTime` with the
//! local clock), every lease call is bounded by the renew deadline, and the holder gives up at
//! the renew deadline, which is shorter than the lease: it has stopped before anyone else may
//! take over.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

use crate::lock;

/// Lease settings: the flags, and the Lease and identity the binary fills in.
#[derive(Clone, Debug, clap::Args)]
pub struct Election {
    /// The Lease's namespace.
    #[arg(skip)]
    pub namespace: String,
    /// The Lease's name.
    #[arg(skip = common::names::LEADER_LEASE.to_string())]
    pub name: String,
    /// This replica's identity.
    #[arg(skip)]
    pub identity: String,

    /// How long the leader Lease lasts without renewal; another replica takes over after it.
    #[arg(long, default_value = "15s", value_parser = common::duration::parse)]
    pub leader_lease_duration: Duration,

    /// How often the leader renews its Lease (well inside --leader-renew-deadline).
    #[arg(long, default_value = "4s", value_parser = common::duration::parse)]
    pub leader_renew_interval: Duration,

    /// How long the leader keeps failing to renew (each Lease call is cut off at it) before it
    /// stops all work and exits; shorter than --leader-lease-duration, so that it has stopped
    /// before another replica may take over.
    #[arg(long, default_value = "10s", value_parser = common::duration::parse)]
    pub leader_renew_deadline: Duration,
}

/// Why this replica stopped leading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::Display)]
pub enum Lost {
    /// No renewal succeeded within the renew deadline (the API server did not answer in time).
    #[strum(to_string = "the lease could not be renewed within the renew deadline")]
    Deadline,
    /// Another replica holds the lease.
    #[strum(to_string = "another replica holds the lease")]
    Taken,
}

/// The lease record as this replica last saw it, and when it first saw that record (its own
/// monotonic clock).
#[derive(Clone, Debug, Default)]
pub struct Observed(Option<(LeaseSpec, Instant)>);

impl Observed {
    /// Notes that `record` was read at `now`; returns when this record was first seen.
    pub fn see(&mut self, record: &LeaseSpec, now: Instant) -> Instant {
        match &self.0 {
            Some((seen, since)) if seen == record => *since,
            _ => self.0.insert((record.clone(), now)).1,
        }
    }
}

/// Whether `lease`, whose record has not changed since `unchanged_since` (local clock), may be
/// taken by `identity` at `now`: when free, ours, or unchanged for a whole lease duration.
pub fn can_take(lease: &LeaseSpec, identity: &str, unchanged_since: Instant, now: Instant) -> bool {
    let holder = lease.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return true;
    }
    let seconds = lease.lease_duration_seconds.unwrap_or(15).max(1);
    now >= unchanged_since + Duration::from_secs(seconds.unsigned_abs().into())
}

impl Election {
    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.leader_lease_duration.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to hold the lease; `Ok(true)` while this replica holds it. `observed` keeps
    /// what this replica saw of the lease between attempts.
    pub async fn try_hold(
        &self,
        client: &kube::Client,
        observed: &mut Observed,
    ) -> Result<bool, kube::Error> {
        let api: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
        let now = Timestamp::now();
        let written = match api.get_opt(&self.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(now, None, 0)),
                };
                api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                let seen = Instant::now();
                let since = observed.see(&spec, seen);
                if !can_take(&spec, &self.identity, since, seen) {
                    return Ok(false);
                }
                let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
                let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
                lease.spec = Some(self.spec(
                    now,
                    if ours { spec.acquire_time } else { None },
                    transitions,
                ));
                // The update carries the resourceVersion read: a racing replica gets a conflict.
                api.replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        // A conflict: another replica wrote the lease first.
        match written {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the lease; returns when the winning attempt was sent
    /// (the start of the first term, for [`Election::hold`]).
    pub async fn acquire(&self, client: &kube::Client) -> Instant {
        let mut observed = Observed::default();
        loop {
            let sent = Instant::now();
            let attempt = self.try_hold(client, &mut observed);
            match tokio::time::timeout_at(sent + self.leader_renew_deadline, attempt).await {
                Ok(Ok(true)) => return sent,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election failed; retrying"),
                Err(_) => tracing::warn!("a leader election call timed out; retrying"),
            }
            tokio::time::sleep(self.leader_renew_interval).await;
        }
    }

    /// Renews until the lease is lost, and says why: another replica took it, or no renewal
    /// succeeded within the renew deadline of the last successful one sent (`renewed`, at first
    /// what [`Election::acquire`] returned). Returns at that deadline at the latest, even when a
    /// call hangs; should this task not run by then (a stalled runtime), `fence` runs at that
    /// deadline on a thread of its own.
    pub async fn hold(
        &self,
        client: &kube::Client,
        mut renewed: Instant,
        fence: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Lost> {
        let watchdog = Watchdog::start((renewed + self.leader_renew_deadline).into_std(), fence)?;
        let mut observed = Observed::default();
        loop {
            let give_up = renewed + self.leader_renew_deadline;
            tokio::time::sleep_until((Instant::now() + self.leader_renew_interval).min(give_up))
                .await;
            let sent = Instant::now();
            if sent >= give_up {
                return Ok(Lost::Deadline);
            }
            // A call that hangs is abandoned at the deadline.
            match tokio::time::timeout_at(give_up, self.try_hold(client, &mut observed)).await {
                Ok(Ok(true)) => {
                    renewed = sent;
                    watchdog.feed((sent + self.leader_renew_deadline).into_std());
                }
                Ok(Ok(false)) => return Ok(Lost::Taken),
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing the lease failed"),
                Err(_) => return Ok(Lost::Deadline),
            }
        }
    }
}

/// A deadline kept on an OS thread of its own: unless fed a later one in time, it runs its
/// fence at the deadline, whether or not the async runtime is free.
#[derive(Debug)]
pub struct Watchdog(Arc<Mutex<std::time::Instant>>);

impl Watchdog {
    /// Starts the thread that runs `fence` at `deadline` (or at a later one fed meanwhile).
    pub fn start(
        deadline: std::time::Instant,
        fence: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Mutex::new(deadline));
        let deadline = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("leader-watchdog".into())
            .spawn(move || {
                // Ends quietly once the watchdog is dropped (the lease was given up in time).
                while let Some(at) = deadline.upgrade().map(|d| *lock(&d)) {
                    let now = std::time::Instant::now();
                    if now >= at {
                        return fence();
                    }
                    std::thread::sleep((at - now).min(Duration::from_millis(500)));
                }
            })?;
        Ok(Self(shared))
    }

    /// Moves the deadline to `deadline`.
    pub fn feed(&self, deadline: std::time::Instant) {
        *lock(&self.0) = deadline;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).expect("time"))),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_taken_only_when_free_ours_or_unchanged_for_its_duration() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert!(can_take(&LeaseSpec::default(), "a", start, start));
        assert!(can_take(&lease("a", 999), "a", start, start));
        // The holder's renewTime says nothing about expiry: a clock running behind (renewTime
        // in the distant past) is not an expired lease while the record keeps changing.
        let mut observed = Observed::default();
        let since = observed.see(&lease("b", 0), at(0));
        assert!(!can_take(&lease("b", 0), "a", since, at(0)), "just seen");
        let since = observed.see(&lease("b", 1), at(10));
        assert_eq!(since, at(10), "a renewal restarts the clock");
        assert!(!can_take(&lease("b", 1), "a", since, at(24)));
        let since = observed.see(&lease("b", 1), at(25));
        assert_eq!(
            since,
            at(10),
            "an unchanged record keeps its first sighting"
        );
        assert!(
            can_take(&lease("b", 1), "a", since, at(25)),
            "unchanged for 15 s: expired"
        );
        // Nor is a renewTime in the future (a clock running ahead) a live lease for ever.
        let mut observed = Observed::default();
        let ahead = lease("b", i64::from(i32::MAX));
        let since = observed.see(&ahead, at(0));
        assert!(can_take(&ahead, "a", since, at(15)));
    }

    /// A holder whose API server stops answering (every call hangs, as through a stalled
    /// connection, with the client's minutes-long defaults) gives up at the renew deadline.
    #[tokio::test]
    async fn a_hanging_api_server_loses_the_lease_at_the_renew_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        // Accepts connections and never answers.
        let hold_open = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let config = kube::Config::new(url.parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let election = Election {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "a".into(),
            leader_lease_duration: Duration::from_secs(3),
            leader_renew_deadline: Duration::from_secs(2),
            leader_renew_interval: Duration::from_millis(200),
        };
        let renewed = Instant::now();
        let lost = tokio::time::timeout(
            Duration::from_secs(30),
            election.hold(&client, renewed, || {}),
        )
        .await
        .expect("hold returns although every call hangs")
        .expect("watchdog");
        assert_eq!(lost, Lost::Deadline);
        assert!(renewed.elapsed() >= election.leader_renew_deadline);
        hold_open.abort();
    }

    #[test]
    fn the_watchdog_fences_at_its_last_deadline_while_the_runtime_is_blocked() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let (fenced, rx) = std::sync::mpsc::channel();
        let start = std::time::Instant::now();
        runtime.block_on(async {
            let fence = move || fenced.send(start.elapsed()).expect("send");
            let watchdog =
                Watchdog::start(start + Duration::from_millis(300), fence).expect("start");
            watchdog.feed(start + Duration::from_millis(700));
            // The runtime's only thread is stuck (a blocking call) well past the deadline.
            std::thread::sleep(Duration::from_millis(1500));
            let at = rx.try_recv().expect("fenced while the runtime was blocked");
            assert!(
                at >= Duration::from_millis(700),
                "not before the fed deadline: {at:?}"
            );
            assert!(at < Duration::from_millis(1300), "at the deadline: {at:?}");
        });
    }

    #[test]
    fn a_dropped_watchdog_never_fences() {
        let (fenced, rx) = std::sync::mpsc::channel();
        let deadline = std::time::Instant::now() + Duration::from_millis(200);
        drop(Watchdog::start(deadline, move || fenced.send(()).expect("send")).expect("start"));
        std::thread::sleep(Duration::from_millis(900));
        assert!(rx.try_recv().is_err());
    }
}
