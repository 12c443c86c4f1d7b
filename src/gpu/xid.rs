//! XID errors: a dedicated thread waits on an NVML event set and counts critical XID events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::sampler::{SampleError, SamplerCounters};

/// XID counts per GPU index, then per XID code, and each GPU's last XID. Locked only to add one
/// event or copy one GPU's counts.
#[derive(Debug, Default)]
pub struct XidCounts(Mutex<BTreeMap<u32, GpuXids>>);

#[derive(Debug, Clone, Default)]
struct GpuXids {
    counts: BTreeMap<u64, u64>,
    last: Option<u64>,
}

impl XidCounts {
    pub fn record(&self, gpu: u32, xid: u64) {
        if let Ok(mut map) = self.0.lock() {
            let g = map.entry(gpu).or_default();
            *g.counts.entry(xid).or_default() += 1;
            g.last = Some(xid);
        }
    }

    /// The GPU's counts by XID code, and the last XID it reported.
    pub fn for_gpu(&self, gpu: u32) -> (BTreeMap<u64, u64>, Option<u64>) {
        let g = self
            .0
            .lock()
            .map(|m| m.get(&gpu).cloned().unwrap_or_default())
            .unwrap_or_default();
        (g.counts, g.last)
    }
}

/// How long one wait blocks; it bounds nothing but the thread's own loop.
const WAIT_MS: u32 = 1000;

/// Starts the XID thread. GPUs that do not support XID events are skipped; with none, no thread
/// is started.
pub fn spawn(nvml: &'static Nvml, counts: Arc<XidCounts>, metrics: Arc<SamplerCounters>) {
    let set = match register(nvml) {
        Ok(Some(set)) => set,
        Ok(None) => {
            tracing::info!("no GPU supports XID events; gpu_xid_errors_total stays empty");
            return;
        }
        Err(e) => {
            metrics.error(SampleError::Xid);
            tracing::warn!(error = %e, "cannot watch XID events; gpu_xid_errors_total stays empty");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("gpuwatch-xid".into())
        .spawn(move || loop {
            match set.wait(WAIT_MS) {
                Ok(event) => {
                    let Some(xid) = event.event_data.map(xid_code) else {
                        continue;
                    };
                    match event.device.index() {
                        Ok(gpu) => {
                            tracing::warn!(gpu, xid, "XID error");
                            counts.record(gpu, xid);
                        }
                        Err(e) => {
                            metrics.error(SampleError::Xid);
                            tracing::warn!(xid, error = %e, "XID error on a GPU whose index cannot be read");
                        }
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    metrics.error(SampleError::Xid);
                    tracing::debug!(error = %e, "waiting for XID events failed");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the XID thread");
    }
}

fn xid_code(x: nvml_wrapper::enums::event::XidError) -> u64 {
    match x {
        nvml_wrapper::enums::event::XidError::Value(v) => v,
        nvml_wrapper::enums::event::XidError::Unknown => 999,
    }
}

fn register(nvml: &'static Nvml) -> Result<Option<nvml_wrapper::EventSet<'static>>, NvmlError> {
    let mut set = nvml.create_event_set()?;
    let mut any = false;
    for i in 0..nvml.device_count()? {
        let Ok(device) = nvml.device_by_index(i) else {
            continue;
        };
        let supported = device
            .supported_event_types()
            .unwrap_or(EventTypes::empty());
        if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
            continue;
        }
        set = device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| e.error)?;
        any = true;
    }
    Ok(any.then_some(set))
}
