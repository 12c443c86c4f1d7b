//! gpuwatch: an NVIDIA GPU exporter for Prometheus that also watches what the node costs.
//!
//! See ARCHITECTURE.md for the map of this crate.

mod actions;
mod app;
pub mod cli;
mod client;
pub mod cloud;
mod cmd;
pub mod config;
pub mod controller;
mod crypto;
mod exec;
pub mod exposition;
pub use gpuwatch_core::cost;
mod files;
pub mod gpu;
pub use gpuwatch_core::health;
mod http;
mod kubernetes;
pub mod logging;
pub mod metrics;
mod notify;
pub mod process_memory;
mod redact;
mod snapshot_table;
pub use gpuwatch_core::rules;
pub mod simulate;
pub mod slurm;
pub mod spend;
pub mod state;
mod status;
mod systemd;
pub use gpuwatch_core::step;
pub mod time;
mod vetoes;
mod watch;
