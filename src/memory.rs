//! Keeping the resident set small. gpuwatch runs on every node of a fleet, so what it keeps
//! resident is paid once per node.
//!
//! - One malloc arena (glibc): the daemon's threads allocate little and rarely at once, and an
//!   arena per thread would keep pages of its own.
//! - Once the daemon is ready, and again when the pollers' first rounds are done, `trim` gives
//!   the heap pages that startup freed back to the kernel, and unmaps from the process the
//!   pages of the executable and the libraries it was started with that only startup touched:
//!   the clean, file-backed pages the kernel would reclaim anyway under memory pressure. A page
//!   touched again comes back from the page cache (a minor fault).
//! - The threads that went deepest at startup (the main thread, the async worker, the NVML
//!   thread) give back the stack pages below where they run ([`trim_stack`]).
//!
//! What may be dropped is narrow, and the parse fails closed. Only mappings of files that were
//! mapped before `main` ran (the executable, the loader, libc and the other libraries it links
//! against), which stay mapped at the same addresses until the process exits, so that a range
//! read from `/proc/self/smaps` is still that mapping when it is dropped: a library loaded
//! later (NVML, by `dlopen`, which may be retried or closed) is never touched. Of those, only
//! private, read-only mappings of regular files that `smaps` shows in full with no anonymous
//! page, resident or swapped out (a written page of a private mapping, such as the relocated
//! read-only data, is anonymous, and dropping it would bring back the file's bytes in its
//! place), and no locked, huge-page, I/O or raw-PFN flag. A failed call leaves memory as it
//! was.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::sync::OnceLock;

/// The regular files mapped when `main` started.
static STARTUP_FILES: OnceLock<BTreeSet<String>> = OnceLock::new();

/// Limits malloc to one arena, and notes the files mapped now. Call first thing in `main`,
/// before any thread starts.
pub fn at_start() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; before any thread starts, nothing
    // allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let files = std::fs::read_to_string("/proc/self/maps")
        .map(|maps| {
            maps.lines()
                .filter_map(|l| header(l).map(|(_, rest)| path(rest).to_string()))
                .filter(|p| p.starts_with('/') && !p.starts_with("/dev/"))
                .collect()
        })
        .unwrap_or_default();
    let _ = STARTUP_FILES.set(files);
}

/// A mapping's address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: usize,
    pub end: usize,
}

/// Drops what startup alone touched (see the module's documentation). Returns the bytes of
/// mappings dropped. Blocks: reads /proc.
pub fn trim() -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    let Some(startup) = STARTUP_FILES.get() else {
        return 0;
    };
    let Ok(smaps) = std::fs::File::open("/proc/self/smaps") else {
        return 0;
    };
    let lines = std::io::BufReader::new(smaps).lines().map_while(Result::ok);
    let ranges = droppable(lines, |path| {
        startup.contains(path) && std::fs::metadata(path).is_ok_and(|m| m.file_type().is_file())
    });
    let mut dropped = 0;
    for r in ranges {
        // SAFETY: the range is a whole private, read-only mapping of a regular file mapped
        // since before `main` (so never unmapped or replaced since `smaps` was read), with no
        // anonymous page: its contents are the file's, and come back from it when touched.
        let rc = unsafe {
            libc::madvise(
                r.start as *mut libc::c_void,
                r.end - r.start,
                libc::MADV_DONTNEED,
            )
        };
        if rc == 0 {
            dropped += r.end - r.start;
        }
    }
    dropped
}

/// What [`trim_stack`] leaves below its own frame, at least: far more than the rest of that
/// frame, the red zone and `madvise` use. Two pages where pages are larger (64 KiB on some
/// aarch64 kernels), since `madvise` works in whole pages.
const STACK_MARGIN: usize = 16 * 1024;

/// Gives back the pages of the calling thread's stack below where it runs now, and returns how
/// many bytes that was. A thread keeps every stack page it ever touched: startup's deep calls
/// (parsing, the first NVML calls) leave pages that steady state never uses again. Below the
/// stack pointer nothing is live, so a page touched again simply comes back zeroed; this is
/// what glibc does to the stacks of exited threads it keeps for reuse. The range is where the
/// thread's own stack (`pthread_getattr_np`) and the mapping of `/proc/self/maps` that holds
/// the caller's frame overlap; where either cannot be read, nothing is dropped.
#[inline(never)]
pub fn trim_stack() -> usize {
    let here = 0u8;
    let sp = std::hint::black_box(&here) as *const u8 as usize;
    let (Some(low), Some(page)) = (stack_low(), page_size()) else {
        return 0;
    };
    let Some(mapping) = mapping_of(sp) else {
        return 0;
    };
    let start = mapping.start.max(low).next_multiple_of(page);
    let end = sp.saturating_sub(STACK_MARGIN.max(2 * page)) & !(page - 1);
    if end <= start {
        return 0;
    }
    // SAFETY: [start, end) is whole pages of the calling thread's own stack, inside one mapping,
    // at least STACK_MARGIN and two pages below its current frame: no live frame or object is
    // there, and no other thread uses this stack. Its pages come back zero-filled when touched.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    if rc == 0 {
        end - start
    } else {
        0
    }
}

/// The mapping of `/proc/self/maps` that holds `addr`.
fn mapping_of(addr: usize) -> Option<Range> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(header)
        .map(|(r, _)| r)
        .find(|r| r.start <= addr && addr < r.end)
}

/// The lowest address of the calling thread's stack, as the C library knows it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn stack_low() -> Option<usize> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    let mut addr: *mut libc::c_void = std::ptr::null_mut();
    let mut size: libc::size_t = 0;
    // SAFETY: pthread_getattr_np initialises `attr` for the calling thread when it returns 0;
    // it is read once and destroyed.
    let rc = unsafe {
        if libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) != 0 {
            return None;
        }
        let rc = libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size);
        libc::pthread_attr_destroy(attr.as_mut_ptr());
        rc
    };
    (rc == 0 && !addr.is_null() && size > 0).then_some(addr as usize)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn stack_low() -> Option<usize> {
    None
}

/// The kernel's page size.
fn page_size() -> Option<usize> {
    // SAFETY: sysconf only reads a system setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).ok().filter(|p| p.is_power_of_two())
}

/// One mapping of `smaps` as read so far.
struct Entry {
    range: Range,
    /// Private, not writable, of a file `regular` accepts.
    eligible: bool,
    anonymous_zero: Option<bool>,
    swap_zero: Option<bool>,
    /// `VmFlags`, the last field of an entry: seen means the entry was read whole.
    flags_ok: Option<bool>,
}

impl Entry {
    fn droppable(&self) -> bool {
        self.eligible
            && self.anonymous_zero == Some(true)
            && self.swap_zero == Some(true)
            && self.flags_ok == Some(true)
    }
}

/// The mappings in `smaps` text that may be dropped: private and not writable, of a file that
/// `regular` accepts, shown whole with explicit `Anonymous: 0 kB` and `Swap: 0 kB` lines and
/// `VmFlags` with no locked (`lo`), huge-page (`ht`), I/O (`io`) or raw-PFN (`pf`) flag.
/// Anything missing or unexpected keeps the mapping.
pub fn droppable(
    lines: impl Iterator<Item = String>,
    regular: impl Fn(&str) -> bool,
) -> Vec<Range> {
    let mut out = Vec::new();
    let mut current: Option<Entry> = None;
    for line in lines {
        if let Some((range, rest)) = header(&line) {
            if let Some(e) = current.take().filter(Entry::droppable) {
                out.push(e.range);
            }
            let perms = rest.split_whitespace().next().unwrap_or("");
            let p = path(rest);
            current = Some(Entry {
                range,
                eligible: perms.len() == 4
                    && perms.starts_with('r')
                    && !perms.contains('w')
                    && perms.ends_with('p')
                    && p.starts_with('/')
                    && !p.starts_with("/dev/")
                    && !p.ends_with(" (deleted)")
                    && regular(p),
                anonymous_zero: None,
                swap_zero: None,
                flags_ok: None,
            });
            continue;
        }
        let Some(e) = current.as_mut() else { continue };
        let zero = |v: &str| v.trim() == "0 kB";
        if let Some(v) = line.strip_prefix("Anonymous:") {
            e.anonymous_zero = Some(zero(v));
        } else if let Some(v) = line.strip_prefix("Swap:") {
            e.swap_zero = Some(zero(v));
        } else if let Some(v) = line.strip_prefix("VmFlags:") {
            e.flags_ok = Some(
                !v.split_whitespace()
                    .any(|f| matches!(f, "lo" | "ht" | "io" | "pf")),
            );
        }
    }
    if let Some(e) = current.filter(Entry::droppable) {
        out.push(e.range);
    }
    out
}

/// A mapping's header line ("start-end perms offset dev inode path"): its range and the rest.
fn header(line: &str) -> Option<(Range, &str)> {
    let (range, rest) = line.split_once(' ')?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (start < end).then_some((Range { start, end }, rest))
}

/// The path of a header's rest ("perms offset dev inode path"), which may hold spaces; empty
/// for an anonymous mapping.
fn path(rest: &str) -> &str {
    rest.splitn(5, ' ').nth(4).map_or("", str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Touches about `depth` × 64 KiB of stack, and returns a sum that needs every level.
    #[inline(never)]
    fn deep(depth: u32) -> u64 {
        let mut block = [0u8; 64 * 1024];
        block[0] = depth as u8;
        let block = std::hint::black_box(&mut block);
        let below = if depth == 0 { 0 } else { deep(depth - 1) };
        below + u64::from(block[0]) + u64::from(block[65535])
    }

    /// The resident bytes of the calling thread's stack mapping, by `mincore`.
    fn stack_resident() -> usize {
        let here = 0u8;
        let sp = std::hint::black_box(&here) as *const u8 as usize;
        let r = mapping_of(sp).unwrap();
        let page = page_size().unwrap();
        let mut pages = vec![0u8; (r.end - r.start) / page];
        // SAFETY: the range is a whole mapping, and `pages` has a byte for each of its pages.
        let rc = unsafe {
            libc::mincore(
                r.start as *mut libc::c_void,
                r.end - r.start,
                pages.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        pages.iter().filter(|p| **p & 1 == 1).count() * page
    }

    #[test]
    fn trim_stack_gives_back_what_a_deep_call_touched_and_the_stack_still_works() {
        std::thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(|| {
                assert_eq!(deep(16), (0..=16).sum::<u64>());
                let touched = stack_resident();
                assert!(touched > 1 << 20, "the deep call touched {touched} bytes");
                let dropped = trim_stack();
                let left = stack_resident();
                assert!(dropped > 1 << 20, "dropped {dropped} bytes");
                assert!(left < 64 * 1024, "{left} bytes still resident");
                // Pages come back zeroed, and the thread runs as before.
                assert_eq!(deep(16), (0..=16).sum::<u64>());
                assert!(stack_resident() > 1 << 20);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    const SMAPS: &str = "\
55d0a0000000-55d0a0200000 r--p 00000000 08:01 1234 /usr/bin/gpuwatch
Size:               2048 kB
Rss:                 900 kB
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd mr mw me sd
55d0a0200000-55d0a1000000 r-xp 00200000 08:01 1234 /usr/bin/gpuwatch
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me sd
55d0a1000000-55d0a1001000 r--p 01000000 08:01 1234 /usr/bin/gpuwatch
Anonymous:             0 kB
Swap:                  4 kB
VmFlags: rd mr mw me ac sd
55d0a1001000-55d0a1100000 r--p 01001000 08:01 1234 /usr/bin/gpuwatch
Anonymous:           700 kB
Swap:                  0 kB
VmFlags: rd mr mw me ac sd
55d0a1100000-55d0a1110000 rw-p 01100000 08:01 1234 /usr/bin/gpuwatch
Anonymous:            64 kB
Swap:                  0 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000100000 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me sd
7f0000100000-7f0000180000 r-xp 00000000 08:01 98 /usr/lib/libnvidia-ml.so.1
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me sd
7f0000180000-7f0000190000 r--s 00000000 00:05 97 /dev/nvidia0
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd sh mr mw me ms io pf dd
7f0000190000-7f00001a0000 r-xp 00000000 08:01 96 /usr/lib/locked.so
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me lo sd
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Anonymous:          1024 kB
Swap:                  0 kB
VmFlags: rd wr mr mw me ac sd
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Anonymous:            32 kB
Swap:                  0 kB
VmFlags: rd wr mr mw me gd ac
";

    /// The files mapped at start in the example: not NVML, which is loaded later.
    fn started(p: &str) -> bool {
        [
            "/usr/bin/gpuwatch",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/locked.so",
        ]
        .contains(&p)
    }

    #[test]
    fn only_clean_read_only_mappings_of_startup_files_are_dropped() {
        let got = droppable(SMAPS.lines().map(String::from), started);
        // The executable's read-only data and text, and libc's text. Never: a page swapped
        // out or written (the relocated read-only data), the writable data, a library loaded
        // later, a device, a locked mapping, the heap or the stack.
        assert_eq!(
            got,
            [
                Range {
                    start: 0x55d0a0000000,
                    end: 0x55d0a0200000
                },
                Range {
                    start: 0x55d0a0200000,
                    end: 0x55d0a1000000
                },
                Range {
                    start: 0x7f0000000000,
                    end: 0x7f0000100000
                },
            ]
        );
    }

    #[test]
    fn an_entry_not_read_whole_is_kept() {
        // Cut before VmFlags, or without the Anonymous or Swap line: kept.
        for cut in [
            "1000-2000 r-xp 00000000 08:01 7 /usr/bin/gpuwatch\nAnonymous: 0 kB\nSwap: 0 kB\n",
            "1000-2000 r-xp 00000000 08:01 7 /usr/bin/gpuwatch\nSwap: 0 kB\nVmFlags: rd ex\n",
            "1000-2000 r-xp 00000000 08:01 7 /usr/bin/gpuwatch\nAnonymous: 0 kB\nVmFlags: rd ex\n",
        ] {
            assert!(
                droppable(cut.lines().map(String::from), |_| true).is_empty(),
                "{cut}"
            );
        }
    }

    #[test]
    fn a_path_with_spaces_is_read_whole() {
        let smaps = "1000-2000 r-xp 00000000 08:01 7 /opt/my tools/gpuwatch\n\
                     Anonymous: 0 kB\nSwap: 0 kB\nVmFlags: rd ex\n";
        let got = droppable(smaps.lines().map(String::from), |p| {
            p == "/opt/my tools/gpuwatch"
        });
        assert_eq!(got.len(), 1);
        assert!(droppable(smaps.lines().map(String::from), |p| p == "/opt/my").is_empty());
    }

    #[test]
    fn devices_and_deleted_files_are_never_dropped() {
        let smaps = "1000-2000 r--p 00000000 00:05 7 /dev/nvidiactl\n\
                     Anonymous: 0 kB\nSwap: 0 kB\nVmFlags: rd\n\
                     3000-4000 r-xp 00000000 08:01 8 /usr/bin/gpuwatch (deleted)\n\
                     Anonymous: 0 kB\nSwap: 0 kB\nVmFlags: rd ex\n";
        assert!(droppable(smaps.lines().map(String::from), |_| true).is_empty());
    }

    #[test]
    fn trimming_this_process_keeps_it_working() {
        // The test binary drops its own clean read-only pages, then goes on running code and
        // reading constants from them. Only its own: other tests may load and unload
        // libraries meanwhile.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let _ = STARTUP_FILES.set([exe.to_string_lossy().into_owned()].into());
        let before: Vec<String> = SMAPS.lines().map(str::to_uppercase).collect();
        assert!(trim() > 0, "the text of the test binary is dropped");
        let after: Vec<String> = SMAPS.lines().map(str::to_uppercase).collect();
        assert_eq!(before, after);
    }
}
