//! Field values (`nvmlDeviceGetFieldValues`: the memory temperature, remapped rows, NVLink errors
//! and data, and the field twins of the power, its limit, energy, ECC counts, violation
//! counters, PCIe replays and retired pages), retired pages through their own calls, and the
//! clocks' violation counters.

use std::ffi::{c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::field_id::*;
use nvml_wrapper_sys::bindings::*;

use super::{at_now, query};
use crate::scenario::{to_u32, Answer, Field, Gpu, RetiredPages};

/// A field value's scope that means every NVLink link at once.
const ALL_LINKS: c_uint = c_uint::MAX;

/// A field's value at `t` for a scope.
type Read = fn(&Gpu, f64, c_uint) -> Answer<u64>;

/// How NVML types a field's value: most are unsigned long longs; the power readings and the
/// PCIe replay counter are unsigned ints, as their own calls give them.
fn typed_as_uint(id: c_uint) -> bool {
    matches!(
        id,
        NVML_FI_DEV_POWER_AVERAGE
            | NVML_FI_DEV_POWER_INSTANT
            | NVML_FI_DEV_POWER_CURRENT_LIMIT
            | NVML_FI_DEV_PCIE_REPLAY_COUNTER
    )
}

/// What one field id reads: its scenario field, and its value at `t` for `scope`. `None` for an
/// id the fake does not know, which NVML answers "not supported".
fn field(id: c_uint) -> Option<(Field, Read)> {
    if let Some(f) = twin(id) {
        return Some(f);
    }
    fn count(v: f64) -> Answer<u64> {
        Answer::Value(v.round().max(0.0) as u64)
    }
    fn link_count(g: &Gpu, v: f64) -> Answer<u64> {
        if g.nvlink_links == 0 {
            Answer::NotSupported
        } else {
            count(v)
        }
    }
    /// NVLink data, over every link or one of them (an even share).
    fn link_data(g: &Gpu, v: f64, scope: c_uint) -> Answer<u64> {
        match scope {
            _ if g.nvlink_links == 0 => Answer::NotSupported,
            ALL_LINKS => count(v),
            l if l < g.nvlink_links => count(v / f64::from(g.nvlink_links)),
            _ => Answer::InvalidArgument,
        }
    }
    Some(match id {
        NVML_FI_DEV_MEMORY_TEMP => (Field::MemoryTemperature, |g, t, _| {
            count(g.memory_temperature.at(t))
        }),
        NVML_FI_DEV_REMAPPED_COR => (Field::RemappedRows, |g, t, _| {
            count(g.remapped_correctable.at(t))
        }),
        NVML_FI_DEV_REMAPPED_UNC => (Field::RemappedRows, |g, t, _| {
            count(g.remapped_uncorrectable.at(t))
        }),
        NVML_FI_DEV_REMAPPED_PENDING => {
            (Field::RemappedRows, |g, t, _| count(g.remap_pending.at(t)))
        }
        NVML_FI_DEV_REMAPPED_FAILURE => {
            (Field::RemappedRows, |g, t, _| count(g.remap_failed.at(t)))
        }
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL => (Field::NvlinkErrors, |g, t, _| {
            link_count(g, g.nvlink_errors[0].at(t))
        }),
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL => (Field::NvlinkErrors, |g, t, _| {
            link_count(g, g.nvlink_errors[1].at(t))
        }),
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL => (Field::NvlinkErrors, |g, t, _| {
            link_count(g, g.nvlink_errors[2].at(t))
        }),
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL => (Field::NvlinkErrors, |g, t, _| {
            link_count(g, g.nvlink_errors[3].at(t))
        }),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => (Field::NvlinkBytes, |g, t, scope| {
            link_data(g, g.nvlink_tx_kib.at(t), scope)
        }),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => (Field::NvlinkBytes, |g, t, scope| {
            link_data(g, g.nvlink_rx_kib.at(t), scope)
        }),
        _ => return None,
    })
}

/// The field values that are twins of a reading's own call, answering exactly what the call
/// would: the power (averaged over a second, and instant: the fake has one power), its
/// enforced limit, energy (mJ), the volatile ECC totals, the violation counters (ns), PCIe
/// replays and retired pages.
fn twin(id: c_uint) -> Option<(Field, Read)> {
    fn value(v: u64) -> Answer<u64> {
        Answer::Value(v)
    }
    fn held(g: &Gpu, t: f64, i: usize) -> Answer<u64> {
        value((g.clock_event_seconds[i].at(t).max(0.0) * 1e9).round() as u64)
    }
    fn retired(g: &Gpu, t: f64, read: fn(&RetiredPages, f64) -> u64) -> Answer<u64> {
        g.retired_pages
            .as_ref()
            .map_or(Answer::NotSupported, |r| value(read(r, t)))
    }
    Some(match id {
        NVML_FI_DEV_POWER_AVERAGE | NVML_FI_DEV_POWER_INSTANT => (Field::Power, |g, t, _| {
            value(u64::from(g.power_milliwatts(t)))
        }),
        NVML_FI_DEV_POWER_CURRENT_LIMIT => (Field::PowerLimit, |g, _, _| {
            value(u64::from(g.power_limit_milliwatts))
        }),
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => {
            (Field::Energy, |g, t, _| value(g.energy_millijoules(t)))
        }
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL => (Field::Ecc, |g, t, _| {
            value(g.ecc_corrected.at(t).max(0.0) as u64)
        }),
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL => (Field::Ecc, |g, t, _| {
            value(g.ecc_uncorrected.at(t).max(0.0) as u64)
        }),
        NVML_FI_DEV_PERF_POLICY_POWER => (Field::ClockEvents, |g, t, _| held(g, t, 0)),
        NVML_FI_DEV_PERF_POLICY_THERMAL => (Field::ClockEvents, |g, t, _| held(g, t, 1)),
        NVML_FI_DEV_PERF_POLICY_SYNC_BOOST => (Field::ClockEvents, |g, t, _| held(g, t, 2)),
        NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT => (Field::ClockEvents, |g, t, _| held(g, t, 3)),
        NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION => (Field::ClockEvents, |g, t, _| held(g, t, 4)),
        NVML_FI_DEV_PERF_POLICY_RELIABILITY => (Field::ClockEvents, |g, t, _| held(g, t, 5)),
        NVML_FI_DEV_PCIE_REPLAY_COUNTER => (Field::PcieReplays, |g, t, _| {
            value(u64::from(to_u32(g.pcie_replays.at(t))))
        }),
        NVML_FI_DEV_RETIRED_SBE => (Field::RetiredPages, |g, t, _| {
            retired(g, t, |r, t| u64::from(to_u32(r.single_bit.at(t))))
        }),
        NVML_FI_DEV_RETIRED_DBE => (Field::RetiredPages, |g, t, _| {
            retired(g, t, |r, t| u64::from(to_u32(r.double_bit.at(t))))
        }),
        // The fake's one pending flag is any page's; the double-bit flag stays clear.
        NVML_FI_DEV_RETIRED_PENDING | NVML_FI_DEV_RETIRED_PENDING_SBE => {
            (Field::RetiredPages, |g, t, _| {
                retired(g, t, |r, t| u64::from(r.pending.at(t) >= 0.5))
            })
        }
        NVML_FI_DEV_RETIRED_PENDING_DBE => {
            (Field::RetiredPages, |g, _, _| retired(g, 0.0, |_, _| 0))
        }
        _ => return None,
    })
}

/// A fault's answer, else the reading's own.
fn flatten<T>(a: Answer<Answer<T>>) -> Answer<T> {
    match a {
        Answer::Value(inner) => inner,
        Answer::NotSupported => Answer::NotSupported,
        Answer::Lost => Answer::Lost,
        Answer::InvalidArgument => Answer::InvalidArgument,
        Answer::Unknown => Answer::Unknown,
    }
}

fn code<T>(answer: &Answer<T>) -> nvmlReturn_t {
    match answer {
        Answer::Value(_) => nvmlReturn_enum_NVML_SUCCESS,
        Answer::NotSupported => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        Answer::Lost => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        Answer::InvalidArgument => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Answer::Unknown => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    }
}

/// Each field answers on its own, as NVML's do: a field the GPU lacks, or one a fault hits,
/// fails alone. A lost GPU fails the whole call.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    values_count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetFieldValues");
    if values.is_null() || values_count <= 0 {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let (st, gpu, t) = match at_now(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    if st.scenario.is_lost(gpu, t) {
        return nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
    }
    // SAFETY: non-null, and by NVML's contract valid for `values_count` entries.
    let entries = std::slice::from_raw_parts_mut(values, values_count as usize);
    let stamp = (t * 1e6) as i64;
    for v in entries {
        let known = !st.scenario.unknown_field_ids.contains(&v.fieldId);
        let answer = match field(v.fieldId).filter(|_| known) {
            None => Answer::NotSupported,
            Some((f, read)) => {
                let scope = v.scopeId;
                flatten(st.scenario.read(gpu, f, t, |g| read(g, t, scope)))
            }
        };
        v.nvmlReturn = code(&answer);
        v.timestamp = stamp;
        v.latencyUsec = 0;
        if let Answer::Value(n) = answer {
            if typed_as_uint(v.fieldId) {
                v.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                v.value.uiVal = u32::try_from(n).unwrap_or(u32::MAX);
            } else {
                v.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                v.value.ullVal = n;
            }
        }
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// The pages retired for `cause` at `t`, or why there are none to tell.
fn retired(g: &Gpu, cause: nvmlPageRetirementCause_t, t: f64) -> Answer<u32> {
    let Some(r) = &g.retired_pages else {
        return Answer::NotSupported;
    };
    match cause {
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => {
            Answer::Value(to_u32(r.single_bit.at(t)))
        }
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => {
            Answer::Value(to_u32(r.double_bit.at(t)))
        }
        _ => Answer::InvalidArgument,
    }
}

/// Writes the count of retired pages (and, where asked, their addresses and times); a buffer
/// too small for them gets the count and `INSUFFICIENT_SIZE`.
unsafe fn retired_pages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    if count.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let (st, gpu, t) = match at_now(device) {
        Ok(found) => found,
        Err(e) => return e,
    };
    let n = match flatten(
        st.scenario
            .read(gpu, Field::RetiredPages, t, |g| retired(g, cause, t)),
    ) {
        Answer::Value(n) => n,
        other => return code(&other),
    };
    // SAFETY: non-null, and by NVML's contract valid for reads and writes.
    let room = *count;
    *count = n;
    if room < n {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for i in 0..n as usize {
        if !addresses.is_null() {
            // SAFETY: the caller's buffer holds `room` >= `n` entries.
            addresses.add(i).write(0x1000 * (i as u64 + 1));
        }
        if !timestamps.is_null() {
            // SAFETY: as above.
            timestamps.add(i).write((t * 1e6) as u64);
        }
    }
    nvmlReturn_enum_NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetRetiredPages");
    retired_pages(device, cause, page_count, addresses, std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    page_count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetRetiredPages_v2");
    retired_pages(device, cause, page_count, addresses, timestamps)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    is_pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetRetiredPagesPendingStatus");
    let mut pending = None;
    let rc = query(device, Field::RetiredPages, is_pending, |g, t| {
        pending = g.retired_pages.as_ref().map(|r| r.pending.at(t) >= 0.5);
        match pending {
            Some(true) => nvmlEnableState_enum_NVML_FEATURE_ENABLED,
            _ => nvmlEnableState_enum_NVML_FEATURE_DISABLED,
        }
    });
    if rc == nvmlReturn_enum_NVML_SUCCESS && pending.is_none() {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    }
    rc
}

/// The time the clocks were held down by one policy, in nanoseconds, since the driver loaded.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetViolationStatus(
    device: nvmlDevice_t,
    policy: nvmlPerfPolicyType_t,
    viol_time: *mut nvmlViolationTime_t,
) -> nvmlReturn_t {
    crate::calls::count("nvmlDeviceGetViolationStatus");
    // Power (0) to reliability (5); the totals over them are not played.
    let i = policy as usize;
    if i >= 6 {
        return match policy {
            nvmlPerfPolicyType_enum_NVML_PERF_POLICY_TOTAL_APP_CLOCKS
            | nvmlPerfPolicyType_enum_NVML_PERF_POLICY_TOTAL_BASE_CLOCKS => {
                nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
            }
            _ => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        };
    }
    query(device, Field::ClockEvents, viol_time, |g, t| {
        nvmlViolationTime_t {
            referenceTime: (t * 1e6).max(0.0) as u64,
            violationTime: (g.clock_event_seconds[i].at(t).max(0.0) * 1e9).round() as u64,
        }
    })
}
