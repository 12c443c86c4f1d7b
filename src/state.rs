//! The state directory: rule windows, pending and in-flight actions, and the local hold.
//!
//! Writes are atomic (temporary file, fsync, rename). A missing or corrupt state file is logged
//! and replaced by a fresh state, which starts with boot grace again; it never stops the daemon.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::rules::engine;

const STATE_FILE: &str = "state.json";
const HOLD_FILE: &str = "hold.json";
const AUDIT_FILE: &str = "audit.jsonl";

/// Everything that must survive a restart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub engine: engine::State,
    #[serde(default)]
    pub ledger: crate::cost::ledger::Ledger,
    #[serde(default)]
    pub alerted: crate::cost::budget::Alerted,
    /// The last known spot price, kept across restarts.
    #[serde(default)]
    pub spot_price: Option<f64>,
}

/// A hold written by `gpuwatch hold`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hold {
    /// RFC 3339.
    pub until: String,
    #[serde(default)]
    pub reason: String,
}

/// What the state directory (or an instance tag) says about holds right now.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum HoldStatus {
    #[default]
    None,
    Until(f64, String),
    /// A hold whose expiry cannot be read is a hold, without end.
    Unreadable(String),
}

impl HoldStatus {
    /// The Unix time the hold lasts until; unreadable holds last forever.
    pub fn until(&self) -> Option<f64> {
        match self {
            HoldStatus::None => None,
            HoldStatus::Until(t, _) => Some(*t),
            HoldStatus::Unreadable(_) => Some(f64::INFINITY),
        }
    }
}

/// Why no state was loaded; the text is the log line.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    /// A first start.
    Missing(String),
    /// Unreadable or corrupt: worth a warning.
    Corrupt(String),
}

#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: impl Into<PathBuf>) -> StateDir {
        StateDir { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn audit_path(&self) -> PathBuf {
        self.dir.join(AUDIT_FILE)
    }

    pub fn create(&self) -> io::Result<()> {
        fs::create_dir_all(&self.dir)
    }

    /// Loads the persisted state. `Err` carries the log line for a missing or corrupt file; the
    /// caller starts fresh. A corrupt file is kept beside as `state.json.corrupt`.
    pub fn load(&self) -> Result<Persisted, LoadError> {
        let path = self.dir.join(STATE_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(LoadError::Missing(format!(
                    "no state at {}; starting fresh",
                    path.display()
                )))
            }
            Err(e) => {
                return Err(LoadError::Corrupt(format!(
                    "cannot read {}: {e}; starting fresh with boot grace",
                    path.display()
                )))
            }
        };
        serde_json::from_str(&text).map_err(|e| {
            let aside = self.dir.join("state.json.corrupt");
            let _ = fs::rename(&path, &aside);
            LoadError::Corrupt(format!(
                "{} is corrupt ({e}); kept as {}, starting fresh with boot grace",
                path.display(),
                aside.display()
            ))
        })
    }

    /// Saves the state atomically; `durable` adds the fsyncs that survive a power cut.
    pub fn save(&self, state: &Persisted, durable: bool) -> io::Result<()> {
        let body = serde_json::to_vec(state).map_err(io::Error::other)?;
        write_atomic(&self.dir.join(STATE_FILE), &body, durable)
    }

    pub fn hold(&self) -> HoldStatus {
        let path = self.dir.join(HOLD_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return HoldStatus::None,
            Err(e) => {
                return HoldStatus::Unreadable(format!("cannot read {}: {e}", path.display()))
            }
        };
        match serde_json::from_str::<Hold>(&text) {
            Ok(h) => match crate::time::parse_rfc3339(&h.until) {
                Some(t) => HoldStatus::Until(t, h.reason),
                None => HoldStatus::Unreadable(format!(
                    "{}: until \"{}\" is not RFC 3339",
                    path.display(),
                    h.until
                )),
            },
            Err(e) => HoldStatus::Unreadable(format!("{}: {e}", path.display())),
        }
    }

    pub fn set_hold(&self, hold: &Hold) -> io::Result<()> {
        self.create()?;
        let body = serde_json::to_vec_pretty(hold).map_err(io::Error::other)?;
        write_atomic(&self.dir.join(HOLD_FILE), &body, true)
    }

    /// Removes the local hold; `Ok(false)` when there was none.
    pub fn release(&self) -> io::Result<bool> {
        match fs::remove_file(self.dir.join(HOLD_FILE)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Runs blocking file I/O (fsyncs, /proc scans) so that it does not stall an async worker: on a
/// multi-threaded runtime the worker hands its other tasks off first. Elsewhere it just runs.
pub fn off_async<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Writes `body` to `path` through a temporary file and a rename, so that readers and a crash
/// see either the old file or the new one, never a mix.
pub fn write_atomic(path: &Path, body: &[u8], durable: bool) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(body)?;
        if durable {
            f.sync_all()?;
        }
    }
    fs::rename(&tmp, path)?;
    if durable {
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
    }
    Ok(())
}

/// The append-only audit log: one JSON object per line, fsynced per record.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
}

impl AuditLog {
    pub fn new(path: PathBuf) -> AuditLog {
        AuditLog { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn append(&self, record: &serde_json::Value) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(&line)?;
        f.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_corrupt_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        assert!(matches!(sd.load(), Err(LoadError::Missing(m)) if m.contains("no state")));
        let mut p = Persisted::default();
        p.engine
            .rules
            .insert("r".into(), engine::RuleState::default());
        sd.save(&p, true).unwrap();
        assert_eq!(sd.load().unwrap(), p);
        fs::write(dir.path().join(STATE_FILE), b"{\"engine\": [").unwrap();
        let Err(LoadError::Corrupt(e)) = sd.load() else {
            panic!("not corrupt")
        };
        assert!(
            e.contains("is corrupt") && e.contains("starting fresh"),
            "{e}"
        );
        assert!(dir.path().join("state.json.corrupt").exists());
    }

    #[test]
    fn holds() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        assert_eq!(sd.hold(), HoldStatus::None);
        sd.set_hold(&Hold {
            until: "2026-11-30T00:53:20Z".into(),
            reason: "training".into(),
        })
        .unwrap();
        assert_eq!(
            sd.hold(),
            HoldStatus::Until(1_796_000_000.0, "training".into())
        );
        fs::write(dir.path().join(HOLD_FILE), br#"{"until": "next tuesday"}"#).unwrap();
        assert!(matches!(sd.hold(), HoldStatus::Unreadable(_)));
        assert_eq!(sd.hold().until(), Some(f64::INFINITY));
        assert!(sd.release().unwrap());
        assert!(!sd.release().unwrap());
    }
}
