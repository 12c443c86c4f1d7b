//! gpuwatch: an NVIDIA GPU exporter for Prometheus that also watches what the node costs.
//!
//! See ARCHITECTURE.md for the map of this crate.

pub mod actions;
pub mod app;
pub mod cli;
pub mod cloud;
pub mod cloudwatch;
pub mod cmd;
pub mod config;
pub mod crypto;
pub mod exec;
pub mod exposition;
pub use gpuwatch_core::cost;
pub mod files;
pub mod gpu;
pub mod http;
pub mod kubernetes;
pub mod metrics;
pub mod notify;
pub mod process_memory;
pub mod redact;
pub mod report;
pub use gpuwatch_core::rules;
pub mod simulate;
pub mod spend;
pub mod state;
pub mod status;
pub mod systemd;
pub use gpuwatch_core::step;
pub mod time;
pub mod vetoes;
pub mod watch;
