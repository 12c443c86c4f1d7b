//! The scenario file's raw form, as TOML reads it, with its defaults, and its validation into a
//! [`Scenario`]: every error names the key at fault.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::series::RawSeries;
use super::{
    to_u32, Fault, FaultKind, Field, Gpm, GpmMetric, Gpu, Mig, RetiredPages, Scenario, Series,
    THROTTLE_REASONS,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    #[serde(default = "default_driver")]
    driver_version: String,
    nvml_version: Option<String>,
    #[serde(default = "default_cuda")]
    cuda_driver_version: i32,
    /// The device count to report, when it is not the number of `[[gpu]]` tables (a library
    /// that reports more devices than it has).
    device_count: Option<u32>,
    /// Field ids this driver does not know: every GPU answers them "not supported", as a driver
    /// older than the ids does.
    #[serde(default)]
    unknown_field_ids: Vec<u32>,
    #[serde(default)]
    time: RawTime,
    #[serde(default)]
    gpu: Vec<RawGpu>,
    #[serde(default)]
    fault: Vec<RawFault>,
    /// AMD GPUs, shown through the fake's sysfs tree (`crate::amd`), never through NVML.
    #[serde(default)]
    amd: Vec<super::amd::RawAmd>,
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
    pids_file: Option<String>,
    #[serde(default = "default_process_name")]
    process_name: String,
    ecc_corrected: Option<RawSeries>,
    ecc_uncorrected: Option<RawSeries>,
    encoder_utilization: Option<RawSeries>,
    decoder_utilization: Option<RawSeries>,
    pcie_replays: Option<RawSeries>,
    pcie_link_generation: Option<RawSeries>,
    pcie_link_width: Option<RawSeries>,
    #[serde(default = "default_pcie_generation")]
    pcie_link_max_generation: u32,
    #[serde(default = "default_pcie_width")]
    pcie_link_max_width: u32,
    memory_temperature: Option<RawSeries>,
    #[serde(default)]
    memory_reserved_mib: u64,
    remapped_rows_correctable: Option<RawSeries>,
    remapped_rows_uncorrectable: Option<RawSeries>,
    row_remap_pending: Option<RawSeries>,
    row_remap_failed: Option<RawSeries>,
    /// Given: the GPU retires pages (before Ampere); absent: it does not.
    retired_pages: Option<RawRetiredPages>,
    #[serde(default)]
    clock_event_seconds: RawClockEvents,
    #[serde(default = "default_nvlink_links")]
    nvlink_links: u32,
    #[serde(default)]
    nvlink_errors: RawNvlinkErrors,
    nvlink_tx_kib: Option<RawSeries>,
    nvlink_rx_kib: Option<RawSeries>,
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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRetiredPages {
    single_bit: Option<RawSeries>,
    double_bit: Option<RawSeries>,
    pending: Option<RawSeries>,
}

/// Seconds held down by each of NVML's violation policies.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClockEvents {
    power: Option<RawSeries>,
    thermal: Option<RawSeries>,
    sync_boost: Option<RawSeries>,
    board_limit: Option<RawSeries>,
    low_utilization: Option<RawSeries>,
    reliability: Option<RawSeries>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNvlinkErrors {
    crc_flit: Option<RawSeries>,
    crc_data: Option<RawSeries>,
    replay: Option<RawSeries>,
    recovery: Option<RawSeries>,
}

/// An H100 SXM's NVLink: 18 links.
fn default_nvlink_links() -> u32 {
    18
}

/// An H100 SXM's link: PCIe 5.0, 16 lanes.
fn default_pcie_generation() -> u32 {
    5
}

fn default_pcie_width() -> u32 {
    16
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

pub(super) fn secs(key: &str, text: &str) -> Result<f64, String> {
    humantime::parse_duration(text)
        .map(|d| d.as_secs_f64())
        .map_err(|e| format!("{key}: \"{text}\" is not a duration: {e}"))
}

impl RawScenario {
    pub(super) fn validate(self, base: &Path) -> Result<Scenario, String> {
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
            faults.push(f.validate(i, gpus.len())?);
        }
        let mut amd = Vec::with_capacity(self.amd.len());
        for (i, a) in self.amd.into_iter().enumerate() {
            amd.push(a.validate(i, base)?);
        }
        Ok(Scenario {
            amd,
            nvml_version: self
                .nvml_version
                .unwrap_or_else(|| format!("12.{}", self.driver_version)),
            driver_version: self.driver_version,
            cuda_driver_version: self.cuda_driver_version,
            device_count: self.device_count,
            unknown_field_ids: self.unknown_field_ids,
            speed: self.time.speed,
            start,
            gpus,
            faults,
        })
    }
}

impl RawFault {
    /// Validates `fault[i]` of a scenario with `gpus` GPUs.
    fn validate(self, i: usize, gpus: usize) -> Result<Fault, String> {
        let key = format!("fault[{i}]");
        if let Some(g) = self.gpu {
            if g as usize >= gpus {
                return Err(format!("{key}.gpu: \"{g}\" is not a GPU of this scenario"));
            }
        }
        let kind = match self.kind.as_str() {
            "lost" if self.fields.is_empty() => FaultKind::Lost,
            "lost" => FaultKind::LostFor(self.fields.into_iter().collect()),
            "not_supported" => {
                if self.fields.is_empty() {
                    return Err(format!("{key}.fields: a not_supported fault names fields"));
                }
                FaultKind::NotSupported(self.fields.into_iter().collect())
            }
            "fails" => {
                if self.fields.is_empty() {
                    return Err(format!("{key}.fields: a fails fault names fields"));
                }
                FaultKind::Fails(self.fields.into_iter().collect())
            }
            "delay" => {
                let text = self
                    .delay
                    .ok_or_else(|| format!("{key}.delay: a delay fault needs a delay"))?;
                FaultKind::Delay(Duration::from_secs_f64(secs(
                    &format!("{key}.delay"),
                    &text,
                )?))
            }
            "xid" => FaultKind::Xid(
                self.xid
                    .ok_or_else(|| format!("{key}.xid: an xid fault needs an xid"))?,
            ),
            "init_failure" => FaultKind::InitFailure,
            other => {
                return Err(format!(
                    "{key}.kind: \"{other}\" is not one of lost, not_supported, fails, delay, xid, init_failure"
                ))
            }
        };
        Ok(Fault {
            at: secs(&format!("{key}.at"), &self.at)?,
            until: match self.until {
                Some(u) => Some(secs(&format!("{key}.until"), &u)?),
                None => None,
            },
            gpu: self.gpu,
            kind,
        })
    }
}

/// A GPU's place in the scenario, for its series: its key, and the directory of the file.
pub(super) struct At<'a> {
    pub(super) key: &'a str,
    pub(super) base: &'a Path,
}

impl At<'_> {
    /// The series at `name`, or `default` throughout where the scenario gives none.
    pub(super) fn series(
        &self,
        name: &str,
        raw: Option<RawSeries>,
        default: f64,
    ) -> Result<Series, String> {
        match raw {
            None => Ok(Series::Constant(default)),
            Some(r) => r.validate(&format!("{}.{name}", self.key), self.base),
        }
    }

    /// The throttle reasons at `name`, as NVML's bits.
    fn bits(&self, name: &str, names: &[String]) -> Result<u64, String> {
        names.iter().try_fold(0u64, |acc, n| {
            THROTTLE_REASONS
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, b)| acc | b)
                .ok_or_else(|| format!("{}.{name}: \"{n}\" is not a throttle reason", self.key))
        })
    }
}

impl RawGpu {
    fn validate(self, i: usize, base: &Path) -> Result<Gpu, String> {
        let key = format!("gpu[{i}]");
        let at = At { key: &key, base };
        let limit_w = self.power_limit_watts;
        if self.memory_reserved_mib > self.memory_total_mib {
            return Err(format!(
                "{key}.memory_reserved_mib: {} is more than memory_total_mib ({})",
                self.memory_reserved_mib, self.memory_total_mib
            ));
        }
        Ok(Gpu {
            uuid: self
                .uuid
                .unwrap_or_else(|| format!("GPU-00000000-0000-4000-8000-{:012x}", i + 1)),
            pci_bus_id: self
                .pci_bus_id
                .unwrap_or_else(|| format!("00000000:{:02X}:00.0", 0x18 + i * 0x10)),
            memory_total_bytes: self.memory_total_mib * 1024 * 1024,
            power_limit_milliwatts: to_u32(limit_w * 1000.0),
            utilization: at.series("utilization", self.utilization, 0.0)?,
            memory_utilization: at.series("memory_utilization", self.memory_utilization, 0.0)?,
            memory_used_mib: at.series("memory_used_mib", self.memory_used_mib, 0.0)?,
            temperature: at.series("temperature", self.temperature, 35.0)?,
            power_watts: at.series("power_watts", self.power_watts, limit_w * 0.1)?,
            sm_clock_mhz: at.series("sm_clock_mhz", self.sm_clock_mhz, 1980.0)?,
            memory_clock_mhz: at.series("memory_clock_mhz", self.memory_clock_mhz, 2619.0)?,
            processes: at.series("processes", self.processes, 0.0)?,
            ecc_corrected: at.series("ecc_corrected", self.ecc_corrected, 0.0)?,
            ecc_uncorrected: at.series("ecc_uncorrected", self.ecc_uncorrected, 0.0)?,
            encoder_utilization: at.series("encoder_utilization", self.encoder_utilization, 0.0)?,
            decoder_utilization: at.series("decoder_utilization", self.decoder_utilization, 0.0)?,
            pcie_replays: at.series("pcie_replays", self.pcie_replays, 0.0)?,
            pcie_link_generation: at.series(
                "pcie_link_generation",
                self.pcie_link_generation,
                f64::from(self.pcie_link_max_generation),
            )?,
            pcie_link_width: at.series(
                "pcie_link_width",
                self.pcie_link_width,
                f64::from(self.pcie_link_max_width),
            )?,
            pcie_link_max_generation: self.pcie_link_max_generation,
            pcie_link_max_width: self.pcie_link_max_width,
            memory_temperature: at.series("memory_temperature", self.memory_temperature, 45.0)?,
            memory_reserved_bytes: self.memory_reserved_mib * 1024 * 1024,
            remapped_correctable: at.series(
                "remapped_rows_correctable",
                self.remapped_rows_correctable,
                0.0,
            )?,
            remapped_uncorrectable: at.series(
                "remapped_rows_uncorrectable",
                self.remapped_rows_uncorrectable,
                0.0,
            )?,
            remap_pending: at.series("row_remap_pending", self.row_remap_pending, 0.0)?,
            remap_failed: at.series("row_remap_failed", self.row_remap_failed, 0.0)?,
            retired_pages: match self.retired_pages {
                None => None,
                Some(r) => Some(r.validate(&at)?),
            },
            clock_event_seconds: self.clock_event_seconds.validate(&at)?,
            nvlink_links: self.nvlink_links,
            nvlink_errors: self.nvlink_errors.validate(&at)?,
            nvlink_tx_kib: at.series("nvlink_tx_kib", self.nvlink_tx_kib, 0.0)?,
            nvlink_rx_kib: at.series("nvlink_rx_kib", self.nvlink_rx_kib, 0.0)?,
            throttle_supported: at.bits("throttle_supported", &self.throttle_supported)?,
            throttle_active: at.bits("throttle_active", &self.throttle_active)?,
            mig: migs(self.mig_devices, self.mig, &at, i)?,
            gpm: match self.gpm {
                Some(g) => Some(g.validate(&format!("{key}.gpm"), base)?),
                None => None,
            },
            process_name: self.process_name,
            pids_file: self.pids_file.map(|f| base.join(f)),
            name: self.name,
        })
    }
}

impl RawRetiredPages {
    fn validate(self, at: &At) -> Result<RetiredPages, String> {
        Ok(RetiredPages {
            single_bit: at.series("retired_pages.single_bit", self.single_bit, 0.0)?,
            double_bit: at.series("retired_pages.double_bit", self.double_bit, 0.0)?,
            pending: at.series("retired_pages.pending", self.pending, 0.0)?,
        })
    }
}

impl RawClockEvents {
    /// The seconds of each policy, in the order of `Gpu::clock_event_seconds`.
    fn validate(self, at: &At) -> Result<[Series; 6], String> {
        Ok([
            at.series("clock_event_seconds.power", self.power, 0.0)?,
            at.series("clock_event_seconds.thermal", self.thermal, 0.0)?,
            at.series("clock_event_seconds.sync_boost", self.sync_boost, 0.0)?,
            at.series("clock_event_seconds.board_limit", self.board_limit, 0.0)?,
            at.series(
                "clock_event_seconds.low_utilization",
                self.low_utilization,
                0.0,
            )?,
            at.series("clock_event_seconds.reliability", self.reliability, 0.0)?,
        ])
    }
}

impl RawNvlinkErrors {
    /// The counts of each kind, in the order of `Gpu::nvlink_errors`.
    fn validate(self, at: &At) -> Result<[Series; 4], String> {
        Ok([
            at.series("nvlink_errors.crc_flit", self.crc_flit, 0.0)?,
            at.series("nvlink_errors.crc_data", self.crc_data, 0.0)?,
            at.series("nvlink_errors.replay", self.replay, 0.0)?,
            at.series("nvlink_errors.recovery", self.recovery, 0.0)?,
        ])
    }
}

/// GPU `gpu`'s MIG devices: those listed by UUID alone (`mig_devices`), then those described
/// in full (`mig`), at most `MAX_MIG` in all.
fn migs(uuids: Vec<String>, raw: Vec<RawMig>, at: &At, gpu: usize) -> Result<Vec<Mig>, String> {
    let key = at.key;
    let mut mig = Vec::new();
    for (m, uuid) in uuids.into_iter().enumerate() {
        mig.push(
            RawMig {
                uuid: Some(uuid),
                profile: default_profile(),
                ..RawMig::default()
            }
            .validate(&format!("{key}.mig_devices[{m}]"), gpu, m, at.base)?,
        );
    }
    let from_list = mig.len();
    if from_list + raw.len() > MAX_MIG {
        return Err(format!(
            "{key}.mig: {} MIG devices; a GPU has at most {MAX_MIG}",
            from_list + raw.len()
        ));
    }
    for (m, r) in raw.into_iter().enumerate() {
        mig.push(r.validate(&format!("{key}.mig[{m}]"), gpu, from_list + m, at.base)?);
    }
    Ok(mig)
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

/// The most MIG devices a scenario gives one GPU (over all its layouts): as many as gpuwatch
/// reads, and few enough for the handles to stay apart.
const MAX_MIG: usize = 16;

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
