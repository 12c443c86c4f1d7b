//! What every subsystem's series share: label values from outside (`Text`), GPU label sets
//! and family descriptors (`encode`), the view a subsystem swaps for its collector (`Shared`),
//! and encoding a registry. Each subsystem registers its own series from its own `metrics.rs`
//! (`gpu`, `watch`, `spend`, `cloudwatch`, `state`, `serve`); the wiring in `app.rs` puts them
//! together. Nothing here knows another subsystem.

pub mod encode;

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use prometheus_client::registry::Registry;

/// A view that one subsystem writes and its collector reads at scrape time: swapped whole, so a
/// scrape never sees half an update and never holds the lock while it encodes.
#[derive(Debug, Default)]
pub struct Shared<T>(std::sync::Mutex<Arc<T>>);

impl<T: Clone + Default> Shared<T> {
    pub fn view(&self) -> Arc<T> {
        self.0.lock().map(|v| Arc::clone(&v)).unwrap_or_default()
    }

    pub fn update(&self, f: impl FnOnce(&mut T)) {
        if let Ok(mut v) = self.0.lock() {
            let mut next = (**v).clone();
            f(&mut next);
            *v = Arc::new(next);
        }
    }
}

/// The content type of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A label value that is not a constant of gpuwatch's own: a GPU or process name, a UUID, a rule
/// or budget name, a tag. The encoder writes label values as they are, so this escapes them per
/// the exposition format (backslash, double quote and newline), and replaces other control
/// characters, so that no value can end a label, a line or the whole scrape early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text<'a>(pub &'a str);

/// A name fit to be a label value, a word in a message and part of a file name: 1 to 64 bytes
/// of letters, digits, `.`, `_`, `-`, `@` (directory users) and a final `$` (machine
/// accounts); not `.` or `..`.
pub fn plain_name(name: &str) -> bool {
    let body = name.strip_suffix('$').unwrap_or(name);
    !body.is_empty()
        && name.len() <= 64
        && body != "."
        && body != ".."
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
}

impl EncodeLabelValue for Text<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        write_label_value(encoder, self.0)
    }
}

/// Writes `value` escaped as the inside of a quoted label value.
pub fn write_label_value(out: &mut impl std::fmt::Write, value: &str) -> std::fmt::Result {
    let mut rest = value;
    while let Some(i) = rest.find(|c: char| c == '\\' || c == '"' || (c.is_control() && c != '\t'))
    {
        out.write_str(&rest[..i])?;
        let c = rest[i..].chars().next().unwrap_or_default();
        match c {
            '\\' => out.write_str("\\\\")?,
            '"' => out.write_str("\\\"")?,
            '\n' => out.write_str("\\n")?,
            _ => out.write_char(char::REPLACEMENT_CHARACTER)?,
        }
        rest = &rest[i + c.len_utf8()..];
    }
    out.write_str(rest)
}

/// Encodes a registry as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing to a String cannot fail, and our collectors return no errors of their own.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let cases = [
            ("python3", "python3"),
            ("a\"b", "a\\\"b"),
            ("back\\slash", "back\\\\slash"),
            ("two\nlines", "two\\nlines"),
            (
                "x\"} 0\ngpu_utilization_ratio{gpu=\"0\"",
                "x\\\"} 0\\ngpu_utilization_ratio{gpu=\\\"0\\\"",
            ),
            ("nul\0cr\r", "nul\u{fffd}cr\u{fffd}"),
            ("tab\tok", "tab\tok"),
            ("\u{e9}t\u{e9}", "\u{e9}t\u{e9}"),
        ];
        for (raw, want) in cases {
            let mut out = String::new();
            write_label_value(&mut out, raw).unwrap();
            assert_eq!(out, want, "{raw:?}");
        }
    }
}
