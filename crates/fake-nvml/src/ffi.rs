//! The NVML C ABI, answered from a scenario.
//!
//! Signatures, structs and return codes come from `nvml-wrapper-sys`, the same bindings
//! nvml-wrapper loads a real driver with, so a mismatch shows up as a build error here.
//! The safety contract of every function is NVML's own: pointers must be valid for writes.
#![allow(clippy::missing_safety_doc, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;

use crate::scenario::{Answer, Field, GpmMetric, Gpu, Mig, Scenario};
use crate::SCENARIO_ENV;

struct State {
    scenario: Scenario,
    epoch: Instant,
    xids: Vec<(f64, u32, u64)>,
}

impl State {
    fn now(&self) -> f64 {
        self.scenario.sim_time(self.epoch.elapsed().as_secs_f64())
    }
}

static STATE: OnceLock<Result<State, String>> = OnceLock::new();
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

fn load() -> &'static Result<State, String> {
    STATE.get_or_init(|| {
        let epoch = Instant::now();
        pin_in_memory();
        let path = std::env::var_os(SCENARIO_ENV)
            .ok_or_else(|| format!("{SCENARIO_ENV} is not set; it names the scenario file"))?;
        let scenario =
            Scenario::from_path(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
        let xids = scenario.xid_events();
        Ok(State {
            scenario,
            epoch,
            xids,
        })
    })
}

/// Keeps this library loaded for the life of the process. nvml-wrapper unloads the library when
/// `nvmlInit` fails; without the pin, a reload would restart the scenario's clock and faults.
fn pin_in_memory() {
    // SAFETY: dladdr reads the address of one of our own functions; dlopen with RTLD_NOLOAD only
    // takes another reference on a library that is already loaded.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let here = nvmlInit_v2 as *const libc::c_void;
        if libc::dladdr(here, &mut info) != 0 && !info.dli_fname.is_null() {
            libc::dlopen(
                info.dli_fname,
                libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
            );
        }
    }
}

fn state() -> Result<&'static State, nvmlReturn_t> {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return Err(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    }
    load()
        .as_ref()
        .map_err(|_| nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)
}

fn handle(index: u32) -> nvmlDevice_t {
    (index as usize + 1) as nvmlDevice_t
}

/// MIG device handles: the parent's index and the MIG device's, above the GPU handles' range.
const MIG_BASE: usize = 1 << 20;

fn mig_handle(gpu: u32, mig: u32) -> nvmlDevice_t {
    (MIG_BASE + ((gpu as usize) << 8) + mig as usize) as nvmlDevice_t
}

/// The (GPU, MIG device) a MIG handle stands for, while that MIG device exists.
fn mig_of(st: &State, device: nvmlDevice_t) -> Option<(u32, u32)> {
    let v = (device as usize).checked_sub(MIG_BASE)?;
    let (gpu, mig) = ((v >> 8) as u32, (v & 0xff) as u32);
    let g = st.scenario.gpus.get(gpu as usize)?;
    g.mig
        .get(mig as usize)
        .is_some_and(|m| m.exists(st.now()))
        .then_some((gpu, mig))
}

/// Answers a query on a MIG device handle: `None` when `device` is not one (the caller answers
/// for the GPU), else the return code, with the value written through `out`. The parent's faults
/// apply to its MIG devices.
unsafe fn mig_query<T>(
    device: nvmlDevice_t,
    field: Field,
    out: *mut T,
    read: impl FnOnce(&Mig, f64) -> T,
) -> Option<nvmlReturn_t> {
    if (device as usize) < MIG_BASE {
        return None;
    }
    if out.is_null() {
        return Some(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    let st = match state() {
        Ok(st) => st,
        Err(e) => return Some(e),
    };
    let Some((gpu, mig)) = mig_of(st, device) else {
        return Some(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    };
    let t = delay_then_now(st, gpu);
    let answer = st
        .scenario
        .read(gpu, field, t, |g| read(&g.mig[mig as usize], t));
    Some(write_answer(answer, out))
}

/// Writes a value through `out`, or returns the error the answer is.
unsafe fn write_answer<T>(answer: Answer<T>, out: *mut T) -> nvmlReturn_t {
    match answer {
        Answer::Value(v) => {
            out.write(v);
            nvmlReturn_enum_NVML_SUCCESS
        }
        Answer::NotSupported => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        Answer::Lost => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        Answer::InvalidArgument => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Answer::Unknown => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    }
}

/// The library's state and the GPU a (whole-GPU) handle stands for.
fn gpu_of(device: nvmlDevice_t) -> Result<(&'static State, u32), nvmlReturn_t> {
    let st = state()?;
    Ok((st, index_of(st, device)?))
}

fn index_of(st: &State, device: nvmlDevice_t) -> Result<u32, nvmlReturn_t> {
    let i = (device as usize).wrapping_sub(1);
    if device.is_null() || i >= st.scenario.gpus.len() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(i as u32)
}

/// Runs one device query: resolves the handle, applies delay, lost and not-supported faults,
/// and writes the value through `out`.
unsafe fn query<T>(
    device: nvmlDevice_t,
    field: Field,
    out: *mut T,
    read: impl FnOnce(&Gpu, f64) -> T,
) -> nvmlReturn_t {
    if out.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let (st, gpu) = match gpu_of(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    let t = delay_then_now(st, gpu);
    write_answer(st.scenario.read(gpu, field, t, |g| read(g, t)), out)
}

fn delay_then_now(st: &State, gpu: u32) -> f64 {
    let t = st.now();
    if let Some(d) = st.scenario.delay(gpu, t) {
        std::thread::sleep(d);
        return st.now();
    }
    t
}

unsafe fn write_str(buf: *mut c_char, len: c_uint, s: &str) -> nvmlReturn_t {
    if buf.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let bytes = crate::scenario::raw_bytes(s);
    if bytes.len() + 1 > len as usize {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
    buf.add(bytes.len()).write(0);
    nvmlReturn_enum_NVML_SUCCESS
}

unsafe fn write_str_array<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let n = s.len().min(N - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

// ---- library -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    match load() {
        Err(msg) => {
            eprintln!("gpuwatch-fake-nvml: {msg}");
            nvmlReturn_enum_NVML_ERROR_UNKNOWN
        }
        Ok(st) if st.scenario.init_fails(st.now()) => nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        Ok(_) => {
            INIT_COUNT.fetch_add(1, Ordering::SeqCst);
            nvmlReturn_enum_NVML_SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    nvmlInit_v2()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let prev = INIT_COUNT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1));
    match prev {
        Ok(_) => nvmlReturn_enum_NVML_SUCCESS,
        Err(_) => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static [u8] = match result {
        nvmlReturn_enum_NVML_SUCCESS => b"Success\0",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => b"Uninitialized\0",
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => b"Invalid Argument\0",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => b"Not Supported\0",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => b"GPU is lost\0",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => b"Driver Not Loaded\0",
        nvmlReturn_enum_NVML_ERROR_TIMEOUT => b"Timeout\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    match state() {
        Ok(st) => write_str(version, length, &st.scenario.driver_version),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    match state() {
        Ok(st) => write_str(version, length, &st.scenario.nvml_version),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    match state() {
        Ok(_) if version.is_null() => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Ok(st) => {
            version.write(st.scenario.cuda_driver_version);
            nvmlReturn_enum_NVML_SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    nvmlSystemGetCudaDriverVersion_v2(version)
}

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
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    let t = st.now();
    let found = st.scenario.gpus.iter().enumerate().find(|(i, g)| {
        let first = process_pid(*i as u32, 0);
        pid >= first && pid < first + g.process_count(t)
    });
    match found {
        Some((_, g)) => write_str(name, length, &g.process_name),
        None => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    }
}

// ---- devices -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    match state() {
        Ok(_) if count.is_null() => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Ok(st) => {
            count.write(st.scenario.gpus.len() as c_uint);
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
    let (st, gpu) = match gpu_of(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    let t = delay_then_now(st, gpu);
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
    if let Ok(st) = state() {
        if let Some((gpu, mig)) = mig_of(st, device) {
            let g = &st.scenario.gpus[gpu as usize];
            return write_str(uuid, length, &g.mig[mig as usize].uuid);
        }
    }
    device_str(device, uuid, length, |g| &g.uuid)
}

/// MIG mode: on (1) when the scenario gives the GPU MIG devices (at any time: a layout with none
/// is still MIG mode); the pending mode is the same.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
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

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    if let Ok(st) = state() {
        if let Some((gpu, mig)) = mig_of(st, device) {
            let g = &st.scenario.gpus[gpu as usize];
            let mig_name = format!("{} MIG {}", g.name, g.mig[mig as usize].profile);
            return write_str(name, length, &mig_name);
        }
    }
    device_str(device, name, length, |g| &g.name)
}

/// The GPU instance of a MIG device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    mig_query(device, Field::Identity, id, |m, _| m.gpu_instance)
        .unwrap_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
}

/// The compute instance of a MIG device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    mig_query(device, Field::Identity, id, |m, _| m.compute_instance)
        .unwrap_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
}

/// The GPU a MIG device is part of.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
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

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    query(device, Field::Identity, pci, |g, _| {
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
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
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
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let version = if memory.is_null() {
        0
    } else {
        (*memory).version
    };
    // NVML v2 reports driver-reserved memory separately; the fake reserves none.
    let answer = |total: u64, used: u64| nvmlMemory_v2_t {
        version,
        total,
        reserved: 0,
        free: total - used,
        used,
    };
    let mig = mig_query(device, Field::Memory, memory, |m, t| {
        answer(m.memory_total_bytes, m.memory_used_bytes(t))
    });
    if let Some(rc) = mig {
        return rc;
    }
    query(device, Field::Memory, memory, |g, t| {
        answer(g.memory_total_bytes, g.memory_used_bytes(t))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
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
    query(device, Field::Memory, memory, |g, t| {
        let used = g.memory_used_bytes(t);
        nvmlMemory_t {
            total: g.memory_total_bytes,
            free: g.memory_total_bytes - used,
            used,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
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
    query(device, Field::Power, power, |g, t| g.power_milliwatts(t))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    query(device, Field::PowerLimit, limit, |g, _| {
        g.power_limit_milliwatts
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
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
    query(device, Field::Throttle, reasons, |g, _| {
        g.throttle_active & g.throttle_supported
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
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

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    if count.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let capacity = count.read();
    let mut gpu_index = 0;
    let mut listed = Vec::new();
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
            let n = g.process_count(t);
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
        infos.add(i).write(nvmlProcessInfo_t {
            pid: process_pid(gpu_index, k) + instance.2,
            usedGpuMemory: used,
            gpuInstanceId: instance.0,
            computeInstanceId: instance.1,
        });
    }
    nvmlReturn_enum_NVML_SUCCESS
}

// ---- events --------------------------------------------------------------------------------

const SUPPORTED_EVENTS: u64 = (nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeXidCriticalError) as u64;

struct EventSet {
    /// Bitmask of registered GPU indices.
    gpus: Mutex<(u64, usize)>,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    query(device, Field::Events, types, |_, _| SUPPORTED_EVENTS)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    if let Err(e) = state() {
        return e;
    }
    if set.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let boxed = Box::new(EventSet {
        gpus: Mutex::new((0, 0)),
    });
    set.write(Box::into_raw(boxed).cast());
    nvmlReturn_enum_NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    let (_, gpu) = match gpu_of(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    if set.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    if types & !SUPPORTED_EVENTS != 0 {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    }
    let set = &*set.cast::<EventSet>();
    if let Ok(mut g) = set.gpus.lock() {
        g.0 |= 1 << gpu;
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// Delivers the scenario's XID events in time order, once each per event set.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    if set.is_null() || data.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let set = &*set.cast::<EventSet>();
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        {
            let Ok(mut guard) = set.gpus.lock() else {
                return nvmlReturn_enum_NVML_ERROR_UNKNOWN;
            };
            let (registered, next) = &mut *guard;
            let t = st.now();
            while let Some(&(at, gpu, xid)) = st.xids.get(*next) {
                if at > t {
                    break;
                }
                *next += 1;
                if *registered & (1 << gpu) != 0 {
                    data.write(nvmlEventData_t {
                        device: handle(gpu),
                        eventType: u64::from(nvmlEventTypeXidCriticalError),
                        eventData: xid,
                        gpuInstanceId: u32::MAX,
                        computeInstanceId: u32::MAX,
                    });
                    return nvmlReturn_enum_NVML_SUCCESS;
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return nvmlReturn_enum_NVML_ERROR_TIMEOUT;
        }
        // Sleep until the next event is due (in wall time), or the deadline.
        let next_due = set
            .gpus
            .lock()
            .ok()
            .and_then(|g| st.xids.get(g.1).map(|e| e.0))
            .filter(|_| st.scenario.speed > 0.0)
            .map(|at| Duration::from_secs_f64(((at - st.now()) / st.scenario.speed).max(0.0)));
        let wait = next_due.map_or(deadline - now, |d| d.min(deadline - now));
        std::thread::sleep(wait + Duration::from_millis(1));
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    if set.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    drop(Box::from_raw(set.cast::<EventSet>()));
    nvmlReturn_enum_NVML_SUCCESS
}

// ---- GPM ------------------------------------------------------------------------------------

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
    sample.write(s.cast());
    nvmlReturn_enum_NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    if sample.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    GPM_SAMPLES_LIVE.fetch_sub(1, Ordering::SeqCst);
    drop(Box::from_raw(sample.cast::<GpmSample>()));
    nvmlReturn_enum_NVML_SUCCESS
}

/// Fills the sample with the GPU and the simulated time, applying the GPU's faults.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
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
    if get.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
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
