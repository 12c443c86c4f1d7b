//! Resource benchmark: `gpuwatch run` over 8 fake GPUs at a 1 s interval, with GPM off (GPUs
//! without it) and on (Hopper GPUs, 13 GPM metrics each, two sample buffers per GPU), side by side.
//!
//!     cargo bench --bench exporter                      # 60 s window
//!     GPUWATCH_BENCH_SECS=10 cargo bench --bench exporter
//!
//! Prints resident memory after the window, CPU time per minute over the window (from
//! /proc/PID/stat), and the latency of 1,000 sequential scrapes over one keep-alive connection
//! (p50, p99, max). Figures, not assertions: the machine may be shared.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GPUS: usize = 8;
const SCRAPES: usize = 1000;

fn scenario(gpm: bool) -> String {
    let mut s = String::from("driver_version = \"550.54.15\"\n");
    for i in 0..GPUS {
        s.push_str(&format!(
            "[[gpu]]\nutilization = {{ kind = \"bursts\", busy = 95, idle = 5, period = \"{}s\", duty = 0.7 }}\n\
             memory_used_mib = 60000\ntemperature = {{ kind = \"ramp\", from = 40, to = 75, over = \"10m\" }}\n\
             power_watts = {{ kind = \"bursts\", busy = 650, idle = 120, period = \"{}s\", duty = 0.7 }}\nprocesses = 2\n",
            30 + i,
            30 + i
        ));
        if gpm {
            s.push_str(&format!(
                "[gpu.gpm]\nsm_active = {{ kind = \"bursts\", busy = 85, idle = 2, period = \"{}s\", duty = 0.7 }}\n\
                 sm_occupancy = 40\ngraphics_active = 90\ntensor_active = 55\ndram_active = 45\nfp64_active = 1\n\
                 fp32_active = 12\nfp16_active = 30\ninteger_active = 5\npcie_tx_mib_per_second = 200\n\
                 pcie_rx_mib_per_second = 2000\nnvlink_tx_mib_per_second = 40000\nnvlink_rx_mib_per_second = 40000\n",
                30 + i
            ));
        }
    }
    s
}

fn proc_stat_cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command: state is field 3; utime 14, stime 15.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
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
    for gpm in [false, true] {
        run(window, gpm);
    }
}

/// Runs the daemon for `window` seconds, then scrapes it, and prints the figures.
fn run(window: u64, gpm: bool) {
    let bin = env!("CARGO_BIN_EXE_gpuwatch");
    let lib = std::path::Path::new(bin)
        .parent()
        .unwrap()
        .join("libgpuwatch_fake_nvml.so");
    let lib = if lib.is_file() {
        lib
    } else {
        std::path::Path::new(bin)
            .parent()
            .unwrap()
            .join("deps/libgpuwatch_fake_nvml.so")
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("scenario.toml"), scenario(gpm)).unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[nvml]\nlibrary = \"{}\"\n[sampling]\ninterval = \"1s\"\n",
            lib.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&config)
        .env(
            "GPUWATCH_FAKE_NVML_SCENARIO",
            dir.path().join("scenario.toml"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The readiness line on stdout: "listening on http://ADDR/".
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
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
    let mut c = TcpStream::connect(addr).unwrap();
    write!(c, "GET /api/v1/snapshot?after=0&timeout=30s HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut first = String::new();
    c.read_to_string(&mut first).unwrap();
    assert!(first.contains("\"seq\":"), "{first}");

    let ticks = clock_ticks_per_second();
    let cpu0 = proc_stat_cpu_ticks(pid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(window));
    let cpu1 = proc_stat_cpu_ticks(pid);
    let elapsed = t0.elapsed().as_secs_f64();
    let rss_idle = rss_kib(pid);
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
    let rss_after = rss_kib(pid);

    println!(
        "gpuwatch run, {GPUS} fake GPUs, GPM {}, 1 s interval, {elapsed:.0} s window",
        if gpm { "on" } else { "off" }
    );
    println!(
        "  resident memory after {elapsed:.0} s: {:.1} MiB",
        rss_idle as f64 / 1024.0
    );
    println!(
        "  CPU time: {:.3} s per minute ({:.3}% of one core)",
        cpu_secs / elapsed * 60.0,
        cpu_secs / elapsed * 100.0
    );
    println!(
        "  {SCRAPES} sequential scrapes of {bytes} bytes: p50 {:.0} us, p99 {:.0} us, max {:.0} us",
        percentile(&lat, 0.50).as_secs_f64() * 1e6,
        percentile(&lat, 0.99).as_secs_f64() * 1e6,
        lat.last().unwrap().as_secs_f64() * 1e6
    );
    println!(
        "  resident memory after the scrapes: {:.1} MiB",
        rss_after as f64 / 1024.0
    );

    let _ = child.kill();
    let _ = child.wait();
}
