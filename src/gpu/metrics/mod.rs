//! GPU sampling's series: every `gpu_*` family and the snapshot-derived `gpuwatch_*` ones,
//! encoded at scrape time from the latest snapshot (so a GPU that disappears also disappears
//! from the output), and the sampler's error counters. Nothing here calls NVML or waits on the
//! sampler.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::registry::Registry;

mod profiling;

pub use self::profiling::MigLabels;
use self::profiling::{encode_gpm, per_device};
use super::sampler::Snapshots;
use super::{GpuSample, MigSample, Snapshot};
use crate::config::Names;
use crate::kubernetes::metrics::KubernetesMetrics;
use crate::kubernetes::PodRef;
use crate::metrics::encode::*;
use crate::metrics::Text;

/// Why a sample, or part of one, is missing.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
#[repr(usize)]
pub enum SampleError {
    /// The NVML library failed to load or initialise.
    NvmlInit,
    /// A GPU answered `GPU_IS_LOST`.
    GpuLost,
    /// An NVML call failed with something other than "not supported".
    ReadFailed,
    /// NVML answered a value outside its valid range.
    OutOfRange,
    /// A sampling cycle overran its timeout and was abandoned.
    Timeout,
    /// Watching XID events failed.
    Xid,
}

impl SampleError {
    pub const ALL: [SampleError; 6] = [
        SampleError::NvmlInit,
        SampleError::GpuLost,
        SampleError::ReadFailed,
        SampleError::OutOfRange,
        SampleError::Timeout,
        SampleError::Xid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SampleError::NvmlInit => "nvml_init",
            SampleError::GpuLost => "gpu_lost",
            SampleError::ReadFailed => "read_failed",
            SampleError::OutOfRange => "out_of_range",
            SampleError::Timeout => "timeout",
            SampleError::Xid => "xid",
        }
    }
}

impl EncodeLabelValue for SampleError {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// The daemon's own counters. Lock-free; cheap to update from any thread.
#[derive(Debug, Default)]
pub struct SamplerMetrics {
    errors: [AtomicU64; SampleError::ALL.len()],
    /// GPM sample buffers held now: two per GPU (and per GPU instance) with GPM.
    gpm_buffers: AtomicU64,
}

impl SamplerMetrics {
    /// Registers the counters; every kind is present from the start, at 0, in a fixed order.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(Arc::clone(self)));
    }

    pub fn error(&self, kind: SampleError) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn error_count(&self, kind: SampleError) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    pub fn set_gpm_buffers(&self, n: usize) {
        self.gpm_buffers.store(n as u64, Ordering::Relaxed);
    }
}

/// Version and source revision of this build, for `gpuwatch_build_info`.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    pub version: String,
    pub revision: String,
}

impl BuildInfo {
    pub fn current() -> Self {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision: env!("GPUWATCH_REVISION").to_string(),
        }
    }
}

/// Encodes the snapshot-derived `gpuwatch_*` series and every GPU series, under gpuwatch's
/// names, dcgm-exporter's, or both.
pub struct SnapshotCollector {
    snapshots: Snapshots,
    build: BuildInfo,
    names: Names,
    /// The `Hostname` label of the DCGM names.
    hostname: String,
    /// Who holds which GPU, on Kubernetes.
    pods: Option<Arc<KubernetesMetrics>>,
}

impl fmt::Debug for SnapshotCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotCollector")
            .field("build", &self.build)
            .finish()
    }
}

impl SnapshotCollector {
    /// A collector under gpuwatch's own names.
    pub fn new(snapshots: Snapshots, build: BuildInfo) -> Self {
        SnapshotCollector::with_names(snapshots, build, Names::Gpuwatch, String::new())
    }

    /// A collector under the names chosen by `[exposition] names`; `hostname` is the DCGM
    /// names' `Hostname` label.
    pub fn with_names(
        snapshots: Snapshots,
        build: BuildInfo,
        names: Names,
        hostname: String,
    ) -> Self {
        SnapshotCollector {
            snapshots,
            build,
            names,
            hostname,
            pods: None,
        }
    }

    /// Labels each GPU's series with the pod that holds it, from the kubelet's assignments.
    pub fn with_pods(mut self, pods: Arc<KubernetesMetrics>) -> Self {
        self.pods = Some(pods);
        self
    }

    fn snapshot(&self) -> std::sync::Arc<Snapshot> {
        self.snapshots.latest()
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let snap = self.snapshot();
        // On Kubernetes, who holds each GPU: its series carry the pod, one series per pod.
        let held = self
            .pods
            .as_ref()
            .map(|p| p.view().held(&snap.gpus))
            .unwrap_or_default();
        let views = views(&snap.gpus, &held.gpus);
        let gpus = &views[..];
        // A MIG device's series carry the pods holding that device.
        let migs = mig_views(&snap.gpus, &held.mig);
        // The series that identify or count GPUs, and per-process ones (a process is in one
        // pod, and NVML does not say which), stay one per GPU: no pod labels.
        let no_pods = BTreeMap::new();
        let unshared = self::views(&snap.gpus, &no_pods);
        let e = &mut enc;

        gauges(
            e,
            desc(
                "gpuwatch_build_info",
                "gpuwatch version and source revision",
                None,
            ),
            [(
                [
                    ("version", self.build.version.as_str()),
                    ("revision", self.build.revision.as_str()),
                ],
                1i64,
            )],
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_nvml_up",
                "1 when the NVML library is loaded and answering",
                None,
            ),
            i64::from(snap.nvml.up),
        )?;
        if snap.nvml.up {
            let unknown = "unknown";
            gauges(
                e,
                desc(
                    "gpuwatch_nvml_info",
                    "NVIDIA driver, NVML and CUDA driver versions",
                    None,
                ),
                [(
                    [
                        (
                            "driver_version",
                            Text(snap.nvml.driver_version.as_deref().unwrap_or(unknown)),
                        ),
                        (
                            "nvml_version",
                            Text(snap.nvml.nvml_version.as_deref().unwrap_or(unknown)),
                        ),
                        (
                            "cuda_driver_version",
                            Text(snap.nvml.cuda_driver_version.as_deref().unwrap_or(unknown)),
                        ),
                    ],
                    1i64,
                )],
            )?;
        }
        if snap.is_ready() {
            gauge(
                e,
                desc(
                    "gpuwatch_gpus",
                    "GPUs NVML reports on this node, lost ones included",
                    None,
                ),
                snap.gpus.len() as i64,
            )?;
            gauge(
                e,
                desc(
                    "gpuwatch_last_sample_timestamp",
                    "When the latest sample was taken",
                    Some("seconds"),
                ),
                snap.timestamp,
            )?;
            gauge(
                e,
                desc(
                    "gpuwatch_sample_duration",
                    "How long the latest sampling cycle took",
                    Some("seconds"),
                ),
                snap.duration_seconds,
            )?;
        }

        if self.names.dcgm() {
            super::dcgm::encode(e, &snap, gpus, &migs, &self.hostname)?;
        }
        if !self.names.gpuwatch() {
            return Ok(());
        }
        gauges(
            e,
            desc("gpu_info", "GPU identity; value 1", None),
            // A lost GPU keeps its identity, as far as it was ever read.
            unshared
                .iter()
                .filter(|g| g.up || g.name.is_some() || g.pci_bus_id.is_some())
                .map(|g| {
                    let extra = [
                        ("name", Text(g.name.as_deref().unwrap_or(""))),
                        ("pci_bus_id", Text(g.pci_bus_id.as_deref().unwrap_or(""))),
                    ];
                    (with(g, extra), 1i64)
                }),
        )?;
        gauges(
            e,
            desc(
                "gpu_up",
                "1 when the GPU answers NVML, 0 when it is lost",
                None,
            ),
            unshared.iter().map(|g| (labels(g), i64::from(g.up))),
        )?;
        gauges(
            e,
            desc(
                "gpu_utilization",
                "Fraction of the last sample period a kernel was running",
                Some("ratio"),
            ),
            per_gpu(gpus, |g| g.utilization_ratio),
        )?;
        gauges(
            e,
            desc(
                "gpu_memory_utilization",
                "Fraction of the last sample period device memory was read or written",
                Some("ratio"),
            ),
            per_gpu(gpus, |g| g.memory_utilization_ratio),
        )?;
        // A MIG device is a device of its own: its memory, processes and GPM metrics carry its
        // UUID, GPU instance, compute instance and profile, beside its GPU's index.
        gauges(
            e,
            desc("gpu_memory_used", "Device memory in use", Some("bytes")),
            per_device(
                gpus,
                &migs,
                |g| g.memory_used_bytes.map(|v| v as i64),
                |m| m.memory_used_bytes.map(|v| v as i64),
            ),
        )?;
        gauges(
            e,
            desc("gpu_memory_free", "Device memory free", Some("bytes")),
            per_device(
                gpus,
                &migs,
                |g| g.memory_free_bytes.map(|v| v as i64),
                |m| m.memory_free_bytes().map(|v| v as i64),
            ),
        )?;
        gauges(
            e,
            desc("gpu_memory_total", "Device memory in all", Some("bytes")),
            per_device(
                gpus,
                &migs,
                |g| g.memory_total_bytes.map(|v| v as i64),
                |m| m.memory_total_bytes.map(|v| v as i64),
            ),
        )?;
        gauges(
            e,
            desc("gpu_temperature", "GPU core temperature", Some("celsius")),
            per_gpu(gpus, |g| g.temperature_celsius),
        )?;
        gauges(
            e,
            desc("gpu_power", "Power draw", Some("watts")),
            per_gpu(gpus, |g| g.power_watts),
        )?;
        gauges(
            e,
            desc("gpu_power_limit", "Enforced power limit", Some("watts")),
            per_gpu(gpus, |g| g.power_limit_watts),
        )?;
        counters(
            e,
            desc(
                "gpu_energy",
                "Energy consumed since the driver loaded",
                Some("joules"),
            ),
            per_gpu(gpus, |g| g.energy_joules),
        )?;
        gauges(
            e,
            desc("gpu_clock", "Current clock frequency", Some("hertz")),
            gpus.iter().filter(|g| g.up).flat_map(|g| {
                let sm = g.sm_clock_hertz.map(|v| (with(g, [("clock", "sm")]), v));
                let mem = g
                    .memory_clock_hertz
                    .map(|v| (with(g, [("clock", "memory")]), v));
                sm.into_iter().chain(mem)
            }),
        )?;
        gauges(
            e,
            desc(
                "gpu_clock_throttle_active",
                "1 while the reason is holding clocks down; one series per reason the GPU supports",
                None,
            ),
            gpus.iter().filter(|g| g.up).flat_map(|g| {
                g.throttle_reasons
                    .iter()
                    .map(move |t| (with(g, [("reason", t.reason)]), i64::from(t.active)))
            }),
        )?;
        encode_gpm(e, &unshared, gpus, &migs)?;
        counters(
            e,
            desc(
                "gpu_ecc_errors",
                "ECC errors since the driver loaded (volatile counters)",
                None,
            ),
            gpus.iter().filter(|g| g.up).flat_map(|g| {
                let c = g
                    .ecc_corrected
                    .map(|v| (with(g, [("kind", "corrected")]), v));
                let u = g
                    .ecc_uncorrected
                    .map(|v| (with(g, [("kind", "uncorrected")]), v));
                c.into_iter().chain(u)
            }),
        )?;
        // XID counts stay visible for lost GPUs: an XID is often what explains the loss, and a
        // counter that vanished and came back would read as a reset.
        counters(
            e,
            desc(
                "gpu_xid_errors",
                "Critical XID errors seen since gpuwatch started, by XID code",
                None,
            ),
            gpus.iter().flat_map(|g| {
                g.xid_errors
                    .iter()
                    .map(move |(xid, n)| (with(g, [("xid", *xid)]), *n))
            }),
        )?;
        gauges(
            e,
            desc("gpu_processes", "Running compute processes", None),
            per_device(
                gpus,
                &migs,
                |g| g.processes.map(i64::from),
                |m| m.processes.map(i64::from),
            ),
        )?;
        gauges(
            e,
            desc(
                "gpu_process_memory_used",
                "Device memory used by one compute process",
                Some("bytes"),
            ),
            unshared.iter().filter(|g| g.up).flat_map(|g| {
                g.process_memory.iter().flatten().filter_map(move |p| {
                    let extra = (
                        [("pid", p.pid)],
                        [("process", Text(p.name.as_deref().unwrap_or("")))],
                    );
                    p.used_memory_bytes.map(|b| (with(g, extra), b as i64))
                })
            }),
        )?;
        Ok(())
    }
}

impl Collector for SamplerMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        counters(
            &mut enc,
            desc(
                "gpuwatch_sample_errors",
                "Sampling errors by kind: failed or out-of-range readings, lost GPUs, NVML init failures, abandoned cycles",
                None,
            ),
            SampleError::ALL
                .iter()
                .map(|k| ([("kind", k.as_str())], self.error_count(*k))),
        )?;
        gauge(
            &mut enc,
            desc(
                "gpuwatch_gpm_sample_buffers",
                "GPM sample buffers held: two per GPU, and per GPU instance, with GPM",
                None,
            ),
            self.gpm_buffers.load(Ordering::Relaxed) as i64,
        )
    }
}

/// One GPU as its series show it: the sample, and the pod holding it, if any. A GPU shared by
/// several pods (time-slicing) is one view per pod, so it has one series per pod.
pub(super) struct GpuView<'a> {
    pub(super) sample: &'a GpuSample,
    pub(super) pod: Option<&'a PodRef>,
}

impl std::ops::Deref for GpuView<'_> {
    type Target = GpuSample;

    fn deref(&self) -> &GpuSample {
        self.sample
    }
}

impl<'a> GpuView<'a> {
    pub(super) fn pod_labels(&self) -> Option<PodLabels<'a>> {
        self.pod.map(PodLabels::of)
    }
}

/// One MIG device as its series show it: its GPU, the device, and the pod holding it, if any
/// (one view per pod, as for a GPU).
pub(super) struct MigView<'a> {
    pub(super) gpu: &'a GpuSample,
    pub(super) mig: &'a MigSample,
    pub(super) pod: Option<&'a PodRef>,
}

/// The views of the MIG devices of a snapshot's GPUs that are up, given who holds each (by MIG
/// device UUID).
pub(super) fn mig_views<'a>(
    gpus: &'a [GpuSample],
    pods: &'a BTreeMap<String, Vec<PodRef>>,
) -> Vec<MigView<'a>> {
    let mut out = Vec::new();
    for gpu in gpus.iter().filter(|g| g.up) {
        for mig in &gpu.mig {
            match pods.get(&mig.uuid).filter(|p| !p.is_empty()) {
                Some(held) => out.extend(held.iter().map(|p| MigView {
                    gpu,
                    mig,
                    pod: Some(p),
                })),
                None => out.push(MigView {
                    gpu,
                    mig,
                    pod: None,
                }),
            }
        }
    }
    out
}

/// The views of a snapshot's GPUs, given who holds each (by GPU index).
pub(super) fn views<'a>(
    gpus: &'a [GpuSample],
    pods: &'a BTreeMap<u32, Vec<PodRef>>,
) -> Vec<GpuView<'a>> {
    let mut out = Vec::with_capacity(gpus.len());
    for g in gpus {
        match pods.get(&g.index).filter(|p| !p.is_empty()) {
            Some(held) => out.extend(held.iter().map(|p| GpuView {
                sample: g,
                pod: Some(p),
            })),
            None => out.push(GpuView {
                sample: g,
                pod: None,
            }),
        }
    }
    out
}

fn labels<'a>(g: &GpuView<'a>) -> GpuLabels<'a, NoLabels> {
    with(g, NO_LABELS)
}

fn with<'a, X>(g: &GpuView<'a>, extra: X) -> GpuLabels<'a, X> {
    GpuLabels {
        gpu: g.sample.index,
        uuid: &g.sample.uuid,
        pod: g.pod_labels(),
        extra,
    }
}

/// Series of one optional reading of every GPU that is up.
fn per_gpu<'a, V: 'a>(
    gpus: &'a [GpuView<'a>],
    read: impl Fn(&'a GpuView<'a>) -> Option<V> + 'a,
) -> impl Iterator<Item = (GpuLabels<'a, NoLabels>, V)> + 'a {
    gpus.iter()
        .filter(|g| g.up)
        .filter_map(move |g| read(g).map(|v| (labels(g), v)))
}
