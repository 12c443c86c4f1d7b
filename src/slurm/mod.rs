//! Slurm jobs on the node: which job a GPU process belongs to, read from its cgroup (every
//! layout Slurm uses) or, where the cgroup says nothing, its environment; and which jobs a prolog
//! says hold each GPU (dcgm-exporter's job mapping directory, in `mapping`).
//!
//! The layouts, as `/proc/PID/cgroup` shows them:
//! - cgroup v1: `N:controller:/slurm/uid_U/job_J/step_S[/task_T]` (`/slurm_<node>` with several
//!   slurmd on one host);
//! - cgroup v2 up to 25.11: `0::[prefix]/system.slice/[<node>_]slurmstepd.scope/job_J/step_S/...`
//!   (the slice is `CgroupSlice` since 25.11);
//! - cgroup v2 from 26.05: the job's directory is its SLUID (`s` and 13 Crockford base32
//!   characters) rather than `job_J`, unless `CgroupJobIdPaths=yes`.
//!
//! Every read is bounded, and a process that has gone is no error: it has no job.
//!
//! A cgroup is believed only where root owns the Slurm directory it names (`slurm`, or
//! `slurmstepd.scope`, under `/sys/fs/cgroup`): a user with a delegated subtree (rootless
//! containers, `systemd-run --user`) can make directories named like Slurm's. A job read from
//! one that root does not own is a claim, as an environment's is.

pub mod holders;
pub mod mapping;
mod metrics;
pub mod users;

/// Registers the holders' series (`gpuwatch_job_gpu_allocated`, the users' memory), when
/// Slurm or process owners are on.
pub fn register(
    holders: Option<&std::sync::Arc<holders::SharedHolders>>,
    config: &crate::config::Config,
    registry: &mut prometheus_client::registry::Registry,
) {
    if let Some(view) = holders {
        registry.register_collector(Box::new(metrics::HoldersCollector {
            view: std::sync::Arc::clone(view),
            slurm: config.slurm.enabled,
        }));
    }
}

/// The most of `/proc/PID/cgroup` and `/proc/PID/environ` read.
const MAX_CGROUP_BYTES: u64 = 64 * 1024;
const MAX_ENVIRON_BYTES: u64 = 256 * 1024;

/// The Slurm job a process belongs to, and its owner where the cgroup names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The job id (`42`), or its SLUID (`sEKNKTV3WPV500`) under Slurm 26.05's cgroup v2 paths.
    pub job: String,
    /// The job's user, from a cgroup v1 path's `uid_U` (only under a Slurm directory that
    /// root owns).
    pub uid: Option<u32>,
}

/// The job a process's cgroup file (`/proc/PID/cgroup`) places it in, if any line does.
pub fn from_cgroup(text: &str) -> Option<Holder> {
    located(text).map(|(h, _)| h)
}

/// The job a cgroup file places a process in, with the directories (under `/sys/fs/cgroup`)
/// that may hold the Slurm directory its path names.
fn located(text: &str) -> Option<(Holder, Vec<std::path::PathBuf>)> {
    every_located(text).next()
}

/// Every line of a cgroup file that places the process in a job, in order.
fn every_located(text: &str) -> impl Iterator<Item = (Holder, Vec<std::path::PathBuf>)> + '_ {
    text.lines().filter_map(|line| {
        // `hierarchy-id:controllers:path`; the path may itself hold colons.
        let mut fields = line.splitn(3, ':');
        let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let (holder, slurm_dir) = from_path(path)?;
        // cgroup v2 is mounted at the root (or at `unified` beside v1); a v1 hierarchy at its
        // controllers' name (`memory`, `cpu,cpuacct`, `systemd` for `name=systemd`).
        let mounts: Vec<&str> = if id == "0" && controllers.is_empty() {
            vec!["", "unified"]
        } else {
            vec![controllers.strip_prefix("name=").unwrap_or(controllers)]
        };
        // A path outside this cgroup namespace's root (`/../..`) cannot be looked at.
        if slurm_dir.split('/').any(|p| p == "..") {
            return Some((holder, Vec::new()));
        }
        let dirs = mounts
            .into_iter()
            .filter(|m| !m.contains('/') && *m != "..")
            .map(|m| std::path::Path::new(m).join(&slurm_dir))
            .collect();
        Some((holder, dirs))
    })
}

/// Whether root owns one of `dirs` (relative to `root`): a Slurm directory that slurmd or
/// slurmstepd made, not one that a user named so.
fn owned_by_root(root: &std::path::Path, dirs: &[std::path::PathBuf]) -> bool {
    use std::os::unix::fs::MetadataExt;
    dirs.iter()
        .any(|d| std::fs::symlink_metadata(root.join(d)).is_ok_and(|m| m.is_dir() && m.uid() == 0))
}

/// The job of one cgroup path, and the path of its Slurm directory (`.../slurm`,
/// `.../slurmstepd.scope`).
fn from_path(path: &str) -> Option<(Holder, String)> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let dir = |i: usize| parts[..=i].join("/");
    // cgroup v1: .../slurm[_node]/uid_U/job_J/step_S
    if let Some(i) = parts
        .iter()
        .position(|p| *p == "slurm" || p.starts_with("slurm_"))
    {
        if let (Some(uid), Some(job)) = (parts.get(i + 1), parts.get(i + 2)) {
            if let (Some(uid), Some(job)) = (uid.strip_prefix("uid_"), job_id(job)) {
                let holder = Holder {
                    job,
                    uid: uid.parse().ok(),
                };
                return Some((holder, dir(i)));
            }
        }
    }
    // cgroup v2: .../[node_]slurmstepd.scope/job_J or /<SLUID>, then step_S.
    let i = parts
        .iter()
        .position(|p| *p == "slurmstepd.scope" || p.ends_with("_slurmstepd.scope"))?;
    let part = parts.get(i + 1)?;
    // slurmstepd's own directories (`system`, `slurmd`) are not jobs; a SLUID is one only with
    // a step under it.
    let job = match job_id(part) {
        Some(j) => j,
        None if is_sluid(part) && parts.get(i + 2).is_some_and(|s| s.starts_with("step_")) => {
            part.to_string()
        }
        None => return None,
    };
    Some((Holder { job, uid: None }, dir(i)))
}

/// `job_42` as `42`; a SLUID as itself (with a step after it, checked by the caller).
fn job_id(part: &str) -> Option<String> {
    let id = part.strip_prefix("job_")?;
    (!id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit()))
        .then(|| id.to_string())
}

/// Slurm's unique job id: `s` and 13 characters of Crockford's base32.
fn is_sluid(part: &str) -> bool {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    part.len() == 14 && part.starts_with('s') && part.bytes().skip(1).all(|b| ALPHABET.contains(&b))
}

/// `SLURM_JOB_ID` from a process's environment (`/proc/PID/environ`: NUL-separated).
pub fn from_environ(bytes: &[u8]) -> Option<String> {
    bytes.split(|b| *b == 0).find_map(|var| {
        let id = var.strip_prefix(b"SLURM_JOB_ID=")?;
        let id = std::str::from_utf8(id).ok()?;
        job_id(&format!("job_{id}"))
    })
}

/// Where a process's job was read from. A cgroup under a Slurm directory that root owns is
/// slurmstepd's to set; the environment, or a cgroup that its user made, is the process owner's
/// claim, who may claim any job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Cgroup,
    /// A cgroup named like Slurm's that root does not own (or that cannot be looked at).
    ForeignCgroup,
    Environ,
}

impl Source {
    /// Whether the job is only claimed: it counts where the prolog gave the device that job.
    pub fn is_claim(self) -> bool {
        self != Source::Cgroup
    }
}

/// Where the cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The job process `pid` belongs to: from its cgroup, else its environment. `None` when it has
/// none, has gone, or cannot be read.
pub fn of_process(pid: u32) -> Option<(Holder, Source)> {
    let dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    let cgroup = crate::files::read_proc(&dir.join("cgroup"), MAX_CGROUP_BYTES)?;
    if let Some(found) = of_cgroup(std::path::Path::new(CGROUP_ROOT), &cgroup) {
        return Some(found);
    }
    let environ = crate::files::read_proc(&dir.join("environ"), MAX_ENVIRON_BYTES)?;
    from_environ(&environ).map(|job| (Holder { job, uid: None }, Source::Environ))
}

/// The job a cgroup file names, and whether root owns its Slurm directory under `root`.
fn of_cgroup(root: &std::path::Path, cgroup: &[u8]) -> Option<(Holder, Source)> {
    let text = String::from_utf8_lossy(cgroup);
    // A line under a Slurm directory that root owns wins over any before it that a user made.
    if let Some((holder, _)) = every_located(&text).find(|(_, dirs)| owned_by_root(root, dirs)) {
        return Some((holder, Source::Cgroup));
    }
    let (mut holder, _) = located(&text)?;
    // Its `uid_U` is a name the path's maker chose: it names no user.
    holder.uid = None;
    Some((holder, Source::ForeignCgroup))
}

#[cfg(test)]
mod tests;
