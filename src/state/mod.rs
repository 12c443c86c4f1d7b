//! The state directory: rule windows, pending and in-flight actions, and the local hold.
//!
//! Writes are atomic: a temporary file with a unique name (created `O_EXCL`, mode 0600), fsync,
//! rename. The directory is 0700 and every file in it 0600, whatever the umask: it holds the
//! instance id, spend and process names, and whoever can write it controls the holds. A missing
//! or corrupt state file is logged and replaced by a fresh state, which starts with boot grace
//! again. A state file that exists but cannot be read (an I/O error) is not replaced: the caller
//! waits until it reads, and takes no action meanwhile.

pub mod audit;
mod holds;
mod io_thread;
pub mod metrics;

pub use audit::{AuditLog, AuditRecord};
pub use holds::{is_job_id, Subject};
pub use io_thread::{drain, off_async, on_io_thread};

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The decision state's file in the state directory.
pub const STATE_FILE: &str = "state.json";
const HOLD_FILE: &str = "hold.json";
/// The interruption notices whose hook has run, so that a restart does not run it again.
const HOOKS_FILE: &str = "hooks.json";
/// The most notices `hooks.json` remembers: the newest.
pub const MAX_HOOKS_KEPT: usize = 16;

/// The largest `state.json` or `hold.json` read: far beyond any real state, and a bound
/// against a file that was replaced by something else.
const MAX_STATE_BYTES: u64 = 64 << 20;
const MAX_HOLD_BYTES: u64 = 64 << 10;

/// Everything that must survive a restart: the decision step's state.
pub type Persisted = gpuwatch_core::step::State;

/// A hold as `gpuwatch hold` writes it to `hold.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldFile {
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
    /// A hold that may be there but has not been read (the instance's tags, before their
    /// first read): unknown holds, without end.
    Unknown(String),
}

impl HoldStatus {
    /// The Unix time the hold lasts until; unreadable holds last forever.
    pub fn until(&self) -> Option<f64> {
        match self {
            HoldStatus::None => None,
            HoldStatus::Until(t, _) => Some(*t),
            HoldStatus::Unreadable(_) | HoldStatus::Unknown(_) => Some(f64::INFINITY),
        }
    }
}

/// A hold in force: where it comes from (`local`, from `gpuwatch hold`, or `tag`, the
/// instance's hold tag), until when, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hold {
    pub source: String,
    /// Unix seconds; `None` when its expiry cannot be read (it then holds without end).
    pub until: Option<f64>,
    pub reason: String,
    /// It may not be there: it was not read yet, and holds as unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
}

/// The holds in force at `now`, from the state directory's hold and the instance tag's: one
/// that has expired is none, and one whose expiry cannot be read holds without end.
pub fn holds_in_force(now: f64, local: &HoldStatus, tag: &HoldStatus) -> Vec<Hold> {
    [("local", local), ("tag", tag)]
        .into_iter()
        .filter_map(|(source, h)| {
            let (until, reason) = match h {
                HoldStatus::None => return None,
                HoldStatus::Until(t, _) if *t <= now => return None,
                HoldStatus::Until(t, reason) => (Some(*t), reason.clone()),
                HoldStatus::Unreadable(why) | HoldStatus::Unknown(why) => (None, why.clone()),
            };
            Some(Hold {
                source: source.to_string(),
                until,
                reason,
                unknown: matches!(h, HoldStatus::Unknown(_)),
            })
        })
        .collect()
}

/// Why no state was loaded; the text is the log line.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    /// A first start.
    Missing(String),
    /// The file is there but does not parse: it is kept aside and a fresh state starts.
    Corrupt(String),
    /// The file is there but cannot be read (an I/O error): it is kept, and nothing may act
    /// until it reads, since it may hold an action in flight.
    Unreadable(String),
}

/// Why the state directory cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} can be written by {who} (mode {mode:o}); whoever can write it controls the holds and the pending actions: make it writable by its owner only (chmod go-w)")]
    Writable {
        path: PathBuf,
        who: &'static str,
        mode: u32,
    },
    #[error("{path} belongs to uid {owner}, not to uid {me} that gpuwatch runs as")]
    Owner { path: PathBuf, owner: u32, me: u32 },
}

#[derive(Debug, Clone)]
pub struct StateDir {
    /// Shared: the decision loop hands a clone to the I/O thread on every sample.
    dir: std::sync::Arc<Path>,
}

impl StateDir {
    pub fn new(dir: impl Into<PathBuf>) -> StateDir {
        StateDir {
            dir: dir.into().into(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn audit_path(&self) -> PathBuf {
        self.dir.join(audit::AUDIT_FILE)
    }

    /// Creates the directory (0700), or checks the one that is there: it must belong to the
    /// user gpuwatch runs as (or root) and be writable by nobody else, and so must `hold.json`.
    /// A directory that others can only read is tightened to 0700.
    pub fn create(&self) -> Result<(), DirError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DirError::Io { path, source }
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io_err(&self.dir))?;
        let meta = fs::metadata(&self.dir).map_err(io_err(&self.dir))?;
        check_private(&self.dir, &meta)?;
        if meta.mode() & 0o077 != 0 {
            fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
                .map_err(io_err(&self.dir))?;
        }
        let hold = self.dir.join(HOLD_FILE);
        match fs::symlink_metadata(&hold) {
            Ok(m) => check_private(&hold, &m)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&hold)(e)),
        }
        Ok(())
    }

    /// Removes temporary `state.json` files that a crash left behind. Only the daemon writes
    /// `state.json`, so at its start none of them is in use.
    pub fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".state.json.") && name.ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// Loads the persisted state. `Err` carries the log line for a missing, corrupt or
    /// unreadable file. A corrupt file is kept beside as `state.json.corrupt`.
    pub fn load(&self) -> Result<Persisted, LoadError> {
        let path = self.dir.join(STATE_FILE);
        let text =
            match crate::files::read_text(&path, MAX_STATE_BYTES, crate::files::Links::Refuse) {
                Ok(t) => t,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(LoadError::Missing(format!(
                        "no state at {}; starting fresh",
                        path.display()
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(self.set_aside(&path, &e.to_string()))
                }
                Err(e) => {
                    return Err(LoadError::Unreadable(format!(
                        "cannot read {}: {e}; no rule acts until it reads",
                        path.display()
                    )))
                }
            };
        serde_json::from_str(&text).map_err(|e| self.set_aside(&path, &e.to_string()))
    }

    /// Reads the state and changes nothing, not even a corrupt file (for `gpuwatch status`).
    pub fn peek(&self) -> Result<Persisted, String> {
        let path = self.dir.join(STATE_FILE);
        let text = crate::files::read_text(&path, MAX_STATE_BYTES, crate::files::Links::Refuse)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{} is corrupt: {e}", path.display()))
    }

    /// Keeps a corrupt state file as `state.json.corrupt`, for a person to look at.
    fn set_aside(&self, path: &Path, why: &str) -> LoadError {
        let aside = self.dir.join("state.json.corrupt");
        let _ = fs::rename(path, &aside);
        LoadError::Corrupt(format!(
            "{} is corrupt ({why}); kept as {}, starting fresh with boot grace",
            path.display(),
            aside.display()
        ))
    }

    /// Saves the state atomically; `durable` adds the fsyncs that survive a power cut.
    pub fn save(&self, state: &Persisted, durable: bool) -> io::Result<()> {
        self.save_encoded(&encode(state)?, durable)
    }

    /// Saves a state already encoded (`encode`), as `save` does.
    pub fn save_encoded(&self, body: &[u8], durable: bool) -> io::Result<()> {
        write_atomic(&self.dir.join(STATE_FILE), body, durable)
    }

    pub fn hold(&self) -> HoldStatus {
        self.hold_at(&self.dir.join(HOLD_FILE))
    }

    /// The keys of the interruption notices whose hook has run (`hooks.json`), oldest first. A
    /// file that is missing or unreadable remembers none: a hook that runs twice does less harm
    /// than one that never runs.
    pub fn hooks_ran(&self) -> Vec<String> {
        let path = self.dir.join(HOOKS_FILE);
        let text = match crate::files::read_text(&path, MAX_HOLD_BYTES, crate::files::Links::Refuse)
        {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read which interruption hooks ran: a notice still in force runs its hook again");
                return Vec::new();
            }
        };
        let mut keys: Vec<String> = serde_json::from_str(&text).unwrap_or_default();
        let excess = keys.len().saturating_sub(MAX_HOOKS_KEPT);
        keys.drain(..excess);
        keys
    }

    /// Remembers `keys` (the newest `MAX_HOOKS_KEPT`) as the notices whose hook has run.
    pub fn set_hooks_ran(&self, keys: &[String]) -> io::Result<()> {
        let newest = &keys[keys.len().saturating_sub(MAX_HOOKS_KEPT)..];
        let body = serde_json::to_vec(newest).map_err(io::Error::other)?;
        write_atomic(&self.dir.join(HOOKS_FILE), &body, true)
    }

    /// The hold a hold file says.
    fn hold_at(&self, path: &Path) -> HoldStatus {
        let path = path.to_path_buf();
        let text = match crate::files::read_text(&path, MAX_HOLD_BYTES, crate::files::Links::Refuse)
        {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return HoldStatus::None,
            Err(e) => {
                return HoldStatus::Unreadable(format!("cannot read {}: {e}", path.display()))
            }
        };
        match serde_json::from_str::<HoldFile>(&text) {
            Ok(h) => match crate::time::parse_rfc3339(&h.until) {
                Some(t) => HoldStatus::Until(t, h.reason),
                None => HoldStatus::Unreadable(format!(
                    "{}: until {:?} is not RFC 3339",
                    path.display(),
                    h.until
                )),
            },
            Err(e) => HoldStatus::Unreadable(format!("{}: {e}", path.display())),
        }
    }

    /// Writes `hold.json`. Root may hold for a daemon that runs as another user (systemd's
    /// `DynamicUser=yes`): the directory is then that user's, and the file is handed to them,
    /// since the daemon reads only a hold file of its own user or root.
    pub fn set_hold(&self, hold: &HoldFile) -> io::Result<()> {
        self.set_hold_at(HOLD_FILE, hold)
    }

    fn set_hold_at(&self, file: &str, hold: &HoldFile) -> io::Result<()> {
        let root = crate::files::effective_uid() == 0;
        let owner = match fs::metadata(&self.dir) {
            Ok(m) if root && m.uid() != 0 => Some(m),
            _ => None,
        };
        match &owner {
            Some(m) => check_private_of(&self.dir, m, m.uid()).map_err(io::Error::other)?,
            None => self.create().map_err(io::Error::other)?,
        }
        let body = serde_json::to_vec_pretty(hold).map_err(io::Error::other)?;
        let owner = owner.map(|m| (m.uid(), m.gid()));
        write_atomic_as(&self.dir.join(file), &body, true, owner)
    }

    /// Removes the local hold; `Ok(false)` when there was none.
    pub fn release(&self) -> io::Result<bool> {
        self.release_at(HOLD_FILE)
    }

    fn release_at(&self, file: &str) -> io::Result<bool> {
        match fs::remove_file(self.dir.join(file)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Refuses a path that another user can write: through its mode, or by owning it.
fn check_private(path: &Path, meta: &fs::Metadata) -> Result<(), DirError> {
    check_private_of(path, meta, crate::files::effective_uid())
}

/// Refuses a path that anyone but `me` (or root) can write.
fn check_private_of(path: &Path, meta: &fs::Metadata, me: u32) -> Result<(), DirError> {
    if meta.uid() != me && meta.uid() != 0 {
        return Err(DirError::Owner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    let who = if mode & 0o002 != 0 {
        "every user"
    } else if mode & 0o020 != 0 {
        "its group"
    } else {
        return Ok(());
    };
    Err(DirError::Writable {
        path: path.to_path_buf(),
        who,
        mode,
    })
}

/// The state as `save` writes it.
pub fn encode(state: &Persisted) -> io::Result<Vec<u8>> {
    serde_json::to_vec(state).map_err(io::Error::other)
}

/// Writes `body` to `path` through a temporary file and a rename, so that readers and a crash
/// see either the old file or the new one, never a mix. The temporary file has a unique name
/// and is created exclusively with mode 0600, so a symlink planted in the directory is never
/// followed, and two writers never share one.
pub fn write_atomic(path: &Path, body: &[u8], durable: bool) -> io::Result<()> {
    write_atomic_as(path, body, durable, None)
}

/// `write_atomic`, with the file given to `owner` (uid, gid) before it takes its name: the
/// name never points at a file of anyone else, and nothing is changed by following a link.
fn write_atomic_as(
    path: &Path,
    body: &[u8],
    durable: bool,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    tmp.write_all(body)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(tmp.as_file(), Some(uid), Some(gid))?;
    }
    if durable {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A write or read of the state directory, for `gpuwatch_state_errors_total{op}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum DiskOp {
    /// `state.json` could not be saved.
    Save,
    /// An audit record could not be written.
    Audit,
    /// `state.json` exists but could not be read.
    Load,
}

impl DiskOp {
    pub const ALL: [DiskOp; 3] = [DiskOp::Save, DiskOp::Audit, DiskOp::Load];

    pub fn as_str(self) -> &'static str {
        match self {
            DiskOp::Save => "save",
            DiskOp::Audit => "audit",
            DiskOp::Load => "load",
        }
    }
}

/// Failed state-directory operations, by kind. Lock-free.
#[derive(Debug, Default)]
pub struct DiskErrors([std::sync::atomic::AtomicU64; DiskOp::ALL.len()]);

impl DiskErrors {
    pub fn count(&self, op: DiskOp) {
        self.0[op as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self, op: DiskOp) -> u64 {
        self.0[op as usize].load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::engine;

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
        sd.set_hold(&HoldFile {
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

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn the_directory_and_its_files_are_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let sd = StateDir::new(&dir);
        sd.create().unwrap();
        assert_eq!(mode(&dir), 0o700);
        sd.save(&Persisted::default(), true).unwrap();
        assert_eq!(mode(&dir.join(STATE_FILE)), 0o600);
        sd.set_hold(&HoldFile {
            until: "2099-01-01T00:00:00Z".into(),
            reason: String::new(),
        })
        .unwrap();
        assert_eq!(mode(&dir.join(HOLD_FILE)), 0o600);
        let audit = AuditLog::new(sd.audit_path());
        audit.append(&serde_json::json!({"event": "x"})).unwrap();
        assert_eq!(mode(&sd.audit_path()), 0o600);
        // No temporary file is left behind.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");

        // A directory others can read (as older versions made it) is tightened.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        sd.create().unwrap();
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn a_directory_or_hold_others_can_write_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let sd = StateDir::new(root.path());
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let e = sd.create().unwrap_err().to_string();
        assert!(e.contains("every user") && e.contains("chmod go-w"), "{e}");
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o770)).unwrap();
        let e = sd.create().unwrap_err().to_string();
        assert!(e.contains("its group"), "{e}");
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(root.path().join(HOLD_FILE), "{}").unwrap();
        fs::set_permissions(
            root.path().join(HOLD_FILE),
            fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        let e = sd.create().unwrap_err().to_string();
        assert!(e.contains("hold.json") && e.contains("every user"), "{e}");
    }

    #[test]
    fn planted_symlinks_are_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let sd = StateDir::new(&dir);
        sd.create().unwrap();
        let victim = root.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        // The old fixed temporary name, and the audit log itself.
        std::os::unix::fs::symlink(&victim, dir.join("state.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(".state.json.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, sd.audit_path()).unwrap();
        sd.save(&Persisted::default(), true).unwrap();
        assert!(AuditLog::new(sd.audit_path())
            .append(&serde_json::json!({"event": "x"}))
            .is_err());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        // A hold that is a symlink is unreadable, and so holds.
        std::os::unix::fs::symlink(&victim, dir.join(HOLD_FILE)).unwrap();
        assert!(matches!(sd.hold(), HoldStatus::Unreadable(_)));
    }

    #[test]
    fn a_state_file_that_cannot_be_read_is_kept_and_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        // An I/O error (here: a directory where the file should be), not a parse error.
        fs::create_dir(dir.path().join(STATE_FILE)).unwrap();
        let Err(LoadError::Unreadable(e)) = sd.load() else {
            panic!("not unreadable")
        };
        assert!(e.contains("no rule acts"), "{e}");
        assert!(dir.path().join(STATE_FILE).is_dir());
        assert!(!dir.path().join("state.json.corrupt").exists());
    }
}
