//! `gpuwatch audit`: the audit log as sentences, rotated files included, oldest first.
//! Malformed lines are reported with their file and line number and skipped, never fatal.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use super::exit;
use crate::config::Config;
use crate::state::audit::{files, read_line, Entry, MAX_RECORD_BYTES};

/// Which records to show.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Records at or after this Unix time.
    pub since: Option<f64>,
    pub rule: Option<String>,
    pub kind: Option<Kind>,
}

/// The kinds `--kind` selects (clap names them: `action`, `warning`, `cancel`, `budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Action,
    Warning,
    Cancel,
    Budget,
}

impl Kind {
    fn matches(self, event: &str) -> bool {
        match self {
            Kind::Action => matches!(
                event,
                "action_attempt" | "action_result" | "api_call" | "api_error"
            ),
            Kind::Warning => event == "warning",
            Kind::Cancel => event == "cancelled",
            Kind::Budget => matches!(
                event,
                "budget_alert" | "period_closed" | "topic_publish" | "sns_publish"
            ),
        }
    }
}

pub fn run(config: &Config, filter: &Filter, json: bool) -> ExitCode {
    let dir = &config.actions.state_dir;
    let files = files(dir);
    if files.is_empty() {
        eprintln!("audit: no audit log in {}", dir.display());
        return exit::NOINPUT.into();
    }
    let mut out = std::io::stdout().lock();
    // A file that cannot be opened is reported, the others still listed, and the exit status
    // says the listing is not whole.
    let mut refused = false;
    for file in files {
        // Not through a link, and never a FIFO or a device: what is planted in the state
        // directory is reported, not followed or waited on.
        let reader = match crate::files::open_regular(&file, crate::files::Links::Refuse) {
            Ok(f) => std::io::BufReader::new(f),
            Err(e) => {
                eprintln!("audit: {}: {e}", file.display());
                refused = true;
                continue;
            }
        };
        if list(reader, &file, filter, json, &mut out).is_err() {
            // A closed pipe (`| head`) ends the listing, quietly.
            return ExitCode::SUCCESS;
        }
    }
    if refused {
        exit::NOINPUT.into()
    } else {
        ExitCode::SUCCESS
    }
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
        let record = match Entry::parse(text) {
            Some(e) => e,
            None => {
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
            writeln!(out, "{}", crate::status::text::plain(&record.sentence()))?;
        }
    }
}

fn keep(e: &Entry, f: &Filter) -> bool {
    if let Some(since) = f.since {
        if e.time().is_none_or(|t| t < since) {
            return false;
        }
    }
    if let Some(rule) = &f.rule {
        if e.rule() != rule {
            return false;
        }
    }
    if let Some(kind) = f.kind {
        if !kind.matches(e.event()) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
        assert!(lines[0].ends_with("rule r: stop cancelled: \u{fffd}]2;owned\u{fffd}"));
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
