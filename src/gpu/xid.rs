//! XID errors: a dedicated thread waits on an NVML event set and counts critical XID events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::counters::{SampleError, SamplerCounters};

/// XID counts per GPU index, then per XID code, and each GPU's last XID. Locked only to add one
/// event or copy one GPU's counts.
#[derive(Debug, Default)]
pub struct XidCounts(Mutex<BTreeMap<u32, GpuXids>>);

#[derive(Debug, Clone, Default)]
struct GpuXids {
    counts: BTreeMap<u64, u64>,
    last: Option<u64>,
    /// Per code: when it was last logged, and how many came since without a log line.
    logged: BTreeMap<u64, (Instant, u64)>,
}

/// One log line per GPU and XID code in this time at most; the rest are counted.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The most XID codes counted apart per GPU (NVIDIA's catalog has under 200); the rest are
/// counted as `UNKNOWN_XID`, so that a library reporting arbitrary codes cannot grow the series
/// without bound.
const MAX_CODES_PER_GPU: usize = 256;
/// The code counted for an XID NVML cannot name, and for codes past the cap.
const UNKNOWN_XID: u64 = 999;

impl XidCounts {
    /// Counts one XID (as `UNKNOWN_XID` past the GPU's cap of codes). Returns, when it is to
    /// be logged, how many of its code on its GPU went unlogged before it: one line per GPU and
    /// code a minute at most, so that a program faulting in a loop cannot flood the journal.
    pub fn record(&self, gpu: u32, xid: u64) -> Option<u64> {
        let Ok(mut map) = self.0.lock() else {
            return None;
        };
        if !map.contains_key(&gpu) && map.len() >= super::nvml::MAX_GPUS as usize {
            return None;
        }
        let g = map.entry(gpu).or_default();
        let code = if g.counts.contains_key(&xid) || g.counts.len() < MAX_CODES_PER_GPU {
            xid
        } else {
            UNKNOWN_XID
        };
        *g.counts.entry(code).or_default() += 1;
        g.last = Some(code);
        let now = Instant::now();
        match g.logged.get_mut(&code) {
            Some((at, unlogged)) if now.duration_since(*at) < LOG_EVERY => {
                *unlogged += 1;
                None
            }
            Some((at, unlogged)) => {
                *at = now;
                Some(std::mem::take(unlogged))
            }
            None => {
                g.logged.insert(code, (now, 0));
                Some(0)
            }
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
                            if let Some(unlogged) = counts.record(gpu, xid) {
                                tracing::warn!(gpu, xid, unlogged, "XID error");
                            }
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
        nvml_wrapper::enums::event::XidError::Unknown => UNKNOWN_XID,
    }
}

fn register(nvml: &'static Nvml) -> Result<Option<nvml_wrapper::EventSet<'static>>, NvmlError> {
    let mut set = nvml.create_event_set()?;
    let mut any = false;
    for i in 0..nvml.device_count()?.min(super::nvml::MAX_GPUS) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_are_all_counted_logged_once_a_minute_and_their_codes_bounded() {
        let counts = XidCounts::default();
        let logged: Vec<Option<u64>> = (0..10).map(|_| counts.record(0, 79)).collect();
        assert_eq!(logged[0], Some(0));
        assert!(logged[1..].iter().all(Option::is_none), "{logged:?}");
        assert_eq!(counts.for_gpu(0).0[&79], 10);
        // Another code, another GPU: each logged once.
        assert_eq!(counts.record(0, 13), Some(0));
        assert_eq!(counts.record(1, 79), Some(0));
        // A library that reports every code there is: the series stay bounded.
        for code in 0..10_000 {
            counts.record(2, code);
        }
        let (codes, last) = counts.for_gpu(2);
        assert!(codes.len() <= MAX_CODES_PER_GPU + 1, "{}", codes.len());
        assert_eq!(codes.values().sum::<u64>(), 10_000);
        assert_eq!(last, Some(UNKNOWN_XID));
    }
}
