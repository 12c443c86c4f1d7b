//! A scenario's AMD GPUs (`[[amd]]` tables): what the fake's sysfs and procfs tree shows of
//! each, over simulated time. NVML never sees them; `crate::amd` writes them as files.

use std::path::Path;

use serde::Deserialize;

use super::parse::At;
use super::series::RawSeries;
use super::Series;

/// One AMD GPU of a scenario.
#[derive(Debug, Clone)]
pub struct AmdGpu {
    pub name: String,
    /// The `unique_id` (16 hex digits); empty where the board has none.
    pub unique_id: String,
    pub pci_bus_id: String,
    pub vram_total_mib: u64,
    pub power_cap_watts: u32,
    /// Percent.
    pub utilization: Series,
    pub memory_utilization: Series,
    pub vram_used_mib: Series,
    /// Hotspot (junction) and memory temperatures; an MI300 has no edge sensor.
    pub temperature: Series,
    pub memory_temperature: Series,
    pub power_watts: Series,
    pub sclk_mhz: Series,
    pub mclk_mhz: Series,
    /// Processes holding a DRM client of the GPU, each with an equal share of the VRAM used.
    pub processes: Series,
    pub process_name: String,
    pub ecc_corrected: Series,
    pub ecc_uncorrected: Series,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAmd {
    #[serde(default = "default_name")]
    name: String,
    unique_id: Option<String>,
    pci_bus_id: Option<String>,
    #[serde(default = "default_vram")]
    vram_total_mib: u64,
    #[serde(default = "default_cap")]
    power_cap_watts: u32,
    utilization: Option<RawSeries>,
    memory_utilization: Option<RawSeries>,
    vram_used_mib: Option<RawSeries>,
    temperature: Option<RawSeries>,
    memory_temperature: Option<RawSeries>,
    power_watts: Option<RawSeries>,
    sclk_mhz: Option<RawSeries>,
    mclk_mhz: Option<RawSeries>,
    processes: Option<RawSeries>,
    #[serde(default = "default_process_name")]
    process_name: String,
    ecc_corrected: Option<RawSeries>,
    ecc_uncorrected: Option<RawSeries>,
}

/// An AMD Instinct MI300X: 192 GiB of HBM3, 750 W.
fn default_name() -> String {
    "AMD Instinct MI300X".to_string()
}

fn default_vram() -> u64 {
    196_608
}

fn default_cap() -> u32 {
    750
}

fn default_process_name() -> String {
    "python3".to_string()
}

impl RawAmd {
    /// Validates `amd[i]`.
    pub(super) fn validate(self, i: usize, base: &Path) -> Result<AmdGpu, String> {
        let key = format!("amd[{i}]");
        let at = At { key: &key, base };
        let unique_id = self
            .unique_id
            .unwrap_or_else(|| format!("{:016x}", 0x3e5a_7c00_0000_0000u64 + i as u64));
        if !(unique_id.is_empty()
            || unique_id.len() == 16 && unique_id.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!(
                "{key}.unique_id: \"{unique_id}\" is not 16 hex digits"
            ));
        }
        let pci_bus_id = self
            .pci_bus_id
            .unwrap_or_else(|| format!("0000:{:02x}:00.0", 0x0c + 0x10 * i));
        if pci_bus_id.len() != 12 || pci_bus_id.as_bytes()[4] != b':' {
            return Err(format!(
                "{key}.pci_bus_id: \"{pci_bus_id}\" is not a PCI address such as 0000:0c:00.0"
            ));
        }
        if self.name.is_empty() || self.name.chars().any(char::is_control) {
            return Err(format!(
                "{key}.name: \"{}\" is not a product name",
                self.name.escape_debug()
            ));
        }
        Ok(AmdGpu {
            name: self.name,
            unique_id,
            pci_bus_id,
            vram_total_mib: self.vram_total_mib,
            power_cap_watts: self.power_cap_watts,
            utilization: at.series("utilization", self.utilization, 0.0)?,
            memory_utilization: at.series("memory_utilization", self.memory_utilization, 0.0)?,
            vram_used_mib: at.series("vram_used_mib", self.vram_used_mib, 0.0)?,
            temperature: at.series("temperature", self.temperature, 40.0)?,
            memory_temperature: at.series("memory_temperature", self.memory_temperature, 38.0)?,
            power_watts: at.series("power_watts", self.power_watts, 140.0)?,
            sclk_mhz: at.series("sclk_mhz", self.sclk_mhz, 2100.0)?,
            mclk_mhz: at.series("mclk_mhz", self.mclk_mhz, 1300.0)?,
            processes: at.series("processes", self.processes, 0.0)?,
            process_name: self.process_name,
            ecc_corrected: at.series("ecc_corrected", self.ecc_corrected, 0.0)?,
            ecc_uncorrected: at.series("ecc_uncorrected", self.ecc_uncorrected, 0.0)?,
        })
    }
}
