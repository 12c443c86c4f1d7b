//! The Prometheus exposition.
//!
//! Device metrics are built at scrape time from the latest snapshot by `SnapshotCollector`, so a
//! GPU that disappears also disappears from the output. The daemon's own counters live in
//! `SelfMetrics`. Nothing here calls NVML or waits on the sampler.

mod collector;
mod daemon;
mod encode;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use prometheus_client::registry::Registry;

pub use collector::{BuildInfo, SnapshotCollector};
pub use daemon::{CloudWatchCollector, HttpCollector, StateCollector, WatchCollector};

/// The content type of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why a sample, or part of one, is missing.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
#[repr(usize)]
pub enum ErrorKind {
    /// The NVML library failed to load or initialise.
    NvmlInit,
    /// A GPU answered `GPU_IS_LOST`.
    GpuLost,
    /// An NVML call failed with something other than "not supported".
    ReadFailed,
    /// NVML answered a value outside its valid range.
    OutOfRange,
    /// A sampling cycle overran its timeout and was abandoned.
    Timeout,
    /// Watching XID events failed.
    Xid,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::NvmlInit,
        ErrorKind::GpuLost,
        ErrorKind::ReadFailed,
        ErrorKind::OutOfRange,
        ErrorKind::Timeout,
        ErrorKind::Xid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NvmlInit => "nvml_init",
            ErrorKind::GpuLost => "gpu_lost",
            ErrorKind::ReadFailed => "read_failed",
            ErrorKind::OutOfRange => "out_of_range",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Xid => "xid",
        }
    }
}

impl EncodeLabelValue for ErrorKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// The daemon's own counters. Lock-free; cheap to update from any thread.
#[derive(Debug, Default)]
pub struct SelfMetrics {
    errors: [AtomicU64; ErrorKind::ALL.len()],
}

impl SelfMetrics {
    /// Registers the counters; every kind is present from the start, at 0, in a fixed order.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(Arc::clone(self)));
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn error_count(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }
}

/// A label value that is not a constant of gpuwatch's own: a GPU or process name, a UUID, a rule
/// or budget name, a tag. The encoder writes label values as they are, so this escapes them per
/// the exposition format (backslash, double quote and newline), and replaces other control
/// characters, so that no value can end a label, a line or the whole scrape early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text<'a>(pub &'a str);

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
