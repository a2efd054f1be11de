//! Leader election on a `coordination.k8s.io` Lease, written here against kube 5 (no second kube
//! in the tree): acquire when free or expired, renew well inside the lease, and report a lost
//! lease at once so the process stops working.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

/// Lease settings.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
}

/// Whether `lease` may be taken by `identity` at `now`.
pub fn can_take(lease: &LeaseSpec, identity: &str, now: Timestamp) -> bool {
    let holder = lease.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return true;
    }
    let renewed = lease
        .renew_time
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let duration = i64::from(lease.lease_duration_seconds.unwrap_or(15));
    now.as_second() > renewed.as_second() + duration
}

impl Election {
    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to hold the lease; `Ok(true)` while this replica holds it.
    pub async fn try_hold(&self, client: &kube::Client) -> Result<bool, kube::Error> {
        let api: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
        let now = Timestamp::now();
        match api.get_opt(&self.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(now, None, 0)),
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                if !can_take(&spec, &self.identity, now) {
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
                match api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self, client: &kube::Client) {
        loop {
            match self.try_hold(client).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election failed; retrying"),
            }
            tokio::time::sleep(self.renew_every).await;
        }
    }

    /// Renews until the lease is lost (or cannot be renewed before it would expire); returns then.
    pub async fn hold(&self, client: &kube::Client) {
        let mut last_ok = std::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew_every).await;
            match self.try_hold(client).await {
                Ok(true) => last_ok = std::time::Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the lease failed");
                    if last_ok.elapsed() + self.renew_every >= self.duration {
                        return;
                    }
                }
            }
        }
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
    fn a_lease_is_taken_only_when_free_ours_or_expired() {
        let now = Timestamp::from_second(1_000).expect("time");
        assert!(can_take(&LeaseSpec::default(), "a", now));
        assert!(can_take(&lease("a", 999), "a", now));
        assert!(!can_take(&lease("b", 990), "a", now), "b renewed 10 s ago");
        assert!(can_take(&lease("b", 980), "a", now), "b's lease expired");
    }
}
