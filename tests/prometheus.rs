//! A real Prometheus server (Debian's `prometheus`) scrapes the daemon over the fake GPUs, and
//! its query API returns the four `gpu_utilization_ratio` series with the scenario's values.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;

const SCENARIO: &str = r#"
time = { speed = 0 }
[[gpu]]
utilization = 11
[[gpu]]
utilization = 22
[[gpu]]
utilization = 33
[[gpu]]
utilization = 44
"#;

#[test]
fn prometheus_scrapes_the_four_gpus() {
    let d = Daemon::start(SCENARIO, "");
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpuwatch\n    static_configs:\n      - targets: ['{}']\n",
            d.addr
        ),
    )
    .unwrap();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus not found: scripts/test installs Debian's prometheus");
    let _prom = common::Killed(child);
    let addr = listen.parse().unwrap();

    // Prometheus answers only after it has started and scraped; poll its query API.
    let deadline = Instant::now() + Duration::from_secs(90);
    let result = loop {
        if let Ok(r) = common::try_get(addr, "/api/v1/query?query=gpu_utilization_ratio") {
            if r.status == 200 {
                let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
                if result.len() == 4 {
                    break result;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never returned 4 series"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut values: Vec<(String, String, f64)> = result
        .iter()
        .map(|s| {
            (
                s["metric"]["gpu"].as_str().unwrap().to_string(),
                s["metric"]["uuid"].as_str().unwrap().to_string(),
                s["value"][1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    values.sort_by(|a, b| a.0.cmp(&b.0));
    let want = [("0", 0.11), ("1", 0.22), ("2", 0.33), ("3", 0.44)];
    for ((gpu, uuid, v), (want_gpu, want_v)) in values.iter().zip(want) {
        assert_eq!(gpu, want_gpu);
        assert!(uuid.starts_with("GPU-"), "{uuid}");
        assert!((v - want_v).abs() < 1e-12, "gpu {gpu}: {v} != {want_v}");
    }
    let up = common::get(addr, "/api/v1/query?query=up%7Bjob%3D%22gpuwatch%22%7D");
    assert!(
        up.body.contains("\"value\":[") && up.body.contains(",\"1\"]"),
        "{}",
        up.body
    );
}
