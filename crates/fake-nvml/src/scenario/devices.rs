//! The devices of a scenario: a GPU's identity and readings, its MIG devices, and its GPM
//! metrics, each a function of simulated time.

use super::{to_u32, Series};

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
    /// A file of pids (whitespace apart), read at every call: the GPU's processes are those,
    /// for tests that put real processes on a GPU. `processes` is then ignored.
    pub pids_file: Option<std::path::PathBuf>,
    pub process_name: String,
    pub ecc_corrected: Series,
    pub ecc_uncorrected: Series,
    /// Video encoder and decoder utilization, percent.
    pub encoder_utilization: Series,
    pub decoder_utilization: Series,
    /// PCIe replays since the driver loaded (a count; the series gives its value).
    pub pcie_replays: Series,
    /// The PCIe link now (generation, lanes), and the most it trains to.
    pub pcie_link_generation: Series,
    pub pcie_link_width: Series,
    pub pcie_link_max_generation: u32,
    pub pcie_link_max_width: u32,
    /// The memory temperature, and the framebuffer memory the driver reserves.
    pub memory_temperature: Series,
    pub memory_reserved_bytes: u64,
    /// Rows remapped for correctable and uncorrectable errors, and whether a remap is
    /// pending or has failed (0 or 1).
    pub remapped_correctable: Series,
    pub remapped_uncorrectable: Series,
    pub remap_pending: Series,
    pub remap_failed: Series,
    /// Page retirement, which GPUs before Ampere do; `None`: not supported.
    pub retired_pages: Option<RetiredPages>,
    /// Seconds the clocks were held down since the driver loaded, by NVML's violation policy
    /// (power, thermal, sync boost, board limit, low utilization, reliability).
    pub clock_event_seconds: [Series; 6],
    /// NVLink links; 0: the GPU has no NVLink, and its NVLink fields are not supported.
    pub nvlink_links: u32,
    /// NVLink errors over every link: CRC flit, CRC data, replay, recovery.
    pub nvlink_errors: [Series; 4],
    /// NVLink data over every link since the driver loaded, in KiB.
    pub nvlink_tx_kib: Series,
    pub nvlink_rx_kib: Series,
    /// NVML clock-throttle reason bits that this GPU supports.
    pub throttle_supported: u64,
    /// NVML clock-throttle reason bits that are active.
    pub throttle_active: u64,
    /// The GPU's MIG devices, over time; MIG mode is on when there are any.
    pub mig: Vec<Mig>,
    /// GPM metrics; `None`: the GPU does not support GPM.
    pub gpm: Option<Gpm>,
}

impl Gpu {
    pub fn memory_used_bytes(&self, t: f64) -> u64 {
        let used = (self.memory_used_mib.at(t).max(0.0) * MIB) as u64;
        used.min(self.memory_total_bytes - self.memory_reserved_bytes)
    }

    pub fn power_milliwatts(&self, t: f64) -> u32 {
        to_u32(self.power_watts.at(t) * 1000.0)
    }

    /// Energy since simulated time 0, in millijoules: the integral of power.
    pub fn energy_millijoules(&self, t: f64) -> u64 {
        (self.power_watts.integral(t) * 1000.0).max(0.0).round() as u64
    }

    pub fn process_count(&self, t: f64) -> u32 {
        match self.pids() {
            Some(p) => p.len() as u32,
            None => to_u32(self.processes.at(t).round()),
        }
    }

    /// The pids in `pids_file`, when the GPU has one (none while it cannot be read).
    pub fn pids(&self) -> Option<Vec<u32>> {
        use std::io::Read;
        let path = self.pids_file.as_ref()?;
        let mut text = String::new();
        if let Ok(f) = std::fs::File::open(path) {
            let _ = f.take(64 * 1024).read_to_string(&mut text);
        }
        Some(
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .take(1024)
                .collect(),
        )
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Pages retired for multiple single-bit errors and for a double-bit error, and whether any
/// are pending retirement (0 or 1); each a count the series gives.
#[derive(Debug, Clone)]
pub struct RetiredPages {
    pub single_bit: Series,
    pub double_bit: Series,
    pub pending: Series,
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
