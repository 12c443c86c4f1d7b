//! Who holds each GPU: the Slurm jobs (from their processes' cgroups and from the job mapping
//! directory) and the users (the owners of the processes, and the jobs' users), joined with a
//! snapshot. Refreshed after every sample, off the scrape path and off the decision step;
//! scrapes and the decision loop read the last refresh.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use super::mapping::{self, Device};
use super::users::Users;
use super::Holder;
use crate::gpu::sampler::Snapshots;
use crate::gpu::{ProcessRef, Snapshot};
use crate::metrics::Shared;

/// A device as holders see it: the GPU's index, and the GPU instance for a MIG device.
pub type DeviceKey = (u32, Option<u32>);

/// What one refresh found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holders {
    /// The snapshot it was read from.
    pub seq: u64,
    /// Each job holding a device: its user where known, and its devices.
    pub jobs: BTreeMap<String, Job>,
    /// Each device held: its jobs and its users, sorted.
    pub devices: BTreeMap<DeviceKey, Held>,
    /// With `[sampling] process_owners`: each GPU process's user, by pid.
    pub owners: BTreeMap<u32, String>,
    /// With `[sampling] process_owners`: GPU memory each user's processes use, in bytes.
    pub user_memory: BTreeMap<String, u64>,
    /// Jobs beyond `[slurm] max_jobs` (and users beyond it) at this refresh, left out.
    pub dropped: usize,
    /// Entries of the job mapping directory that were not read (bad names, lines, or files).
    pub mapping_skipped: usize,
    /// Why the job mapping directory is not known whole (a device file not read whole, a
    /// directory that is not trusted): any job may hold any device then, so no job or user
    /// rule is judged.
    pub mapping_unknown: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Job {
    pub user: Option<String>,
    /// Its devices, with their UUIDs (the MIG device's for a MIG device).
    pub devices: Vec<(DeviceKey, String)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    pub jobs: Vec<String>,
    pub users: Vec<String>,
}

impl Holders {
    /// A device's holders; none when it has none.
    pub fn of(&self, key: DeviceKey) -> Option<&Held> {
        self.devices.get(&key)
    }
}

/// The last refresh, and the sample it was of, to await.
#[derive(Debug)]
pub struct SharedHolders {
    view: Shared<Holders>,
    seq: tokio::sync::watch::Sender<u64>,
}

impl Default for SharedHolders {
    fn default() -> Self {
        SharedHolders {
            view: Shared::default(),
            seq: tokio::sync::watch::channel(0).0,
        }
    }
}

impl SharedHolders {
    /// The last refresh.
    pub fn view(&self) -> Arc<Holders> {
        self.view.view()
    }

    fn publish(&self, holders: Holders) {
        let seq = holders.seq;
        self.view.update(|v| *v = holders);
        self.seq.send_replace(seq);
    }

    /// The holders of sample `seq`, once they are read; `None` when they are not within
    /// `limit` (a slow directory service, a refresh that died), which is holders unknown.
    pub async fn of_sample(&self, seq: u64, limit: std::time::Duration) -> Option<Arc<Holders>> {
        let mut rx = self.seq.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|s| *s >= seq)).await;
        Some(self.view()).filter(|h| h.seq == seq)
    }
}

/// What to read.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `[slurm] enabled`: find each process's job.
    pub slurm: bool,
    pub mapping_dir: Option<PathBuf>,
    /// `[sampling] process_owners`: name each process's user.
    pub owners: bool,
    pub max_jobs: usize,
}

/// What is known of one process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Process {
    pub job: Option<Holder>,
    /// The job was read from the process's environment, which its owner sets (or from a
    /// cgroup that root does not own): it counts only where the job mapping directory (written
    /// by the prolog, as root) lists that job on the same device.
    pub claimed: bool,
    pub uid: Option<u32>,
}

/// Reads a process from `/proc`: its job (with Slurm) and its real uid.
pub fn read_process(pid: u32, slurm: bool) -> Process {
    let found = slurm.then(|| super::of_process(pid)).flatten();
    Process {
        claimed: found.as_ref().is_some_and(|(_, s)| s.is_claim()),
        job: found.map(|(h, _)| h),
        uid: super::users::uid_of(pid),
    }
}

/// The users a job's processes name, by how far each can be believed. A job's user comes only
/// from what its owner cannot forge: a Slurm cgroup that root owns (its `uid_U`, else the
/// owner of a process slurmstepd put there), else the real uid of the processes whose claim
/// the prolog confirmed, and only while they all agree: a process of anyone's may claim a job
/// the prolog lists on its GPU, so a second user among the claims leaves the job's user
/// unknown rather than the first one read.
#[derive(Debug, Default)]
struct JobUsers {
    slurm: BTreeSet<String>,
    claimed: BTreeSet<String>,
}

impl JobUsers {
    fn user(self) -> Option<String> {
        let one =
            |set: BTreeSet<String>| (set.len() == 1).then(|| set.into_iter().next()).flatten();
        if self.slurm.is_empty() {
            one(self.claimed)
        } else {
            one(self.slurm)
        }
    }
}

/// Joins one snapshot's processes (each read by `process`) and the mapping directory's
/// entries into who holds what.
pub fn join(
    settings: &Settings,
    snap: &Snapshot,
    mapping: &mapping::Mapping,
    users: &mut Users,
    process: impl FnMut(u32) -> Process,
) -> Holders {
    let mut out = Holders {
        seq: snap.seq,
        mapping_skipped: mapping.skipped,
        mapping_unknown: settings.slurm.then(|| mapping.unknown.clone()).flatten(),
        ..Holders::default()
    };
    let devices = devices(snap);
    let mut found = Found::default();
    if settings.slurm {
        found.job_of = mapped_jobs(mapping, &devices);
    }
    found.read_processes(settings, &devices, users, process, &mut out);
    hold(settings, &devices, found, &mut out);
    bound_users(settings, &mut out);
    out
}

/// A device as `join` reads it: its key, its UUID and its processes.
type DeviceProcs<'a> = (DeviceKey, &'a str, &'a [ProcessRef]);

/// Every device of the snapshot's GPUs that are up: each GPU, then its MIG devices.
fn devices(snap: &Snapshot) -> Vec<DeviceProcs<'_>> {
    let mut devices: Vec<DeviceProcs> = Vec::new();
    for g in snap.gpus.iter().filter(|g| g.up) {
        devices.push(((g.index, None), &g.uuid, &g.pids));
        for m in &g.mig {
            let Some(gi) = m.gpu_instance else { continue };
            devices.push(((g.index, Some(gi)), &m.uuid, &m.pids));
        }
    }
    devices
}

/// What the prolog says each device holds. A whole GPU in MIG mode is all of its MIG devices:
/// the job holds each of them, and a claim on any of them is confirmed.
fn mapped_jobs(
    mapping: &mapping::Mapping,
    devices: &[DeviceProcs],
) -> BTreeMap<DeviceKey, BTreeSet<String>> {
    let mut job_of: BTreeMap<DeviceKey, BTreeSet<String>> = BTreeMap::new();
    for (device, jobs) in &mapping.jobs {
        let key = match device {
            Device::Index(i) => Some((*i, None)),
            Device::Mig(i, gi) => Some((*i, Some(*gi))),
            Device::Uuid(u) => devices
                .iter()
                .find(|d| d.1.eq_ignore_ascii_case(u))
                .map(|d| d.0),
        };
        let Some(key) = key.filter(|k| devices.iter().any(|d| d.0 == *k)) else {
            continue;
        };
        let mut keys = vec![key];
        if key.1.is_none() {
            keys.extend(
                devices
                    .iter()
                    .map(|d| d.0)
                    .filter(|k| k.0 == key.0 && k.1.is_some()),
            );
        }
        for k in keys {
            job_of.entry(k).or_default().extend(jobs.iter().cloned());
        }
    }
    job_of
}

/// Who holds each device, as the mapping directory and the processes say, before the bounds.
#[derive(Default)]
struct Found {
    job_of: BTreeMap<DeviceKey, BTreeSet<String>>,
    user_of: BTreeMap<DeviceKey, BTreeSet<String>>,
    /// Who each job's user may be, by the evidence for it (see `JobUsers`).
    job_users: BTreeMap<String, JobUsers>,
}

impl Found {
    /// Adds each device's processes' jobs and users; with `[sampling] process_owners`, each
    /// process's user and each user's memory go to `out`.
    fn read_processes(
        &mut self,
        settings: &Settings,
        devices: &[DeviceProcs],
        users: &mut Users,
        mut process: impl FnMut(u32) -> Process,
        out: &mut Holders,
    ) {
        // A process on several devices (a GPU in MIG mode lists its MIG devices' processes
        // too) is read once.
        let mut seen: BTreeMap<u32, Process> = BTreeMap::new();
        let mapped = self.job_of.clone();
        for (key, _, pids) in devices {
            for &ProcessRef {
                pid,
                used_memory_bytes: used,
            } in pids.iter()
            {
                let mut p = seen.entry(pid).or_insert_with(|| process(pid)).clone();
                // A job claimed through the environment only, that the prolog did not give
                // this device, is not believed: anyone can set SLURM_JOB_ID.
                if p.claimed
                    && !p
                        .job
                        .as_ref()
                        .is_some_and(|h| mapped.get(key).is_some_and(|jobs| jobs.contains(&h.job)))
                {
                    p.job = None;
                }
                let owner = p.uid.map(|u| users.name(u));
                if let Some(h) = &p.job {
                    self.job_of.entry(*key).or_default().insert(h.job.clone());
                    let seen = self.job_users.entry(h.job.clone()).or_default();
                    if p.claimed {
                        // A path its owner made names nobody: only the process's real uid
                        // counts.
                        seen.claimed.extend(owner.clone());
                    } else if let Some(u) = h.uid.map(|u| users.name(u)).or_else(|| owner.clone()) {
                        seen.slurm.insert(u);
                    }
                }
                if let Some(o) = &owner {
                    self.user_of.entry(*key).or_default().insert(o.clone());
                    if settings.owners {
                        out.owners.insert(pid, o.clone());
                        *out.user_memory.entry(o.clone()).or_default() += used.unwrap_or(0);
                    }
                }
            }
        }
    }
}

/// Puts in `out` each job, bounded (the first `max_jobs` by id are kept), with its user and
/// devices, and each device held, with its jobs and users.
fn hold(settings: &Settings, devices: &[DeviceProcs], found: Found, out: &mut Holders) {
    let all: BTreeSet<&String> = found.job_of.values().flatten().collect();
    let kept: BTreeSet<String> = all
        .iter()
        .take(settings.max_jobs)
        .map(|j| (*j).clone())
        .collect();
    out.dropped = all.len() - kept.len();
    let job_user: BTreeMap<String, String> = found
        .job_users
        .into_iter()
        .filter_map(|(j, seen)| Some((j, seen.user()?)))
        .collect();
    for (key, uuid, _) in devices {
        let jobs: Vec<String> = found
            .job_of
            .get(key)
            .into_iter()
            .flatten()
            .filter(|j| kept.contains(*j))
            .cloned()
            .collect();
        let mut users: BTreeSet<String> = found.user_of.get(key).cloned().unwrap_or_default();
        users.extend(jobs.iter().filter_map(|j| job_user.get(j).cloned()));
        for j in &jobs {
            let job = out.jobs.entry(j.clone()).or_default();
            job.user = job_user.get(j).cloned();
            job.devices.push((*key, (*uuid).to_string()));
        }
        if !jobs.is_empty() || !users.is_empty() {
            out.devices.insert(
                *key,
                Held {
                    jobs,
                    users: users.into_iter().collect(),
                },
            );
        }
    }
}

/// The users, bounded as the jobs are: the first `max_jobs` by name are kept.
fn bound_users(settings: &Settings, out: &mut Holders) {
    let all: BTreeSet<String> = out
        .devices
        .values()
        .flat_map(|h| h.users.iter().cloned())
        .collect();
    if all.len() > settings.max_jobs {
        let kept: BTreeSet<&String> = all.iter().take(settings.max_jobs).collect();
        out.dropped += all.len() - kept.len();
        for h in out.devices.values_mut() {
            h.users.retain(|u| kept.contains(u));
        }
        out.owners.retain(|_, u| kept.contains(u));
        out.user_memory.retain(|u, _| kept.contains(u));
    }
}

/// Starts refreshing who holds what after every sample, when Slurm or process owners are on.
/// Returns the view that the exposition, the decision loop and the status page read.
pub fn spawn(
    config: &crate::config::Config,
    snapshots: &Snapshots,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Option<Arc<SharedHolders>> {
    let settings = Settings {
        slurm: config.slurm.enabled,
        mapping_dir: config.slurm.job_mapping_dir.clone(),
        owners: config.sampling.process_owners,
        max_jobs: config.slurm.max_jobs,
    };
    if !settings.slurm && !settings.owners {
        return None;
    }
    let view = Arc::new(SharedHolders::default());
    tasks.spawn(refresh(settings, snapshots.clone(), Arc::clone(&view)));
    Some(view)
}

/// Refreshes the view after every sample until the daemon stops. The reads of `/proc`, the
/// mapping directory and the password database (which may ask a directory service) run off
/// the worker thread.
async fn refresh(settings: Settings, snapshots: Snapshots, view: Arc<SharedHolders>) {
    let mut seq = 0;
    let mut users = Users::default();
    let mut dropping = false;
    let mut refused: Option<String> = None;
    let mut unknown: Option<String> = None;
    loop {
        let snap = snapshots.next_after(seq).await;
        seq = snap.seq;
        let s = settings.clone();
        let task = tokio::task::spawn_blocking(move || {
            let mapping = s
                .mapping_dir
                .as_deref()
                .filter(|_| s.slurm)
                .map(mapping::read)
                .unwrap_or_default();
            let holders = join(&s, &snap, &mapping, &mut users, |pid| {
                read_process(pid, s.slurm)
            });
            (holders, users, mapping.refused)
        });
        let Ok((holders, back, refusal)) = task.await else {
            tracing::error!("reading who holds the GPUs failed; job and user rules see unknown data from now on");
            return;
        };
        users = back;
        if refusal != refused {
            if let Some(w) = &refusal {
                tracing::error!(reason = %w, "the job mapping directory is not read: job and user rules are held until it can be");
            }
            refused = refusal;
        }
        // Said once each time it changes: a directory of many files may stay so for long.
        if holders.mapping_unknown != unknown {
            match (&holders.mapping_unknown, refused.is_some()) {
                (Some(w), false) => tracing::warn!(
                    reason = %w,
                    "the job mapping directory is not read whole: any job may hold any GPU, so job and user rules are held until it is"
                ),
                (None, _) => tracing::info!("the job mapping directory is read whole again"),
                _ => {}
            }
            unknown = holders.mapping_unknown.clone();
        }
        if (holders.dropped > 0) != dropping {
            dropping = holders.dropped > 0;
            if dropping {
                tracing::warn!(
                    kept = settings.max_jobs,
                    dropped = holders.dropped,
                    "more jobs (or users) hold GPUs than [slurm] max_jobs; the rest are not tracked"
                );
            }
        }
        view.publish(holders);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuSample;

    fn gpu(index: u32, pids: &[u32]) -> GpuSample {
        GpuSample {
            index,
            uuid: format!("GPU-{index}"),
            up: true,
            pids: pids
                .iter()
                .map(|&pid| ProcessRef {
                    pid,
                    used_memory_bytes: Some(100),
                })
                .collect(),
            ..GpuSample::default()
        }
    }

    fn settings(max_jobs: usize) -> Settings {
        Settings {
            slurm: true,
            mapping_dir: None,
            owners: true,
            max_jobs,
        }
    }

    /// Pid 1 is job 10's (cgroup v1, uid 0), pid 2 job 11's (no uid in its path, owned by
    /// uid 0), pid 3 no job's.
    fn process(pid: u32) -> Process {
        let job = |job: &str, uid| {
            Some(Holder {
                job: job.into(),
                uid,
            })
        };
        match pid {
            1 => Process {
                job: job("10", Some(0)),
                claimed: false,
                uid: Some(0),
            },
            2 => Process {
                job: job("11", None),
                claimed: false,
                uid: Some(0),
            },
            // From the environment: job 12, which the mapping gives GPU 2, and job 10, which
            // it does not give GPU 3.
            4 => Process {
                job: job("12", None),
                claimed: true,
                uid: Some(0),
            },
            5 => Process {
                job: job("10", None),
                claimed: true,
                uid: Some(4_000_000_002),
            },
            _ => Process {
                job: None,
                claimed: false,
                uid: Some(4_000_000_001),
            },
        }
    }

    #[test]
    fn processes_and_the_mapping_say_who_holds_each_gpu() {
        let snap = Snapshot {
            seq: 7,
            gpus: vec![gpu(0, &[1, 3]), gpu(1, &[2]), gpu(2, &[4]), gpu(3, &[5])],
            ..Snapshot::default()
        };
        let mut mapping = mapping::Mapping::default();
        mapping
            .jobs
            .insert(Device::Uuid("GPU-2".into()), vec!["12".into()]);
        // A GPU this node does not have maps nothing.
        mapping.jobs.insert(Device::Index(9), vec!["13".into()]);
        let h = join(
            &settings(256),
            &snap,
            &mapping,
            &mut Users::default(),
            process,
        );
        assert_eq!(h.seq, 7);
        assert_eq!(h.jobs.keys().collect::<Vec<_>>(), ["10", "11", "12"]);
        assert_eq!(h.jobs["10"].user.as_deref(), Some("root"));
        assert_eq!(h.jobs["11"].user.as_deref(), Some("root"));
        // Its process's environment names it on a GPU the prolog gave it: believed, and the
        // process names the job's user.
        assert_eq!(h.jobs["12"].user.as_deref(), Some("root"));
        assert_eq!(h.jobs["12"].devices, [((2, None), "GPU-2".to_string())]);
        // A process claiming job 10 on a GPU the prolog did not give it is not believed.
        assert_eq!(h.jobs["10"].devices, [((0, None), "GPU-0".to_string())]);
        assert_eq!(h.of((3, None)).unwrap().jobs, Vec::<String>::new());
        let g0 = h.of((0, None)).unwrap();
        assert_eq!(g0.jobs, ["10"]);
        assert_eq!(g0.users, ["4000000001", "root"]);
        assert_eq!(h.owners[&3], "4000000001");
        assert_eq!(h.user_memory["root"], 300);
        assert_eq!(h.dropped, 0);
    }

    /// A job's user comes from a root-owned Slurm cgroup, else from its confirmed claims while
    /// they agree; never from a path a user made, nor from the first claim read.
    #[test]
    fn a_jobs_user_is_only_what_its_owner_cannot_forge() {
        let mapping = |jobs: &[(u32, &str)]| {
            let mut m = mapping::Mapping::default();
            for (gpu, job) in jobs {
                m.jobs.insert(Device::Index(*gpu), vec![job.to_string()]);
            }
            m
        };
        let claim = |job: &str, path_uid: Option<u32>, uid: u32| Process {
            job: Some(Holder {
                job: job.into(),
                uid: path_uid,
            }),
            claimed: true,
            uid: Some(uid),
        };
        let snap = Snapshot {
            seq: 1,
            gpus: vec![gpu(0, &[20]), gpu(1, &[21]), gpu(2, &[22]), gpu(3, &[23])],
            ..Snapshot::default()
        };
        let h = join(
            &settings(256),
            &snap,
            &mapping(&[(0, "77"), (1, "42"), (2, "42"), (3, "9")]),
            &mut Users::default(),
            |pid| match pid {
                // Alice (uid 4000002002) in a cgroup she made, `.../slurm/uid_2003/job_77/step_0`.
                20 => claim("77", Some(4_000_002_003), 4_000_002_002),
                // Job 42: a process of 4000002002 claims it first, then alice's (4000002001).
                21 => claim("42", None, 4_000_002_002),
                22 => claim("42", None, 4_000_002_001),
                // Job 9: a claim of 4000002002 only.
                _ => claim("9", None, 4_000_002_002),
            },
        );
        assert_eq!(h.jobs["77"].user.as_deref(), Some("4000002002"));
        assert_eq!(h.of((0, None)).unwrap().users, ["4000002002"]);
        assert_eq!(h.jobs["42"].user, None);
        assert_eq!(h.of((1, None)).unwrap().users, ["4000002002"]);
        assert_eq!(h.of((2, None)).unwrap().users, ["4000002001"]);
        assert_eq!(h.jobs["9"].user.as_deref(), Some("4000002002"));
        // Slurm's own word wins over any claim.
        let snap = Snapshot {
            seq: 2,
            gpus: vec![gpu(0, &[30, 31])],
            ..Snapshot::default()
        };
        let h = join(
            &settings(256),
            &snap,
            &mapping(&[(0, "9")]),
            &mut Users::default(),
            |pid| match pid {
                30 => claim("9", None, 4_000_002_002),
                _ => Process {
                    job: Some(Holder {
                        job: "9".into(),
                        uid: Some(4_000_002_001),
                    }),
                    claimed: false,
                    uid: Some(4_000_002_001),
                },
            },
        );
        assert_eq!(h.jobs["9"].user.as_deref(), Some("4000002001"));
    }

    /// The prolog names a whole GPU that is in MIG mode: the job holds each of its MIG
    /// devices, and a claim on one of them is confirmed, so a busy MIG device is never left
    /// out of its job.
    #[test]
    fn a_whole_gpu_in_the_mapping_gives_its_mig_devices_to_the_job() {
        let mut g0 = gpu(0, &[]);
        g0.mig = vec![crate::gpu::MigSample {
            uuid: "MIG-0-1".into(),
            gpu_instance: Some(1),
            pids: vec![ProcessRef {
                pid: 40,
                used_memory_bytes: Some(1),
            }],
            ..crate::gpu::MigSample::default()
        }];
        let snap = Snapshot {
            seq: 3,
            gpus: vec![g0, gpu(1, &[])],
            ..Snapshot::default()
        };
        let mut mapping = mapping::Mapping::default();
        for (dev, job) in [
            (Device::Uuid("gpu-0".into()), "42"),
            (Device::Index(1), "42"),
        ] {
            mapping.jobs.insert(dev, vec![job.into()]);
        }
        let h = join(
            &settings(256),
            &snap,
            &mapping,
            &mut Users::default(),
            |_| Process {
                job: Some(Holder {
                    job: "42".into(),
                    uid: None,
                }),
                claimed: true,
                uid: Some(4_000_003_001),
            },
        );
        let devices: Vec<DeviceKey> = h.jobs["42"].devices.iter().map(|d| d.0).collect();
        assert_eq!(devices, [(0, None), (0, Some(1)), (1, None)]);
        assert_eq!(h.of((0, Some(1))).unwrap().jobs, ["42"]);
    }

    #[test]
    fn jobs_beyond_the_cap_are_counted_and_left_out() {
        let snap = Snapshot {
            gpus: vec![gpu(0, &[1]), gpu(1, &[2])],
            ..Snapshot::default()
        };
        let h = join(
            &settings(1),
            &snap,
            &mapping::Mapping::default(),
            &mut Users::default(),
            process,
        );
        assert_eq!(h.jobs.keys().collect::<Vec<_>>(), ["10"]);
        assert_eq!(h.dropped, 1);
        assert!(h.of((1, None)).is_some_and(|d| d.jobs.is_empty()));
    }
}
