//! GPM (GPU Performance Monitoring, Hopper and later): what the SMs, tensor cores and memory
//! really do, from two samples a cycle apart. Each GPU that supports it has two sample buffers,
//! allocated once and reused every cycle (the older and the newer sample swap places), and freed
//! when the GPU stops answering or stops supporting GPM.

use std::collections::HashMap;

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, GpmSample, Nvml};
use serde::{Deserialize, Serialize};

/// The GPM metrics of one GPU over the last cycle, in Prometheus units: activities as ratios
/// from 0 to 1, PCIe and NVLink in bytes per second. A metric that failed is `None`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpmReadings {
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub graphics_active: Option<f64>,
    pub tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
    pub fp64_active: Option<f64>,
    pub fp32_active: Option<f64>,
    pub fp16_active: Option<f64>,
    pub integer_active: Option<f64>,
    pub pcie_tx_bytes_per_second: Option<f64>,
    pub pcie_rx_bytes_per_second: Option<f64>,
    pub nvlink_tx_bytes_per_second: Option<f64>,
    pub nvlink_rx_bytes_per_second: Option<f64>,
}

/// The metrics asked for, in the order `set` expects them.
const METRICS: [GpmMetricId; 13] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::GraphicsUtil,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::Fp64Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp16Util,
    GpmMetricId::IntegerUtil,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
    GpmMetricId::NvlinkTotalTxPerSec,
    GpmMetricId::NvlinkTotalRxPerSec,
];

const MIB: f64 = 1024.0 * 1024.0;

impl GpmReadings {
    /// Stores metric `i` of `METRICS`, in Prometheus units; a value out of range is dropped.
    fn set(&mut self, i: usize, value: f64) -> bool {
        let ratio = (0.0..=100.0).contains(&value).then_some(value / 100.0);
        let rate = (value.is_finite() && value >= 0.0).then_some(value * MIB);
        let (slot, v) = match i {
            0 => (&mut self.sm_active, ratio),
            1 => (&mut self.sm_occupancy, ratio),
            2 => (&mut self.graphics_active, ratio),
            3 => (&mut self.tensor_active, ratio),
            4 => (&mut self.dram_active, ratio),
            5 => (&mut self.fp64_active, ratio),
            6 => (&mut self.fp32_active, ratio),
            7 => (&mut self.fp16_active, ratio),
            8 => (&mut self.integer_active, ratio),
            9 => (&mut self.pcie_tx_bytes_per_second, rate),
            10 => (&mut self.pcie_rx_bytes_per_second, rate),
            11 => (&mut self.nvlink_tx_bytes_per_second, rate),
            _ => (&mut self.nvlink_rx_bytes_per_second, rate),
        };
        *slot = v;
        v.is_some()
    }
}

/// Two sample buffers of one GPU; `newer` says which holds the last sample, `filled` whether
/// it holds one at all.
struct Buffers {
    samples: [GpmSample<'static>; 2],
    newer: usize,
    filled: bool,
}

/// What one GPU's GPM read gave.
pub enum Read {
    /// The GPU does not support GPM.
    Unsupported,
    /// Supported; the metrics over the last cycle (none on the first cycle, or after a failed
    /// sample).
    Metrics(Option<GpmReadings>),
    /// A call failed; the metrics are absent this cycle.
    Failed(&'static str, NvmlError),
}

/// The buffers of every GPU that supports GPM, by index, and of every GPU instance of a GPU in
/// MIG mode, by index and GPU instance id.
#[derive(Default)]
pub struct Gpm {
    /// By GPU index, and for a GPU instance its id and the UUID of its (first) MIG device: an
    /// instance destroyed and made again under the same id is a new one, with new buffers.
    buffers: HashMap<(u32, Option<(u32, String)>), Buffers>,
}

impl Gpm {
    /// Buffers held now (two per GPU that supports GPM).
    pub fn buffers(&self) -> usize {
        self.buffers.len() * 2
    }

    /// Frees the buffers of a GPU that is lost or gone, its GPU instances' too.
    pub fn forget(&mut self, index: u32) {
        self.buffers.retain(|(i, _), _| *i != index);
    }

    /// Keeps only the buffers of the GPUs in `0..count`.
    pub fn retain_below(&mut self, count: u32) {
        self.buffers.retain(|(i, _), _| *i < count);
    }

    /// Frees the buffers of GPU instances of GPU `index` that no longer exist (the MIG layout
    /// changed).
    pub fn retain_instances(&mut self, index: u32, instances: &[(u32, String)]) {
        self.buffers
            .retain(|(i, gi), _| *i != index || gi.as_ref().is_none_or(|g| instances.contains(g)));
    }

    /// Whether GPU `d` supports GPM: `Ok(false)` where it answers "not supported" or the
    /// library lacks the call.
    pub fn support(d: &Device<'static>) -> Result<bool, NvmlError> {
        match d.gpm_support() {
            Ok(supported) => Ok(supported),
            Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Takes this cycle's sample of GPU `index` (or, with `instance`, of that GPU instance of it),
    /// which supports GPM, and computes the metrics since the last one.
    pub fn read(
        &mut self,
        nvml: &'static Nvml,
        d: &Device<'static>,
        index: u32,
        instance: Option<(u32, &str)>,
    ) -> Read {
        let key = (index, instance.map(|(gi, uuid)| (gi, uuid.to_string())));
        let b = match self.buffers.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => match (alloc(nvml), alloc(nvml)) {
                (Ok(a), Ok(b)) => e.insert(Buffers {
                    samples: [a, b],
                    newer: 0,
                    filled: false,
                }),
                (Err(e), _) | (_, Err(e)) => return Read::Failed("gpm_alloc", e),
            },
        };
        let next = 1 - b.newer;
        if let Err(e) = sample_into(nvml, d, instance.map(|(gi, _)| gi), &b.samples[next]) {
            // The buffer may hold half a sample: nothing is compared with it.
            b.filled = false;
            return Read::Failed("gpm_sample", e);
        }
        let had = std::mem::replace(&mut b.filled, true);
        let older = b.newer;
        b.newer = next;
        if !had {
            return Read::Metrics(None);
        }
        match nvml_wrapper::gpm::gpm_metrics_get(
            nvml,
            &b.samples[older],
            &b.samples[next],
            &METRICS,
        ) {
            Ok(results) => {
                let mut r = GpmReadings::default();
                for (i, m) in results.into_iter().enumerate() {
                    if let Ok(m) = m {
                        r.set(i, m.value);
                    }
                }
                Read::Metrics(Some(r))
            }
            Err(e) => Read::Failed("gpm_metrics", e),
        }
    }
}

/// Allocates one sample buffer.
fn alloc(nvml: &'static Nvml) -> Result<GpmSample<'static>, NvmlError> {
    // The buffer is freed on drop through nvmlGpmSampleFree: without it, allocate nothing.
    nvml_sym(nvml.lib().nvmlGpmSampleFree.as_ref())?;
    let sym = nvml_sym(nvml.lib().nvmlGpmSampleAlloc.as_ref())?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: the call writes one sample handle into `raw`; on success the handle is the
    // library's, and `from_handle` takes it over (freeing it on drop) exactly once.
    unsafe {
        nvml_try((*sym)(&mut raw))?;
        Ok(GpmSample::from_handle(nvml, raw))
    }
}

/// Takes a sample of `d` (or of its GPU instance `instance`) into the buffer `s`, which is
/// reused rather than allocated again.
fn sample_into(
    nvml: &'static Nvml,
    d: &Device<'static>,
    instance: Option<u32>,
    s: &GpmSample<'static>,
) -> Result<(), NvmlError> {
    // SAFETY: both handles are live: the device's for the library's life, the sample's while
    // `s` is; the calls write only into the sample.
    unsafe {
        match instance {
            None => {
                let sym = nvml_sym(nvml.lib().nvmlGpmSampleGet.as_ref())?;
                nvml_try((*sym)(d.handle(), s.handle()))
            }
            Some(gi) => {
                let sym = nvml_sym(nvml.lib().nvmlGpmMigSampleGet.as_ref())?;
                nvml_try((*sym)(d.handle(), gi, s.handle()))
            }
        }
    }
}

/// The GPU instance and compute instance ids of a MIG device.
pub fn instance_ids(nvml: &'static Nvml, mig: &Device<'static>) -> (Option<u32>, Option<u32>) {
    let lib = nvml.lib();
    let mut gi = 0u32;
    let mut ci = 0u32;
    // SAFETY: the handle is live for the library's life, and each call writes one id.
    unsafe {
        let gi = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())
            .and_then(|f| nvml_try(f(mig.handle(), &mut gi)))
            .ok()
            .map(|()| gi);
        let ci = nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())
            .and_then(|f| nvml_try(f(mig.handle(), &mut ci)))
            .ok()
            .map(|()| ci);
        (gi, ci)
    }
}
