//! Bounds and checks shared by every section: bounded durations, names, capped file reads.

use super::*;

/// Bounds that keep every duration sane: no config value may make a timer overflow or a loop
/// wait for centuries.
pub(super) const DAY: Duration = Duration::from_secs(86_400);
pub(super) const WEEK: Duration = Duration::from_secs(7 * 86_400);

pub(super) fn duration(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    text: &str,
    range: std::ops::RangeInclusive<Duration>,
) -> Option<Duration> {
    let show = |d: &Duration| humantime::format_duration(*d).to_string();
    match humantime::parse_duration(text) {
        Ok(d) if range.contains(&d) => Some(d),
        Ok(d) if d < *range.start() => {
            invalid(
                key,
                format!(
                    "\"{text}\" is too short; the least is \"{}\"",
                    show(range.start())
                ),
            );
            None
        }
        Ok(_) => {
            invalid(
                key,
                format!(
                    "\"{text}\" is too long; the most is \"{}\"",
                    show(range.end())
                ),
            );
            None
        }
        Err(_) => {
            invalid(
                key,
                format!("\"{text}\" is not a duration, such as \"1s\" or \"500ms\""),
            );
            None
        }
    }
}

/// The longest rule or budget name: names are label values and log fields.
pub(super) const MAX_NAME: usize = 128;

/// Checks a rule or budget name: not empty, not too long, no control characters.
pub(super) fn check_name(invalid: &mut impl FnMut(&str, String), what: &str, name: &str) {
    if name.trim().is_empty() {
        invalid("name", format!("\"\" is empty; every {what} needs a name"));
    } else if name.chars().count() > MAX_NAME {
        invalid(
            "name",
            format!(
                "\"{}...\" is longer than {MAX_NAME} characters",
                name.chars().take(32).collect::<String>()
            ),
        );
    } else if name.chars().any(char::is_control) {
        invalid(
            "name",
            format!("{name:?} contains a control character (a newline or tab, say)"),
        );
    }
}

/// The largest config or rules file read: enough for thousands of rules, and a bound against
/// `/dev/zero` or a runaway file.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Reads a config or rules file, refusing anything larger than `MAX_FILE_BYTES`.
pub fn read_capped(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let err = |source: std::io::Error| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(err)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(err(std::io::Error::other(format!(
            "larger than {} MiB; is this the right file?",
            MAX_FILE_BYTES >> 20
        ))));
    }
    String::from_utf8(bytes).map_err(|_| err(std::io::Error::other("not UTF-8 text")))
}

/// serde says "unknown field "x", expected one of ..."; config files have keys.
pub(super) fn unknown_key_message(message: &str) -> String {
    match message.strip_prefix("unknown field \"") {
        Some(rest) => {
            let (name, rest) = rest.split_once('"').unwrap_or((rest, ""));
            let expected = rest.trim_start_matches(", ");
            format!("\"{name}\" is not a known key; {expected}")
        }
        None => message.to_string(),
    }
}
