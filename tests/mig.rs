//! MIG over the fake NVML: every MIG device is a device of its own, with its memory, processes
//! and GPM metrics under its UUID, GPU instance, compute instance and profile, beside its GPU's
//! index; the GPU keeps its physical readings, and its utilization is absent in MIG mode. A new
//! MIG layout is picked up without a restart.

mod common;

use std::time::Duration;

use common::{metric, Daemon, Scrape};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// GPU 0 split into a 3g.40gb and two 2g.20gb instances; GPU 1 whole.
const SPLIT: &str = r#"
[[gpu]]
utilization = 77
temperature = 61
power_watts = 350
[[gpu.mig]]
profile = "3g.40gb"
uuid = "MIG-11111111-0000-4000-8000-000000000001"
gpu_instance = 1
memory_used_mib = 10240
processes = 2
gpm = { sm_active = 64, tensor_active = 40, dram_active = 30, fp16_active = 12 }
[[gpu.mig]]
profile = "2g.20gb"
uuid = "MIG-11111111-0000-4000-8000-000000000002"
gpu_instance = 5
memory_used_mib = 2048
processes = 1
gpm = { sm_active = 3 }
[[gpu.mig]]
profile = "2g.20gb"
uuid = "MIG-11111111-0000-4000-8000-000000000003"
gpu_instance = 6
gpm = { sm_active = 0 }
[[gpu]]
utilization = 50
gpm = { sm_active = 45 }
"#;

fn mig(uuid: &str) -> common::MetricMatch {
    metric("gpu_memory_used_bytes").gpu(0).label("uuid", uuid)
}

fn await_mig(d: &Daemon, until: impl Fn(&Scrape) -> bool) -> Scrape {
    d.await_scrape(Duration::from_secs(30), until)
}

#[test]
fn every_mig_device_is_a_device_of_its_own() {
    let d = Daemon::start(SPLIT, "");
    let s = await_mig(&d, |s| {
        s.named("gpu_sm_active_ratio")
            .iter()
            .filter(|x| x.labels.contains_key("gpu_instance"))
            .count()
            == 3
    });
    for (uuid, gi, profile, used, total, procs, sm) in [
        (
            "MIG-11111111-0000-4000-8000-000000000001",
            1,
            "3g.40gb",
            10.0,
            40.0,
            2.0,
            0.64,
        ),
        (
            "MIG-11111111-0000-4000-8000-000000000002",
            5,
            "2g.20gb",
            2.0,
            20.0,
            1.0,
            0.03,
        ),
        (
            "MIG-11111111-0000-4000-8000-000000000003",
            6,
            "2g.20gb",
            0.0,
            20.0,
            0.0,
            0.0,
        ),
    ] {
        let labels = |name: &str| {
            metric(name)
                .gpu(0)
                .label("uuid", uuid)
                .label("gpu_instance", gi)
                .label("compute_instance", 0)
                .label("mig_profile", profile)
        };
        labels("gpu_memory_used_bytes")
            .value(used * GIB)
            .assert_in(&s);
        labels("gpu_memory_total_bytes")
            .value(total * GIB)
            .assert_in(&s);
        labels("gpu_memory_free_bytes")
            .value((total - used) * GIB)
            .assert_in(&s);
        labels("gpu_processes").value(procs).assert_in(&s);
        labels("gpu_sm_active_ratio").value(sm).assert_in(&s);
    }
    metric("gpu_tensor_active_ratio")
        .label("uuid", "MIG-11111111-0000-4000-8000-000000000001")
        .value(0.4)
        .assert_in(&s);
    metric("gpu_pipe_active_ratio")
        .gpu(0)
        .label("gpu_instance", 1)
        .label("pipe", "fp16")
        .value(0.12)
        .assert_in(&s);
    // A metric the driver does not report for an instance is absent, never 0.
    metric("gpu_tensor_active_ratio")
        .label("uuid", "MIG-11111111-0000-4000-8000-000000000002")
        .absent()
        .assert_in(&s);
    // The GPU keeps its physical readings; its utilization is absent in MIG mode.
    let parent = "GPU-00000000-0000-4000-8000-000000000001";
    metric("gpu_temperature_celsius")
        .gpu(0)
        .value(61.0)
        .assert_in(&s);
    metric("gpu_power_watts").gpu(0).value(350.0).assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(0)
        .absent()
        .assert_in(&s);
    metric("gpu_memory_total_bytes")
        .gpu(0)
        .label("uuid", parent)
        .value(81559.0 * 1024.0 * 1024.0)
        .assert_in(&s);
    // GPU 1 is whole: no MIG series.
    metric("gpu_utilization_ratio")
        .gpu(1)
        .value(0.5)
        .assert_in(&s);
    assert!(
        !s.series
            .iter()
            .any(|x| x.labels.get("gpu").map(String::as_str) == Some("1")
                && x.labels.contains_key("gpu_instance")),
        "{}",
        s.text
    );
    common::assert_promtool_accepts(&s.text);
}

/// One 7g.80gb instance for the first 3 s, then three smaller ones: the daemon reads the new
/// layout on its next cycle, the old device's series go, and the new ones come.
#[test]
fn a_new_mig_layout_is_picked_up_without_a_restart() {
    let scenario = r#"
[[gpu]]
[[gpu.mig]]
profile = "7g.80gb"
uuid = "MIG-22222222-0000-4000-8000-000000000007"
gpu_instance = 0
until = "3s"
gpm = { sm_active = 90 }
[[gpu.mig]]
profile = "3g.40gb"
uuid = "MIG-22222222-0000-4000-8000-000000000001"
gpu_instance = 1
from = "3s"
gpm = { sm_active = 20 }
[[gpu.mig]]
profile = "2g.20gb"
uuid = "MIG-22222222-0000-4000-8000-000000000002"
gpu_instance = 5
from = "3s"
[[gpu.mig]]
profile = "2g.20gb"
uuid = "MIG-22222222-0000-4000-8000-000000000003"
gpu_instance = 6
from = "3s"
"#;
    let d = Daemon::start(scenario, "");
    let before = await_mig(&d, |s| {
        mig("MIG-22222222-0000-4000-8000-000000000007")
            .get(s)
            .is_some()
    });
    mig("MIG-22222222-0000-4000-8000-000000000001")
        .absent()
        .assert_in(&before);
    let after = await_mig(&d, |s| {
        s.named("gpu_sm_active_ratio")
            .iter()
            .any(|x| x.labels.get("gpu_instance").map(String::as_str) == Some("1"))
    });
    mig("MIG-22222222-0000-4000-8000-000000000007")
        .absent()
        .assert_in(&after);
    for uuid in [
        "MIG-22222222-0000-4000-8000-000000000001",
        "MIG-22222222-0000-4000-8000-000000000002",
        "MIG-22222222-0000-4000-8000-000000000003",
    ] {
        assert!(mig(uuid).get(&after).is_some(), "{uuid}:\n{}", after.text);
    }
    metric("gpu_sm_active_ratio")
        .label("gpu_instance", 1)
        .value(0.2)
        .assert_in(&after);
    // Still the same daemon: its first sample is long gone.
    assert!(d.snapshot_after(0)["seq"].as_u64().unwrap() > 3);
}

/// Rules that alert after two idle 1 s periods: on SM activity, on utilization and on
/// processes; with the state in the test's directory.
fn rules_config(dir: &std::path::Path) -> String {
    let rule = |name: &str, metric: &str, threshold: f64| {
        format!(
            "[[rules]]\nname = \"{name}\"\nmetric = \"{metric}\"\ncomparison = \"less_than\"\n\
             threshold = {threshold}\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"alert\"\n"
        )
    };
    format!(
        "[actions]\nstate_dir = \"{}\"\nboot_grace = \"0s\"\nwarning = \"1h\"\nwall = false\n{}{}{}",
        dir.join("state").display(),
        rule("sm-idle", "sm_active", 0.05),
        rule("util-idle", "gpu_utilization", 0.05),
        rule("no-processes", "processes", 1.0),
    )
}

fn breaching(s: &Scrape, rule: &str) -> Option<f64> {
    metric("gpuwatch_rule_breaching").label("rule", rule).get(s)
}

/// An idle rule over a node in MIG mode judges every MIG device, and the node is idle only when
/// all are: one MIG device at work keeps it; once that one idles too, the rule on SM activity
/// breaches. A rule on utilization never does (NVML has none for MIG devices: unknown, so
/// busy). Each MIG device has its own idle time.
#[test]
fn an_idle_rule_judges_every_mig_device() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("sm.txt");
    std::fs::write(&live, "60").unwrap();
    let scenario = r#"
[[gpu]]
[[gpu.mig]]
profile = "3g.40gb"
uuid = "MIG-33333333-0000-4000-8000-000000000001"
gpu_instance = 1
processes = 1
gpm = { sm_active = { kind = "live", file = "sm.txt" } }
[[gpu.mig]]
profile = "2g.20gb"
uuid = "MIG-33333333-0000-4000-8000-000000000002"
gpu_instance = 5
gpm = { sm_active = 1 }
[[gpu.mig]]
profile = "2g.20gb"
uuid = "MIG-33333333-0000-4000-8000-000000000003"
gpu_instance = 6
gpm = { sm_active = 0 }
"#;
    let config = rules_config(dir.path());
    let d = Daemon::start_in(dir, scenario, &config);
    let idle = |s: &Scrape, gi: u32| {
        metric("gpuwatch_gpu_idle_seconds")
            .gpu(0)
            .label("gpu_instance", gi)
            .get(s)
    };
    // The two small instances idle for 4 s: by then the rules have judged at least two whole
    // periods with the big one at work.
    let s = await_mig(&d, |s| idle(s, 5).is_some_and(|v| v >= 4.0));
    assert!(idle(&s, 6).unwrap() >= 3.0, "{}", s.text);
    assert_eq!(idle(&s, 1), Some(0.0), "{}", s.text);
    assert_eq!(breaching(&s, "sm-idle"), Some(0.0), "{}", s.text);
    let labelled = metric("gpuwatch_gpu_idle_seconds")
        .gpu(0)
        .label("uuid", "MIG-33333333-0000-4000-8000-000000000002")
        .label("gpu_instance", 5)
        .label("compute_instance", 0)
        .label("mig_profile", "2g.20gb");
    assert!(labelled.get(&s).is_some(), "{}", s.text);
    // The status shows each MIG device under its GPU, with its idle time: as JSON, on the
    // page, and in `gpuwatch status`.
    let status = d.get("/api/v1/status").json();
    let devices = status["gpus"][0]["mig"].as_array().unwrap();
    assert_eq!(devices.len(), 3, "{status}");
    assert_eq!(devices[1]["profile"], "2g.20gb", "{status}");
    assert!(
        devices[1]["idle_seconds"].as_f64().unwrap() >= 4.0,
        "{status}"
    );
    assert!(devices[0]["idle_seconds"].is_null(), "{status}");
    let page = d.get("/").body;
    assert!(page.contains("GI 5 · CI 0 2g.20gb"), "{page}");
    let out = std::process::Command::new(common::BIN)
        .args(["status", "--url", &format!("http://{}/", d.addr)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  GI 5 · CI 0 2g.20gb: SM 1%"), "{text}");

    // The big instance idles too: the node is idle.
    std::fs::write(d.dir.path().join("sm.txt"), "0").unwrap();
    let s = await_mig(&d, |s| breaching(s, "sm-idle") == Some(1.0));
    assert_eq!(breaching(&s, "util-idle"), Some(0.0), "{}", s.text);
    // The big instance still runs a process: the processes rule sees it busy.
    assert_eq!(breaching(&s, "no-processes"), Some(0.0), "{}", s.text);
    let audit = d.audit();
    let warned: Vec<&serde_json::Value> = common::events(&audit, "warning");
    assert!(!warned.is_empty(), "{audit:?}");
    assert!(warned.iter().all(|w| w["rule"] == "sm-idle"), "{audit:?}");
}

/// While MIG devices cannot be read (their handles fail, or the MIG mode does), no rule judges
/// the node: the ones not read could be at work. Here the GPU itself reports no processes, so a
/// rule on processes would see an idle GPU if the GPU stood in for its MIG devices.
#[test]
fn mig_devices_that_cannot_be_read_keep_the_node_busy() {
    for (field, unread) in [("mig", 2), ("mig_mode", 1)] {
        let dir = tempfile::tempdir().unwrap();
        let scenario = format!(
            r#"
[[gpu]]
processes = 0
[[gpu.mig]]
profile = "3g.40gb"
gpu_instance = 1
processes = 2
[[gpu.mig]]
profile = "3g.40gb"
gpu_instance = 2
processes = 1
[[fault]]
at = "0s"
kind = "fails"
fields = ["{field}"]
"#
        );
        let config = rules_config(dir.path());
        let d = Daemon::start_in(dir, &scenario, &config);
        let first = d.snapshot_after(0);
        assert_eq!(first["gpus"][0]["mig_unread"], unread, "{field}: {first}");
        // Five samples later (two 1 s periods and more have closed), nothing breaches.
        let mut seq = first["seq"].as_u64().unwrap();
        for _ in 0..5 {
            seq = d.snapshot_after(seq)["seq"].as_u64().unwrap();
        }
        let s = d.await_scrape(Duration::from_secs(10), |s| {
            breaching(s, "no-processes").is_some()
        });
        assert_eq!(
            breaching(&s, "no-processes"),
            Some(0.0),
            "{field}: {}",
            s.text
        );
        assert_eq!(breaching(&s, "sm-idle"), Some(0.0), "{field}: {}", s.text);
        let audit = d.audit();
        assert!(
            common::events(&audit, "warning").is_empty(),
            "{field}: {audit:?}"
        );
    }
}

/// Under dcgm-exporter's names a GPU in MIG mode is its GPU instances, each labelled
/// `GPU_I_PROFILE` and `GPU_I_ID` beside its GPU's labels (the GPU's UUID, as dcgm-exporter
/// writes it): its own memory and profiling metrics, and its GPU's physical readings.
#[test]
fn dcgm_names_show_each_gpu_instance() {
    let d = Daemon::start(SPLIT, "[exposition]\nnames = \"dcgm\"\n");
    let s = await_mig(&d, |s| {
        s.named("DCGM_FI_PROF_SM_ACTIVE")
            .iter()
            .filter(|x| x.labels.contains_key("GPU_I_ID"))
            .count()
            == 3
    });
    let parent = "GPU-00000000-0000-4000-8000-000000000001";
    for (gi, profile, used_mib, sm) in [
        (1, "3g.40gb", 10240.0, 0.64),
        (5, "2g.20gb", 2048.0, 0.03),
        (6, "2g.20gb", 0.0, 0.0),
    ] {
        let m = |name: &str| {
            metric(name)
                .gpu(0)
                .label("UUID", parent)
                .label("GPU_I_ID", gi)
                .label("GPU_I_PROFILE", profile)
        };
        m("DCGM_FI_DEV_FB_USED").value(used_mib).assert_in(&s);
        m("DCGM_FI_PROF_SM_ACTIVE").value(sm).assert_in(&s);
        m("DCGM_FI_DEV_GPU_TEMP").value(61.0).assert_in(&s);
        m("DCGM_FI_DEV_POWER_USAGE").value(350.0).assert_in(&s);
    }
    // The GPU has no series of its own in MIG mode, and no utilization.
    for family in ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL"] {
        let whole = s
            .named(family)
            .iter()
            .filter(|x| x.labels["gpu"] == "0" && !x.labels.contains_key("GPU_I_ID"))
            .count();
        assert_eq!(whole, 0, "{family}:\n{}", s.text);
    }
    metric("DCGM_FI_DEV_GPU_UTIL")
        .gpu(1)
        .value(50.0)
        .assert_in(&s);
}
