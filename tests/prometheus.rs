//! A real Prometheus server (Debian's `prometheus`) scrapes the daemon over the fake GPUs, and
//! its query API returns the four `gpu_utilization_ratio` series with the scenario's values.

mod common;

use std::time::Duration;

use common::prometheus::Prometheus;
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

    let prom = Prometheus::scraping(d.addr);
    let result = prom.await_query("gpu_utilization_ratio", |r| r.len() == 4);
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
    prom.assert_up();
}

/// A string that tries every way out of a label value: a quote and brace to end it, a newline
/// to start a line of its own, backslashes to eat the escaping, and a control character.
const HOSTILE: &str = "x\\\"} 0\ngpu_utilization_ratio{uuid=\"SPOOFED\"} 0\n\\";

#[test]
fn hostile_label_values_are_escaped_and_prometheus_keeps_every_scrape() {
    let toml_str = |s: &str| format!("{s:?}");
    let scenario = format!(
        "time = {{ speed = 0 }}\n[[gpu]]\nutilization = 50\nname = {name}\nprocesses = 1\nprocess_name = {proc}\n\
         [[gpu]]\nutilization = 50\nname = {bad_name}\nprocesses = 1\nprocess_name = {bad_proc}\n",
        name = toml_str(&format!("NVIDIA {HOSTILE}")),
        proc = toml_str(&format!("python3 {HOSTILE}")),
        // Bytes that are not UTF-8, as a driver might answer them (the fake's \xHH).
        bad_name = toml_str("NVIDIA \\xff\\xfe"),
        bad_proc = toml_str("py\\xc3\\x28"),
    );
    let rule = format!("rule with \"quote\\ {}", "}");
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[sampling]\nper_process_memory = true\n[actions]\nstate_dir = {state}\n[cost]\nhourly_price_usd = 1.0\n\
         [[budgets]]\nname = {budget}\nlimit_usd = 100\n\
         [[rules]]\nname = {rule}\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\nperiod = \"1s\"\naction = \"alert\"\n",
        budget = toml_str("team \"a\\b\""),
        rule = toml_str(&rule),
        state = toml_str(&dir.path().join("state").display().to_string()),
    );
    let d = Daemon::start_in(dir, &scenario, &extra);
    let scrape = d.await_scrape(Duration::from_secs(30), |s| {
        s.text.contains("gpuwatch_rule_breaching") && s.text.contains("gpu_process_memory")
    });

    // promtool reads the exposition as valid, with no line injected.
    common::assert_promtool_accepts(&scrape.text);
    assert!(!scrape
        .text
        .lines()
        .any(|l| l.starts_with("gpu_utilization_ratio{uuid=\"SPOOFED\"}")));

    // A real Prometheus keeps every scrape, and reads each value back exactly.
    let prom = Prometheus::scraping(d.addr);
    let info = prom.await_query("gpu_info", |r| r.len() == 2);
    let on = |r: &[serde_json::Value], gpu: &str, label: &str| {
        r.iter()
            .find(|s| s["metric"]["gpu"] == gpu)
            .map(|s| s["metric"][label].clone())
            .unwrap()
    };
    assert_eq!(on(&info, "0", "name"), format!("NVIDIA {HOSTILE}"));
    // A name that is not UTF-8 is a failed read (counted), not garbage in a label: the label is
    // empty, which Prometheus stores as absent.
    assert!(on(&info, "1", "name").is_null(), "{info:?}");
    let procs = prom.await_query("gpu_process_memory_used_bytes", |r| r.len() == 2);
    assert_eq!(on(&procs, "0", "process"), format!("python3 {HOSTILE}"));
    assert!(on(&procs, "1", "process").is_null(), "{procs:?}");
    let failed = prom.await_query("gpuwatch_sample_errors_total{kind=\"read_failed\"}", |r| {
        r.first()
            .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
            .is_some_and(|v| v >= 1.0)
    });
    assert_eq!(failed.len(), 1);
    let rules = prom.await_query("gpuwatch_rule_breaching", |r| r.len() == 1);
    assert_eq!(rules[0]["metric"]["rule"], rule.as_str());
    let budgets = prom.await_query("gpuwatch_budget_limit_dollars", |r| r.len() == 1);
    assert_eq!(budgets[0]["metric"]["budget"], "team \"a\\b\"");
    let spoofed = prom.await_query("gpu_utilization_ratio", |r| !r.is_empty());
    assert_eq!(spoofed.len(), 2, "{spoofed:?}");
    assert!(spoofed.iter().all(|s| s["metric"]["uuid"] != "SPOOFED"));
    prom.assert_up();
}

/// Prometheus scrapes over TLS with basic auth, as its `tls_config` and `basic_auth` say.
#[test]
fn prometheus_scrapes_over_tls_with_basic_auth() {
    use common::certs::{protect, PASSWORD, USER};
    let dir = tempfile::tempdir().unwrap();
    let p = protect(dir.path());
    let d = Daemon::start_in(
        dir,
        SCENARIO,
        "[server]\nlisten = \"127.0.0.1:0\"\nweb_config_file = \"web-config.yml\"\n",
    );
    let job = format!(
        "    scheme: https\n    tls_config:\n      ca_file: '{}'\n    basic_auth:\n      username: {USER}\n      password: {PASSWORD}\n",
        p.ca.display()
    );
    let prom = Prometheus::scraping_with(d.addr, &job);
    let result = prom.await_query("gpu_utilization_ratio", |r| r.len() == 4);
    assert_eq!(result.len(), 4);
    prom.assert_up();
}

/// In `dcgm` mode, dashboards written for NVIDIA's dcgm-exporter work unchanged: every query of
/// its published Grafana dashboard (`tests/data/dcgm/dashboard-queries.txt`) returns data from a
/// real Prometheus scraping gpuwatch, with the units those panels expect.
#[test]
fn the_dcgm_exporter_dashboard_works_in_dcgm_mode() {
    let d = Daemon::start(
        SCENARIO,
        // The published dashboard predates dcgm-exporter's lower-case `hostname`.
        "[exposition]\nnames = \"dcgm\"\nhostname = \"gpu-node-1\"\nhostname_label = \"Hostname\"\n",
    );
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    let prom = Prometheus::scraping(d.addr);
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/dcgm/dashboard-queries.txt"),
    )
    .unwrap();
    let mut queries = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        queries += 1;
        if let Some(args) = line
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
        {
            let (metric, label) = args.split_once(',').unwrap();
            let values = prom.await_label_values(metric.trim(), label.trim());
            assert!(!values.is_empty(), "{line}");
            continue;
        }
        let query = line
            .replace("$Hostname", ".*")
            .replace("$gpu", ".*")
            .replace("$instance", ".*");
        let result = prom.await_query(&query, |r| !r.is_empty());
        assert!(!result.is_empty(), "{line} returned nothing");
    }
    assert!(queries >= 15, "{queries} queries");
    // The units the panels expect: percent, MiB and MHz, with dcgm-exporter's labels.
    let util = prom.await_query("DCGM_FI_DEV_GPU_UTIL{gpu=\"2\"}", |r| r.len() == 1);
    assert_eq!(util[0]["value"][1], "33");
    assert_eq!(util[0]["metric"]["Hostname"], "gpu-node-1");
    assert_eq!(util[0]["metric"]["device"], "nvidia2");
    assert_eq!(util[0]["metric"]["modelName"], "NVIDIA H100 80GB HBM3");
    assert!(util[0]["metric"]["UUID"]
        .as_str()
        .unwrap()
        .starts_with("GPU-"));
    assert_eq!(util[0]["metric"]["DCGM_FI_DRIVER_VERSION"], "550.54.15");
    let fb = prom.await_query("DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE", |r| {
        r.len() == 4
    });
    for s in &fb {
        let mib: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
        // The fake's 81,559 MiB, give or take the rounding down of each part.
        assert!((81_557.0..=81_559.0).contains(&mib), "{mib}");
    }
    // No gpu_* series in dcgm mode, though gpuwatch's own series are there.
    let gpu = prom.await_query("count({__name__=~\"gpu_.*\"}) or vector(0)", |r| {
        !r.is_empty()
    });
    assert_eq!(gpu[0]["value"][1], "0", "{gpu:?}");
    let ours = prom.await_query("gpuwatch_gpus", |r| !r.is_empty());
    assert_eq!(ours[0]["value"][1], "4");
    prom.assert_up();
}
