//! Resource benchmark: `gpuwatch run` over fake GPUs at a 1 s interval, printing one row per
//! setup so that the cost of GPM, of the cost watch and of each GPU shows side by side:
//!
//! - 8 GPUs without GPM, cost watch off (the exporter alone);
//! - 8, 64 and 256 Hopper GPUs (13 GPM metrics each), cost watch off and on;
//! - 8 GPUs with GPM and the cost watch, without any `Environment=` setting of the systemd unit,
//!   as a plain `gpuwatch run` starts (the unit sets none today, so it matches the row above it).
//!
//! Every other row runs with the unit's `Environment=` settings, as the unit runs the daemon.
//!
//! "Cost watch on" is what a fleet runs: an idle rule (dry run), a price, a local budget, and
//! `provider = "aws"`, with instance metadata from a loopback IMDSv2 fake in this process and
//! every AWS endpoint on a closed loopback port: no packet leaves the machine.
//!
//!     cargo bench --profile dist --bench exporter       # 60 s per row, the shipped build
//!     GPUWATCH_BENCH_SECS=40 GPUWATCH_BENCH_GPUS=8 cargo bench --profile dist --bench exporter
//!
//! gpuwatch gives the heap that startup freed back once it is ready and again 30 s later: a window
//! shorter than that measures before the second drop.
//!
//! Each row: resident memory (VmRSS) and its anonymous part (RssAnon) from /proc/PID/status,
//! the anonymous and file-backed pages of /proc/PID/smaps_rollup, CPU time per minute over the
//! window (from /proc/PID/stat), and the latency of sequential scrapes over one keep-alive
//! connection (p50, p99, max). Figures, not assertions: the machine may be shared; compare rows
//! of one run.
//!
//! With `GPUWATCH_BENCH_ALL_SMI` naming all-smi's binary (`cargo install all-smi`, 0.22 was
//! compared; it needs Debian's protobuf-compiler, libprotobuf-dev and libdrm-dev), all-smi's
//! exporter (`all-smi api`) runs beside the exporter-alone row over the same fake GPUs: it finds
//! GPUs through `lspci`, so a stand-in that prints one NVIDIA 3D controller goes first on its
//! PATH, and its NVML is the fake library, through LD_LIBRARY_PATH. Both are scraped once a
//! second through the window, and two more lines give both processes' memory at its end, and
//! the ratios:
//!
//!     GPUWATCH_BENCH_ALL_SMI=all-smi GPUWATCH_BENCH_SECS=40 GPUWATCH_BENCH_GPUS=8 cargo bench --profile dist --bench exporter
//!
//! With `GPUWATCH_BENCH_BIN` naming other `gpuwatch` binaries (separated by `:`), each row runs
//! once for each of them instead of the bench's own build, over the same fake library, so that
//! two builds (such as `target/release/gpuwatch` and `target/dist/gpuwatch`) compare in one run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCRAPES: usize = 1000;

/// One setup to measure.
#[derive(Clone, Copy)]
struct Setup {
    gpus: usize,
    gpm: bool,
    cost: bool,
    /// Without the unit's environment.
    bare: bool,
}

fn scenario(setup: Setup) -> String {
    let mut s = String::from("driver_version = \"550.54.15\"\n");
    for i in 0..setup.gpus {
        let period = 30 + i % 17;
        s.push_str(&format!(
            "[[gpu]]\nutilization = {{ kind = \"bursts\", busy = 95, idle = 5, period = \"{period}s\", duty = 0.7 }}\n\
             memory_used_mib = 60000\ntemperature = {{ kind = \"ramp\", from = 40, to = 75, over = \"10m\" }}\n\
             power_watts = {{ kind = \"bursts\", busy = 650, idle = 120, period = \"{period}s\", duty = 0.7 }}\nprocesses = 2\n",
        ));
        if setup.gpm {
            s.push_str(&format!(
                "[gpu.gpm]\nsm_active = {{ kind = \"bursts\", busy = 85, idle = 2, period = \"{period}s\", duty = 0.7 }}\n\
                 sm_occupancy = 40\ngraphics_active = 90\ntensor_active = 55\ndram_active = 45\nfp64_active = 1\n\
                 fp32_active = 12\nfp16_active = 30\ninteger_active = 5\npcie_tx_mib_per_second = 200\n\
                 pcie_rx_mib_per_second = 2000\nnvlink_tx_mib_per_second = 40000\nnvlink_rx_mib_per_second = 40000\n",
            ));
        }
    }
    s
}

/// The cost watch as a fleet runs it: AWS provider (metadata from `imds`), a price, a budget
/// and an idle rule, in dry run.
fn cost_config(imds: SocketAddr, state: &std::path::Path) -> String {
    format!(
        "[cloud]\nprovider = \"aws\"\nimds_endpoint = \"http://{imds}\"\nregion = \"us-east-1\"\n\
         endpoint_url = \"http://127.0.0.1:9\"\n\
         [actions]\nmode = \"dry-run\"\nstate_dir = \"{}\"\nwall = false\n\
         [cost]\nhourly_price_usd = 32.77\n\
         [[budgets]]\nname = \"team-gpu\"\nsource = \"local\"\nlimit_usd = 5000\nthresholds = [0.5, 0.8, 1.0]\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"5m\"\nevaluation_periods = 2\naction = \"stop\"\n",
        state.display()
    )
}

/// A loopback IMDSv2: a token, the instance's identity and one tag; 404 for the rest (no spot
/// notice). One request per connection.
fn imds() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // Headers, up to the blank line (IMDS requests carry no body).
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let body = match path.strip_prefix("/latest/meta-data/") {
                _ if path == "/latest/api/token" => Some("bench-token"),
                Some("instance-id") => Some("i-0123456789abcdef0"),
                Some("instance-type") => Some("p5.48xlarge"),
                Some("placement/availability-zone") => Some("us-east-1a"),
                Some("placement/region") => Some("us-east-1"),
                Some("instance-life-cycle") => Some("on-demand"),
                Some("tags/instance") => Some("team"),
                Some("tags/instance/team") => Some("ml"),
                _ => None,
            };
            let response = match body {
                Some(b) => format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                    b.len()
                ),
                None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string(),
            };
            let _ = conn.write_all(response.as_bytes());
        }
    });
    addr
}

fn proc_stat_cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command: state is field 3; utime 14, stime 15.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A "Name:  1234 kB" field of a /proc file, in KiB.
fn kib(file: &str, field: &str) -> u64 {
    file.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resident memory now, in KiB.
struct Memory {
    rss: u64,
    rss_anon: u64,
    rss_file: u64,
    /// smaps_rollup's `Anonymous`: pages not backed by a file, private or written.
    anonymous: u64,
}

fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Memory {
        rss: kib(&status, "VmRSS"),
        rss_anon: kib(&status, "RssAnon"),
        rss_file: kib(&status, "RssFile"),
        anonymous: kib(&rollup, "Anonymous"),
    }
}

fn clock_ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100.0)
}

/// One GET on a keep-alive connection; returns the body length.
fn scrape(conn: &mut BufReader<TcpStream>, addr: SocketAddr) -> usize {
    write!(
        conn.get_mut(),
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n"
    )
    .unwrap();
    let mut length = 0;
    loop {
        let mut line = String::new();
        conn.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body).unwrap();
    length
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this once quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let window: u64 = std::env::var("GPUWATCH_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 2 } else { 60 });
    // GPUWATCH_BENCH_GPUS=8 runs only the rows with that many GPUs.
    let only: Option<usize> = std::env::var("GPUWATCH_BENCH_GPUS")
        .ok()
        .and_then(|s| s.parse().ok());
    let mut setups = vec![Setup {
        gpus: 8,
        gpm: false,
        cost: false,
        bare: false,
    }];
    for gpus in [8, 64, 256] {
        for cost in [false, true] {
            setups.push(Setup {
                gpus,
                gpm: true,
                cost,
                bare: false,
            });
        }
    }
    setups.push(Setup {
        gpus: 8,
        gpm: true,
        cost: true,
        bare: true,
    });
    if quick {
        // A smoke run: the exporter and the whole cost watch, on 8 GPUs.
        setups.retain(|s| s.gpus == 8 && s.gpm && !s.bare);
    }
    let all_smi = std::env::var("GPUWATCH_BENCH_ALL_SMI").ok();
    let imds = imds();
    println!(
        "{:>4} {:>3} {:>4} {:>4}  {:>8} {:>8} {:>8} {:>8}  {:>9}  {:>7} {:>7} {:>7} {:>8}",
        "GPUs",
        "GPM",
        "cost",
        "env",
        "RSS MiB",
        "anon",
        "file",
        "smaps an",
        "CPU s/min",
        "p50 µs",
        "p99 µs",
        "max µs",
        "bytes"
    );
    let own = env!("CARGO_BIN_EXE_gpuwatch").to_string();
    let bins: Vec<String> = match std::env::var("GPUWATCH_BENCH_BIN") {
        Ok(list) => list
            .split(':')
            .filter(|b| !b.is_empty())
            .map(str::to_string)
            .collect(),
        Err(_) => vec![own.clone()],
    };
    assert!(!bins.is_empty(), "GPUWATCH_BENCH_BIN names no binary");
    for setup in setups
        .into_iter()
        .filter(|s| only.is_none_or(|n| n == s.gpus))
    {
        // all-smi exports what NVML reads, no GPM and no cost: it sits beside the exporter alone.
        let exporter_alone = !setup.gpm && !setup.cost && !setup.bare;
        for bin in &bins {
            if *bin != own {
                println!("      {bin}:");
            }
            run(
                bin,
                window,
                setup,
                imds,
                all_smi.as_deref().filter(|_| exporter_alone),
            );
        }
    }
}

/// The fake NVML library that cargo built beside the binary.
fn fake_library() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .parent()
        .unwrap();
    let lib = dir.join("libgpuwatch_fake_nvml.so");
    if lib.is_file() {
        lib
    } else {
        dir.join("deps/libgpuwatch_fake_nvml.so")
    }
}

/// Starts the daemon `bin` for `setup` (under `wrapper`, a command and its arguments, if any),
/// and waits for its first sample. Returns it, its address and its directory.
fn start(
    bin: &str,
    setup: Setup,
    imds: SocketAddr,
    wrapper: &[String],
) -> (Daemon, SocketAddr, tempfile::TempDir) {
    let lib = fake_library();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("scenario.toml"), scenario(setup)).unwrap();
    let config = dir.path().join("gpuwatch.toml");
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[nvml]\nlibrary = \"{}\"\n[sampling]\ninterval = \"1s\"\n",
        lib.display()
    );
    if setup.cost {
        text.push_str(&cost_config(imds, &dir.path().join("state")));
    }
    std::fs::write(&config, text).unwrap();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    if !setup.bare {
        command.envs(unit_environment());
    }
    let mut child = Daemon(
        command
            .args(["run", "--config"])
            .arg(&config)
            .env(
                "GPUWATCH_FAKE_NVML_SCENARIO",
                dir.path().join("scenario.toml"),
            )
            // The fake library counts every call by function.
            .env("GPUWATCH_FAKE_NVML_CALLS", dir.path().join("calls.txt"))
            // Nothing reaches the real metadata address or AWS.
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ACCESS_KEY_ID", "bench")
            .env("AWS_SECRET_ACCESS_KEY", "bench")
            .env("AWS_REGION", "us-east-1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin}: {e}")),
    );
    // The readiness line on stdout: "listening on http://ADDR/".
    let mut out = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let addr: SocketAddr = out
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("listening on http://")
                .and_then(|r| r.trim_end_matches('/').parse().ok())
        })
        .expect("gpuwatch did not start");
    std::thread::spawn(move || out.for_each(drop));

    // Wait for the first sample through the daemon's own long-poll.
    let first = get(addr, "/api/v1/snapshot?after=0&timeout=30s");
    assert!(first.contains("\"seq\":"), "{first}");
    (child, addr, dir)
}

/// Runs the daemon for `window` seconds, then scrapes it, and prints one row. With `all_smi`,
/// all-smi's exporter runs beside it over the same GPUs, both are scraped once a second
/// through the window, and both processes' memory at its end follows the row.
fn run(bin: &str, window: u64, setup: Setup, imds: SocketAddr, all_smi: Option<&str>) {
    let (child, addr, dir) = start(bin, setup, imds, &[]);
    let pid = child.0.id();
    let peer = all_smi.map(|program| start_all_smi(program, dir.path(), setup.gpus));

    let ticks = clock_ticks_per_second();
    let cpu0 = proc_stat_cpu_ticks(pid);
    let calls0 = nvml_calls(dir.path());
    let t0 = Instant::now();
    match &peer {
        None => std::thread::sleep(Duration::from_secs(window)),
        Some((_, peer_addr)) => {
            let mut conn = BufReader::new(TcpStream::connect(addr).unwrap());
            while t0.elapsed() < Duration::from_secs(window) {
                scrape(&mut conn, addr);
                get(*peer_addr, "/metrics");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    let beside = peer
        .as_ref()
        .map(|(smi, _)| (memory(pid), memory(smi.0.id())));
    let cpu1 = proc_stat_cpu_ticks(pid);
    let calls1 = nvml_calls(dir.path());
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu_secs = (cpu1 - cpu0) as f64 / ticks;

    let mut conn = BufReader::new(TcpStream::connect(addr).unwrap());
    conn.get_mut().set_nodelay(true).unwrap();
    let mut lat = Vec::with_capacity(SCRAPES);
    let mut bytes = 0;
    for _ in 0..SCRAPES {
        let s = Instant::now();
        bytes = scrape(&mut conn, addr);
        lat.push(s.elapsed());
    }
    lat.sort();
    // After the window and the scrapes: the steady state a Prometheus sees.
    let m = memory(pid);
    let mib = |k: u64| k as f64 / 1024.0;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{:>4} {:>3} {:>4} {:>4}  {:>8.1} {:>8.2} {:>8.1} {:>8.2}  {:>9.3}  {:>7.0} {:>7.0} {:>7.0} {:>8}",
        setup.gpus,
        if setup.gpm { "on" } else { "off" },
        if setup.cost { "on" } else { "off" },
        if setup.bare { "none" } else { "unit" },
        mib(m.rss),
        mib(m.rss_anon),
        mib(m.rss_file),
        mib(m.anonymous),
        cpu_secs / elapsed * 60.0,
        us(percentile(&lat, 0.50)),
        us(percentile(&lat, 0.99)),
        us(*lat.last().unwrap()),
        bytes
    );
    if let Some((gw, smi)) = beside {
        let describe = |m: &Memory| {
            format!(
                "{:.1} MiB resident, {:.2} MiB anonymous, {:.1} MiB file-backed",
                mib(m.rss),
                mib(m.rss_anon),
                mib(m.rss_file)
            )
        };
        let ratio = |a: u64, b: u64| a as f64 / b as f64;
        println!(
            "      beside all-smi, at the window's end: gpuwatch {}; all-smi {}",
            describe(&gw),
            describe(&smi)
        );
        println!(
            "      gpuwatch / all-smi: resident {:.2}, anonymous {:.2}, file-backed {:.2}",
            ratio(gw.rss, smi.rss),
            ratio(gw.rss_anon, smi.rss_anon),
            ratio(gw.rss_file, smi.rss_file)
        );
    }
    print_calls(&calls0, &calls1, setup.gpus, elapsed);
}

/// Starts all-smi's exporter over the scenario in `dir`, and waits until it serves `gpus` GPUs.
fn start_all_smi(program: &str, dir: &std::path::Path, gpus: usize) -> (Daemon, SocketAddr) {
    let bin = dir.join("all-smi-bin");
    let lib = dir.join("all-smi-lib");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    let lspci = bin.join("lspci");
    std::fs::write(
        &lspci,
        "#!/bin/sh\necho '00:1e.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)'\n",
    )
    .unwrap();
    std::fs::set_permissions(&lspci, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        std::os::unix::fs::symlink(fake_library(), lib.join(name)).unwrap();
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let smi = Daemon(
        Command::new(program)
            .args(["api", "--port", &port.to_string(), "--interval", "1"])
            .env("PATH", path)
            .env("LD_LIBRARY_PATH", &lib)
            .env("GPUWATCH_FAKE_NVML_SCENARIO", dir.join("scenario.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("GPUWATCH_BENCH_ALL_SMI={program}: {e}")),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // all-smi says nothing when it serves: ask until it answers with every GPU, or give up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = get(addr, "/metrics")
            .lines()
            .filter(|l| l.starts_with("all_smi_gpu_temperature_celsius{"))
            .count();
        if seen == gpus {
            return (smi, addr);
        }
        assert!(
            Instant::now() < deadline,
            "all-smi serves {seen} of the {gpus} GPUs after 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One GET on a connection of its own; the whole response, or nothing if nobody answers.
fn get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut c) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    let mut response = String::new();
    let _ = c.read_to_string(&mut response);
    response
}

/// The `Environment=` settings of the systemd unit.
fn unit_environment() -> Vec<(String, String)> {
    let unit = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/gpuwatch.service");
    std::fs::read_to_string(unit)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("Environment=")?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The daemon under test, killed when the row is done or the benchmark fails.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The fake library's call counts (`GPUWATCH_FAKE_NVML_CALLS`), by function, as last written
/// (it writes them at most once a second, so a window's counts are right to about a second).
fn nvml_calls(dir: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    gpuwatch_fake_nvml::calls::read(&dir.join("calls.txt"))
}

/// NVML calls per GPU per second over the window, and with `GPUWATCH_BENCH_CALLS` set, each
/// function's.
fn print_calls(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    gpus: usize,
    secs: f64,
) {
    let rate = |n: u64| n as f64 / gpus as f64 / secs;
    let made: Vec<(&String, u64)> = after
        .iter()
        .map(|(f, n)| (f, n - before.get(f).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let total: u64 = made.iter().map(|(_, n)| n).sum();
    println!(
        "      NVML: {:.1} calls per GPU per second, {} functions",
        rate(total),
        made.len()
    );
    if std::env::var_os("GPUWATCH_BENCH_CALLS").is_some() {
        for (f, n) in made {
            println!("        {f}: {:.2}", rate(n));
        }
    }
}
