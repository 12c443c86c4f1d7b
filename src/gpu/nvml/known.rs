//! What is asked of a GPU once, not every cycle: its handle, its identity and what it can do
//! (the PCIe link's maximum, GPM, the throttle reasons it reports); and what moves slowly
//! enough to be read on the slow interval (the PCIe link now, a MIG mode that is off and not
//! about to change). All of it is dropped when the GPU stops answering, so a GPU that comes back
//! is read anew, and when NVML is initialised anew.

use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;

use super::GpuReader;
use crate::gpu::PcieLink;

/// How often the slow readings are read, unless the config says otherwise.
pub const SLOW_INTERVAL: Duration = Duration::from_secs(10);

/// One GPU's handle and what was learnt of it.
pub(super) struct Known {
    pub(super) device: Device<'static>,
    pub(super) facts: Facts,
}

/// What a GPU has said of itself that holds while NVML keeps its handle. `None`: not yet known.
#[derive(Default)]
pub(super) struct Facts {
    /// UUID, name and bus id all read (each is kept in `NvmlSource::identities`).
    pub(super) identity: bool,
    pub(super) gpm: Option<bool>,
    pub(super) throttle_supported: Option<ThrottleReasons>,
    /// The most the PCIe link trains to: generation and width.
    pub(super) pcie_max: Option<(Option<u32>, Option<u32>)>,
    /// The PCIe link now (generation and width), and when it was read.
    pub(super) pcie_now: Option<(Instant, Option<u32>, Option<u32>)>,
    /// When MIG mode was last read off with no change pending.
    pub(super) mig_off: Option<Instant>,
}

impl GpuReader<'_> {
    /// Whether something read at `at` is due again.
    fn due(&self, at: Option<Instant>) -> bool {
        at.is_none_or(|at| at.elapsed() >= self.src.slow_interval)
    }

    /// Whether reading `field` is settled: read, or recorded as unsupported.
    fn settled<T>(&self, field: &'static str, v: &Option<T>) -> bool {
        v.is_some() || self.src.unsupported.contains(&(self.index, field))
    }

    /// The PCIe link of GPU `d`: its maximum once, the link now on the slow interval (a read
    /// that failed is tried again next cycle).
    pub(super) fn pcie_link(&mut self, d: &Device<'static>) -> PcieLink {
        // A generation is 1 to 6 today, a width 1 to 32 lanes; far beyond is bad data.
        let link = |r: &mut Self, call: &dyn Fn() -> Result<u32, NvmlError>, most: u32| {
            let v = r.optional("pcie_link", call);
            r.check("pcie_link", v, |v| (1..=most).contains(&v))
        };
        let (max_generation, max_width) = match self.facts.pcie_max {
            Some(max) => max,
            None => {
                let generation = link(self, &|| d.max_pcie_link_gen(), 16);
                let width = link(self, &|| d.max_pcie_link_width(), 64);
                if self.settled("pcie_link", &generation) && self.settled("pcie_link", &width) {
                    self.facts.pcie_max = Some((generation, width));
                }
                (generation, width)
            }
        };
        let (generation, width) = match self.facts.pcie_now {
            Some((at, generation, width)) if !self.due(Some(at)) => (generation, width),
            _ => {
                let generation = link(self, &|| d.current_pcie_link_gen(), 16);
                let width = link(self, &|| d.current_pcie_link_width(), 64);
                self.facts.pcie_now = (self.settled("pcie_link", &generation)
                    && self.settled("pcie_link", &width))
                .then(|| (Instant::now(), generation, width));
                (generation, width)
            }
        };
        PcieLink {
            generation,
            max_generation,
            width,
            max_width,
        }
    }

    /// Whether MIG mode is known off now without asking: it was read off, with no change
    /// pending, within the slow interval. A GPU put into MIG mode shows it within that.
    pub(super) fn mig_known_off(&self) -> bool {
        self.facts.mig_off.is_some() && !self.due(self.facts.mig_off)
    }

    /// Each throttle reason GPU `d` supports: read until it answers, then kept.
    pub(super) fn supported_throttle_reasons(
        &mut self,
        d: &Device<'static>,
    ) -> Option<ThrottleReasons> {
        if self.facts.throttle_supported.is_none() {
            self.facts.throttle_supported =
                self.get("throttle_reasons", || d.supported_throttle_reasons());
        }
        self.facts.throttle_supported
    }
}
