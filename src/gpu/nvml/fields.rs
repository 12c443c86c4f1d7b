//! The readings that tell a GPU's health and its memory's: the memory temperature, row
//! remapping, retired pages, time the clocks were held down, and the NVLink counters.
//!
//! nvml-wrapper has calls for the retired pages and the clock events, and these are read
//! through it. The rest are NVML field values, asked in one `nvmlDeviceGetFieldValues` call
//! per GPU; each field answers on its own, so one the GPU lacks is recorded as unsupported
//! (once, as every optional reading is) and the others still read.

use nvml_wrapper::enum_wrappers::device::{PerformancePolicy, RetirementCause};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::sys_exports::field_id::*;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlFieldValue_t;

use super::GpuReader;
use crate::gpu::{ClockEvents, MemoryRepair, NvLinkCounters};

/// A field's scope: the whole GPU, or (for NVLink throughput) every link at once.
const ALL_LINKS: u32 = u32::MAX;

/// The memory temperature a sensor can report; beyond is bad data.
const MAX_MEMORY_TEMPERATURE: u64 = 200;

/// One field value gpuwatch asks for: NVML's id, its scope, and its reading's name (as
/// `gpu_reading_unsupported` gives it). Each field has its own: a GPU may lack one NVLink
/// counter and have the others.
struct Ask {
    id: u32,
    scope: u32,
    reading: &'static str,
}

const fn ask(id: u32, reading: &'static str) -> Ask {
    Ask {
        id,
        scope: 0,
        reading,
    }
}

/// Every field value, in the order `Fields` reads them.
const ASKS: [Ask; 11] = [
    ask(NVML_FI_DEV_MEMORY_TEMP, "memory_temperature"),
    ask(NVML_FI_DEV_REMAPPED_COR, "remapped_rows_correctable"),
    ask(NVML_FI_DEV_REMAPPED_UNC, "remapped_rows_uncorrectable"),
    ask(NVML_FI_DEV_REMAPPED_PENDING, "row_remap_pending"),
    ask(NVML_FI_DEV_REMAPPED_FAILURE, "row_remap_failed"),
    ask(
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        "nvlink_crc_flit_errors",
    ),
    ask(
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        "nvlink_crc_data_errors",
    ),
    ask(
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        "nvlink_replay_errors",
    ),
    ask(
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        "nvlink_recovery_errors",
    ),
    Ask {
        id: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        scope: ALL_LINKS,
        reading: "nvlink_tx_bytes",
    },
    Ask {
        id: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        scope: ALL_LINKS,
        reading: "nvlink_rx_bytes",
    },
];

/// What `health_readings` read of one GPU.
pub(super) struct Fields {
    pub(super) memory_temperature_celsius: Option<f64>,
    pub(super) memory_repair: MemoryRepair,
    pub(super) clock_events: ClockEvents,
    pub(super) nvlink: NvLinkCounters,
}

impl GpuReader<'_> {
    /// The memory temperature, memory repair, clock events and NVLink counters of GPU `d`.
    pub(super) fn health_readings(&mut self, nvml: &'static Nvml, d: &Device<'static>) -> Fields {
        let v = self.field_values(nvml, d);
        let count = |r: &mut Self, i: usize| r.check(ASKS[i].reading, v[i], |n| n < u64::MAX);
        let flag =
            |r: &mut Self, i: usize| r.check(ASKS[i].reading, v[i], |n| n <= 1).map(|n| n == 1);
        let temp = self.check("memory_temperature", v[0], |t| t <= MAX_MEMORY_TEMPERATURE);
        let remapped_correctable = count(self, 1);
        let remapped_uncorrectable = count(self, 2);
        let remap_pending = flag(self, 3);
        let remap_failed = flag(self, 4);
        let nvlink = NvLinkCounters {
            crc_flit_errors: count(self, 5),
            crc_data_errors: count(self, 6),
            replay_errors: count(self, 7),
            recovery_errors: count(self, 8),
            // NVML counts NVLink data in KiB.
            tx_bytes: count(self, 9).and_then(|k| k.checked_mul(1024)),
            rx_bytes: count(self, 10).and_then(|k| k.checked_mul(1024)),
        };

        let retired = |r: &mut Self, cause| {
            r.optional("retired_pages", || d.retired_pages(cause))
                .map(|pages| pages.len() as u64)
        };
        let retired_single_bit = retired(self, RetirementCause::MultipleSingleBitEccErrors);
        let retired_double_bit = retired(self, RetirementCause::DoubleBitEccError);
        let retired_pending = self.optional("retired_pages", || d.are_pages_pending_retired());

        // NVML counts violation time in nanoseconds.
        let mut held = |policy, reading| {
            self.optional(reading, || d.violation_status(policy))
                .map(|v| v.violation_time as f64 / 1e9)
        };
        let clock_events = ClockEvents {
            power: held(PerformancePolicy::Power, "clock_events_power"),
            thermal: held(PerformancePolicy::Thermal, "clock_events_thermal"),
            sync_boost: held(PerformancePolicy::SyncBoost, "clock_events_sync_boost"),
            board_limit: held(PerformancePolicy::BoardLimit, "clock_events_board_limit"),
            low_utilization: held(
                PerformancePolicy::LowUtilization,
                "clock_events_low_utilization",
            ),
            reliability: held(PerformancePolicy::Reliability, "clock_events_reliability"),
        };

        Fields {
            memory_temperature_celsius: temp.map(|t| t as f64),
            memory_repair: MemoryRepair {
                remapped_correctable,
                remapped_uncorrectable,
                remap_pending,
                remap_failed,
                retired_single_bit,
                retired_double_bit,
                retired_pending,
            },
            clock_events,
            nvlink,
        }
    }

    /// Every field value of `ASKS` that the GPU has not said it lacks, in one call: each as a
    /// whole number, `None` where it is unknown. A field answering "not supported" is recorded
    /// once and not asked again; one that fails, or answers a negative or fractional value, is
    /// counted and logged.
    fn field_values(&mut self, nvml: &'static Nvml, d: &Device<'static>) -> [Option<u64>; 11] {
        let mut out = [None; 11];
        let wanted: Vec<usize> = (0..ASKS.len())
            .filter(|&i| {
                !self
                    .src
                    .unsupported
                    .contains(&(self.index, ASKS[i].reading))
            })
            .collect();
        if wanted.is_empty() || self.lost.is_some() {
            return out;
        }
        let mut raw: Vec<nvmlFieldValue_t> = wanted
            .iter()
            .map(|&i| {
                // SAFETY: `nvmlFieldValue_t` is a plain C struct of integers and a union of
                // numbers, for which all zeroes is a valid value.
                let mut f: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                f.fieldId = ASKS[i].id;
                f.scopeId = ASKS[i].scope;
                f
            })
            .collect();
        // nvml-wrapper's `field_values_for` cannot set a field's scope, which the NVLink
        // throughput needs (every link, not link 0); the ids asked are all below the range it
        // renumbers for newer drivers, so the raw call asks exactly what it would.
        let mut call = || -> Result<(), NvmlError> {
            let sym = nvml_sym(nvml.lib().nvmlDeviceGetFieldValues.as_ref())?;
            // SAFETY: the device handle is live for the library's life, and the call writes
            // only into the `raw.len()` entries it is given.
            unsafe { nvml_try(sym(d.handle(), raw.len() as i32, raw.as_mut_ptr())) }
        };
        match call() {
            Ok(()) => {}
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                for &i in &wanted {
                    self.src.unsupported.insert((self.index, ASKS[i].reading));
                }
                return out;
            }
            Err(e) => {
                self.get("field_values", || Err::<(), _>(e));
                return out;
            }
        }
        for (&i, f) in wanted.iter().zip(raw) {
            let reading = ASKS[i].reading;
            let value = FieldValueSample::try_from(f).and_then(|s| s.value);
            out[i] = match value {
                Err(NvmlError::NotSupported) => {
                    self.src.unsupported.insert((self.index, reading));
                    None
                }
                Err(e) => self.get(reading, || Err::<u64, _>(e)),
                Ok(v) => match whole(&v) {
                    Some(n) => Some(n),
                    None => {
                        self.src.bad_value(self.index, reading, format!("{v:?}"));
                        None
                    }
                },
            };
        }
        out
    }
}

/// A field value as a whole, non-negative number.
fn whole(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U32(n) => Some(u64::from(n)),
        SampleValue::U64(n) => Some(n),
        SampleValue::I64(n) => u64::try_from(n).ok(),
        SampleValue::F64(x) if x.is_finite() && x >= 0.0 && x.fract() == 0.0 => Some(x as u64),
        SampleValue::F64(_) => None,
    }
}
