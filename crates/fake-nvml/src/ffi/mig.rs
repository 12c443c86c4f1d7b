//! MIG: a GPU's MIG mode, its MIG device handles, and a MIG device's instance ids and parent.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;

use super::{gpu_of, handle, mig_handle, mig_of, mig_query, query, state};
use crate::scenario::Field;

/// MIG mode: on (1) when the scenario gives the GPU MIG devices (at any time: a layout with none
/// is still MIG mode); the pending mode is the same.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetMigMode");
    if pending.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let rc = query(device, Field::MigMode, current, |g, _| {
        c_uint::from(!g.mig.is_empty())
    });
    if rc == nvmlReturn_enum_NVML_SUCCESS {
        pending.write(current.read());
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetMaxMigDeviceCount");
    // Every MIG device the scenario names, existing now or not: a slot of one that does not
    // exist is NOT_FOUND, as a hole in the driver's layout is.
    query(device, Field::Identity, count, |g, _| g.mig.len() as c_uint)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetMigDeviceHandleByIndex");
    if mig_device.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let (st, gpu) = match gpu_of(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    if st.scenario.fails(gpu, Field::Mig, st.now()) {
        return nvmlReturn_enum_NVML_ERROR_UNKNOWN;
    }
    let exists = st.scenario.gpus[gpu as usize]
        .mig
        .get(index as usize)
        .is_some_and(|m| m.exists(st.now()));
    if !exists {
        return nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
    }
    mig_device.write(mig_handle(gpu, index));
    nvmlReturn_enum_NVML_SUCCESS
}

/// The GPU instance of a MIG device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetGpuInstanceId");
    mig_query(device, Field::Identity, id, |m, _| m.gpu_instance)
        .unwrap_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
}

/// The compute instance of a MIG device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetComputeInstanceId");
    mig_query(device, Field::Identity, id, |m, _| m.compute_instance)
        .unwrap_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
}

/// The GPU a MIG device is part of.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    if device.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    match mig_of(st, mig_device) {
        Some((gpu, _)) => {
            device.write(handle(gpu));
            nvmlReturn_enum_NVML_SUCCESS
        }
        None => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    }
}
