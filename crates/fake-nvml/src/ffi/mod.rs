//! The NVML C ABI, answered from a scenario.
//!
//! Signatures, structs and return codes come from `nvml-wrapper-sys`, the same bindings
//! nvml-wrapper loads a real driver with, so a mismatch shows up as a build error here.
//! The safety contract of every function is NVML's own: pointers must be valid for writes.
//!
//! This module holds the shared plumbing: the library's state and its clock, device handles
//! (whole GPUs and MIG devices), and the query helpers that apply faults and write answers.
//! The exported functions live in one submodule per NVML area.
#![allow(clippy::missing_safety_doc, non_upper_case_globals)]

use std::ffi::{c_char, c_uint};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use nvml_wrapper_sys::bindings::*;

use crate::scenario::{Answer, Field, Gpu, Mig, Scenario};
use crate::SCENARIO_ENV;

mod device;
mod events;
mod gpm;
mod health;
mod library;
mod mig;
mod processes;
mod telemetry;

pub use device::*;
pub use events::*;
pub use gpm::*;
pub use health::*;
pub use library::*;
pub use mig::*;
pub use processes::*;
pub use telemetry::*;

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
    let (st, gpu, t) = match at_now(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    write_answer(st.scenario.read(gpu, field, t, |g| read(g, t)), out)
}

/// The library's state, the GPU a (whole-GPU) handle stands for, and the simulated time of the
/// call, after any delay a fault adds.
fn at_now(device: nvmlDevice_t) -> Result<(&'static State, u32, f64), nvmlReturn_t> {
    let (st, gpu) = gpu_of(device)?;
    Ok((st, gpu, delay_then_now(st, gpu)))
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
    // SAFETY: `buf` is non-null and, by NVML's contract, valid for `len` bytes, which the
    // check above shows hold the string and its terminating 0.
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
