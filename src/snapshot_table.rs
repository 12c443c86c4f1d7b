//! `gpuwatch snapshot`: one sample as a table, like `nvidia-smi`, or as JSON.

use std::fmt::Write as _;

use crate::gpu::Snapshot;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Renders a snapshot as a fixed-width table. Unknown readings show as "-". Text NVML gives
/// (versions, names, bus ids, UUIDs) is made plain before it is cut, so that an escape sequence
/// in it neither drives the terminal nor is cut in the middle.
pub fn table(snap: &Snapshot) -> String {
    let mut out = String::new();
    let nvml = &snap.nvml;
    let _ = writeln!(
        out,
        "driver {}   NVML {}   CUDA {}",
        text(nvml.driver_version.as_deref()),
        text(nvml.nvml_version.as_deref()),
        text(nvml.cuda_driver_version.as_deref()),
    );
    let _ = writeln!(
        out,
        "{:<3} {:<24} {:<18} {:>5} {:>5} {:>15} {:>5} {:>13} {:>11} {:>5}",
        "GPU",
        "NAME",
        "BUS-ID",
        "UTIL",
        "MEM%",
        "MEMORY (GiB)",
        "TEMP",
        "POWER (W)",
        "CLOCK (MHz)",
        "PROCS"
    );
    for g in &snap.gpus {
        if !g.up {
            let _ = writeln!(
                out,
                "{:<3} {:<24} lost (uuid {})",
                g.index,
                "-",
                text(Some(&g.uuid))
            );
            continue;
        }
        let memory = match (g.memory_used_bytes, g.memory_total_bytes) {
            (Some(u), Some(t)) => format!("{:.1}/{:.1}", u as f64 / GIB, t as f64 / GIB),
            _ => "-".to_string(),
        };
        let power = match (g.power_watts, g.power_limit_watts) {
            (Some(p), Some(l)) => format!("{p:.0}/{l:.0}"),
            (Some(p), None) => format!("{p:.0}/-"),
            _ => "-".to_string(),
        };
        let clock = match (g.sm_clock_hertz, g.memory_clock_hertz) {
            (Some(s), Some(m)) => format!("{:.0}/{:.0}", s / 1e6, m / 1e6),
            _ => "-".to_string(),
        };
        let _ = writeln!(
            out,
            "{:<3} {:<24} {:<18} {:>5} {:>5} {:>15} {:>5} {:>13} {:>11} {:>5}",
            g.index,
            truncate(&text(g.name.as_deref()), 24),
            text(g.pci_bus_id.as_deref()),
            pct(g.utilization_ratio),
            pct(g.memory_utilization_ratio),
            memory,
            g.temperature_celsius
                .map_or("-".to_string(), |t| format!("{t:.0}C")),
            power,
            clock,
            g.processes.map_or("-".to_string(), |p| p.to_string()),
        );
    }
    health(&mut out, snap);
    out
}

/// Each GPU's health under the table, with each problem in words and what fixes it.
fn health(out: &mut String, snap: &Snapshot) {
    for g in &snap.gpus {
        let Some(h) = &g.health else { continue };
        let _ = writeln!(out, "GPU {} {}", g.index, h.state.as_str());
        for f in &h.problems {
            let _ = writeln!(out, "  {} ({})", f.words, f.action.words());
        }
    }
}

fn pct(r: Option<f64>) -> String {
    r.map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0))
}

/// Text from NVML, plain; "-" when there is none.
fn text(s: Option<&str>) -> String {
    match s {
        Some(s) if !s.is_empty() => crate::redact::plain(s),
        _ => "-".to_string(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuSample;

    /// A GPU name with an escape sequence (that would clear the screen) and one cut at the
    /// column's width: neither reaches the terminal raw.
    #[test]
    fn names_from_nvml_are_printed_plain() {
        let snap = Snapshot {
            gpus: vec![GpuSample {
                index: 0,
                up: true,
                name: Some("NVIDIA H100\u{1b}[2J\u{1b}]0;owned\u{7}".into()),
                uuid: "GPU-1\u{1b}[31m".into(),
                pci_bus_id: Some("0000:01:00.0\u{1b}[0m".into()),
                ..GpuSample::default()
            }],
            ..Snapshot::default()
        };
        let out = table(&snap);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(
            out.contains("NVIDIA H100\u{fffd}[2J\u{fffd}]0;owned 0000"),
            "{out:?}"
        );
        // Cut after being made plain: 24 characters, none of them a raw escape.
        let long = Snapshot {
            gpus: vec![GpuSample {
                index: 0,
                up: true,
                name: Some(format!("{}\u{1b}[2J", "x".repeat(22))),
                ..GpuSample::default()
            }],
            ..Snapshot::default()
        };
        let out = table(&long);
        assert!(
            out.contains(&format!("{}\u{fffd}[ ", "x".repeat(22))),
            "{out:?}"
        );
        assert!(!out.contains('\u{1b}'));
    }
}
