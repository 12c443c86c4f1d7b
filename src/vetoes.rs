//! Activity vetoes: an open SSH session or a named process keeps the node busy.
//!
//! A process's name (`comm`, `argv[0]`) is chosen by whoever starts it, so any local user could
//! hold the node with a process named `sshd: x@pts/9`. What they cannot choose is the
//! executable a process runs (`/proc/PID/exe`) or the user it runs as. So:
//! - an SSH session is a process running the real sshd (an executable named `sshd` or
//!   `sshd-session`, owned by root and writable by nobody else) whose title names a user
//!   session (`sshd: USER@pts/N` or `USER@notty`), or a remote login recorded in utmp
//!   (written only by root's login services) whose process is alive;
//! - a process veto that is an absolute path matches the executable; a bare name matches
//!   `comm` as before, which is spoofable, and is said so at start. `process_uid` restricts
//!   process vetoes to one user.
//!
//! Another user's executable can be read only with ptrace rights, which the systemd unit's
//! sandbox does not grant. Such a process is judged by its name instead (`comm`, and the
//! title for sshd), and that is logged once: an imitated veto costs money, a missed one a
//! user's work.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::VetoesConfig;

/// Why the node counts as busy regardless of its GPUs, if it does.
pub fn check(cfg: &VetoesConfig) -> Option<String> {
    check_in(cfg, Path::new("/proc"))
}

/// `check` over the process list at `proc`. A list that cannot be read vetoes: the processes
/// and sessions it would show are unknown, and unknown is busy.
fn check_in(cfg: &VetoesConfig, proc: &Path) -> Option<String> {
    if !cfg.ssh_sessions && cfg.processes.is_empty() {
        return None;
    }
    if cfg.ssh_sessions {
        if let Some(user) = utmp_remote_login(Path::new("/var/run/utmp")) {
            return Some(format!("an SSH session of \"{user}\" is open"));
        }
    }
    let entries = match std::fs::read_dir(proc) {
        Ok(e) => e,
        Err(e) => {
            return Some(format!(
                "the process list ({}) cannot be read: {e}",
                proc.display()
            ))
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        if !cfg.processes.is_empty() {
            if let Some(why) = process_veto(cfg, &dir) {
                return Some(why);
            }
        }
        if cfg.ssh_sessions {
            if let Some(user) = sshd_session(&dir) {
                return Some(format!("an SSH session of \"{user}\" is open"));
            }
        }
    }
    None
}

/// A process name is at most 16 bytes (`TASK_COMM_LEN`); a little more is read.
const MAX_COMM_BYTES: u64 = 64;
/// sshd's session title (`sshd: user@pts/0`) is all of its command line that is read.
const MAX_CMDLINE_BYTES: u64 = 4096;

fn process_veto(cfg: &VetoesConfig, dir: &Path) -> Option<String> {
    if let Some(uid) = cfg.process_uid {
        if std::fs::metadata(dir).ok()?.uid() != uid {
            return None;
        }
    }
    let exe = executable(dir);
    let comm = crate::files::read_proc_text(&dir.join("comm"), MAX_COMM_BYTES);
    matching(&cfg.processes, &exe, comm.as_deref().map(str::trim))
}

/// The first of `processes` that a process running `exe`, named `comm`, matches.
fn matching(processes: &[String], exe: &Exe, comm: Option<&str>) -> Option<String> {
    processes.iter().find_map(|p| {
        if !p.starts_with('/') {
            return (comm == Some(p.as_str())).then(|| format!("process \"{p}\" is running"));
        }
        match exe {
            Exe::Path(exe) => (exe == Path::new(p)).then(|| format!("{p} is running")),
            Exe::Hidden => {
                // The kernel keeps 15 bytes of the executable's name.
                let name = Path::new(p).file_name()?.to_string_lossy();
                let name: String = name
                    .chars()
                    .scan(0, |n, c| {
                        *n += c.len_utf8();
                        (*n <= 15).then_some(c)
                    })
                    .collect();
                (comm == Some(name.as_str())).then(|| {
                    format!("{p} is running (known by its name: its executable cannot be read)")
                })
            }
            Exe::None => None,
        }
    })
}

/// What a process's executable is, as far as this process may know.
#[derive(Debug, PartialEq)]
enum Exe {
    Path(PathBuf),
    /// Another user's process, without ptrace rights to read its executable.
    Hidden,
    /// A kernel thread, a zombie, or a process gone.
    None,
}

fn executable(dir: &Path) -> Exe {
    match std::fs::read_link(dir.join("exe")) {
        Ok(p) => Exe::Path(p),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "other users' executables cannot be read here (that needs ptrace rights): \
                     SSH and process vetoes know their processes by name, which any user can imitate"
                );
            }
            Exe::Hidden
        }
        Err(_) => Exe::None,
    }
}

/// The user of an sshd session process, if `dir` is one running the real sshd.
///
/// The executable is checked first: only then is the command line read. Reading another
/// process's command line reads its memory, which a local user could make block (an argument
/// area backed by a file on a FUSE mount): the real sshd's is its own. Where the executable is
/// hidden, a process named `sshd` is read; since Linux 4.18 that read never faults in a
/// file-backed page.
fn sshd_session(dir: &Path) -> Option<String> {
    session_of(dir, executable(dir))
}

fn session_of(dir: &Path, exe: Exe) -> Option<String> {
    let sshd = match exe {
        Exe::Path(exe) => is_real_sshd(&exe),
        // Without ptrace rights, its name must do (a session process runs as its user).
        Exe::Hidden => crate::files::read_proc_text(&dir.join("comm"), MAX_COMM_BYTES)
            .is_some_and(|c| matches!(c.trim(), "sshd" | "sshd-session")),
        Exe::None => false,
    };
    if !sshd {
        return None;
    }
    let cmdline = crate::files::read_proc(&dir.join("cmdline"), MAX_CMDLINE_BYTES)?;
    let cmd = String::from_utf8_lossy(&cmdline);
    let rest = cmd.strip_prefix("sshd: ")?;
    let (user, _) = rest.split_once('@')?;
    Some(user.trim().to_string())
}

fn is_real_sshd(exe: &Path) -> bool {
    let named = exe
        .file_name()
        .is_some_and(|n| n == "sshd" || n == "sshd-session");
    // The name first: most processes are not sshd, and need no stat.
    named && std::fs::metadata(exe).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0)
}

/// The user of a live remote login in utmp, if there is one. glibc's x86-64 and aarch64
/// record: 384 bytes; type at 0 (7 is a user process), pid at 4, line at 8 (32 bytes), user at
/// 44 (32), host at 76 (256).
fn utmp_remote_login(path: &Path) -> Option<String> {
    const RECORD: usize = 384;
    const USER_PROCESS: i16 = 7;
    let meta = std::fs::metadata(path).ok()?;
    // Only root's login services may write it.
    if meta.uid() != 0 || meta.mode() & 0o002 != 0 || meta.len() > 4 << 20 {
        return None;
    }
    let bytes = crate::files::read_capped(path, 4 << 20, crate::files::Links::Follow).ok()?;
    let text = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    bytes.chunks_exact(RECORD).find_map(|r| {
        let kind = i16::from_ne_bytes([r[0], r[1]]);
        let pid = i32::from_ne_bytes([r[4], r[5], r[6], r[7]]);
        let user = text(&r[44..76]);
        let host = text(&r[76..332]);
        let alive = pid > 0 && Path::new(&format!("/proc/{pid}")).exists();
        (kind == USER_PROCESS && alive && !host.is_empty() && !user.is_empty()).then_some(user)
    })
}

/// Process vetoes named by `comm` only, which any user can imitate; logged once at start.
pub fn spoofable(cfg: &VetoesConfig) -> Vec<&str> {
    cfg.processes
        .iter()
        .filter(|p| !p.starts_with('/'))
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_vetoes_by_name_or_executable() {
        // This test binary's own name and executable are in /proc.
        let me = std::fs::read_to_string("/proc/self/comm")
            .unwrap()
            .trim()
            .to_string();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let by_name = VetoesConfig {
            processes: vec![me.clone()],
            ..VetoesConfig::default()
        };
        assert_eq!(
            check(&by_name),
            Some(format!("process \"{me}\" is running"))
        );
        let by_exe = VetoesConfig {
            processes: vec![exe.display().to_string()],
            ..VetoesConfig::default()
        };
        assert_eq!(
            check(&by_exe),
            Some(format!("{} is running", exe.display()))
        );
        // Restricted to another user, it is not this process.
        let other_uid = VetoesConfig {
            processes: vec![exe.display().to_string()],
            process_uid: Some(crate::files::effective_uid() + 4242),
            ..VetoesConfig::default()
        };
        assert_eq!(check(&other_uid), None);
        let none = VetoesConfig {
            processes: vec!["no-such-process-xyz".into(), "/no/such/exe".into()],
            ..VetoesConfig::default()
        };
        assert_eq!(check(&none), None);
        assert_eq!(check(&VetoesConfig::default()), None);
        // A process list that cannot be read is unknown, and unknown is busy.
        let why = check_in(&by_name, Path::new("/nonexistent/proc")).unwrap();
        assert!(why.contains("cannot be read"), "{why}");
        assert_eq!(spoofable(&by_name), vec![me.as_str()]);
        assert!(spoofable(&by_exe).is_empty());
    }

    #[test]
    fn a_process_whose_executable_is_hidden_is_known_by_its_name() {
        let vetoes = [
            "/usr/bin/jupyter-lab".to_string(),
            "/opt/a/very-long-trainer-name".into(),
        ];
        let hidden = |comm| matching(&vetoes, &Exe::Hidden, Some(comm));
        assert_eq!(
            hidden("jupyter-lab").as_deref(),
            Some("/usr/bin/jupyter-lab is running (known by its name: its executable cannot be read)")
        );
        // The kernel's 15 bytes of a long name.
        assert!(hidden("very-long-train").is_some());
        assert_eq!(hidden("python3"), None);
        // A readable executable is matched on its path alone; a kernel thread never matches.
        let shown = Exe::Path("/usr/bin/python3".into());
        assert_eq!(matching(&vetoes, &shown, Some("jupyter-lab")), None);
        assert_eq!(matching(&vetoes, &Exe::None, Some("jupyter-lab")), None);
    }

    /// Starts `program` sleeping, with the title (`argv[0]`) `title`, and waits until its
    /// command line shows it (it can read empty for a moment while the exec completes).
    fn titled(program: &Path, title: &str) -> (std::process::Child, PathBuf) {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new(program)
            .arg0(title)
            .arg("30")
            .spawn()
            .unwrap();
        let dir = PathBuf::from(format!("/proc/{}", child.id()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read(dir.join("cmdline")).is_ok_and(|t| t.starts_with(title.as_bytes())) {
            assert!(
                std::time::Instant::now() < deadline,
                "the title never appeared"
            );
            std::thread::yield_now();
        }
        (child, dir)
    }

    #[test]
    fn a_process_named_like_an_ssh_session_is_not_one() {
        // Any user can do this; it once held the node busy.
        let (mut child, dir) = titled(&which("sleep"), "sshd: mallory@pts/9");
        assert_eq!(sshd_session(&dir), None);
        // Nor when its executable is hidden: its name is still `sleep`.
        assert_eq!(session_of(&dir, Exe::Hidden), None);
        let cfg = VetoesConfig {
            ssh_sessions: true,
            ..VetoesConfig::default()
        };
        assert!(!check(&cfg).is_some_and(|why| why.contains("mallory")));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_session_process_whose_executable_is_hidden_is_known_by_its_name() {
        // sshd's session process, as a sandboxed daemon sees another user's: named `sshd`,
        // titled with its user, its executable unreadable.
        let bin = tempfile::tempdir().unwrap();
        let sshd = bin.path().join("sshd");
        std::os::unix::fs::symlink(which("sleep"), &sshd).unwrap();
        let (mut child, dir) = titled(&sshd, "sshd: alice@notty");
        assert_eq!(session_of(&dir, Exe::Hidden).as_deref(), Some("alice"));
        // Its executable readable, it is not the real sshd.
        assert_eq!(sshd_session(&dir), None);
        let _ = child.kill();
        let _ = child.wait();
    }

    fn which(name: &str) -> PathBuf {
        ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
            .unwrap()
    }

    #[test]
    fn utmp_records_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("utmp");
        let mut record = vec![0u8; 384];
        record[0..2].copy_from_slice(&7i16.to_ne_bytes());
        let me = std::process::id() as i32;
        record[4..8].copy_from_slice(&me.to_ne_bytes());
        record[8..13].copy_from_slice(b"pts/3");
        record[44..49].copy_from_slice(b"alice");
        record[76..85].copy_from_slice(b"10.0.0.99");
        std::fs::write(&path, &record).unwrap();
        let owned_by_root = crate::files::effective_uid() == 0;
        assert_eq!(
            utmp_remote_login(&path),
            owned_by_root.then(|| "alice".to_string())
        );
        // A local login (no host) is not a remote session; nor is one whose process is gone.
        record[76..85].copy_from_slice(&[0; 9]);
        std::fs::write(&path, &record).unwrap();
        assert_eq!(utmp_remote_login(&path), None);
    }
}
