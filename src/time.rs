//! Time at the edge: the one place the daemon reads the clock. Formatting and parsing are
//! the core's (`gpuwatch_core::time`), re-exported here.

use std::time::{SystemTime, UNIX_EPOCH};

pub use gpuwatch_core::time::*;

/// The current time in Unix seconds. Only the edges (the daemon's loops) call this; the core
/// is handed `now`.
#[allow(clippy::disallowed_methods)] // The one place the clock is read.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// How long the machine has been asleep (suspended, or hibernated and resumed) since it
/// booted, in seconds: the boot clock counts that time, the monotonic clock does not. 0 when
/// either cannot be read.
pub fn suspended() -> f64 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill. (The standard library reads neither clock by id.)
        let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
        (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
    };
    match (read(libc::CLOCK_BOOTTIME), read(libc::CLOCK_MONOTONIC)) {
        (Some(boot), Some(mono)) => (boot - mono).max(0.0),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_asleep_is_finite_and_not_negative() {
        let s = super::suspended();
        assert!(s.is_finite() && s >= 0.0, "{s}");
    }
}
