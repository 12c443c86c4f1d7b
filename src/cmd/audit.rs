//! `gpuwatch audit`: the audit log as sentences, rotated files included, oldest first.
//! Malformed lines are reported with their file and line number and skipped, never fatal.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use super::exit;
use crate::config::Config;

/// Which records to show.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Records at or after this Unix time.
    pub since: Option<f64>,
    pub rule: Option<String>,
    pub kind: Option<Kind>,
}

/// The kinds `--kind` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Action,
    Warning,
    Cancel,
    Budget,
}

impl Kind {
    pub fn parse(text: &str) -> Option<Kind> {
        match text {
            "action" => Some(Kind::Action),
            "warning" => Some(Kind::Warning),
            "cancel" => Some(Kind::Cancel),
            "budget" => Some(Kind::Budget),
            _ => None,
        }
    }

    fn matches(self, event: &str) -> bool {
        match self {
            Kind::Action => matches!(
                event,
                "action_attempt" | "action_result" | "api_call" | "api_error"
            ),
            Kind::Warning => event == "warning",
            Kind::Cancel => event == "cancelled",
            Kind::Budget => matches!(event, "budget_alert" | "period_closed" | "sns_publish"),
        }
    }
}

/// The audit log and its rotated files, oldest first.
pub fn files(state_dir: &Path) -> Vec<PathBuf> {
    let current = state_dir.join("audit.jsonl");
    let mut rotated: Vec<(u32, PathBuf)> = std::fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let n = path
                .file_name()?
                .to_str()?
                .strip_prefix("audit.jsonl.")?
                .parse()
                .ok()?;
            Some((n, path))
        })
        .collect();
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut out: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    if current.exists() {
        out.push(current);
    }
    out
}

/// The longest record `gpuwatch audit` reads; a longer line is reported and skipped, read in
/// pieces and never held whole.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

pub fn run(config: &Config, filter: &Filter, json: bool) -> ExitCode {
    let dir = &config.actions.state_dir;
    let files = files(dir);
    if files.is_empty() {
        eprintln!("audit: no audit log in {}", dir.display());
        return exit::NOINPUT.into();
    }
    let mut out = std::io::stdout().lock();
    for file in files {
        // Not through a link, and never a FIFO or a device: what is planted in the state
        // directory is reported, not followed or waited on.
        let reader = match crate::files::open_regular(&file, crate::files::Links::Refuse) {
            Ok(f) => std::io::BufReader::new(f),
            Err(e) => {
                eprintln!("audit: {}: {e}", file.display());
                continue;
            }
        };
        if list(reader, &file, filter, json, &mut out).is_err() {
            // A closed pipe (`| head`) ends the listing, quietly.
            return ExitCode::SUCCESS;
        }
    }
    ExitCode::SUCCESS
}

/// Lists one file's records, a line at a time, so that a log of any size is read in little
/// memory; a line that is too long, not UTF-8 or not a JSON record is reported and skipped.
/// `Err` is a failed write to `out`.
fn list(
    mut reader: impl std::io::BufRead,
    file: &Path,
    filter: &Filter,
    json: bool,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let mut n = 0;
    let mut line = Vec::new();
    loop {
        n += 1;
        let whole = match read_line(&mut reader, &mut line, MAX_RECORD_BYTES) {
            Ok(None) => return Ok(()),
            Ok(Some(whole)) => whole,
            Err(_) => {
                eprintln!("audit: {}: cannot read on from line {n}", file.display());
                return Ok(());
            }
        };
        if !whole {
            eprintln!(
                "audit: {}:{n}: longer than {} KiB, skipped",
                file.display(),
                MAX_RECORD_BYTES >> 10
            );
            continue;
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            eprintln!("audit: {}:{n}: not UTF-8, skipped", file.display());
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        let record: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                eprintln!("audit: {}:{n}: not a JSON record, skipped", file.display());
                continue;
            }
        };
        if !keep(&record, filter) {
            continue;
        }
        // In valid JSON a raw control character can only be whitespace between tokens (inside
        // strings they are escaped): `--json` prints the record with those made spaces. A
        // sentence quotes values from the file, and a terminal must not run what they hold.
        if json {
            let line: String = text
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{}", crate::status::text::plain(&sentence(&record)))?;
        }
    }
}

/// Reads the next line (without its `\n`) into `line`, keeping at most `max` bytes:
/// `Some(true)` for a whole line, `Some(false)` for one that was longer (the rest of it is read
/// and dropped), `None` at the end of the input.
fn read_line(
    reader: &mut impl std::io::BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut whole = true;
    let mut any = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
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

fn str_of<'a>(r: &'a Value, key: &str) -> &'a str {
    r.get(key).and_then(Value::as_str).unwrap_or("")
}

pub fn time_of(r: &Value) -> Option<f64> {
    crate::time::parse_rfc3339(str_of(r, "time"))
}

fn keep(r: &Value, f: &Filter) -> bool {
    if let Some(since) = f.since {
        if time_of(r).is_none_or(|t| t < since) {
            return false;
        }
    }
    if let Some(rule) = &f.rule {
        if str_of(r, "rule") != rule {
            return false;
        }
    }
    if let Some(kind) = f.kind {
        if !kind.matches(str_of(r, "event")) {
            return false;
        }
    }
    true
}

/// Unix seconds as local time, `YYYY-MM-DD HH:MM`.
fn local(t: f64) -> String {
    let secs = t as libc::time_t;
    // SAFETY: localtime_r writes the struct we pass; it reads the time zone (TZ, or
    // /etc/localtime) and nothing of ours.
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

/// One record, in words.
pub fn sentence(r: &Value) -> String {
    let when = time_of(r).map_or_else(|| "?".to_string(), local);
    let rule = str_of(r, "rule");
    let action = str_of(r, "action");
    let what = match str_of(r, "event") {
        "breach" => {
            let e = &r["evidence"];
            let periods = e["periods"].as_array().map_or(0, Vec::len);
            format!(
                "rule {rule} breached ({} of {periods} periods past the threshold {})",
                e["breaching_periods"], e["threshold"]
            )
        }
        "recovered" => format!("rule {rule} no longer breaches"),
        "warning" => format!(
            "rule {rule} warns: {action} at {} unless the GPUs are used again",
            local_clock(str_of(r, "due_at"))
        ),
        "cancelled" => format!("rule {rule}: {action} cancelled, {}", str_of(r, "reason")),
        "postponed" => format!("rule {rule}: {action} postponed, {}", str_of(r, "reason")),
        "action_attempt" => format!("rule {rule}: {action} begins ({} mode)", str_of(r, "mode")),
        "action_result" => {
            let detail = str_of(r, "detail");
            let result = str_of(r, "result");
            if detail.is_empty() {
                format!("rule {rule}: {action} {result}")
            } else {
                format!("rule {rule}: {action} {result}: {detail}")
            }
        }
        "api_call" => format!(
            "rule {rule}: {} (request {})",
            str_of(r, "operation"),
            str_of(r, "request_id")
        ),
        "api_error" => format!(
            "rule {rule}: {} failed: {}",
            str_of(r, "operation"),
            str_of(r, "error")
        ),
        "budget_alert" => format!(
            "budget {} {} spend at {:.0}% of ${} (threshold {:.0}%)",
            str_of(r, "budget"),
            str_of(r, "basis"),
            r["ratio"].as_f64().unwrap_or(0.0) * 100.0,
            r["limit"],
            r["threshold"].as_f64().unwrap_or(0.0) * 100.0
        ),
        "period_closed" => format!("budget period closed: ${} spent", r["spent_usd"]),
        "started" => format!(
            "gpuwatch started ({} mode, boot grace until {})",
            str_of(r, "mode"),
            local_clock(str_of(r, "grace_until"))
        ),
        "stopped" => "gpuwatch stopped".to_string(),
        "in_flight_at_restart" => format!(
            "rule {rule}: the {action} sent before a restart is not repeated (instance {})",
            r["instance_state"]
        ),
        "spot_interruption" => "spot interruption notice".to_string(),
        "spot_rebalance" => "spot rebalance recommendation".to_string(),
        "interruption_hook" => format!("interruption hook: {}", str_of(r, "result")),
        "sns_publish" => format!("budget {} alert published to SNS", str_of(r, "budget")),
        "state_reset" => format!("state reset: {}", str_of(r, "reason")),
        other => format!("{other}: {r}"),
    };
    format!("{when}  {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_skipped_and_control_characters_are_replaced() {
        let long = format!("{{\"event\":\"x\",\"pad\":\"{}\"}}", "a".repeat(100_000));
        let evil =
            r#"{"event":"cancelled","rule":"r","action":"stop","reason":"\u001b]2;owned\u0007"}"#;
        let input = format!("{long}\n{evil}\nnot json\n{{\"event\":\"stopped\"}}");
        let mut out = Vec::new();
        list(
            std::io::BufReader::with_capacity(1024, input.as_bytes()),
            Path::new("audit.jsonl"),
            &Filter::default(),
            false,
            &mut out,
        )
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].ends_with("rule r: stop cancelled, \u{fffd}]2;owned\u{fffd}"));
        assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'));
        assert!(lines[1].ends_with("gpuwatch stopped"), "{out}");
    }

    #[test]
    fn lines_are_read_whole_up_to_the_limit() {
        let mut r = std::io::BufReader::with_capacity(4, &b"abcdef\nxy\n\nlast"[..]);
        let mut line = Vec::new();
        assert_eq!(read_line(&mut r, &mut line, 6).unwrap(), Some(true));
        assert_eq!(line, b"abcdef");
        assert_eq!(read_line(&mut r, &mut line, 1).unwrap(), Some(false));
        assert!(line.is_empty());
        assert_eq!(read_line(&mut r, &mut line, 6).unwrap(), Some(true));
        assert!(line.is_empty());
        assert_eq!(read_line(&mut r, &mut line, 6).unwrap(), Some(true));
        assert_eq!(line, b"last");
        assert_eq!(read_line(&mut r, &mut line, 6).unwrap(), None);
    }
}
