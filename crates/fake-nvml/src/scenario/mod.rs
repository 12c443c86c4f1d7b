//! Scenario files: parsing and the time-series engine.
//!
//! Everything here is pure: values are functions of the scenario and of the simulated time `t`
//! (seconds since the library was first initialised, times the speed factor). The C ABI in
//! `ffi` is the only place that reads the clock.
//!
//! This module holds the scenario itself, its faults and the answers they give; the GPUs and
//! their MIG devices and GPM metrics are in `devices`, values over time in `series`, and the
//! file's raw form and its validation in `parse`.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod amd;
mod devices;
mod parse;
mod series;
#[cfg(test)]
mod tests;

pub use amd::AmdGpu;
pub use devices::{Gpm, GpmMetric, Gpu, Mig, RetiredPages, THROTTLE_REASONS};
pub use series::{parse_trace, Series};

use parse::RawScenario;

/// A parsed, validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    /// The device count reported, if not the number of GPUs.
    pub device_count: Option<u32>,
    /// Field ids the driver does not know (answered "not supported" on every GPU).
    pub unknown_field_ids: Vec<u32>,
    /// Simulated seconds per wall-clock second. 0 freezes time at `start`.
    pub speed: f64,
    /// Simulated time at initialisation.
    pub start: f64,
    pub gpus: Vec<Gpu>,
    pub faults: Vec<Fault>,
    /// AMD GPUs, for the sysfs tree alone.
    pub amd: Vec<AmdGpu>,
}

/// The readings a fault can turn into `NVML_ERROR_NOT_SUPPORTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// PCI information.
    Identity,
    /// Supported event types (and so XID events).
    Events,
    Utilization,
    Memory,
    Temperature,
    Power,
    PowerLimit,
    Energy,
    Clocks,
    Throttle,
    Ecc,
    Processes,
    /// GPM: support, samples and metrics.
    Gpm,
    /// MIG device handles (`nvmlDeviceGetMigDeviceHandleByIndex`).
    Mig,
    /// MIG mode (`nvmlDeviceGetMigMode`).
    MigMode,
    /// Video encoder utilization.
    Encoder,
    /// Video decoder utilization.
    Decoder,
    /// The PCIe replay counter.
    PcieReplays,
    /// The PCIe link's generation and width, now and at most.
    PcieLink,
    /// The memory temperature (a field value).
    MemoryTemperature,
    /// Remapped rows, and a remap pending or failed (field values).
    RemappedRows,
    /// Retired pages and pages pending retirement.
    RetiredPages,
    /// Time the clocks were held down, by reason (violation counters).
    ClockEvents,
    /// NVLink error counters (field values).
    NvlinkErrors,
    /// NVLink data totals (field values).
    NvlinkBytes,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Every call for the GPU answers `NVML_ERROR_GPU_IS_LOST`.
    Lost,
    /// Calls for the named fields answer `NVML_ERROR_GPU_IS_LOST`: a GPU that falls off the bus
    /// partway through a cycle, after its identity was read.
    LostFor(BTreeSet<Field>),
    /// The named fields answer `NVML_ERROR_NOT_SUPPORTED`.
    NotSupported(BTreeSet<Field>),
    /// Calls for the named fields fail with `NVML_ERROR_UNKNOWN`.
    Fails(BTreeSet<Field>),
    /// Every device call sleeps this long (wall clock) before answering.
    Delay(Duration),
    /// One critical XID event with this code is delivered to event sets.
    Xid(u64),
    /// `nvmlInit` fails with `NVML_ERROR_DRIVER_NOT_LOADED`.
    InitFailure,
}

#[derive(Debug, Clone)]
pub struct Fault {
    /// Simulated seconds at which the fault begins.
    pub at: f64,
    /// Simulated seconds at which it ends; `None` is forever. Ignored for XID events.
    pub until: Option<f64>,
    /// The GPU index it applies to; `None` is every GPU.
    pub gpu: Option<u32>,
    pub kind: FaultKind,
}

impl Fault {
    pub fn active(&self, t: f64) -> bool {
        t >= self.at && self.until.is_none_or(|u| t < u)
    }

    fn applies_to(&self, gpu: u32) -> bool {
        self.gpu.is_none_or(|g| g == gpu)
    }
}

/// The answer of a device query: a value, or the NVML error to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<T> {
    Value(T),
    NotSupported,
    Lost,
    InvalidArgument,
    /// `NVML_ERROR_UNKNOWN`: a call that failed.
    Unknown,
}

impl Scenario {
    pub fn from_path(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            path: path.to_path_buf(),
            message: format!("cannot read: {e}"),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Scenario::parse(&text, base).map_err(|message| ScenarioError {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses scenario text; relative trace paths are resolved against `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Scenario, String> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| e.message().to_string())?;
        raw.validate(base)
    }

    /// Simulated time for `elapsed` wall-clock seconds since initialisation.
    pub fn sim_time(&self, elapsed: f64) -> f64 {
        self.start + elapsed * self.speed
    }

    pub fn init_fails(&self, t: f64) -> bool {
        self.faults
            .iter()
            .any(|f| f.kind == FaultKind::InitFailure && f.active(t))
    }

    /// The wall-clock delay every device call takes at `t`.
    pub fn delay(&self, gpu: u32, t: f64) -> Option<Duration> {
        self.faults
            .iter()
            .filter(|f| f.applies_to(gpu) && f.active(t))
            .find_map(|f| match f.kind {
                FaultKind::Delay(d) => Some(d),
                _ => None,
            })
    }

    pub fn is_lost(&self, gpu: u32, t: f64) -> bool {
        self.faults
            .iter()
            .any(|f| f.kind == FaultKind::Lost && f.applies_to(gpu) && f.active(t))
    }

    fn lost_for(&self, gpu: u32, field: Field, t: f64) -> bool {
        self.faults.iter().any(|f| match &f.kind {
            FaultKind::LostFor(fields) => {
                fields.contains(&field) && f.applies_to(gpu) && f.active(t)
            }
            _ => false,
        })
    }

    /// Whether calls for `field` fail (`NVML_ERROR_UNKNOWN`) at `t`.
    pub fn fails(&self, gpu: u32, field: Field, t: f64) -> bool {
        self.faults.iter().any(|f| match &f.kind {
            FaultKind::Fails(fields) => fields.contains(&field) && f.applies_to(gpu) && f.active(t),
            _ => false,
        })
    }

    /// Whether calls for `field` answer `NVML_ERROR_NOT_SUPPORTED` at `t`.
    pub fn unsupported(&self, gpu: u32, field: Field, t: f64) -> bool {
        self.faults.iter().any(|f| match &f.kind {
            FaultKind::NotSupported(fields) => {
                fields.contains(&field) && f.applies_to(gpu) && f.active(t)
            }
            _ => false,
        })
    }

    /// XID events, in order of time: `(at, gpu, xid)`.
    pub fn xid_events(&self) -> Vec<(f64, u32, u64)> {
        let mut events: Vec<(f64, u32, u64)> = Vec::new();
        for f in &self.faults {
            if let FaultKind::Xid(xid) = f.kind {
                match f.gpu {
                    Some(g) => events.push((f.at, g, xid)),
                    None => {
                        events.extend((0..self.gpus.len() as u32).map(|g| (f.at, g, xid)));
                    }
                }
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        events
    }

    /// Reads one field of one GPU at `t`, applying faults.
    pub fn read<T>(&self, gpu: u32, field: Field, t: f64, f: impl FnOnce(&Gpu) -> T) -> Answer<T> {
        let Some(g) = self.gpus.get(gpu as usize) else {
            return Answer::InvalidArgument;
        };
        if self.is_lost(gpu, t) || self.lost_for(gpu, field, t) {
            Answer::Lost
        } else if self.unsupported(gpu, field, t) {
            Answer::NotSupported
        } else if self.fails(gpu, field, t) {
            Answer::Unknown
        } else {
            Answer::Value(f(g))
        }
    }
}

/// Saturating conversion, so that a scenario can produce NVML's 0xFFFFFFFF sentinel.
pub fn to_u32(v: f64) -> u32 {
    v.round().clamp(0.0, u32::MAX as f64) as u32
}

/// The bytes a string answers through NVML: `\\xHH` (a backslash, `x` and two hex digits)
/// stands for the raw byte, so that a scenario can play a driver whose strings are not UTF-8.
pub fn raw_bytes(s: &str) -> std::borrow::Cow<'_, [u8]> {
    if !s.contains("\\x") {
        return std::borrow::Cow::Borrowed(s.as_bytes());
    }
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 2..i + 4)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (
            b[i],
            b.get(i + 1),
            hex.and_then(|h| u8::from_str_radix(h, 16).ok()),
        ) {
            (b'\\', Some(b'x'), Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A scenario file that could not be loaded.
#[derive(Debug, Clone)]
pub struct ScenarioError {
    pub path: PathBuf,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scenario {}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for ScenarioError {}
