//! A GPU's compute processes as the sample keeps them.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use super::GpuReader;
use crate::gpu::ProcessSample;

/// The memory a process uses, where NVML says.
pub(super) fn used(m: &UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(*b),
        UsedGpuMemory::Unavailable => None,
    }
}

/// A process list as pids and memory, bounded: a driver that lists more than any GPU runs is
/// not believed past the cap.
pub(super) fn process_refs(list: &[ProcessInfo]) -> Vec<crate::gpu::ProcessRef> {
    const MAX_PROCESSES: usize = 1024;
    list.iter()
        .take(MAX_PROCESSES)
        .map(|p| crate::gpu::ProcessRef {
            pid: p.pid,
            used_memory_bytes: used(&p.used_gpu_memory),
        })
        .collect()
}

/// What `GpuReader::processes` read of one GPU.
pub(super) struct Processes {
    pub(super) count: Option<u32>,
    /// With per-process metrics: each process, with its name and memory.
    pub(super) each: Option<Vec<ProcessSample>>,
    /// With holders read: each process's pid and memory.
    pub(super) pids: Vec<crate::gpu::ProcessRef>,
}

impl GpuReader<'_> {
    /// GPU `d`'s compute processes: the list where per-process metrics or holders need it,
    /// else only their count.
    pub(super) fn processes(&mut self, nvml: &'static Nvml, d: &Device<'static>) -> Processes {
        if !(self.src.per_process || self.src.pids) {
            return Processes {
                count: self.get("processes", || d.running_compute_processes_count()),
                each: None,
                pids: Vec::new(),
            };
        }
        match self.get("processes", || d.running_compute_processes()) {
            Some(list) => {
                let each = self.src.per_process.then(|| {
                    list.iter()
                        .map(|p| ProcessSample {
                            pid: p.pid,
                            name: nvml.sys_process_name(p.pid, 256).ok(),
                            used_memory_bytes: used(&p.used_gpu_memory),
                        })
                        .collect()
                });
                let pids = if self.src.pids {
                    process_refs(&list)
                } else {
                    Vec::new()
                };
                Processes {
                    count: Some(list.len() as u32),
                    each,
                    pids,
                }
            }
            None => Processes {
                count: None,
                each: None,
                pids: Vec::new(),
            },
        }
    }
}
