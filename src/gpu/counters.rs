//! What sampling counts, for `gpuwatch_sample_errors_total` and the GPM buffers gauge: shared
//! by the sampler, the NVML source and the XID watcher, and owned by none of them.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::registry::Registry;

use crate::metrics::encode::{counters, desc, gauge};

/// Why a sample, or part of one, is missing.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
#[repr(usize)]
pub enum SampleError {
    /// The NVML library failed to load or initialise.
    NvmlInit,
    /// A GPU answered `GPU_IS_LOST`.
    GpuLost,
    /// An NVML call failed with something other than "not supported".
    ReadFailed,
    /// NVML answered a value outside its valid range.
    OutOfRange,
    /// A sampling cycle overran its timeout and was abandoned.
    Timeout,
    /// Watching XID events failed.
    Xid,
}

impl SampleError {
    pub const ALL: [SampleError; 6] = [
        SampleError::NvmlInit,
        SampleError::GpuLost,
        SampleError::ReadFailed,
        SampleError::OutOfRange,
        SampleError::Timeout,
        SampleError::Xid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SampleError::NvmlInit => "nvml_init",
            SampleError::GpuLost => "gpu_lost",
            SampleError::ReadFailed => "read_failed",
            SampleError::OutOfRange => "out_of_range",
            SampleError::Timeout => "timeout",
            SampleError::Xid => "xid",
        }
    }
}

impl EncodeLabelValue for SampleError {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// The daemon's own counters. Lock-free; cheap to update from any thread.
#[derive(Debug, Default)]
pub struct SamplerCounters {
    errors: [AtomicU64; SampleError::ALL.len()],
    /// GPM sample buffers held now: two per GPU (and per GPU instance) with GPM.
    gpm_buffers: AtomicU64,
}

impl SamplerCounters {
    /// Registers the counters; every kind is present from the start, at 0, in a fixed order.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(Arc::clone(self)));
    }

    pub fn error(&self, kind: SampleError) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn error_count(&self, kind: SampleError) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    pub fn set_gpm_buffers(&self, n: usize) {
        self.gpm_buffers.store(n as u64, Ordering::Relaxed);
    }
}

impl Collector for SamplerCounters {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        counters(
            &mut enc,
            desc(
                "gpuwatch_sample_errors",
                "Sampling errors by kind: failed or out-of-range readings, lost GPUs, NVML init failures, abandoned cycles",
                None,
            ),
            SampleError::ALL
                .iter()
                .map(|k| ([("kind", k.as_str())], self.error_count(*k))),
        )?;
        gauge(
            &mut enc,
            desc(
                "gpuwatch_gpm_sample_buffers",
                "GPM sample buffers held: two per GPU, and per GPU instance, with GPM",
                None,
            ),
            self.gpm_buffers.load(Ordering::Relaxed) as i64,
        )
    }
}
