//! The one reader of the audit log: a line as an `Entry` (its JSON and, where it is one, its
//! typed record), the record in words, and the log's tail for the status page.

use std::io;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::AuditRecord;
use crate::rules::engine::{breached, cancelled, postponed, RECOVERED};
use crate::rules::Action;
use gpuwatch_core::cost::budget::Crossing;

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

/// A warning in words: what calls it off is the record's own (`Rule::calls_off`), or, in a
/// record from before it was kept, an idle rule's.
fn warning_words(rule: &str, action: Action, due_at: &str, unless: &str) -> String {
    let unless = if unless.is_empty() {
        "the GPUs are used again"
    } else {
        unless
    };
    format!(
        "rule {rule} warns: {action} at {} unless {unless}",
        local_clock(due_at)
    )
}

/// A breach in words, as `simulate` says it too (`Event::sentence`), from the evidence on
/// record: its periods are those kept and those left out to fit the line.
fn breach_words(rule: &str, evidence: &Value) -> String {
    let (Some(breaching), Some(threshold)) = (
        evidence["breaching_periods"].as_u64(),
        evidence["threshold"].as_f64(),
    ) else {
        return format!("rule {rule} breached (its evidence is not on record)");
    };
    let periods = evidence["periods"].as_array().map_or(0, Vec::len)
        + evidence["periods_omitted"].as_u64().unwrap_or(0) as usize;
    format!(
        "rule {rule}: {}",
        breached(breaching as usize, periods, threshold)
    )
}

/// An action's result in words, as its `action_result` record holds it (`result`, the
/// executor's label, and its `detail`): "stop done", "stop failed: ...", "stop refused: ...";
/// a dry run says what it would have done ("would stop this instance ..."). `gpuwatch audit`
/// and `simulate` (whose every action is a rehearsal) both say it so.
pub fn action_result(action: Action, result: &str, detail: &str) -> String {
    match (result, detail) {
        ("dry_run", would) if !would.is_empty() => would.to_string(),
        (result, "") => format!("{action} {result}"),
        (result, detail) => format!("{action} {result}: {detail}"),
    }
}

/// A record in words; `mode` is the mode it was written in.
fn words(r: &AuditRecord, mode: &str) -> String {
    use AuditRecord as R;
    match r {
        R::Breach { rule, evidence, .. } => breach_words(rule, evidence),
        R::Recovered { rule, .. } => format!("rule {rule}: {RECOVERED}"),
        R::Warning {
            rule,
            action,
            due_at,
            unless,
            ..
        } => warning_words(rule, *action, due_at, unless),
        R::Cancelled {
            rule,
            action,
            reason,
            ..
        } => format!("rule {rule}: {}", cancelled(*action, reason)),
        R::Postponed {
            rule,
            action,
            reason,
            ..
        } => format!("rule {rule}: {}", postponed(*action, reason)),
        R::ActionAttempt { rule, action, .. } => {
            format!("rule {rule}: {action} begins ({mode} mode)")
        }
        R::ActionResult {
            rule,
            action,
            result,
            detail,
        } => format!("rule {rule}: {}", action_result(*action, result, detail)),
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
        R::StampRefused {
            rule,
            operation,
            error,
            ..
        } => format!(
            "rule {rule}: {operation} refused for the cloud's limits ({error}); the action went on without its stamp"
        ),
        // The sentence the alert itself was sent with.
        R::BudgetAlert {
            budget,
            threshold,
            basis,
            ratio,
            limit,
        } => gpuwatch_core::step::alert_text(&Crossing {
            budget: budget.clone(),
            threshold: *threshold,
            basis: *basis,
            ratio: *ratio,
            limit: *limit,
            period_start: 0.0,
        }),
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
        R::SpotInterruption { .. } => "interruption notice".to_string(),
        R::SpotRebalance => "spot rebalance recommendation".to_string(),
        R::ScheduledEvent { event_type: t, .. } => format!("scheduled event {t} (blocks nothing)"),
        R::InterruptionHook { result, .. } => format!("interruption hook: {result}"),
        R::TopicPublish { budget, topic, .. } => format!(
            "budget {budget} alert published to {}",
            if topic.is_empty() { "its topic" } else { topic }
        ),
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
