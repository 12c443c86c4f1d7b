//! GPU health end to end, on the fake NVML: for each problem, the state it puts its GPU in, its
//! `problem` label, the words on `/api/v1/health` and in `gpuwatch status`, and how it clears;
//! an XID held until the GPU is reset, across a restart.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{metric, Daemon, Scrape};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(30);

fn health(d: &Daemon) -> Value {
    let r = d.get("/api/v1/health");
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

/// Waits until GPU `gpu` is in `state` on `/api/v1/health`, and returns that answer.
fn await_state(d: &Daemon, gpu: usize, state: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        last = health(d);
        if last["gpus"][gpu]["state"] == state {
            return last;
        }
        let seq = last["seq"].as_u64().unwrap_or(0);
        d.snapshot_after(seq);
    }
    panic!("GPU {gpu} never became {state}: {last}\nlog:\n{}", d.log());
}

fn problems(h: &Value, gpu: usize) -> Vec<String> {
    h["gpus"][gpu]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["problem"].as_str().unwrap().to_string())
        .collect()
}

fn assert_state(s: &Scrape, gpu: u32, state: &str) {
    for other in ["healthy", "degraded", "unhealthy"] {
        metric("gpu_health")
            .gpu(gpu)
            .label("state", other)
            .value(if other == state { 1.0 } else { 0.0 })
            .assert_in(s);
    }
}

fn status_text(d: &Daemon) -> String {
    let out = Command::new(common::BIN)
        .args(["status", "--url", &format!("http://{}", d.addr)])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each condition the readings show: the state, the label, the words, and healthy again once
/// the condition clears (a live file drives each reading).
#[test]
fn each_problem_shows_in_its_state_label_and_words_and_clears() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let live = |name: &str, v: &str| std::fs::write(root.join(name), v).unwrap();
    for (file, v) in [
        ("failed", "0"),
        ("pending", "0"),
        ("dbe", "0"),
        ("width", "16"),
    ] {
        live(file, v);
    }
    let scenario = format!(
        r#"
[[gpu]]
row_remap_failed = {{ kind = "live", file = "{d}/failed" }}
row_remap_pending = {{ kind = "live", file = "{d}/pending" }}
ecc_uncorrected = {{ kind = "live", file = "{d}/dbe" }}
pcie_link_width = {{ kind = "live", file = "{d}/width" }}
[[gpu]]
"#,
        d = root.display()
    );
    // A price, and the state directory the cost watch keeps its ledger in.
    let config = format!(
        "[cost]\nhourly_price_usd = 3600\n[actions]\nstate_dir = \"{}\"\n",
        root.join("state").display()
    );
    let d = Daemon::start_in(dir, &scenario, &config);
    let h = await_state(&d, 0, "healthy");
    assert_eq!(h["node"], "healthy");
    // The dollars the decision loop had counted once it judged sample `seq` (it publishes
    // them after the sampler publishes the sample).
    let unhealthy_dollars = |d: &Daemon, seq: u64| {
        let judged = d.get(&format!(
            "/api/v1/status?after={}&timeout=10s",
            seq.saturating_sub(1)
        ));
        assert_eq!(judged.status, 200, "{}", judged.body);
        metric("gpuwatch_gpu_unhealthy_dollars_total")
            .get(&d.scrape())
            .unwrap_or(0.0)
    };
    for (file, on, off, state, label, words, action) in [
        (
            "failed",
            "1",
            "0",
            "unhealthy",
            "row_remap_failed",
            "no spare rows",
            "report_hardware",
        ),
        (
            "pending",
            "1",
            "0",
            "degraded",
            "row_remap_pending",
            "waits for a GPU reset",
            "reset_gpu",
        ),
        (
            "dbe",
            "2",
            "0",
            "unhealthy",
            "uncorrectable_ecc",
            "uncorrectable ECC",
            "reset_gpu",
        ),
        (
            "width",
            "4",
            "16",
            "degraded",
            "pcie_link_degraded",
            "PCIe link",
            "report_hardware",
        ),
    ] {
        live(file, on);
        let h = await_state(&d, 0, state);
        let before = unhealthy_dollars(&d, h["seq"].as_u64().unwrap());
        assert_eq!(problems(&h, 0), [label], "{h}");
        let p = &h["gpus"][0]["problems"][0];
        assert_eq!(p["severity"], state);
        assert_eq!(p["action"], action);
        assert!(p["words"].as_str().unwrap().contains(words), "{p}");
        assert_eq!(h["node"], state, "the node is its worst GPU");
        assert_eq!(h["gpus"][1]["state"], "healthy");
        let s = d.scrape();
        assert_state(&s, 0, state);
        metric("gpu_health_problem")
            .gpu(0)
            .label("problem", label)
            .value(1.0)
            .assert_in(&s);
        metric("gpuwatch_node_health")
            .label("state", state)
            .value(1.0)
            .assert_in(&s);
        let text = status_text(&d);
        assert!(text.contains(&format!("GPU 0 is {state}:")), "{text}");
        assert!(text.contains(words), "{text}");
        let page = d.get("/").body;
        assert!(page.contains(&format!("GPU 0 is {state}:")), "{page}");
        // The price: one of the two GPUs unhealthy costs half the price while it lasts (a
        // degraded GPU still works, and costs nothing extra).
        let seq = h["seq"].as_u64().unwrap();
        let later = d.snapshot_after(d.snapshot_after(seq)["seq"].as_u64().unwrap());
        let after = unhealthy_dollars(&d, later["seq"].as_u64().unwrap());
        if state == "unhealthy" {
            assert!(
                after > before,
                "{label}: {before} then {after} at {}",
                later["seq"]
            );
        } else {
            assert_eq!(after, before, "{label}");
        }
        live(file, off);
        await_state(&d, 0, "healthy");
        let s = d.scrape();
        metric("gpu_health_problem").gpu(0).absent().assert_in(&s);
    }
    // `/-/healthy` is the daemon's health, not the GPUs': a sick GPU never fails it.
    live("failed", "1");
    await_state(&d, 0, "unhealthy");
    assert_eq!(d.get("/-/healthy").status, 200);
    assert_eq!(d.get("/-/ready").status, 200);
}

/// A GPU that falls off the bus is unhealthy ("lost") while it is gone, and healthy once it
/// answers again; what the application did wrong (XID 13) is counted, never held against it.
#[test]
fn a_lost_gpu_is_unhealthy_until_it_answers_and_an_application_xid_is_only_counted() {
    let scenario = r#"
time = { speed = 1.0 }
[[gpu]]
[[gpu]]
[[fault]]
at = "2s"
until = "5s"
gpu = 1
kind = "lost"
[[fault]]
at = "1s"
gpu = 0
kind = "xid"
xid = 13
"#;
    let d = Daemon::start(scenario, "");
    let h = await_state(&d, 1, "unhealthy");
    assert_eq!(problems(&h, 1), ["lost"]);
    assert_eq!(h["gpus"][1]["problems"][0]["action"], "reboot_node");
    let s = d.scrape();
    metric("gpu_health_problem")
        .gpu(1)
        .label("problem", "lost")
        .value(1.0)
        .assert_in(&s);
    await_state(&d, 1, "healthy");
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpu_xid_errors_total")
            .gpu(0)
            .label("xid", "13")
            .get(s)
            .is_some()
    });
    assert_state(&s, 0, "healthy");
}

/// `gpuwatch snapshot` says each GPU's health, and its problems in words.
#[test]
fn the_snapshot_says_each_gpus_health_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = "[[gpu]]\nrow_remap_failed = 1\n[[gpu]]\n";
    std::fs::write(dir.path().join("scenario.toml"), scenario).unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[nvml]\nlibrary = \"{}\"\n",
            common::fake_library().display()
        ),
    )
    .unwrap();
    let out = Command::new(common::BIN)
        .args(["snapshot", "--config"])
        .arg(&config)
        .env(
            "GPUWATCH_FAKE_NVML_SCENARIO",
            dir.path().join("scenario.toml"),
        )
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("GPU 0 unhealthy\n  a memory row could not be remapped"),
        "{text}"
    );
    assert!(text.contains("(report the hardware)"), "{text}");
    assert!(text.contains("GPU 1 healthy\n"), "{text}");
}

/// Readings the GPU does not support, or that fail, never make it unhealthy on their own.
#[test]
fn unsupported_or_failing_readings_make_no_problem() {
    let scenario = r#"
[[gpu]]
[[fault]]
at = "0s"
kind = "not_supported"
fields = ["remapped_rows", "ecc", "pcie_link", "clock_events"]
[[fault]]
at = "0s"
kind = "fails"
fields = ["retired_pages", "nvlink_errors"]
"#;
    let d = Daemon::start(scenario, "");
    let h = await_state(&d, 0, "healthy");
    assert!(problems(&h, 0).is_empty(), "{h}");
}

/// Thermal limits holding the clocks down for most of each interval degrade the GPU.
#[test]
fn sustained_thermal_throttling_degrades_the_gpu() {
    let scenario = r#"
[[gpu]]
clock_event_seconds = { thermal = { kind = "ramp", from = 0, to = 540, over = "10m" } }
[[gpu]]
clock_event_seconds = { thermal = { kind = "ramp", from = 0, to = 60, over = "10m" } }
"#;
    let d = Daemon::start(scenario, "");
    let h = await_state(&d, 0, "degraded");
    assert_eq!(problems(&h, 0), ["thermal_throttling"]);
    assert_eq!(
        h["gpus"][1]["state"], "healthy",
        "10% of the time is no problem"
    );
}

/// An XID that needs a reset holds its GPU unhealthy after the event, across a restart of the
/// daemon (state.json keeps it), until the volatile ECC counters show the GPU was reset.
#[test]
fn an_xid_holds_across_a_restart_until_the_gpu_is_reset() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::write(root.join("ecc"), "5").unwrap();
    let config = format!(
        "[cost]\nhourly_price_usd = 10\n[actions]\nstate_dir = \"{}\"\n",
        root.join("state").display()
    );
    let gpus = format!(
        "[[gpu]]\necc_corrected = {{ kind = \"live\", file = \"{}\" }}\n[[gpu]]\n",
        root.join("ecc").display()
    );
    let with_xid = format!("{gpus}[[fault]]\nat = \"1s\"\ngpu = 0\nkind = \"xid\"\nxid = 48\n");
    let mut d = Daemon::start_in(dir, &with_xid, &config);
    let h = await_state(&d, 0, "unhealthy");
    assert_eq!(problems(&h, 0), ["xid_48"]);
    let p = &h["gpus"][0]["problems"][0];
    assert_eq!(p["action"], "reset_gpu");
    assert!(p["words"].as_str().unwrap().starts_with("XID 48: "), "{p}");
    assert!(p["since"].as_f64().is_some());
    // Saved before the stop.
    d.await_sample(LIMIT, |_| {
        std::fs::read_to_string(root.join("state/state.json"))
            .is_ok_and(|s| s.contains("\"xid\":48"))
    });
    d.terminate();
    d.wait_exit(LIMIT).expect("stops");

    // No XID this time: the hold alone keeps it unhealthy. Only gpuwatch restarted: the driver
    // ran on, and its counters (energy since it loaded) with it, ten minutes on.
    let resumed = format!("time = {{ start = \"10m\" }}\n{gpus}");
    let d = Daemon::start_in(common::reuse_dir(&root), &resumed, &config);
    let h = await_state(&d, 0, "unhealthy");
    assert_eq!(problems(&h, 0), ["xid_48"]);
    assert_eq!(h["gpus"][1]["state"], "healthy");
    let s = d.scrape();
    metric("gpu_xid_errors_total").gpu(0).absent().assert_in(&s);
    // The reset: the volatile counters back at zero.
    std::fs::write(root.join("ecc"), "0").unwrap();
    await_state(&d, 0, "healthy");
    drop(d);

    // A driver reload (or a reset) shows as the energy since the driver loaded going back:
    // here the driver restarted with gpuwatch, and the hold from before is gone.
    std::fs::write(root.join("ecc"), "5").unwrap();
    let with_xid_again = format!(
        "time = {{ start = \"20m\" }}\n{gpus}[[fault]]\nat = \"20m1s\"\ngpu = 0\nkind = \"xid\"\nxid = 48\n"
    );
    let mut d = Daemon::start_in(common::reuse_dir(&root), &with_xid_again, &config);
    await_state(&d, 0, "unhealthy");
    d.terminate();
    d.wait_exit(LIMIT).expect("stops");
    let d = Daemon::start_in(common::reuse_dir(&root), &gpus, &config);
    let h = await_state(&d, 0, "healthy");
    assert!(problems(&h, 0).is_empty(), "{h}");
}
