//! GPM (GPU Performance Monitoring): device support, samples of a GPU or a GPU instance, and
//! the metrics between two samples.

use std::ffi::{c_uint, CStr};
use std::sync::atomic::{AtomicI64, Ordering};

use nvml_wrapper_sys::bindings::*;

use super::{gpu_of, index_of, query, state};
use crate::scenario::{Field, GpmMetric};

/// A GPM sample: which GPU, and when (simulated time). Allocated by `nvmlGpmSampleAlloc` and
/// freed by `nvmlGpmSampleFree`, as the driver's are.
struct GpmSample {
    gpu: Option<u32>,
    /// For a GPU instance's sample: which MIG device of the GPU.
    mig: Option<usize>,
    t: f64,
}

/// GPM samples allocated and not yet freed, for tests that check buffers are not leaked.
pub static GPM_SAMPLES_LIVE: AtomicI64 = AtomicI64::new(0);

/// The scenario's metric for an NVML GPM metric id, with the names NVML reports for it.
fn gpm_metric(id: c_uint) -> Option<(GpmMetric, &'static CStr, &'static CStr)> {
    use GpmMetric::*;
    Some(match id {
        nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => (GraphicsActive, c"GR_UTIL", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => (SmActive, c"SM_UTIL", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => (SmOccupancy, c"SM_OCCUPANCY", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_INTEGER_UTIL => (IntegerActive, c"INTEGER_UTIL", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => {
            (TensorActive, c"ANY_TENSOR_UTIL", c"%")
        }
        nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => (DramActive, c"DRAM_BW_UTIL", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL => (Fp64Active, c"FP64_UTIL", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL => (Fp32Active, c"FP32_UTIL", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL => (Fp16Active, c"FP16_UTIL", c"%"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC => (PcieTx, c"PCIE_TX", c"MiB/sec"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => (PcieRx, c"PCIE_RX", c"MiB/sec"),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC => {
            (NvlinkTx, c"NVLINK_TOTAL_TX", c"MiB/sec")
        }
        nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC => {
            (NvlinkRx, c"NVLINK_TOTAL_RX", c"MiB/sec")
        }
        _ => return None,
    })
}

/// Whether the GPU supports GPM now: the scenario gives it a `gpm` table, and no fault says
/// otherwise.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlGpmQueryDeviceSupport");
    // SAFETY: `support` is checked non-null first; by NVML's contract it is valid for reads
    // and writes.
    if support.is_null() || (*support).version != NVML_GPM_SUPPORT_VERSION {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // Support is a property of the device: a `fails` fault on GPM fails the samples, not this;
    // a `not_supported` fault on GPM makes the GPU say it has none.
    let mut supported: c_uint = 0;
    let rc = query(device, Field::Identity, &mut supported, |g, _| {
        c_uint::from(g.gpm.is_some() || g.mig.iter().any(|m| m.gpm.is_some()))
    });
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return rc;
    }
    if let Ok(st) = state() {
        if let Ok(gpu) = index_of(st, device) {
            if st.scenario.unsupported(gpu, Field::Gpm, st.now()) {
                supported = 0;
            }
        }
    }
    (*support).isSupportedDevice = supported;
    rc
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    crate::calls::count("nvmlGpmSampleAlloc");
    if sample.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    if let Err(e) = state() {
        return e;
    }
    GPM_SAMPLES_LIVE.fetch_add(1, Ordering::SeqCst);
    let s = Box::into_raw(Box::new(GpmSample {
        gpu: None,
        mig: None,
        t: 0.0,
    }));
    // SAFETY: `sample` is non-null, and by NVML's contract valid for writes.
    sample.write(s.cast());
    nvmlReturn_enum_NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    crate::calls::count("nvmlGpmSampleFree");
    if sample.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    GPM_SAMPLES_LIVE.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: the sample came from `Box::into_raw` in `nvmlGpmSampleAlloc`, and is freed once.
    drop(Box::from_raw(sample.cast::<GpmSample>()));
    nvmlReturn_enum_NVML_SUCCESS
}

/// Fills the sample with the GPU and the simulated time, applying the GPU's faults.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlGpmSampleGet");
    if sample.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let mut at: (u32, f64, bool) = (0, 0.0, false);
    let rc = query(device, Field::Gpm, &mut at, |g, t| (0, t, g.gpm.is_some()));
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return rc;
    }
    if !at.2 {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    }
    let gpu = match state().and_then(|st| index_of(st, device)) {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: a non-null sample is one `nvmlGpmSampleAlloc` made and not yet freed.
    let s = &mut *sample.cast::<GpmSample>();
    s.gpu = Some(gpu);
    s.mig = None;
    s.t = at.1;
    nvmlReturn_enum_NVML_SUCCESS
}

/// A sample of one GPU instance of a GPU in MIG mode.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlGpmMigSampleGet");
    if sample.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let mut t = 0.0;
    let rc = query(device, Field::Gpm, &mut t, |_, t| t);
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return rc;
    }
    let (st, gpu) = match gpu_of(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    let found = st.scenario.gpus[gpu as usize]
        .mig
        .iter()
        .position(|m| m.gpu_instance == gpu_instance && m.exists(t));
    let Some(entry) = found else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    if st.scenario.gpus[gpu as usize].mig[entry].gpm.is_none() {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    }
    // SAFETY: a non-null sample is one `nvmlGpmSampleAlloc` made and not yet freed.
    let s = &mut *sample.cast::<GpmSample>();
    s.gpu = Some(gpu);
    s.mig = Some(entry);
    s.t = t;
    nvmlReturn_enum_NVML_SUCCESS
}

/// The metrics between two samples of one GPU: each the mean of its series over the interval,
/// as the driver computes them from its counters.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(get: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    crate::calls::count("nvmlGpmMetricsGet");
    if get.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: `get` is non-null, and by NVML's contract valid for reads and writes.
    let get = &mut *get;
    if get.version != NVML_GPM_METRICS_GET_VERSION
        || get.sample1.is_null()
        || get.sample2.is_null()
        || get.numMetrics as usize > get.metrics.len()
    {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    // SAFETY: both samples are non-null, so ones `nvmlGpmSampleAlloc` made and not yet freed.
    let (s1, s2) = (
        &*get.sample1.cast::<GpmSample>(),
        &*get.sample2.cast::<GpmSample>(),
    );
    let (Some(g1), Some(g2)) = (s1.gpu, s2.gpu) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    if g1 != g2 || s1.mig != s2.mig || s2.t < s1.t {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let gpm = st
        .scenario
        .gpus
        .get(g1 as usize)
        .and_then(|g| match s1.mig {
            None => g.gpm.as_ref(),
            Some(m) => g.mig.get(m)?.gpm.as_ref(),
        });
    let Some(gpm) = gpm else {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    };
    if st.scenario.fails(g1, Field::Gpm, st.now()) {
        return nvmlReturn_enum_NVML_ERROR_UNKNOWN;
    }
    for m in get.metrics.iter_mut().take(get.numMetrics as usize) {
        match gpm_metric(m.metricId)
            .and_then(|(metric, name, unit)| Some((gpm.mean(metric, s1.t, s2.t)?, name, unit)))
        {
            Some((value, name, unit)) => {
                m.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                m.value = value;
                m.metricInfo.shortName = name.as_ptr().cast_mut();
                m.metricInfo.longName = name.as_ptr().cast_mut();
                m.metricInfo.unit = unit.as_ptr().cast_mut();
            }
            None => m.nvmlReturn = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        }
    }
    nvmlReturn_enum_NVML_SUCCESS
}
