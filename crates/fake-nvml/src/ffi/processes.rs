//! Compute processes: the processes running on a GPU or a MIG device, and their names.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;

use super::{index_of, mig_of, mig_query, query, state, write_str};
use crate::scenario::Field;

/// Process ids are `10000 + 100 × gpu + n`, for the `n`th process of a GPU.
fn process_pid(gpu: u32, n: u32) -> u32 {
    10_000 + 100 * gpu + n
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::calls::count("nvmlSystemGetProcessName");
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    let t = st.now();
    let found = st
        .scenario
        .gpus
        .iter()
        .enumerate()
        .find(|(i, g)| match g.pids() {
            Some(pids) => pids.contains(&pid),
            None => {
                let first = process_pid(*i as u32, 0);
                pid >= first && pid < first + g.process_count(t)
            }
        });
    match found {
        Some((_, g)) => write_str(name, length, &g.process_name),
        None => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetComputeRunningProcesses_v3");
    if count.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let capacity = count.read();
    let mut gpu_index = 0;
    let mut listed = Vec::new();
    // The real pids of a GPU with a pids file.
    let mut real: Option<Vec<u32>> = None;
    // A MIG device's processes: their pids and instance ids are the MIG device's own.
    let mut instance = (u32::MAX, u32::MAX, 0);
    let mig = mig_query(device, Field::Processes, count, |m, t| {
        let n = m.process_count(t);
        let per = m.memory_used_bytes(t) / u64::from(n.max(1));
        listed = (0..n).map(|k| (k, per)).collect();
        instance = (
            m.gpu_instance,
            m.compute_instance,
            1000 * (m.gpu_instance + 1),
        );
        n
    });
    let rc = if let Some(rc) = mig {
        if let Ok(st) = state() {
            gpu_index = mig_of(st, device).map_or(0, |(g, _)| g);
        }
        rc
    } else {
        query(device, Field::Processes, count, |g, t| {
            real = g.pids();
            let n = real
                .as_ref()
                .map_or_else(|| g.process_count(t), |p| p.len() as u32);
            let per = g.memory_used_bytes(t) / u64::from(n.max(1));
            listed = (0..n).map(|k| (k, per)).collect();
            n
        })
    };
    if rc != nvmlReturn_enum_NVML_SUCCESS {
        return rc;
    }
    if mig.is_none() {
        if let Ok(st) = state() {
            gpu_index = index_of(st, device).unwrap_or(0);
        }
    }
    let n = listed.len() as c_uint;
    if n == 0 {
        return nvmlReturn_enum_NVML_SUCCESS;
    }
    if infos.is_null() || capacity < n {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i, (k, used)) in listed.into_iter().enumerate() {
        // SAFETY: `infos` is non-null and holds `capacity` entries (NVML's contract), and
        // `i < n <= capacity`.
        let pid = match &real {
            Some(pids) => pids[k as usize],
            None => process_pid(gpu_index, k) + instance.2,
        };
        infos.add(i).write(nvmlProcessInfo_t {
            pid,
            usedGpuMemory: used,
            gpuInstanceId: instance.0,
            computeInstanceId: instance.1,
        });
    }
    nvmlReturn_enum_NVML_SUCCESS
}
