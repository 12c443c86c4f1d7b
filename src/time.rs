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

/// A clock by id, in seconds; `None` when it cannot be read.
fn clock(id: libc::clockid_t) -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill. (The standard library reads no clock by id.)
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9)
}

/// How long the machine has been asleep (suspended, or hibernated and resumed) since it
/// booted, in seconds: the boot clock counts that time, the monotonic clock does not. 0 when
/// either cannot be read.
pub fn suspended() -> f64 {
    match (clock(libc::CLOCK_BOOTTIME), clock(libc::CLOCK_MONOTONIC)) {
        (Some(boot), Some(mono)) => (boot - mono).max(0.0),
        _ => 0.0,
    }
}

/// The monotonic clock in seconds (from an unspecified start; it stops while the machine
/// sleeps). Read with each sample's wall-clock time, it bounds how much time the sample
/// accrues when the wall clock is stepped.
pub fn monotonic() -> Option<f64> {
    clock(libc::CLOCK_MONOTONIC)
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_asleep_is_finite_and_not_negative() {
        let s = super::suspended();
        assert!(s.is_finite() && s >= 0.0, "{s}");
    }
}

/// A message that a failure repeats (an audit log that cannot be written, metadata that does
/// not answer): said the first time, then at most once every `every`, with how many times it
/// went unsaid in between.
#[derive(Debug, Default)]
pub struct Throttle {
    last: Option<std::time::Instant>,
    unsaid: u64,
}

impl Throttle {
    /// Whether to say it now: `Some(unsaid since it was last said)`, or `None` to count it.
    pub fn due(&mut self, every: std::time::Duration) -> Option<u64> {
        if self.last.is_some_and(|t| t.elapsed() < every) {
            self.unsaid += 1;
            return None;
        }
        self.last = Some(std::time::Instant::now());
        Some(std::mem::take(&mut self.unsaid))
    }

    /// The failure is over: the next one is said at once. Returns whether it had been said.
    pub fn clear(&mut self) -> bool {
        self.unsaid = 0;
        self.last.take().is_some()
    }
}

#[cfg(test)]
mod throttle_tests {
    use super::Throttle;
    use std::time::Duration;

    #[test]
    fn said_once_then_counted_until_its_interval_passes() {
        let mut t = Throttle::default();
        assert_eq!(t.due(Duration::from_secs(60)), Some(0));
        assert_eq!(t.due(Duration::from_secs(60)), None);
        assert_eq!(t.due(Duration::from_secs(60)), None);
        // Once the interval is over, said with the count of those unsaid.
        assert_eq!(t.due(Duration::ZERO), Some(2));
        assert!(t.clear());
        assert!(!t.clear());
        assert_eq!(t.due(Duration::from_secs(60)), Some(0));
    }
}
