//! Exposition of the device families: every `gpu_*` family, its dcgm-exporter twin, and the
//! snapshot-derived `gpuwatch_*` ones, encoded at scrape time from the latest snapshot (so a
//! GPU that disappears also disappears from the output) and the kubelet's pod view. Nothing
//! here calls NVML or waits on the sampler.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

mod dcgm;
mod families;
mod series;
mod table;
mod value;

use crate::config::{HostnameLabel, Names};
use crate::gpu::sampler::Snapshots;
use crate::gpu::{GpuSample, MigSample, Snapshot};
use crate::kubernetes::view::SharedKubernetesView;
use crate::kubernetes::PodRef;
use crate::metrics::encode::*;
use crate::metrics::Text;
use crate::slurm::holders::SharedHolders;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};

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

/// Registers the device families, under the names `[exposition] names` chooses, each GPU's
/// series labelled with the pods holding it where `pods` says.
pub fn register(
    config: &crate::config::Config,
    snapshots: &Snapshots,
    (pods, holders): (
        Option<&Arc<SharedKubernetesView>>,
        Option<&Arc<SharedHolders>>,
    ),
    registry: &mut prometheus_client::registry::Registry,
) {
    let mut collector = SnapshotCollector::with_names(
        snapshots.clone(),
        BuildInfo::current(),
        config.exposition.names,
        hostname(config),
    )
    .with_hostname_label(config.exposition.hostname_label);
    if let Some(view) = pods {
        collector = collector.with_pods(Arc::clone(view));
    }
    if let Some(view) = holders {
        collector.holders = Some(Holders {
            view: Arc::clone(view),
            job_label: config.slurm.job_label,
            owners: config.sampling.process_owners,
        });
    }
    registry.register_collector(Box::new(collector));
}

/// The host label of the DCGM names: the configured one, else `NODE_NAME` (which a
/// DaemonSet sets to the node's name, as dcgm-exporter's does), else the machine's hostname.
pub fn hostname(config: &crate::config::Config) -> String {
    config
        .exposition
        .hostname
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            crate::files::read_proc_text(std::path::Path::new("/proc/sys/kernel/hostname"), 256)
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

/// Encodes the snapshot-derived `gpuwatch_*` series and every GPU series, under gpuwatch's
/// names, dcgm-exporter's, or both.
pub struct SnapshotCollector {
    snapshots: Snapshots,
    build: BuildInfo,
    names: Names,
    /// The host label of the DCGM names, and that label's name.
    hostname: String,
    hostname_label: HostnameLabel,
    /// Who holds which GPU, on Kubernetes.
    pods: Option<Arc<SharedKubernetesView>>,
    /// Which jobs and users hold which GPU.
    holders: Option<Holders>,
}

/// The jobs and users holding GPUs, and which labels they add.
struct Holders {
    view: Arc<SharedHolders>,
    /// `hpc_job` on every GPU series, one series per job.
    job_label: bool,
    /// `user` on the per-process series.
    owners: bool,
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
    /// names' host label.
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
            hostname_label: HostnameLabel::default(),
            pods: None,
            holders: None,
        }
    }

    /// Names the DCGM names' host label `Hostname`, as dcgm-exporter did before it renamed the label.
    pub fn with_hostname_label(mut self, label: HostnameLabel) -> Self {
        self.hostname_label = label;
        self
    }

    /// Labels each GPU's series with the pod that holds it, from the kubelet's assignments.
    pub fn with_pods(mut self, pods: Arc<SharedKubernetesView>) -> Self {
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
        // With `[slurm] job_label`, each GPU's series carry the job holding it, one per job.
        let holders = self.holders.as_ref().map(|h| (h.view.view(), h));
        // A GPU's own series carry the jobs holding it or any of its MIG devices; a MIG
        // device's, the jobs holding that device.
        let jobs = match holders.as_ref().filter(|(_, h)| h.job_label) {
            Some((v, _)) => job_labels(v),
            None => JobLabels::default(),
        };
        let owners = holders
            .as_ref()
            .filter(|(_, h)| h.owners)
            .map(|(v, _)| &v.owners);
        let views = views(&snap.gpus, &held.gpus, &jobs.gpus);
        let gpus = &views[..];
        // A MIG device's series carry the pods holding that device.
        let migs = mig_views(&snap.gpus, &held.mig, &jobs.migs);
        // The series that identify or count GPUs, and per-process ones (a process is in one
        // pod, and NVML does not say which), stay one per GPU: no pod labels.
        let no_pods = BTreeMap::new();
        let no_jobs = BTreeMap::new();
        let unshared = self::views(&snap.gpus, &no_pods, &no_jobs);
        let e = &mut enc;

        encode_build_and_nvml(e, &self.build, &snap)?;
        if snap.is_ready() {
            encode_sampling(e, &snap)?;
        }

        let scrape = Scrape {
            gpus,
            unshared: &unshared,
            migs: &migs,
            owners,
        };
        if self.names.dcgm() {
            dcgm::encode(e, &snap, &scrape, (self.hostname_label, &self.hostname))?;
        }
        if self.names.gpuwatch() {
            table::encode(e, &scrape)?;
        } else if snap.gpus.iter().any(|g| !g.has_dcgm_names()) {
            // A GPU dcgm-exporter does not export keeps gpuwatch's names in every mode.
            let (gpus, unshared) = (own_names(gpus), own_names(&unshared));
            let migs: Vec<_> = migs
                .iter()
                .filter(|m| !m.gpu.has_dcgm_names())
                .copied()
                .collect();
            table::encode(
                e,
                &Scrape {
                    gpus: &gpus,
                    unshared: &unshared,
                    migs: &migs,
                    owners,
                },
            )?;
        }
        Ok(())
    }
}

/// The views of the GPUs that dcgm-exporter does not export.
fn own_names<'a>(views: &[GpuView<'a>]) -> Vec<GpuView<'a>> {
    views
        .iter()
        .filter(|g| !g.has_dcgm_names())
        .copied()
        .collect()
}

/// The jobs whose label the series carry, with `[slurm] job_label`.
#[derive(Default)]
struct JobLabels {
    /// By GPU: the jobs holding the GPU or any of its MIG devices.
    gpus: BTreeMap<u32, Vec<String>>,
    /// By GPU and GPU instance: the jobs holding that MIG device.
    migs: BTreeMap<(u32, u32), Vec<String>>,
}

fn job_labels(holders: &crate::slurm::holders::Holders) -> JobLabels {
    let mut jobs = JobLabels::default();
    for ((gpu, gi), held) in &holders.devices {
        let all = jobs.gpus.entry(*gpu).or_default();
        for j in &held.jobs {
            if !all.contains(j) {
                all.push(j.clone());
            }
        }
        if let Some(gi) = gi {
            jobs.migs.insert((*gpu, *gi), held.jobs.clone());
        }
    }
    jobs
}

/// `gpuwatch_build_info`, `gpuwatch_nvml_up`, and while NVML is up `gpuwatch_nvml_info`.
fn encode_build_and_nvml(
    e: &mut DescriptorEncoder,
    build: &BuildInfo,
    snap: &Snapshot,
) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpuwatch_build_info",
            "gpuwatch version and source revision",
            None,
        ),
        [(
            [
                ("version", build.version.as_str()),
                ("revision", build.revision.as_str()),
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
    Ok(())
}

/// Once a sample is ready: how many GPUs, the node's health, and the latest sample's time and
/// duration.
fn encode_sampling(e: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), fmt::Error> {
    gauge(
        e,
        desc(
            "gpuwatch_gpus",
            "GPUs NVML reports on this node, lost ones included",
            None,
        ),
        snap.gpus.len() as i64,
    )?;
    // The node's health: the worst of its GPUs', while any GPU's is known.
    if let Some(worst) = crate::health::node(snap.gpus.iter().filter_map(|g| g.health.as_ref())) {
        gauges(
            e,
            desc(
                "gpuwatch_node_health",
                "1 for the node's health state, the worst of its GPUs' (healthy, degraded or unhealthy), 0 for the rest",
                None,
            ),
            crate::health::State::ALL
                .into_iter()
                .map(|state| ([("state", state.as_str())], i64::from(state == worst))),
        )?;
    }
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
    )
}

/// What one scrape's device families read: the GPUs (one view per pod holding one), the same
/// without pods (for identity and per-process series), and the MIG devices.
pub(crate) struct Scrape<'a> {
    pub(crate) gpus: &'a [GpuView<'a>],
    pub(crate) unshared: &'a [GpuView<'a>],
    pub(crate) migs: &'a [MigView<'a>],
    /// With `[sampling] process_owners`: each GPU process's user, by pid.
    pub(crate) owners: Option<&'a BTreeMap<u32, String>>,
}

/// One GPU as its series show it: the sample, and the pod holding it, if any. A GPU shared by
/// several pods (time-slicing) is one view per pod, so it has one series per pod.
#[derive(Clone, Copy)]
pub(crate) struct GpuView<'a> {
    pub(crate) sample: &'a GpuSample,
    pub(crate) pod: Option<&'a PodRef>,
    /// The Slurm job holding it, with `[slurm] job_label` (one view per job, as per pod).
    pub(crate) job: Option<&'a str>,
}

impl std::ops::Deref for GpuView<'_> {
    type Target = GpuSample;

    fn deref(&self) -> &GpuSample {
        self.sample
    }
}

impl<'a> GpuView<'a> {
    pub(crate) fn pod_labels(&self) -> Option<PodLabels<'a>> {
        self.pod.map(PodRef::labels)
    }

    /// The GPU's label set (`gpu`, `uuid`, the pod holding it) with a series' own labels.
    pub(crate) fn labels_with<X>(&self, extra: X) -> GpuLabels<'a, X> {
        GpuLabels {
            gpu: self.sample.index,
            uuid: &self.sample.uuid,
            pod: self.pod_labels(),
            hpc_job: self.job,
            extra,
        }
    }
}

/// One MIG device as its series show it: its GPU, the device, and the pod holding it, if any
/// (one view per pod, as for a GPU).
#[derive(Clone, Copy)]
pub(crate) struct MigView<'a> {
    pub(crate) gpu: &'a GpuSample,
    pub(crate) mig: &'a MigSample,
    pub(crate) pod: Option<&'a PodRef>,
    /// The Slurm job holding it, with `[slurm] job_label`.
    pub(crate) job: Option<&'a str>,
}

/// The views of the MIG devices of a snapshot's GPUs that are up, given who holds each (by MIG
/// device UUID).
pub(crate) fn mig_views<'a>(
    gpus: &'a [GpuSample],
    pods: &'a BTreeMap<String, Vec<PodRef>>,
    jobs: &'a BTreeMap<(u32, u32), Vec<String>>,
) -> Vec<MigView<'a>> {
    let mut out = Vec::new();
    for gpu in gpus.iter().filter(|g| g.up) {
        for mig in &gpu.mig {
            let pods = each_or_none(pods.get(&mig.uuid));
            let jobs = each_or_none(mig.gpu_instance.and_then(|gi| jobs.get(&(gpu.index, gi))));
            for pod in &pods {
                out.extend(jobs.iter().map(|job| MigView {
                    gpu,
                    mig,
                    pod: *pod,
                    job: (*job).map(String::as_str),
                }));
            }
        }
    }
    out
}

/// Each holder of a device, or one `None` where it has none: a device's series are one per
/// holder, or one without.
fn each_or_none<T>(held: Option<&Vec<T>>) -> Vec<Option<&T>> {
    match held.filter(|h| !h.is_empty()) {
        Some(held) => held.iter().map(Some).collect(),
        None => vec![None],
    }
}

/// The views of a snapshot's GPUs, given the pods and the jobs holding each (by GPU index): one
/// view per pod and job.
pub(crate) fn views<'a>(
    gpus: &'a [GpuSample],
    pods: &'a BTreeMap<u32, Vec<PodRef>>,
    jobs: &'a BTreeMap<u32, Vec<String>>,
) -> Vec<GpuView<'a>> {
    let mut out = Vec::with_capacity(gpus.len());
    for g in gpus {
        let pods = each_or_none(pods.get(&g.index));
        let jobs = each_or_none(jobs.get(&g.index));
        for pod in &pods {
            out.extend(jobs.iter().map(|job| GpuView {
                sample: g,
                pod: *pod,
                job: (*job).map(String::as_str),
            }));
        }
    }
    out
}

/// A MIG device's own labels (`gpu_instance`, `compute_instance`, `mig_profile`); none for a
/// GPU.
#[derive(Debug, Clone, Copy)]
pub struct MigLabels<'a>(pub Option<&'a MigSample>);

impl EncodeLabelSet for MigLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        let Some(m) = self.0 else {
            return Ok(());
        };
        if let Some(gi) = m.gpu_instance {
            ("gpu_instance", gi).encode(encoder.encode_label())?;
        }
        if let Some(ci) = m.compute_instance {
            ("compute_instance", ci).encode(encoder.encode_label())?;
        }
        if let Some(p) = &m.profile {
            ("mig_profile", Text(p)).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}
