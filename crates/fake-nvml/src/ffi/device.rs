//! Device identity and memory: the device count and handles, index, UUID, name, PCI information
//! and memory use, of whole GPUs and (for UUID, name and memory) of MIG devices.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;

use super::{
    at_now, delay_then_now, handle, index_of, mig_of, mig_query, query, state, write_str,
    write_str_array,
};
use crate::scenario::{Field, Gpu};

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetCount_v2");
    match state() {
        Ok(_) if count.is_null() => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Ok(st) => {
            count.write(
                st.scenario
                    .device_count
                    .unwrap_or(st.scenario.gpus.len() as c_uint),
            );
            nvmlReturn_enum_NVML_SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetHandleByIndex_v2");
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    if device.is_null() || index as usize >= st.scenario.gpus.len() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let t = delay_then_now(st, index);
    if st.scenario.is_lost(index, t) {
        return nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
    }
    device.write(handle(index));
    nvmlReturn_enum_NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetIndex");
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    match index_of(st, device) {
        Ok(_) if index.is_null() => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Ok(i) => {
            index.write(i);
            nvmlReturn_enum_NVML_SUCCESS
        }
        Err(e) => e,
    }
}

unsafe fn device_str(
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
    pick: impl FnOnce(&Gpu) -> &str,
) -> nvmlReturn_t {
    let (st, gpu, t) = match at_now(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    if st.scenario.is_lost(gpu, t) {
        return nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
    }
    write_str(buf, length, pick(&st.scenario.gpus[gpu as usize]))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetUUID");
    if let Ok(st) = state() {
        if let Some((gpu, mig)) = mig_of(st, device) {
            let g = &st.scenario.gpus[gpu as usize];
            return write_str(uuid, length, &g.mig[mig as usize].uuid);
        }
    }
    device_str(device, uuid, length, |g| &g.uuid)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetName");
    if let Ok(st) = state() {
        if let Some((gpu, mig)) = mig_of(st, device) {
            let g = &st.scenario.gpus[gpu as usize];
            let mig_name = format!("{} MIG {}", g.name, g.mig[mig as usize].profile);
            return write_str(name, length, &mig_name);
        }
    }
    device_str(device, name, length, |g| &g.name)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetPciInfo_v3");
    query(device, Field::Identity, pci, |g, _| {
        // SAFETY: `nvmlPciInfo_t` is a C struct of integers and byte arrays: all zeroes is valid.
        let mut info: nvmlPciInfo_t = std::mem::zeroed();
        write_str_array(&mut info.busId, &g.pci_bus_id);
        let legacy = g.pci_bus_id.get(4..).unwrap_or(&g.pci_bus_id);
        write_str_array(&mut info.busIdLegacy, legacy);
        let bus = g
            .pci_bus_id
            .split(':')
            .nth(1)
            .and_then(|b| u32::from_str_radix(b, 16).ok())
            .unwrap_or(0);
        info.bus = bus;
        info.pciDeviceId = 0x2330_10de;
        info.pciSubSystemId = 0x16c1_10de;
        info
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetMemoryInfo_v2");
    let version = if memory.is_null() {
        0
    } else {
        // SAFETY: `memory` is non-null, and by NVML's contract valid for reads.
        (*memory).version
    };
    // NVML v2 reports driver-reserved memory apart from the used and the free.
    let answer = |total: u64, reserved: u64, used: u64| nvmlMemory_v2_t {
        version,
        total,
        reserved,
        free: total - reserved - used,
        used,
    };
    let mig = mig_query(device, Field::Memory, memory, |m, t| {
        answer(m.memory_total_bytes, 0, m.memory_used_bytes(t))
    });
    if let Some(rc) = mig {
        return rc;
    }
    query(device, Field::Memory, memory, |g, t| {
        answer(
            g.memory_total_bytes,
            g.memory_reserved_bytes,
            g.memory_used_bytes(t),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetMemoryInfo");
    let mig = mig_query(device, Field::Memory, memory, |m, t| {
        let used = m.memory_used_bytes(t);
        nvmlMemory_t {
            total: m.memory_total_bytes,
            free: m.memory_total_bytes - used,
            used,
        }
    });
    if let Some(rc) = mig {
        return rc;
    }
    // Version 1 counts the reserved memory as used.
    query(device, Field::Memory, memory, |g, t| {
        let used = g.memory_used_bytes(t) + g.memory_reserved_bytes;
        nvmlMemory_t {
            total: g.memory_total_bytes,
            free: g.memory_total_bytes - used,
            used,
        }
    })
}
