//! Whether the daemon makes progress: the one stall test that both systemd's watchdog and
//! `/-/healthy` answer by.
//!
//! Progress means both:
//! - the sampler publishes new samples (a cycle stuck in the driver publishes none, and the
//!   abandoned call must return before sampling resumes: a restart is the remedy);
//! - the decision loop finishes each sample within half the test's window of its arrival, or is
//!   inside an action whose own time limit has not passed (a cloud call retries for
//!   `actions.retry_for`, an `exec` runs for up to `actions.exec_timeout`; neither is a wedge).
//!
//! `monitor` applies it on a timer: over `server.stall_timeout` for `/-/healthy` (which a
//! Kubernetes liveness probe asks), and over `WatchdogSec` for systemd's pings. It is a
//! liveness test only: a sick or lost GPU, or NVML down, is no stall.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

use crate::gpu::sampler::Snapshots;

/// How far the decision loop has come, as the stall test reads it.
#[derive(Debug)]
pub struct Progress {
    base: Instant,
    /// The seq of the last sample the decision loop is done with.
    stepped: AtomicU64,
    /// While an action runs: when its own time limit ends it (milliseconds since `base`).
    acting_until: AtomicU64,
    /// Woken at each step, for readers who await it.
    notify: tokio::sync::Notify,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            base: Instant::now(),
            stepped: AtomicU64::new(0),
            acting_until: AtomicU64::new(0),
            notify: tokio::sync::Notify::new(),
        }
    }
}

impl Progress {
    /// The decision loop is done with the sample `seq`.
    pub fn stepped(&self, seq: u64) {
        self.stepped.fetch_max(seq, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Waits until the decision loop is done with sample `seq`, for at most `limit`.
    pub async fn await_stepped(&self, seq: u64, limit: Duration) {
        let wait = async {
            loop {
                let notified = self.notify.notified();
                if self.stepped.load(Ordering::Acquire) >= seq {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }

    /// An action starts that ends on its own within `limit`; `Acting` marks its end when
    /// dropped, leaving `grace` for the rest of the step (saving the action's record).
    pub fn acting(&self, limit: Duration, grace: Duration) -> Acting<'_> {
        self.act_until(Instant::now() + limit);
        Acting {
            progress: self,
            grace,
        }
    }

    fn act_until(&self, until: Instant) {
        let until = until.saturating_duration_since(self.base);
        self.acting_until
            .store(until.as_millis() as u64 + 1, Ordering::Release);
    }

    fn acting_now(&self) -> bool {
        let until = self.acting_until.load(Ordering::Acquire);
        until != 0 && (self.base.elapsed().as_millis() as u64) < until
    }
}

/// An action in progress; see [`Progress::acting`].
pub struct Acting<'a> {
    progress: &'a Progress,
    grace: Duration,
}

impl Drop for Acting<'_> {
    fn drop(&mut self) {
        self.progress.act_until(Instant::now() + self.grace);
    }
}

/// How long after an action the decision loop may still be finishing its step (saving the
/// action's record durably).
pub const ACTED_GRACE: Duration = Duration::from_secs(10);

/// What a stall test found at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The sampler published a new sample within the window.
    pub sampling: bool,
    /// The decision loop is done with every sample older than half the window, or is acting.
    pub deciding: bool,
}

impl Verdict {
    pub fn ok(self) -> bool {
        self.sampling && self.deciding
    }
}

/// The stall test over a window of `limit`, fed the latest sample's seq at each tick.
#[derive(Debug)]
pub struct Stall {
    limit: Duration,
    last_seq: u64,
    last_change: Instant,
    /// The latest seq at each recent tick: the decision loop must be done with those half a
    /// window old.
    seen: VecDeque<(Instant, u64)>,
    /// The newest seq seen at least half a window ago.
    due: u64,
}

impl Stall {
    /// A test that starts counting at `now` (the first sample must come within `limit`).
    pub fn new(limit: Duration, now: Instant) -> Stall {
        Stall {
            limit,
            last_seq: 0,
            last_change: now,
            seen: VecDeque::new(),
            due: 0,
        }
    }

    /// Applies the test at `now`, with the latest sample's `seq` and the decision loop's
    /// progress (`None` without a cost watch).
    pub fn observe(&mut self, now: Instant, seq: u64, progress: Option<&Progress>) -> Verdict {
        if seq != self.last_seq {
            self.last_seq = seq;
            self.last_change = now;
        }
        self.seen.push_back((now, seq));
        while let Some(&(at, seq)) = self.seen.front() {
            if now.duration_since(at) < self.limit / 2 {
                break;
            }
            self.due = seq;
            self.seen.pop_front();
        }
        Verdict {
            sampling: now.duration_since(self.last_change) < self.limit,
            deciding: progress
                .is_none_or(|p| p.stepped.load(Ordering::Acquire) >= self.due || p.acting_now()),
        }
    }
}

/// The latest verdict over `server.stall_timeout`, for `/-/healthy`.
#[derive(Debug, Default)]
pub struct Liveness {
    /// 0: making progress; 1: no new sample; 2: the decision loop is behind.
    state: AtomicU8,
}

impl Liveness {
    fn set(&self, v: Verdict) {
        let state = match (v.sampling, v.deciding) {
            (false, _) => 1,
            (true, false) => 2,
            (true, true) => 0,
        };
        self.state.store(state, Ordering::Release);
    }

    /// `None` while the daemon makes progress; else what has stalled, in words.
    pub fn stalled(&self) -> Option<&'static str> {
        match self.state.load(Ordering::Acquire) {
            0 => None,
            1 => Some("the sampler has published no sample"),
            _ => Some("the decision loop has fallen behind the samples"),
        }
    }
}

/// What the stall tests watch: the sampler's samples, the decision loop's progress (when there
/// is a cost watch), and the number of pending actions for systemd's status line.
pub struct Watched {
    pub snapshots: Snapshots,
    pub progress: Option<Arc<Progress>>,
    pub pending: Box<dyn Fn() -> usize + Send + Sync>,
}

/// Applies the stall test on a timer until cancelled: over `stall_timeout` into `liveness`,
/// and under systemd over `WatchdogSec` for the pings (`WATCHDOG=1` only while it passes),
/// keeping the `STATUS=` line current.
pub async fn monitor(
    watched: Watched,
    liveness: Arc<Liveness>,
    stall_timeout: Duration,
    interval: Duration,
    timeout: Duration,
) {
    let systemd = crate::systemd::enabled();
    let watchdog = crate::systemd::watchdog_period().filter(|_| systemd);
    if let Some(period) = watchdog {
        if period < interval + timeout {
            tracing::warn!(
                ?period,
                ?interval,
                ?timeout,
                "WatchdogSec is shorter than sampling.interval plus sampling.timeout; systemd may restart a healthy gpuwatch"
            );
        }
    }
    // Without a watchdog the status line is still kept current, every 10 s.
    let tick = watchdog
        .unwrap_or(Duration::from_secs(10))
        .min(stall_timeout)
        / 4;
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    let mut health = Stall::new(stall_timeout, start);
    let mut dog = watchdog.map(|period| Stall::new(period, start));
    let mut last_status = String::new();
    let mut was_stalled = false;
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let snap = watched.snapshots.latest();
        let progress = watched.progress.as_deref();
        let verdict = health.observe(now, snap.seq, progress);
        liveness.set(verdict);
        if verdict.ok() == was_stalled {
            was_stalled = !verdict.ok();
            match liveness.stalled() {
                Some(what) => tracing::warn!(
                    ?stall_timeout,
                    "{what} within server.stall_timeout: /-/healthy answers 503"
                ),
                None => tracing::info!("progress again: /-/healthy answers 200"),
            }
        }
        if !systemd {
            continue;
        }
        let status = crate::systemd::status_line(&snap, (watched.pending)());
        let mut states = Vec::new();
        if status != last_status {
            states.push(NotifyState::Status(&status));
        }
        if let Some(dog) = &mut dog {
            let v = dog.observe(now, snap.seq, progress);
            if v.ok() {
                states.push(NotifyState::Watchdog);
            } else {
                tracing::warn!(
                    sampling = v.sampling,
                    deciding = v.deciding,
                    "no watchdog ping: gpuwatch is not making progress"
                );
            }
        }
        if !states.is_empty() {
            crate::systemd::send(&states);
        }
        last_status.clone_from(&status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_test_by_tick() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let progress = Progress::default();
        let mut stall = Stall::new(Duration::from_secs(120), t0);
        // Samples come and are decided on.
        for (at, seq) in [(0, 1), (30, 31), (60, 61), (90, 91)] {
            progress.stepped(seq);
            assert!(stall.observe(s(at), seq, Some(&progress)).ok(), "{at}");
        }
        // The decision loop stops at 91 while samples go on: behind once 91's successors are
        // half a window old.
        assert!(stall.observe(s(120), 121, Some(&progress)).ok());
        assert!(stall.observe(s(150), 151, Some(&progress)).ok());
        let v = stall.observe(s(180), 181, Some(&progress));
        assert_eq!(
            v,
            Verdict {
                sampling: true,
                deciding: false
            }
        );
        // An action within its own limit is progress.
        let acting = progress.acting(Duration::from_secs(600), Duration::from_secs(10));
        assert!(stall.observe(s(181), 182, Some(&progress)).deciding);
        drop(acting);
        // It catches up.
        progress.stepped(182);
        assert!(stall.observe(s(210), 182, Some(&progress)).ok());
        // No new sample for the window: the sampler is stalled, whatever the decisions.
        assert!(stall.observe(s(300), 182, Some(&progress)).ok());
        let v = stall.observe(s(330), 182, Some(&progress));
        assert!(!v.sampling && v.deciding, "{v:?}");
        // Without a cost watch only the samples count.
        let mut alone = Stall::new(Duration::from_secs(120), t0);
        assert!(alone.observe(s(100), 0, None).ok());
        assert!(!alone.observe(s(121), 0, None).ok());
    }

    #[test]
    fn liveness_says_what_stalled() {
        let l = Liveness::default();
        assert_eq!(l.stalled(), None);
        l.set(Verdict {
            sampling: false,
            deciding: true,
        });
        assert!(l.stalled().unwrap().contains("no sample"));
        l.set(Verdict {
            sampling: true,
            deciding: false,
        });
        assert!(l.stalled().unwrap().contains("decision loop"));
        l.set(Verdict {
            sampling: true,
            deciding: true,
        });
        assert_eq!(l.stalled(), None);
    }
}
