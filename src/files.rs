//! The one way gpuwatch opens a file to read it: without blocking, checked to be a regular file,
//! and size-capped.
//!
//! A FIFO opened for reading blocks until a writer comes, a character device such as
//! `/dev/zero` never ends, and a socket or a directory is no file at all. Any of them, planted
//! where gpuwatch expects its state, config, certificate or trace, must be an error that names
//! the path, never a hang: so every file is opened with `O_NONBLOCK` (which never blocks the open
//! and does nothing to a regular file's reads), `fstat`ed, and refused unless it is a regular
//! file, before a byte is read. Files in the state directory are opened with `O_NOFOLLOW` too
//! (`Links::Refuse`): root reading them must not follow a link planted there.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Whether a symlink at the path itself is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Config, certificates and traces: an admin's link (a Kubernetes ConfigMap's, say) is fine.
    Follow,
    /// The state directory's files: a link there is refused (`ELOOP`).
    Refuse,
}

/// Opens `path` for reading; anything but a regular file is an `InvalidInput` error that says
/// what it is. The error's text does not repeat the path: callers name it.
pub fn open_regular(path: &Path, links: Links) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        // Opening a socket fails with ENXIO: say what it is.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => match std::fs::metadata(path) {
            Ok(m) => return Err(not_regular(m.file_type())),
            Err(_) => return Err(e),
        },
        Err(e) => return Err(e),
    };
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    Err(not_regular(kind))
}

fn not_regular(kind: std::fs::FileType) -> io::Error {
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {what}, not a regular file"),
    )
}

/// Reads a regular file of at most `max` bytes. A larger one is `InvalidData`, refused by its
/// size before it is read when `fstat` already says so.
pub fn read_capped(path: &Path, max: u64, links: Links) -> io::Result<Vec<u8>> {
    let file = open_regular(path, links)?;
    if file.metadata()?.len() > max {
        return Err(too_large(max));
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(max));
    }
    Ok(bytes)
}

/// Reads at most `max` bytes of a kernel file (`/proc`, `/sys`): such files report no size, and
/// are not regular files to `fstat` in every case, so the cap alone bounds the read. `None` when
/// it cannot be opened or read (a process that has gone).
pub fn read_proc(path: &Path, max: u64) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).ok()?;
    let mut out = Vec::new();
    file.take(max).read_to_end(&mut out).ok()?;
    Some(out)
}

/// `read_proc`, as text (bytes that are not UTF-8 replaced).
pub fn read_proc_text(path: &Path, max: u64) -> Option<String> {
    read_proc(path, max).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// `read_capped`, as UTF-8 text (`InvalidData` when it is not).
pub fn read_text(path: &Path, max: u64, links: Links) -> io::Result<String> {
    String::from_utf8(read_capped(path, max, links)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

fn too_large(max: u64) -> io::Error {
    let size = if max >= 1 << 20 && max % (1 << 20) == 0 {
        format!("{} MiB", max >> 20)
    } else if max >= 1 << 10 && max % (1 << 10) == 0 {
        format!("{} KiB", max >> 10)
    } else {
        format!("{max} bytes")
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("is larger than {size}; is this the right file?"),
    )
}

/// This process's effective user id: whose files the state directory and the vetoes trust.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail. (The standard library has no
    // getter for the effective user id.)
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(dir: &Path) -> Vec<(std::path::PathBuf, &'static str)> {
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path. (The standard library cannot make a FIFO.)
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let socket = dir.join("socket");
        // The socket file stays when the listener closes.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let sub = dir.join("dir");
        std::fs::create_dir(&sub).unwrap();
        vec![
            (fifo, "a FIFO"),
            (socket, "a socket"),
            (sub, "a directory"),
            (std::path::PathBuf::from("/dev/zero"), "a character device"),
        ]
    }

    #[test]
    fn anything_but_a_regular_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        for (path, what) in kinds(dir.path()) {
            let e = read_capped(&path, 1024, Links::Follow).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}", path.display());
            assert_eq!(e.to_string(), format!("is {what}, not a regular file"));
        }
        // A link to one is refused as what it points to, or as a link.
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_capped(&link, 1024, Links::Follow)
            .unwrap_err()
            .to_string()
            .contains("character device"));
        let e = read_capped(&link, 1024, Links::Refuse).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    }

    #[test]
    fn a_file_is_read_up_to_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_capped(&path, 5, Links::Refuse).unwrap(), b"12345");
        let e = read_capped(&path, 4, Links::Refuse).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(read_capped(&path, 2 << 20, Links::Refuse).unwrap().len(), 5);
        assert!(too_large(1 << 20).to_string().contains("1 MiB"));
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(read_text(&path, 5, Links::Follow)
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
    }
}
