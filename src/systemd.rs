//! systemd's notify protocol: `READY=1` once the listener is bound and the first sample is
//! taken, `STATUS=` lines with the GPUs, NVML and pending actions, `STOPPING=1` at shutdown, and
//! `WATCHDOG=1` only while the daemon makes progress (`progress::Stall`, the test `/-/healthy`
//! answers by too), so that systemd restarts a wedged one.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) every call here does nothing.

use std::time::Duration;

use sd_notify::NotifyState;

use crate::gpu::sampler::Snapshots;
use crate::gpu::Snapshot;

/// Whether systemd listens: `NOTIFY_SOCKET` is set.
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty())
}

pub(crate) fn send(states: &[NotifyState]) {
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
pub(crate) fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.parse::<u32>().ok() != Some(std::process::id()) => None,
        _ => (usec > 0).then(|| Duration::from_micros(usec)),
    }
}
