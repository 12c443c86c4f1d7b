//! Who a process belongs to: its real uid (from `/proc/PID/status`), and that uid's name from
//! the password database (`getpwuid_r`), cached. A name becomes a label value, so it is bounded
//! and plain; a uid with no such name is its number.

use std::collections::HashMap;
use std::ffi::CStr;

/// The most names cached: beyond any node's users, and a bound on what churn can make
/// gpuwatch hold.
const MAX_CACHED: usize = 4096;
/// The most of `/proc/PID/status` read (it is about 1.5 KiB).
const MAX_STATUS_BYTES: u64 = 16 * 1024;
/// The largest buffer offered to `getpwuid_r` (an entry with a long GECOS field needs more
/// than the first).
const MAX_PASSWD_BUFFER: usize = 1 << 20;

/// User names by uid, looked up once each.
#[derive(Debug, Default)]
pub struct Users {
    names: HashMap<u32, String>,
    /// Uids the database had no plain name for, and when it was asked: asked again after
    /// `RETRY` (a directory service that was down may answer now).
    unnamed: HashMap<u32, std::time::Instant>,
}

const RETRY: std::time::Duration = std::time::Duration::from_secs(60);

impl Users {
    /// The name of `uid`, or the uid as a number where the password database has none (or one
    /// that is not a plain name).
    pub fn name(&mut self, uid: u32) -> String {
        if let Some(n) = self.names.get(&uid) {
            return n.clone();
        }
        if self.unnamed.get(&uid).is_some_and(|t| t.elapsed() < RETRY) {
            return uid.to_string();
        }
        let Some(name) = lookup(uid).filter(|n| crate::metrics::plain_name(n)) else {
            if self.unnamed.len() >= MAX_CACHED {
                self.unnamed.clear();
            }
            self.unnamed.insert(uid, std::time::Instant::now());
            return uid.to_string();
        };
        if self.names.len() >= MAX_CACHED {
            self.names.clear();
        }
        self.names.insert(uid, name.clone());
        name
    }
}

/// The real uid a process runs as (`Uid:` in `/proc/PID/status`); `None` when it has gone.
pub fn uid_of(pid: u32) -> Option<u32> {
    let text = crate::files::read_proc(
        std::path::Path::new(&format!("/proc/{pid}/status")),
        MAX_STATUS_BYTES,
    )?;
    uid_from_status(&String::from_utf8_lossy(&text))
}

/// The real uid in a `/proc/PID/status` text: the first of the four on its `Uid:` line.
pub fn uid_from_status(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The password database's name of `uid`.
fn lookup(uid: u32) -> Option<String> {
    let mut size = 16 * 1024;
    loop {
        let mut buf = vec![0u8; size];
        // SAFETY: `passwd` is plain data that getpwuid_r fills in; `buf` outlives every use of
        // the pointers it sets in `pw`, and its length is passed.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut pw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && size < MAX_PASSWD_BUFFER {
            size *= 4;
            continue;
        }
        if rc != 0 || result.is_null() || pw.pw_name.is_null() {
            return None;
        }
        // SAFETY: on success `pw_name` points at a NUL-terminated string inside `buf`.
        let name = unsafe { CStr::from_ptr(pw.pw_name) };
        return name.to_str().ok().map(str::to_string);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_has_a_name_and_an_unknown_uid_is_its_number() {
        let mut users = Users::default();
        assert_eq!(users.name(0), "root");
        assert_eq!(users.name(4_000_000_123), "4000000123");
        // Cached: the same answer again.
        assert_eq!(users.name(0), "root");
    }

    #[test]
    fn only_plain_names_are_label_values() {
        for ok in ["alice", "a.b-c_d", "alice@corp.example", "HOST$", "u1"] {
            assert!(crate::metrics::plain_name(ok), "{ok}");
        }
        for bad in ["", "$", "a b", "a\"b", "a\nb", "é", "a/b", &"x".repeat(65)] {
            assert!(!crate::metrics::plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_real_uid_is_read_from_the_status_file() {
        let status = "Name:\tpython3\nUid:\t1000\t1001\t1000\t1000\nGid:\t1000\n";
        assert_eq!(uid_from_status(status), Some(1000));
        assert_eq!(uid_from_status("Name:\tx\n"), None);
        assert_eq!(uid_from_status("Uid:\tx\n"), None);
        // SAFETY: getuid has no preconditions and cannot fail; std has no call for it.
        let me = unsafe { libc::getuid() };
        assert_eq!(uid_of(std::process::id()), Some(me));
    }
}
