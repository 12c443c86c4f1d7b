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
