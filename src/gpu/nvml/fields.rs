//! Field values: every reading NVML gives through `nvmlDeviceGetFieldValues`, asked for in one
//! call per GPU per cycle. That is the memory temperature, row remapping and the NVLink
//! counters (which have no other call), and the power, its enforced limit, energy, the volatile
//! ECC totals, the time the clocks were held down, PCIe replays and retired pages (which do).
//!
//! Each field answers on its own. A field the GPU answers "not supported" is asked no more:
//! a reading with a call of its own falls back to that call for good (said once, in the log),
//! as on a driver older than the field id; one without is recorded as unsupported (once, as
//! every optional reading is). A field that fails, or answers a negative or fractional value,
//! is counted and logged and left out: never 0.

use std::collections::HashSet;

use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, PerformancePolicy, RetirementCause,
};
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

/// A reading's own call, for a driver that has no field for it.
#[derive(Clone, Copy)]
enum Call {
    Power,
    PowerLimit,
    Energy,
    Ecc(MemoryError),
    Held(PerformancePolicy),
    PcieReplays,
    Retired(RetirementCause),
    RetiredPending,
}

impl Call {
    fn read(self, d: &Device<'static>) -> Result<u64, NvmlError> {
        match self {
            Call::Power => d.power_usage().map(u64::from),
            Call::PowerLimit => d.enforced_power_limit().map(u64::from),
            Call::Energy => d.total_energy_consumption(),
            Call::Ecc(kind) => d.total_ecc_errors(kind, EccCounter::Volatile),
            // NVML counts violation time in nanoseconds, as the fields do.
            Call::Held(policy) => d.violation_status(policy).map(|v| v.violation_time),
            Call::PcieReplays => d.pcie_replay_counter().map(u64::from),
            Call::Retired(cause) => d.retired_pages(cause).map(|pages| pages.len() as u64),
            Call::RetiredPending => d.are_pages_pending_retired().map(u64::from),
        }
    }

    /// Whether "not supported" from the call is recorded, and the reading asked no more (the
    /// readings a GPU may lack altogether), rather than asked again next cycle.
    fn optional(self) -> bool {
        matches!(
            self,
            Call::Held(_) | Call::PcieReplays | Call::Retired(_) | Call::RetiredPending
        )
    }
}

/// How the ids of one reading make its value.
#[derive(Clone, Copy)]
enum Pick {
    /// The first id, in order of preference, that the GPU has.
    First,
    /// Set (1) when any id is; every id must answer.
    Any,
}

/// One reading asked for as field values: its name (as logs and `gpu_reading_unsupported` give
/// it), its field ids and their scope, and its own call, if NVML has one.
struct Ask {
    reading: &'static str,
    ids: &'static [u32],
    scope: u32,
    pick: Pick,
    call: Option<Call>,
}

const fn ask(reading: &'static str, ids: &'static [u32], call: Option<Call>) -> Ask {
    Ask {
        reading,
        ids,
        scope: 0,
        pick: Pick::First,
        call,
    }
}

const fn held(reading: &'static str, ids: &'static [u32], policy: PerformancePolicy) -> Ask {
    ask(reading, ids, Some(Call::Held(policy)))
}

/// Where each reading is in `ASKS` (and in `Values`).
pub(super) mod at {
    pub const MEMORY_TEMPERATURE: usize = 0;
    pub const REMAPPED_CORRECTABLE: usize = 1;
    pub const REMAPPED_UNCORRECTABLE: usize = 2;
    pub const REMAP_PENDING: usize = 3;
    pub const REMAP_FAILED: usize = 4;
    pub const NVLINK_CRC_FLIT: usize = 5;
    pub const NVLINK_CRC_DATA: usize = 6;
    pub const NVLINK_REPLAY: usize = 7;
    pub const NVLINK_RECOVERY: usize = 8;
    pub const NVLINK_TX: usize = 9;
    pub const NVLINK_RX: usize = 10;
    pub const POWER: usize = 11;
    pub const POWER_LIMIT: usize = 12;
    pub const ENERGY: usize = 13;
    pub const ECC_CORRECTED: usize = 14;
    pub const ECC_UNCORRECTED: usize = 15;
    /// The six violation counters, power to reliability, from here on.
    pub const HELD: usize = 16;
    pub const PCIE_REPLAYS: usize = 22;
    pub const RETIRED_SINGLE_BIT: usize = 23;
    pub const RETIRED_DOUBLE_BIT: usize = 24;
    pub const RETIRED_PENDING: usize = 25;
}

const N: usize = 26;

/// Every reading asked for as field values, in `at`'s order.
const ASKS: [Ask; N] = [
    ask("memory_temperature", &[NVML_FI_DEV_MEMORY_TEMP], None),
    ask(
        "remapped_rows_correctable",
        &[NVML_FI_DEV_REMAPPED_COR],
        None,
    ),
    ask(
        "remapped_rows_uncorrectable",
        &[NVML_FI_DEV_REMAPPED_UNC],
        None,
    ),
    ask("row_remap_pending", &[NVML_FI_DEV_REMAPPED_PENDING], None),
    ask("row_remap_failed", &[NVML_FI_DEV_REMAPPED_FAILURE], None),
    ask(
        "nvlink_crc_flit_errors",
        &[NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL],
        None,
    ),
    ask(
        "nvlink_crc_data_errors",
        &[NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL],
        None,
    ),
    ask(
        "nvlink_replay_errors",
        &[NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL],
        None,
    ),
    ask(
        "nvlink_recovery_errors",
        &[NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL],
        None,
    ),
    Ask {
        scope: ALL_LINKS,
        ..ask(
            "nvlink_tx_bytes",
            &[NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX],
            None,
        )
    },
    Ask {
        scope: ALL_LINKS,
        ..ask(
            "nvlink_rx_bytes",
            &[NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX],
            None,
        )
    },
    // `nvmlDeviceGetPowerUsage` gives the power averaged over a second where the GPU has that
    // (Ampere but GA100, and later), and the instant power before: so do these, in this order.
    ask(
        "power",
        &[NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT],
        Some(Call::Power),
    ),
    ask(
        "power_limit",
        &[NVML_FI_DEV_POWER_CURRENT_LIMIT],
        Some(Call::PowerLimit),
    ),
    ask(
        "energy",
        &[NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION],
        Some(Call::Energy),
    ),
    ask(
        "ecc",
        &[NVML_FI_DEV_ECC_SBE_VOL_TOTAL],
        Some(Call::Ecc(MemoryError::Corrected)),
    ),
    ask(
        "ecc",
        &[NVML_FI_DEV_ECC_DBE_VOL_TOTAL],
        Some(Call::Ecc(MemoryError::Uncorrected)),
    ),
    held(
        "clock_events_power",
        &[NVML_FI_DEV_PERF_POLICY_POWER],
        PerformancePolicy::Power,
    ),
    held(
        "clock_events_thermal",
        &[NVML_FI_DEV_PERF_POLICY_THERMAL],
        PerformancePolicy::Thermal,
    ),
    held(
        "clock_events_sync_boost",
        &[NVML_FI_DEV_PERF_POLICY_SYNC_BOOST],
        PerformancePolicy::SyncBoost,
    ),
    held(
        "clock_events_board_limit",
        &[NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT],
        PerformancePolicy::BoardLimit,
    ),
    held(
        "clock_events_low_utilization",
        &[NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION],
        PerformancePolicy::LowUtilization,
    ),
    held(
        "clock_events_reliability",
        &[NVML_FI_DEV_PERF_POLICY_RELIABILITY],
        PerformancePolicy::Reliability,
    ),
    ask(
        "pcie_replays",
        &[NVML_FI_DEV_PCIE_REPLAY_COUNTER],
        Some(Call::PcieReplays),
    ),
    ask(
        "retired_pages",
        &[NVML_FI_DEV_RETIRED_SBE],
        Some(Call::Retired(RetirementCause::MultipleSingleBitEccErrors)),
    ),
    ask(
        "retired_pages",
        &[NVML_FI_DEV_RETIRED_DBE],
        Some(Call::Retired(RetirementCause::DoubleBitEccError)),
    ),
    // Pages pending retirement for either cause, as `nvmlDeviceGetRetiredPagesPendingStatus`.
    Ask {
        pick: Pick::Any,
        ..ask(
            "retired_pages",
            &[
                NVML_FI_DEV_RETIRED_PENDING_SBE,
                NVML_FI_DEV_RETIRED_PENDING_DBE,
            ],
            Some(Call::RetiredPending),
        )
    },
];

/// What the driver lacks, per GPU: the field ids it answered "not supported" for, and the
/// readings (by place in `ASKS`) read through their own calls instead. Forgotten when NVML is
/// initialised anew.
#[derive(Default)]
pub(super) struct Lacks {
    ids: HashSet<(u32, u32)>,
    by_call: HashSet<(u32, usize)>,
    /// The readings whose own call has been said (once) to stand in for their fields.
    said: HashSet<(u32, &'static str)>,
}

impl Lacks {
    pub(super) fn clear(&mut self) {
        self.ids.clear();
        self.by_call.clear();
        self.said.clear();
    }
}

/// This cycle's field values of one GPU, each a whole number, `None` where it is unknown.
pub(super) struct Values([Option<u64>; N]);

impl Values {
    pub(super) fn get(&self, at: usize) -> Option<u64> {
        self.0[at]
    }
}

/// What `health_readings` read of one GPU.
pub(super) struct Fields {
    pub(super) memory_temperature_celsius: Option<f64>,
    pub(super) memory_repair: MemoryRepair,
    pub(super) clock_events: ClockEvents,
    pub(super) nvlink: NvLinkCounters,
}

impl GpuReader<'_> {
    /// The memory temperature, memory repair, clock events and NVLink counters in `v`.
    pub(super) fn health_readings(&mut self, v: &Values) -> Fields {
        let count = |r: &mut Self, i: usize| r.check(ASKS[i].reading, v.get(i), |n| n < u64::MAX);
        let flag = |r: &mut Self, i: usize| {
            r.check(ASKS[i].reading, v.get(i), |n| n <= 1)
                .map(|n| n == 1)
        };
        let temp = self.check("memory_temperature", v.get(at::MEMORY_TEMPERATURE), |t| {
            t <= MAX_MEMORY_TEMPERATURE
        });
        let nvlink = NvLinkCounters {
            crc_flit_errors: count(self, at::NVLINK_CRC_FLIT),
            crc_data_errors: count(self, at::NVLINK_CRC_DATA),
            replay_errors: count(self, at::NVLINK_REPLAY),
            recovery_errors: count(self, at::NVLINK_RECOVERY),
            // NVML counts NVLink data in KiB.
            tx_bytes: count(self, at::NVLINK_TX).and_then(|k| k.checked_mul(1024)),
            rx_bytes: count(self, at::NVLINK_RX).and_then(|k| k.checked_mul(1024)),
        };
        let memory_repair = MemoryRepair {
            remapped_correctable: count(self, at::REMAPPED_CORRECTABLE),
            remapped_uncorrectable: count(self, at::REMAPPED_UNCORRECTABLE),
            remap_pending: flag(self, at::REMAP_PENDING),
            remap_failed: flag(self, at::REMAP_FAILED),
            retired_single_bit: v.get(at::RETIRED_SINGLE_BIT),
            retired_double_bit: v.get(at::RETIRED_DOUBLE_BIT),
            retired_pending: flag(self, at::RETIRED_PENDING),
        };
        // Nanoseconds, as seconds.
        let held = |i: usize| v.get(at::HELD + i).map(|ns| ns as f64 / 1e9);
        let clock_events = ClockEvents {
            power: held(0),
            thermal: held(1),
            sync_boost: held(2),
            board_limit: held(3),
            low_utilization: held(4),
            reliability: held(5),
        };
        Fields {
            memory_temperature_celsius: temp.map(|t| t as f64),
            memory_repair,
            clock_events,
            nvlink,
        }
    }

    /// Every reading of `ASKS` that the GPU has not said it lacks: the field values in one
    /// call, and the readings the driver has no field for through their own calls.
    pub(super) fn field_values(&mut self, nvml: &'static Nvml, d: &Device<'static>) -> Values {
        let mut out = Values([None; N]);
        // (reading, field id) of each entry asked.
        let mut asked: Vec<(usize, u32)> = Vec::new();
        for (i, a) in ASKS.iter().enumerate() {
            if !self.wanted(i) || self.src.lacks.by_call.contains(&(self.index, i)) {
                continue;
            }
            for &id in a.ids {
                if !self.src.lacks.ids.contains(&(self.index, id)) {
                    asked.push((i, id));
                }
            }
        }
        // `None`: the call failed (counted), and what it would have read is unknown this cycle.
        let mut answers: Option<Vec<Option<Answer>>> = self
            .ask(nvml, d, &asked)
            .map(|all| all.into_iter().map(Some).collect());
        for (i, a) in ASKS.iter().enumerate() {
            if !self.wanted(i) {
                continue;
            }
            if !self.src.lacks.by_call.contains(&(self.index, i)) {
                let Some(answers) = answers.as_mut() else {
                    continue;
                };
                let mine: Vec<(u32, Answer)> = asked
                    .iter()
                    .zip(answers.iter_mut())
                    .filter(|((j, _), _)| *j == i)
                    .filter_map(|((_, id), answer)| Some((*id, answer.take()?)))
                    .collect();
                match self.pick(a, mine) {
                    Picked::Value(v) => {
                        out.0[i] = v;
                        continue;
                    }
                    Picked::Lacking => self.fall_back(i),
                }
            }
            if self.src.lacks.by_call.contains(&(self.index, i)) {
                out.0[i] = self.by_call(d, i);
            }
        }
        out
    }

    /// Whether reading `i` is asked at all: not once the GPU is lost, nor once it is recorded
    /// unsupported.
    fn wanted(&self, i: usize) -> bool {
        self.lost.is_none()
            && !self
                .src
                .unsupported
                .contains(&(self.index, ASKS[i].reading))
    }

    /// The answers to `asked`, in one call; `None` if there are none to tell (nothing asked, or
    /// the call failed, which is counted). A library without field values leaves every reading
    /// to its own call.
    fn ask(
        &mut self,
        nvml: &'static Nvml,
        d: &Device<'static>,
        asked: &[(usize, u32)],
    ) -> Option<Vec<Answer>> {
        if asked.is_empty() {
            return None;
        }
        let mut raw: Vec<nvmlFieldValue_t> = asked
            .iter()
            .map(|&(i, id)| {
                // SAFETY: `nvmlFieldValue_t` is a plain C struct of integers and a union of
                // numbers, for which all zeroes is a valid value.
                let mut f: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                f.fieldId = id;
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
            Ok(()) => Some(
                raw.into_iter()
                    .map(|f| FieldValueSample::try_from(f).and_then(|s| s.value))
                    .collect(),
            ),
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                for &(i, id) in asked {
                    self.src.lacks.ids.insert((self.index, id));
                    if !self.src.lacks.by_call.contains(&(self.index, i)) {
                        self.fall_back(i);
                    }
                }
                None
            }
            Err(e) => {
                self.get("field_values", || Err::<(), _>(e));
                None
            }
        }
    }

    /// The value of reading `a` from its ids' answers (in its order of preference), or that the
    /// GPU lacks its fields. A failed field, or a bad value, is counted and logged.
    fn pick(&mut self, a: &Ask, answers: Vec<(u32, Answer)>) -> Picked {
        let mut values = Vec::new();
        let mut lacking = false;
        for (id, answer) in answers {
            match answer {
                Err(NvmlError::NotSupported) => {
                    self.src.lacks.ids.insert((self.index, id));
                    lacking = true;
                }
                Err(e) => return Picked::Value(self.get(a.reading, || Err::<u64, _>(e))),
                Ok(v) => match whole(&v) {
                    Some(n) => values.push(n),
                    None => {
                        self.src.bad_value(self.index, a.reading, format!("{v:?}"));
                        return Picked::Value(None);
                    }
                },
            }
            if matches!(a.pick, Pick::First) && !values.is_empty() {
                break;
            }
        }
        match a.pick {
            Pick::First => values
                .first()
                .map_or(Picked::Lacking, |&n| Picked::Value(Some(n))),
            Pick::Any if lacking || values.is_empty() => Picked::Lacking,
            Pick::Any => Picked::Value(values.iter().max().copied()),
        }
    }

    /// Reading `i` has no field on this GPU: its own call reads it from now on, or, without
    /// one, it is recorded unsupported.
    fn fall_back(&mut self, i: usize) {
        let a = &ASKS[i];
        if a.call.is_none() {
            self.src.unsupported.insert((self.index, a.reading));
        } else {
            self.src.lacks.by_call.insert((self.index, i));
        }
    }

    /// Reading `i` through its own call; the first time it answers, the log says so (once per
    /// GPU and reading).
    fn by_call(&mut self, d: &Device<'static>, i: usize) -> Option<u64> {
        let a = &ASKS[i];
        let call = a.call?;
        let v = if call.optional() {
            self.optional(a.reading, || call.read(d))
        } else {
            self.get(a.reading, || call.read(d))
        };
        if v.is_some() && self.src.lacks.said.insert((self.index, a.reading)) {
            tracing::info!(
                gpu = self.index,
                reading = a.reading,
                "NVML gives this GPU no field value for the reading; it is read through its own call from now on"
            );
        }
        v
    }
}

/// One field's answer.
type Answer = Result<SampleValue, NvmlError>;

/// What a reading's field answers gave.
enum Picked {
    /// Its value, or `None` where the answer failed or was bad.
    Value(Option<u64>),
    /// The GPU has none of its fields.
    Lacking,
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
