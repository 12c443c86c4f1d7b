//! The command line: `snapshot` (table and JSON), `demo`, and `--help` on every command.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{metric, BIN};

const SCENARIO: &str = r#"
driver_version = "535.161.08"
time = { speed = 0 }
[[gpu]]
utilization = 64
memory_used_mib = 40960
temperature = 61
power_watts = 402
processes = 3
[[gpu]]
name = "NVIDIA L4"
utilization = 4294967295
[[fault]]
at = "0s"
gpu = 1
kind = "not_supported"
fields = ["power"]
"#;

fn snapshot_cmd(args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[nvml]\nlibrary = \"{}\"\n",
            common::fake_library().display()
        ),
    )
    .unwrap();
    Command::new(BIN)
        .arg("snapshot")
        .args(args)
        .arg("--config")
        .arg(&config)
        .env("GPUWATCH_FAKE_NVML_SCENARIO", &scenario)
        .output()
        .unwrap()
}

#[test]
fn snapshot_json_carries_the_sample() {
    let out = snapshot_cmd(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nvml"]["driver_version"], "535.161.08");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(v["gpus"][0]["utilization_ratio"], 0.64);
    assert_eq!(v["gpus"][0]["memory_used_bytes"], 40960u64 * 1024 * 1024);
    assert_eq!(v["gpus"][0]["power_watts"], 402.0);
    assert_eq!(v["gpus"][0]["processes"], 3);
    // Unknown is null, never 0.
    assert_eq!(v["gpus"][1]["utilization_ratio"], serde_json::Value::Null);
    assert_eq!(v["gpus"][1]["power_watts"], serde_json::Value::Null);
    assert_eq!(v["gpus"][1]["name"], "NVIDIA L4");
}

#[test]
fn snapshot_table_shows_unknown_as_a_dash() {
    let out = snapshot_cmd(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("driver 535.161.08"), "{text}");
    assert!(lines[1].starts_with("GPU "), "{text}");
    let gpu0: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(&gpu0[..1], ["0"]);
    assert!(
        lines[2].contains(" 64% ")
            && lines[2].contains("40.0/79.6")
            && lines[2].contains("61C")
            && lines[2].contains("402/700"),
        "{}",
        lines[2]
    );
    let gpu1 = lines[3];
    assert!(
        gpu1.contains("NVIDIA L4") && gpu1.contains("    - "),
        "{gpu1}"
    );
}

#[test]
fn snapshot_without_nvml_says_why_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["snapshot", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVML unavailable (/nonexistent/libnvidia-ml.so.1)"),
        "{err}"
    );
}

#[test]
fn every_command_has_help() {
    for cmd in [
        &[][..],
        &["run"],
        &["demo"],
        &["snapshot"],
        &["check-config"],
        &["controller"],
        &["controller", "restore"],
    ] {
        let out = Command::new(BIN).args(cmd).arg("--help").output().unwrap();
        assert!(out.status.success(), "{cmd:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: gpuwatch"),
            "{cmd:?}"
        );
    }
}

#[test]
fn version_names_the_price_table_date() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("gpuwatch 0.1.0 (revision "), "{text}");
    assert!(
        text.contains(&format!(
            "; prices as of {})",
            gpuwatch::cloud::aws::prices::table().as_of
        )),
        "{text}"
    );
}

/// Starts `gpuwatch demo` with `extra` arguments on a port the kernel picks: the running
/// demo, its address, and what it printed before it listened.
fn start_demo(extra: &[&str]) -> (common::Killed, std::net::SocketAddr, String) {
    // Port 0: the kernel picks a free one, and the readiness line names it.
    let mut child = common::Killed(
        Command::new(BIN)
            .args(["demo", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("GPUWATCH_FAKE_NVML_SCENARIO")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    // Keep draining the log, as a terminal would.
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || BufReader::new(stderr).lines().for_each(drop));
    // The readiness line says when the listener is bound, and where.
    let mut printed = String::new();
    let addr = (&mut stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| {
            printed.push_str(&line);
            printed.push('\n');
            common::ready_address(&line)
        })
        .unwrap_or_else(|| panic!("the demo exited without listening:\n{printed}"));
    // The rest of stdout is drained too.
    std::thread::spawn(move || stdout.lines().for_each(drop));
    (child, addr, printed)
}

/// The README's first command: the demo serves four simulated GPUs with no config at all.
#[test]
fn demo_serves_four_gpus() {
    let (_child, addr, printed) = start_demo(&[]);
    assert!(
        printed.starts_with("gpuwatch demo: 4 simulated Hopper GPUs"),
        "{printed}"
    );
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_ne!(addr.port(), 0);
    // Await the first sample through the daemon's own long-poll.
    let r = common::get(addr, "/api/v1/snapshot?after=0&timeout=10s");
    let snap: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(snap["gpus"].as_array().unwrap().len(), 4, "{snap}");
    // The cost watch reads each sample after the sampler publishes it: await a sample or two.
    let mut seq = snap["seq"].as_u64().unwrap();
    let scrape = loop {
        let scrape = common::Scrape::parse(&common::get(addr, "/metrics").body);
        if !scrape.named("gpuwatch_rule_breaching").is_empty() || seq > 5 {
            break scrape;
        }
        let next = common::get(addr, &format!("/api/v1/snapshot?after={seq}&timeout=10s"));
        seq = serde_json::from_str::<serde_json::Value>(&next.body).unwrap()["seq"]
            .as_u64()
            .unwrap();
    };
    metric("gpuwatch_gpus").value(4.0).assert_in(&scrape);
    metric("gpu_utilization_ratio")
        .gpu(2)
        .value(0.42)
        .assert_in(&scrape);
    assert_eq!(scrape.named("gpu_utilization_ratio").len(), 4);
    // GPU 1 spins: a kernel always running, so 100% utilization (its SM activity is 2%).
    metric("gpu_utilization_ratio")
        .gpu(1)
        .value(1.0)
        .assert_in(&scrape);
    // The demo's idle rules are loaded: on utilization (dry-run stop) and on SM activity.
    metric("gpuwatch_rule_breaching")
        .label("rule", "demo-any-gpu-idle")
        .value(0.0)
        .assert_in(&scrape);
    metric("gpuwatch_rule_breaching")
        .label("rule", "demo-sm-idle")
        .value(0.0)
        .assert_in(&scrape);
    metric("gpuwatch_spot_interruption_pending")
        .value(0.0)
        .assert_in(&scrape);
}

/// `gpuwatch demo --amd`: two simulated AMD GPUs after the four NVIDIA ones, read from the
/// sysfs and procfs tree the demo writes and keeps rewriting.
#[test]
fn demo_with_amd_serves_a_mixed_node() {
    let (_child, addr, printed) = start_demo(&["--amd"]);
    assert!(
        printed.contains("2 simulated AMD Instinct MI300X"),
        "{printed}"
    );
    let r = common::get(addr, "/api/v1/snapshot?after=0&timeout=10s");
    let snap: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let gpus = snap["gpus"].as_array().unwrap();
    let vendors: Vec<&str> = gpus.iter().map(|g| g["vendor"].as_str().unwrap()).collect();
    assert_eq!(
        vendors,
        ["nvidia", "nvidia", "nvidia", "nvidia", "amd", "amd"],
        "{snap}"
    );
    assert_eq!(gpus[5]["name"], "AMD Instinct MI300X", "{snap}");
    assert_eq!(gpus[5]["utilization_ratio"], 0.0, "{snap}");
    assert_eq!(gpus[5]["processes"], 1, "{snap}");
    assert_eq!(gpus[5]["memory_used_bytes"], 64000u64 << 20, "{snap}");
    let scrape = common::Scrape::parse(&common::get(addr, "/metrics").body);
    metric("gpu_info")
        .gpu(4)
        .label("vendor", "amd")
        .value(1.0)
        .assert_in(&scrape);
    metric("gpuwatch_gpus").value(6.0).assert_in(&scrape);
}

/// A `GPUWATCH_LOG` that is not a level or a list of `target=level` is named in a warning, and
/// logging goes on at `info`.
#[test]
fn a_log_filter_not_understood_is_reported() {
    let empty = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(BIN)
        .args(["snapshot", "--config"])
        .arg(empty.path())
        .env("GPUWATCH_LOG", "info,gpuwatch=loud")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GPUWATCH_LOG=\"info,gpuwatch=loud\": \"gpuwatch=loud\" is not a level")
            && err.contains("logging at info"),
        "{err}"
    );
}

/// `gpuwatch run --listen 127.0.0.1:0` serves on a port the kernel chose and says which, on
/// stdout, in its one readiness line; a bad `--listen` exits 64.
#[test]
fn run_reports_the_port_it_listens_on() {
    let d = common::Daemon::start("[[gpu]]\nutilization = 5\n", "");
    assert_ne!(d.addr.port(), 0);
    assert_eq!(d.get("/-/healthy").status, 200);

    let empty = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(empty.path())
        .args(["--listen", "localhost"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--listen: \"localhost\" is not an IP address and port"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
}

/// `gpuwatch audit` reads the audit log and its rotated files oldest first, says each record
/// in words (local time, here UTC), filters by time, rule and kind, passes JSON through, and
/// reports a malformed line with its place, skipping it.
#[test]
fn audit_tells_what_happened_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let now = gpuwatch::time::now().floor();
    let at = |ago: f64| gpuwatch::time::rfc3339(now - ago);
    let record = |v: serde_json::Value| v.to_string();
    let oldest = [record(serde_json::json!({
        "event": "started", "time": at(10_800.0), "mode": "enforce", "rules": ["idle-2h"],
        "grace_until": at(9_900.0)}))];
    let older = [
        record(
            serde_json::json!({"event": "breach", "time": at(7_200.0), "mode": "enforce",
            "rule": "idle-2h", "evidence": {"breaching": true, "breaching_periods": 2,
            "threshold": 0.05, "periods": [{}, {}]}}),
        ),
        "not json".to_string(),
        record(
            serde_json::json!({"event": "warning", "time": at(7_200.0), "mode": "enforce",
            "rule": "idle-2h", "action": "stop", "due_at": at(6_600.0)}),
        ),
    ];
    let newest = [
        record(
            serde_json::json!({"event": "action_attempt", "time": at(600.0), "mode": "enforce",
            "rule": "idle-2h", "action": "stop"}),
        ),
        record(
            serde_json::json!({"event": "action_result", "time": at(600.0), "mode": "enforce",
            "rule": "idle-2h", "action": "stop", "result": "done", "detail": ""}),
        ),
        record(
            serde_json::json!({"event": "budget_alert", "time": at(60.0), "mode": "enforce",
            "budget": "team", "basis": "actual", "ratio": 0.8, "limit": 100.0, "threshold": 0.8}),
        ),
    ];
    std::fs::write(state.join("audit.jsonl.2"), oldest.join("\n") + "\n").unwrap();
    std::fs::write(state.join("audit.jsonl.1"), older.join("\n") + "\n").unwrap();
    let mut current = newest.join("\n").into_bytes();
    current.extend_from_slice(b"\n\xff\xfe\n");
    std::fs::write(state.join("audit.jsonl"), current).unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!("[actions]\nstate_dir = \"{}\"\n", state.display()),
    )
    .unwrap();
    let audit = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("audit")
            .arg("--config")
            .arg(&config)
            .args(args)
            .env("TZ", "UTC")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let clock = |ago: f64| {
        let t = at(ago);
        format!("{} {}", &t[..10], &t[11..16])
    };
    let (text, errors) = audit(&[]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert_eq!(
        lines[0],
        format!(
            "{}  gpuwatch started (enforce mode, boot grace until {})",
            clock(10_800.0),
            &clock(9_900.0)[11..]
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "{}  rule idle-2h: 2 of 2 periods breach the threshold 0.05",
            clock(7_200.0)
        )
    );
    assert_eq!(
        lines[2],
        format!(
            "{}  rule idle-2h warns: stop at {} unless the GPUs are used again",
            clock(7_200.0),
            &clock(6_600.0)[11..]
        )
    );
    assert_eq!(
        lines[4],
        format!("{}  rule idle-2h: stop done", clock(600.0))
    );
    assert_eq!(
        lines[5],
        format!(
            "{}  budget \"team\" actual spend is at 80% of $100.00 (threshold 80%)",
            clock(60.0)
        )
    );
    assert!(
        errors.contains("audit.jsonl.1:2: not a JSON record, skipped"),
        "{errors}"
    );
    assert!(
        errors.contains("audit.jsonl:4: not UTF-8, skipped"),
        "{errors}"
    );

    let (warnings, _) = audit(&["--kind", "warning"]);
    assert_eq!(warnings.lines().count(), 1, "{warnings}");
    assert!(warnings.contains("warns: stop"));
    let (recent, _) = audit(&["--since", "1h"]);
    assert_eq!(recent.lines().count(), 3, "{recent}");
    let (rule, _) = audit(&["--rule", "idle-2h", "--kind", "action"]);
    assert_eq!(rule.lines().count(), 2, "{rule}");
    let (json, _) = audit(&["--json", "--since", "1h"]);
    assert_eq!(json, newest.join("\n") + "\n");
}

/// An audit log that cannot be opened (a link, here to `/dev/zero`) is reported, the rotated
/// files are still listed, and the exit status says the listing is not whole.
#[test]
fn audit_exits_non_zero_when_it_cannot_open_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let started = serde_json::json!({"event": "started", "time": "2026-11-30T12:00:00Z",
        "mode": "enforce", "rules": [], "grace_until": "2026-11-30T12:05:00Z"});
    std::fs::write(state.join("audit.jsonl.1"), format!("{started}\n")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", state.join("audit.jsonl")).unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!("[actions]\nstate_dir = \"{}\"\n", state.display()),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("audit")
        .arg("--config")
        .arg(&config)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(66), "{errors}");
    assert!(errors.contains("audit.jsonl"), "{errors}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}
