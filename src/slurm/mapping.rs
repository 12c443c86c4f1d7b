//! dcgm-exporter's job mapping directory: a Slurm prolog writes one file per GPU, named by the
//! GPU's index (`0`), its MIG device (`0.1`: GPU and GPU instance) or its UUID, holding the ids
//! of the jobs allocated it, one per line; the epilog removes it. A GPU allocated to a job with
//! no process on it still belongs to the job.
//!
//! `deploy/slurm/prolog.sh` and `epilog.sh` write it. Bounded: at most `MAX_FILES` device files
//! of `MAX_FILE_BYTES`, `MAX_JOBS_PER_GPU` jobs each, among at most `MAX_ENTRIES` entries (the
//! scripts' lock and temporary files, which start with a dot, count only there). Names and
//! lines that are not a GPU or a job id are counted as skipped: they name no job on a device.
//! A device file that is not read whole (too large, too many jobs, beyond the cap, unreadable)
//! may name any job on its device, so the mapping is then unknown (`Mapping::unknown`), and
//! unknown holders are busy: no job or user rule is judged until it is read whole again.

use std::collections::BTreeMap;
use std::path::Path;

/// Device files read: a node has at most a few dozen devices, each named by index or UUID.
const MAX_FILES: usize = 1024;
/// Entries listed, device files or not: lock and temporary files left behind by crashed
/// prologs count here only.
const MAX_ENTRIES: usize = 65_536;
/// A shared GPU (`OverSubscribe`, shards) may be listed for many jobs at once, and a prolog
/// that appends leaves a line per job: 1,024 job ids of 20 digits fit in 22 KiB.
const MAX_FILE_BYTES: u64 = 64 * 1024;
const MAX_JOBS_PER_GPU: usize = 1024;

/// The device a mapping file names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Device {
    /// A GPU by index.
    Index(u32),
    /// A MIG device: its GPU's index and its GPU instance.
    Mig(u32, u32),
    /// A GPU (or MIG device) by UUID.
    Uuid(String),
}

/// What the directory says: the jobs on each device, and how many entries were skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    pub jobs: BTreeMap<Device, Vec<String>>,
    pub skipped: usize,
    /// Why the directory was not read at all: others could write it (and so name any job on
    /// any GPU, for rules that may cancel it).
    pub refused: Option<String>,
    /// Why what the directory says is not known whole: a device file (or the listing) that was
    /// not read may give any job a device, and a job judged without it may be judged on its
    /// idle devices alone. `None` when every device file was read whole (or there is no
    /// directory).
    pub unknown: Option<String>,
}

impl Mapping {
    /// Reads one device file into the mapping: its jobs, or why it is not known whole. A file
    /// gone since the listing (an epilog removed it) maps nothing.
    fn read_file(&mut self, device: Device, path: &Path) {
        let text = match crate::files::read_text(path, MAX_FILE_BYTES, crate::files::Links::Refuse)
        {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => return self.unread(|| format!("{}: {e}", path.display())),
        };
        let jobs = jobs(&text);
        self.skipped += jobs.skipped;
        if jobs.beyond > 0 {
            self.skipped += jobs.beyond - 1;
            self.unread(|| {
                format!(
                    "{} lists more than {MAX_JOBS_PER_GPU} jobs; the rest were not read",
                    path.display()
                )
            });
        }
        if text.ends_with(|c| c != '\n') {
            // A prolog may be appending to it: its last line may be an id cut short.
            self.unread(|| {
                format!(
                    "{} does not end with a newline (a prolog may be writing it)",
                    path.display()
                )
            });
        }
        if !jobs.ids.is_empty() {
            // Two names of one device (`0` and `00`): both lists count.
            let listed = self.jobs.entry(device).or_default();
            for id in jobs.ids {
                if !listed.contains(&id) {
                    listed.push(id);
                }
            }
        }
    }

    /// Notes the first reason the mapping is not known whole; every such entry is skipped too.
    fn unread(&mut self, why: impl FnOnce() -> String) {
        self.skipped += 1;
        if self.unknown.is_none() {
            self.unknown = Some(why());
        }
    }
}

/// The device a file name names, if it names one.
pub fn device(name: &str) -> Option<Device> {
    let digits = |s: &str| {
        (!s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    if let Some(rest) = name
        .strip_prefix("GPU-")
        .or_else(|| name.strip_prefix("MIG-"))
    {
        let ok = rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        return ok.then(|| Device::Uuid(name.to_string()));
    }
    match name.split_once('.') {
        None => digits(name).map(Device::Index),
        Some((gpu, gi)) => Some(Device::Mig(digits(gpu)?, digits(gi)?)),
    }
}

/// A directory only root (or gpuwatch's own user) can write: not a link, owned by one of them,
/// and writable by neither its group nor others. A missing one is trusted (it maps nothing).
fn trusted(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let me = crate::files::effective_uid();
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, neither root nor gpuwatch's uid {me}",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} can be written by others (mode {:o}): make it writable by its owner only",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// One file's job ids: one per line, trimmed; empty lines and `0` (what some epilogs write
/// instead of removing the file) are none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Jobs {
    pub ids: Vec<String>,
    /// Lines that are no job id.
    pub skipped: usize,
    /// Job ids beyond `MAX_JOBS_PER_GPU`, not read: the file is not known whole.
    pub beyond: usize,
}

/// How long a read waits for the scripts to let go of their lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes the scripts' lock (`.lock`, which `deploy/slurm/prolog.sh` and `epilog.sh` hold
/// while they change the directory) shared, waiting at most `LOCK_WAIT`; `Ok(None)` where the
/// directory has no lock file (prologs of other make write none).
fn lock_shared(dir: &Path) -> Result<Option<std::fs::File>, String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(".lock");
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let began = std::time::Instant::now();
    loop {
        // SAFETY: flock on a descriptor this function owns, open for its whole call; it only
        // takes an advisory lock. (The standard library's File::try_lock_shared needs a newer
        // Rust than this crate's rust-version.)
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return Ok(Some(file));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(format!("{}: {e}", path.display()));
        }
        if began.elapsed() >= LOCK_WAIT {
            return Err(format!(
                "{} was held for more than {LOCK_WAIT:?} (a prolog or epilog writing)",
                path.display()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The job ids of one file's text.
pub fn jobs(text: &str) -> Jobs {
    let mut out = Jobs::default();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "0")
    {
        if !crate::state::is_job_id(line) {
            out.skipped += 1;
        } else if out.ids.iter().any(|j| j == line) {
            continue;
        } else if out.ids.len() >= MAX_JOBS_PER_GPU {
            out.beyond += 1;
        } else {
            out.ids.push(line.to_string());
        }
    }
    out
}

/// Reads the directory. A directory that is missing maps nothing; a file that is gone between
/// the listing and the read (as an epilog removes it) maps nothing either. Anything else that
/// keeps a device file from being read whole makes the mapping unknown.
pub fn read(dir: &Path) -> Mapping {
    let mut m = Mapping::default();
    if let Err(why) = trusted(dir) {
        m.unknown = Some(format!("the directory is not trusted: {why}"));
        m.refused = Some(why);
        return m;
    }
    // Held until the reading is done: no file is read mid-append, and no listing misses a file
    // the epilog renames over.
    let _lock = match lock_shared(dir) {
        Ok(lock) => lock,
        Err(why) => {
            m.unread(|| why);
            return m;
        }
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return m,
        Err(e) => {
            m.unread(|| format!("{} cannot be listed: {e}", dir.display()));
            return m;
        }
    };
    let (mut listed, mut files) = (0usize, 0usize);
    for entry in entries {
        listed += 1;
        if listed > MAX_ENTRIES {
            m.unread(|| {
                format!(
                    "{} holds more than {MAX_ENTRIES} entries; the rest were not read",
                    dir.display()
                )
            });
            break;
        }
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                m.unread(|| format!("{} cannot be listed: {e}", dir.display()));
                continue;
            }
        };
        let name = entry.file_name();
        // The scripts' lock and temporary files.
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let Some(device) = name.to_str().and_then(device) else {
            m.skipped += 1;
            continue;
        };
        files += 1;
        if files > MAX_FILES {
            m.unread(|| {
                format!(
                    "{} holds more than {MAX_FILES} device files; the rest were not read",
                    dir.display()
                )
            });
            continue;
        }
        m.read_file(device, &entry.path());
    }
    m
}
