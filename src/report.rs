//! `gpuwatch snapshot`: one sample as a table, like `nvidia-smi`, or as JSON.

use std::fmt::Write as _;

use crate::gpu::Snapshot;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Renders a snapshot as a fixed-width table. Unknown readings show as "-".
pub fn table(snap: &Snapshot) -> String {
    let mut out = String::new();
    let nvml = &snap.nvml;
    let _ = writeln!(
        out,
        "driver {}   NVML {}   CUDA {}",
        nvml.driver_version.as_deref().unwrap_or("-"),
        nvml.nvml_version.as_deref().unwrap_or("-"),
        nvml.cuda_driver_version.as_deref().unwrap_or("-"),
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
                or_dash(&g.uuid)
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
            truncate(g.name.as_deref().unwrap_or("-"), 24),
            g.pci_bus_id.as_deref().unwrap_or("-"),
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

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
