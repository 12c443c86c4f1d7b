//! The real GPU source: NVML through nvml-wrapper.
//!
//! Runs on the sampler's NVML thread only. Every reading is checked: a failure, a
//! "not supported" or an out-of-range value leaves the field `None`, and failures and bad
//! values are counted in `gpuwatch_sample_errors_total{kind}`.

mod fields;
mod links;
mod processes;
mod throttle;
use processes::{process_refs, used};
use throttle::THROTTLE_REASONS;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{cuda_driver_version_major, cuda_driver_version_minor, Device, Nvml};

use super::counters::{SampleError, SamplerCounters};
use super::xid::{self, XidCounts};
use super::{GpuSample, GpuSource, NvmlStatus, ProcessSample, Sample, ThrottleReason};

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
            xids: Arc::new(XidCounts::default()),
            identities: HashMap::new(),
            logged: HashSet::new(),
            unsupported: HashSet::new(),
            gpm: super::gpm::Gpm::default(),
        }
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
                // A new driver may support what the old one did not.
                self.unsupported.clear();
                self.last_init_error = None;
                self.backoff = INIT_BACKOFF_FIRST;
                if self.watch_xid {
                    xid::spawn(nvml, Arc::clone(&self.xids), Arc::clone(&self.metrics));
                }
                Ok(nvml)
            }
            Err(e) => {
                let msg = init_error_text(&e);
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

    fn read_gpu(&mut self, nvml: &'static Nvml, index: u32) -> GpuSample {
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => return self.unreachable(index, &e),
        };
        let mut r = GpuReader {
            src: self,
            index,
            lost: None,
        };
        let sample = r.read_all(nvml, &device);
        match r.lost {
            Some(e) => self.unreachable(index, &e),
            None => sample,
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

    /// One MIG device of GPU `d`: its identity, memory, processes, and the GPM metrics of its
    /// GPU instance.
    /// A MIG device whose UUID cannot be read is left out: it could not be told apart.
    fn read_mig(&mut self, nvml: &'static Nvml, m: &Device<'static>) -> Option<super::MigSample> {
        let uuid = self.get("mig_uuid", || m.uuid())?;
        // NVML names a MIG device "<GPU name> MIG <profile>".
        let profile = self
            .get("mig_name", || m.name())
            .and_then(|n| Some(n.rsplit_once(" MIG ")?.1.to_string()));
        let (gpu_instance, compute_instance) = super::gpm::instance_ids(nvml, m);
        let memory = self
            .get("mig_memory", || m.memory_info())
            .filter(|mem| mem.total > 0 && mem.used <= mem.total);
        let (processes, pids) = if self.src.pids {
            match self.get("mig_processes", || m.running_compute_processes()) {
                Some(list) => (Some(list.len() as u32), process_refs(&list)),
                None => (None, Vec::new()),
            }
        } else {
            let n = self.get("mig_processes", || m.running_compute_processes_count());
            (n, Vec::new())
        };
        Some(super::MigSample {
            uuid,
            gpu_instance,
            compute_instance,
            profile,
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            processes,
            pids,
            gpm: None,
        })
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
        use super::gpm::Read;
        if self.lost.is_some() {
            return (None, None);
        }
        match self.src.gpm.read(nvml, d, self.index, instance) {
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
        // Each identity field is kept as soon as it is read: a GPU that falls off the bus a
        // few calls later still has its UUID, name and bus id.
        let uuid = self.get("uuid", || d.uuid());
        let name = self.get("name", || d.name());
        let pci_bus_id = self.get("pci_info", || d.pci_info()).map(|p| p.bus_id);
        let known = self.src.identities.entry(index).or_default();
        // Another GPU at this index (the devices were enumerated anew): its GPM buffers hold
        // the other GPU's samples, and go.
        if uuid.is_some() && known.uuid.is_some() && uuid != known.uuid {
            self.src.gpm.forget(index);
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
        // A field that failed this once keeps the value it was last read with.
        let (uuid, name, pci_bus_id) = (
            known.uuid.clone().unwrap_or_default(),
            known.name.clone(),
            known.pci_bus_id.clone(),
        );

        // MIG devices, each a device of its own: read every cycle, so a new layout shows at
        // once. A slot without a device (NOT_FOUND) is a hole in the layout; one that cannot
        // be read, or whose UUID or instance ids cannot, is counted as unread, and a rule
        // cannot judge the node while one is (it could be the one at work).
        // A MIG mode that cannot be read (other than "not supported") is unread too: the GPU
        // may be in MIG mode, and its own readings would stand in for devices not read.
        let mut mig_unread = 0u32;
        let mode = match d.mig_mode() {
            Err(NvmlError::NotSupported) => None,
            read => {
                let mode = self.get("mig_mode", || read);
                mig_unread += u32::from(mode.is_none());
                mode
            }
        };
        let mig: Vec<super::MigSample> = match mode {
            Some(mode) if mode.current == 1 => {
                let n = match self.get("mig_devices", || d.mig_device_count()) {
                    Some(n) => n,
                    None => {
                        mig_unread += 1;
                        0
                    }
                };
                // More than any GPU has: those past the bound are unread.
                mig_unread += n.saturating_sub(MAX_MIG_DEVICES);
                let mut devices: Vec<Device<'static>> = Vec::new();
                for i in 0..n.min(MAX_MIG_DEVICES) {
                    match d.mig_device_by_index(i) {
                        Ok(m) => devices.push(m),
                        Err(NvmlError::NotFound) => {}
                        Err(e) => {
                            mig_unread += 1;
                            // Counted and logged as any failed read; lost if the GPU is.
                            self.get("mig_device", || Err::<(), _>(e));
                        }
                    }
                }
                let mut read = Vec::with_capacity(devices.len());
                for m in &devices {
                    match self.read_mig(nvml, m) {
                        Some(s) if s.gpu_instance.is_some() && s.compute_instance.is_some() => {
                            read.push(s)
                        }
                        Some(s) => {
                            mig_unread += 1;
                            read.push(s);
                        }
                        None => mig_unread += 1,
                    }
                }
                read
            }
            _ => Vec::new(),
        };
        // GPM is per GPU instance, which may hold several MIG devices (compute instances): one
        // sample each per cycle, shared by its devices.
        let mut instances: Vec<(u32, String)> = Vec::new();
        for m in &mig {
            if let Some(gi) = m.gpu_instance {
                if !instances.iter().any(|(i, _)| *i == gi) {
                    instances.push((gi, m.uuid.clone()));
                }
            }
        }
        let mut mig = mig;
        for (gi, key) in &instances {
            let gpm = self.read_gpm(nvml, d, Some((*gi, key.as_str()))).1;
            for m in mig.iter_mut().filter(|m| m.gpu_instance == Some(*gi)) {
                m.gpm.clone_from(&gpm);
            }
        }
        self.src.gpm.retain_instances(index, &instances);
        let mig_uuids = mig.iter().map(|m| m.uuid.clone()).collect();

        let util = self.get("utilization", || d.utilization_rates());
        let gpu_util = self.check("utilization", util.as_ref().map(|u| u.gpu), |v| v <= 100);
        let mem_util = self.check("memory_utilization", util.as_ref().map(|u| u.memory), |v| {
            v <= 100
        });

        let memory = self.get("memory", || d.memory_info());
        let memory = match memory {
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
                    index,
                    "memory",
                    format!(
                        "used {} free {} reserved {} total {}",
                        m.used, m.free, m.reserved, m.total
                    ),
                );
                None
            }
            None => None,
        };

        let temp = self.get("temperature", || d.temperature(TemperatureSensor::Gpu));
        let temp = self.check("temperature", temp, |v| v <= MAX_TEMPERATURE_CELSIUS);
        let power = self.get("power", || d.power_usage());
        let power = self.check("power", power, |v| v <= MAX_POWER_MILLIWATTS);
        let limit = self.get("power_limit", || d.enforced_power_limit());
        let limit = self.check("power_limit", limit, |v| v > 0 && v <= MAX_POWER_MILLIWATTS);
        let energy = self.get("energy", || d.total_energy_consumption());
        let energy = self.check("energy", energy, |v| v != u64::MAX);
        let sm = self.get("sm_clock", || d.clock_info(Clock::SM));
        let sm = self.check("sm_clock", sm, |v| v <= MAX_CLOCK_MHZ);
        let mem_clock = self.get("memory_clock", || d.clock_info(Clock::Memory));
        let mem_clock = self.check("memory_clock", mem_clock, |v| v <= MAX_CLOCK_MHZ);

        let links = self.engines_and_links(d);
        let health = self.health_readings(nvml, d);

        let supported = self.get("throttle_reasons", || d.supported_throttle_reasons());
        let current = self.get("throttle_reasons", || d.current_throttle_reasons());
        let throttle_reasons = match (supported, current) {
            (Some(s), Some(c)) => THROTTLE_REASONS
                .iter()
                .filter(|(bit, _)| s.contains(*bit))
                .map(|(bit, reason)| ThrottleReason {
                    reason,
                    active: c.contains(*bit),
                })
                .collect(),
            _ => Vec::new(),
        };

        let ecc_corrected = self.get("ecc", || {
            d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        });
        let ecc_corrected = self.check("ecc", ecc_corrected, |v| v != u64::MAX);
        let ecc_uncorrected = self.get("ecc", || {
            d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        });
        let ecc_uncorrected = self.check("ecc", ecc_uncorrected, |v| v != u64::MAX);

        let (processes, process_memory, pids) = if self.src.per_process || self.src.pids {
            match self.get("processes", || d.running_compute_processes()) {
                Some(list) => {
                    let procs = self.src.per_process.then(|| {
                        list.iter()
                            .map(|p| ProcessSample {
                                pid: p.pid,
                                name: nvml.sys_process_name(p.pid, 256).ok(),
                                used_memory_bytes: used(&p.used_gpu_memory),
                            })
                            .collect()
                    });
                    let pids = if self.src.pids {
                        process_refs(&list)
                    } else {
                        Vec::new()
                    };
                    (Some(list.len() as u32), procs, pids)
                }
                None => (None, None, Vec::new()),
            }
        } else {
            (
                self.get("processes", || d.running_compute_processes_count()),
                None,
                Vec::new(),
            )
        };

        let (gpm_supported, gpm) = self.read_gpm(nvml, d, None);

        let xids = self.src.xids.for_gpu(index);
        GpuSample {
            index,
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
            pcie_replays: links.pcie_replays.map(u64::from),
            pcie_link: links.pcie_link,
            memory_temperature_celsius: health.memory_temperature_celsius,
            memory_reserved_bytes: memory.as_ref().map(|m| m.reserved),
            memory_repair: health.memory_repair,
            clock_events: health.clock_events,
            nvlink: health.nvlink,
            unsupported: self.unsupported(),
            processes,
            process_memory,
            pids,
            health: None,
            lost: false,
        }
    }
}

fn percent_ratio(p: u32) -> f64 {
    f64::from(p) / 100.0
}

fn milli(v: u32) -> f64 {
    f64::from(v) / 1000.0
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
