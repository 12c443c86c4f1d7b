//! The audit log: its one typed schema (`AuditRecord`, one variant per event kind, tagged by
//! `event`), the append-only writer (`AuditLog`), and the one reader (`files`, `Entry`), which
//! `gpuwatch audit` and the status page both render with `Entry::sentence`.
//!
//! On disk each record is one JSON object per line, its keys in alphabetical order, with `time`
//! (RFC 3339), `mode` and, on a cloud, `instance_id` added by the executor when it writes it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DiskErrors;
use crate::config::Rotation;
use crate::cost::budget::Basis;
use crate::rules::Action;

/// The audit log's file name in the state directory; rotated files add `.1`, `.2`, ...
pub const AUDIT_FILE: &str = "audit.jsonl";

/// The longest record the reader takes; a longer line is reported and skipped, read in pieces
/// and never held whole.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

mod read;
pub use read::{action_result, local, read_line, recent, Entry};

/// A record as one JSON line no longer than the reader takes. A rule judged over many periods
/// and GPUs can make its evidence longer: its oldest periods are left out (and counted, as
/// `periods_omitted`), and if that is not enough, the evidence says it was too large.
fn fitted(record: &serde_json::Value) -> io::Result<Vec<u8>> {
    let line = serde_json::to_vec(record).map_err(io::Error::other)?;
    // Room for the newline and for a torn record's line ending.
    const MOST: usize = MAX_RECORD_BYTES - 2;
    if line.len() <= MOST {
        return Ok(line);
    }
    let mut record = record.clone();
    let mut omitted = 0;
    let mut len = line.len();
    // Room for `"periods_omitted":N`.
    while len + 32 > MOST {
        let Some(periods) = record
            .pointer_mut("/evidence/periods")
            .and_then(|p| p.as_array_mut())
            .filter(|p| !p.is_empty())
        else {
            break;
        };
        // The periods' share of the excess, at least one: a few rounds at most.
        let n = (periods.len() * (len + 32 - MOST))
            .div_ceil(len)
            .clamp(1, periods.len());
        periods.drain(..n);
        omitted += n;
        len = serde_json::to_vec(&record).map_err(io::Error::other)?.len();
    }
    if omitted > 0 {
        record["evidence"]["periods_omitted"] = omitted.into();
    }
    let line = serde_json::to_vec(&record).map_err(io::Error::other)?;
    if line.len() <= MOST {
        return Ok(line);
    }
    record["evidence"] = serde_json::json!({ "omitted": "the evidence was too large to record" });
    serde_json::to_vec(&record).map_err(io::Error::other)
}

/// One audit record. Each variant is the one way its event is written; field names are the
/// JSON keys. Reading is lenient: a field missing from a line (one written by hand, or by an
/// older version) reads as empty, except the action and the basis, which the words name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AuditRecord {
    /// The cost watch started with these rules; no instance action before `grace_until`.
    Started {
        #[serde(default)]
        rules: Vec<String>,
        #[serde(default)]
        grace_until: String,
    },
    Stopped,
    /// A rule began to breach, on the sample taken `at` (Unix seconds).
    Breach {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        at: f64,
        #[serde(default)]
        evidence: Value,
    },
    Recovered {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        at: f64,
    },
    /// The warning before an action, due at `due_at` (RFC 3339).
    Warning {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        at: f64,
        action: Action,
        #[serde(default)]
        due_at: String,
        /// What calls the action off (`Rule::calls_off`); records before it was kept say
        /// nothing, and read as an idle rule's.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        unless: String,
        #[serde(default)]
        evidence: Value,
    },
    Cancelled {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        at: f64,
        action: Action,
        #[serde(default)]
        reason: String,
    },
    Postponed {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        at: f64,
        action: Action,
        #[serde(default)]
        reason: String,
    },
    /// Written before an action runs: no record, no action.
    ActionAttempt {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        at: f64,
        action: Action,
        #[serde(default)]
        evidence: Value,
    },
    ActionResult {
        #[serde(default)]
        rule: String,
        action: Action,
        #[serde(default)]
        result: String,
        #[serde(default)]
        detail: String,
    },
    /// A cloud call that succeeded, with its request id.
    ApiCall {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        operation: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    ApiError {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        operation: String,
        #[serde(default)]
        error: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// A `gpuwatch:action` stamp the cloud refused for its own limits (the instance has all
    /// the tags it may have): the action went on without it.
    StampRefused {
        #[serde(default)]
        rule: String,
        #[serde(default)]
        operation: String,
        #[serde(default)]
        error: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    /// An action handed out before a restart; it is never repeated.
    InFlightAtRestart {
        #[serde(default)]
        rule: String,
        action: Action,
        #[serde(default)]
        sent_at: String,
        #[serde(default)]
        instance_state: Option<String>,
        #[serde(default)]
        repeated: bool,
    },
    BudgetAlert {
        #[serde(default)]
        budget: String,
        #[serde(default)]
        threshold: f64,
        basis: Basis,
        #[serde(default)]
        ratio: f64,
        #[serde(default)]
        limit: f64,
    },
    /// A budget alert published to a topic of the cloud's. Written as
    /// `topic_publish`; a log from before reads `sns_publish` as the same record.
    #[serde(alias = "sns_publish")]
    TopicPublish {
        #[serde(default)]
        budget: String,
        /// The topic, as the config names it (empty in a log from before).
        #[serde(default)]
        topic: String,
        #[serde(default)]
        message_id: Option<String>,
    },
    PeriodClosed {
        #[serde(default)]
        period_start: String,
        #[serde(default)]
        period_end: String,
        #[serde(default)]
        spent_usd: f64,
    },
    /// An interruption notice (a spot interruption, an eviction or a deletion of the instance),
    /// as instance metadata gave it (the record's `time` is when it was seen).
    SpotInterruption {
        #[serde(default)]
        notice: String,
    },
    SpotRebalance,
    /// A scheduled event that blocks nothing (a freeze, a reboot, a redeploy).
    ScheduledEvent {
        #[serde(default)]
        event_type: String,
        #[serde(default)]
        notice: String,
    },
    InterruptionHook {
        #[serde(default)]
        command: Vec<String>,
        #[serde(default)]
        result: String,
    },
    /// `state.json` did not parse and was set aside.
    StateReset {
        #[serde(default)]
        reason: String,
    },
}

impl AuditRecord {
    /// The record as written: its fields plus when, in which mode and on which instance.
    pub fn stamped(&self, time: f64, mode: &str, instance_id: Option<&str>) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Some(obj) = value.as_object_mut() {
            obj.insert("time".into(), Value::from(crate::time::rfc3339(time)));
            obj.insert("mode".into(), Value::from(mode));
            if let Some(id) = instance_id {
                obj.insert("instance_id".into(), Value::from(id));
            }
        }
        value
    }
}

/// A rotated file of the log: `audit.jsonl.1` is the newest.
fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut p = path.to_path_buf().into_os_string();
    p.push(format!(".{n}"));
    PathBuf::from(p)
}

/// The audit log and its rotated files, oldest first.
pub fn files(state_dir: &Path) -> Vec<PathBuf> {
    let current = state_dir.join(AUDIT_FILE);
    // Only the names `rotated` writes (`.1`, not `.01` or `.+1`), each read once.
    let mut numbered: Vec<(u32, PathBuf)> = fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let n: u32 = e
                .file_name()
                .to_str()?
                .strip_prefix(AUDIT_FILE)?
                .strip_prefix('.')?
                .parse()
                .ok()?;
            (e.path() == rotated(&current, n)).then(|| (n, e.path()))
        })
        .collect();
    numbered.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
    let mut out: Vec<PathBuf> = numbered.into_iter().map(|(_, p)| p).collect();
    if current.exists() {
        out.push(current);
    }
    out
}

/// The append-only audit log: one JSON object per line, fsynced per record, rotated by size
/// (`audit.jsonl.1` is the newest rotated file). A record is never split across files, and a
/// line torn by a full disk never merges with the next record: that starts on a line of its own.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    rotation: Rotation,
    lock: std::sync::Mutex<()>,
    /// Failures of the whole state directory, counted where they happen.
    pub errors: DiskErrors,
}

impl AuditLog {
    pub fn new(path: PathBuf) -> AuditLog {
        AuditLog::with_rotation(path, Rotation::default())
    }

    pub fn with_rotation(path: PathBuf, rotation: Rotation) -> AuditLog {
        AuditLog {
            path,
            rotation,
            lock: std::sync::Mutex::new(()),
            errors: DiskErrors::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record durably. `Err` means it may not be on disk.
    pub fn append(&self, record: &serde_json::Value) -> io::Result<()> {
        let mut line = fitted(record)?;
        line.push(b'\n');
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.open()?;
        let len = f.metadata()?.len();
        // A file this record may have created: its name must be durable with the record.
        let mut new_file = len == 0;
        if len > 0 && len + line.len() as u64 > self.rotation.max_bytes {
            drop(f);
            self.rotate()?;
            f = self.open()?;
            new_file = true;
        } else if len > 0 {
            use std::os::unix::fs::FileExt;
            let mut last = [0u8];
            f.read_exact_at(&mut last, len - 1)?;
            if last[0] != b'\n' {
                // A record torn by a failed write: end its line so this one stands alone.
                line.insert(0, b'\n');
            }
        }
        f.write_all(&line)?;
        f.sync_data()?;
        if new_file {
            self.sync_dir()?;
        }
        Ok(())
    }

    /// Makes the log's directory entries (a new file, a rotation's renames) durable.
    fn sync_dir(&self) -> io::Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    }

    /// Opens the log to append, never blocking on what is planted in its place: anything but a
    /// regular file is refused, and the record is then not written.
    fn open(&self) -> io::Result<File> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path)?;
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", self.path.display()),
            ));
        }
        Ok(file)
    }

    /// `audit.jsonl` becomes `audit.jsonl.1`, `.1` becomes `.2`, and so on; the oldest beyond
    /// `keep` is dropped.
    fn rotate(&self) -> io::Result<()> {
        let numbered = |n: u32| rotated(&self.path, n);
        let keep = self.rotation.keep.max(1);
        match fs::remove_file(numbered(keep)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        for n in (1..keep).rev() {
            match fs::rename(numbered(n), numbered(n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        fs::rename(&self.path, numbered(1))?;
        self.sync_dir()
    }
}

#[cfg(test)]
mod tests;
