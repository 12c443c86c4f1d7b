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
