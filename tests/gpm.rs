//! GPM over the fake NVML, end to end: every metric equals the scenario in Prometheus units
//! (and under dcgm-exporter's names), a GPU without GPM has none of them (never 0), a GPM call
//! that fails leaves them absent and is counted, and an idle rule on `sm_active` catches a GPU
//! that reads 100% utilization while its SMs idle, where a `gpu_utilization` rule does not.

mod common;

use std::time::Duration;

use common::{metric, Daemon, Scrape, DCGM_LINT};

const MIB: f64 = 1024.0 * 1024.0;

/// GPU 0 with every GPM metric constant; GPU 1 without GPM.
const SCENARIO: &str = r#"
[[gpu]]
utilization = 90
gpm = { sm_active = 37, sm_occupancy = 21, graphics_active = 41, tensor_active = 12, dram_active = 33, fp64_active = 1, fp32_active = 22, fp16_active = 9, integer_active = 4, pcie_tx_mib_per_second = 100, pcie_rx_mib_per_second = 250, nvlink_tx_mib_per_second = 4000, nvlink_rx_mib_per_second = 3500 }
[[gpu]]
name = "NVIDIA A10G"
utilization = 50
"#;

fn await_gpm(d: &Daemon) -> Scrape {
    d.await_scrape(Duration::from_secs(20), |s| {
        !s.named("gpu_sm_active_ratio").is_empty()
    })
}

#[test]
fn every_gpm_metric_equals_the_scenario_in_prometheus_units() {
    let d = Daemon::start(SCENARIO, "[exposition]\nnames = \"both\"\n");
    let s = await_gpm(&d);
    for (name, labels, want) in [
        ("gpu_sm_active_ratio", vec![], 0.37),
        ("gpu_sm_occupancy_ratio", vec![], 0.21),
        ("gpu_graphics_engine_active_ratio", vec![], 0.41),
        ("gpu_tensor_active_ratio", vec![], 0.12),
        ("gpu_dram_active_ratio", vec![], 0.33),
        ("gpu_pipe_active_ratio", vec![("pipe", "fp64")], 0.01),
        ("gpu_pipe_active_ratio", vec![("pipe", "fp32")], 0.22),
        ("gpu_pipe_active_ratio", vec![("pipe", "fp16")], 0.09),
        ("gpu_pipe_active_ratio", vec![("pipe", "integer")], 0.04),
        (
            "gpu_pcie_bytes_per_second",
            vec![("direction", "tx")],
            100.0 * MIB,
        ),
        (
            "gpu_pcie_bytes_per_second",
            vec![("direction", "rx")],
            250.0 * MIB,
        ),
        (
            "gpu_nvlink_bytes_per_second",
            vec![("direction", "tx")],
            4000.0 * MIB,
        ),
        (
            "gpu_nvlink_bytes_per_second",
            vec![("direction", "rx")],
            3500.0 * MIB,
        ),
        ("gpu_gpm_supported", vec![], 1.0),
        ("DCGM_FI_PROF_SM_ACTIVE", vec![], 0.37),
        ("DCGM_FI_PROF_SM_OCCUPANCY", vec![], 0.21),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", vec![], 0.41),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", vec![], 0.12),
        ("DCGM_FI_PROF_DRAM_ACTIVE", vec![], 0.33),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", vec![], 100.0 * MIB),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", vec![], 250.0 * MIB),
    ] {
        let mut m = metric(name).gpu(0);
        for (k, v) in labels {
            m = m.label(k, v);
        }
        m.value(want).assert_in(&s);
    }
    // GPU 1 has no GPM: it says so, and has none of the metrics (absent, never 0).
    metric("gpu_gpm_supported").gpu(1).value(0.0).assert_in(&s);
    for name in [
        "gpu_sm_active_ratio",
        "gpu_tensor_active_ratio",
        "gpu_dram_active_ratio",
        "gpu_pipe_active_ratio",
        "gpu_pcie_bytes_per_second",
        "DCGM_FI_PROF_SM_ACTIVE",
    ] {
        assert!(
            s.named(name).iter().all(|x| x.labels["gpu"] == "0"),
            "{name} for GPU 1:\n{}",
            s.text
        );
    }
    // dcgm-exporter's labels are camelCase: its interface, not a slip.
    common::assert_promtool_accepts_but(&s.text, DCGM_LINT);
}

#[test]
fn a_failing_gpm_call_leaves_the_metrics_absent_and_is_counted() {
    let scenario = format!(
        "{SCENARIO}[[fault]]\nat = \"0s\"\ngpu = 0\nkind = \"fails\"\nfields = [\"gpm\"]\n"
    );
    let d = Daemon::start(&scenario, "");
    let s = d.await_scrape(Duration::from_secs(20), |s| {
        metric("gpuwatch_sample_errors_total")
            .label("kind", "read_failed")
            .get(s)
            .is_some_and(|v| v >= 2.0)
    });
    metric("gpu_gpm_supported").gpu(0).value(1.0).assert_in(&s);
    metric("gpu_sm_active_ratio").gpu(0).absent().assert_in(&s);
    // The other readings are unaffected.
    metric("gpu_utilization_ratio")
        .gpu(0)
        .value(0.9)
        .assert_in(&s);
    assert!(d.log().contains("field=\"gpm_sample\""), "{}", d.log());
}

/// The case GPM is for: utilization reads 100% (a kernel is always running) while the SMs are
/// 2% active. A rule on `gpu_utilization` sees a busy GPU; a rule on `sm_active` sees it idle.
/// And a GPU without GPM is unknown to an `sm_active` rule, which counts as busy, while a
/// `gpu_utilization` rule sees it idle.
#[test]
fn an_sm_active_rule_catches_a_gpu_that_utilization_calls_busy() {
    let rules = "[actions]\nboot_grace = \"0s\"\nwarning = \"1h\"\nwall = false\n".to_string()
        + &rule("util-idle", "gpu_utilization")
        + &rule("sm-idle", "sm_active");
    let start = |scenario: &str| {
        let dir = tempfile::tempdir().unwrap();
        let config = rules.replacen(
            "[actions]\n",
            &format!(
                "[actions]\nstate_dir = \"{}\"\n",
                dir.path().join("state").display()
            ),
            1,
        );
        Daemon::start_in(dir, scenario, &config)
    };
    let breaching =
        |s: &Scrape, rule: &str| metric("gpuwatch_rule_breaching").label("rule", rule).get(s);

    // Spinning: 100% utilization, 2% SM activity.
    let spinning = start("[[gpu]]\nutilization = 100\nprocesses = 1\ngpm = { sm_active = 2 }\n");
    let s = spinning.await_scrape(Duration::from_secs(30), |s| {
        breaching(s, "sm-idle") == Some(1.0)
    });
    assert_eq!(breaching(&s, "util-idle"), Some(0.0), "{}", s.text);
    metric("gpu_sm_active_ratio")
        .gpu(0)
        .value(0.02)
        .assert_in(&s);

    // No GPM, and idle: the utilization rule breaches; the SM rule sees unknown, so busy.
    let old = start("[[gpu]]\nname = \"NVIDIA A10G\"\nutilization = 0\n");
    let s = old.await_scrape(Duration::from_secs(30), |s| {
        breaching(s, "util-idle") == Some(1.0)
    });
    // By now the SM rule has judged the same periods: unknown each time.
    assert_eq!(breaching(&s, "sm-idle"), Some(0.0), "{}", s.text);
    metric("gpu_gpm_supported").gpu(0).value(0.0).assert_in(&s);
}

/// An idle rule over two 1 s periods on `metric`, that alerts.
fn rule(name: &str, metric: &str) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nmetric = \"{metric}\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"alert\"\n"
    )
}

/// `check-config` warns about a rule on a GPM metric when this node's GPUs lack GPM (here GPU
/// 1), and says nothing when they all have it.
#[test]
fn check_config_warns_when_the_gpus_have_no_gpm() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[nvml]\nlibrary = \"{}\"\n[[rules]]\nname = \"sm-idle\"\nmetric = \"sm_active\"\n\
             comparison = \"less_than\"\nthreshold = 0.05\nperiod = \"5m\"\nevaluation_periods = 2\n\
             action = \"alert\"\n",
            common::fake_library().display()
        ),
    )
    .unwrap();
    let check = |scenario: &str| {
        let path = dir.path().join("scenario.toml");
        std::fs::write(&path, scenario).unwrap();
        let out = std::process::Command::new(common::BIN)
            .args(["check-config"])
            .arg(&config)
            .env("GPUWATCH_FAKE_NVML_SCENARIO", &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = check(SCENARIO);
    assert!(
        err.contains("warning: rules.sm-idle: metric \"sm_active\": GPU 1 of this node has no GPM"),
        "{err}"
    );
    let err = check("[[gpu]]\ngpm = { sm_active = 50 }\n");
    assert!(!err.contains("warning"), "{err}");
}

/// The buffers are allocated once per GPU with GPM (two each) and freed when the GPU is lost:
/// GPU 1 falls off the bus at 6 s (late enough for a loaded machine to have read GPM from both
/// GPUs before), and its two buffers go.
#[test]
fn gpm_buffers_are_allocated_once_and_freed_when_the_gpu_is_lost() {
    let scenario = "[[gpu]]\ngpm = { sm_active = 10 }\n[[gpu]]\ngpm = { sm_active = 20 }\n\
                    [[gpu]]\nname = \"NVIDIA A10G\"\n\
                    [[fault]]\nat = \"6s\"\ngpu = 1\nkind = \"lost\"\n";
    let d = Daemon::start(scenario, "");
    let buffers = |s: &Scrape| metric("gpuwatch_gpm_sample_buffers").get(s);
    // Two GPUs with GPM: four buffers, and still four a few cycles on (none leaked per cycle).
    let s = d.await_scrape(Duration::from_secs(20), |s| {
        metric("gpu_sm_active_ratio").gpu(1).get(s).is_some()
    });
    assert_eq!(buffers(&s), Some(4.0), "{}", s.text);
    let s = d.await_scrape(Duration::from_secs(20), |s| {
        metric("gpu_up").gpu(1).get(s) == Some(0.0)
    });
    assert_eq!(buffers(&s), Some(2.0), "{}", s.text);
    metric("gpu_sm_active_ratio")
        .gpu(0)
        .value(0.1)
        .assert_in(&s);
    metric("gpu_sm_active_ratio").gpu(1).absent().assert_in(&s);
}
