//! Kubernetes' series: whether the kubelet answers, how often it failed, and which pod holds
//! which GPU (`gpuwatch_pod_gpu_allocated`). The pod labels on the GPU series themselves are
//! added by the GPU collector, from `KubernetesView::by_gpu`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::{Assignment, DeviceId, PodRef};
use crate::gpu::sampler::Snapshots;
use crate::gpu::GpuSample;
use crate::metrics::encode::*;
use crate::metrics::{Shared, Text};

/// What the poller last learnt from the kubelet.
#[derive(Debug, Clone, Default)]
pub struct KubernetesView {
    /// The last `List` answered.
    pub up: bool,
    pub assignments: Vec<Assignment>,
    /// Calls that failed.
    pub errors: u64,
}

pub type KubernetesMetrics = Shared<KubernetesView>;

/// The most pods one GPU's series are labelled with (time-slicing rarely passes a few dozen):
/// a bound on the series one GPU can make.
const MAX_PODS_PER_GPU: usize = 64;

impl KubernetesView {
    /// Who holds each GPU, by index: a device named by UUID or by index is matched to the
    /// snapshot's GPUs, a MIG device to the GPU it is part of; one held through several time-slicing replicas counts once per
    /// container.
    pub fn by_gpu(&self, gpus: &[GpuSample]) -> BTreeMap<u32, Vec<PodRef>> {
        let mut out: BTreeMap<u32, Vec<PodRef>> = BTreeMap::new();
        for a in &self.assignments {
            let gpu = match &a.device {
                DeviceId::Uuid(u) => gpus.iter().find(|g| !g.uuid.is_empty() && g.uuid == *u),
                DeviceId::Index(i) => gpus.iter().find(|g| g.index == *i),
                DeviceId::Mig(u) => gpus.iter().find(|g| g.mig_uuids.contains(u)),
            };
            if let Some(g) = gpu {
                let held = out.entry(g.index).or_default();
                if held.len() < MAX_PODS_PER_GPU && !held.contains(&a.pod) {
                    held.push(a.pod.clone());
                }
            }
        }
        out
    }
}

/// `gpuwatch_kubernetes_up`, `gpuwatch_kubernetes_errors_total` and
/// `gpuwatch_pod_gpu_allocated`.
pub struct KubernetesCollector {
    pub view: Arc<KubernetesMetrics>,
    pub snapshots: Snapshots,
}

impl fmt::Debug for KubernetesCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesCollector").finish()
    }
}

impl Collector for KubernetesCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let v = self.view.view();
        let snap = self.snapshots.latest();
        let e = &mut enc;
        gauge(
            e,
            desc(
                "gpuwatch_kubernetes_up",
                "1 while the kubelet's pod resources answer; without them GPU series carry no pod labels",
                None,
            ),
            i64::from(v.up),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_kubernetes_errors",
                "Calls to the kubelet's pod resources that failed",
                None,
            ),
            [(NO_LABELS, v.errors)],
        )?;
        let by_gpu = v.by_gpu(&snap.gpus);
        gauges(
            e,
            desc(
                "gpuwatch_pod_gpu_allocated",
                "1 for each container and the GPU the kubelet assigned it",
                None,
            ),
            snap.gpus.iter().flat_map(|g| {
                by_gpu.get(&g.index).into_iter().flatten().map(move |p| {
                    let labels = (
                        [
                            ("pod", Text(&p.pod)),
                            ("namespace", Text(&p.namespace)),
                            ("container", Text(&p.container)),
                        ],
                        ([("gpu", g.index)], [("uuid", Text(&g.uuid))]),
                    );
                    (labels, 1i64)
                })
            }),
        )
    }
}
