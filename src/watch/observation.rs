//! What the engine sees of a snapshot: each GPU, or each MIG device of a GPU in MIG mode, in
//! rule units, with its health and the pods holding it.

use crate::gpu::{GpuSample, MigSample, Snapshot};
use crate::health::State;
use crate::rules::{GpuReading, Metric, MigDevice, Observation};

/// What the engine sees of a snapshot: every GPU up, or the observation is incomplete. A GPU
/// in MIG mode is its MIG devices, each judged as a device of its own (with the GPU's power
/// ratio, which is physical); one that could not be read leaves the observation incomplete.
/// `holders` names the pods holding a GPU or one of its MIG devices.
pub fn observation(
    s: &Snapshot,
    holders: impl Fn(&GpuSample, Option<&MigSample>) -> Vec<String>,
) -> Observation {
    let mut gpus: Vec<GpuReading> = Vec::with_capacity(s.gpus.len());
    for g in &s.gpus {
        let power = match (g.power_watts, g.power_limit_watts) {
            (Some(p), Some(l)) if l > 0.0 && g.up => Some(p / l),
            _ => None,
        };
        // Health goes with every device of the GPU: 1 while unhealthy, with the problems in
        // words for a rule's evidence; unknown while the GPU's health is.
        let unhealthy = g.health.as_ref().map(|h| h.state == State::Unhealthy);
        let problems: Vec<String> = match &g.health {
            Some(h) if h.state == State::Unhealthy => h
                .problems
                .iter()
                .map(|f| format!("GPU {}: {}", g.index, f.words))
                .collect(),
            _ => Vec::new(),
        };
        let mut r = GpuReading {
            index: g.index,
            problems: problems.clone(),
            ..GpuReading::default()
        };
        r.set(
            Metric::GpuUnhealthy,
            unhealthy.map(|u| f64::from(u8::from(u))),
        );
        if !g.up {
            gpus.push(r);
            continue;
        }
        if !g.mig.is_empty() {
            gpus.extend(g.mig.iter().filter_map(|m| {
                let mut r = GpuReading {
                    index: g.index,
                    mig: Some(MigDevice {
                        gpu_instance: m.gpu_instance?,
                        compute_instance: m.compute_instance?,
                        share: mig_share(g, m),
                    }),
                    holders: holders(g, Some(m)),
                    problems: problems.clone(),
                    ..GpuReading::default()
                };
                r.set(
                    Metric::GpuUnhealthy,
                    unhealthy.map(|u| f64::from(u8::from(u))),
                );
                let memory = ratio(m.memory_used_bytes, m.memory_total_bytes);
                set_device(&mut r, memory, power, m.processes, m.gpm.as_ref());
                Some(r)
            }));
            continue;
        }
        r.holders = holders(g, None);
        r.set(Metric::GpuUtilization, g.utilization_ratio);
        r.set(Metric::MemoryUtilization, g.memory_utilization_ratio);
        let memory = ratio(g.memory_used_bytes, g.memory_total_bytes);
        set_device(&mut r, memory, power, g.processes, g.gpm.as_ref());
        gpus.push(r);
    }
    Observation {
        t: s.timestamp,
        complete: s.nvml.complete()
            && !s.gpus.is_empty()
            && s.gpus.iter().all(|g| g.up && g.mig_unread == 0),
        gpus,
        veto: None,
        holders_unknown: false,
    }
}

fn ratio(used: Option<u64>, total: Option<u64>) -> Option<f64> {
    match (used, total) {
        (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
        _ => None,
    }
}

/// The readings a whole GPU and a MIG device both have. Without GPM the activities stay
/// unknown, which a rule counts as busy.
fn set_device(
    r: &mut GpuReading,
    memory_used: Option<f64>,
    power: Option<f64>,
    processes: Option<u32>,
    gpm: Option<&crate::gpu::gpm::GpmReadings>,
) {
    r.set(Metric::MemoryUsedRatio, memory_used);
    r.set(Metric::PowerRatio, power);
    r.set(Metric::Processes, processes.map(f64::from));
    r.set(Metric::SmActive, gpm.and_then(|m| m.sm_active));
    r.set(Metric::TensorActive, gpm.and_then(|m| m.tensor_active));
    r.set(Metric::DramActive, gpm.and_then(|m| m.dram_active));
}

/// A MIG device's share of its GPU: its GPU instance's memory as a share of the GPU's, split
/// evenly among the instance's compute instances; an even split of the GPU when the memory is
/// unknown.
fn mig_share(g: &GpuSample, m: &MigSample) -> f64 {
    let even = 1.0 / g.mig.len() as f64;
    let (Some(mem), Some(total)) = (m.memory_total_bytes, g.memory_total_bytes) else {
        return even;
    };
    if total == 0 {
        return even;
    }
    let siblings = g
        .mig
        .iter()
        .filter(|x| x.gpu_instance == m.gpu_instance)
        .count()
        .max(1);
    (mem as f64 / total as f64 / siblings as f64).clamp(0.0, 1.0)
}
