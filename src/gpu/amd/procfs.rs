//! Whether a process list shows every process of the node. A scan that cannot see a process
//! would count it as none, which is the one answer it must never give wrongly: so where the
//! list is the kernel's procfs, it is believed only when gpuwatch is in the initial PID
//! namespace (a container without the host's PIDs lists its own processes alone) and the mount
//! does not hide other users' processes (`hidepid=invisible`, `subset=pid`). A tree on disk
//! (the tests') is what it is.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The initial PID namespace's inode number (`PROC_PID_INIT_INO`), fixed by the kernel.
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";
/// The most bytes of the mount table read.
const MAX_MOUNTINFO: u64 = 4 << 20;

/// `Err` with why the processes under `proc` may not be all of the node's.
pub(super) fn complete(proc: &Path) -> Result<(), String> {
    let Some(options) = procfs_options(proc)? else {
        return Ok(());
    };
    if let Some(o) = options
        .split(',')
        .find(|o| matches!(*o, "hidepid=2" | "hidepid=invisible") || o.starts_with("subset="))
    {
        return Err(format!(
            "{} is mounted with {o}, which hides processes",
            proc.display()
        ));
    }
    let ns = std::fs::read_link(proc.join("self/ns/pid"))
        .map_err(|e| format!("{}: {e}", proc.join("self/ns/pid").display()))?;
    if ns.as_os_str() != INITIAL_PID_NAMESPACE {
        return Err(format!(
            "gpuwatch runs in a PID namespace of its own ({}), where the node's other processes are not listed (on Kubernetes, give the pod hostPID: true)",
            ns.display()
        ));
    }
    Ok(())
}

/// The superblock options of the procfs mounted at `proc` (or above it), or `None` where it is
/// no procfs.
fn procfs_options(proc: &Path) -> Result<Option<String>, String> {
    let at = std::fs::canonicalize(proc).map_err(|e| format!("{}: {e}", proc.display()))?;
    let mut text = String::new();
    std::fs::File::open("/proc/self/mountinfo")
        .and_then(|f| f.take(MAX_MOUNTINFO).read_to_string(&mut text))
        .map_err(|e| format!("the mount table (/proc/self/mountinfo) cannot be read: {e}"))?;
    Ok(mount_of(&text, &at).and_then(|(fstype, options)| (fstype == "proc").then_some(options)))
}

/// The file system type and superblock options of the last mount in a mount table
/// (`proc_pid_mountinfo(5)`: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS...] - TYPE SOURCE
/// SUPEROPTIONS`) whose mount point holds `at`: the mount `at` is on.
pub(super) fn mount_of(mountinfo: &str, at: &Path) -> Option<(String, String)> {
    let mut found: Option<(usize, String, String)> = None;
    for line in mountinfo.lines() {
        let (fields, after) = line.split_once(" - ")?;
        let point = unescape(fields.split(' ').nth(4)?);
        let mut after = after.split(' ');
        let (fstype, _, options) = (after.next()?, after.next()?, after.next().unwrap_or(""));
        if at.starts_with(&point) {
            let depth = point.components().count();
            // A later mount on the same point, or one deeper, is the one `at` is on.
            if found.as_ref().is_none_or(|(d, _, _)| depth >= *d) {
                found = Some((depth, fstype.to_string(), options.to_string()));
            }
        }
    }
    found.map(|(_, t, o)| (t, o))
}

/// A mount point as the table escapes it (space, tab, newline, backslash as `\ooo`).
fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw,hidepid=invisible\n\
        24 22 0:22 / /host\\040proc rw,relatime - proc proc rw\n\
        25 22 0:30 / /tmp rw - tmpfs tmpfs rw,size=100k\n";

    #[test]
    fn the_mount_a_path_is_on_and_its_options() {
        let m = |p: &str| mount_of(TABLE, Path::new(p));
        assert_eq!(
            m("/proc"),
            Some(("proc".into(), "rw,hidepid=invisible".into()))
        );
        assert_eq!(m("/host proc"), Some(("proc".into(), "rw".into())));
        assert_eq!(m("/tmp/x/proc").map(|x| x.0), Some("tmpfs".into()));
        assert_eq!(m("/procfs").map(|x| x.0), Some("ext4".into()));
        assert_eq!(mount_of("garbage", Path::new("/")), None);
    }

    #[test]
    fn a_tree_on_disk_is_believed() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(complete(tmp.path()), Ok(()));
        assert!(complete(&tmp.path().join("missing")).is_err());
    }
}
