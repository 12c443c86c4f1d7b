//! `[slurm]`: which Slurm job holds each GPU, from its processes' cgroups and from
//! dcgm-exporter's job mapping directory.

use super::*;

/// `[slurm]` as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSlurm {
    pub enabled: bool,
    /// The directory a prolog writes (a file per GPU with its jobs); empty: not read.
    pub job_mapping_dir: String,
    /// Label every GPU series with `hpc_job`, as dcgm-exporter does.
    pub job_label: bool,
    pub max_jobs: usize,
}

impl Default for RawSlurm {
    fn default() -> Self {
        RawSlurm {
            enabled: false,
            job_mapping_dir: String::new(),
            job_label: false,
            max_jobs: 256,
        }
    }
}

/// `[slurm]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmConfig {
    pub enabled: bool,
    pub job_mapping_dir: Option<PathBuf>,
    pub job_label: bool,
    /// The most jobs (and users) tracked on the node; the rest are counted and left out.
    pub max_jobs: usize,
}

/// The most jobs `max_jobs` may ask for.
const MAX_MAX_JOBS: usize = 4096;

impl RawSlurm {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<SlurmConfig> {
        let mut ok = true;
        let dir = &self.job_mapping_dir;
        let job_mapping_dir = if dir.is_empty() {
            None
        } else if dir.starts_with('/') && !dir.chars().any(char::is_control) {
            // A prolog may make it later; what is there already must be a directory.
            match std::fs::symlink_metadata(dir) {
                Ok(m) if !m.is_dir() => {
                    invalid(
                        "slurm.job_mapping_dir",
                        format!(
                            "\"{dir}\" is not a directory (a prolog writes one file per GPU in it)"
                        ),
                    );
                    ok = false;
                    None
                }
                _ => Some(PathBuf::from(dir)),
            }
        } else {
            invalid(
                "slurm.job_mapping_dir",
                format!("{dir:?} is not an absolute path, such as \"/run/gpuwatch/jobs\""),
            );
            ok = false;
            None
        };
        if !(1..=MAX_MAX_JOBS).contains(&self.max_jobs) {
            invalid(
                "slurm.max_jobs",
                format!("\"{}\" is not from 1 to {MAX_MAX_JOBS}", self.max_jobs),
            );
            ok = false;
        }
        for (key, set) in [
            ("slurm.job_mapping_dir", job_mapping_dir.is_some()),
            ("slurm.job_label", self.job_label),
        ] {
            if set && !self.enabled {
                invalid(
                    key,
                    "is set, but [slurm] enabled is false; set enabled = true".into(),
                );
                ok = false;
            }
        }
        ok.then_some(SlurmConfig {
            enabled: self.enabled,
            job_mapping_dir,
            job_label: self.job_label,
            max_jobs: self.max_jobs,
        })
    }
}
