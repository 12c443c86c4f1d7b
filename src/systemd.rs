//! systemd's notify protocol: `READY=1` once the listener is bound and the first sample is
//! taken, `STATUS=` lines with the GPUs, NVML and pending actions, `STOPPING=1` at shutdown, and
//! `WATCHDOG=1` only while the daemon makes progress, so that systemd restarts a wedged one.
//!
//! Progress means both:
//! - the sampler publishes new samples (a cycle stuck in the driver publishes none);
//! - the decision loop finishes each sample within a watchdog period of its arrival, or is inside
//!   an action whose own time limit has not passed (an EC2 stop retries for `actions.retry_for`,
//!   an `exec` runs for up to `actions.exec_timeout`; neither is a wedge).
//!
//! A sampling cycle stuck in the driver publishes no sample, and the abandoned call must return
//! before sampling resumes: a restart is the remedy, so the pings stop then too.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) every call here does nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

use crate::gpu::sampler::Snapshots;
use crate::gpu::Snapshot;

/// How far the decision loop has come, as the watchdog reads it.
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

/// Whether systemd listens: `NOTIFY_SOCKET` is set.
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty())
}

fn send(states: &[NotifyState]) {
    if !enabled() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "cannot notify systemd");
    }
}

/// Waits for the first sample (at most `limit`: a first cycle stuck in the driver does not
/// keep the service starting forever), then tells systemd the daemon is ready, with its status.
pub async fn ready(snapshots: &Snapshots, limit: Duration) {
    let status = match tokio::time::timeout(limit, snapshots.next_after(0)).await {
        Ok(first) => status_line(&first, 0),
        Err(_) => "the first NVML cycle has not returned".to_string(),
    };
    send(&[NotifyState::Ready, NotifyState::Status(&status)]);
}

/// Tells systemd the daemon is stopping.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// The `STATUS=` line: GPUs, NVML and pending actions.
pub fn status_line(snap: &Snapshot, pending: usize) -> String {
    let up = snap.gpus.iter().filter(|g| g.up).count();
    let nvml = if snap.nvml.up {
        format!(
            "NVML up, driver {}",
            snap.nvml.driver_version.as_deref().unwrap_or("unknown")
        )
    } else {
        "NVML down".to_string()
    };
    let actions = match pending {
        0 => "no action pending".to_string(),
        1 => "1 action pending".to_string(),
        n => format!("{n} actions pending"),
    };
    format!("{up} of {} GPUs up; {nvml}; {actions}", snap.gpus.len())
}

/// The watchdog period systemd asks for: `WATCHDOG_USEC`, when `WATCHDOG_PID` is unset or is
/// this process (as `sd_watchdog_enabled(3)` reads them).
fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.parse::<u32>().ok() != Some(std::process::id()) => None,
        _ => (usec > 0).then(|| Duration::from_micros(usec)),
    }
}

/// What the watchdog watches: the sampler's samples, the decision loop's progress (when there is
/// a cost watch), and the number of pending actions for the status line.
pub struct Watched {
    pub snapshots: Snapshots,
    pub progress: Option<Arc<Progress>>,
    pub pending: Box<dyn Fn() -> usize + Send + Sync>,
}

/// Pings the watchdog every quarter period while the daemon makes progress, and updates the
/// status line when it changes. Runs until cancelled; does nothing without a socket.
///
/// Progress: a new sample within the period, and the decision loop done with every sample that
/// came at least half a period ago (or inside an action that has not reached its own limit).
pub async fn watchdog(watched: Watched, interval: Duration, timeout: Duration) {
    if !enabled() {
        return;
    }
    let watchdog = watchdog_period();
    // Without a watchdog the status line is still kept current.
    let period = watchdog.unwrap_or(Duration::from_secs(10));
    let watchdog = watchdog.is_some();
    if watchdog && period < interval + timeout {
        tracing::warn!(
            ?period,
            ?interval,
            ?timeout,
            "WatchdogSec is shorter than sampling.interval plus sampling.timeout; systemd may restart a healthy gpuwatch"
        );
    }
    let mut ticker = tokio::time::interval(period / 4);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_seq = 0;
    let mut last_change = Instant::now();
    // The latest seq at each recent tick: the decision loop must be done with those half a
    // period old.
    let mut seen: std::collections::VecDeque<(Instant, u64)> = std::collections::VecDeque::new();
    // The newest seq seen at least half a period ago.
    let mut due = 0;
    let mut last_status = String::new();
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let snap = watched.snapshots.latest();
        if snap.seq != last_seq {
            last_seq = snap.seq;
            last_change = now;
        }
        seen.push_back((now, snap.seq));
        while let Some(&(at, seq)) = seen.front() {
            if now.duration_since(at) < period / 2 {
                break;
            }
            due = seq;
            seen.pop_front();
        }
        let sampling = now.duration_since(last_change) < period;
        let deciding = watched
            .progress
            .as_ref()
            .is_none_or(|p| p.stepped.load(Ordering::Acquire) >= due || p.acting_now());
        let status = status_line(&snap, (watched.pending)());
        let mut states = Vec::new();
        if status != last_status {
            states.push(NotifyState::Status(&status));
        }
        if watchdog && sampling && deciding {
            states.push(NotifyState::Watchdog);
        } else if watchdog {
            tracing::warn!(
                sampling,
                deciding,
                "no watchdog ping: gpuwatch is not making progress"
            );
        }
        if !states.is_empty() {
            send(&states);
        }
        last_status.clone_from(&status);
    }
}
