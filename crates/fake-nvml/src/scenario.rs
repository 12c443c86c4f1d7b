//! Scenario files: parsing and the time-series engine.
//!
//! Everything here is pure: values are functions of the scenario and of the simulated time `t`
//! (seconds since the library was first initialised, times the speed factor). The C ABI in
//! `ffi.rs` is the only place that reads the clock.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A parsed, validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    /// Simulated seconds per wall-clock second. 0 freezes time at `start`.
    pub speed: f64,
    /// Simulated time at initialisation.
    pub start: f64,
    pub gpus: Vec<Gpu>,
    pub faults: Vec<Fault>,
}

#[derive(Debug, Clone)]
pub struct Gpu {
    pub name: String,
    pub uuid: String,
    pub pci_bus_id: String,
    pub memory_total_bytes: u64,
    pub power_limit_milliwatts: u32,
    /// Percent, as NVML reports it. Values above 100 are passed through unchanged.
    pub utilization: Series,
    pub memory_utilization: Series,
    pub memory_used_mib: Series,
    pub temperature: Series,
    pub power_watts: Series,
    pub sm_clock_mhz: Series,
    pub memory_clock_mhz: Series,
    pub processes: Series,
    pub process_name: String,
    pub ecc_corrected: Series,
    pub ecc_uncorrected: Series,
    /// NVML clock-throttle reason bits that this GPU supports.
    pub throttle_supported: u64,
    /// NVML clock-throttle reason bits that are active.
    pub throttle_active: u64,
    /// The GPU's MIG devices, over time; MIG mode is on when there are any.
    pub mig: Vec<Mig>,
    /// GPM metrics; `None`: the GPU does not support GPM.
    pub gpm: Option<Gpm>,
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

/// A value over simulated time.
#[derive(Debug, Clone, PartialEq)]
pub enum Series {
    Constant(f64),
    /// Linear from `from` to `to` over `over` seconds, starting at `start`, then holds `to`.
    Ramp {
        from: f64,
        to: f64,
        start: f64,
        over: f64,
    },
    /// `busy` for the first `duty` fraction of every `period`, `idle` for the rest.
    Bursts {
        busy: f64,
        idle: f64,
        period: f64,
        duty: f64,
    },
    /// Linear interpolation between `(t, value)` points; holds the last value after the end.
    Trace(Vec<(f64, f64)>),
    /// The number in a file, read at every call, so that a test can drive a reading directly
    /// (and await its effect) instead of racing a clock. Unreadable means 0.
    Live(std::path::PathBuf),
}

impl Series {
    pub fn at(&self, t: f64) -> f64 {
        match self {
            Series::Constant(v) => *v,
            Series::Ramp {
                from,
                to,
                start,
                over,
            } => {
                if t <= *start {
                    *from
                } else if t >= start + over {
                    *to
                } else {
                    from + (to - from) * (t - start) / over
                }
            }
            Series::Bursts {
                busy,
                idle,
                period,
                duty,
            } => {
                let phase = t.rem_euclid(*period) / period;
                if phase < *duty {
                    *busy
                } else {
                    *idle
                }
            }
            Series::Trace(points) => trace_at(points, t),
            Series::Live(path) => std::fs::read_to_string(path)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0),
        }
    }

    /// The integral of the series from 0 to `t` (value × seconds).
    pub fn integral(&self, t: f64) -> f64 {
        if t <= 0.0 {
            return 0.0;
        }
        match self {
            Series::Constant(v) => v * t,
            Series::Ramp {
                from,
                to,
                start,
                over,
            } => {
                let before = from * t.min(*start);
                let ramp_t = (t - start).clamp(0.0, *over);
                let during = from * ramp_t + (to - from) * ramp_t * ramp_t / (2.0 * over);
                let after = to * (t - start - over).max(0.0);
                before + during + after
            }
            Series::Bursts {
                busy,
                idle,
                period,
                duty,
            } => {
                let per_period = period * (duty * busy + (1.0 - duty) * idle);
                let whole = (t / period).floor();
                let rest = t - whole * period;
                let busy_part = rest.min(duty * period);
                whole * per_period + busy_part * busy + (rest - busy_part) * idle
            }
            Series::Trace(points) => trace_integral(points, t),
            // Not integrable after the fact: the current value over the whole time.
            Series::Live(_) => self.at(t) * t,
        }
    }
}

fn trace_at(points: &[(f64, f64)], t: f64) -> f64 {
    match points.iter().position(|(pt, _)| *pt > t) {
        None => points.last().map_or(0.0, |p| p.1),
        Some(0) => points[0].1,
        Some(i) => {
            let (t0, v0) = points[i - 1];
            let (t1, v1) = points[i];
            v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        }
    }
}

fn trace_integral(points: &[(f64, f64)], t: f64) -> f64 {
    let Some(&(first_t, first_v)) = points.first() else {
        return 0.0;
    };
    // Before the first point the trace holds its first value.
    let mut total = first_v * first_t.min(t);
    for pair in points.windows(2) {
        let (t0, v0) = pair[0];
        let (t1, _) = pair[1];
        if t <= t0 {
            return total;
        }
        let end = t.min(t1);
        let v_end = trace_at(points, end);
        total += (v0 + v_end) / 2.0 * (end - t0);
    }
    let (last_t, last_v) = points[points.len() - 1];
    total + last_v * (t - last_t).max(0.0)
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

impl Gpu {
    pub fn memory_used_bytes(&self, t: f64) -> u64 {
        let used = (self.memory_used_mib.at(t).max(0.0) * MIB) as u64;
        used.min(self.memory_total_bytes)
    }

    pub fn power_milliwatts(&self, t: f64) -> u32 {
        to_u32(self.power_watts.at(t) * 1000.0)
    }

    /// Energy since simulated time 0, in millijoules: the integral of power.
    pub fn energy_millijoules(&self, t: f64) -> u64 {
        (self.power_watts.integral(t) * 1000.0).max(0.0).round() as u64
    }

    pub fn process_count(&self, t: f64) -> u32 {
        to_u32(self.processes.at(t).round())
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Saturating conversion, so that a scenario can produce NVML's 0xFFFFFFFF sentinel.
pub fn to_u32(v: f64) -> u32 {
    v.round().clamp(0.0, u32::MAX as f64) as u32
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

// ---- raw form -------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default = "default_driver")]
    driver_version: String,
    nvml_version: Option<String>,
    #[serde(default = "default_cuda")]
    cuda_driver_version: i32,
    #[serde(default)]
    time: RawTime,
    #[serde(default)]
    gpu: Vec<RawGpu>,
    #[serde(default)]
    fault: Vec<RawFault>,
}

fn default_driver() -> String {
    "550.54.15".to_string()
}

fn default_cuda() -> i32 {
    12040
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTime {
    #[serde(default = "one")]
    speed: f64,
    #[serde(default)]
    start: Option<String>,
}

impl Default for RawTime {
    fn default() -> Self {
        RawTime {
            speed: 1.0,
            start: None,
        }
    }
}

fn one() -> f64 {
    1.0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    #[serde(default = "default_name")]
    name: String,
    uuid: Option<String>,
    pci_bus_id: Option<String>,
    #[serde(default = "default_memory")]
    memory_total_mib: u64,
    #[serde(default = "default_power_limit")]
    power_limit_watts: f64,
    utilization: Option<RawSeries>,
    memory_utilization: Option<RawSeries>,
    memory_used_mib: Option<RawSeries>,
    temperature: Option<RawSeries>,
    power_watts: Option<RawSeries>,
    sm_clock_mhz: Option<RawSeries>,
    memory_clock_mhz: Option<RawSeries>,
    processes: Option<RawSeries>,
    #[serde(default = "default_process_name")]
    process_name: String,
    ecc_corrected: Option<RawSeries>,
    ecc_uncorrected: Option<RawSeries>,
    #[serde(default = "default_throttle_supported")]
    throttle_supported: Vec<String>,
    #[serde(default)]
    throttle_active: Vec<String>,
    /// MIG devices by UUID alone (1g.10gb each); `mig` describes them fully.
    #[serde(default)]
    mig_devices: Vec<String>,
    #[serde(default)]
    mig: Vec<RawMig>,
    gpm: Option<RawGpm>,
}

fn default_name() -> String {
    "NVIDIA H100 80GB HBM3".to_string()
}

fn default_memory() -> u64 {
    81559
}

fn default_power_limit() -> f64 {
    700.0
}

fn default_process_name() -> String {
    "python3".to_string()
}

fn default_throttle_supported() -> Vec<String> {
    THROTTLE_REASONS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect()
}

/// NVML's clock-throttle reason bits, by the names scenarios use.
pub const THROTTLE_REASONS: &[(&str, u64)] = &[
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
];

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSeries {
    Value(f64),
    Shape(RawShape),
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RawShape {
    Constant {
        value: f64,
    },
    Ramp {
        from: f64,
        to: f64,
        over: String,
        #[serde(default)]
        start: Option<String>,
    },
    Bursts {
        busy: f64,
        idle: f64,
        period: String,
        duty: f64,
    },
    Trace {
        file: String,
    },
    Live {
        file: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    at: String,
    until: Option<String>,
    gpu: Option<u32>,
    kind: String,
    #[serde(default)]
    fields: Vec<Field>,
    delay: Option<String>,
    xid: Option<u64>,
}

fn secs(key: &str, text: &str) -> Result<f64, String> {
    humantime::parse_duration(text)
        .map(|d| d.as_secs_f64())
        .map_err(|e| format!("{key}: \"{text}\" is not a duration: {e}"))
}

impl RawScenario {
    fn validate(self, base: &Path) -> Result<Scenario, String> {
        if !(self.time.speed >= 0.0 && self.time.speed.is_finite()) {
            return Err(format!(
                "time.speed: \"{}\" must be a finite number >= 0",
                self.time.speed
            ));
        }
        let start = match &self.time.start {
            Some(s) => secs("time.start", s)?,
            None => 0.0,
        };
        let mut gpus = Vec::with_capacity(self.gpu.len());
        for (i, g) in self.gpu.into_iter().enumerate() {
            gpus.push(g.validate(i, base)?);
        }
        let mut faults = Vec::with_capacity(self.fault.len());
        for (i, f) in self.fault.into_iter().enumerate() {
            let key = format!("fault[{i}]");
            if let Some(g) = f.gpu {
                if g as usize >= gpus.len() {
                    return Err(format!("{key}.gpu: \"{g}\" is not a GPU of this scenario"));
                }
            }
            let kind = match f.kind.as_str() {
                "lost" if f.fields.is_empty() => FaultKind::Lost,
                "lost" => FaultKind::LostFor(f.fields.into_iter().collect()),
                "not_supported" => {
                    if f.fields.is_empty() {
                        return Err(format!("{key}.fields: a not_supported fault names fields"));
                    }
                    FaultKind::NotSupported(f.fields.into_iter().collect())
                }
                "fails" => {
                    if f.fields.is_empty() {
                        return Err(format!("{key}.fields: a fails fault names fields"));
                    }
                    FaultKind::Fails(f.fields.into_iter().collect())
                }
                "delay" => {
                    let text = f
                        .delay
                        .ok_or_else(|| format!("{key}.delay: a delay fault needs a delay"))?;
                    FaultKind::Delay(Duration::from_secs_f64(secs(
                        &format!("{key}.delay"),
                        &text,
                    )?))
                }
                "xid" => FaultKind::Xid(
                    f.xid
                        .ok_or_else(|| format!("{key}.xid: an xid fault needs an xid"))?,
                ),
                "init_failure" => FaultKind::InitFailure,
                other => {
                    return Err(format!(
                        "{key}.kind: \"{other}\" is not one of lost, not_supported, fails, delay, xid, init_failure"
                    ))
                }
            };
            faults.push(Fault {
                at: secs(&format!("{key}.at"), &f.at)?,
                until: match f.until {
                    Some(u) => Some(secs(&format!("{key}.until"), &u)?),
                    None => None,
                },
                gpu: f.gpu,
                kind,
            });
        }
        Ok(Scenario {
            nvml_version: self
                .nvml_version
                .unwrap_or_else(|| format!("12.{}", self.driver_version)),
            driver_version: self.driver_version,
            cuda_driver_version: self.cuda_driver_version,
            speed: self.time.speed,
            start,
            gpus,
            faults,
        })
    }
}

impl RawGpu {
    fn validate(self, i: usize, base: &Path) -> Result<Gpu, String> {
        let key = format!("gpu[{i}]");
        let series = |name: &str, raw: Option<RawSeries>, default: f64| -> Result<Series, String> {
            match raw {
                None => Ok(Series::Constant(default)),
                Some(r) => r.validate(&format!("{key}.{name}"), base),
            }
        };
        let bits = |name: &str, names: &[String]| -> Result<u64, String> {
            names.iter().try_fold(0u64, |acc, n| {
                THROTTLE_REASONS
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, b)| acc | b)
                    .ok_or_else(|| format!("{key}.{name}: \"{n}\" is not a throttle reason"))
            })
        };
        let limit_w = self.power_limit_watts;
        Ok(Gpu {
            uuid: self
                .uuid
                .unwrap_or_else(|| format!("GPU-00000000-0000-4000-8000-{:012x}", i + 1)),
            pci_bus_id: self
                .pci_bus_id
                .unwrap_or_else(|| format!("00000000:{:02X}:00.0", 0x18 + i * 0x10)),
            memory_total_bytes: self.memory_total_mib * 1024 * 1024,
            power_limit_milliwatts: to_u32(limit_w * 1000.0),
            utilization: series("utilization", self.utilization, 0.0)?,
            memory_utilization: series("memory_utilization", self.memory_utilization, 0.0)?,
            memory_used_mib: series("memory_used_mib", self.memory_used_mib, 0.0)?,
            temperature: series("temperature", self.temperature, 35.0)?,
            power_watts: series("power_watts", self.power_watts, limit_w * 0.1)?,
            sm_clock_mhz: series("sm_clock_mhz", self.sm_clock_mhz, 1980.0)?,
            memory_clock_mhz: series("memory_clock_mhz", self.memory_clock_mhz, 2619.0)?,
            processes: series("processes", self.processes, 0.0)?,
            ecc_corrected: series("ecc_corrected", self.ecc_corrected, 0.0)?,
            ecc_uncorrected: series("ecc_uncorrected", self.ecc_uncorrected, 0.0)?,
            throttle_supported: bits("throttle_supported", &self.throttle_supported)?,
            throttle_active: bits("throttle_active", &self.throttle_active)?,
            mig: {
                let mut mig = Vec::new();
                for (m, uuid) in self.mig_devices.into_iter().enumerate() {
                    mig.push(
                        RawMig {
                            uuid: Some(uuid),
                            profile: default_profile(),
                            ..RawMig::default()
                        }
                        .validate(
                            &format!("{key}.mig_devices[{m}]"),
                            i,
                            m,
                            base,
                        )?,
                    );
                }
                let from_list = mig.len();
                if from_list + self.mig.len() > MAX_MIG {
                    return Err(format!(
                        "{key}.mig: {} MIG devices; a GPU has at most {MAX_MIG}",
                        from_list + self.mig.len()
                    ));
                }
                for (m, raw) in self.mig.into_iter().enumerate() {
                    mig.push(raw.validate(&format!("{key}.mig[{m}]"), i, from_list + m, base)?);
                }
                mig
            },
            gpm: match self.gpm {
                Some(g) => Some(g.validate(&format!("{key}.gpm"), base)?),
                None => None,
            },
            process_name: self.process_name,
            name: self.name,
        })
    }
}

impl RawSeries {
    fn validate(self, key: &str, base: &Path) -> Result<Series, String> {
        Ok(match self {
            RawSeries::Value(v) | RawSeries::Shape(RawShape::Constant { value: v }) => {
                Series::Constant(v)
            }
            RawSeries::Shape(RawShape::Ramp {
                from,
                to,
                over,
                start,
            }) => {
                let over = secs(&format!("{key}.over"), &over)?;
                if over <= 0.0 {
                    return Err(format!("{key}.over: must be greater than zero"));
                }
                let start = match start {
                    Some(s) => secs(&format!("{key}.start"), &s)?,
                    None => 0.0,
                };
                Series::Ramp {
                    from,
                    to,
                    start,
                    over,
                }
            }
            RawSeries::Shape(RawShape::Bursts {
                busy,
                idle,
                period,
                duty,
            }) => {
                let period = secs(&format!("{key}.period"), &period)?;
                if period <= 0.0 {
                    return Err(format!("{key}.period: must be greater than zero"));
                }
                if !(0.0..=1.0).contains(&duty) {
                    return Err(format!("{key}.duty: \"{duty}\" is not between 0 and 1"));
                }
                Series::Bursts {
                    busy,
                    idle,
                    period,
                    duty,
                }
            }
            RawSeries::Shape(RawShape::Live { file }) => Series::Live(base.join(file)),
            RawSeries::Shape(RawShape::Trace { file }) => {
                let path = base.join(&file);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{key}.file: \"{file}\" cannot be read: {e}"))?;
                Series::Trace(
                    parse_trace(&text).map_err(|e| format!("{key}.file: \"{file}\": {e}"))?,
                )
            }
        })
    }
}

/// Parses a CSV trace of `seconds,value` lines. A header line and `#` comments are skipped.
pub fn parse_trace(text: &str) -> Result<Vec<(f64, f64)>, String> {
    let mut points = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut cols = line.split(',').map(str::trim);
        let (Some(t), Some(v)) = (cols.next(), cols.next()) else {
            return Err(format!("line {}: expected \"seconds,value\"", n + 1));
        };
        match (t.parse::<f64>(), v.parse::<f64>()) {
            (Ok(t), Ok(v)) => {
                if points.last().is_some_and(|&(pt, _)| t <= pt) {
                    return Err(format!("line {}: time \"{t}\" does not increase", n + 1));
                }
                points.push((t, v));
            }
            _ if points.is_empty() && n == 0 => continue, // header
            _ => return Err(format!("line {}: \"{line}\" is not two numbers", n + 1)),
        }
    }
    if points.is_empty() {
        return Err("no data points".to_string());
    }
    Ok(points)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_bytes_escapes() {
        assert_eq!(&*raw_bytes("H100"), b"H100");
        assert_eq!(&*raw_bytes("a\\xffb\\xFE"), b"a\xffb\xfe");
        assert_eq!(&*raw_bytes("\\xg0"), b"\\xg0");
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn gpm_metrics_are_means_over_the_interval() {
        let s = Scenario::parse(
            "[[gpu]]\n[gpu.gpm]\nsm_active = { kind = \"ramp\", from = 0, to = 100, over = \"100s\" }\n\
             pcie_tx_mib_per_second = 10\n[[gpu]]\n",
            Path::new("."),
        )
        .unwrap();
        let gpm = s.gpus[0].gpm.as_ref().unwrap();
        // A ramp's mean over [10, 30] is its value at 20.
        assert!((gpm.mean(GpmMetric::SmActive, 10.0, 30.0).unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(gpm.mean(GpmMetric::PcieTx, 0.0, 5.0), Some(10.0));
        // Unnamed metrics are not supported; a GPU without the table has no GPM.
        assert_eq!(gpm.mean(GpmMetric::TensorActive, 0.0, 5.0), None);
        assert!(s.gpus[1].gpm.is_none());
    }

    #[test]
    fn mig_devices_by_uuid_and_in_full() {
        let s = Scenario::parse(
            "[[gpu]]\nmig_devices = [\"MIG-a\"]\n[[gpu.mig]]\nprofile = \"3g.40gb\"\nfrom = \"10s\"\n",
            Path::new("."),
        )
        .unwrap();
        let mig = &s.gpus[0].mig;
        assert_eq!(mig.len(), 2);
        assert_eq!(
            (mig[0].uuid.as_str(), mig[0].profile.as_str()),
            ("MIG-a", "1g.10gb")
        );
        assert_eq!(mig[0].memory_total_bytes, 10 << 30);
        assert_eq!(
            (mig[1].gpu_instance, mig[1].memory_total_bytes),
            (2, 40 << 30)
        );
        assert!(!mig[1].exists(5.0) && mig[1].exists(10.0));
        let err = Scenario::parse("[[gpu]]\n[[gpu.mig]]\nprofile = \"big\"\n", Path::new("."))
            .unwrap_err();
        assert!(
            err.contains("gpu[0].mig[0].profile: \"big\" is not a MIG profile"),
            "{err}"
        );
    }

    #[test]
    fn series_values_over_time() {
        let cases: &[(Series, f64, f64)] = &[
            (Series::Constant(7.0), 123.0, 7.0),
            (
                Series::Ramp {
                    from: 80.0,
                    to: 0.0,
                    start: 10.0,
                    over: 40.0,
                },
                30.0,
                40.0,
            ),
            (
                Series::Ramp {
                    from: 80.0,
                    to: 0.0,
                    start: 10.0,
                    over: 40.0,
                },
                5.0,
                80.0,
            ),
            (
                Series::Ramp {
                    from: 80.0,
                    to: 0.0,
                    start: 10.0,
                    over: 40.0,
                },
                500.0,
                0.0,
            ),
            (
                Series::Bursts {
                    busy: 95.0,
                    idle: 2.0,
                    period: 60.0,
                    duty: 0.5,
                },
                29.0,
                95.0,
            ),
            (
                Series::Bursts {
                    busy: 95.0,
                    idle: 2.0,
                    period: 60.0,
                    duty: 0.5,
                },
                61.0 + 30.0,
                2.0,
            ),
            (Series::Trace(vec![(0.0, 10.0), (10.0, 20.0)]), 5.0, 15.0),
            (Series::Trace(vec![(0.0, 10.0), (10.0, 20.0)]), 50.0, 20.0),
        ];
        for (s, t, want) in cases {
            assert!(
                close(s.at(*t), *want),
                "{s:?} at {t}: {} != {want}",
                s.at(*t)
            );
        }
    }

    #[test]
    fn integrals_match_numeric_integration() {
        let series = [
            Series::Constant(300.0),
            Series::Ramp {
                from: 100.0,
                to: 500.0,
                start: 7.0,
                over: 33.0,
            },
            Series::Bursts {
                busy: 650.0,
                idle: 90.0,
                period: 17.0,
                duty: 0.3,
            },
            Series::Trace(vec![(2.0, 10.0), (5.0, 40.0), (9.0, 0.0)]),
        ];
        for s in &series {
            for t in [0.5, 3.0, 8.0, 41.0, 100.0] {
                let steps = 200_000;
                let dt = t / steps as f64;
                let numeric: f64 = (0..steps).map(|i| s.at((i as f64 + 0.5) * dt) * dt).sum();
                let exact = s.integral(t);
                assert!(
                    (numeric - exact).abs() < 1e-2 * (1.0 + exact.abs()) * 0.01,
                    "{s:?} to {t}: numeric {numeric} exact {exact}"
                );
            }
        }
    }

    #[test]
    fn parses_full_scenario_and_faults() {
        let text = r#"
            driver_version = "550.90.07"
            time = { speed = 60, start = "1h" }
            [[gpu]]
            utilization = { kind = "bursts", busy = 95, idle = 3, period = "10m", duty = 0.75 }
            power_watts = 350
            throttle_active = ["sw_power_cap"]
            [[gpu]]
            name = "NVIDIA A10G"
            temperature = { kind = "ramp", from = 40, to = 70, over = "30m" }
            [[fault]]
            at = "1h30m"
            gpu = 1
            kind = "lost"
            until = "2h"
            [[fault]]
            at = "10s"
            kind = "not_supported"
            fields = ["power", "ecc"]
        "#;
        let s = Scenario::parse(text, Path::new(".")).unwrap();
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.nvml_version, "12.550.90.07");
        assert_eq!(s.sim_time(60.0), 3600.0 + 3600.0);
        assert_eq!(s.gpus[0].throttle_active, 0x4);
        assert!(s.is_lost(1, 5400.0));
        assert!(!s.is_lost(1, 7200.0));
        assert!(!s.is_lost(0, 5400.0));
        assert_eq!(
            s.read(0, Field::Power, 11.0, |g| g.power_milliwatts(11.0)),
            Answer::NotSupported
        );
        assert_eq!(s.read(0, Field::Temperature, 11.0, |_| 1), Answer::Value(1));
        assert_eq!(
            s.read(0, Field::Power, 9.0, |g| g.power_milliwatts(9.0)),
            Answer::Value(350_000)
        );
        assert_eq!(s.read(5, Field::Power, 9.0, |_| 0), Answer::InvalidArgument);
    }

    #[test]
    fn rejects_bad_scenarios_naming_the_key() {
        let cases = [
            ("[[gpu]]\nutilization = { kind = \"bursts\", busy = 1, idle = 0, period = \"1m\", duty = 2 }", "gpu[0].utilization.duty: \"2\" is not between 0 and 1"),
            ("[[fault]]\nat = \"1s\"\nkind = \"explode\"", "fault[0].kind: \"explode\" is not one of lost, not_supported, fails, delay, xid, init_failure"),
            ("[[gpu]]\n[[fault]]\nat = \"soon\"\nkind = \"lost\"", "fault[0].at: \"soon\" is not a duration"),
            ("[[gpu]]\nthrottle_active = [\"hot\"]", "gpu[0].throttle_active: \"hot\" is not a throttle reason"),
        ];
        for (text, want) in cases {
            let err = Scenario::parse(text, Path::new(".")).unwrap_err();
            assert!(
                err.starts_with(want),
                "{err:?} does not start with {want:?}"
            );
        }
    }

    #[test]
    fn trace_csv_with_header() {
        let points = parse_trace("seconds,utilization\n0,10\n60,90\n").unwrap();
        assert_eq!(points, vec![(0.0, 10.0), (60.0, 90.0)]);
        assert!(parse_trace("0,1\n0,2\n")
            .unwrap_err()
            .contains("does not increase"));
    }
}

// ---- GPM ------------------------------------------------------------------------------------

/// A GPM metric a scenario can give a series (NVML's `nvmlGpmMetricId_t`, by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpmMetric {
    SmActive,
    SmOccupancy,
    GraphicsActive,
    TensorActive,
    DramActive,
    Fp64Active,
    Fp32Active,
    Fp16Active,
    IntegerActive,
    PcieTx,
    PcieRx,
    NvlinkTx,
    NvlinkRx,
}

/// A GPU's GPM metrics over simulated time, in NVML's units: percent for activities, MiB/s for
/// PCIe and NVLink. A GPU without a `gpm` table does not support GPM.
#[derive(Debug, Clone)]
pub struct Gpm {
    pub series: Vec<(GpmMetric, Series)>,
}

impl Gpm {
    /// The metric's mean over `[t1, t2]`, as NVML computes it from two samples; `None` for a
    /// metric the scenario does not name, which the driver reports as not supported.
    pub fn mean(&self, metric: GpmMetric, t1: f64, t2: f64) -> Option<f64> {
        let (_, s) = self.series.iter().find(|(m, _)| *m == metric)?;
        Some(if t2 > t1 {
            (s.integral(t2) - s.integral(t1)) / (t2 - t1)
        } else {
            s.at(t2)
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGpm {
    sm_active: Option<RawSeries>,
    sm_occupancy: Option<RawSeries>,
    graphics_active: Option<RawSeries>,
    tensor_active: Option<RawSeries>,
    dram_active: Option<RawSeries>,
    fp64_active: Option<RawSeries>,
    fp32_active: Option<RawSeries>,
    fp16_active: Option<RawSeries>,
    integer_active: Option<RawSeries>,
    pcie_tx_mib_per_second: Option<RawSeries>,
    pcie_rx_mib_per_second: Option<RawSeries>,
    nvlink_tx_mib_per_second: Option<RawSeries>,
    nvlink_rx_mib_per_second: Option<RawSeries>,
}

impl RawGpm {
    fn validate(self, key: &str, base: &Path) -> Result<Gpm, String> {
        use GpmMetric::*;
        let named = [
            ("sm_active", SmActive, self.sm_active),
            ("sm_occupancy", SmOccupancy, self.sm_occupancy),
            ("graphics_active", GraphicsActive, self.graphics_active),
            ("tensor_active", TensorActive, self.tensor_active),
            ("dram_active", DramActive, self.dram_active),
            ("fp64_active", Fp64Active, self.fp64_active),
            ("fp32_active", Fp32Active, self.fp32_active),
            ("fp16_active", Fp16Active, self.fp16_active),
            ("integer_active", IntegerActive, self.integer_active),
            (
                "pcie_tx_mib_per_second",
                PcieTx,
                self.pcie_tx_mib_per_second,
            ),
            (
                "pcie_rx_mib_per_second",
                PcieRx,
                self.pcie_rx_mib_per_second,
            ),
            (
                "nvlink_tx_mib_per_second",
                NvlinkTx,
                self.nvlink_tx_mib_per_second,
            ),
            (
                "nvlink_rx_mib_per_second",
                NvlinkRx,
                self.nvlink_rx_mib_per_second,
            ),
        ];
        let mut series = Vec::new();
        for (name, metric, raw) in named {
            if let Some(r) = raw {
                series.push((metric, r.validate(&format!("{key}.{name}"), base)?));
            }
        }
        Ok(Gpm { series })
    }
}

// ---- MIG ------------------------------------------------------------------------------------

/// The most MIG devices a scenario gives one GPU (over all its layouts): as many as gpuwatch
/// reads, and few enough for the handles to stay apart.
const MAX_MIG: usize = 16;

/// A MIG device of a GPU: a GPU instance (with one compute instance) of a profile, its memory
/// and processes, its GPM metrics, and when it exists (a layout change ends one and starts
/// others).
#[derive(Debug, Clone)]
pub struct Mig {
    pub uuid: String,
    /// Such as `3g.40gb`.
    pub profile: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub memory_total_bytes: u64,
    pub memory_used_mib: Series,
    pub processes: Series,
    pub gpm: Option<Gpm>,
    /// Simulated seconds from which it exists.
    pub from: f64,
    /// Simulated seconds at which it is destroyed; `None` is never.
    pub until: Option<f64>,
}

impl Mig {
    pub fn exists(&self, t: f64) -> bool {
        t >= self.from && self.until.is_none_or(|u| t < u)
    }

    pub fn memory_used_bytes(&self, t: f64) -> u64 {
        ((self.memory_used_mib.at(t).max(0.0) * MIB) as u64).min(self.memory_total_bytes)
    }

    pub fn process_count(&self, t: f64) -> u32 {
        to_u32(self.processes.at(t).round())
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMig {
    uuid: Option<String>,
    #[serde(default = "default_profile")]
    profile: String,
    gpu_instance: Option<u32>,
    #[serde(default)]
    compute_instance: u32,
    memory_total_mib: Option<u64>,
    memory_used_mib: Option<RawSeries>,
    processes: Option<RawSeries>,
    gpm: Option<RawGpm>,
    from: Option<String>,
    until: Option<String>,
}

fn default_profile() -> String {
    "1g.10gb".to_string()
}

impl RawMig {
    fn validate(self, key: &str, gpu: usize, m: usize, base: &Path) -> Result<Mig, String> {
        // "3g.40gb": 40 GiB of memory, unless the scenario says otherwise.
        let gb = self
            .profile
            .split_once('.')
            .and_then(|(_, mem)| mem.strip_suffix("gb")?.parse::<u64>().ok());
        let memory_total_mib = match (self.memory_total_mib, gb) {
            (Some(mib), _) => mib,
            (None, Some(gb)) => gb * 1024,
            (None, None) => {
                return Err(format!(
                    "{key}.profile: \"{}\" is not a MIG profile such as \"3g.40gb\"",
                    self.profile
                ))
            }
        };
        let series = |name: &str, raw: Option<RawSeries>| -> Result<Series, String> {
            match raw {
                None => Ok(Series::Constant(0.0)),
                Some(r) => r.validate(&format!("{key}.{name}"), base),
            }
        };
        Ok(Mig {
            uuid: self.uuid.unwrap_or_else(|| {
                format!("MIG-00000000-0000-4000-8000-{:06x}{:06x}", gpu + 1, m + 1)
            }),
            gpu_instance: self.gpu_instance.unwrap_or(m as u32 + 1),
            compute_instance: self.compute_instance,
            memory_total_bytes: memory_total_mib * 1024 * 1024,
            memory_used_mib: series("memory_used_mib", self.memory_used_mib)?,
            processes: series("processes", self.processes)?,
            gpm: match self.gpm {
                Some(g) => Some(g.validate(&format!("{key}.gpm"), base)?),
                None => None,
            },
            from: match &self.from {
                Some(f) => secs(&format!("{key}.from"), f)?,
                None => 0.0,
            },
            until: match &self.until {
                Some(u) => Some(secs(&format!("{key}.until"), u)?),
                None => None,
            },
            profile: self.profile,
        })
    }
}
