//! Events: the supported event types, event sets, and the scenario's XID events delivered
//! through them.

use std::ffi::{c_uint, c_ulonglong};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;

use super::{gpu_of, handle, query, state};
use crate::scenario::Field;

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
    crate::calls::count("nvmlDeviceGetSupportedEventTypes");
    query(device, Field::Events, types, |_, _| SUPPORTED_EVENTS)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    crate::calls::count("nvmlEventSetCreate");
    if let Err(e) = state() {
        return e;
    }
    if set.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let boxed = Box::new(EventSet {
        gpus: Mutex::new((0, 0)),
    });
    // SAFETY: `set` is non-null, and by NVML's contract valid for writes.
    set.write(Box::into_raw(boxed).cast());
    nvmlReturn_enum_NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceRegisterEvents");
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
    // SAFETY: a non-null event set is one `nvmlEventSetCreate` made and not yet freed.
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
    crate::calls::count("nvmlEventSetWait_v2");
    let st = match state() {
        Ok(st) => st,
        Err(e) => return e,
    };
    if set.is_null() || data.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: a non-null event set is one `nvmlEventSetCreate` made and not yet freed.
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
    crate::calls::count("nvmlEventSetFree");
    if set.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the set came from `Box::into_raw` in `nvmlEventSetCreate`, and is freed once.
    drop(Box::from_raw(set.cast::<EventSet>()));
    nvmlReturn_enum_NVML_SUCCESS
}
