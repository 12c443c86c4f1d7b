//! Every call into the library, counted by function, for whoever measures how often a client
//! calls NVML: where `GPUWATCH_FAKE_NVML_CALLS` names a file, the counts since `nvmlInit` are
//! written there as `function count` lines, sorted, at most once a second and at
//! `nvmlShutdown` (each write replaces the file whole). Without it, nothing is counted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The environment variable that names the counts' file.
pub const CALLS_ENV: &str = "GPUWATCH_FAKE_NVML_CALLS";

struct Counts {
    by_function: BTreeMap<&'static str, u64>,
    written: Instant,
}

static COUNTS: Mutex<Option<Counts>> = Mutex::new(None);

fn file() -> Option<&'static PathBuf> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| std::env::var_os(CALLS_ENV).map(PathBuf::from))
        .as_ref()
}

/// Counts one call of `function`.
pub fn count(function: &'static str) {
    let Some(file) = file() else {
        return;
    };
    let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let counts = counts.get_or_insert_with(|| Counts {
        by_function: BTreeMap::new(),
        written: Instant::now(),
    });
    *counts.by_function.entry(function).or_default() += 1;
    if counts.written.elapsed() >= Duration::from_secs(1) {
        counts.written = Instant::now();
        write(file, &counts.by_function);
    }
}

/// Writes the counts now (at `nvmlShutdown`).
pub fn flush() {
    let Some(file) = file() else {
        return;
    };
    let counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = counts.as_ref() {
        write(file, &c.by_function);
    }
}

/// The counts as last written to `file`, by function (none where it is not there yet): the
/// reader of what this module writes.
pub fn read(file: &std::path::Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (f, n) = l.split_once(' ')?;
            Some((f.to_string(), n.parse().ok()?))
        })
        .collect()
}

fn write(file: &PathBuf, counts: &BTreeMap<&'static str, u64>) {
    let text: String = counts.iter().map(|(f, n)| format!("{f} {n}\n")).collect();
    let part = file.with_extension("part");
    if std::fs::write(&part, text).is_ok() {
        let _ = std::fs::rename(&part, file);
    }
}
