//! A GPU's MIG devices, each a device of its own: the layout, read every cycle in MIG mode so
//! that a new one shows at once; each device; and the GPM metrics of each GPU instance. A GPU
//! out of MIG mode, with no change pending, has its mode read on the slow interval.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::processes::process_refs;
use super::{GpuReader, MAX_MIG_DEVICES};
use crate::gpu::MigSample;

impl GpuReader<'_> {
    /// The MIG devices of GPU `d` in MIG mode, and how many were not read. A slot without a
    /// device (NOT_FOUND) is a hole in the layout; one that cannot be read, or whose UUID or
    /// instance ids cannot, is counted as unread, and a rule cannot judge the node while one is
    /// (it could be the one at work). A MIG mode that cannot be read (other than "not
    /// supported") is unread too: the GPU may be in MIG mode, and its own readings would stand
    /// in for devices not read.
    pub(super) fn mig_devices(
        &mut self,
        nvml: &'static Nvml,
        d: &Device<'static>,
    ) -> (Vec<MigSample>, u32) {
        let mut mig_unread = 0u32;
        if self.mig_known_off() {
            return (Vec::new(), 0);
        }
        let read = d.mig_mode();
        // Off (or not a MIG GPU) with nothing pending: asked again on the slow interval. On,
        // about to change, or unknown: every cycle.
        let off = match &read {
            Ok(m) => m.current == 0 && m.pending == 0,
            Err(e) => matches!(e, NvmlError::NotSupported),
        };
        self.facts.mig_off = off.then(std::time::Instant::now);
        let mode = match read {
            Err(NvmlError::NotSupported) => None,
            read => {
                let mode = self.get("mig_mode", || read);
                mig_unread += u32::from(mode.is_none());
                mode
            }
        };
        if mode.is_none_or(|m| m.current != 1) {
            return (Vec::new(), mig_unread);
        }
        let n = match self.get("mig_devices", || d.mig_device_count()) {
            Some(n) => n,
            None => {
                mig_unread += 1;
                0
            }
        };
        // More than any GPU has: those past the bound are unread.
        mig_unread += n.saturating_sub(MAX_MIG_DEVICES);
        let mut devices: Vec<Device<'static>> = Vec::new();
        for i in 0..n.min(MAX_MIG_DEVICES) {
            match d.mig_device_by_index(i) {
                Ok(m) => devices.push(m),
                Err(NvmlError::NotFound) => {}
                Err(e) => {
                    mig_unread += 1;
                    // Counted and logged as any failed read; lost if the GPU is.
                    self.get("mig_device", || Err::<(), _>(e));
                }
            }
        }
        let mut read = Vec::with_capacity(devices.len());
        for m in &devices {
            match self.read_mig(nvml, m) {
                Some(s) if s.gpu_instance.is_some() && s.compute_instance.is_some() => read.push(s),
                Some(s) => {
                    mig_unread += 1;
                    read.push(s);
                }
                None => mig_unread += 1,
            }
        }
        (read, mig_unread)
    }

    /// One MIG device of GPU `d`: its identity, memory, processes, and the GPM metrics of its
    /// GPU instance.
    /// A MIG device whose UUID cannot be read is left out: it could not be told apart.
    fn read_mig(&mut self, nvml: &'static Nvml, m: &Device<'static>) -> Option<MigSample> {
        let uuid = self.get("mig_uuid", || m.uuid())?;
        // NVML names a MIG device "<GPU name> MIG <profile>".
        let profile = self
            .get("mig_name", || m.name())
            .and_then(|n| Some(n.rsplit_once(" MIG ")?.1.to_string()));
        let (gpu_instance, compute_instance) = crate::gpu::gpm::instance_ids(nvml, m);
        let memory = self
            .get("mig_memory", || m.memory_info())
            .filter(|mem| mem.total > 0 && mem.used <= mem.total);
        let (processes, pids) = if self.src.pids {
            match self.get("mig_processes", || m.running_compute_processes()) {
                Some(list) => (Some(list.len() as u32), process_refs(&list)),
                None => (None, Vec::new()),
            }
        } else {
            let n = self.get("mig_processes", || m.running_compute_processes_count());
            (n, Vec::new())
        };
        Some(MigSample {
            uuid,
            gpu_instance,
            compute_instance,
            profile,
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            processes,
            pids,
            gpm: None,
        })
    }

    /// GPM is per GPU instance, which may hold several MIG devices (compute instances): one
    /// sample each per cycle, shared by its devices.
    pub(super) fn instance_gpm(
        &mut self,
        nvml: &'static Nvml,
        d: &Device<'static>,
        mig: &mut [MigSample],
    ) {
        let mut instances: Vec<(u32, String)> = Vec::new();
        for m in mig.iter() {
            if let Some(gi) = m.gpu_instance {
                if !instances.iter().any(|(i, _)| *i == gi) {
                    instances.push((gi, m.uuid.clone()));
                }
            }
        }
        for (gi, key) in &instances {
            let gpm = self.read_gpm(nvml, d, Some((*gi, key.as_str()))).1;
            for m in mig.iter_mut().filter(|m| m.gpu_instance == Some(*gi)) {
                m.gpm.clone_from(&gpm);
            }
        }
        self.src.gpm.retain_instances(self.index, &instances);
    }
}
