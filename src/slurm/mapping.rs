//! dcgm-exporter's job mapping directory: a Slurm prolog writes one file per GPU, named by the
//! GPU's index (`0`), its MIG device (`0.1`: GPU and GPU instance) or its UUID, holding the ids
//! of the jobs allocated it, one per line; the epilog removes it. A GPU allocated to a job with
//! no process on it still belongs to the job.
//!
//! `deploy/slurm/prolog.sh` and `epilog.sh` write it. Bounded: at most `MAX_FILES` files of `MAX_FILE_BYTES`, `MAX_JOBS_PER_GPU` jobs each; what
//! is beyond is counted as skipped, as are names and lines that are not a GPU or a job id.

use std::collections::BTreeMap;
use std::path::Path;

const MAX_FILES: usize = 1024;
const MAX_FILE_BYTES: u64 = 4096;
const MAX_JOBS_PER_GPU: usize = 64;

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

/// The job ids of one file's text: one per line, trimmed; empty lines and `0` (what some
/// epilogs write instead of removing the file) are none.
pub fn jobs(text: &str) -> (Vec<String>, usize) {
    let mut out: Vec<String> = Vec::new();
    let mut skipped = 0;
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "0")
    {
        if !crate::state::is_job_id(line) || out.len() >= MAX_JOBS_PER_GPU {
            skipped += 1;
        } else if !out.iter().any(|j| j == line) {
            out.push(line.to_string());
        }
    }
    (out, skipped)
}

/// Reads the directory. A directory that is missing maps nothing; a file that cannot be read
/// (gone between the listing and the read, as an epilog removes it) is skipped.
pub fn read(dir: &Path) -> Mapping {
    let mut m = Mapping::default();
    if let Err(why) = trusted(dir) {
        m.refused = Some(why);
        return m;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return m;
    };
    for (n, entry) in entries.flatten().enumerate() {
        if n >= MAX_FILES {
            m.skipped += 1;
            continue;
        }
        let name = entry.file_name();
        // The scripts' lock and temporary files.
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let Some(device) = name.to_str().and_then(device) else {
            m.skipped += 1;
            continue;
        };
        let text =
            crate::files::read_text(&entry.path(), MAX_FILE_BYTES, crate::files::Links::Refuse);
        let Ok(text) = text else {
            m.skipped += 1;
            continue;
        };
        let (jobs, skipped) = jobs(&text);
        m.skipped += skipped;
        if !jobs.is_empty() {
            m.jobs.insert(device, jobs);
        }
    }
    m
}
