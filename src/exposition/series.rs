//! The device families that are not one reading per device: identity, per-reason, per-XID
//! and per-process series. Each is a row of the table (`Row::Series`) at its place.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use super::{GpuView, Scrape};
use crate::metrics::encode::*;
use crate::metrics::Text;

fn labels<'a>(g: &GpuView<'a>) -> GpuLabels<'a, NoLabels> {
    g.labels_with(NO_LABELS)
}

fn with<'a, X>(g: &GpuView<'a>, extra: X) -> GpuLabels<'a, X> {
    g.labels_with(extra)
}

pub(super) fn info(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc("gpu_info", "GPU identity; value 1", None),
        // A lost GPU keeps its identity, as far as it was ever read.
        s.unshared
            .iter()
            .filter(|g| g.up || g.name.is_some() || g.pci_bus_id.is_some())
            .map(|g| {
                let extra = [
                    ("name", Text(g.name.as_deref().unwrap_or(""))),
                    ("pci_bus_id", Text(g.pci_bus_id.as_deref().unwrap_or(""))),
                    ("vendor", Text(g.vendor.as_str())),
                ];
                (with(g, extra), 1i64)
            }),
    )
}

pub(super) fn up(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpu_up",
            "1 when the GPU answers (NVML, or the amdgpu driver's files), 0 when it is lost",
            None,
        ),
        s.unshared.iter().map(|g| (labels(g), i64::from(g.up))),
    )
}

pub(super) fn throttle(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpu_clock_throttle_active",
            "1 while the reason is holding clocks down; one series per reason the GPU supports",
            None,
        ),
        s.gpus.iter().filter(|g| g.up).flat_map(|g| {
            g.throttle_reasons
                .iter()
                .map(move |t| (with(g, [("reason", t.reason)]), i64::from(t.active)))
        }),
    )
}

pub(super) fn gpm_supported(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpu_gpm_supported",
            "1 when the GPU supports GPM profiling metrics (Hopper and later), else 0",
            None,
        ),
        s.unshared
            .iter()
            .filter(|g| g.up)
            .filter_map(|g| g.gpm_supported.map(|v| (labels(g), i64::from(v)))),
    )
}

/// XID counts stay visible for lost GPUs: an XID is often what explains the loss, and a
/// counter that vanished and came back would read as a reset.
pub(super) fn xid_errors(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    counters(
        e,
        desc(
            "gpu_xid_errors",
            "Critical XID errors seen since gpuwatch started, by XID code",
            None,
        ),
        s.gpus.iter().flat_map(|g| {
            g.xid_errors
                .iter()
                .map(move |(xid, n)| (with(g, [("xid", *xid)]), *n))
        }),
    )
}

pub(super) fn process_memory(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpu_process_memory_used",
            "Device memory used by one compute process",
            Some("bytes"),
        ),
        s.unshared.iter().filter(|g| g.up).flat_map(|g| {
            g.process_memory.iter().flatten().filter_map(move |p| {
                // With process owners, the process's user where it is known.
                let user: Vec<(&str, Text)> = s
                    .owners
                    .and_then(|o| o.get(&p.pid))
                    .map(|u| ("user", Text(u)))
                    .into_iter()
                    .collect();
                let extra = (
                    [("pid", p.pid)],
                    ([("process", Text(p.name.as_deref().unwrap_or("")))], user),
                );
                p.used_memory_bytes.map(|b| (with(g, extra), b as i64))
            })
        }),
    )
}

/// The readings each GPU does not support, as NVML said once: 1 per reading, so that an absent
/// series reads as "not supported" rather than "broken".
pub(super) fn unsupported(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpu_reading_unsupported",
            "1 for each reading the GPU does not support (NVML said so once; it is not asked again)",
            None,
        ),
        s.unshared.iter().filter(|g| g.up).flat_map(|g| {
            g.unsupported
                .iter()
                .map(move |r| (with(g, [("reading", *r)]), 1i64))
        }),
    )
}

pub(super) fn health(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpu_health",
            "1 for the GPU's health state (healthy, degraded or unhealthy), 0 for the rest; absent while unknown",
            None,
        ),
        s.unshared.iter().flat_map(|g| {
            g.health.iter().flat_map(move |h| {
                crate::health::State::ALL
                    .into_iter()
                    .map(move |state| (with(g, [("state", state.as_str())]), i64::from(h.state == state)))
            })
        }),
    )?;
    gauges(
        e,
        desc(
            "gpu_health_problem",
            "1 for each problem the GPU has now (the status page and /api/v1/health say it in words)",
            None,
        ),
        s.unshared.iter().flat_map(|g| {
            g.health.iter().flat_map(move |h| {
                h.problems
                    .iter()
                    .map(move |f| (with(g, [("problem", Text(&f.label))]), 1i64))
            })
        }),
    )
}
