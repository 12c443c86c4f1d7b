//! The audit log: its one typed schema (`AuditRecord`, one variant per event kind, tagged by
//! `event`), the append-only writer (`AuditLog`), and the one reader (`files`, `Entry`), which
//! `gpuwatch audit` and the status page both render with `Entry::sentence`.
//!
//! On disk each record is one JSON object per line, its keys in alphabetical order, with `time`
//! (RFC 3339), `mode` and, on EC2, `instance_id` added by the executor when it writes it.

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
    /// An EC2 call that succeeded, with its request id.
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
    SnsPublish {
        #[serde(default)]
        budget: String,
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
    /// A spot interruption notice, as IMDS gave it (the record's `time` is when it was seen).
    SpotInterruption {
        #[serde(default)]
        notice: String,
    },
    SpotRebalance,
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
    let mut numbered: Vec<u32> = fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            let n = name.to_str()?.strip_prefix(AUDIT_FILE)?.strip_prefix('.')?;
            n.parse().ok()
        })
        .collect();
    numbered.sort_unstable_by(|a, b| b.cmp(a));
    let mut out: Vec<PathBuf> = numbered.into_iter().map(|n| rotated(&current, n)).collect();
    if current.exists() {
        out.push(current);
    }
    out
}

/// One line of the log as read: the JSON object, and its typed record where it is one (a
/// record of a kind this version does not know, or of another shape, is still shown).
#[derive(Debug, Clone)]
pub struct Entry {
    pub raw: Value,
    pub record: Option<AuditRecord>,
}

impl Entry {
    /// Parses one line; `None` for anything but a JSON object.
    pub fn parse(line: &str) -> Option<Entry> {
        let raw: Value = serde_json::from_str(line).ok()?;
        if !raw.is_object() {
            return None;
        }
        let record = AuditRecord::deserialize(&raw).ok();
        Some(Entry { raw, record })
    }

    fn str_of(&self, key: &str) -> &str {
        self.raw.get(key).and_then(Value::as_str).unwrap_or("")
    }

    /// The event kind, as written.
    pub fn event(&self) -> &str {
        self.str_of("event")
    }

    /// The rule it is about; empty for none.
    pub fn rule(&self) -> &str {
        self.str_of("rule")
    }

    /// When it was written, in Unix seconds.
    pub fn time(&self) -> Option<f64> {
        crate::time::parse_rfc3339(self.str_of("time"))
    }

    /// The record in words, after its local time.
    pub fn sentence(&self) -> String {
        let when = self.time().map_or_else(|| "?".to_string(), local);
        let what = match &self.record {
            Some(r) => words(r, self.str_of("mode")),
            None => format!("{}: {}", self.event(), self.raw),
        };
        format!("{when}  {what}")
    }
}

/// A record in words; `mode` is the mode it was written in.
fn words(r: &AuditRecord, mode: &str) -> String {
    use AuditRecord as R;
    match r {
        R::Breach { rule, evidence, .. } => {
            let periods = evidence["periods"].as_array().map_or(0, Vec::len);
            format!(
                "rule {rule} breached ({} of {periods} periods past the threshold {})",
                evidence["breaching_periods"], evidence["threshold"]
            )
        }
        R::Recovered { rule, .. } => format!("rule {rule} no longer breaches"),
        R::Warning {
            rule,
            action,
            due_at,
            ..
        } => format!(
            "rule {rule} warns: {action} at {} unless the GPUs are used again",
            local_clock(due_at)
        ),
        R::Cancelled {
            rule,
            action,
            reason,
            ..
        } => format!("rule {rule}: {action} cancelled, {reason}"),
        R::Postponed {
            rule,
            action,
            reason,
            ..
        } => format!("rule {rule}: {action} postponed, {reason}"),
        R::ActionAttempt { rule, action, .. } => {
            format!("rule {rule}: {action} begins ({mode} mode)")
        }
        R::ActionResult {
            rule,
            action,
            result,
            detail,
        } => {
            if detail.is_empty() {
                format!("rule {rule}: {action} {result}")
            } else {
                format!("rule {rule}: {action} {result}: {detail}")
            }
        }
        R::ApiCall {
            rule,
            operation,
            request_id,
        } => format!(
            "rule {rule}: {operation} (request {})",
            request_id.as_deref().unwrap_or("")
        ),
        R::ApiError {
            rule,
            operation,
            error,
            ..
        } => format!("rule {rule}: {operation} failed: {error}"),
        R::BudgetAlert {
            budget,
            threshold,
            basis,
            ratio,
            limit,
        } => format!(
            "budget {budget} {} spend at {:.0}% of ${} (threshold {:.0}%)",
            basis.as_str(),
            ratio * 100.0,
            Value::from(*limit),
            threshold * 100.0
        ),
        R::PeriodClosed { spent_usd, .. } => {
            format!("budget period closed: ${} spent", Value::from(*spent_usd))
        }
        R::Started { grace_until, .. } => format!(
            "gpuwatch started ({mode} mode, boot grace until {})",
            local_clock(grace_until)
        ),
        R::Stopped => "gpuwatch stopped".to_string(),
        R::InFlightAtRestart {
            rule,
            action,
            instance_state,
            ..
        } => format!(
            "rule {rule}: the {action} sent before a restart is not repeated (instance {})",
            Value::from(instance_state.clone())
        ),
        R::SpotInterruption { .. } => "spot interruption notice".to_string(),
        R::SpotRebalance => "spot rebalance recommendation".to_string(),
        R::InterruptionHook { result, .. } => format!("interruption hook: {result}"),
        R::SnsPublish { budget, .. } => format!("budget {budget} alert published to SNS"),
        R::StateReset { reason } => format!("state reset: {reason}"),
    }
}

/// Unix seconds as local time, `YYYY-MM-DD HH:MM`.
pub fn local(t: f64) -> String {
    let secs = t as libc::time_t;
    // SAFETY: localtime_r writes only the struct we pass, and reads the time zone (TZ, or
    // /etc/localtime) and nothing of ours. Why unsafe: the standard library has no local time.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return crate::time::rfc3339(t);
        }
        tm
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min
    )
}

/// The hour and minute of an RFC 3339 value, in local time.
fn local_clock(text: &str) -> String {
    crate::time::parse_rfc3339(text)
        .map(|t| local(t).split_off(11))
        .unwrap_or_else(|| text.to_string())
}

/// Reads the next line (without its `\n`) into `line`, keeping at most `max` bytes:
/// `Some(true)` for a whole line, `Some(false)` for one that was longer (the rest of it is read
/// and dropped), `None` at the end of the input.
pub fn read_line(
    reader: &mut impl io::BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<bool>> {
    line.clear();
    let mut whole = true;
    let mut any = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(any.then_some(whole));
        }
        any = true;
        let (piece, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if whole && line.len() + piece.len() <= max {
            line.extend_from_slice(piece);
        } else {
            whole = false;
            line.clear();
        }
        let used = end.unwrap_or(buf.len());
        reader.consume(used);
        if end.is_some() {
            return Ok(Some(whole));
        }
    }
}

/// The last `n` records of the log, read from at most its last 256 KiB.
pub fn recent(path: &Path, n: usize) -> Vec<Entry> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 256 * 1024;
    // Not through a link: root reading the status must not follow one planted in the
    // directory; and never a FIFO or a device.
    let Ok(mut file) = crate::files::open_regular(path, crate::files::Links::Refuse) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(TAIL);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    if file.take(TAIL).read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    // A read that starts mid-file starts mid-line: that first piece is not a record.
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    let mut entries: Vec<Entry> = lines
        .iter()
        .rev()
        .filter_map(|l| Entry::parse(l))
        .take(n)
        .collect();
    entries.reverse();
    entries
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
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.open()?;
        let len = f.metadata()?.len();
        if len > 0 && len + line.len() as u64 > self.rotation.max_bytes {
            drop(f);
            self.rotate()?;
            f = self.open()?;
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
        f.sync_data()
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
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_log_rotates_by_size_and_count_without_splitting_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        let log = AuditLog::with_rotation(
            path.clone(),
            Rotation {
                max_bytes: 200,
                keep: 2,
            },
        );
        for i in 0..20 {
            log.append(&serde_json::json!({"event": "tick", "n": i, "pad": "x".repeat(40)}))
                .unwrap();
        }
        let mut seen = Vec::new();
        for name in ["audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"] {
            let text = fs::read_to_string(dir.path().join(name)).unwrap();
            assert!(text.len() <= 200, "{name}: {}", text.len());
            for line in text.lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                seen.push(v["n"].as_u64().unwrap());
            }
        }
        assert!(!dir.path().join("audit.jsonl.3").exists());
        // The newest records, in order, none split.
        assert_eq!(seen.last(), Some(&19));
        assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");
    }

    #[test]
    fn a_torn_line_never_merges_with_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_FILE);
        fs::write(&path, "{\"event\":\"ok\"}\n{\"event\":\"tor").unwrap();
        AuditLog::new(path.clone())
            .append(&serde_json::json!({"event": "next"}))
            .unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[2], "{\"event\":\"next\"}");
    }

    /// One record of every kind, as the daemon writes it: the JSONL on disk is an interface
    /// (scripts and `jq` read it), so a change to any line is a change a reviewer sees here.
    #[test]
    fn every_kind_of_record_is_written_as_its_golden_line() {
        use serde_json::json;
        let evidence =
            json!({"breaching_periods": 3, "periods": [0.01, 0.02, 0.0], "threshold": 0.05});
        let records = [
            AuditRecord::Started {
                rules: vec!["idle".into()],
                grace_until: "2026-12-01T00:10:00Z".into(),
            },
            AuditRecord::Stopped,
            AuditRecord::Breach {
                rule: "idle".into(),
                at: 1_796_083_200.0,
                evidence: evidence.clone(),
            },
            AuditRecord::Recovered {
                rule: "idle".into(),
                at: 1_796_083_200.0,
            },
            AuditRecord::Warning {
                rule: "idle".into(),
                at: 1_796_083_200.0,
                action: Action::Stop,
                due_at: "2026-12-01T00:15:00Z".into(),
                evidence: evidence.clone(),
            },
            AuditRecord::Cancelled {
                rule: "idle".into(),
                at: 1_796_083_200.0,
                action: Action::Stop,
                reason: "the GPUs are in use again".into(),
            },
            AuditRecord::Postponed {
                rule: "idle".into(),
                at: 1_796_083_200.0,
                action: Action::Terminate,
                reason: "held until 2026-12-01T02:00:00Z".into(),
            },
            AuditRecord::ActionAttempt {
                rule: "idle".into(),
                at: 1_796_083_200.0,
                action: Action::Stop,
                evidence,
            },
            AuditRecord::ActionResult {
                rule: "idle".into(),
                action: Action::Stop,
                result: "done".into(),
                detail: String::new(),
            },
            AuditRecord::ApiCall {
                rule: "idle".into(),
                operation: "StopInstances".into(),
                request_id: Some("req-1".into()),
            },
            AuditRecord::ApiError {
                rule: "idle".into(),
                operation: "StopInstances".into(),
                error: "UnauthorizedOperation".into(),
                request_id: None,
            },
            AuditRecord::InFlightAtRestart {
                rule: "idle".into(),
                action: Action::Stop,
                sent_at: "2026-12-01T00:15:00Z".into(),
                instance_state: Some("stopping".into()),
                repeated: false,
            },
            AuditRecord::BudgetAlert {
                budget: "monthly".into(),
                threshold: 0.8,
                basis: Basis::Actual,
                ratio: 0.81,
                limit: 1000.0,
            },
            AuditRecord::SnsPublish {
                budget: "monthly".into(),
                message_id: Some("msg-1".into()),
            },
            AuditRecord::PeriodClosed {
                period_start: "2026-11-01T00:00:00Z".into(),
                period_end: "2026-12-01T00:00:00Z".into(),
                spent_usd: 712.5,
            },
            AuditRecord::SpotInterruption {
                notice: "Interruption { action: \"terminate\" }".into(),
            },
            AuditRecord::SpotRebalance,
            AuditRecord::InterruptionHook {
                command: vec!["/usr/local/bin/drain".into()],
                result: "done".into(),
            },
            AuditRecord::StateReset {
                reason: "state.json is corrupt".into(),
            },
        ];
        let mut got = String::new();
        for (i, r) in records.iter().enumerate() {
            let instance = (i % 2 == 0).then_some("i-0123456789abcdef0");
            got +=
                &serde_json::to_string(&r.stamped(1_796_083_260.0, "enforce", instance)).unwrap();
            got.push('\n');
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/audit/records.jsonl");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            fs::write(&path, &got).unwrap();
        }
        assert_eq!(
            got,
            fs::read_to_string(&path).unwrap(),
            "rerun with UPDATE_GOLDEN=1 and review"
        );
        // The one reader reads every line back as the record it was.
        for (line, want) in got.lines().zip(&records) {
            let entry = Entry::parse(line).unwrap();
            assert_eq!(entry.record.as_ref(), Some(want), "{line}");
            assert_eq!(entry.time(), Some(1_796_083_260.0));
            assert!(!entry.sentence().contains(": {"), "{}", entry.sentence());
        }
    }
}
