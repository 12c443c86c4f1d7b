//! Leader election on a `coordination.k8s.io/v1` Lease in the controller's namespace, as
//! client-go's leader election does it: the holder renews `renewTime` every third of the
//! lease's duration; another takes the Lease over only once the record has not changed for
//! `leaseDurationSeconds` by its own clock (the time it last saw the record change, never the
//! holder's `renewTime`, so clocks apart make no second leader), and every write carries the
//! `resourceVersion` read, so of two that try at once one gets 409 Conflict. A leader acts only until two thirds of the duration after the start
//! of its last successful renewal: one that cannot renew stops acting before its lease can
//! expire and another take it.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// Until when this controller may act, if it leads.
    leading_until: std::sync::Mutex<Option<Instant>>,
    /// The record last seen (holder and renewal), and when it was first seen by this clock.
    observed: std::sync::Mutex<Option<(String, Instant)>>,
}

impl Elector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Elector {
        Elector {
            api,
            name: name.into(),
            identity: identity.into(),
            duration,
            leading_until: std::sync::Mutex::new(None),
            observed: std::sync::Mutex::new(None),
        }
    }

    /// Whether this controller leads now, and may act.
    pub fn leads(&self) -> bool {
        let until = *self.leading_until.lock().unwrap_or_else(|e| e.into_inner());
        until.is_some_and(|u| Instant::now() < u)
    }

    /// How often to try: a third of the lease's duration.
    pub fn every(&self) -> Duration {
        self.duration / 3
    }

    /// Takes or renews the Lease once. Returns whether this controller leads.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let started = Instant::now();
        let now = crate::time::now();
        let renewed = self.renew(now).await;
        let mut until = self.leading_until.lock().unwrap_or_else(|e| e.into_inner());
        match renewed {
            Ok(true) => {
                *until = Some(started + self.duration * 2 / 3);
                Ok(true)
            }
            Ok(false) => {
                *until = None;
                Ok(false)
            }
            // An error leaves the time already granted, no more.
            Err(e) => Err(e),
        }
    }

    async fn renew(&self, now: f64) -> Result<bool, kube::Error> {
        let seconds = self.duration.as_secs().max(1);
        let stamp = micro_time(now);
        let current = match self.api.get_opt(&self.name).await? {
            None => {
                let lease: Lease = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": self.name},
                    "spec": {
                        "holderIdentity": self.identity,
                        "leaseDurationSeconds": seconds,
                        "acquireTime": stamp,
                        "renewTime": stamp,
                        "leaseTransitions": 0,
                    },
                }))
                .expect("a Lease");
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if super::cluster::status_code(&e) == Some(409) => Ok(false),
                    Err(e) => Err(e),
                };
            }
            Some(l) => l,
        };
        let spec = serde_json::to_value(&current.spec).unwrap_or_default();
        let holder = spec["holderIdentity"].as_str().unwrap_or("");
        let record = format!("{holder}|{}", spec["renewTime"].as_str().unwrap_or(""));
        // A Lease without a duration lasts as long as this controller's own.
        let duration = spec["leaseDurationSeconds"]
            .as_f64()
            .filter(|d| *d > 0.0)
            .map_or(self.duration, Duration::from_secs_f64);
        let transitions = spec["leaseTransitions"].as_i64().unwrap_or(0);
        let ours = holder == self.identity;
        let unchanged_for = {
            let mut observed = self.observed.lock().unwrap_or_else(|e| e.into_inner());
            match &*observed {
                Some((seen, since)) if *seen == record => since.elapsed(),
                _ => {
                    *observed = Some((record, Instant::now()));
                    Duration::ZERO
                }
            }
        };
        let expired = holder.is_empty() || unchanged_for > duration;
        if !ours && !expired {
            return Ok(false);
        }
        let mut next = serde_json::to_value(&current).unwrap_or_default();
        next["spec"]["holderIdentity"] = self.identity.clone().into();
        next["spec"]["leaseDurationSeconds"] = seconds.into();
        next["spec"]["renewTime"] = stamp.clone().into();
        if !ours {
            next["spec"]["acquireTime"] = stamp.into();
            next["spec"]["leaseTransitions"] = (transitions + 1).into();
        }
        let next: Lease = serde_json::from_value(next).expect("a Lease");
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => {
                if !ours {
                    tracing::info!(lease = %self.name, previous = %holder, "this controller now leads");
                }
                Ok(true)
            }
            Err(e) if super::cluster::status_code(&e) == Some(409) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// A Lease's MicroTime: RFC 3339 with microseconds, in UTC.
fn micro_time(t: f64) -> String {
    let whole = gpuwatch_core::time::rfc3339(t.floor());
    let micros = ((t - t.floor()) * 1e6).floor() as u32;
    format!("{}.{micros:06}Z", whole.trim_end_matches('Z'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn micro_time_is_rfc3339_with_microseconds() {
        let s = super::micro_time(1_765_000_000.25);
        assert!(s.ends_with(".250000Z"), "{s}");
        assert_eq!(
            gpuwatch_core::time::parse_rfc3339(&s).map(|t| (t * 100.0).round() / 100.0),
            Some(1_765_000_000.25)
        );
    }
}
