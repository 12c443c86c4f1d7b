//! How often gpuwatch calls NVML, counted by the fake library (`GPUWATCH_FAKE_NVML_CALLS`):
//! what a GPU says of itself is asked once, the readings NVML gives as field values come in one
//! call per GPU per cycle, and a driver without those fields gives the same metrics through
//! each reading's own call.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{metric, Daemon};

/// Two GPUs with GPM, every reading the fake has, time running.
const TWO: &str = r#"
[[gpu]]
utilization = 40
ecc_corrected = 3
ecc_uncorrected = 1
pcie_replays = 9
retired_pages = { single_bit = 2, double_bit = 1, pending = 1 }
clock_event_seconds = { power = 5, thermal = 2, sync_boost = 1, board_limit = 3, low_utilization = 7, reliability = 4 }
[gpu.gpm]
sm_active = 30
[[gpu]]
utilization = 60
[gpu.gpm]
sm_active = 50
"#;

/// The fake's counts, by function, as last written.
fn counts(dir: &Path) -> BTreeMap<String, u64> {
    gpuwatch_fake_nvml::calls::read(&dir.join("calls.txt"))
}

fn n(c: &BTreeMap<String, u64>, f: &str) -> u64 {
    c.get(f).copied().unwrap_or(0)
}

/// Awaits counts written after at least `cycles` more cycles of every GPU than `after` had.
fn await_counts(d: &Daemon, after: &BTreeMap<String, u64>, cycles: u64) -> BTreeMap<String, u64> {
    let want = n(after, "nvmlDeviceGetUtilizationRates") + 2 * cycles;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seq = 0;
    loop {
        let c = counts(d.dir.path());
        if n(&c, "nvmlDeviceGetUtilizationRates") >= want {
            return c;
        }
        assert!(Instant::now() < deadline, "{c:?}\n{}", d.log());
        seq = d.snapshot_after(seq)["seq"].as_u64().unwrap();
    }
}

fn start(scenario: &str, config: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("scenario.toml"), scenario).unwrap();
    let calls = dir.path().join("calls.txt");
    let config = format!(
        "[nvml]\nlibrary = \"{}\"\n{config}",
        common::fake_library().display()
    );
    Daemon::start_with_env(
        dir,
        &config,
        &[("GPUWATCH_FAKE_NVML_CALLS", calls.to_str().unwrap())],
    )
}

/// The identity and what each GPU can do are asked once; the readings with field values
/// (power, its limit, energy, ECC, violation counters, PCIe replays, retired pages) are read
/// in the one field-values call of each GPU's cycle, and never through their own calls; the
/// PCIe link now and a MIG mode that is off are asked once per slow interval.
#[test]
fn what_a_gpu_says_of_itself_is_asked_once_and_field_values_come_in_one_call() {
    let config = "[sampling]\ninterval = \"100ms\"\nslow_interval = \"1h\"\n";
    let d = start(TWO, config);
    let c = await_counts(&d, &BTreeMap::new(), 20);
    for once in [
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlGpmQueryDeviceSupport",
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        "nvmlDeviceGetMigMode",
    ] {
        assert_eq!(n(&c, once), 2, "{once}: {c:?}");
    }
    for never in [
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetRetiredPages_v2",
    ] {
        assert_eq!(n(&c, never), 0, "{never}: {c:?}");
    }
    // GPU 1 retires no pages (as Hopper GPUs): its fields answer "not supported", its own
    // calls are tried once, answer the same, and the reading is recorded unsupported.
    for once in [
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
    ] {
        assert!(n(&c, once) <= 2, "{once}: {c:?}");
    }
    // One field-values call per GPU per cycle (the counts are written between two calls of a
    // cycle, at most one apart).
    let cycles = n(&c, "nvmlDeviceGetUtilizationRates");
    let fields = n(&c, "nvmlDeviceGetFieldValues");
    assert!(cycles.abs_diff(fields) <= 1, "{c:?}");
    // Per GPU per cycle: utilization, memory, temperature, two clocks, throttle reasons,
    // encoder, decoder, field values, processes, and two GPM calls.
    let every_cycle: u64 = c
        .iter()
        .filter(|(f, n)| {
            **n > 8 && !["nvmlDeviceGetCount_v2", "nvmlEventSetWait_v2"].contains(&f.as_str())
        })
        .map(|(_, n)| *n)
        .sum();
    let per_cycle = every_cycle as f64 / cycles as f64;
    assert!((11.5..=12.5).contains(&per_cycle), "{per_cycle}: {c:?}");

    // And the values are those of the scenario.
    let s = d.scrape();
    metric("gpu_ecc_errors_total")
        .gpu(0)
        .label("kind", "corrected")
        .value(3.0)
        .assert_in(&s);
    metric("gpu_pcie_replays_total")
        .gpu(0)
        .value(9.0)
        .assert_in(&s);
    metric("gpu_power_limit_watts")
        .gpu(0)
        .value(700.0)
        .assert_in(&s);
}

/// A GPU that falls off the bus and comes back is asked who it is again, once.
#[test]
fn a_gpu_that_comes_back_is_asked_who_it_is_again() {
    let scenario =
        format!("{TWO}[[fault]]\nat = \"0s\"\nuntil = \"2s\"\ngpu = 1\nkind = \"lost\"\n");
    let d = start(&scenario, "[sampling]\ninterval = \"100ms\"\n");
    d.await_sample(Duration::from_secs(30), |s| {
        s["gpus"][1]["up"] == true && s["gpus"][1]["name"].is_string()
    });
    // Counts written well after that sample (they are written at most once a second).
    let back = await_counts(&d, &counts(d.dir.path()), 30);
    let later = await_counts(&d, &back, 20);
    for once in ["nvmlDeviceGetName", "nvmlGpmQueryDeviceSupport"] {
        // GPU 0 once; GPU 1 once it answered (a lost GPU answers none of them).
        assert_eq!(n(&back, once), 2, "{once}: {back:?}");
        assert_eq!(n(&later, once), 2, "{once}: {later:?}");
    }
}

/// Every field id of a reading that has its own call, unknown to the driver.
const OLDER_DRIVER: &str = "unknown_field_ids = [3, 4, 29, 30, 74, 75, 76, 77, 78, 79, 83, 92, \
                            93, 94, 185, 186, 190]\n";

/// A driver that predates the field ids gives every reading through its own call, with the same
/// values, and says so once per GPU and reading.
#[test]
fn a_driver_without_the_field_ids_gives_the_same_metrics_through_the_calls() {
    let frozen = format!("time = {{ speed = 0, start = \"1h\" }}\n{TWO}");
    let config = "[sampling]\ninterval = \"100ms\"\n";
    let newer = start(&frozen, config);
    let older = start(&format!("{OLDER_DRIVER}{frozen}"), config);
    let device = |d: &Daemon| {
        let s = d.await_scrape(Duration::from_secs(30), |s| {
            metric("gpu_sm_active_ratio").gpu(1).get(s).is_some()
        });
        let lines: Vec<String> = s
            .text
            .lines()
            .filter(|l| l.starts_with("gpu_") && !l.starts_with("gpu_info"))
            .map(str::to_string)
            .collect();
        lines
    };
    let (want, got) = (device(&newer), device(&older));
    assert!(want.len() > 60, "{want:#?}");
    assert_eq!(got, want);
    let c = await_counts(&older, &BTreeMap::new(), 10);
    for by_call in [
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetPcieReplayCounter",
    ] {
        assert!(n(&c, by_call) >= 10, "{by_call}: {c:?}");
    }
    // The only field values left (the memory temperature, remapped rows, NVLink) still come in
    // one call.
    let cycles = n(&c, "nvmlDeviceGetUtilizationRates");
    assert!(
        cycles.abs_diff(n(&c, "nvmlDeviceGetFieldValues")) <= 1,
        "{c:?}"
    );
    let log = older.log();
    // GPU 1 retires no pages: its calls answer "not supported" too, and nothing is said.
    for (reading, gpus) in [
        ("power", 2),
        ("ecc", 2),
        ("clock_events_thermal", 2),
        ("retired_pages", 1),
    ] {
        let said = log
            .lines()
            .filter(|l| {
                l.contains("through its own call") && l.contains(&format!("reading=\"{reading}\""))
            })
            .count();
        assert_eq!(said, gpus, "{reading}:\n{log}");
    }
}
