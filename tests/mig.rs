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
gpm = { sm_active = 64, tensor_active = 40, dram_active = 30 }
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
