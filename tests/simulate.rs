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
    let from_toml = gpuwatch::cloud::parse_config(toml, Path::new("t.toml")).unwrap();
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

/// The daemon's sampling interval in the differential tests, in seconds: each event of one
/// edge has its twin in the other within one sample.
const INTERVAL: f64 = 0.2;

/// An event as both edges tell it: its kind, its rule, and the time of the sample it was
/// decided on.
type Decided = (String, String, f64);

/// A config for the differential tests: a sample every 200 ms, no boot grace, a warning of two
/// seconds, dry-run, the state in `dir/state`, and these rules.
fn differential_config(dir: &Path, rules: &str) -> String {
    format!(
        "[sampling]\ninterval = \"200ms\"\ntimeout = \"1s\"\n\
         [actions]\nboot_grace = \"0s\"\nwarning = \"2s\"\nwall = false\nstate_dir = \"{}\"\n{rules}",
        dir.join("state").display()
    )
}

/// An idle rule on `gpu_utilization` under 5%.
fn idle_rule(name: &str, period: &str, action: &str) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"{period}\"\nevaluation_periods = 2\naction = \"{action}\"\n"
    )
}

/// Records every sample the daemon takes, for `secs` seconds of its time, as a trace
/// (`timestamp,gpu,utilization`), calling `each` with each sample's time and sequence number
/// once it is recorded. Returns the trace and the last sample's time, once the daemon has
/// decided on it.
fn record_trace(d: &common::Daemon, secs: f64, mut each: impl FnMut(f64, u64)) -> (String, f64) {
    let mut trace = String::new();
    let (mut seq, mut first, mut last) = (0, None, 0.0);
    while last - first.unwrap_or(last) < secs {
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
        each(last, seq);
    }
    decided_on(d, seq);
    (trace, last)
}

/// Waits until the daemon has decided on sample `seq`: a sample is published before the
/// decision loop has decided on it, and its status is served once the loop is done with it,
/// its records written and its state saved (or not).
fn decided_on(d: &common::Daemon, seq: u64) {
    let status = d.get(&format!("/api/v1/status?after={}&timeout=10s", seq - 1));
    assert_eq!(status.status, 200, "{}", status.body);
}

/// The daemon's decisions on the samples up to `last`, from its audit log (in dry-run, an action
/// is its attempt), leaving out those of `stopped` (a rule and the time the replay took the node
/// down with it) after that time: the replay reports no instance action of a node that is down.
fn decided_by(d: &common::Daemon, last: f64, stopped: Option<(&str, f64)>) -> Vec<Decided> {
    d.audit()
        .iter()
        .filter_map(|r| {
            let kind = match r["event"].as_str()? {
                "action_attempt" => "action",
                k @ ("breach" | "recovered" | "warning" | "cancelled" | "postponed") => k,
                _ => return None,
            };
            let (rule, at) = (r["rule"].as_str()?.to_string(), r["at"].as_f64()?);
            let after_stop = stopped.is_some_and(|(s, t)| rule == s && at > t);
            (at <= last && !after_stop).then(|| (kind.to_string(), rule, at))
        })
        .collect()
}

/// The events of a replay's report that the daemon's audit log has too.
fn simulated_of(reports: &[gpuwatch::simulate::Report]) -> Vec<Decided> {
    reports
        .iter()
        .filter(|r| !["node_down", "withdrawn"].contains(&r.kind))
        .map(|r| (r.kind.to_string(), r.rule.clone(), r.at))
        .collect()
}

fn kinds(events: &[Decided]) -> Vec<String> {
    events.iter().map(|(k, r, _)| format!("{r} {k}")).collect()
}

/// Rule by rule, the same events in the same order, each within one sample of its twin.
fn assert_same(decided: &[Decided], simulated: &[Decided], rules: &[&str]) {
    for rule in rules {
        let of = |events: &[Decided]| -> Vec<Decided> {
            events.iter().filter(|e| e.1 == *rule).cloned().collect()
        };
        let (daemon, replay) = (of(decided), of(simulated));
        assert_eq!(
            kinds(&daemon),
            kinds(&replay),
            "daemon {decided:?}\nsimulate {simulated:?}"
        );
        for (d, r) in daemon.iter().zip(&replay) {
            assert!(
                (d.2 - r.2).abs() <= INTERVAL + 1e-3,
                "{d:?} vs {r:?}\ndaemon {decided:?}\nsimulate {simulated:?}"
            );
        }
    }
}

/// The daemon and `gpuwatch simulate` run one decision step. One trace, played through the
/// daemon by the fake NVML and through `simulate` from the samples the daemon took, gives the
/// same events: kind, rule, and time within one sample.
#[test]
fn the_daemon_and_simulate_decide_the_same() {
    let dir = tempfile::tempdir().unwrap();
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
    let config = differential_config(
        dir.path(),
        &(idle_rule("idle-alert", "1s", "alert") + &idle_rule("idle-stop", "2s", "stop")),
    );
    let d = common::Daemon::start_in(dir, &scenario, &config);

    // Every sample the daemon takes, for 18 seconds of its time, replayed.
    let (trace, last) = record_trace(&d, 18.0, |_, _| {});
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
    let simulated: Vec<Decided> = replay
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
    let decided = decided_by(&d, last, Some(("idle-stop", stopped_at)));
    assert_same(&decided, &simulated, &["idle-alert", "idle-stop"]);
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

/// Puts a directory where `state.json` goes, so that every save of the state fails (the rename
/// onto it does) while the audit log is written as ever; gives the file back with `false`.
fn state_unwritable(state: &Path, unwritable: bool) {
    let file = state.join("state.json");
    if !unwritable {
        return std::fs::remove_dir(&file).unwrap();
    }
    // The daemon may save between the removal and the directory: then again.
    loop {
        let _ = std::fs::remove_file(&file);
        match std::fs::create_dir(&file) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("{}: {e}", file.display()),
        }
    }
}

/// The daemon and `simulate` withdraw a warning alike, and withhold alike what a failed save
/// cannot make durable. The alert rule's first warning is withdrawn because GPU 0 is read
/// without its utilization (unknown is busy), its second because GPU 0 is used again; during
/// its third `state.json` becomes unwritable, so each time its action falls due it is withdrawn
/// (not recorded) and falls due again, until the state can be saved and it runs. The replay is
/// told the span over which the daemon's saves failed.
#[test]
fn the_daemon_and_simulate_withdraw_and_withhold_the_same() {
    let dir = tempfile::tempdir().unwrap();
    // GPU 0 idles, has no utilization reading from 3 s to 3.4 s, works from 7 s to 7.5 s, then
    // idles again; GPU 1 idles.
    std::fs::write(
        dir.path().join("u.csv"),
        "0,2\n7,2\n7.01,60\n7.5,60\n7.51,2\n120,2\n",
    )
    .unwrap();
    let scenario = format!(
        "[[gpu]]\nutilization = {{ kind = \"trace\", file = \"{}\" }}\n[[gpu]]\nutilization = 1\n\
         [[fault]]\nat = \"3s\"\nuntil = \"3400ms\"\ngpu = 0\nkind = \"fails\"\nfields = [\"utilization\"]\n",
        dir.path().join("u.csv").display()
    );
    let config = differential_config(dir.path(), &idle_rule("idle-alert", "1s", "alert"));
    let d = common::Daemon::start_in(dir, &scenario, &config);
    let state = d.dir.path().join("state");
    let withdrawn = |s: &common::Scrape| {
        common::metric("gpuwatch_actions_total")
            .label("result", "not_recorded")
            .get(s)
            .unwrap_or(0.0)
    };

    // The saves fail after the sample on which the third warning is on record, up to the one
    // on which the action has been withdrawn three times. Each change is made once the daemon
    // has decided on the sample just taken, a sample before the next: so the span of samples
    // whose saves failed is known exactly (the samples after `from`, up to `until`).
    let (mut from, mut until) = (None, None);
    let (trace, last) = record_trace(&d, 18.0, |t, seq| {
        if from.is_none() && common::events(&d.audit(), "warning").len() >= 3 {
            decided_on(&d, seq);
            state_unwritable(&state, true);
            from = Some(t + 1e-3);
        } else if from.is_some() && until.is_none() {
            decided_on(&d, seq);
            if withdrawn(&d.scrape()) >= 3.0 {
                state_unwritable(&state, false);
                until = Some(t + 1e-3);
            }
        }
    });
    let span = from.zip(until).expect("the state was unwritable a while");
    let config = gpuwatch::cloud::load_config(&d.dir.path().join("gpuwatch.toml")).unwrap();
    let rows = gpuwatch::simulate::parse_trace(&trace).unwrap();
    let options = gpuwatch::simulate::Options {
        state_unwritable: Some(span),
        ..Default::default()
    };
    let reports = gpuwatch::simulate::replay_with(&config, &rows, &options);
    let decided = decided_by(&d, last, None);
    assert_same(&decided, &simulated_of(&reports), &["idle-alert"]);
    // Each cancellation for the same reason: GPU 0 read without its utilization, then in use.
    let audit = d.audit();
    let reasons: Vec<String> = common::events(&audit, "cancelled")
        .iter()
        .map(|c| format!("alert cancelled: {}", c["reason"].as_str().unwrap()))
        .collect();
    let replayed: Vec<&str> = reports
        .iter()
        .filter(|r| r.kind == "cancelled")
        .map(|r| r.detail.as_str())
        .collect();
    assert_eq!(reasons, replayed);
    assert_eq!(
        reasons,
        [
            "alert cancelled: GPU 0 has no gpu_utilization reading",
            "alert cancelled: GPU 0 came back: gpu_utilization 0.600",
        ]
    );

    // The action runs once the state is saved, after the span.
    let acted = decided
        .iter()
        .find(|e| e.0 == "action" && e.2 > span.0)
        .expect("the action ran once the state was saved");
    assert!(acted.2 > span.1, "{acted:?} ran in {span:?}");
    // Until then, the replay withdrew it as often as the daemon did.
    let replayed = reports.iter().filter(|r| r.kind == "withdrawn").count() as f64;
    assert!(replayed >= 3.0, "{reports:#?}");
    assert_eq!(replayed, withdrawn(&d.scrape()));
    let line = reports.iter().find(|r| r.kind == "withdrawn").unwrap();
    assert!(
        line.detail.contains("state.json could not be made durable"),
        "{}",
        line.detail
    );
}

/// A replay rehearses a state that cannot be saved as the daemon lives it: over the span, the
/// action that falls due is withdrawn at every step and the budget alerts withheld, and they go
/// out at the first step after it, once.
#[test]
fn an_unwritable_state_withdraws_the_action_and_withholds_the_alert() {
    let config = gpuwatch::cloud::parse_config(
        "[actions]\nboot_grace = \"0s\"\nwarning = \"10m\"\n\
         [[budgets]]\nname = \"team\"\nlimit_usd = 100\nthresholds = [0.5]\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"10m\"\nevaluation_periods = 2\naction = \"alert\"\n",
        Path::new("t.toml"),
    )
    .unwrap();
    // An hour, idle, a sample a minute, from 2026-11-30T00:00:00Z; $30 an hour from $40 spent
    // crosses half the budget on the forecast at once, and on actual spend 20 minutes in, as
    // the rule warns. Its alert is due at 30 minutes. The state cannot be saved for 40.
    let start = 1_795_996_800.0;
    let trace: String = (0..60)
        .map(|m| format!("{},0,0.01\n", start + f64::from(m) * 60.0))
        .collect();
    let rows = gpuwatch::simulate::parse_trace(&trace).unwrap();
    let options = gpuwatch::simulate::Options {
        spend: Some(gpuwatch::simulate::Spend {
            usd_per_hour: 30.0,
            start_usd: 40.0,
        }),
        state_unwritable: Some((start, start + 40.0 * 60.0)),
        ..Default::default()
    };
    let reports = gpuwatch::simulate::replay_with(&config, &rows, &options);
    let minutes = |kind: &str| -> Vec<f64> {
        reports
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| (r.at - start) / 60.0)
            .collect()
    };
    // The warning is on record before the save, failed or not.
    assert_eq!(minutes("warning"), [20.0], "{reports:#?}");
    // Each step withholds the alerts that cross (forecast, then actual spend too) ...
    let withheld: Vec<&str> = reports
        .iter()
        .filter(|r| r.kind == "withheld")
        .map(|r| r.detail.as_str())
        .collect();
    assert_eq!(withheld.len(), 39, "{reports:#?}");
    assert_eq!(
        withheld[0],
        "1 budget alert withheld until state.json can be made durable"
    );
    assert_eq!(
        withheld[19],
        "2 budget alerts withheld until state.json can be made durable"
    );
    // ... and withdraws the action due, until the first step after the span.
    let until_40: Vec<f64> = (30..40).map(f64::from).collect();
    assert_eq!(minutes("withdrawn"), until_40, "{reports:#?}");
    assert_eq!(minutes("budget_alert"), [40.0, 40.0], "{reports:#?}");
    assert_eq!(minutes("action"), [40.0], "{reports:#?}");

    // Without the span, both go out when they fall due.
    let saved = gpuwatch::simulate::replay_with(
        &config,
        &rows,
        &gpuwatch::simulate::Options {
            state_unwritable: None,
            ..options
        },
    );
    let at = |kind: &str| {
        saved
            .iter()
            .find(|r| r.kind == kind)
            .map(|r| (r.at - start) / 60.0)
    };
    assert_eq!((at("budget_alert"), at("action")), (Some(1.0), Some(30.0)));
    assert!(!saved
        .iter()
        .any(|r| r.kind == "withdrawn" || r.kind == "withheld"));
}

/// A node is terminated once: after the first instance action the replay says the node is down,
/// reports no further instance action, and stops its spend; an alert rule goes on. A stop that
/// the daemon would refuse (a one-time spot instance) leaves the node up.
#[test]
fn an_instance_action_takes_the_node_down_once() {
    let rules = |action: &str, spot_stop: &str| {
        gpuwatch::cloud::parse_config(
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
    let config = gpuwatch::cloud::parse_config(
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
    let err = gpuwatch::cloud::parse_config(
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
    // `reclaim` is a pod's: on a node-scoped rule it is refused, naming the key and the value.
    let err = gpuwatch::cloud::parse_config(
        "[[rules]]\nname = \"n\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"10m\"\naction = \"reclaim\"\n",
        Path::new("node.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("rules[0].action: \"reclaim\" gives a pod's GPUs back")
            && err.contains("scope is \"node\""),
        "{err}"
    );
    // A reclaim verdict judges idleness: a rule that breaches above its threshold cannot give
    // one, nor can one gated on a budget.
    let err = gpuwatch::cloud::parse_config(
        "[[rules]]\nname = \"p\"\nscope = \"pod\"\nmetric = \"gpu_utilization\"\ncomparison = \"greater_than\"\n\
         threshold = 0.05\nperiod = \"10m\"\naction = \"reclaim\"\nbudget = { name = \"team\", spent_at_least = 0.5 }\n",
        Path::new("above.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("rules[0].comparison: \"greater_than\": a reclaim rule judges idleness")
            && err.contains("rules[0].budget: a reclaim verdict stands on idleness alone"),
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
    let config = gpuwatch::cloud::parse_config(
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
