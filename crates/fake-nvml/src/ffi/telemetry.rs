//! A GPU's readings: utilization, temperature, power, its limit and energy, clocks, throttle
//! reasons, ECC error counts, the video engines' utilization, PCIe replays and the PCIe link.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::*;

use super::{index_of, query, state};
use crate::scenario::Field;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetUtilizationRates");
    // In MIG mode NVML does not report the GPU's utilization.
    if let Ok(st) = state() {
        if let Ok(gpu) = index_of(st, device) {
            if !st.scenario.gpus[gpu as usize].mig.is_empty() {
                return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
            }
        }
    }
    query(device, Field::Utilization, utilization, |g, t| {
        nvmlUtilization_t {
            gpu: crate::scenario::to_u32(g.utilization.at(t)),
            memory: crate::scenario::to_u32(g.memory_utilization.at(t)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetTemperature");
    if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    query(device, Field::Temperature, temp, |g, t| {
        crate::scenario::to_u32(g.temperature.at(t))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetPowerUsage");
    query(device, Field::Power, power, |g, t| g.power_milliwatts(t))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetEnforcedPowerLimit");
    query(device, Field::PowerLimit, limit, |g, _| {
        g.power_limit_milliwatts
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetTotalEnergyConsumption");
    query(device, Field::Energy, energy, |g, t| {
        g.energy_millijoules(t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetClockInfo");
    let pick = match clock_type {
        nvmlClockType_enum_NVML_CLOCK_GRAPHICS | nvmlClockType_enum_NVML_CLOCK_SM => 0,
        nvmlClockType_enum_NVML_CLOCK_MEM => 1,
        nvmlClockType_enum_NVML_CLOCK_VIDEO => 2,
        _ => return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    };
    query(device, Field::Clocks, clock, |g, t| match pick {
        0 => crate::scenario::to_u32(g.sm_clock_mhz.at(t)),
        1 => crate::scenario::to_u32(g.memory_clock_mhz.at(t)),
        _ => crate::scenario::to_u32(g.sm_clock_mhz.at(t) * 0.9),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetCurrentClocksThrottleReasons");
    query(device, Field::Throttle, reasons, |g, _| {
        g.throttle_active & g.throttle_supported
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetSupportedClocksThrottleReasons");
    query(device, Field::Throttle, reasons, |g, _| {
        g.throttle_supported
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    _counter_type: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetTotalEccErrors");
    let corrected = match error_type {
        nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED => true,
        nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED => false,
        _ => return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    };
    query(device, Field::Ecc, count, |g, t| {
        let s = if corrected {
            &g.ecc_corrected
        } else {
            &g.ecc_uncorrected
        };
        s.at(t).max(0.0) as u64
    })
}

/// Encoder or decoder utilization: percent, and the sampling period (1 s here).
unsafe fn media(
    device: nvmlDevice_t,
    field: Field,
    utilization: *mut c_uint,
    period_us: *mut c_uint,
    read: impl Fn(&crate::scenario::Gpu, f64) -> f64,
) -> nvmlReturn_t {
    if period_us.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let rc = query(device, field, utilization, |g, t| {
        crate::scenario::to_u32(read(g, t))
    });
    if rc == nvmlReturn_enum_NVML_SUCCESS {
        // SAFETY: checked non-null above; the caller passes a writable c_uint.
        *period_us = 1_000_000;
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetEncoderUtilization");
    media(
        device,
        Field::Encoder,
        utilization,
        sampling_period_us,
        |g, t| g.encoder_utilization.at(t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetDecoderUtilization");
    media(
        device,
        Field::Decoder,
        utilization,
        sampling_period_us,
        |g, t| g.decoder_utilization.at(t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetPcieReplayCounter");
    query(device, Field::PcieReplays, value, |g, t| {
        crate::scenario::to_u32(g.pcie_replays.at(t))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: nvmlDevice_t,
    generation: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetCurrPcieLinkGeneration");
    query(device, Field::PcieLink, generation, |g, t| {
        crate::scenario::to_u32(g.pcie_link_generation.at(t))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: nvmlDevice_t,
    generation: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetMaxPcieLinkGeneration");
    query(device, Field::PcieLink, generation, |g, _| {
        g.pcie_link_max_generation
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: nvmlDevice_t,
    width: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetCurrPcieLinkWidth");
    query(device, Field::PcieLink, width, |g, t| {
        crate::scenario::to_u32(g.pcie_link_width.at(t))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: nvmlDevice_t,
    width: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetMaxPcieLinkWidth");
    query(device, Field::PcieLink, width, |g, _| g.pcie_link_max_width)
}
