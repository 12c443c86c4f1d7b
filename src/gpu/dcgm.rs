//! The GPU series under dcgm-exporter's names (`[exposition] names = "dcgm"` or `"both"`), so
//! that dashboards and alerts written for NVIDIA's exporter work unchanged: its default
//! counters' names, units and labels (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
//! `Hostname`, `DCGM_FI_DRIVER_VERSION`). A GPU in MIG mode is its GPU instances, as
//! dcgm-exporter shows them: each with `GPU_I_PROFILE` and `GPU_I_ID` beside its GPU's labels,
//! its own memory and profiling metrics, its GPU's physical ones, and the pods holding it.
//!
//! dcgm-exporter writes the Prometheus text format, where a counter keeps its bare name. In
//! OpenMetrics, which gpuwatch serves, a counter's samples end in `_total`, so the two counters
//! among these (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` and the ECC totals) are typed gauge here:
//! the names stay exactly what queries ask for, and `rate()` works on them as before.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};

use super::gpm::GpmReadings;
use super::metrics::{GpuView, MigView};
use super::{GpuSample, MigSample, Snapshot};
use crate::kubernetes::PodRef;
use crate::metrics::encode::*;
use crate::metrics::Text;

/// dcgm-exporter's label set, in its order (the pod's labels last, as it sorts them).
struct DcgmLabels<'a> {
    gpu: u32,
    uuid: &'a str,
    pci_bus_id: &'a str,
    model: &'a str,
    hostname: &'a str,
    driver: &'a str,
    /// The GPU instance, for a GPU in MIG mode.
    mig: Option<&'a MigSample>,
    pod: Option<PodLabels<'a>>,
}

impl EncodeLabelSet for DcgmLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        ("gpu", self.gpu).encode(encoder.encode_label())?;
        if !self.uuid.is_empty() {
            ("UUID", Text(self.uuid)).encode(encoder.encode_label())?;
        }
        ("pci_bus_id", Text(self.pci_bus_id)).encode(encoder.encode_label())?;
        ("device", format!("nvidia{}", self.gpu)).encode(encoder.encode_label())?;
        ("modelName", Text(self.model)).encode(encoder.encode_label())?;
        if let Some(m) = self.mig {
            if let Some(p) = &m.profile {
                ("GPU_I_PROFILE", Text(p)).encode(encoder.encode_label())?;
            }
            if let Some(gi) = m.gpu_instance {
                ("GPU_I_ID", gi).encode(encoder.encode_label())?;
            }
        }
        ("Hostname", Text(self.hostname)).encode(encoder.encode_label())?;
        ("DCGM_FI_DRIVER_VERSION", Text(self.driver)).encode(encoder.encode_label())?;
        if let Some(p) = &self.pod {
            ("container", Text(p.container)).encode(encoder.encode_label())?;
            ("namespace", Text(p.namespace)).encode(encoder.encode_label())?;
            ("pod", Text(p.pod)).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// The GPUs the families are over, and the labels they share.
struct Gpus<'a> {
    views: &'a [GpuView<'a>],
    /// Each GPU instance of a GPU in MIG mode: its GPU, its first MIG device, and a pod holding
    /// any of its MIG devices (one entry per pod; one without a pod when none does).
    instances: Vec<(&'a GpuSample, &'a MigSample, Option<&'a PodRef>)>,
    driver: &'a str,
    hostname: &'a str,
}

impl<'a> Gpus<'a> {
    /// The labels of a GPU's series, before any GPU instance or pod.
    fn labels(&self, g: &'a GpuSample) -> DcgmLabels<'a> {
        DcgmLabels {
            gpu: g.index,
            uuid: &g.uuid,
            pci_bus_id: g.pci_bus_id.as_deref().unwrap_or(""),
            model: g.name.as_deref().unwrap_or(""),
            hostname: self.hostname,
            driver: self.driver,
            mig: None,
            pod: None,
        }
    }
}

/// One DCGM family: every GPU that is up and has the reading, converted to DCGM's unit; for a
/// GPU in MIG mode, each of its GPU instances (read with the instance's first MIG device).
fn family<V: prometheus_client::encoding::EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &'static str,
    help: &'static str,
    gpus: &Gpus<'_>,
    read: impl Fn(&GpuSample, Option<&MigSample>) -> Option<V>,
) -> Result<(), fmt::Error> {
    let whole = gpus
        .views
        .iter()
        .filter(|g| g.up && g.sample.mig.is_empty())
        .filter_map(|g| {
            let l = DcgmLabels {
                pod: g.pod_labels(),
                ..gpus.labels(g.sample)
            };
            read(g.sample, None).map(|v| (l, v))
        });
    let instances = gpus.instances.iter().filter_map(|&(gpu, mig, pod)| {
        let l = DcgmLabels {
            mig: Some(mig),
            pod: pod.map(PodLabels::of),
            ..gpus.labels(gpu)
        };
        read(gpu, Some(mig)).map(|x| (l, x))
    });
    gauges(e, desc(name, help, None), whole.chain(instances))
}

const MIB: f64 = 1024.0 * 1024.0;

/// The GPU instances of the MIG views, each with every pod holding one of its MIG devices.
fn instances<'a>(
    migs: &'a [MigView<'a>],
) -> Vec<(&'a GpuSample, &'a MigSample, Option<&'a PodRef>)> {
    let mut out: Vec<(&GpuSample, &MigSample, Option<&PodRef>)> = Vec::new();
    for v in migs {
        let first = v
            .gpu
            .mig
            .iter()
            .find(|m| m.gpu_instance == v.mig.gpu_instance)
            .unwrap_or(v.mig);
        let mut of_instance = out.iter().filter(|x| std::ptr::eq(x.1, first));
        match v.pod {
            Some(pod) => {
                if !of_instance.any(|x| x.2 == Some(pod)) {
                    out.retain(|x| !(std::ptr::eq(x.1, first) && x.2.is_none()));
                    out.push((v.gpu, first, Some(pod)));
                }
            }
            None => {
                if of_instance.next().is_none() {
                    out.push((v.gpu, first, None));
                }
            }
        }
    }
    out
}

/// A ratio from NVML's whole percent back to the percent it was.
fn percent(ratio: f64) -> i64 {
    (ratio * 100.0).round() as i64
}

pub(super) fn encode(
    e: &mut DescriptorEncoder,
    snap: &Snapshot,
    views: &[GpuView<'_>],
    migs: &[MigView<'_>],
    hostname: &str,
) -> Result<(), fmt::Error> {
    if !snap.nvml.up {
        return Ok(());
    }
    let gpus = &Gpus {
        views,
        instances: instances(migs),
        driver: snap.nvml.driver_version.as_deref().unwrap_or(""),
        hostname,
    };
    family(
        e,
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        gpus,
        |g, _| g.utilization_ratio.map(percent),
    )?;
    family(
        e,
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        gpus,
        |g, _| g.memory_utilization_ratio.map(percent),
    )?;
    family(
        e,
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        gpus,
        |g, m| {
            m.map_or(g.memory_used_bytes, |m| m.memory_used_bytes)
                .map(|b| (b as f64 / MIB).floor() as i64)
        },
    )?;
    family(
        e,
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        gpus,
        |g, m| {
            m.map_or(g.memory_free_bytes, |m| m.memory_free_bytes())
                .map(|b| (b as f64 / MIB).floor() as i64)
        },
    )?;
    family(
        e,
        "DCGM_FI_DEV_GPU_TEMP",
        "GPU temperature (in C).",
        gpus,
        |g, _| g.temperature_celsius.map(|c| c.round() as i64),
    )?;
    family(
        e,
        "DCGM_FI_DEV_POWER_USAGE",
        "Power draw (in W).",
        gpus,
        |g, _| g.power_watts,
    )?;
    family(
        e,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        gpus,
        |g, _| g.energy_joules.map(|j| (j * 1000.0).round() as i64),
    )?;
    family(
        e,
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        gpus,
        |g, _| g.sm_clock_hertz.map(|h| (h / 1e6).round() as i64),
    )?;
    family(
        e,
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        gpus,
        |g, _| g.memory_clock_hertz.map(|h| (h / 1e6).round() as i64),
    )?;
    family(
        e,
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        gpus,
        |g, _| Some(g.last_xid.unwrap_or(0) as i64),
    )?;
    family(
        e,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        gpus,
        |g, _| g.ecc_corrected.map(|v| v as i64),
    )?;
    family(
        e,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        gpus,
        |g, _| g.ecc_uncorrected.map(|v| v as i64),
    )?;
    encode_prof(e, gpus)
}

/// The profiling families, from GPM, in dcgm-exporter's units: activities as ratios from 0 to
/// 1, PCIe and NVLink traffic in bytes per second.
fn encode_prof(e: &mut DescriptorEncoder, gpus: &Gpus<'_>) -> Result<(), fmt::Error> {
    type Read = fn(&GpmReadings) -> Option<f64>;
    let families: [(&'static str, &'static str, Read); 11] = [
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
            |m| m.graphics_active,
        ),
        (
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            |m| m.sm_active,
        ),
        (
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "The ratio of number of warps resident on an SM.",
            |m| m.sm_occupancy,
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            |m| m.tensor_active,
        ),
        (
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            |m| m.dram_active,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "Ratio of cycles the fp64 pipes are active.",
            |m| m.fp64_active,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "Ratio of cycles the fp32 pipes are active.",
            |m| m.fp32_active,
        ),
        (
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "Ratio of cycles the fp16 pipes are active.",
            |m| m.fp16_active,
        ),
        (
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            |m| m.pcie_tx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            |m| m.pcie_rx_bytes_per_second,
        ),
        (
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            |m| m.nvlink_tx_bytes_per_second,
        ),
    ];
    // A GPU instance's own activity, in MIG mode.
    fn gpm<'a>(g: &'a GpuSample, m: Option<&'a MigSample>) -> Option<&'a GpmReadings> {
        m.map_or(g.gpm.as_ref(), |m| m.gpm.as_ref())
    }
    for (name, help, read) in families {
        family(e, name, help, gpus, |g, m| gpm(g, m).and_then(read))?;
    }
    family(
        e,
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
        gpus,
        |g, m| gpm(g, m).and_then(|m| m.nvlink_rx_bytes_per_second),
    )
}
