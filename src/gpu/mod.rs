//! The GPU boundary: what one sample of the node holds, and where samples come from.
//!
//! `Snapshot` is immutable once published. A reading that failed, is not supported, or is out of
//! range is `None`: unknown is never 0.

pub mod amd;
pub mod counters;
pub mod gpm;
pub mod health;
pub mod nvml;
pub mod sampler;
mod xid;

use std::collections::BTreeMap;

use serde::Serialize;

/// One complete sample of every GPU on the node.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    /// 1 for the first sample; 0 means no sample has been taken yet.
    pub seq: u64,
    /// When the sample was taken, in seconds since the Unix epoch.
    pub timestamp: f64,
    /// The monotonic clock when the sample was taken (`time::monotonic`): what really passed
    /// between two samples when the wall clock is stepped.
    #[serde(skip)]
    pub monotonic: Option<f64>,
    /// How long the sampling cycle took.
    pub duration_seconds: f64,
    pub nvml: NvmlStatus,
    pub gpus: Vec<GpuSample>,
    /// The XIDs held against GPUs until they are reset, as health remembers them now: the
    /// decision loop saves them in `state.json`, so that a restart keeps them. `None` until
    /// health has its memory from before the restart.
    #[serde(skip)]
    pub health_holds: Option<BTreeMap<String, Vec<crate::health::XidHold>>>,
}

/// What a source returns for one cycle; the sampler stamps it into a `Snapshot`.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub nvml: NvmlStatus,
    pub gpus: Vec<GpuSample>,
}

/// The readings GPU `gpu` does not support, in order, from a source's record of (GPU,
/// reading) pairs.
fn unsupported_of<K: PartialEq>(
    set: &std::collections::HashSet<(K, &'static str)>,
    gpu: K,
) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = set
        .iter()
        .filter(|(g, _)| *g == gpu)
        .map(|(_, reading)| *reading)
        .collect();
    out.sort_unstable();
    out
}

/// Whether the PCI bus under `sysfs` holds an NVIDIA display or 3D controller, driver loaded
/// or not: a node that has one may have GPM once its driver is up.
pub fn nvidia_on_bus(sysfs: &std::path::Path) -> bool {
    let Ok(devices) = std::fs::read_dir(sysfs.join("bus/pci/devices")) else {
        return false;
    };
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    devices.filter_map(Result::ok).take(4096).any(|d| {
        read(d.path().join("vendor")).trim() == "0x10de"
            && read(d.path().join("class")).trim().starts_with("0x03")
    })
}

impl Sample {
    /// Why no GPU of the node can ever give GPM's metrics, where that is certain: there is no
    /// NVIDIA driver, and every GPU is of a vendor without GPM.
    pub fn never_gpm(&self) -> Option<&'static str> {
        let none = self.nvml.absent
            && !self.gpus.is_empty()
            && self.gpus.iter().all(|g| g.vendor != Vendor::Nvidia);
        none.then_some("its GPUs are AMD's, which have no GPM, and it has no NVIDIA driver")
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct NvmlStatus {
    /// The library loaded and initialised, and the device count was read.
    pub up: bool,
    /// The library gpuwatch loads.
    pub library: String,
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    /// Why NVML is down, when it is.
    pub error: Option<String>,
    /// NVML is down because the node has no NVIDIA driver (the library or the driver is not
    /// there, and never was since the start) while other GPUs are read: not a failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub absent: bool,
}

impl NvmlStatus {
    /// Whether every GPU the node has is read: NVML up, or the node has no NVIDIA GPU.
    pub fn complete(&self) -> bool {
        self.up || self.absent
    }
}

/// Whose GPU it is: NVIDIA's, read through NVML, or AMD's, read from the amdgpu driver's files.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    #[default]
    Nvidia,
    Amd,
}

impl Vendor {
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub vendor: Vendor,
    /// Empty when the GPU was lost before its UUID was ever read.
    pub uuid: String,
    /// `false` when the GPU answered `GPU_IS_LOST` or could not be reached; then every reading
    /// is `None`.
    pub up: bool,
    /// `true` when it answered `GPU_IS_LOST` (fell off the bus), as opposed to a failure to
    /// reach it that says nothing of the GPU itself (permissions, say).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    pub name: Option<String>,
    pub pci_bus_id: Option<String>,
    pub utilization_ratio: Option<f64>,
    pub memory_utilization_ratio: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    pub energy_joules: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
    pub memory_clock_hertz: Option<f64>,
    /// One entry per supported throttle reason; empty when unknown.
    pub throttle_reasons: Vec<ThrottleReason>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    /// Video encoder and decoder utilization, 0 to 1.
    pub encoder_utilization_ratio: Option<f64>,
    pub decoder_utilization_ratio: Option<f64>,
    /// PCIe replays (link-level retransmissions) since the driver loaded.
    pub pcie_replays: Option<u64>,
    /// The PCIe link now and the most it trains to: generation, and width in lanes.
    pub pcie_link: PcieLink,
    /// The memory (HBM or GDDR) temperature.
    pub memory_temperature_celsius: Option<f64>,
    /// Framebuffer memory the driver reserves for itself (neither used nor free).
    pub memory_reserved_bytes: Option<u64>,
    /// How the GPU has repaired its memory: row remapping, and page retirement before Ampere.
    pub memory_repair: MemoryRepair,
    /// Time the clocks were held down, by reason, since the driver loaded.
    pub clock_events: ClockEvents,
    /// NVLink error counters and data totals over every link; absent without NVLink.
    pub nvlink: NvLinkCounters,
    /// The readings this GPU does not support, as NVML said once (they are not asked again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<&'static str>,
    pub processes: Option<u32>,
    /// Present only when per-process memory is switched on.
    pub process_memory: Option<Vec<ProcessSample>>,
    /// The compute processes, when who holds the GPU is wanted (`[slurm]`, process owners).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<ProcessRef>,
    /// XID errors seen since the daemon started, by XID code.
    pub xid_errors: BTreeMap<u64, u64>,
    /// The UUIDs of the GPU's MIG devices, while MIG mode is on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_uuids: Vec<String>,
    /// The last XID error seen since the daemon started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_xid: Option<u64>,
    /// Whether the GPU supports GPM (Hopper and later); `None` while unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpm_supported: Option<bool>,
    /// GPM metrics over the last cycle; absent without GPM, on the first cycle, and after a
    /// failed call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpm: Option<gpm::GpmReadings>,
    /// The GPU's MIG devices, each a device of its own, while MIG mode is on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigSample>,
    /// MIG devices this cycle that could not be read, or whose UUID or instance ids could
    /// not: while any is, no rule judges the node.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mig_unread: u32,
    /// The GPU's health and its problems; `None` while unknown (NVML down, or the holds kept
    /// from before a restart not read yet): never healthy by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::GpuHealth>,
}

impl GpuSample {
    /// Whether the GPU gives GPM's metrics (`sm_active` and the like): NVIDIA's Hopper and
    /// later do, as NVML says (`None` while it has not said); no AMD GPU does.
    pub fn has_gpm(&self) -> Option<bool> {
        match self.vendor {
            Vendor::Nvidia => self.gpm_supported,
            Vendor::Amd => Some(false),
        }
    }

    /// Whether dcgm-exporter exports this GPU (NVIDIA's): only such a GPU's series have its
    /// names (`[exposition] names = "dcgm"`); every other GPU keeps gpuwatch's in every mode.
    pub fn has_dcgm_names(&self) -> bool {
        self.vendor == Vendor::Nvidia
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A GPU's PCIe link: each field `None` while unknown. A link below its maximum (a GPU that
/// trained down to x4, or to an older generation) moves data slower than it should.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PcieLink {
    pub generation: Option<u32>,
    pub max_generation: Option<u32>,
    pub width: Option<u32>,
    pub max_width: Option<u32>,
}

/// Row remapping (Ampere and later) and page retirement (earlier GPUs): each `None` while
/// unknown or where the GPU does not do it. A failed remap, or a remap or retirement pending,
/// means the GPU needs a reset.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct MemoryRepair {
    pub remapped_correctable: Option<u64>,
    pub remapped_uncorrectable: Option<u64>,
    pub remap_pending: Option<bool>,
    pub remap_failed: Option<bool>,
    pub retired_single_bit: Option<u64>,
    pub retired_double_bit: Option<u64>,
    pub retired_pending: Option<bool>,
}

/// Seconds the clocks were held below what was asked, by reason, since the driver loaded
/// (NVML's violation counters).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ClockEvents {
    pub power: Option<f64>,
    pub thermal: Option<f64>,
    pub sync_boost: Option<f64>,
    pub board_limit: Option<f64>,
    pub low_utilization: Option<f64>,
    pub reliability: Option<f64>,
}

/// NVLink counters summed over every link of the GPU since the driver loaded.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct NvLinkCounters {
    /// Flow-control (flit) CRC errors.
    pub crc_flit_errors: Option<u64>,
    /// Data CRC errors.
    pub crc_data_errors: Option<u64>,
    /// Replays (retransmissions).
    pub replay_errors: Option<u64>,
    /// Link recoveries.
    pub recovery_errors: Option<u64>,
    /// Data sent and received, in bytes.
    pub tx_bytes: Option<u64>,
    pub rx_bytes: Option<u64>,
}

/// One MIG device: a GPU instance (and its compute instance) of a GPU in MIG mode, with its
/// memory, processes and GPM metrics. The GPU keeps its physical readings (temperature, power,
/// clocks, ECC, XID); its utilization is absent, as NVML does not report it in MIG mode.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct MigSample {
    pub uuid: String,
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
    /// The profile, such as `3g.40gb`, from the device's name.
    pub profile: Option<String>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub processes: Option<u32>,
    /// The compute processes, when who holds the device is wanted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<ProcessRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpm: Option<gpm::GpmReadings>,
}

impl MigSample {
    /// Memory not in use, from the total and the used (NVML's own `free` of a MIG device is
    /// not read).
    pub fn memory_free_bytes(&self) -> Option<u64> {
        self.memory_total_bytes?
            .checked_sub(self.memory_used_bytes?)
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThrottleReason {
    pub reason: &'static str,
    pub active: bool,
}

/// A compute process on a GPU or a MIG device, and the GPU memory it uses.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ProcessRef {
    pub pid: u32,
    pub used_memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
}

/// A source of GPU samples: NVML in production, a double in unit tests.
///
/// `sample` may block for as long as the hardware does; the sampler runs it on a thread of its
/// own and abandons cycles that overrun their timeout.
pub trait GpuSource: Send + 'static {
    fn sample(&mut self) -> Sample;
}

impl Snapshot {
    pub fn is_ready(&self) -> bool {
        self.seq > 0
    }
}
