//! The one table of device readings. Each row is one reading of a GPU sample: how to read it
//! (from the GPU, and from a MIG device where it has its own), its gpuwatch family (name, unit,
//! type, and the row's own label in a family of several readings), its scope under gpuwatch's
//! names, and its dcgm-exporter twin with the unit conversion. Both naming modes are generated
//! from it: `encode` here for gpuwatch's, `dcgm::encode` for dcgm-exporter's. Adding a field is
//! one row, plus its NVML read.
//!
//! A few families are not one reading per device: identity, per-reason, per-XID and
//! per-process series. They are rows too (`Row::Series`), at their place in the output.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};

use super::families::*;
use super::series::{gpm_supported, info, process_memory, throttle, unsupported, up, xid_errors};
pub use super::value::Value;
use super::value::{float, int, mega, mib, milli, percent, rounded, same};
use super::{MigLabels, Scrape};
use crate::gpu::gpm::GpmReadings;
use crate::gpu::{GpuSample, MigSample};
use crate::kubernetes::PodRef;
use crate::metrics::encode::*;

/// A gpuwatch family: the rows that name it, next to each other in the table, are its series.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub unit: Option<&'static str>,
    pub counter: bool,
}

/// A reading's dcgm-exporter name, help and unit. Every DCGM family is typed gauge: in
/// OpenMetrics a counter's samples would end in `_total`, and queries ask for the bare name.
#[derive(Debug)]
pub struct Twin {
    pub name: &'static str,
    pub help: &'static str,
    /// From the reading's base unit to DCGM's (percent, MiB, MHz, mJ).
    pub convert: fn(Value) -> Value,
    /// Its place among the DCGM families, which keep the order they have always had; a new
    /// twin takes the next number.
    pub order: u8,
}

/// Which devices a reading has series for under gpuwatch's names. Under DCGM's, a GPU in MIG
/// mode is its GPU instances: each reads the row's MIG read on its first MIG device where
/// there is one, else its GPU's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Each GPU that is up.
    Gpu,
    /// Each GPU that is up, then each MIG device, read on its own.
    Device,
}

/// How a reading is read from a GPU's sample, and from a MIG device's.
pub type ReadGpu = fn(&GpuSample) -> Option<Value>;
pub type ReadMig = fn(&MigSample) -> Option<Value>;

pub struct Reading {
    /// `None` for a reading only dcgm-exporter's names show.
    pub family: Option<&'static Family>,
    /// The row's own label in its family (`clock="sm"`).
    pub label: Option<(&'static str, &'static str)>,
    pub scope: Scope,
    pub gpu: ReadGpu,
    pub mig: Option<ReadMig>,
    pub dcgm: Option<Twin>,
}

/// Encodes a family whose series are not one reading per device.
pub type Series = fn(&mut DescriptorEncoder, &Scrape<'_>) -> Result<(), fmt::Error>;

pub enum Row {
    Reading(Reading),
    Series(Series),
}

/// A GPM reading of a GPU, and of a MIG device (its GPU instance's), in Prometheus units.
macro_rules! gpm {
    ($field:ident) => {
        (
            |g: &GpuSample| float(g.gpm.as_ref().and_then(|m: &GpmReadings| m.$field)),
            |m: &MigSample| float(m.gpm.as_ref().and_then(|m: &GpmReadings| m.$field)),
        )
    };
}

/// One row of a GPM reading: per device under gpuwatch's names, unless `scope` says the GPU.
const fn gpm_row(
    family: &'static Family,
    label: Option<(&'static str, &'static str)>,
    scope: Scope,
    read: (ReadGpu, ReadMig),
    dcgm: Option<Twin>,
) -> Row {
    Row::Reading(Reading {
        family: Some(family),
        label,
        scope,
        gpu: read.0,
        mig: Some(read.1),
        dcgm,
    })
}

/// A reading of the GPU alone: one series per GPU that is up, and under DCGM's names its GPU
/// instances show the GPU's value.
const fn gpu_row(
    family: &'static Family,
    label: Option<(&'static str, &'static str)>,
    gpu: ReadGpu,
    dcgm: Option<Twin>,
) -> Row {
    Row::Reading(Reading {
        family: Some(family),
        label,
        scope: Scope::Gpu,
        gpu,
        mig: None,
        dcgm,
    })
}

const fn twin(
    name: &'static str,
    help: &'static str,
    convert: fn(Value) -> Value,
    order: u8,
) -> Option<Twin> {
    Some(Twin {
        name,
        help,
        convert,
        order,
    })
}

/// Every device family, in the order gpuwatch's names show them.
pub static TABLE: &[Row] = &[
    Row::Series(info),
    Row::Series(up),
    gpu_row(
        &UTILIZATION,
        None,
        |g| float(g.utilization_ratio),
        twin("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", percent, 1),
    ),
    gpu_row(
        &MEMORY_UTILIZATION,
        None,
        |g| float(g.memory_utilization_ratio),
        twin("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", percent, 2),
    ),
    Row::Reading(Reading {
        family: Some(&MEMORY_USED),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.memory_used_bytes),
        mig: Some(|m| int(m.memory_used_bytes)),
        dcgm: twin("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", mib, 3),
    }),
    Row::Reading(Reading {
        family: Some(&MEMORY_FREE),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.memory_free_bytes),
        mig: Some(|m| int(m.memory_free_bytes())),
        dcgm: twin("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", mib, 4),
    }),
    Row::Reading(Reading {
        family: Some(&MEMORY_TOTAL),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.memory_total_bytes),
        mig: Some(|m| int(m.memory_total_bytes)),
        dcgm: None,
    }),
    gpu_row(
        &TEMPERATURE,
        None,
        |g| float(g.temperature_celsius),
        twin("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", rounded, 5),
    ),
    gpu_row(
        &POWER,
        None,
        |g| float(g.power_watts),
        twin("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", same, 6),
    ),
    gpu_row(
        &POWER_LIMIT,
        None,
        |g| float(g.power_limit_watts),
        None,
    ),
    gpu_row(
        &ENERGY,
        None,
        |g| float(g.energy_joules),
        twin(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since boot (in mJ).",
            milli,
            7,
        ),
    ),
    gpu_row(
        &CLOCK,
        Some(("clock", "sm")),
        |g| float(g.sm_clock_hertz),
        twin("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", mega, 8),
    ),
    gpu_row(
        &CLOCK,
        Some(("clock", "memory")),
        |g| float(g.memory_clock_hertz),
        twin("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", mega, 9),
    ),
    Row::Series(throttle),
    Row::Series(gpm_supported),
    gpm_row(
        &SM_ACTIVE,
        None,
        Scope::Device,
        gpm!(sm_active),
        twin(
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            same,
            14,
        ),
    ),
    gpm_row(
        &SM_OCCUPANCY,
        None,
        Scope::Device,
        gpm!(sm_occupancy),
        twin(
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "The ratio of number of warps resident on an SM.",
            same,
            15,
        ),
    ),
    gpm_row(
        &GRAPHICS_ACTIVE,
        None,
        Scope::Device,
        gpm!(graphics_active),
        twin(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
            same,
            13,
        ),
    ),
    gpm_row(
        &TENSOR_ACTIVE,
        None,
        Scope::Device,
        gpm!(tensor_active),
        twin(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            same,
            16,
        ),
    ),
    gpm_row(
        &DRAM_ACTIVE,
        None,
        Scope::Device,
        gpm!(dram_active),
        twin(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            same,
            17,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "fp64")),
        Scope::Device,
        gpm!(fp64_active),
        twin(
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "Ratio of cycles the fp64 pipes are active.",
            same,
            18,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "fp32")),
        Scope::Device,
        gpm!(fp32_active),
        twin(
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "Ratio of cycles the fp32 pipes are active.",
            same,
            19,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "fp16")),
        Scope::Device,
        gpm!(fp16_active),
        twin(
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "Ratio of cycles the fp16 pipes are active.",
            same,
            20,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "integer")),
        Scope::Device,
        gpm!(integer_active),
        None,
    ),
    gpm_row(
        &PCIE,
        Some(("direction", "tx")),
        Scope::Gpu,
        gpm!(pcie_tx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            same,
            21,
        ),
    ),
    gpm_row(
        &PCIE,
        Some(("direction", "rx")),
        Scope::Gpu,
        gpm!(pcie_rx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            same,
            22,
        ),
    ),
    gpm_row(
        &NVLINK,
        Some(("direction", "tx")),
        Scope::Gpu,
        gpm!(nvlink_tx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            same,
            23,
        ),
    ),
    gpm_row(
        &NVLINK,
        Some(("direction", "rx")),
        Scope::Gpu,
        gpm!(nvlink_rx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            same,
            24,
        ),
    ),
    gpu_row(
        &ECC_ERRORS,
        Some(("kind", "corrected")),
        |g| int(g.ecc_corrected),
        twin(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Total number of single-bit volatile ECC errors.",
            same,
            11,
        ),
    ),
    gpu_row(
        &ECC_ERRORS,
        Some(("kind", "uncorrected")),
        |g| int(g.ecc_uncorrected),
        twin(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit volatile ECC errors.",
            same,
            12,
        ),
    ),
    Row::Series(xid_errors),
    // dcgm-exporter's XID gauge is the last XID seen (0 for none); gpuwatch counts them by code.
    Row::Reading(Reading {
        family: None,
        label: None,
        scope: Scope::Gpu,
        gpu: |g| Some(Value::Int(g.last_xid.unwrap_or(0) as i64)),
        mig: None,
        dcgm: twin(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            same,
            10,
        ),
    }),
    Row::Reading(Reading {
        family: Some(&PROCESSES),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.processes),
        mig: Some(|m| int(m.processes)),
        dcgm: None,
    }),
    Row::Series(process_memory),
    gpu_row(
        &ENCODER,
        None,
        |g| float(g.encoder_utilization_ratio),
        twin("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", percent, 25),
    ),
    gpu_row(
        &DECODER,
        None,
        |g| float(g.decoder_utilization_ratio),
        twin("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", percent, 26),
    ),
    gpu_row(
        &PCIE_REPLAYS,
        None,
        |g| int(g.pcie_replays),
        twin(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "Total number of PCIe retries.",
            same,
            27,
        ),
    ),
    pcie_link(&PCIE_LINK_GENERATION, "current", |g| int(g.pcie_link.generation)),
    pcie_link(&PCIE_LINK_GENERATION, "max", |g| int(g.pcie_link.max_generation)),
    pcie_link(&PCIE_LINK_WIDTH, "current", |g| int(g.pcie_link.width)),
    pcie_link(&PCIE_LINK_WIDTH, "max", |g| int(g.pcie_link.max_width)),
    Row::Series(unsupported),
];

/// One side of the PCIe link (`which="current"` or `"max"`); dcgm-exporter has no such field.
const fn pcie_link(family: &'static Family, which: &'static str, gpu: ReadGpu) -> Row {
    gpu_row(family, Some(("which", which)), gpu, None)
}

/// The readings with a DCGM twin, in the DCGM families' order: sorted once, not per scrape.
pub fn twins() -> &'static [(&'static Reading, &'static Twin)] {
    static TWINS: std::sync::OnceLock<Vec<(&'static Reading, &'static Twin)>> =
        std::sync::OnceLock::new();
    TWINS.get_or_init(|| {
        let mut out: Vec<_> = TABLE
            .iter()
            .filter_map(|row| match row {
                Row::Reading(r) => Some((r, r.dcgm.as_ref()?)),
                Row::Series(_) => None,
            })
            .collect();
        out.sort_by_key(|(_, t)| t.order);
        out
    })
}

/// The row's own label, if any.
struct Own(Option<(&'static str, &'static str)>);

impl EncodeLabelSet for Own {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        match self.0 {
            Some(label) => label.encode(encoder.encode_label()),
            None => Ok(()),
        }
    }
}

/// Encodes every device family under gpuwatch's names.
pub(super) fn encode(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    let same_family = |a: &Row, b: &Row| match (a, b) {
        (Row::Reading(a), Row::Reading(b)) => match (a.family, b.family) {
            (Some(x), Some(y)) => std::ptr::eq(x, y),
            _ => false,
        },
        _ => false,
    };
    for rows in TABLE.chunk_by(same_family) {
        let readings: Vec<&'static Reading> = rows
            .iter()
            .filter_map(|r| match r {
                Row::Reading(r) => Some(r),
                Row::Series(_) => None,
            })
            .collect();
        let family = match (rows, readings.first()) {
            // A family of series: one row of its own.
            ([Row::Series(series)], _) => {
                series(e, s)?;
                continue;
            }
            (
                _,
                Some(Reading {
                    family: Some(f), ..
                }),
            ) => *f,
            // A reading only dcgm-exporter's names show.
            _ => continue,
        };
        let series = family_series(&readings, s);
        let d = desc(family.name, family.help, family.unit);
        if family.counter {
            counters(e, d, series)?;
        } else {
            gauges(e, d, series)?;
        }
    }
    Ok(())
}

/// The series of one family's readings: device by device, each device's readings in row order.
fn family_series<'a>(
    readings: &[&'static Reading],
    s: &Scrape<'a>,
) -> Vec<(GpuLabels<'a, (MigLabels<'a>, Own)>, Value)> {
    let mut out = Vec::new();
    for g in s.gpus.iter().filter(|g| g.up) {
        for r in readings {
            if let Some(v) = (r.gpu)(g.sample) {
                out.push((g.labels_with((MigLabels(None), Own(r.label))), v));
            }
        }
    }
    if readings.first().is_some_and(|r| r.scope == Scope::Device) {
        for v in s.migs {
            for r in readings {
                if let Some(x) = r.mig.and_then(|read| read(v.mig)) {
                    let labels = GpuLabels {
                        gpu: v.gpu.index,
                        uuid: &v.mig.uuid,
                        pod: v.pod.map(PodRef::labels),
                        extra: (MigLabels(Some(v.mig)), Own(r.label)),
                    };
                    out.push((labels, x));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dcgm_twins_are_numbered_once_each_in_order() {
        let orders: Vec<u8> = twins().iter().map(|(_, t)| t.order).collect();
        let want: Vec<u8> = (1..=orders.len() as u8).collect();
        assert_eq!(orders, want);
        let mut names: Vec<&str> = twins().iter().map(|(_, t)| t.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), orders.len(), "a DCGM name twice");
    }

    #[test]
    fn the_rows_of_a_family_are_next_to_each_other_and_agree_on_their_scope() {
        let mut seen: Vec<&str> = Vec::new();
        let mut last: Option<&Family> = None;
        for row in TABLE {
            let Row::Reading(r) = row else {
                last = None;
                continue;
            };
            let Some(f) = r.family else { continue };
            if !last.is_some_and(|l| std::ptr::eq(l, f)) {
                assert!(!seen.contains(&f.name), "{} is split in the table", f.name);
                seen.push(f.name);
            }
            last = Some(f);
        }
        for row in TABLE {
            let Row::Reading(r) = row else { continue };
            if r.scope == Scope::Device {
                assert!(
                    r.mig.is_some(),
                    "{:?}: a per-device row reads MIG devices",
                    r.family
                );
            }
        }
    }
}
