//! The pure core of gpuwatch: what its rules say and how they are judged, what the node is and
//! what it costs, which EC2 calls an action means, and the one `step` that the daemon and
//! `gpuwatch simulate` both run.
//!
//! Nothing in this crate does I/O or reads a clock: time arrives as Unix seconds, and the world
//! as values. Its dependencies (serde, humantime) cannot do I/O, and `clippy.toml` here forbids
//! the standard library's files, sockets, processes, environment and clocks, so the build (with
//! `clippy -D warnings`) holds the invariant.

pub mod cost;
pub mod health;
pub mod node;
pub mod plan;
pub mod rules;
pub mod step;
pub mod time;

/// For `skip_serializing_if`: a time or an amount of 0 is left out of the state file, which
/// stays as it was for state that never had one.
pub(crate) fn is_zero(t: &f64) -> bool {
    *t == 0.0
}
