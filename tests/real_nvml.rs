//! On a machine with a real NVIDIA GPU: `gpuwatch snapshot --json` agrees with `nvidia-smi`.
//!
//! Ignored by default; on a GPU machine run:
//!
//!     GPUWATCH_REAL_NVML=1 cargo test --release --test real_nvml -- --ignored --nocapture

use std::process::Command;

fn enabled() -> bool {
    std::env::var("GPUWATCH_REAL_NVML").as_deref() == Ok("1")
}

const FIELDS: &str = "index,uuid,name,pci.bus_id,memory.total,memory.used,power.limit,power.draw,temperature.gpu,utilization.gpu,clocks.sm,clocks.mem,driver_version";

#[test]
#[ignore = "needs a real NVIDIA GPU: GPUWATCH_REAL_NVML=1 ... -- --ignored"]
fn snapshot_agrees_with_nvidia_smi() {
    assert!(
        enabled(),
        "set GPUWATCH_REAL_NVML=1 to confirm this machine has an NVIDIA GPU and nvidia-smi"
    );
    let smi = Command::new("nvidia-smi")
        .arg(format!("--query-gpu={FIELDS}"))
        .arg("--format=csv,noheader,nounits")
        .output()
        .expect("nvidia-smi");
    assert!(smi.status.success());
    let smi = String::from_utf8(smi.stdout).unwrap();
    println!("nvidia-smi:\n{smi}");

    // Without /etc/gpuwatch/gpuwatch.toml this is the defaults: the system's libnvidia-ml.so.1.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["snapshot", "--json"])
        .output()
        .unwrap();
    let table = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .arg("snapshot")
        .output()
        .unwrap();
    println!(
        "gpuwatch snapshot:\n{}",
        String::from_utf8_lossy(&table.stdout)
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let rows: Vec<Vec<String>> = smi
        .lines()
        .map(|l| l.split(',').map(|c| c.trim().to_string()).collect())
        .collect();
    assert_eq!(snap["gpus"].as_array().unwrap().len(), rows.len());
    for row in rows {
        let i: usize = row[0].parse().unwrap();
        let g = &snap["gpus"][i];
        println!("gpu {i}: {g}");
        assert_eq!(g["uuid"], row[1]);
        assert_eq!(g["name"], row[2]);
        // nvidia-smi prints the bus id with an 8-digit domain, NVML with 8 or 4.
        assert!(
            row[3]
                .to_lowercase()
                .ends_with(&g["pci_bus_id"].as_str().unwrap().to_lowercase()[4..]),
            "{row:?}"
        );
        let mib = |b: &serde_json::Value| b.as_f64().unwrap() / 1024.0 / 1024.0;
        assert!((mib(&g["memory_total_bytes"]) - row[4].parse::<f64>().unwrap()).abs() <= 1.0);
        // Dynamic readings move between the two calls: compare loosely.
        assert!((mib(&g["memory_used_bytes"]) - row[5].parse::<f64>().unwrap()).abs() <= 2048.0);
        assert!(
            (g["power_limit_watts"].as_f64().unwrap() - row[6].parse::<f64>().unwrap()).abs()
                <= 1.0
        );
        assert!(
            (g["power_watts"].as_f64().unwrap() - row[7].parse::<f64>().unwrap()).abs() <= 100.0
        );
        assert!(
            (g["temperature_celsius"].as_f64().unwrap() - row[8].parse::<f64>().unwrap()).abs()
                <= 5.0
        );
        let util = g["utilization_ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&util));
        assert!(
            (g["sm_clock_hertz"].as_f64().unwrap() / 1e6 - row[10].parse::<f64>().unwrap()).abs()
                <= 500.0
        );
        assert!(
            (g["memory_clock_hertz"].as_f64().unwrap() / 1e6 - row[11].parse::<f64>().unwrap())
                .abs()
                <= 500.0
        );
        assert_eq!(snap["nvml"]["driver_version"], row[12]);
    }
}

/// On a Hopper or later GPU: gpuwatch's GPM SM activity agrees with `nvidia-smi dmon
/// --gpm-metrics` (SM activity, metric 2) within a few points. With `GPUWATCH_GPM_LOAD` set to a
/// command (a CUDA program that keeps the GPU busy), it runs while both measure; otherwise the
/// GPU is compared at rest.
#[test]
#[ignore = "needs a real Hopper GPU: GPUWATCH_REAL_NVML=1 ... -- --ignored"]
fn gpm_sm_activity_agrees_with_nvidia_smi_dmon() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    assert!(enabled(), "set GPUWATCH_REAL_NVML=1 on a GPU machine");
    let mut load = std::env::var("GPUWATCH_GPM_LOAD").ok().map(|cmd| {
        Command::new("sh")
            .args(["-c", &cmd])
            .spawn()
            .expect("start GPUWATCH_GPM_LOAD")
    });
    // The defaults: an empty config file (a device such as /dev/null is refused as a config).
    let empty = tempfile::NamedTempFile::new().unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .arg("run")
        .arg("--config")
        .arg(empty.path())
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(daemon.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("listening on "))
        .expect("gpuwatch listens");
    let addr = line
        .trim_start_matches("listening on http://")
        .trim_end_matches('/')
        .to_string();
    // Five seconds of dmon (one line a second per GPU), while gpuwatch samples every second.
    let dmon = Command::new("nvidia-smi")
        .args(["dmon", "--gpm-metrics", "2", "-c", "5"])
        .output()
        .expect("nvidia-smi dmon");
    let dmon = String::from_utf8_lossy(&dmon.stdout).into_owned();
    println!("nvidia-smi dmon --gpm-metrics 2:\n{dmon}");
    let started = Instant::now();
    let mut body = String::new();
    while started.elapsed() < Duration::from_secs(10) {
        let out = Command::new("curl")
            .args(["-s", &format!("http://{addr}/metrics")])
            .output()
            .unwrap();
        body = String::from_utf8_lossy(&out.stdout).into_owned();
        if body.contains("gpu_sm_active_ratio{") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    if let Some(l) = load.as_mut() {
        let _ = l.kill();
        let _ = l.wait();
    }
    let ours: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with("gpu_sm_active_ratio{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    println!("gpuwatch gpu_sm_active_ratio: {ours:?}");
    assert!(
        !ours.is_empty(),
        "no GPM SM activity from gpuwatch:\n{body}"
    );
    // dmon's rows: "gpu  smact ..." with the value in the second column, per GPU, per second.
    let theirs: Vec<f64> = dmon
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    assert!(!theirs.is_empty(), "no rows from dmon");
    let mean = theirs.iter().sum::<f64>() / theirs.len() as f64;
    let ours_mean = ours.iter().sum::<f64>() / ours.len() as f64 * 100.0;
    println!("SM activity: nvidia-smi {mean:.1}%, gpuwatch {ours_mean:.1}%");
    assert!(
        (mean - ours_mean).abs() <= 5.0,
        "nvidia-smi {mean:.1}% vs gpuwatch {ours_mean:.1}%"
    );
}

/// The health readings agree with `nvidia-smi --query-gpu`: where nvidia-smi says N/A, gpuwatch
/// has no value (it never makes one up), and where it has a number, gpuwatch's is the same.
#[test]
#[ignore = "needs a real NVIDIA GPU: GPUWATCH_REAL_NVML=1 ... -- --ignored"]
fn health_readings_agree_with_nvidia_smi() {
    assert!(
        enabled(),
        "set GPUWATCH_REAL_NVML=1 to confirm this machine has an NVIDIA GPU and nvidia-smi"
    );
    // nvidia-smi's field, gpuwatch's JSON path in a GPU's sample, the factor from nvidia-smi's
    // unit to gpuwatch's, and how far apart a moving reading may be.
    let mib = 1024.0 * 1024.0;
    let fields: &[(&str, &[&str], f64, f64)] = &[
        (
            "temperature.memory",
            &["memory_temperature_celsius"],
            1.0,
            5.0,
        ),
        (
            "memory.reserved",
            &["memory_reserved_bytes"],
            mib,
            1.0 * mib,
        ),
        (
            "pcie.link.gen.current",
            &["pcie_link", "generation"],
            1.0,
            0.0,
        ),
        (
            "pcie.link.gen.max",
            &["pcie_link", "max_generation"],
            1.0,
            0.0,
        ),
        ("pcie.link.width.current", &["pcie_link", "width"], 1.0, 0.0),
        ("pcie.link.width.max", &["pcie_link", "max_width"], 1.0, 0.0),
        (
            "utilization.encoder",
            &["encoder_utilization_ratio"],
            0.01,
            0.5,
        ),
        (
            "utilization.decoder",
            &["decoder_utilization_ratio"],
            0.01,
            0.5,
        ),
        (
            "remapped_rows.correctable",
            &["memory_repair", "remapped_correctable"],
            1.0,
            0.0,
        ),
        (
            "remapped_rows.uncorrectable",
            &["memory_repair", "remapped_uncorrectable"],
            1.0,
            0.0,
        ),
        (
            "retired_pages.single_bit_ecc.count",
            &["memory_repair", "retired_single_bit"],
            1.0,
            0.0,
        ),
        (
            "retired_pages.double_bit.count",
            &["memory_repair", "retired_double_bit"],
            1.0,
            0.0,
        ),
    ];
    let query: Vec<&str> = std::iter::once("index")
        .chain(fields.iter().map(|f| f.0))
        .collect();
    let smi = Command::new("nvidia-smi")
        .arg(format!("--query-gpu={}", query.join(",")))
        .arg("--format=csv,noheader,nounits")
        .output()
        .expect("nvidia-smi");
    let text = String::from_utf8_lossy(&smi.stdout).into_owned();
    println!("nvidia-smi --query-gpu={}:\n{text}", query.join(","));
    assert!(
        smi.status.success(),
        "{}",
        String::from_utf8_lossy(&smi.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["snapshot", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for line in text.lines() {
        let row: Vec<&str> = line.split(',').map(str::trim).collect();
        let i: usize = row[0].parse().unwrap();
        let g = &snap["gpus"][i];
        for (n, (name, path, factor, slack)) in fields.iter().enumerate() {
            let ours = path.iter().fold(g, |v, k| &v[*k]);
            let theirs = row[n + 1];
            println!("gpu {i} {name}: nvidia-smi {theirs}, gpuwatch {ours}");
            match theirs.parse::<f64>() {
                Ok(v) => {
                    let ours = ours
                        .as_f64()
                        .unwrap_or_else(|| panic!("gpu {i} {name}: nvidia-smi {v}, gpuwatch none"));
                    assert!(
                        (ours - v * factor).abs() <= *slack,
                        "gpu {i} {name}: nvidia-smi {v}, gpuwatch {ours}"
                    );
                }
                // "[N/A]" or "[Not Supported]": gpuwatch has no value either.
                Err(_) => assert!(ours.is_null(), "gpu {i} {name}: {theirs} vs {ours}"),
            }
        }
    }
}
