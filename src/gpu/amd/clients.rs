//! Which processes use each AMD GPU, and how much of its memory: the DRM clients each process
//! holds, from the `fdinfo` of its file descriptors (the kernel's DRM client usage stats).
//!
//! A process's file descriptors are listed from `<proc>/<pid>/fdinfo`. One whose link in
//! `<proc>/<pid>/fd` points outside `/dev/dri/` is not a GPU's and is not read further; the
//! fdinfo of the others says whose client it is (`drm-driver: amdgpu`), of which GPU
//! (`drm-pdev`, else the render node the link names), which client (`drm-client-id`: a file
//! descriptor duplicated within a process is one client), and its VRAM (`drm-resident-vram`,
//! else the older `drm-memory-vram`).
//!
//! The kernel shows another user's file descriptors only to a reader with ptrace rights over
//! that process. A process whose descriptors cannot be listed, or one of whose GPU
//! descriptors cannot be read, may be using any GPU: the scan says so, and no AMD GPU's
//! process list is known that cycle. Unknown is never none.

use std::collections::{BTreeMap, HashMap};
use std::io::ErrorKind;
use std::path::Path;

/// The most file descriptors of one process looked at (the most `RLIMIT_NOFILE` allows by
/// default); a process with more is unknown.
const MAX_FDS: usize = 1 << 20;
/// The most threads of one process looked at, where its main thread has ended.
const MAX_TASKS: usize = 1 << 16;
/// The most bytes of one fdinfo file read (a client's is about 1.5 KiB).
const MAX_FDINFO: usize = 16 * 1024;
/// The most clients kept of one process on one GPU.
const MAX_CLIENTS: usize = 256;

/// One cycle's DRM clients of the node's AMD GPUs.
#[derive(Debug, Default)]
pub(super) struct Clients {
    /// By PCI address: each process using that GPU, by pid, with its clients' VRAM.
    pub(super) by_gpu: HashMap<String, BTreeMap<u32, Used>>,
    /// Processes whose GPU clients could not be read, and why (the first of them).
    pub(super) unreadable: usize,
    pub(super) why: Option<(u32, String)>,
}

/// What one process holds of one GPU.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Used {
    /// Each client's VRAM, by its client id (or, without one, its descriptor).
    clients: BTreeMap<(Option<u64>, String), Option<u64>>,
}

impl Used {
    /// The VRAM of every client of the process, where at least one says.
    pub(super) fn vram_bytes(&self) -> Option<u64> {
        self.clients
            .values()
            .flatten()
            .copied()
            .reduce(u64::saturating_add)
    }
}

impl Clients {
    fn unreadable(&mut self, pid: u32, why: impl std::fmt::Display) {
        self.unreadable += 1;
        if self.why.is_none() {
            self.why = Some((pid, why.to_string()));
        }
    }
}

/// Every process's amdgpu clients under `proc`. `nodes` names each AMD GPU's DRM nodes
/// (`renderD128`, `card1`) by its PCI address, for a client whose fdinfo names no device;
/// `only` is the one AMD GPU's address where the node has one.
pub(super) fn scan(proc: &Path, nodes: &HashMap<String, String>, only: Option<&str>) -> Clients {
    let mut out = Clients::default();
    if let Err(why) = super::procfs::complete(proc) {
        out.unreadable(0, why);
        return out;
    }
    let entries = match std::fs::read_dir(proc) {
        Ok(e) => e,
        Err(e) => {
            out.unreadable(0, format_args!("{}: {e}", proc.display()));
            return out;
        }
    };
    let mut listed = 0usize;
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                out.unreadable(0, format_args!("{}: {e}", proc.display()));
                return out;
            }
        };
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        listed += 1;
        let at = Place {
            dir: entry.path(),
            pid,
            nodes,
            only,
        };
        match at.clients() {
            Ok(found) => at.add(found, &mut out),
            Err(why) => out.unreadable(pid, why),
        }
    }
    // Every node runs processes: a list of none is the wrong directory (a mount missing).
    if listed == 0 {
        out.unreadable(0, format_args!("{} lists no process", proc.display()));
    }
    out
}

/// Whether a read failed because the process or descriptor is gone (it holds nothing now).
fn gone(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// One process under the process list, and how its clients are matched to GPUs.
struct Place<'a> {
    dir: std::path::PathBuf,
    pid: u32,
    nodes: &'a HashMap<String, String>,
    only: Option<&'a str>,
}

/// One client found: its GPU's address, its key within the process, its VRAM.
type Found = (String, (Option<u64>, String), Option<u64>);

impl Place<'_> {
    /// The process's amdgpu clients. A process whose main thread has ended has no
    /// descriptors of its own to list: its other threads' are read instead.
    fn clients(&self) -> Result<Vec<Found>, String> {
        let Some(found) = self.table(&self.dir)? else {
            return Ok(Vec::new());
        };
        if !found.1 {
            return Ok(found.0);
        }
        let tasks = match std::fs::read_dir(self.dir.join("task")) {
            Ok(t) => t,
            Err(e) if gone(&e) => return Ok(Vec::new()),
            Err(e) => return Err(format!("pid {}: its threads: {e}", self.pid)),
        };
        let own = self.pid.to_string();
        let mut all = Vec::new();
        for (n, task) in tasks.enumerate() {
            let task = task.map_err(|e| format!("pid {}: its threads: {e}", self.pid))?;
            if n == MAX_TASKS {
                return Err(format!("pid {}: more than {MAX_TASKS} threads", self.pid));
            }
            if task.file_name().to_str() == Some(own.as_str()) {
                continue;
            }
            if let Some((found, _)) = self.table(&task.path())? {
                all.extend(found);
            }
        }
        Ok(all)
    }

    /// The amdgpu clients in one descriptor table (`dir/fdinfo`, `dir/fd`), and whether it
    /// listed no descriptor at all; `None` where it is gone.
    fn table(&self, dir: &Path) -> Result<Option<(Vec<Found>, bool)>, String> {
        let pid = self.pid;
        let fds = match std::fs::read_dir(dir.join("fdinfo")) {
            Ok(e) => e,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(format!("pid {pid}: {e}{}", hint(&e))),
        };
        // A tree that lists fdinfo alone (no `fd` links) has every descriptor read.
        let links = dir.join("fd").is_dir();
        let mut found = Vec::new();
        let mut empty = true;
        for (n, fd) in fds.enumerate() {
            if n == MAX_FDS {
                return Err(format!("pid {pid}: more than {MAX_FDS} file descriptors"));
            }
            let fd = fd.map_err(|e| format!("pid {pid}: {e}"))?;
            empty = false;
            let name = fd.file_name().to_string_lossy().into_owned();
            let target = if links {
                match std::fs::read_link(dir.join("fd").join(&name)) {
                    Ok(t) if !may_be_gpu(&t) => continue,
                    Ok(t) => Some(t),
                    Err(e) if gone(&e) => continue,
                    // Its fdinfo alone says what it is.
                    Err(_) => None,
                }
            } else {
                None
            };
            let text = match read(&fd.path()) {
                Ok(t) => t,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(format!("pid {pid}: fd {name}: {e}{}", hint(&e))),
            };
            let info = parse(&text);
            if !info.is_amdgpu(target.is_some()) {
                continue;
            }
            let node = target
                .as_deref()
                .and_then(|t| t.file_name()?.to_str())
                .and_then(|n| self.nodes.get(n));
            let gpu = info
                .pdev
                .as_ref()
                .or(node)
                .map(String::as_str)
                .or(self.only);
            let Some(gpu) = gpu else {
                return Err(format!(
                    "pid {pid}: fd {name}: an amdgpu client names no GPU of this node's (a partition's render node, or a device not found)"
                ));
            };
            // A descriptor duplicated within the process is one client; without a client id,
            // each descriptor is one.
            let key = match info.client {
                Some(c) => (Some(c), String::new()),
                None => (None, name),
            };
            found.push((gpu.to_string(), key, info.vram));
        }
        Ok(Some((found, empty)))
    }

    fn add(&self, found: Vec<Found>, out: &mut Clients) {
        for (gpu, key, vram) in found {
            let used = out
                .by_gpu
                .entry(gpu)
                .or_default()
                .entry(self.pid)
                .or_default();
            if used.clients.len() < MAX_CLIENTS {
                used.clients.insert(key, vram);
            }
        }
    }
}

/// What a refused read needs, said where the kernel refused it.
fn hint(e: &std::io::Error) -> &'static str {
    if e.kind() == ErrorKind::PermissionDenied {
        " (another user's descriptors need CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH)"
    } else {
        ""
    }
}

/// Whether a descriptor's link may be a GPU's: a device node, but none of those every process
/// holds that are no GPU. Sockets, pipes, files and the like are not read further.
fn may_be_gpu(target: &Path) -> bool {
    let Some(t) = target.to_str() else {
        return true;
    };
    let never = [
        "/dev/null",
        "/dev/zero",
        "/dev/urandom",
        "/dev/random",
        "/dev/ptmx",
        "/dev/console",
        "/dev/kmsg",
        "/dev/tty",
        "/dev/full",
    ];
    let never_under = ["/dev/pts/", "/dev/shm/", "/dev/mqueue/", "/dev/hugepages/"];
    t.starts_with("/dev/") && !never.contains(&t) && !never_under.iter().any(|p| t.starts_with(p))
}

/// An fdinfo file's text, at most `MAX_FDINFO` bytes.
fn read(path: &Path) -> std::io::Result<String> {
    let bytes = super::read_bytes(path, MAX_FDINFO)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// What one fdinfo file says of a DRM client.
#[derive(Debug, Default, PartialEq)]
pub(super) struct FdInfo {
    pub(super) driver: Option<String>,
    /// The GPU's PCI address, lowercase.
    pub(super) pdev: Option<String>,
    pub(super) client: Option<u64>,
    /// Resident VRAM in bytes.
    pub(super) vram: Option<u64>,
    /// It has a `pasid`, which only amdgpu prints.
    pub(super) pasid: bool,
}

impl FdInfo {
    /// Whether it is an amdgpu client: its driver says so, or (kernels before the common
    /// keys, which print no driver) it names a PCI device and is a DRM node's descriptor or
    /// has amdgpu's `pasid`.
    fn is_amdgpu(&self, drm_node: bool) -> bool {
        match &self.driver {
            Some(d) => d == "amdgpu",
            None => self.pdev.is_some() && (drm_node || self.pasid),
        }
    }
}

/// An fdinfo file's text: `key:` then whitespace then the value, one per line
/// (`drm-memory-gtt: \t` has a space before its tab). Lines that are not a key the parse
/// knows, or hold a value it cannot read, are passed over.
pub(super) fn parse(text: &str) -> FdInfo {
    let mut info = FdInfo::default();
    let (mut resident, mut legacy) = (None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "drm-driver" if !value.is_empty() => info.driver = Some(value.to_string()),
            // `pdev` is the key of the first kernels that printed amdgpu's fdinfo.
            "drm-pdev" | "pdev" => info.pdev = super::text::pci_address(value),
            "drm-client-id" => info.client = value.parse().ok(),
            "pasid" => info.pasid = true,
            "drm-resident-vram" => resident = bytes(value, 1),
            // Deprecated, printed by amdgpu alone: KiB. Its oldest form is `vram mem: N kB`.
            "drm-memory-vram" | "vram mem" => legacy = bytes(value, 1024),
            _ => {}
        }
    }
    info.vram = resident.or(legacy);
    info
}

/// A memory value: a number and an optional unit (`KiB`, `MiB`, `GiB`, `kB`); bare, `unit`
/// bytes each.
fn bytes(value: &str, unit: u64) -> Option<u64> {
    let mut words = value.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    let scale = match words.next() {
        None => unit,
        Some("KiB" | "kB") => 1 << 10,
        Some("MiB") => 1 << 20,
        Some("GiB") => 1 << 30,
        Some(_) => return None,
    };
    if words.next().is_some() {
        return None;
    }
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A client as a current kernel prints it (drm_show_fdinfo, then amdgpu's own keys).
    const NEW: &str = "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1090\n\
        drm-driver:\tamdgpu\ndrm-client-id:\t42\ndrm-pdev:\t0000:03:00.0\npasid:\t32770\n\
        drm-total-vram:\t256 MiB\ndrm-shared-vram:\t0\ndrm-active-vram:\t0\n\
        drm-resident-vram:\t256 MiB\ndrm-purgeable-vram:\t0\ndrm-total-gtt:\t2 MiB\n\
        drm-resident-gtt:\t2 MiB\ndrm-memory-vram:\t262144 KiB\ndrm-memory-gtt: \t2048 KiB\n\
        drm-memory-cpu: \t0 KiB\namd-evicted-vram:\t0 KiB\namd-requested-vram:\t262144 KiB\n\
        drm-engine-gfx:\t123456789 ns\ndrm-engine-compute:\t5000 ns\n";

    #[test]
    fn a_current_kernel_s_client_is_read_in_bytes() {
        let i = parse(NEW);
        assert_eq!(i.driver.as_deref(), Some("amdgpu"));
        assert_eq!(i.pdev.as_deref(), Some("0000:03:00.0"));
        assert_eq!(i.client, Some(42));
        assert_eq!(i.vram, Some(256 << 20));
        assert!(i.is_amdgpu(false));
    }

    #[test]
    fn older_kernels_keys_are_read() {
        // Before the common memory keys: amdgpu printed the legacy key alone, in KiB.
        let i = parse("drm-driver:\tamdgpu\ndrm-pdev:\t0000:C1:00.0\ndrm-client-id:\t7\ndrm-memory-vram:\t1024 KiB\ndrm-memory-gtt: \t8 KiB\n");
        assert_eq!(i.pdev.as_deref(), Some("0000:c1:00.0"));
        assert_eq!(i.vram, Some(1 << 20));
        // The first amdgpu fdinfo: no driver key, `pdev` and `vram mem` in kB.
        let i = parse("pdev:\t0000:03:00.0\npasid:\t32769\nvram mem:\t2048 kB\ngtt mem:\t0 kB\n");
        assert_eq!(i.vram, Some(2 << 20));
        assert!(i.is_amdgpu(false), "amdgpu's pasid, naming a device");
        let i = parse("pdev:\t0000:03:00.0\n");
        assert!(i.is_amdgpu(true), "a DRM node's descriptor naming a device");
        assert!(!i.is_amdgpu(false), "a device named, by whom unknown");
        // A bare number is bytes, where the key is the common one.
        assert_eq!(parse("drm-resident-vram:\t4096\n").vram, Some(4096));
    }

    #[test]
    fn other_drivers_and_garbage_are_no_amdgpu_client() {
        assert!(!parse("drm-driver:\ti915\ndrm-pdev:\t0000:00:02.0\n").is_amdgpu(true));
        assert_eq!(parse(""), FdInfo::default());
        let i = parse("drm-driver:\tamdgpu\ndrm-pdev:\tnot-an-address\ndrm-resident-vram:\tlots MiB\ndrm-client-id:\t-1\n");
        assert_eq!((i.pdev, i.vram, i.client), (None, None, None));
        assert_eq!(parse("drm-resident-vram:\t1 PiB\n").vram, None);
        assert_eq!(
            parse("drm-resident-vram:\t18446744073709551615 MiB\n").vram,
            None
        );
    }

    fn client(dir: &Path, pid: u32, fd: u32, target: Option<&str>, text: &str) {
        let p = dir.join(pid.to_string());
        std::fs::create_dir_all(p.join("fdinfo")).unwrap();
        std::fs::write(p.join("fdinfo").join(fd.to_string()), text).unwrap();
        if let Some(t) = target {
            std::fs::create_dir_all(p.join("fd")).unwrap();
            symlink(t, p.join("fd").join(fd.to_string())).unwrap();
        }
    }

    fn nodes() -> HashMap<String, String> {
        HashMap::from([("renderD129".to_string(), "0000:04:00.0".to_string())])
    }

    #[test]
    fn each_process_s_clients_are_summed_once_per_client() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        // Two descriptors of one client (a dup), and a second client: 256 + 64 MiB.
        client(proc, 100, 5, Some("/dev/dri/renderD128"), NEW);
        client(proc, 100, 6, Some("/dev/dri/renderD128"), NEW);
        let second = NEW
            .replace("drm-client-id:\t42", "drm-client-id:\t43")
            .replace("drm-resident-vram:\t256 MiB", "drm-resident-vram:\t64 MiB");
        client(proc, 100, 7, Some("/dev/dri/renderD128"), &second);
        // A socket, whose fdinfo is never read (it would parse as a client).
        client(proc, 100, 8, Some("socket:[1234]"), NEW);
        // An old kernel's client with no device named: its render node's GPU.
        client(
            proc,
            200,
            3,
            Some("/dev/dri/renderD129"),
            "drm-driver:\tamdgpu\ndrm-memory-vram:\t4 KiB\n",
        );
        // Another driver's client.
        client(
            proc,
            300,
            3,
            Some("/dev/dri/renderD130"),
            "drm-driver:\ti915\n",
        );
        std::fs::create_dir_all(proc.join("self")).unwrap();
        let c = scan(proc, &nodes(), None);
        assert_eq!(c.unreadable, 0, "{c:?}");
        assert_eq!(c.by_gpu.len(), 2, "{c:?}");
        assert_eq!(c.by_gpu["0000:03:00.0"][&100].vram_bytes(), Some(320 << 20));
        assert_eq!(c.by_gpu["0000:04:00.0"][&200].vram_bytes(), Some(4096));
    }

    #[test]
    fn a_tree_of_fdinfo_alone_is_read_and_a_client_of_no_gpu_is_unknown() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        client(proc, 100, 5, None, NEW);
        client(proc, 101, 5, None, "pos:\t0\nflags:\t0100002\n");
        let c = scan(proc, &nodes(), None);
        assert_eq!(c.by_gpu["0000:03:00.0"].keys().collect::<Vec<_>>(), [&100]);
        // A client naming no device goes to the node's one AMD GPU, and with several is
        // unknown.
        client(proc, 102, 5, None, "drm-driver:\tamdgpu\n");
        let c = scan(proc, &nodes(), Some("0000:03:00.0"));
        assert_eq!(c.by_gpu["0000:03:00.0"].len(), 2);
        assert_eq!(c.by_gpu["0000:03:00.0"][&102].vram_bytes(), None);
        let c = scan(proc, &nodes(), None);
        assert_eq!(c.unreadable, 1);
    }

    #[test]
    fn a_process_whose_main_thread_ended_is_read_through_its_threads() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        // The leader's table is gone (fdinfo lists nothing); thread 101 holds the client.
        std::fs::create_dir_all(proc.join("100/fdinfo")).unwrap();
        std::fs::create_dir_all(proc.join("100/task/100/fdinfo")).unwrap();
        let task = proc.join("100/task");
        client(&task, 101, 5, Some("/dev/dri/renderD128"), NEW);
        let c = scan(proc, &nodes(), None);
        assert_eq!(c.unreadable, 0, "{c:?}");
        assert_eq!(c.by_gpu["0000:03:00.0"][&100].vram_bytes(), Some(256 << 20));
    }

    #[test]
    fn a_device_under_another_name_and_clients_without_ids_are_each_counted() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        // A container's name for the render node; no client id (each descriptor a client).
        let old = "drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-memory-vram:\t1024 KiB\n";
        client(proc, 100, 5, Some("/dev/gpu0"), old);
        client(proc, 100, 6, Some("/dev/gpu0"), old);
        // /dev/null is never read, even holding what a client would.
        client(proc, 100, 7, Some("/dev/null"), NEW);
        let c = scan(proc, &nodes(), None);
        assert_eq!(c.by_gpu["0000:03:00.0"][&100].vram_bytes(), Some(2 << 20));
    }

    #[test]
    fn an_empty_process_list_is_no_list() {
        let tmp = tempfile::tempdir().unwrap();
        let c = scan(tmp.path(), &nodes(), None);
        assert_eq!(c.unreadable, 1);
        assert!(c.why.unwrap().1.contains("lists no process"));
    }

    #[test]
    fn a_process_whose_descriptors_cannot_be_read_is_unknown() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path();
        client(proc, 100, 5, Some("/dev/dri/renderD128"), NEW);
        // A process whose fdinfo is a file, not a directory: it cannot be listed.
        std::fs::create_dir_all(proc.join("101")).unwrap();
        std::fs::write(proc.join("101/fdinfo"), "").unwrap();
        let c = scan(proc, &nodes(), None);
        assert_eq!(c.unreadable, 1);
        assert_eq!(c.why.as_ref().map(|w| w.0), Some(101));
        // A process gone between the list and the read holds nothing.
        std::fs::remove_file(proc.join("101/fdinfo")).unwrap();
        assert_eq!(scan(proc, &nodes(), None).unreadable, 0);
        // No process list at all.
        assert_eq!(scan(&proc.join("nothing"), &nodes(), None).unreadable, 1);
    }
}
