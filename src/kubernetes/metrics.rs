//! Kubernetes' series: whether the kubelet answers, how often it failed, and which pod holds
//! which GPU (`gpuwatch_pod_gpu_allocated`). The pod labels on the GPU series themselves are
//! added by the GPU collector, from `KubernetesView::by_gpu` (`view.rs`).

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::view::SharedKubernetesView;
use crate::gpu::sampler::Snapshots;
use crate::metrics::encode::*;
use crate::metrics::Text;

/// `gpuwatch_kubernetes_up`, `gpuwatch_kubernetes_errors_total` and
/// `gpuwatch_pod_gpu_allocated`.
pub struct KubernetesCollector {
    pub view: Arc<SharedKubernetesView>,
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
