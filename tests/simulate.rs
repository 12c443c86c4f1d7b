//! `gpuwatch simulate` replays a trace with golden output (text and JSON), and rules in the JSON
//! form mean exactly what their TOML twins mean.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuwatch::config::Config;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/simulate")
        .join(name)
}

fn golden(args: &[&str], file: &str) {
    golden_with("config.toml", args, file);
}

fn golden_with(config: &str, args: &[&str], file: &str) {
    let (config, trace) = (data(config), data("trace.csv"));
    let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> =
        vec![&"simulate", &"--config", &config, &"--trace", &trace];
    all.extend(args.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
    let got = common::gpuwatch(&all);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(data(file), &got).unwrap();
    }
    let want = std::fs::read_to_string(data(file)).unwrap();
    assert_eq!(
        got, want,
        "simulate output changed; review it and rerun with UPDATE_GOLDEN=1"
    );
}

#[test]
fn replay_timeline_matches_golden_text() {
    golden(&[], "expected.txt");
}

#[test]
fn replay_timeline_matches_golden_json() {
    golden(&["--json"], "expected.jsonl");
    // Each line is one event object with the documented fields.
    let text = std::fs::read_to_string(data("expected.jsonl")).unwrap();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for key in ["time", "rule", "kind", "action", "detail"] {
            assert!(v.get(key).is_some(), "{key} missing in {line}");
        }
    }
    assert!(text.contains("\"kind\":\"action\""));
    assert!(text.contains("\"kind\":\"cancelled\""));
}

/// With a price and a starting spend, budget alerts replay, and the budget-gated rule acts only
/// once 80% of the budget is spent (an hour in, at $10/h from $70 of $100).
#[test]
fn replay_with_spend_matches_golden_text() {
    golden_with(
        "budget.toml",
        &["--price", "10", "--spend", "70"],
        "expected-budget.txt",
    );
    let text = std::fs::read_to_string(data("expected-budget.txt")).unwrap();
    let first_warning = text.lines().find(|l| l.contains(" warning ")).unwrap();
    assert!(
        first_warning.starts_with("2026-11-30T01:00:00Z"),
        "{first_warning}"
    );
}

#[test]
fn json_rules_mean_what_the_toml_rule_means() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rules.json");
    std::fs::write(
        &json,
        r#"{"Rules": [{"Description": "Terminate if GPU idle > 2h",
                       "Actions": [{"Type": "Terminate"}],
                       "Trigger": {"Metric": "GPUUtilization", "Comparison": "LessThan",
                                   "Threshold": 5, "Period": 3600, "EvaluationPeriods": 2}}]}"#,
    )
    .unwrap();
    let mut from_json = Config::default();
    from_json.add_rules_file(&json).unwrap();
    let toml = r#"
[[rules]]
name = "Terminate if GPU idle > 2h"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "1h"
evaluation_periods = 2
action = "terminate"
"#;
    let from_toml = Config::parse(toml, Path::new("t.toml")).unwrap();
    assert_eq!(from_json.rules, from_toml.rules);

    // And the replay of the same trace is the same, event for event.
    let rows =
        gpuwatch::simulate::parse_trace(&std::fs::read_to_string(data("trace.csv")).unwrap())
            .unwrap();
    let a = gpuwatch::simulate::replay_with(&from_json, &rows, &Default::default());
    let b = gpuwatch::simulate::replay_with(&from_toml, &rows, &Default::default());
    assert_eq!(a, b);
}

#[test]
fn bad_rules_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rules.json");
    std::fs::write(
        &json,
        r#"{"Rules": [{"Description": "x", "Actions": [{"Type": "Terminate"}],
           "Trigger": {"Metric": "GPUTemperature", "Comparison": "LessThan", "Threshold": 5, "Period": 60}}]}"#,
    )
    .unwrap();
    let err = Config::default()
        .add_rules_file(&json)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "config: {}: Rules[0].Trigger.Metric: \"GPUTemperature\" is not one of GPUUtilization, GPUMemoryUtilization, GPUMemoryUsedPercent, GPUPowerPercent, GPUProcessCount, SMActivity, TensorActivity, DRAMActivity, GPUHealth",
            json.display()
        )
    );
}

/// The trace's power column becomes `power_ratio` given the power limit; without the limit the
/// readings are unknown, and unknown is busy.
#[test]
fn power_rules_replay_with_the_power_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[actions]\nboot_grace = \"0s\"\nwarning = \"1m\"\n[[rules]]\nname = \"low-power\"\nmetric = \"power_ratio\"\ncomparison = \"less_than\"\nthreshold = 0.2\nperiod = \"5m\"\nevaluation_periods = 2\naction = \"alert\"\n",
    )
    .unwrap();
    let trace = dir.path().join("t.csv");
    let mut csv = String::from("timestamp,gpu,utilization,memory_used_bytes,power_watts\n");
    for m in 0..20 {
        csv.push_str(&format!("{},0,0.01,0,70\n", 1_796_000_400 + m * 60));
    }
    std::fs::write(&trace, csv).unwrap();
    let run = |extra: &[&str]| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"simulate", &"--config", &config, &"--trace", &trace];
        args.extend(extra.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
        common::gpuwatch(&args)
    };
    let with = run(&["--power-limit-watts", "700"]);
    assert!(
        with.contains(" action     low-power: would alert"),
        "{with}"
    );
    let without = run(&[]);
    assert_eq!(without, "no rule breached: no warning, no action\n");
}

/// The daemon and `gpuwatch simulate` run one decision step. One trace, played through the
/// daemon by the fake NVML and through `simulate` from the samples the daemon took, gives the
/// same events: kind, rule, and time within one sample.
#[test]
fn the_daemon_and_simulate_decide_the_same() {
    const INTERVAL: f64 = 0.2;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // GPU 0 idles, works for a second and a half from 7 s, then idles again; GPU 1 idles.
    std::fs::write(
        dir.path().join("u.csv"),
        "0,2\n7,2\n7.01,60\n8.5,60\n8.51,2\n120,2\n",
    )
    .unwrap();
    let scenario = format!(
        "[[gpu]]\nutilization = {{ kind = \"trace\", file = \"{}\" }}\n[[gpu]]\nutilization = 1\n",
        dir.path().join("u.csv").display()
    );
    let config = format!(
        "[sampling]\ninterval = \"200ms\"\ntimeout = \"1s\"\n\
         [actions]\nboot_grace = \"0s\"\nwarning = \"2s\"\nwall = false\nstate_dir = \"{}\"\n\
         [[rules]]\nname = \"idle-alert\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"alert\"\n\
         [[rules]]\nname = \"idle-stop\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"2s\"\nevaluation_periods = 2\naction = \"stop\"\n",
        state.display()
    );
    let d = common::Daemon::start_in(dir, &scenario, &config);

    // Record every sample the daemon takes, for 18 seconds of its time.
    let mut trace = String::new();
    let (mut seq, mut first, mut last) = (0, None, 0.0);
    while last - first.unwrap_or(last) < 18.0 {
        let snap = d.snapshot_after(seq);
        seq = snap["seq"].as_u64().unwrap();
        last = snap["timestamp"].as_f64().unwrap();
        first.get_or_insert(last);
        for g in snap["gpus"].as_array().unwrap() {
            let u = g["utilization_ratio"]
                .as_f64()
                .map_or(String::new(), |u| u.to_string());
            trace.push_str(&format!("{last},{},{u}\n", g["index"]));
        }
    }
    // The sample at `last` is published before the decision loop has decided on it: the status
    // of a sample is served once the loop is done with it, its records written.
    let status = d.get(&format!("/api/v1/status?after={}&timeout=10s", seq - 1));
    assert_eq!(status.status, 200, "{}", status.body);
    let trace_path = d.dir.path().join("trace.csv");
    std::fs::write(&trace_path, &trace).unwrap();
    let config_path = d.dir.path().join("gpuwatch.toml");
    let replay = common::gpuwatch(&[
        &"simulate",
        &"--config",
        &config_path,
        &"--trace",
        &trace_path,
        &"--json",
    ]);
    let simulated: Vec<(String, String, f64)> = replay
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] != "node_down")
        .map(|v| {
            let kind = v["kind"].as_str().unwrap().to_string();
            (
                kind,
                v["rule"].as_str().unwrap().to_string(),
                v["at"].as_f64().unwrap(),
            )
        })
        .collect();

    // The daemon's decisions on the recorded samples, in dry-run. The replay takes the node
    // down at the first stop: the daemon's later decisions for that rule are not in it.
    let stopped_at = simulated
        .iter()
        .find(|(kind, rule, _)| kind == "action" && rule == "idle-stop")
        .map(|e| e.2)
        .expect("the replay stops the node");
    let decided: Vec<(String, String, f64)> = d
        .audit()
        .iter()
        .filter_map(|r| {
            let kind = match r["event"].as_str()? {
                "action_attempt" => "action",
                k @ ("breach" | "recovered" | "warning" | "cancelled" | "postponed") => k,
                _ => return None,
            };
            let (rule, at) = (r["rule"].as_str()?.to_string(), r["at"].as_f64()?);
            (at <= last && (rule != "idle-stop" || at <= stopped_at))
                .then(|| (kind.to_string(), rule, at))
        })
        .collect();

    let kinds = |events: &[(String, String, f64)]| {
        events
            .iter()
            .map(|(k, r, _)| format!("{r} {k}"))
            .collect::<Vec<_>>()
    };
    // Rule by rule, the same events in the same order, each within one sample of its twin.
    for rule in ["idle-alert", "idle-stop"] {
        let of = |events: &[(String, String, f64)]| -> Vec<(String, String, f64)> {
            events.iter().filter(|e| e.1 == rule).cloned().collect()
        };
        let (daemon, replay) = (of(&decided), of(&simulated));
        assert_eq!(
            kinds(&daemon),
            kinds(&replay),
            "daemon {decided:?}\nsimulate {simulated:?}"
        );
        for (d, r) in daemon.iter().zip(&replay) {
            assert!((d.2 - r.2).abs() <= INTERVAL + 1e-3, "{d:?} vs {r:?}");
        }
    }
    // The trace exercised warnings, a cancellation by the busy second and both rules' actions.
    let all = kinds(&decided).join("\n");
    for want in [
        "idle-alert warning",
        "idle-alert cancelled",
        "idle-alert action",
        "idle-stop action",
    ] {
        assert!(all.contains(want), "{want} missing:\n{all}");
    }
}

/// A node is terminated once: after the first instance action the replay says the node is down,
/// reports no further instance action, and stops its spend; an alert rule goes on. A stop that
/// the daemon would refuse (a one-time spot instance) leaves the node up.
#[test]
fn an_instance_action_takes_the_node_down_once() {
    let rules = |action: &str, spot_stop: &str| {
        Config::parse(
            &format!(
                "[actions]\nboot_grace = \"10m\"\nwarning = \"10m\"\nspot_stop = \"{spot_stop}\"\n\
                 [[rules]]\nname = \"idle-2h\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
                 threshold = 0.05\nperiod = \"1h\"\nevaluation_periods = 2\naction = \"{action}\"\n\
                 [[rules]]\nname = \"idle-alert\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
                 threshold = 0.05\nperiod = \"30m\"\nevaluation_periods = 2\naction = \"alert\"\n"
            ),
            Path::new("t.toml"),
        )
        .unwrap()
    };
    // Six hours, idle throughout, one sample a minute, from 2026-11-30T00:00:00Z.
    let rows: Vec<gpuwatch::simulate::Row> = (0..=360)
        .map(|m| gpuwatch::simulate::Row {
            t: 1_795_996_800.0 + f64::from(m) * 60.0,
            gpu: 0,
            utilization: Some(0.01),
            memory_used_bytes: None,
            power_watts: None,
            pod: None,
            job: None,
            user: None,
            sm_active: None,
            tensor_active: None,
        })
        .collect();
    let options = |lifecycle| gpuwatch::simulate::Options {
        lifecycle,
        spend: Some(gpuwatch::simulate::Spend {
            usd_per_hour: 10.0,
            start_usd: 0.0,
        }),
        ..Default::default()
    };
    let kinds = |reports: &[gpuwatch::simulate::Report], rule: &str| {
        reports
            .iter()
            .filter(|r| r.rule == rule)
            .map(|r| r.kind)
            .collect::<Vec<_>>()
    };

    let r = gpuwatch::simulate::replay_with(&rules("terminate", "refuse"), &rows, &options(None));
    assert_eq!(
        kinds(&r, "idle-2h"),
        vec!["breach", "warning", "action", "node_down"],
        "{r:#?}"
    );
    let down = r.iter().find(|r| r.kind == "node_down").unwrap();
    assert_eq!(down.time, "2026-11-30T02:10:00Z");
    assert!(down.detail.contains("terminated"), "{}", down.detail);
    // The alert rule re-arms and alerts again after the node went down, as in the daemon.
    let alerts = r
        .iter()
        .filter(|x| x.rule == "idle-alert" && x.kind == "action")
        .count();
    assert!(alerts >= 3, "{r:#?}");

    // A stop on a one-time spot instance with spot_stop = "terminate" terminates it.
    let r = gpuwatch::simulate::replay_with(
        &rules("stop", "terminate"),
        &rows,
        &options(Some(gpuwatch::rules::Lifecycle::Spot)),
    );
    let down = r.iter().find(|r| r.kind == "node_down").unwrap();
    assert!(down.detail.contains("terminated"), "{}", down.detail);

    // With spot_stop = "refuse" the daemon refuses the stop: the node stays up, and the rule
    // acts again on fresh periods.
    let r = gpuwatch::simulate::replay_with(
        &rules("stop", "refuse"),
        &rows,
        &options(Some(gpuwatch::rules::Lifecycle::Spot)),
    );
    let k = kinds(&r, "idle-2h");
    assert!(!k.contains(&"node_down"), "{r:#?}");
    assert_eq!(k.iter().filter(|k| **k == "refused").count(), 2, "{r:#?}");
}

/// A price or starting spend that is not a finite amount is refused (exit 64) before any replay:
/// an infinite spend would make the forecast NaN.
#[test]
fn simulate_refuses_prices_that_are_not_amounts() {
    let (config, trace) = (data("budget.toml"), data("trace.csv"));
    for (price, spend) in [
        ("inf", "0"),
        ("10", "inf"),
        ("NaN", "0"),
        ("0", "0"),
        ("20000", "0"),
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(["simulate", "--config"])
            .arg(&config)
            .arg("--trace")
            .arg(&trace)
            .args(["--price", price, "--spend", spend])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(64),
            "--price {price} --spend {spend}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--price must be above 0"), "{err}");
    }
}

/// A pod-scoped rule judges each pod of the trace's `pod` column on its own GPUs: the pod that
/// holds an idle GPU is alerted about, by name, though the node as a whole is busy.
#[test]
fn pod_scoped_rules_replay_per_pod() {
    let config = Config::parse(
        "[actions]\nboot_grace = \"0s\"\nwarning = \"5m\"\n\
         [[rules]]\nname = \"pod-idle\"\nscope = \"pod\"\nmetric = \"gpu_utilization\"\n\
         comparison = \"less_than\"\nthreshold = 0.05\nperiod = \"10m\"\nevaluation_periods = 2\naction = \"alert\"\n",
        Path::new("pod.toml"),
    )
    .unwrap();
    // An hour, a sample a minute: ml/notebook holds GPU 0 and leaves it idle, ml/train works
    // GPU 1 hard.
    let mut trace = String::from("timestamp,gpu,utilization,memory_used_bytes,power_watts,pod\n");
    for m in 0..60 {
        let t = 1_795_996_800 + m * 60;
        trace.push_str(&format!(
            "{t},0,0.01,,,ml/notebook\n{t},1,0.95,,,ml/train\n"
        ));
    }
    let rows = gpuwatch::simulate::parse_trace(&trace).unwrap();
    let reports = gpuwatch::simulate::replay_with(&config, &rows, &Default::default());
    let seen: Vec<(&str, &str, &str)> = reports
        .iter()
        .map(|r| (r.time.as_str(), r.rule.as_str(), r.kind))
        .collect();
    // Breach after two idle periods, warn, alert; the alert re-arms on fresh periods, as in
    // the daemon. ml/train never appears.
    assert_eq!(
        seen,
        [
            ("2026-11-30T00:20:00Z", "pod-idle ml/notebook", "breach"),
            ("2026-11-30T00:20:00Z", "pod-idle ml/notebook", "warning"),
            ("2026-11-30T00:25:00Z", "pod-idle ml/notebook", "action"),
            ("2026-11-30T00:50:00Z", "pod-idle ml/notebook", "warning"),
            ("2026-11-30T00:55:00Z", "pod-idle ml/notebook", "action"),
        ],
        "{reports:#?}"
    );
    // An instance action is refused for a pod-scoped rule, naming the key.
    let err = Config::parse(
        "[[rules]]\nname = \"p\"\nscope = \"pod\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"10m\"\naction = \"terminate\"\n",
        Path::new("pod.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("rules[0].action: \"terminate\" acts on the instance"),
        "{err}"
    );
}

/// `simulate` takes GPM's `sm_active` and `tensor_active` columns: a GPU at 100% utilization and
/// 2% SM activity breaches an `sm_active` rule (TOML, or `SMActivity` in the JSON form, the
/// same rule) and not a `gpu_utilization` one; a row without the column is unknown, so busy.
#[test]
fn simulate_replays_sm_activity() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        "[actions]\nboot_grace = \"0s\"\nwarning = \"1m\"\n\
         [[rules]]\nname = \"sm\"\nmetric = \"sm_active\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"5m\"\nevaluation_periods = 2\naction = \"alert\"\n\
         [[rules]]\nname = \"util\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"5m\"\nevaluation_periods = 2\naction = \"alert\"\n",
    )
    .unwrap();
    let json = dir.path().join("rules.json");
    std::fs::write(
        &json,
        r#"{"Rules": [{"Description": "sm-json", "Actions": [{"Type": "Alert"}],
           "Trigger": {"Metric": "SMActivity", "Comparison": "LessThan", "Threshold": 5,
                       "Period": 300, "EvaluationPeriods": 2}}]}"#,
    )
    .unwrap();
    // An hour, a row a minute: 100% utilization, 2% SM activity (the last column empty).
    let trace = dir.path().join("trace.csv");
    let mut text = String::from(
        "timestamp,gpu,utilization,memory_used_bytes,power_watts,pod,sm_active,tensor_active\n",
    );
    for m in 0..=60 {
        text.push_str(&format!("{},0,100%,,,,2%,\n", 1_796_000_000 + m * 60));
    }
    std::fs::write(&trace, text).unwrap();
    let out = Command::new(common::BIN)
        .args(["simulate", "--json", "--config"])
        .arg(&config)
        .arg("--rules")
        .arg(&json)
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let breaches = |rule: &str| {
        events
            .iter()
            .filter(|e| e["rule"] == rule && e["kind"] == "breach")
            .count()
    };
    assert_eq!(breaches("sm"), 1, "{events:?}");
    assert_eq!(breaches("util"), 0, "{events:?}");
    // The JSON rule is the same rule: it breaches at the same moment.
    let at = |rule: &str| {
        events
            .iter()
            .find(|e| e["rule"] == rule && e["kind"] == "breach")
            .map(|e| e["at"].clone())
    };
    let json_rule = events
        .iter()
        .find(|e| e["rule"] != "sm" && e["rule"] != "util" && e["kind"] == "breach")
        .unwrap_or_else(|| panic!("the JSON rule never breached: {events:?}"));
    assert_eq!(Some(json_rule["at"].clone()), at("sm"));
}

#[test]
fn job_and_user_rules_replay_per_job_and_per_user() {
    let rule = |scope: &str| {
        format!(
            "[[rules]]\nname = \"{scope}-idle\"\nscope = \"{scope}\"\nmetric = \"gpu_utilization\"\n\
             comparison = \"less_than\"\nthreshold = 0.05\nperiod = \"10m\"\nevaluation_periods = 2\naction = \"alert\"\n"
        )
    };
    let config = Config::parse(
        &format!(
            "[actions]\nboot_grace = \"0s\"\nwarning = \"5m\"\n[slurm]\nenabled = true\n{}{}",
            rule("job"),
            rule("user")
        ),
        Path::new("jobs.toml"),
    )
    .unwrap();
    // Half an hour: job 4242 of alice leaves GPU 0 idle, job 4243 of bob works GPU 1.
    let mut trace = String::from(
        "timestamp,gpu,utilization,memory_used_bytes,power_watts,pod,sm_active,tensor_active,job,user\n",
    );
    for m in 0..30 {
        let t = 1_795_996_800 + m * 60;
        trace.push_str(&format!(
            "{t},0,0.01,,,,,,4242,alice\n{t},1,0.95,,,,,,4243,bob\n"
        ));
    }
    let rows = gpuwatch::simulate::parse_trace(&trace).unwrap();
    let reports = gpuwatch::simulate::replay_with(&config, &rows, &Default::default());
    let seen: Vec<(&str, &str, &str)> = reports
        .iter()
        .map(|r| (r.time.as_str(), r.rule.as_str(), r.kind))
        .collect();
    assert_eq!(
        seen,
        [
            ("2026-11-30T00:20:00Z", "job-idle job 4242", "breach"),
            ("2026-11-30T00:20:00Z", "job-idle job 4242", "warning"),
            ("2026-11-30T00:20:00Z", "user-idle user alice", "breach"),
            ("2026-11-30T00:20:00Z", "user-idle user alice", "warning"),
            ("2026-11-30T00:25:00Z", "job-idle job 4242", "action"),
            ("2026-11-30T00:25:00Z", "user-idle user alice", "action"),
        ],
        "{reports:#?}"
    );
}
