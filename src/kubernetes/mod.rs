//! Pod attribution: which pod holds which GPU, from the kubelet's PodResources API (gRPC on
//! its unix socket). A poller refreshes the assignments on its own interval, off the scrape
//! path; a scrape joins them with the latest snapshot. A missing or broken socket means no pod
//! labels and `gpuwatch_kubernetes_up 0`, with one log line per distinct failure.

pub mod metrics;
mod proto;
pub mod verdicts;
pub mod view;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use self::proto::{ListPodResourcesRequest, ListPodResourcesResponse};
use self::view::{KubernetesView, SharedKubernetesView};

/// The container a GPU is assigned to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub pod: String,
    pub namespace: String,
    pub container: String,
}

impl PodRef {
    /// The labels a series of a GPU this pod holds carries.
    pub(crate) fn labels(&self) -> crate::metrics::encode::PodLabels<'_> {
        crate::metrics::encode::PodLabels {
            pod: &self.pod,
            namespace: &self.namespace,
            container: &self.container,
        }
    }
}

/// How the NVIDIA device plugin names a device to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceId {
    /// A GPU UUID (`GPU-…`), the plugin's default.
    Uuid(String),
    /// A GPU index (`0`), with `deviceIDStrategy: index`.
    Index(u32),
    /// A MIG device UUID (`MIG-…`), mapped to its parent once MIG devices are known.
    Mig(String),
    /// A GPU's PCI address (`0000:03:00.0`, lowercase), as AMD's device plugin names its
    /// `amd.com/gpu` devices.
    Pci(String),
    /// An `amd.com/` device named otherwise (a partition, `amdgpu_xcp_N`): no GPU read here.
    Unresolved(String),
}

/// One device held by one container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Assignment {
    pub device: DeviceId,
    pub pod: PodRef,
}

/// The longest name believed from the kubelet (pod and namespace names are at most 253).
const MAX_NAME: usize = 253;
/// The most GPU assignments kept from one answer: far beyond any node (a node of 16 GPUs, each
/// time-sliced 48 ways, has 768), and a bound on what a broken kubelet can make gpuwatch hold.
pub const MAX_ASSIGNMENTS: usize = 4096;
/// Consecutive failed calls after which the last assignments are dropped: one slow answer
/// does not strip the pod labels (which would start new series), a kubelet that is gone does.
const FORGET_AFTER: u32 = 3;

/// Reads a device id as the NVIDIA device plugin writes it. A time-sliced GPU's replicas carry
/// `::N` after the GPU's own id (`GPU-…::3`); each replica is its GPU. Anything else is `None`.
pub fn parse_device_id(id: &str) -> Option<DeviceId> {
    let id = id.split_once("::").map_or(id, |(base, _)| base);
    if id.is_empty() || id.len() > MAX_NAME || id.chars().any(char::is_control) {
        return None;
    }
    if let Some(pci) = crate::gpu::amd::pci_address(id) {
        Some(DeviceId::Pci(pci))
    } else if id.starts_with("GPU-") {
        Some(DeviceId::Uuid(id.to_string()))
    } else if id.starts_with("MIG-") {
        Some(DeviceId::Mig(id.to_string()))
    } else {
        id.parse().ok().map(DeviceId::Index)
    }
}

/// The GPU assignments in a `List` answer: GPU resources only (NVIDIA's `nvidia.com/gpu` and
/// `nvidia.com/mig-…`, named by UUID or index; AMD's `amd.com/gpu`, named by PCI address),
/// each device id read, names bounded. Sorted, without repeats.
fn assignments(response: ListPodResourcesResponse) -> Vec<Assignment> {
    let mut out = Vec::new();
    let name = |s: &str| -> Option<String> {
        (!s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control))
            .then(|| s.to_string())
    };
    for pod in response.pod_resources {
        let (Some(pod_name), Some(namespace)) = (name(&pod.name), name(&pod.namespace)) else {
            continue;
        };
        for container in pod.containers {
            let Some(container_name) = name(&container.name) else {
                continue;
            };
            for devices in &container.devices {
                let by_address = devices.resource_name.starts_with("amd.com/");
                if !(by_address || devices.resource_name.starts_with("nvidia.com/")) {
                    continue;
                }
                for id in &devices.device_ids {
                    if out.len() >= MAX_ASSIGNMENTS {
                        break;
                    }
                    let device = match parse_device_id(id) {
                        Some(d @ DeviceId::Pci(_)) if by_address => Some(d),
                        _ if by_address => name(id).map(DeviceId::Unresolved),
                        Some(DeviceId::Pci(_)) => None,
                        d => d,
                    };
                    if let Some(device) = device {
                        out.push(Assignment {
                            device,
                            pod: PodRef {
                                pod: pod_name.clone(),
                                namespace: namespace.clone(),
                                container: container_name.clone(),
                            },
                        });
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A failed call to the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("cannot connect to {socket}: {source}")]
    Connect {
        socket: String,
        source: tonic::transport::Error,
    },
    #[error("PodResourcesLister/List failed: {0}")]
    Call(#[from] tonic::Status),
}

/// How long one `List` may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest `List` answer read (tonic's own default, stated).
const MAX_ANSWER: usize = 4 << 20;

/// Asks the kubelet which devices every container holds.
pub async fn list(socket: &Path) -> Result<Vec<Assignment>, KubeletError> {
    let path = socket.to_path_buf();
    // The URI is a placeholder: the connector dials the unix socket.
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|source| KubeletError::Connect {
            socket: socket.display().to_string(),
            source,
        })?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_ANSWER);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec =
        tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
    let method = http::uri::PathAndQuery::from_static("/v1.PodResourcesLister/List");
    let response = grpc
        .unary(
            tonic::Request::new(ListPodResourcesRequest {}),
            method,
            codec,
        )
        .await?;
    Ok(assignments(response.into_inner()))
}

/// On Kubernetes (`[kubernetes] pod_resources_socket` set): starts polling the kubelet for who
/// holds which device, off the scrape path. Returns the view that the GPU series and pod-scoped
/// rules read; `register` adds its own series.
pub fn spawn(
    config: &crate::config::Config,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Option<Arc<SharedKubernetesView>> {
    let socket = config.kubernetes.pod_resources_socket.clone()?;
    let view = Arc::new(SharedKubernetesView::default());
    tasks.spawn(poll(socket, config.kubernetes.refresh, Arc::clone(&view)));
    Some(view)
}

/// Registers `gpuwatch_kubernetes_up` and `gpuwatch_pod_gpu_allocated` over the view, after
/// the device families (so that a scrape lists them in the order it always has).
pub fn register(
    view: Option<&Arc<SharedKubernetesView>>,
    snapshots: &crate::gpu::sampler::Snapshots,
    registry: &mut prometheus_client::registry::Registry,
) {
    if let Some(view) = view {
        registry.register_collector(Box::new(metrics::KubernetesCollector {
            view: Arc::clone(view),
            snapshots: snapshots.clone(),
        }));
    }
}

/// Refreshes the assignments every `every` until the daemon stops.
pub async fn poll(socket: PathBuf, every: Duration, view: Arc<SharedKubernetesView>) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_error: Option<String> = None;
    let mut failures = 0u32;
    // Whether the last answer overflowed: its warning is logged once per change, not per refresh.
    let mut overflowing = false;
    loop {
        ticker.tick().await;
        match list(&socket).await {
            Ok(assignments) => {
                failures = 0;
                let over = assignments.len() >= MAX_ASSIGNMENTS;
                if over && !overflowing {
                    tracing::warn!(
                        kept = MAX_ASSIGNMENTS,
                        "the kubelet lists more GPU assignments than any node has; the rest are ignored"
                    );
                } else if overflowing && !over {
                    tracing::info!("the kubelet lists fewer GPU assignments than the cap again");
                }
                overflowing = over;
                if last_error.take().is_some() {
                    tracing::info!(socket = %socket.display(), "the kubelet's pod resources answer again");
                }
                view.update(|v| {
                    *v = KubernetesView {
                        up: true,
                        assignments,
                        errors: v.errors,
                    }
                });
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_ref() != Some(&text) {
                    tracing::warn!(error = %text, "cannot read the kubelet's pod resources; GPU series carry no pod labels until it answers");
                    last_error = Some(text);
                }
                failures = failures.saturating_add(1);
                view.update(|v| {
                    v.up = false;
                    if failures >= FORGET_AFTER {
                        v.assignments.clear();
                    }
                    v.errors += 1;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_as_the_device_plugin_writes_them() {
        let uuid = "GPU-00000000-0000-4000-8000-000000000001";
        assert_eq!(parse_device_id(uuid), Some(DeviceId::Uuid(uuid.into())));
        // A time-sliced replica is its GPU.
        assert_eq!(
            parse_device_id(&format!("{uuid}::3")),
            Some(DeviceId::Uuid(uuid.into()))
        );
        assert_eq!(parse_device_id("2"), Some(DeviceId::Index(2)));
        assert_eq!(parse_device_id("2::1"), Some(DeviceId::Index(2)));
        assert_eq!(
            parse_device_id("MIG-1a2b"),
            Some(DeviceId::Mig("MIG-1a2b".into()))
        );
        // AMD's device plugin names a GPU by its PCI address.
        assert_eq!(
            parse_device_id("0000:C1:00.0"),
            Some(DeviceId::Pci("0000:c1:00.0".into()))
        );
        for bad in [
            "",
            "::1",
            "gpu0",
            "-1",
            "GPU-\nx",
            &"9".repeat(300),
            "0000:c1:00.9",
        ] {
            assert_eq!(parse_device_id(bad), None, "{bad:?}");
        }
    }
}
