//! End to end: the `gpuwatch` binary reads the fake `libnvidia-ml.so.1` through nvml-wrapper and
//! serves what the scenario says, in Prometheus units.

mod common;

use std::time::{Duration, Instant};

use common::{metric, Daemon};

/// Four GPUs with time frozen at one hour, so every value is known exactly.
const FROZEN: &str = r#"
driver_version = "550.90.07"
cuda_driver_version = 12040
time = { speed = 0, start = "1h" }

[[gpu]]
uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
memory_total_mib = 81559
power_limit_watts = 700
utilization = 37
memory_utilization = 12
memory_used_mib = 20480
temperature = 54
power_watts = 312.5
sm_clock_mhz = 1755
memory_clock_mhz = 2619
processes = 2
ecc_corrected = 3
ecc_uncorrected = 1
throttle_active = ["sw_power_cap"]

[[gpu]]
uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
utilization = { kind = "ramp", from = 10, to = 90, over = "2h" }
memory_used_mib = { kind = "ramp", from = 0, to = 4096, over = "2h" }
power_watts = { kind = "ramp", from = 100, to = 500, over = "2h" }
temperature = { kind = "ramp", from = 30, to = 80, over = "2h" }

[[gpu]]
uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000002"
name = "NVIDIA A10G"
memory_total_mib = 23028
power_limit_watts = 300
utilization = { kind = "bursts", busy = 90, idle = 10, period = "1000s", duty = 0.5 }
power_watts = { kind = "bursts", busy = 250, idle = 50, period = "1000s", duty = 0.5 }
sm_clock_mhz = 1710
memory_clock_mhz = 6251
processes = 5
throttle_supported = ["gpu_idle", "hw_slowdown"]
throttle_active = ["gpu_idle"]

[[gpu]]
uuid = "GPU-aaaaaaaa-0000-4000-8000-000000000003"
utilization = { kind = "trace", file = "util.csv" }
power_watts = 75.25
"#;

const UTIL_CSV: &str = "seconds,utilization\n0,0\n3000,20\n4200,60\n";

fn frozen(extra: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("util.csv"), UTIL_CSV).unwrap();
    Daemon::start_in(dir, FROZEN, extra)
}

const MIB: f64 = 1024.0 * 1024.0;

#[test]
fn every_value_matches_the_scenario_in_prometheus_units() {
    let d = frozen("");
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    let s = d.scrape();

    // Utilization: percent in NVML, ratio here. GPU 1 is half-way up its ramp; GPU 2 is in the
    // idle part of its burst (600 s into a 1000 s period, duty 0.5); GPU 3 interpolates its trace.
    for (gpu, util) in [(0, 0.37), (1, 0.50), (2, 0.10), (3, 0.40)] {
        metric("gpu_utilization_ratio")
            .gpu(gpu)
            .value(util)
            .assert_in(&s);
        metric("gpu_up").gpu(gpu).value(1.0).assert_in(&s);
    }
    metric("gpu_memory_utilization_ratio")
        .gpu(0)
        .value(0.12)
        .assert_in(&s);

    // Memory: MiB in the scenario, bytes here.
    metric("gpu_memory_used_bytes")
        .gpu(0)
        .value(20480.0 * MIB)
        .assert_in(&s);
    metric("gpu_memory_total_bytes")
        .gpu(0)
        .value(81559.0 * MIB)
        .assert_in(&s);
    metric("gpu_memory_free_bytes")
        .gpu(0)
        .value((81559.0 - 20480.0) * MIB)
        .assert_in(&s);
    metric("gpu_memory_used_bytes")
        .gpu(1)
        .value(2048.0 * MIB)
        .assert_in(&s);
    metric("gpu_memory_total_bytes")
        .gpu(2)
        .value(23028.0 * MIB)
        .assert_in(&s);

    metric("gpu_temperature_celsius")
        .gpu(0)
        .value(54.0)
        .assert_in(&s);
    metric("gpu_temperature_celsius")
        .gpu(1)
        .value(55.0)
        .assert_in(&s);

    // Power: milliwatts in NVML, watts here.
    metric("gpu_power_watts").gpu(0).value(312.5).assert_in(&s);
    metric("gpu_power_watts").gpu(1).value(300.0).assert_in(&s);
    metric("gpu_power_watts").gpu(2).value(50.0).assert_in(&s);
    metric("gpu_power_watts").gpu(3).value(75.25).assert_in(&s);
    metric("gpu_power_limit_watts")
        .gpu(0)
        .value(700.0)
        .assert_in(&s);
    metric("gpu_power_limit_watts")
        .gpu(2)
        .value(300.0)
        .assert_in(&s);

    // Energy: millijoules in NVML, joules here; the integral of power over the first hour.
    metric("gpu_energy_joules_total")
        .gpu(0)
        .value(312.5 * 3600.0)
        .assert_in(&s);
    metric("gpu_energy_joules_total")
        .gpu(1)
        .value(720_000.0)
        .assert_in(&s);
    metric("gpu_energy_joules_total")
        .gpu(2)
        .value(580_000.0)
        .assert_in(&s);
    metric("gpu_energy_joules_total")
        .gpu(3)
        .value(75.25 * 3600.0)
        .assert_in(&s);

    // Clocks: MHz in NVML, hertz here.
    metric("gpu_clock_hertz")
        .gpu(0)
        .label("clock", "sm")
        .value(1.755e9)
        .assert_in(&s);
    metric("gpu_clock_hertz")
        .gpu(0)
        .label("clock", "memory")
        .value(2.619e9)
        .assert_in(&s);
    metric("gpu_clock_hertz")
        .gpu(2)
        .label("clock", "sm")
        .value(1.710e9)
        .assert_in(&s);
    metric("gpu_clock_hertz")
        .gpu(2)
        .label("clock", "memory")
        .value(6.251e9)
        .assert_in(&s);

    metric("gpu_processes").gpu(0).value(2.0).assert_in(&s);
    metric("gpu_processes").gpu(1).value(0.0).assert_in(&s);
    metric("gpu_processes").gpu(2).value(5.0).assert_in(&s);
    metric("gpu_process_memory_used_bytes")
        .absent()
        .assert_in(&s);

    metric("gpu_ecc_errors_total")
        .gpu(0)
        .label("kind", "corrected")
        .value(3.0)
        .assert_in(&s);
    metric("gpu_ecc_errors_total")
        .gpu(0)
        .label("kind", "uncorrected")
        .value(1.0)
        .assert_in(&s);

    // Throttle reasons: one series per supported reason.
    assert_eq!(
        s.named("gpu_clock_throttle_active")
            .iter()
            .filter(|x| x.labels["gpu"] == "0")
            .count(),
        9
    );
    metric("gpu_clock_throttle_active")
        .gpu(0)
        .label("reason", "sw_power_cap")
        .value(1.0)
        .assert_in(&s);
    metric("gpu_clock_throttle_active")
        .gpu(0)
        .label("reason", "gpu_idle")
        .value(0.0)
        .assert_in(&s);
    assert_eq!(
        s.named("gpu_clock_throttle_active")
            .iter()
            .filter(|x| x.labels["gpu"] == "2")
            .count(),
        2
    );
    metric("gpu_clock_throttle_active")
        .gpu(2)
        .label("reason", "gpu_idle")
        .value(1.0)
        .assert_in(&s);
    metric("gpu_clock_throttle_active")
        .gpu(2)
        .label("reason", "hw_slowdown")
        .value(0.0)
        .assert_in(&s);

    // Identity and the daemon's own series.
    metric("gpu_info")
        .gpu(2)
        .label("uuid", "GPU-aaaaaaaa-0000-4000-8000-000000000002")
        .label("name", "NVIDIA A10G")
        .label("pci_bus_id", "00000000:38:00.0")
        .value(1.0)
        .assert_in(&s);
    metric("gpuwatch_gpus").value(4.0).assert_in(&s);
    metric("gpuwatch_nvml_up").value(1.0).assert_in(&s);
    metric("gpuwatch_nvml_info")
        .label("driver_version", "550.90.07")
        .label("nvml_version", "12.550.90.07")
        .label("cuda_driver_version", "12.4")
        .value(1.0)
        .assert_in(&s);
    for kind in [
        "gpu_lost",
        "read_failed",
        "out_of_range",
        "timeout",
        "nvml_init",
    ] {
        metric("gpuwatch_sample_errors_total")
            .label("kind", kind)
            .value(0.0)
            .assert_in(&s);
    }
    // Every GPU series carries gpu and uuid.
    for series in s.series.iter().filter(|x| x.name.starts_with("gpu_")) {
        assert!(
            series.labels.contains_key("gpu") && series.labels.contains_key("uuid"),
            "{series:?}"
        );
    }
}

#[test]
fn per_process_memory_when_switched_on() {
    let d = frozen("[sampling]\nper_process_memory = true\n");
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    let s = d.scrape();
    for pid in [10000, 10001] {
        metric("gpu_process_memory_used_bytes")
            .gpu(0)
            .label("pid", pid)
            .label("process", "python3")
            .value(10240.0 * MIB)
            .assert_in(&s);
    }
    assert_eq!(s.named("gpu_process_memory_used_bytes").len(), 2 + 5);
    metric("gpu_processes").gpu(2).value(5.0).assert_in(&s);
}

#[test]
fn unknown_is_absent_never_zero() {
    let scenario = r#"
time = { speed = 0 }
[[gpu]]
utilization = 4294967295
memory_utilization = 150
temperature = 4294967295
[[gpu]]
utilization = 20
[[fault]]
at = "0s"
gpu = 1
kind = "not_supported"
fields = ["power", "temperature", "ecc", "clocks"]
"#;
    let d = Daemon::start(scenario, "");
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    let s = d.scrape();
    metric("gpu_utilization_ratio")
        .gpu(0)
        .absent()
        .assert_in(&s);
    metric("gpu_memory_utilization_ratio")
        .gpu(0)
        .absent()
        .assert_in(&s);
    metric("gpu_temperature_celsius")
        .gpu(0)
        .absent()
        .assert_in(&s);
    metric("gpu_power_watts").gpu(0).value(70.0).assert_in(&s);
    metric("gpu_up").gpu(0).value(1.0).assert_in(&s);
    assert!(
        metric("gpuwatch_sample_errors_total")
            .label("kind", "out_of_range")
            .get(&s)
            .unwrap()
            >= 3.0
    );

    // Not supported: absent, and not counted as an error.
    metric("gpu_utilization_ratio")
        .gpu(1)
        .value(0.2)
        .assert_in(&s);
    for name in [
        "gpu_power_watts",
        "gpu_temperature_celsius",
        "gpu_ecc_errors_total",
        "gpu_clock_hertz",
    ] {
        metric(name).gpu(1).absent().assert_in(&s);
    }
    metric("gpuwatch_sample_errors_total")
        .label("kind", "read_failed")
        .value(0.0)
        .assert_in(&s);
    assert!(d.log().contains("out-of-range"), "{}", d.log());
}

#[test]
fn a_lost_gpu_goes_down_alone_and_comes_back() {
    // Ten simulated seconds per second: GPU 1 is lost from 1 s to 4 s of wall time.
    let scenario = r#"
time = { speed = 10 }
[[gpu]]
utilization = 50
[[gpu]]
utilization = 60
[[gpu]]
utilization = 70
[[fault]]
at = "10s"
until = "40s"
gpu = 1
kind = "lost"
"#;
    let d = Daemon::start(scenario, "[sampling]\ninterval = \"100ms\"\n");
    let lost = d.await_sample(Duration::from_secs(20), |s| s["gpus"][1]["up"] == false);
    assert_eq!(lost["gpus"][0]["up"], true);
    assert_eq!(lost["gpus"][2]["up"], true);
    let s = d.scrape();
    metric("gpu_up")
        .gpu(1)
        .label("uuid", "GPU-00000000-0000-4000-8000-000000000002")
        .value(0.0)
        .assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(1)
        .absent()
        .assert_in(&s);
    // Its identity was read before the loss: it keeps `gpu_info`.
    metric("gpu_info")
        .gpu(1)
        .label("uuid", "GPU-00000000-0000-4000-8000-000000000002")
        .label("pci_bus_id", "00000000:28:00.0")
        .value(1.0)
        .assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(0)
        .value(0.5)
        .assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(2)
        .value(0.7)
        .assert_in(&s);
    metric("gpuwatch_gpus").value(3.0).assert_in(&s);
    assert!(
        metric("gpuwatch_sample_errors_total")
            .label("kind", "gpu_lost")
            .get(&s)
            .unwrap()
            >= 1.0
    );

    d.await_sample(Duration::from_secs(20), |s| s["gpus"][1]["up"] == true);
    let s = d.scrape();
    metric("gpu_up").gpu(1).value(1.0).assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(1)
        .value(0.6)
        .assert_in(&s);
}

#[test]
fn missing_library_serves_nvml_down_and_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_with(
        dir,
        "[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n[sampling]\ninterval = \"100ms\"\n",
    );
    let first = d.await_sample(Duration::from_secs(20), |s| s["seq"].as_u64() >= Some(1));
    assert_eq!(first["nvml"]["up"], false);
    // Several more cycles pass, with the library still missing.
    d.await_sample(Duration::from_secs(20), |s| s["seq"].as_u64() >= Some(5));
    let s = d.scrape();
    metric("gpuwatch_nvml_up").value(0.0).assert_in(&s);
    assert!(
        s.series.iter().all(|x| !x.name.starts_with("gpu_")),
        "{}",
        s.text
    );
    assert!(
        metric("gpuwatch_sample_errors_total")
            .label("kind", "nvml_init")
            .get(&s)
            .unwrap()
            >= 1.0
    );
    assert_eq!(d.get("/-/healthy").status, 200);
    assert_eq!(d.get("/-/ready").status, 200);
    assert!(d.is_running());
    // One clear line, naming the file, not one per retry.
    let log = d.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("NVML unavailable"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("\"/nonexistent/libnvidia-ml.so.1\""),
        "{}",
        lines[0]
    );
}

/// A library that reports a million devices is not believed: the sampler would allocate and
/// read without bound. NVML counts as down, with the reason, and the daemon serves on.
#[test]
fn a_device_count_past_any_machine_is_nvml_down() {
    let mut d = Daemon::start("device_count = 1000000\n[[gpu]]\nutilization = 50\n", "");
    let s = d.await_sample(Duration::from_secs(20), |s| s["seq"].as_u64() >= Some(2));
    assert_eq!(s["nvml"]["up"], false, "{s}");
    assert!(
        s["nvml"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("reports 1000000 devices, more than the 1024")),
        "{s}"
    );
    assert_eq!(s["gpus"].as_array().map(Vec::len), Some(0), "{s}");
    let m = d.scrape();
    metric("gpuwatch_nvml_up").value(0.0).assert_in(&m);
    assert!(d.is_running());
}

#[test]
fn a_library_that_fails_to_initialise_is_retried_until_it_works() {
    let scenario = r#"
[[gpu]]
utilization = 25
[[fault]]
at = "0s"
until = "1500ms"
kind = "init_failure"
"#;
    let d = Daemon::start(scenario, "[sampling]\ninterval = \"100ms\"\n");
    let first = d.await_sample(Duration::from_secs(20), |s| s["seq"].as_u64() >= Some(1));
    assert_eq!(first["nvml"]["up"], false);
    assert!(
        first["nvml"]["error"]
            .as_str()
            .unwrap()
            .contains("not loaded"),
        "{first}"
    );
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    let s = d.scrape();
    metric("gpuwatch_nvml_up").value(1.0).assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(0)
        .value(0.25)
        .assert_in(&s);
    assert!(
        metric("gpuwatch_sample_errors_total")
            .label("kind", "nvml_init")
            .get(&s)
            .unwrap()
            >= 1.0
    );
}

#[test]
fn a_hung_nvml_call_leaves_scrapes_answering() {
    // From 1 s on, every call for GPU 0 takes 30 s; the cycle timeout is 300 ms.
    let scenario = r#"
[[gpu]]
utilization = 10
[[gpu]]
utilization = 20
[[fault]]
at = "1s"
gpu = 0
kind = "delay"
delay = "30s"
"#;
    let d = Daemon::start(
        scenario,
        "[sampling]\ninterval = \"100ms\"\ntimeout = \"300ms\"\n",
    );
    let before = d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    // Await samples until none comes within 3 s: the sampler is stuck in NVML.
    let mut seq = before["seq"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = d.get(&format!("/api/v1/snapshot?after={seq}&timeout=3s"));
        assert_eq!(r.status, 200);
        let snap: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        let next = snap["seq"].as_u64().unwrap();
        if next == seq {
            break;
        }
        seq = next;
        assert!(Instant::now() < deadline, "sampling never stalled");
    }

    let started = Instant::now();
    let s = d.scrape();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "a scrape took {took:?} while NVML hangs"
    );
    assert!(
        metric("gpuwatch_sample_errors_total")
            .label("kind", "timeout")
            .get(&s)
            .unwrap()
            >= 1.0
    );
    // The last complete snapshot is still served.
    metric("gpu_utilization_ratio")
        .gpu(1)
        .value(0.2)
        .assert_in(&s);
    assert_eq!(d.get("/-/healthy").status, 200);
    assert!(d.log().contains("overran its timeout"), "{}", d.log());
}

#[test]
fn xid_events_are_counted_per_gpu_and_code() {
    let scenario = r#"
[[gpu]]
[[gpu]]
[[gpu]]
[[fault]]
at = "300ms"
gpu = 2
kind = "xid"
xid = 79
[[fault]]
at = "600ms"
gpu = 0
kind = "xid"
xid = 48
[[fault]]
at = "700ms"
gpu = 0
kind = "xid"
xid = 48
"#;
    let d = Daemon::start(scenario, "[sampling]\ninterval = \"100ms\"\n");
    d.await_sample(Duration::from_secs(20), |s| {
        s["gpus"][2]["xid_errors"]["79"] == 1 && s["gpus"][0]["xid_errors"]["48"] == 2
    });
    let s = d.scrape();
    metric("gpu_xid_errors_total")
        .gpu(2)
        .label("xid", 79)
        .value(1.0)
        .assert_in(&s);
    metric("gpu_xid_errors_total")
        .gpu(0)
        .label("xid", 48)
        .value(2.0)
        .assert_in(&s);
    assert_eq!(s.named("gpu_xid_errors_total").len(), 2, "{}", s.text);
}

#[test]
fn endpoints_and_content_type() {
    let d = frozen("");
    // Ready comes with the first sample.
    d.await_sample(Duration::from_secs(20), |s| s["seq"].as_u64() >= Some(1));
    assert_eq!(d.get("/-/ready").status, 200);
    assert_eq!(d.get("/-/healthy").status, 200);
    let m = d.get("/metrics");
    assert!(
        m.headers
            .contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{}",
        m.headers
    );
    assert!(m.body.ends_with("# EOF\n"));
    let landing = d.get("/");
    assert_eq!(landing.status, 200);
    // The status page links the metrics relative to itself (it may sit behind a path prefix).
    assert!(
        landing.body.contains("href=\"metrics\""),
        "{}",
        landing.body
    );
    assert_eq!(d.get("/nope").status, 404);
    assert_eq!(d.get("/api/v1/snapshot?after=0&timeout=soon").status, 400);
    // A duration whose arithmetic once panicked the handler (the client got no answer).
    let huge = d.get("/api/v1/snapshot?after=0&timeout=18446744073709551615s1000000000ns");
    assert_eq!(huge.status, 400, "{}", huge.body);
}

/// Each identity field is kept the moment it is read: a GPU that falls off the bus after its
/// identity calls, in its very first cycle, keeps its UUID and `gpu_info`. A GPU whose identity
/// was never read carries `gpu` only, never an empty `uuid=""`.
#[test]
fn a_gpu_lost_in_its_first_cycle_keeps_the_identity_it_had_read() {
    let scenario = r#"
[[gpu]]
utilization = 50
[[gpu]]
name = "NVIDIA H200"
[[gpu]]
[[fault]]
at = "0s"
gpu = 1
kind = "lost"
fields = ["utilization", "memory", "temperature", "power", "power_limit", "energy", "clocks", "throttle", "ecc", "processes"]
[[fault]]
at = "0s"
gpu = 2
kind = "lost"
"#;
    let d = Daemon::start(scenario, "[sampling]\ninterval = \"100ms\"\n");
    let first = d.await_sample(Duration::from_secs(20), |s| s["seq"].as_u64() >= Some(1));
    assert_eq!(first["gpus"][1]["up"], false, "{first}");
    assert_eq!(first["gpus"][2]["up"], false, "{first}");
    let s = d.scrape();
    let uuid = "GPU-00000000-0000-4000-8000-000000000002";
    metric("gpu_up")
        .gpu(1)
        .label("uuid", uuid)
        .value(0.0)
        .assert_in(&s);
    metric("gpu_info")
        .gpu(1)
        .label("uuid", uuid)
        .label("name", "NVIDIA H200")
        .value(1.0)
        .assert_in(&s);
    let never_read: Vec<_> = s
        .series
        .iter()
        .filter(|x| x.labels.get("gpu").map(String::as_str) == Some("2"))
        .collect();
    assert!(!never_read.is_empty(), "{}", s.text);
    for x in &never_read {
        assert!(!x.labels.contains_key("uuid"), "{}: {:?}", x.name, x.labels);
        assert_ne!(x.name, "gpu_info");
    }
    metric("gpu_up").gpu(2).value(0.0).assert_in(&s);
    assert!(!s.text.contains("uuid=\"\""), "{}", s.text);
    common::assert_promtool_accepts(&s.text);
}

/// Off EC2, `[node] labels` still label `gpuwatch_node_info`, so a fleet of bare-metal nodes sums
/// by team too; the instance's own labels are absent, not empty.
#[test]
fn static_node_labels_without_a_cloud() {
    let d = Daemon::start(
        "[[gpu]]\nutilization = 5\n",
        "[node]\nlabels = { team = \"ml\", project = \"llm\" }\n",
    );
    let s = d.await_scrape(Duration::from_secs(20), |s| {
        !s.named("gpuwatch_node_info").is_empty()
    });
    let info = s.named("gpuwatch_node_info");
    assert_eq!(info.len(), 1);
    let labels: Vec<(&str, &str)> = info[0]
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(labels, [("project", "llm"), ("team", "ml")]);
    assert_eq!(info[0].value, 1.0);
}

/// The video engines and PCIe replays, and a reading a GPU does not support: absent (never
/// 0), said once in `gpu_reading_unsupported`, and not asked again, even once NVML would answer.
#[test]
fn a_reading_the_gpu_lacks_is_absent_said_once_and_not_asked_again() {
    let scenario = r#"
[[gpu]]
encoder_utilization = 30
decoder_utilization = 5
pcie_replays = { kind = "ramp", from = 0, to = 600, over = "10m" }
pcie_link_width = 4
[[gpu]]
encoder_utilization = 40
pcie_replays = 7
[[gpu]]
encoder_utilization = 150
[[fault]]
at = "0s"
until = "2s"
gpu = 1
kind = "not_supported"
fields = ["encoder", "pcie_replays", "pcie_link"]
"#;
    let d = Daemon::start(scenario, "");
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    // Past the fault's end: GPU 1 would answer now, and is not asked.
    let sample = d.await_sample(Duration::from_secs(20), |s| {
        s["gpus"][0]["pcie_replays"]
            .as_u64()
            .is_some_and(|n| n >= 4)
    });
    // Page retirement too: the fake plays Hopper GPUs, which remap rows instead.
    assert_eq!(
        sample["gpus"][1]["unsupported"],
        serde_json::json!([
            "encoder_utilization",
            "pcie_link",
            "pcie_replays",
            "retired_pages"
        ])
    );
    let s = d.scrape();
    metric("gpu_encoder_utilization_ratio")
        .gpu(0)
        .value(0.3)
        .assert_in(&s);
    metric("gpu_decoder_utilization_ratio")
        .gpu(0)
        .value(0.05)
        .assert_in(&s);
    assert!(metric("gpu_pcie_replays_total").gpu(0).get(&s).unwrap() >= 4.0);
    // A link that trained down to x4 of its 16 lanes, at its full generation.
    for (name, which, want) in [
        ("gpu_pcie_link_width", "current", 4.0),
        ("gpu_pcie_link_width", "max", 16.0),
        ("gpu_pcie_link_generation", "current", 5.0),
        ("gpu_pcie_link_generation", "max", 5.0),
    ] {
        metric(name)
            .gpu(0)
            .label("which", which)
            .value(want)
            .assert_in(&s);
    }
    for name in [
        "gpu_encoder_utilization_ratio",
        "gpu_pcie_replays_total",
        "gpu_pcie_link_width",
        "gpu_pcie_link_generation",
    ] {
        metric(name).gpu(1).absent().assert_in(&s);
    }
    // What GPU 1 does support is read as ever.
    metric("gpu_decoder_utilization_ratio")
        .gpu(1)
        .value(0.0)
        .assert_in(&s);
    for reading in ["encoder_utilization", "pcie_link", "pcie_replays"] {
        metric("gpu_reading_unsupported")
            .gpu(1)
            .label("reading", reading)
            .value(1.0)
            .assert_in(&s);
    }
    // And each GPU's page retirement.
    assert_eq!(s.named("gpu_reading_unsupported").len(), 3 + 3);
    // Out of range is not "unsupported": absent and counted as bad data.
    metric("gpu_encoder_utilization_ratio")
        .gpu(2)
        .absent()
        .assert_in(&s);
    assert!(
        metric("gpuwatch_sample_errors_total")
            .label("kind", "out_of_range")
            .get(&s)
            .unwrap()
            >= 1.0
    );
}

/// The health readings, in both naming modes: memory temperature and reserved memory, row
/// remapping, retired pages on a GPU that retires them, time held down by reason, and NVLink.
/// A field the GPU lacks is absent and said once; one that fails is absent and counted; the
/// others of the same call still read.
#[test]
fn health_readings_under_both_names() {
    let scenario = r#"
[[gpu]]
memory_temperature = 61
memory_reserved_mib = 571
remapped_rows_correctable = 3
remapped_rows_uncorrectable = 1
row_remap_pending = 1
nvlink_tx_kib = 2048
nvlink_rx_kib = 1024
clock_event_seconds = { power = 12.5, thermal = 3 }
nvlink_errors = { crc_flit = 2, replay = 9 }
[[gpu]]
name = "Tesla V100-SXM2-16GB"
memory_total_mib = 16384
nvlink_links = 0
retired_pages = { single_bit = 4, double_bit = 1, pending = 1 }
row_remap_failed = 1
[[fault]]
at = "0s"
gpu = 1
kind = "not_supported"
fields = ["remapped_rows", "memory_temperature"]
[[fault]]
at = "0s"
gpu = 0
kind = "fails"
fields = ["clock_events"]
"#;
    let d = Daemon::start(scenario, "[exposition]\nnames = \"both\"\n");
    let sample = d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    assert_eq!(
        sample["gpus"][1]["unsupported"],
        serde_json::json!([
            "memory_temperature",
            "nvlink_crc_data_errors",
            "nvlink_crc_flit_errors",
            "nvlink_recovery_errors",
            "nvlink_replay_errors",
            "nvlink_rx_bytes",
            "nvlink_tx_bytes",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "row_remap_failed",
            "row_remap_pending"
        ])
    );
    assert_eq!(
        sample["gpus"][0]["unsupported"],
        serde_json::json!(["retired_pages"])
    );
    let s = d.scrape();
    let mib = 1024.0 * 1024.0;
    for (name, labels, want) in [
        ("gpu_memory_temperature_celsius", vec![], 61.0),
        ("gpu_memory_reserved_bytes", vec![], 571.0 * mib),
        ("gpu_remapped_rows", vec![("cause", "correctable")], 3.0),
        ("gpu_remapped_rows", vec![("cause", "uncorrectable")], 1.0),
        ("gpu_row_remap_pending", vec![], 1.0),
        ("gpu_row_remap_failed", vec![], 0.0),
        (
            "gpu_nvlink_bytes_total",
            vec![("direction", "tx")],
            2048.0 * 1024.0,
        ),
        (
            "gpu_nvlink_bytes_total",
            vec![("direction", "rx")],
            1024.0 * 1024.0,
        ),
        ("gpu_nvlink_errors_total", vec![("kind", "crc_flit")], 2.0),
        ("gpu_nvlink_errors_total", vec![("kind", "crc_data")], 0.0),
        ("gpu_nvlink_errors_total", vec![("kind", "replay")], 9.0),
        ("DCGM_FI_DEV_MEMORY_TEMP", vec![], 61.0),
        ("DCGM_FI_DEV_FB_RESERVED", vec![], 571.0),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", vec![], 3.0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", vec![], 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", vec![], 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", vec![], 0.0),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", vec![], 3072.0),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", vec![], 9.0),
    ] {
        let mut m = metric(name).gpu(0);
        for (k, v) in labels {
            m = m.label(k, v);
        }
        m.value(want).assert_in(&s);
    }
    // The clock events failed on GPU 0: absent, and counted as failed reads.
    metric("gpu_clock_event_seconds_total")
        .gpu(0)
        .absent()
        .assert_in(&s);
    metric("DCGM_FI_DEV_POWER_VIOLATION")
        .gpu(0)
        .absent()
        .assert_in(&s);
    assert!(
        metric("gpuwatch_sample_errors_total")
            .label("kind", "read_failed")
            .get(&s)
            .unwrap()
            >= 6.0
    );
    // GPU 1 (a V100) retires pages and has no NVLink. It says row remapping and the memory
    // temperature are not supported, so they are absent, its remap failure included.
    for (name, labels, want) in [
        ("gpu_retired_pages", vec![("cause", "single_bit")], 4.0),
        ("gpu_retired_pages", vec![("cause", "double_bit")], 1.0),
        ("gpu_retired_pages_pending", vec![], 1.0),
        ("DCGM_FI_DEV_RETIRED_SBE", vec![], 4.0),
        ("DCGM_FI_DEV_RETIRED_DBE", vec![], 1.0),
        ("DCGM_FI_DEV_RETIRED_PENDING", vec![], 1.0),
        (
            "gpu_clock_event_seconds_total",
            vec![("reason", "power")],
            0.0,
        ),
        ("DCGM_FI_DEV_POWER_VIOLATION", vec![], 0.0),
    ] {
        let mut m = metric(name).gpu(1);
        for (k, v) in labels {
            m = m.label(k, v);
        }
        m.value(want).assert_in(&s);
    }
    for name in [
        "gpu_memory_temperature_celsius",
        "gpu_remapped_rows",
        "gpu_row_remap_failed",
        "gpu_nvlink_bytes_total",
        "gpu_nvlink_errors_total",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    ] {
        metric(name).gpu(1).absent().assert_in(&s);
    }
    // Time held down, in seconds here and microseconds under DCGM's names.
    let d2 = Daemon::start(
        "[[gpu]]\nclock_event_seconds = { power = 12.5, thermal = 3 }\n",
        "[exposition]\nnames = \"both\"\n",
    );
    d2.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    let s = d2.scrape();
    metric("gpu_clock_event_seconds_total")
        .gpu(0)
        .label("reason", "power")
        .value(12.5)
        .assert_in(&s);
    metric("gpu_clock_event_seconds_total")
        .gpu(0)
        .label("reason", "thermal")
        .value(3.0)
        .assert_in(&s);
    metric("DCGM_FI_DEV_POWER_VIOLATION")
        .gpu(0)
        .value(12_500_000.0)
        .assert_in(&s);
    metric("DCGM_FI_DEV_THERMAL_VIOLATION")
        .gpu(0)
        .value(3_000_000.0)
        .assert_in(&s);
}

/// The start-up log says what the cost watch does: a price alone keeps it on (it accounts spend
/// and idle dollars), and with no price only the budgets of this node's own spend wait for one,
/// not those read from the fleet.
#[test]
fn the_start_up_log_says_what_the_cost_watch_does() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let priced = format!(
        "[actions]\nstate_dir = \"{}\"\n[cost]\nhourly_price_usd = 2.0\n",
        state.display()
    );
    let d = Daemon::start_in(dir, "[[gpu]]\n", &priced);
    let log = d.await_log(Duration::from_secs(60), "accounts spend and idle dollars");
    assert!(!log.contains("the cost watch is off"), "{log}");
    drop(d);

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let fleet = format!(
        "[actions]\nstate_dir = \"{}\"\n\
         [[budgets]]\nname = \"team-ml\"\nsource = \"prometheus\"\nurl = \"http://127.0.0.1:9/\"\n\
         query = 'team:gpuwatch_spend_dollars:sum{{team=\"ml\"}}'\nlimit_usd = 100\n\
         [[rules]]\nname = \"gated\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1m\"\nevaluation_periods = 1\naction = \"alert\"\nbudget = {{ name = \"team-ml\", spent_at_least = 0.8 }}\n",
        state.display()
    );
    let d = Daemon::start_in(dir, "[[gpu]]\n", &fleet);
    let log = d.await_log(
        Duration::from_secs(60),
        "budgets read from the fleet still count",
    );
    assert!(!log.contains("stay inactive"), "{log}");
}
