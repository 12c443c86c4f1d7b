//! The real GPU source: NVML through nvml-wrapper.
//!
//! Runs on the sampler's NVML thread only. Every reading is checked: a failure, a
//! "not supported" or an out-of-range value leaves the field `None`, and failures and bad
//! values are counted in `gpuwatch_sample_errors_total{kind}`.

mod fields;
mod known;
mod links;
mod mig;
mod processes;
mod throttle;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::MemoryInfo;
use nvml_wrapper::{cuda_driver_version_major, cuda_driver_version_minor, Device, Nvml};

use super::counters::{SampleError, SamplerCounters};
use super::xid::{self, XidCounts};
use super::{GpuSample, GpuSource, NvmlStatus, Sample};
use fields::at;
use known::{Facts, Known};

pub use known::SLOW_INTERVAL;

/// The most MIG devices read from one GPU (a GPU has at most 7).
const MAX_MIG_DEVICES: u32 = 16;
/// The most GPUs read: a library that reports more is not believed (it would have the sampler
/// allocate and read without bound).
pub(crate) const MAX_GPUS: u32 = 1024;

/// Retry delays for a library that will not load or initialise.
const INIT_BACKOFF_FIRST: Duration = Duration::from_secs(1);
const INIT_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Values beyond these are treated as garbage from the driver, not as readings.
const MAX_TEMPERATURE_CELSIUS: u32 = 200;
const MAX_POWER_MILLIWATTS: u32 = 10_000_000;
const MAX_CLOCK_MHZ: u32 = 20_000;

pub struct NvmlSource {
    library: OsString,
    per_process: bool,
    /// List each GPU's (and MIG device's) processes, for who holds it.
    pids: bool,
    watch_xid: bool,
    metrics: Arc<SamplerCounters>,
    nvml: Option<&'static Nvml>,
    versions: Versions,
    next_init: Instant,
    backoff: Duration,
    last_init_error: Option<String>,
    /// NVML initialised at least once since the start.
    ever_up: bool,
    /// The last failure to initialise was a missing library or driver.
    missing: bool,
    xids: Arc<XidCounts>,
    /// Identity fields seen per index, each kept the moment it is read, so that a GPU lost
    /// later (even later in its first cycle) keeps its identity.
    identities: HashMap<u32, Identity>,
    /// (GPU, field) pairs already logged as bad, so that a broken sensor logs once.
    logged: HashSet<(u32, &'static str)>,
    /// (GPU, reading) pairs that NVML answered "not supported" for (or whose call the library
    /// lacks): each is recorded once and not asked for again until NVML is initialised anew.
    unsupported: HashSet<(u32, &'static str)>,
    /// GPM sample buffers, per GPU that supports GPM.
    gpm: super::gpm::Gpm,
    /// Each GPU's handle, and what it has said of itself, by index: asked once, not every
    /// cycle.
    known: HashMap<u32, Known>,
    /// The field ids the driver lacks, and the readings read through their own calls instead.
    lacks: fields::Lacks,
    /// How often the slow readings are read.
    slow_interval: Duration,
}

/// What identifies a GPU; each field is kept once read.
#[derive(Default, Clone)]
struct Identity {
    uuid: Option<String>,
    name: Option<String>,
    pci_bus_id: Option<String>,
}

#[derive(Default, Clone)]
struct Versions {
    driver: Option<String>,
    nvml: Option<String>,
    cuda: Option<String>,
}

impl NvmlSource {
    pub fn new(
        library: impl Into<OsString>,
        per_process: bool,
        metrics: Arc<SamplerCounters>,
    ) -> Self {
        NvmlSource {
            library: library.into(),
            per_process,
            pids: false,
            watch_xid: true,
            metrics,
            nvml: None,
            versions: Versions::default(),
            next_init: Instant::now(),
            backoff: INIT_BACKOFF_FIRST,
            last_init_error: None,
            ever_up: false,
            missing: false,
            xids: Arc::new(XidCounts::default()),
            identities: HashMap::new(),
            logged: HashSet::new(),
            unsupported: HashSet::new(),
            gpm: super::gpm::Gpm::default(),
            known: HashMap::new(),
            lacks: fields::Lacks::default(),
            slow_interval: SLOW_INTERVAL,
        }
    }

    /// Reads the slow readings (the PCIe link now; MIG mode while it is off) this often.
    pub fn with_slow_interval(mut self, every: Duration) -> Self {
        self.slow_interval = every;
        self
    }

    /// Lists the processes of every GPU and MIG device (their pids and memory), even without
    /// per-process memory: who holds a GPU is read from them.
    pub fn with_pids(mut self, pids: bool) -> Self {
        self.pids = pids;
        self
    }

    /// Does not start the XID thread (for one-shot use, such as `gpuwatch snapshot`).
    pub fn without_xid(mut self) -> Self {
        self.watch_xid = false;
        self
    }

    fn library_display(&self) -> String {
        self.library.to_string_lossy().into_owned()
    }

    fn status(&self, up: bool, error: Option<String>) -> NvmlStatus {
        NvmlStatus {
            up,
            library: self.library_display(),
            driver_version: self.versions.driver.clone(),
            nvml_version: self.versions.nvml.clone(),
            cuda_driver_version: self.versions.cuda.clone(),
            error,
            absent: false,
        }
    }

    /// Loads and initialises the library, at most once per backoff step.
    fn ensure_init(&mut self) -> Result<&'static Nvml, String> {
        if let Some(nvml) = self.nvml {
            return Ok(nvml);
        }
        if Instant::now() < self.next_init {
            return Err(self.last_init_error.clone().unwrap_or_default());
        }
        match Nvml::builder().lib_path(&self.library).init() {
            Ok(nvml) => {
                // The library stays loaded for the life of the process; device handles and the
                // XID thread borrow it.
                let nvml: &'static Nvml = Box::leak(Box::new(nvml));
                self.versions = Versions {
                    driver: nvml.sys_driver_version().ok(),
                    nvml: nvml.sys_nvml_version().ok(),
                    cuda: nvml.sys_cuda_driver_version().ok().map(|v| {
                        format!(
                            "{}.{}",
                            cuda_driver_version_major(v),
                            cuda_driver_version_minor(v)
                        )
                    }),
                };
                tracing::info!(
                    library = %self.library_display(),
                    driver = self.versions.driver.as_deref().unwrap_or("unknown"),
                    nvml = self.versions.nvml.as_deref().unwrap_or("unknown"),
                    cuda = self.versions.cuda.as_deref().unwrap_or("unknown"),
                    "NVML initialised"
                );
                self.nvml = Some(nvml);
                self.ever_up = true;
                // A new driver may support what the old one did not, and its handles are new.
                self.unsupported.clear();
                self.lacks.clear();
                self.known.clear();
                self.last_init_error = None;
                self.backoff = INIT_BACKOFF_FIRST;
                if self.watch_xid {
                    xid::spawn(nvml, Arc::clone(&self.xids), Arc::clone(&self.metrics));
                }
                Ok(nvml)
            }
            Err(e) => {
                let msg = init_error_text(&e);
                self.missing = matches!(
                    e,
                    NvmlError::LibloadingError(_) | NvmlError::DriverNotLoaded
                );
                self.metrics.error(SampleError::NvmlInit);
                if self.last_init_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(
                        "NVML unavailable: cannot initialise \"{}\": {msg}; serving gpuwatch_nvml_up 0 and retrying with backoff (up to {}s)",
                        self.library_display(),
                        INIT_BACKOFF_MAX.as_secs()
                    );
                } else {
                    tracing::debug!(error = %msg, "NVML still unavailable");
                }
                self.last_init_error = Some(msg.clone());
                self.next_init = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(INIT_BACKOFF_MAX);
                Err(msg)
            }
        }
    }

    fn bad_value(&mut self, gpu: u32, field: &'static str, value: impl std::fmt::Display) {
        self.metrics.error(SampleError::OutOfRange);
        if self.logged.insert((gpu, field)) {
            tracing::warn!(gpu, field, value = %value, "NVML returned an out-of-range value; the reading is left out");
        }
    }

    fn read_failed(&mut self, gpu: u32, field: &'static str, e: &NvmlError) {
        self.metrics.error(SampleError::ReadFailed);
        if self.logged.insert((gpu, field)) {
            tracing::warn!(gpu, field, error = %e, "NVML read failed; the reading is left out");
        }
    }

    /// Reads GPU `index` through the handle it was opened with (opened now, the first time
    /// or after it stopped answering).
    fn read_gpu(&mut self, nvml: &'static Nvml, index: u32) -> GpuSample {
        let Known { device, facts } = match self.known.remove(&index) {
            Some(known) => known,
            None => match nvml.device_by_index(index) {
                Ok(device) => Known {
                    device,
                    facts: Facts::default(),
                },
                Err(e) => return self.unreachable(index, &e),
            },
        };
        let mut r = GpuReader {
            src: self,
            index,
            lost: None,
            facts,
        };
        let sample = r.read_all(nvml, &device);
        let (lost, facts) = (r.lost, r.facts);
        match lost {
            Some(e) => self.unreachable(index, &e),
            None => {
                self.known.insert(index, Known { device, facts });
                sample
            }
        }
    }

    /// The sample of a GPU that answered `GPU_IS_LOST` (or could not be opened): `up` is false
    /// and it carries nothing but its identity, as far as it was ever read.
    fn unreachable(&mut self, index: u32, e: &NvmlError) -> GpuSample {
        let kind = if matches!(e, NvmlError::GpuLost) {
            SampleError::GpuLost
        } else {
            SampleError::ReadFailed
        };
        self.metrics.error(kind);
        if self.logged.insert((index, "device")) {
            tracing::error!(gpu = index, error = %e, "GPU unreachable; gpu_up is 0 until it answers again");
        }
        // Its GPM buffers are freed: a GPU that comes back starts over.
        self.gpm.forget(index);
        let id = self.identities.get(&index).cloned().unwrap_or_default();
        let xids = self.xids.for_gpu(index);
        GpuSample {
            index,
            uuid: id.uuid.unwrap_or_default(),
            name: id.name,
            pci_bus_id: id.pci_bus_id,
            up: false,
            // Fallen off the bus; any other failure to reach it says nothing of its health.
            lost: matches!(kind, SampleError::GpuLost),
            xid_errors: xids.0,
            last_xid: xids.1,
            mig_uuids: Vec::new(),
            mig_unread: 0,
            ..GpuSample::default()
        }
    }
}

impl NvmlSource {
    /// Whether the node has no NVIDIA driver at all: NVML never came up, for want of its
    /// library or driver.
    pub fn never_present(&self) -> bool {
        !self.ever_up && self.missing
    }
}

impl GpuSource for NvmlSource {
    fn sample(&mut self) -> Sample {
        let nvml = match self.ensure_init() {
            Ok(n) => n,
            Err(e) => {
                return Sample {
                    nvml: self.status(false, Some(e)),
                    gpus: Vec::new(),
                }
            }
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                self.metrics.error(SampleError::ReadFailed);
                return Sample {
                    nvml: self.status(false, Some(format!("cannot count devices: {e}"))),
                    gpus: Vec::new(),
                };
            }
        };
        if count > MAX_GPUS {
            self.metrics.error(SampleError::ReadFailed);
            return Sample {
                nvml: self.status(
                    false,
                    Some(format!(
                        "NVML reports {count} devices, more than the {MAX_GPUS} gpuwatch reads"
                    )),
                ),
                gpus: Vec::new(),
            };
        }
        self.gpm.retain_below(count);
        self.known.retain(|&i, _| i < count);
        let gpus = (0..count).map(|i| self.read_gpu(nvml, i)).collect();
        self.metrics.set_gpm_buffers(self.gpm.buffers());
        Sample {
            nvml: self.status(true, None),
            gpus,
        }
    }
}

/// Reads one GPU, stopping at the first `GPU_IS_LOST`.
struct GpuReader<'a> {
    src: &'a mut NvmlSource,
    index: u32,
    lost: Option<NvmlError>,
    /// What this GPU has said of itself, kept across cycles.
    facts: Facts,
}

impl GpuReader<'_> {
    /// Runs one NVML call unless the GPU is already known lost. "Not supported" is a normal
    /// absence and is not counted; other failures are.
    fn get<T>(
        &mut self,
        field: &'static str,
        call: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.lost.is_some() {
            return None;
        }
        match call() {
            Ok(v) => Some(v),
            Err(NvmlError::NotSupported) => None,
            Err(NvmlError::GpuLost) => {
                self.lost = Some(NvmlError::GpuLost);
                None
            }
            Err(e) => {
                self.src.read_failed(self.index, field, &e);
                None
            }
        }
    }

    /// Keeps `v` when `ok(v)`, otherwise counts and logs it as out of range.
    fn check<T: std::fmt::Display + Copy>(
        &mut self,
        field: &'static str,
        v: Option<T>,
        ok: impl FnOnce(T) -> bool,
    ) -> Option<T> {
        match v {
            Some(v) if ok(v) => Some(v),
            Some(v) => {
                self.src.bad_value(self.index, field, v);
                None
            }
            None => None,
        }
    }

    /// GPM support and the metrics since the last cycle, of the GPU or of one of its GPU
    /// instances. A failed call leaves the metrics absent this cycle, and is counted and logged
    /// (once).
    fn read_gpm(
        &mut self,
        nvml: &'static Nvml,
        d: &Device<'static>,
        instance: Option<(u32, &str)>,
    ) -> (Option<bool>, Option<super::gpm::GpmReadings>) {
        use super::gpm::{Gpm, Read};
        if self.lost.is_some() {
            return (None, None);
        }
        // Support is asked until the GPU answers, then kept.
        let supported = match self.facts.gpm {
            Some(s) => Ok(s),
            None => Gpm::support(d).inspect(|&s| self.facts.gpm = Some(s)),
        };
        let read = match supported {
            Ok(true) => self.src.gpm.read(nvml, d, self.index, instance),
            Ok(false) => {
                self.src.gpm.forget(self.index);
                Read::Unsupported
            }
            Err(e) => {
                self.src.gpm.forget(self.index);
                Read::Failed("gpm_support", e)
            }
        };
        match read {
            Read::Unsupported => (Some(false), None),
            Read::Metrics(m) => (Some(true), m),
            Read::Failed(_, NvmlError::GpuLost) => {
                self.lost = Some(NvmlError::GpuLost);
                (None, None)
            }
            // In MIG mode a GPU may have GPM for its instances only.
            Read::Failed("gpm_sample", NvmlError::NotSupported) => (Some(true), None),
            Read::Failed(field, e) => {
                self.src.read_failed(self.index, field, &e);
                (Some(true), None)
            }
        }
    }

    fn read_all(&mut self, nvml: &'static Nvml, d: &Device<'static>) -> GpuSample {
        let index = self.index;
        let (uuid, name, pci_bus_id) = self.identity(d);
        let (mut mig, mig_unread) = self.mig_devices(nvml, d);
        self.instance_gpm(nvml, d, &mut mig);
        let mig_uuids = mig.iter().map(|m| m.uuid.clone()).collect();

        let util = self.get("utilization", || d.utilization_rates());
        let gpu_util = self.check("utilization", util.as_ref().map(|u| u.gpu), |v| v <= 100);
        let mem_util = self.check("memory_utilization", util.as_ref().map(|u| u.memory), |v| {
            v <= 100
        });
        let memory = self.memory(d);

        let temp = self.get("temperature", || d.temperature(TemperatureSensor::Gpu));
        let temp = self.check("temperature", temp, |v| v <= MAX_TEMPERATURE_CELSIUS);
        let v = self.field_values(nvml, d);
        let max_power = u64::from(MAX_POWER_MILLIWATTS);
        let power = self.check("power", v.get(at::POWER), |p| p <= max_power);
        let limit = v.get(at::POWER_LIMIT);
        let limit = self.check("power_limit", limit, |p| p > 0 && p <= max_power);
        let energy = self.check("energy", v.get(at::ENERGY), |e| e != u64::MAX);
        let sm = self.get("sm_clock", || d.clock_info(Clock::SM));
        let sm = self.check("sm_clock", sm, |v| v <= MAX_CLOCK_MHZ);
        let mem_clock = self.get("memory_clock", || d.clock_info(Clock::Memory));
        let mem_clock = self.check("memory_clock", mem_clock, |v| v <= MAX_CLOCK_MHZ);

        let links = self.engines_and_links(d);
        let health = self.health_readings(&v);
        let throttle_reasons = self.throttle_reasons(d);
        let ecc_corrected = self.check("ecc", v.get(at::ECC_CORRECTED), |n| n != u64::MAX);
        let ecc_uncorrected = self.check("ecc", v.get(at::ECC_UNCORRECTED), |n| n != u64::MAX);
        let processes = self.processes(nvml, d);
        let (gpm_supported, gpm) = self.read_gpm(nvml, d, None);

        let xids = self.src.xids.for_gpu(index);
        GpuSample {
            index,
            vendor: super::Vendor::Nvidia,
            up: true,
            gpm_supported,
            gpm,
            mig,
            xid_errors: xids.0,
            last_xid: xids.1,
            mig_uuids,
            mig_unread,
            uuid,
            name,
            pci_bus_id,
            utilization_ratio: gpu_util.map(percent_ratio),
            memory_utilization_ratio: mem_util.map(percent_ratio),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_free_bytes: memory.as_ref().map(|m| m.free),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            temperature_celsius: temp.map(f64::from),
            power_watts: power.map(milli),
            power_limit_watts: limit.map(milli),
            energy_joules: energy.map(|mj| mj as f64 / 1000.0),
            sm_clock_hertz: sm.map(mhz),
            memory_clock_hertz: mem_clock.map(mhz),
            throttle_reasons,
            ecc_corrected,
            ecc_uncorrected,
            encoder_utilization_ratio: links.encoder.map(percent_ratio),
            decoder_utilization_ratio: links.decoder.map(percent_ratio),
            pcie_replays: v.get(at::PCIE_REPLAYS),
            pcie_link: links.pcie_link,
            memory_temperature_celsius: health.memory_temperature_celsius,
            memory_reserved_bytes: memory.as_ref().map(|m| m.reserved),
            memory_repair: health.memory_repair,
            clock_events: health.clock_events,
            nvlink: health.nvlink,
            unsupported: self.unsupported(),
            processes: processes.count,
            process_memory: processes.each,
            pids: processes.pids,
            health: None,
            lost: false,
        }
    }

    /// The GPU's UUID, name and bus id. Each is kept as soon as it is read: a GPU that falls
    /// off the bus a few calls later still has them. A field that failed this once keeps the
    /// value it was last read with.
    fn identity(&mut self, d: &Device<'static>) -> (String, Option<String>, Option<String>) {
        if self.facts.identity {
            let known = self.src.identities.get(&self.index).cloned();
            let known = known.unwrap_or_default();
            return (known.uuid.unwrap_or_default(), known.name, known.pci_bus_id);
        }
        let uuid = self.get("uuid", || d.uuid());
        let name = self.get("name", || d.name());
        let pci_bus_id = self.get("pci_info", || d.pci_info()).map(|p| p.bus_id);
        let known = self.src.identities.entry(self.index).or_default();
        // Another GPU at this index (the devices were enumerated anew): its GPM buffers hold
        // the other GPU's samples, and go.
        if uuid.is_some() && known.uuid.is_some() && uuid != known.uuid {
            self.src.gpm.forget(self.index);
        }
        for (field, read) in [
            (&mut known.uuid, uuid),
            (&mut known.name, name),
            (&mut known.pci_bus_id, pci_bus_id),
        ] {
            if read.is_some() {
                *field = read;
            }
        }
        self.facts.identity =
            known.uuid.is_some() && known.name.is_some() && known.pci_bus_id.is_some();
        (
            known.uuid.clone().unwrap_or_default(),
            known.name.clone(),
            known.pci_bus_id.clone(),
        )
    }

    /// The GPU's memory, where its counts add up.
    fn memory(&mut self, d: &Device<'static>) -> Option<MemoryInfo> {
        match self.get("memory", || d.memory_info()) {
            Some(m)
                if m.total > 0
                    && m.used <= m.total
                    && m.free <= m.total
                    && m.reserved <= m.total =>
            {
                Some(m)
            }
            Some(m) => {
                self.src.bad_value(
                    self.index,
                    "memory",
                    format!(
                        "used {} free {} reserved {} total {}",
                        m.used, m.free, m.reserved, m.total
                    ),
                );
                None
            }
            None => None,
        }
    }
}

fn percent_ratio(p: u32) -> f64 {
    f64::from(p) / 100.0
}

fn milli(v: u64) -> f64 {
    v as f64 / 1000.0
}

fn mhz(v: u32) -> f64 {
    f64::from(v) * 1e6
}

/// A one-line reason for an init failure, naming what was tried where nvml-wrapper does not.
fn init_error_text(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => format!("cannot load the library: {inner}"),
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_string(),
        NvmlError::NoPermission => "permission denied".to_string(),
        other => other.to_string(),
    }
}
