//! A GPU's compute processes as the sample keeps them.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

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
