//! The GPU series under dcgm-exporter's names (`[exposition] names = "dcgm"` or `"both"`), so
//! that dashboards and alerts written for NVIDIA's exporter work unchanged: its default
//! counters' names, units and labels (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
//! `hostname` (or `Hostname`, as older releases spell it), `DCGM_FI_DRIVER_VERSION`). A GPU in MIG mode is its GPU instances, as
//! dcgm-exporter shows them: each with `GPU_I_PROFILE` and `GPU_I_ID` beside its GPU's labels,
//! its own memory and profiling metrics, its GPU's physical ones, and the pods holding it.
//! Only the GPUs dcgm-exporter itself exports have these names; the others keep gpuwatch's.
//!
//! dcgm-exporter writes the Prometheus text format, where a counter keeps its bare name. In
//! OpenMetrics, which gpuwatch serves, a counter's samples end in `_total`, so the two counters
//! among these (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` and the ECC totals) are typed gauge here:
//! the names stay exactly what queries ask for, and `rate()` works on them as before.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};

use super::table::{self, Value};
use super::{GpuView, MigView, Scrape};
use crate::config::HostnameLabel;
use crate::gpu::{GpuSample, MigSample, Snapshot};
use crate::kubernetes::PodRef;
use crate::metrics::encode::*;
use crate::metrics::Text;

/// dcgm-exporter's label set, in its order (the pod's labels last, as it sorts them).
struct DcgmLabels<'a> {
    gpu: u32,
    uuid: &'a str,
    pci_bus_id: &'a str,
    model: &'a str,
    hostname: (HostnameLabel, &'a str),
    driver: &'a str,
    /// The GPU instance, for a GPU in MIG mode.
    mig: Option<&'a MigSample>,
    pod: Option<PodLabels<'a>>,
    hpc_job: Option<&'a str>,
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
        let (label, host) = self.hostname;
        (label.name(), Text(host)).encode(encoder.encode_label())?;
        ("DCGM_FI_DRIVER_VERSION", Text(self.driver)).encode(encoder.encode_label())?;
        if let Some(p) = &self.pod {
            ("container", Text(p.container)).encode(encoder.encode_label())?;
            ("namespace", Text(p.namespace)).encode(encoder.encode_label())?;
            ("pod", Text(p.pod)).encode(encoder.encode_label())?;
        }
        if let Some(job) = self.hpc_job {
            ("hpc_job", Text(job)).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// The GPUs the families are over, and the labels they share.
struct Gpus<'a> {
    views: &'a [GpuView<'a>],
    /// Each GPU instance of a GPU in MIG mode: its GPU, its first MIG device, and a pod holding
    /// any of its MIG devices (one entry per pod; one without a pod when none does).
    instances: Vec<Instance<'a>>,
    driver: &'a str,
    hostname: (HostnameLabel, &'a str),
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
            hpc_job: None,
        }
    }
}

/// One DCGM family: every GPU that is up and has the reading, converted to DCGM's unit; for a
/// GPU in MIG mode, each of its GPU instances (read with the instance's first MIG device).
fn family(
    e: &mut DescriptorEncoder,
    name: &'static str,
    help: &'static str,
    gpus: &Gpus<'_>,
    read: impl Fn(&GpuSample, Option<&MigSample>) -> Option<Value>,
) -> Result<(), fmt::Error> {
    let whole = gpus
        .views
        .iter()
        .filter(|g| g.up && g.sample.mig.is_empty() && g.sample.has_dcgm_names())
        .filter_map(|g| {
            let l = DcgmLabels {
                pod: g.pod_labels(),
                hpc_job: g.job,
                ..gpus.labels(g.sample)
            };
            read(g.sample, None).map(|v| (l, v))
        });
    let instances = gpus.instances.iter().filter_map(|&(gpu, mig, (pod, job))| {
        let l = DcgmLabels {
            mig: Some(mig),
            pod: pod.map(PodRef::labels),
            hpc_job: job,
            ..gpus.labels(gpu)
        };
        read(gpu, Some(mig)).map(|x| (l, x))
    });
    gauges(e, desc(name, help, None), whole.chain(instances))
}

/// A GPU instance: its GPU, its first MIG device, and a pod and a job holding one of its MIG
/// devices.
type Instance<'a> = (
    &'a GpuSample,
    &'a MigSample,
    (Option<&'a PodRef>, Option<&'a str>),
);

/// The GPU instances of the MIG views, each with every pod (and job) holding one of its MIG
/// devices.
fn instances<'a>(migs: &'a [MigView<'a>]) -> Vec<Instance<'a>> {
    let mut out: Vec<Instance<'a>> = Vec::new();
    for v in migs {
        let first = v
            .gpu
            .mig
            .iter()
            .find(|m| m.gpu_instance == v.mig.gpu_instance)
            .unwrap_or(v.mig);
        let holder = (v.pod, v.job);
        let mut of_instance = out.iter().filter(|x| std::ptr::eq(x.1, first));
        if holder == (None, None) {
            if of_instance.next().is_none() {
                out.push((v.gpu, first, holder));
            }
        } else if !of_instance.any(|x| x.2 == holder) {
            out.retain(|x| !(std::ptr::eq(x.1, first) && x.2 == (None, None)));
            out.push((v.gpu, first, holder));
        }
    }
    out
}

/// Every DCGM family of the table, in its order.
pub(super) fn encode(
    e: &mut DescriptorEncoder,
    snap: &Snapshot,
    s: &Scrape<'_>,
    hostname: (HostnameLabel, &str),
) -> Result<(), fmt::Error> {
    if !snap.nvml.up {
        return Ok(());
    }
    let gpus = &Gpus {
        views: s.gpus,
        instances: instances(s.migs),
        driver: snap.nvml.driver_version.as_deref().unwrap_or(""),
        hostname,
    };
    for (reading, twin) in table::twins() {
        family(e, twin.name, twin.help, gpus, |g, m| {
            // A GPU instance reads through its first MIG device where the row has a MIG read.
            let value = match (m, reading.mig) {
                (Some(m), Some(read)) => read(m),
                _ => (reading.gpu)(g),
            };
            value.map(twin.convert)
        })?;
    }
    Ok(())
}
