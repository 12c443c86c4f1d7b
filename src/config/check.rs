//! Bounds and checks shared by every section: one of a set of names (`pick`), bounded durations
//! and counts, URLs, names, capped file reads. Each reports through `invalid(key, message)`,
//! naming the key and quoting the value.

use super::*;

/// Bounds that keep every duration sane: no config value may make a timer overflow or a loop
/// wait for centuries.
pub const DAY: Duration = Duration::from_secs(86_400);
pub(super) const WEEK: Duration = Duration::from_secs(7 * 86_400);

pub fn duration(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    text: &str,
    range: std::ops::RangeInclusive<Duration>,
) -> Option<Duration> {
    let show = |d: &Duration| humantime::format_duration(*d).to_string();
    match crate::time::parse_duration(text) {
        Some(d) if range.contains(&d) => Some(d),
        Some(d) if d < *range.start() => {
            invalid(
                key,
                format!(
                    "\"{text}\" is too short; the least is \"{}\"",
                    show(range.start())
                ),
            );
            None
        }
        Some(_) => {
            invalid(
                key,
                format!(
                    "\"{text}\" is too long; the most is \"{}\"",
                    show(range.end())
                ),
            );
            None
        }
        None => {
            invalid(
                key,
                format!("\"{text}\" is not a duration, such as \"1s\" or \"500ms\""),
            );
            None
        }
    }
}

/// The value among `options` that `value` names, or an error listing them.
pub fn pick<T: Copy>(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    value: &str,
    options: &[(&str, T)],
) -> Option<T> {
    let found = options.iter().find(|(n, _)| *n == value).map(|(_, v)| *v);
    if found.is_none() {
        let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        invalid(
            key,
            format!("\"{value}\" is not one of {}", names.join(", ")),
        );
    }
    found
}

/// A count within `range`; `what` says what it must be ("a count between 1 and 100").
pub(super) fn count<T: PartialOrd + std::fmt::Display>(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
    what: &str,
) -> Option<T> {
    if range.contains(&value) {
        Some(value)
    } else {
        invalid(key, format!("\"{value}\" is not {what}"));
        None
    }
}

/// An endpoint URL: `http://` or `https://` and a host. Empty means "not set" (`Some(None)`)
/// unless the key is `required`. Every endpoint in the config goes through this one check.
pub(super) fn url(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    value: &str,
    required: bool,
) -> Option<Option<String>> {
    if value.is_empty() && !required {
        return Some(None);
    }
    let host = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"))
        .unwrap_or("");
    if host.is_empty() || host.starts_with('/') || value.chars().any(char::is_whitespace) {
        invalid(
            key,
            format!("\"{value}\" is not an http:// or https:// URL"),
        );
        return None;
    }
    // What an HTTP client would refuse at the first request (no host, a port over 65535, an
    // unclosed IPv6 bracket) is refused here, with the reason.
    match reqwest::Url::parse(value) {
        Ok(u) if u.host_str().is_some_and(|h| !h.is_empty()) => Some(Some(value.to_string())),
        Ok(_) => {
            invalid(key, format!("\"{value}\" names no host"));
            None
        }
        Err(e) => {
            invalid(key, format!("\"{value}\" is not a URL: {e}"));
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

/// Reads a config or rules file: a regular file (a link to one is fine), of at most
/// `MAX_FILE_BYTES`, as UTF-8.
pub fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    crate::files::read_text(path, MAX_FILE_BYTES, crate::files::Links::Follow).map_err(|source| {
        ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// The path a `*_file` key names. A relative name is beside `base` (the directory of the file
/// that names it); where nothing is there and `GPUWATCH_CONFIG_DIR` is set (the systemd unit
/// sets it to `/etc/gpuwatch`, since it hands the daemon its config as a credential, in a
/// directory of its own), it is looked up there. A leading `${CREDENTIALS_DIRECTORY}/` (or
/// `$CREDENTIALS_DIRECTORY/`) is the directory systemd puts a unit's `LoadCredential=` files
/// in; outside the unit, where that is not set, it is `base`, so that `gpuwatch hold` run by
/// an operator reads the same files from where the credentials come from.
pub fn file_path(base: &Path, value: &str) -> std::path::PathBuf {
    let credential = ["${CREDENTIALS_DIRECTORY}/", "$CREDENTIALS_DIRECTORY/"]
        .iter()
        .find_map(|prefix| value.strip_prefix(prefix));
    if let Some(rest) = credential {
        return match std::env::var_os("CREDENTIALS_DIRECTORY").filter(|d| !d.is_empty()) {
            Some(dir) => Path::new(&dir).join(rest),
            None => base.join(rest),
        };
    }
    let beside = base.join(value);
    if Path::new(value).is_absolute() || beside.exists() {
        return beside;
    }
    match std::env::var_os("GPUWATCH_CONFIG_DIR").filter(|d| !d.is_empty()) {
        Some(dir) if Path::new(&dir).join(value).exists() => Path::new(&dir).join(value),
        _ => beside,
    }
}

/// The largest secret read from a file (a webhook URL, say).
pub const MAX_SECRET_BYTES: u64 = 64 << 10;

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
