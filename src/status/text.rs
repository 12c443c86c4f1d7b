//! The status for a terminal, as `gpuwatch status` prints it.

use std::fmt::Write as _;

use super::{Health, Status};

/// A number of bytes in GiB, or "-".
pub fn gib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| format!("{:.1}", b as f64 / 1024f64.powi(3)))
}

/// A ratio as a whole percentage, or "-".
pub fn percent(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{:.0}%", r * 100.0))
}

/// A duration in seconds as "1h 02m", "4m 05s" or "12s".
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A count of processes, or "-".
pub fn process_count(n: Option<u32>) -> String {
    match n {
        Some(0) => "none".into(),
        Some(n) => format!("{n} process{}", if n == 1 { "" } else { "es" }),
        None => "-".into(),
    }
}

/// A MIG device as its GPU's row names it: "GI 1 · CI 0 3g.40gb".
pub fn mig_name(m: &super::MigStatus) -> String {
    let id = |v: Option<u32>| v.map_or("?".into(), |v| v.to_string());
    format!(
        "GI {} · CI {} {}",
        id(m.gpu_instance),
        id(m.compute_instance),
        m.profile.as_deref().unwrap_or("")
    )
    .trim_end()
    .to_string()
}

/// What a GPU is busy with: its processes, or their count.
pub fn processes(g: &super::GpuStatus) -> String {
    if !g.processes.is_empty() {
        let names: Vec<String> = g
            .processes
            .iter()
            .map(|p| match &p.name {
                Some(n) => format!("{n} ({})", p.pid),
                None => p.pid.to_string(),
            })
            .collect();
        names.join(", ")
    } else {
        process_count(g.process_count)
    }
}

/// The hint for an underfed GPU.
pub fn underutilized_hint(g: &super::GpuStatus) -> String {
    format!(
        "GPU {} is underutilized: {} busy with a process running; larger batches or faster data loading would use it better",
        g.index,
        percent(g.utilization)
    )
}

/// The hint for a GPU that reads busy while its SMs are nearly idle.
pub fn spinning_hint(g: &super::GpuStatus) -> String {
    format!(
        "GPU {} reads {} busy, {} SM active: a process spins on a tiny kernel",
        g.index,
        percent(g.utilization),
        percent(g.sm_active)
    )
}

pub use crate::redact::plain;

/// The status as lines for a terminal. `now` is the reader's clock, for countdowns. Every
/// control character but the line ends is replaced, so no name can drive the terminal.
pub fn render(s: &Status, now: f64) -> String {
    render_lines(s, now)
        .split('\n')
        .map(plain)
        .collect::<Vec<_>>()
        .join("\n")
}

fn render_lines(s: &Status, now: f64) -> String {
    let mut out = String::new();
    header(&mut out, s);
    let _ = writeln!(out);
    gpu_table(&mut out, s);
    gpu_notes(&mut out, s);
    if s.watching {
        let _ = writeln!(out);
        rules(&mut out, s, now);
        jobs_holds_and_interruption(&mut out, s);
    }
    cost(&mut out, s);
    if !s.events.is_empty() {
        let _ = writeln!(out, "\nLast events:");
        for e in &s.events {
            let _ = writeln!(out, "  {}", e.text);
        }
    }
    out
}

/// The daemon, the node and its health; NVML; the instance and its labels.
fn header(out: &mut String, s: &Status) {
    let health = match s.health {
        Health::Ok => "OK",
        Health::Pending => "ACTION PENDING",
        Health::Down => "DOWN",
        Health::Unknown => "UNKNOWN (daemon down)",
    };
    let _ = writeln!(
        out,
        "gpuwatch {} on {}: {health}",
        s.version, s.node.hostname
    );
    let nvml = if s.nvml.up {
        format!(
            "up, driver {}",
            s.nvml.driver.as_deref().unwrap_or("unknown")
        )
    } else if s.seq == 0 {
        s.nvml
            .error
            .clone()
            .unwrap_or_else(|| "no sample yet".into())
    } else {
        format!("down: {}", s.nvml.error.as_deref().unwrap_or("unknown"))
    };
    let _ = writeln!(out, "NVML: {nvml}");
    if let Some(id) = &s.node.instance_id {
        let _ = writeln!(
            out,
            "Node: {id} {} in {} ({})",
            s.node.instance_type.as_deref().unwrap_or("?"),
            s.node.availability_zone.as_deref().unwrap_or("?"),
            s.node.lifecycle.as_deref().unwrap_or("unknown")
        );
    }
    if !s.node.labels.is_empty() {
        let labels: Vec<String> = s
            .node
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(out, "Labels: {}", labels.join(" "));
    }
}

/// A line per GPU, each followed by a line per MIG instance.
fn gpu_table(out: &mut String, s: &Status) {
    let _ = writeln!(
        out,
        "GPU  STATE  UTIL  MEMORY (GiB)   TEMP   POWER (W)    IDLE      PROCESSES"
    );
    for g in &s.gpus {
        let power = match (g.power_watts, g.power_limit_watts) {
            (Some(p), Some(l)) => format!("{p:.0}/{l:.0}"),
            (Some(p), None) => format!("{p:.0}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<4} {:<6} {:>4}  {:>6}/{:<6}  {:>5}  {:<11}  {:<8}  {}",
            g.index,
            if g.up { "up" } else { "LOST" },
            percent(g.utilization),
            gib(g.memory_used_bytes),
            gib(g.memory_total_bytes),
            g.temperature_celsius
                .map_or("-".into(), |t| format!("{t:.0}C")),
            power,
            g.idle_seconds.map_or("-".into(), duration),
            processes(g)
        );
        for m in &g.mig {
            let _ = writeln!(
                out,
                "  {}: SM {}  {}/{} GiB  idle {}  {}",
                plain(&mig_name(m)),
                percent(m.sm_active),
                gib(m.memory_used_bytes),
                gib(m.memory_total_bytes),
                m.idle_seconds.map_or("-".into(), duration),
                process_count(m.process_count)
            );
        }
    }
}

/// Under the table: each GPU's health problems, then the underutilized and spinning hints.
fn gpu_notes(out: &mut String, s: &Status) {
    for g in &s.gpus {
        if let Some(h) = g.health.as_ref().filter(|h| !h.problems.is_empty()) {
            let _ = writeln!(out, "GPU {} is {}:", g.index, h.state);
            for p in &h.problems {
                let _ = writeln!(
                    out,
                    "  {} ({})",
                    plain(&p.words),
                    super::GpuHealthStatus::action_words(p)
                );
            }
        }
    }
    for g in s.gpus.iter().filter(|g| g.underutilized) {
        let _ = writeln!(out, "hint: {}", underutilized_hint(g));
    }
    for g in s.gpus.iter().filter(|g| g.spinning) {
        let _ = writeln!(out, "hint: {}", spinning_hint(g));
    }
}

/// Each rule, its state and summary, and the action it has pending.
fn rules(out: &mut String, s: &Status, now: f64) {
    if s.rules.is_empty() {
        let _ = writeln!(out, "Rules: none");
    }
    for r in &s.rules {
        let counted = r.counted.map_or(String::new(), |c| {
            format!(
                ", {} of the last {} periods breach ({} needed)",
                c.breaching, c.of, c.needed
            )
        });
        let state = if r.breaching { "BREACHING" } else { "ok" };
        let _ = writeln!(out, "Rule {}: {state}{counted}", r.name);
        let _ = writeln!(out, "  {}", r.summary);
        if let Some(p) = &r.pending {
            let _ = writeln!(
                out,
                "  {} in {} (at {}) unless {}; to postpone it:\n    {}",
                p.action.to_uppercase(),
                duration(p.due_at - now),
                crate::time::rfc3339(p.due_at),
                crate::redact::plain(&p.unless),
                p.hold_command
            );
        }
    }
}

fn jobs_holds_and_interruption(out: &mut String, s: &Status) {
    for j in &s.jobs {
        let user = j
            .user
            .as_deref()
            .map_or(String::new(), |u| format!(" of {u}"));
        let dollars = j
            .idle_dollars
            .map_or(String::new(), |d| format!(", ${d:.2}"));
        let _ = writeln!(
            out,
            "Job {}{user} on GPU {}: idle {} of GPU time{dollars}",
            j.job,
            j.gpus.join(", "),
            duration(j.idle_seconds)
        );
    }
    for h in &s.holds {
        let until = h
            .until
            .map_or("without end (unreadable expiry)".into(), |t| {
                format!("until {}", crate::time::rfc3339(t))
            });
        let _ = writeln!(out, "Hold ({}): {until}: {}", h.source, h.reason);
    }
    if let Some(t) = s.interruption {
        let _ = writeln!(
            out,
            "Spot interruption: the instance goes at {}",
            crate::time::rfc3339(t)
        );
    }
}

/// The price, this period's spend and forecast, and each budget; nothing when there is none.
fn cost(out: &mut String, s: &Status) {
    let c = &s.cost;
    if c.usd_per_hour.is_none() && c.budgets.is_empty() {
        return;
    }
    let _ = writeln!(out);
    if let Some(p) = c.usd_per_hour {
        let _ = writeln!(
            out,
            "Price: ${p:.2}/h ({})",
            c.price_source.as_deref().unwrap_or("unknown")
        );
    }
    let money = |v: Option<f64>| v.map_or("-".into(), |v| format!("${v:.2}"));
    let _ = writeln!(
        out,
        "Spend this period: {}, forecast {}; on idle GPUs so far ${:.2}, on unhealthy ones ${:.2}",
        money(c.spent),
        money(c.forecast),
        c.idle_dollars,
        c.unhealthy_dollars
    );
    for b in &c.budgets {
        if let Some(why) = &b.unknown {
            let _ = writeln!(
                out,
                "Budget {}: spend unknown, so no rule tightens on it (limit ${:.2}): {}",
                plain(&b.name),
                b.limit_usd,
                plain(why)
            );
            continue;
        }
        let _ = writeln!(
            out,
            "Budget {}: {} of ${:.2} spent, forecast {}",
            b.name,
            percent(b.spent_ratio),
            b.limit_usd,
            percent(b.forecast_ratio)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_drive_the_terminal() {
        let mut s = Status::default();
        s.node.hostname = "evil\u{1b}]0;owned\u{7}".into();
        s.gpus.push(super::super::GpuStatus {
            name: Some("\u{1b}[2J".into()),
            up: true,
            ..Default::default()
        });
        let out = render(&s, 0.0);
        assert!(!out.contains('\u{1b}'), "{out:?}");
        assert!(!out.contains('\u{7}'), "{out:?}");
        assert!(out.contains("evil\u{fffd}]0;owned\u{fffd}"), "{out:?}");
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(0.4), "0s");
        assert_eq!(duration(59.0), "59s");
        assert_eq!(duration(245.0), "4m 05s");
        assert_eq!(duration(3720.0), "1h 02m");
        assert_eq!(duration(-5.0), "0s");
    }
}
