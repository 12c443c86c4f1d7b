//! gpuwatch: an NVIDIA GPU exporter for Prometheus that also watches what the node costs.
//!
//! See ARCHITECTURE.md for the map of this crate.

pub mod app;
pub mod config;
pub mod gpu;
pub mod metrics;
pub mod report;
pub mod server;
