//! The holders' series: which job holds which GPU (`gpuwatch_job_gpu_allocated`), what each
//! user's processes hold (`gpuwatch_user_gpu_memory_bytes`), and what was left out. The idle
//! time and money of each job and user are the cost series', from the decision step.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};

use super::holders::SharedHolders;
use crate::metrics::encode::*;
use crate::metrics::Text;

pub struct HoldersCollector {
    pub view: Arc<SharedHolders>,
    /// Whether Slurm is on (the job series), besides process owners (the user series).
    pub slurm: bool,
}

impl fmt::Debug for HoldersCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldersCollector").finish()
    }
}

impl Collector for HoldersCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let v = self.view.view();
        let e = &mut enc;
        if self.slurm {
            gauges(
                e,
                desc(
                    "gpuwatch_job_gpu_allocated",
                    "1 for each Slurm job and each GPU (or MIG device) it holds, with the job's user where known",
                    None,
                ),
                v.jobs.iter().flat_map(|(job, j)| {
                    j.devices.iter().map(move |((gpu, gpu_instance), uuid)| {
                        let labels = JobLabels {
                            job,
                            user: j.user.as_deref(),
                            gpu: *gpu,
                            uuid,
                            gpu_instance: *gpu_instance,
                        };
                        (labels, 1i64)
                    })
                }),
            )?;
            gauge(
                e,
                desc(
                    "gpuwatch_slurm_mapping_skipped",
                    "Entries of the job mapping directory not read at the last refresh: names that are no GPU, lines that are no job id, files that could not be read",
                    None,
                ),
                v.mapping_skipped as i64,
            )?;
            gauge(
                e,
                desc(
                    "gpuwatch_slurm_mapping_unknown",
                    "1 while the job mapping directory is not known whole (a device file not read whole, or a directory not trusted): job and user rules are held",
                    None,
                ),
                i64::from(v.mapping_unknown.is_some()),
            )?;
        }
        gauge(
            e,
            desc(
                "gpuwatch_holders_dropped",
                "Jobs and users beyond [slurm] max_jobs at the last refresh, not tracked",
                None,
            ),
            v.dropped as i64,
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_user_gpu_memory",
                "GPU memory the user's processes use",
                Some("bytes"),
            ),
            v.user_memory
                .iter()
                .map(|(u, bytes)| ([("user", Text(u))], *bytes as i64)),
        )
    }
}

/// A job's GPU: `job`, `user` where known, `gpu`, `uuid` once read, and `gpu_instance` for a
/// MIG device.
struct JobLabels<'a> {
    job: &'a str,
    user: Option<&'a str>,
    gpu: u32,
    uuid: &'a str,
    gpu_instance: Option<u32>,
}

impl EncodeLabelSet for JobLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        ("job", Text(self.job)).encode(encoder.encode_label())?;
        if let Some(u) = self.user {
            ("user", Text(u)).encode(encoder.encode_label())?;
        }
        ("gpu", self.gpu).encode(encoder.encode_label())?;
        if !self.uuid.is_empty() {
            ("uuid", Text(self.uuid)).encode(encoder.encode_label())?;
        }
        if let Some(gi) = self.gpu_instance {
            ("gpu_instance", gi).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}
