//! Library lifetime and system queries: `nvmlInit` and `nvmlShutdown`, error strings, and the
//! driver, NVML and CUDA versions.

use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::Ordering;

use nvml_wrapper_sys::bindings::*;

use super::{load, state, write_str, INIT_COUNT};

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    crate::calls::count("nvmlInit_v2");
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
    crate::calls::count("nvmlInit");
    nvmlInit_v2()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    crate::calls::count("nvmlInitWithFlags");
    nvmlInit_v2()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    crate::calls::count("nvmlShutdown");
    crate::calls::flush();
    let prev = INIT_COUNT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1));
    match prev {
        Ok(_) => nvmlReturn_enum_NVML_SUCCESS,
        Err(_) => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    crate::calls::count("nvmlErrorString");
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
    crate::calls::count("nvmlSystemGetDriverVersion");
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
    crate::calls::count("nvmlSystemGetNVMLVersion");
    match state() {
        Ok(st) => write_str(version, length, &st.scenario.nvml_version),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    crate::calls::count("nvmlSystemGetCudaDriverVersion_v2");
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
    crate::calls::count("nvmlSystemGetCudaDriverVersion");
    nvmlSystemGetCudaDriverVersion_v2(version)
}
