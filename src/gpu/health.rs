//! GPU health from a sample: what health is judged from (`readings`), and the judge the
//! sampler runs on every sample (`Judge`), which keeps health's memory between samples.

use tokio::sync::oneshot;

use super::{GpuSample, Snapshot};
use crate::health::{self, Memory, Readings, Settings};

/// Hands the sampler what health remembered before a restart (the XIDs held against GPUs),
/// once the decision loop has read `state.json`; or nothing to remember, where no loop runs.
pub type Seed = oneshot::Sender<Memory>;

/// What health is judged from, of one GPU's sample.
pub fn readings(g: &GpuSample) -> Readings {
    Readings {
        index: g.index,
        uuid: g.uuid.clone(),
        up: g.up,
        xids: g.xid_errors.clone(),
        ecc_corrected: g.ecc_corrected,
        ecc_uncorrected: g.ecc_uncorrected,
        remap_failed: g.memory_repair.remap_failed,
        remap_pending: g.memory_repair.remap_pending,
        retired_pending: g.memory_repair.retired_pending,
        pcie_generation: g.pcie_link.generation,
        pcie_max_generation: g.pcie_link.max_generation,
        pcie_width: g.pcie_link.width,
        pcie_max_width: g.pcie_link.max_width,
        utilization: g.utilization_ratio,
        thermal_seconds: g.clock_events.thermal,
        power_seconds: g.clock_events.power,
        energy_joules: g.energy_joules,
    }
}

/// Judges each sample's GPUs. Until the seed arrives, health is unknown: a GPU is never called
/// healthy before the XIDs held against it before a restart are known.
pub struct Judge {
    settings: Settings,
    memory: Option<Memory>,
    seed: Option<oneshot::Receiver<Memory>>,
}

impl Judge {
    pub fn new(settings: Settings) -> (Judge, Seed) {
        let (tx, rx) = oneshot::channel();
        let judge = Judge {
            settings,
            memory: None,
            seed: Some(rx),
        };
        (judge, tx)
    }

    /// Sets each GPU's health in `s`, and the holds to save.
    pub fn judge(&mut self, s: &mut Snapshot) {
        if let Some(rx) = self.seed.as_mut() {
            match rx.try_recv() {
                Ok(memory) => {
                    self.memory = Some(memory);
                    self.seed = None;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
                // No seed will come: start from nothing.
                Err(oneshot::error::TryRecvError::Closed) => {
                    self.memory = Some(Memory::default());
                    self.seed = None;
                }
            }
        }
        let Some(memory) = self.memory.as_mut() else {
            return;
        };
        // A GPU that answers, or that fell off the bus, has a health; one that could not be
        // reached for another reason (permissions, say) does not: it is unknown, never lost.
        let judged: Vec<usize> = (0..s.gpus.len())
            .filter(|&i| s.gpus[i].up || s.gpus[i].lost)
            .collect();
        let readings: Vec<Readings> = judged.iter().map(|&i| readings(&s.gpus[i])).collect();
        let found = health::assess(
            &self.settings,
            memory,
            s.nvml.complete(),
            &readings,
            s.timestamp,
        );
        for (i, h) in judged.into_iter().zip(found) {
            s.gpus[i].health = Some(h);
        }
        s.health_holds = Some(memory.holds.clone());
    }
}
