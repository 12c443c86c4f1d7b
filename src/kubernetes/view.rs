//! What the kubelet last said, and its join with a snapshot: which pod holds each GPU and each
//! MIG device. Pod-scoped rules decide on this join, and the GPU series' pod labels come from
//! it.

use std::collections::BTreeMap;

use super::{Assignment, DeviceId, PodRef};
use crate::gpu::GpuSample;
use crate::metrics::Shared;

/// What the poller last learnt from the kubelet.
#[derive(Debug, Clone, Default)]
pub struct KubernetesView {
    /// The last `List` answered.
    pub up: bool,
    pub assignments: Vec<Assignment>,
    /// Calls that failed.
    pub errors: u64,
}

pub type SharedKubernetesView = Shared<KubernetesView>;

/// The most pods one GPU's series, or one MIG device's, are labelled with (time-slicing rarely
/// passes a few dozen): a bound on the series one device can make.
const MAX_PODS_PER_GPU: usize = 64;

/// Who holds what, joined with a snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    /// By GPU index: the pods holding the GPU, or one of its MIG devices.
    pub gpus: BTreeMap<u32, Vec<PodRef>>,
    /// By MIG device UUID: the pods holding that MIG device.
    pub mig: BTreeMap<String, Vec<PodRef>>,
    /// By GPU index: the pods holding the GPU itself (by its UUID or index), not through a
    /// MIG device.
    pub whole: BTreeMap<u32, Vec<PodRef>>,
    /// The pods holding a device named by its PCI address that is no GPU read here, or one
    /// not named by a PCI address at all (an MI300 partition, `amdgpu_xcp_N`): which GPU it
    /// is cannot be told, so such a pod counts as holding every device, and is judged idle
    /// only when all of them are.
    pub unresolved: Vec<PodRef>,
}

impl KubernetesView {
    /// Who holds each GPU, by index: a device named by UUID or by index is matched to the
    /// snapshot's GPUs, a MIG device to the GPU it is part of; one held through several
    /// time-slicing replicas counts once per container.
    pub fn by_gpu(&self, gpus: &[GpuSample]) -> BTreeMap<u32, Vec<PodRef>> {
        self.held(gpus).gpus
    }

    /// Who holds each GPU (as `by_gpu`) and each MIG device the snapshot has.
    pub fn held(&self, gpus: &[GpuSample]) -> Held {
        let mut out = Held::default();
        let add = |list: &mut Vec<PodRef>, pod: &PodRef| {
            if list.len() < MAX_PODS_PER_GPU && !list.contains(pod) {
                list.push(pod.clone());
            }
        };
        for a in &self.assignments {
            let gpu = match &a.device {
                DeviceId::Uuid(u) => gpus.iter().find(|g| !g.uuid.is_empty() && g.uuid == *u),
                DeviceId::Index(i) => gpus.iter().find(|g| g.index == *i),
                DeviceId::Mig(u) => gpus.iter().find(|g| g.mig_uuids.contains(u)),
                DeviceId::Pci(p) => {
                    let found = gpus.iter().find(|g| {
                        g.pci_bus_id
                            .as_deref()
                            .is_some_and(|b| b.eq_ignore_ascii_case(p))
                    });
                    if found.is_none() {
                        add(&mut out.unresolved, &a.pod);
                    }
                    found
                }
                DeviceId::Unresolved(_) => {
                    add(&mut out.unresolved, &a.pod);
                    None
                }
            };
            let Some(g) = gpu else { continue };
            add(out.gpus.entry(g.index).or_default(), &a.pod);
            match &a.device {
                DeviceId::Mig(u) => add(out.mig.entry(u.clone()).or_default(), &a.pod),
                _ => add(out.whole.entry(g.index).or_default(), &a.pod),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::MigSample;

    #[test]
    fn a_mig_device_is_held_as_itself_and_for_its_gpu() {
        let pod = |name: &str| PodRef {
            pod: name.into(),
            namespace: "ml".into(),
            container: "c".into(),
        };
        let gpu = GpuSample {
            index: 0,
            uuid: "GPU-0".into(),
            up: true,
            mig_uuids: vec!["MIG-a".into(), "MIG-b".into()],
            mig: vec![
                MigSample {
                    uuid: "MIG-a".into(),
                    ..MigSample::default()
                },
                MigSample {
                    uuid: "MIG-b".into(),
                    ..MigSample::default()
                },
            ],
            ..GpuSample::default()
        };
        let view = KubernetesView {
            up: true,
            assignments: vec![
                Assignment {
                    device: DeviceId::Uuid("GPU-0".into()),
                    pod: pod("whole"),
                },
                Assignment {
                    device: DeviceId::Mig("MIG-a".into()),
                    pod: pod("small"),
                },
                // A MIG device of no GPU here.
                Assignment {
                    device: DeviceId::Mig("MIG-z".into()),
                    pod: pod("elsewhere"),
                },
                // An AMD GPU, held by its PCI address.
                Assignment {
                    device: DeviceId::Pci("0000:c1:00.0".into()),
                    pod: pod("rocm"),
                },
                // A partition's id, and an address of no GPU here: the pods count as holding
                // all.
                Assignment {
                    device: DeviceId::Unresolved("amdgpu_xcp_3".into()),
                    pod: pod("partition"),
                },
                Assignment {
                    device: DeviceId::Pci("0000:d1:00.0".into()),
                    pod: pod("elsewhere-amd"),
                },
            ],
            errors: 0,
        };
        let amd = GpuSample {
            index: 1,
            pci_bus_id: Some("0000:c1:00.0".into()),
            up: true,
            ..GpuSample::default()
        };
        let held = view.held(&[gpu, amd]);
        assert_eq!(held.unresolved, [pod("partition"), pod("elsewhere-amd")]);
        assert_eq!(held.gpus[&1], [pod("rocm")]);
        assert_eq!(held.whole[&1], [pod("rocm")]);
        assert_eq!(held.gpus[&0], [pod("whole"), pod("small")]);
        assert_eq!(held.whole[&0], [pod("whole")]);
        assert_eq!(held.mig["MIG-a"], [pod("small")]);
        assert!(!held.mig.contains_key("MIG-b"));
        assert!(!held.mig.contains_key("MIG-z"));
    }
}
