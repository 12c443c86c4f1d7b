//! The steady state's functions, for the order the linker gives them (`link/symbol-order.txt`).
//!
//! The daemon runs under `valgrind --tool=callgrind` with instrumentation off. Once its startup is
//! over (the first sample, then 35 s, past the daemon's second trim of startup pages), it
//! is turned on for `window` seconds while a scraper reads `/metrics` once a second, as a
//! Prometheus would. Every function of the gpuwatch executable that ran in that window is
//! written out, hottest (most instructions of its own) first.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{scrape, start, Setup};

pub fn run(window: u64, setup: Setup, imds: SocketAddr, out: &Path) {
    let trace = tempfile::tempdir().unwrap();
    let file = trace.path().join("callgrind.out");
    let wrapper: Vec<String> = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--demangle=no",
        "--compress-strings=no",
        "--compress-pos=no",
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--callgrind-out-file={}", file.display())])
    .collect();
    let (daemon, addr, _dir) = start(setup, imds, &wrapper);
    let pid = daemon.0.id().to_string();
    std::thread::sleep(Duration::from_secs(35));
    control(&["--instr=on", &pid]);
    let mut conn = BufReader::new(TcpStream::connect(addr).unwrap());
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(window) {
        scrape(&mut conn, addr);
        std::thread::sleep(Duration::from_secs(1));
    }
    control(&["--dump=steady", &pid]);
    drop(daemon);

    // The dump is the newest file beside the output file.
    let dump = std::fs::read_dir(trace.path())
        .unwrap()
        .filter_map(Result::ok)
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .expect("callgrind wrote no dump")
        .path();
    let dump = std::fs::read_to_string(&dump).unwrap();
    let costs = own_costs(&dump, "/gpuwatch");
    let mut hot: Vec<(&str, u64)> = costs.into_iter().collect();
    hot.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut f = std::fs::File::create(out).unwrap();
    writeln!(
        f,
        "# The functions gpuwatch's steady state runs, hottest first: the linker places them\n\
         # together (build.rs). Written by `GPUWATCH_BENCH_PROFILE=<this file> cargo bench --bench\n\
         # exporter`, from 8 GPUs with GPM and the cost watch on, over {window} s. A name's\n\
         # `.llvm.<hash>` suffix matches any hash; a name that no longer exists is skipped, so\n\
         # a stale file costs memory, not correctness."
    )
    .unwrap();
    for (name, _) in &hot {
        writeln!(f, "{name}").unwrap();
    }
    eprintln!("{} functions written to {}", hot.len(), out.display());
}

/// How many of the functions `list` names the executable `bin` holds together, between the
/// symbols build.rs's linker script defines, and how many `list` names; `Err` says why it could
/// not tell. A name counts when a function of that name, whatever its `.llvm.<hash>` suffix,
/// lies there. Uses binutils' `nm`.
pub fn placed(bin: &Path, list: &Path) -> Result<(usize, usize), String> {
    let out = Command::new("nm")
        .arg(bin)
        .output()
        .map_err(|e| format!("nm: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nm failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let base = |name: &str| match name.rsplit_once(".llvm.") {
        Some((base, hash)) if hash.bytes().all(|b| b.is_ascii_digit()) => base.to_string(),
        _ => name.to_string(),
    };
    // "000000000134be88 t name": the address and the name.
    let symbols: Vec<(u64, &str)> = std::str::from_utf8(&out.stdout)
        .map_err(|e| format!("nm: {e}"))?
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let address = u64::from_str_radix(f.next()?, 16).ok()?;
            Some((address, f.nth(1)?))
        })
        .collect();
    let at = |name: &str| symbols.iter().find(|s| s.1 == name).map(|s| s.0);
    let (Some(start), Some(end)) = (at("gpuwatch_hot_start"), at("gpuwatch_hot_end")) else {
        return Err("no gpuwatch_hot_start and gpuwatch_hot_end: the order was not applied".into());
    };
    let hot: std::collections::HashSet<String> = symbols
        .iter()
        .filter(|s| (start..end).contains(&s.0))
        .map(|s| base(s.1))
        .collect();
    let list = std::fs::read_to_string(list).map_err(|e| format!("{}: {e}", list.display()))?;
    let names: std::collections::BTreeSet<String> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(base)
        .collect();
    Ok((
        names.iter().filter(|n| hot.contains(*n)).count(),
        names.len(),
    ))
}

fn control(args: &[&str]) {
    let status = Command::new("callgrind_control")
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("callgrind_control (valgrind) is not installed");
    assert!(status.success(), "callgrind_control {args:?} failed");
}

/// Each function's own instruction count, for the functions of objects whose path ends with
/// `object`, from an uncompressed callgrind dump: a `fn=` line names the function, and the
/// cost lines after it are its own, except the one after each `calls=` line (a call's
/// inclusive cost).
fn own_costs<'a>(dump: &'a str, object: &str) -> HashMap<&'a str, u64> {
    let mut costs = HashMap::new();
    let mut ours = false;
    let mut current: Option<&str> = None;
    let mut after_call = false;
    for line in dump.lines() {
        if let Some(ob) = line.strip_prefix("ob=") {
            ours = ob.ends_with(object);
        } else if let Some(name) = line.strip_prefix("fn=") {
            // Callgrind names a recursive call's frames `name'2` and so on: one function.
            let name = name.rsplit_once('\'').map_or(name, |(base, depth)| {
                if depth.bytes().all(|b| b.is_ascii_digit()) {
                    base
                } else {
                    name
                }
            });
            current = ours.then_some(name);
            if let Some(name) = current {
                costs.entry(name).or_insert(0);
            }
        } else if line.starts_with("calls=") {
            after_call = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-') {
            if !after_call {
                if let Some(name) = current {
                    let ir: u64 = line
                        .split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    *costs.entry(name).or_insert(0) += ir;
                }
            }
            after_call = false;
        }
    }
    costs
}
