//! Property tests for every parser of outside input: config, JSON rules, trace CSV, instance
//! metadata answers, hold tags, `state.json` and `hold.json`. Each must return a value or an
//! error: never panic, never hang, never let a NaN or an unbounded number through. The number
//! of cases is bounded (set `PROPTEST_CASES` to run more).

use std::path::Path;

use gpuwatch::config::MAX_EVALUATION_PERIODS;
use gpuwatch::state::{HoldStatus, StateDir};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Values that once slipped through somewhere, and ordinary ones.
fn nasty_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("1e300".to_string()),
        Just("4294967295".to_string()),
        Just("18446744073709551615".to_string()),
        Just("0.05".to_string()),
        Just("2".to_string()),
        Just("\"300000000000y\"".to_string()),
        Just("\"0s\"".to_string()),
        Just("\"1s\"".to_string()),
        Just("\"1h\"".to_string()),
        Just("\"\"".to_string()),
        Just("\"a\\nb\"".to_string()),
        Just("true".to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        any::<u64>().prop_map(|v| v.to_string()),
        "\"[ -~]{0,12}\"",
    ]
}

const RULE_KEYS: [&str; 9] = [
    "threshold",
    "period",
    "evaluation_periods",
    "datapoints_to_alarm",
    "metric",
    "comparison",
    "action",
    "statistic",
    "gpus",
];

const TOP_KEYS: [(&str, &str); 10] = [
    ("sampling", "interval"),
    ("sampling", "timeout"),
    ("server", "max_connections"),
    ("server", "header_read_timeout"),
    ("actions", "warning"),
    ("actions", "boot_grace"),
    ("actions", "audit_max_mib"),
    ("cost", "hourly_price_usd"),
    ("cloud", "poll_interval"),
    ("cloud.aws.cloudwatch", "max_queue"),
];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_text_never_panics(text in "\\PC{0,400}") {
        let _ = gpuwatch::cloud::parse_config(&text, Path::new("fuzz.toml"));
    }

    #[test]
    fn a_config_that_loads_is_finite_and_bounded(
        top in proptest::collection::vec((0..TOP_KEYS.len(), nasty_value()), 0..6),
        rule in proptest::collection::vec((0..RULE_KEYS.len(), nasty_value()), 0..6),
        gate in proptest::option::of(nasty_value()),
    ) {
        let mut text = String::new();
        for (i, v) in &top {
            let (table, key) = TOP_KEYS[*i];
            text.push_str(&format!("[{table}]\n{key} = {v}\n"));
        }
        text.push_str("[[budgets]]\nname = \"b\"\nlimit_usd = 10\n");
        text.push_str("[[rules]]\nname = \"r\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
                       threshold = 0.05\nperiod = \"1m\"\naction = \"alert\"\n");
        let mut seen = std::collections::BTreeSet::new();
        for (i, v) in &rule {
            // A key given twice is a TOML error; the last one wins here, as a person would mean.
            if seen.insert(*i) && !["threshold", "period", "metric", "comparison", "action"].contains(&RULE_KEYS[*i]) {
                text.push_str(&format!("{} = {v}\n", RULE_KEYS[*i]));
            }
        }
        if let Some(g) = gate {
            text.push_str(&format!("budget = {{ name = \"b\", spent_at_least = {g} }}\n"));
        }
        if let Ok(c) = gpuwatch::cloud::parse_config(&text, Path::new("fuzz.toml")) {
            for rule in &c.rules {
                let r = rule.condition().expect("a [[rules]] rule has a GPU condition");
                prop_assert!(r.threshold.is_finite());
                prop_assert!(r.evaluation_periods >= 1 && r.evaluation_periods <= MAX_EVALUATION_PERIODS);
                prop_assert!(r.datapoints_to_alarm >= 1 && r.datapoints_to_alarm <= r.evaluation_periods);
                prop_assert!(r.period.as_secs() <= 86_400);
                if let Some(g) = &rule.budget {
                    prop_assert!(g.spent_at_least.is_finite());
                }
            }
            prop_assert!(c.sampling.interval.as_secs() <= 3600);
            prop_assert!(c.sampling.timeout.as_secs() <= 600);
            prop_assert!(c.actions.warning.as_secs() <= 7 * 86_400);
            prop_assert!(c.cost.hourly_price_usd.is_none_or(|p| p.is_finite() && p > 0.0));
            for b in &c.budgets {
                prop_assert!(b.limit_usd.is_none_or(f64::is_finite));
                prop_assert!(b.thresholds.iter().all(|t| t.is_finite()));
            }
        }
    }

    #[test]
    fn json_rules_never_panic_and_stay_bounded(
        periods in any::<u64>(),
        threshold in any::<f64>(),
        period in any::<i64>(),
        junk in "\\PC{0,200}",
    ) {
        let _ = gpuwatch::config::json::parse(&junk, "fuzz.json");
        let text = format!(
            r#"{{"Rules": [{{"Description": "r", "Actions": [{{"Type": "Alert"}}],
                "Trigger": {{"Metric": "GPUUtilization", "Comparison": "LessThan",
                             "Threshold": {threshold:?}, "Period": {period}, "EvaluationPeriods": {periods}}}}}]}}"#
        );
        if let Ok(raw) = gpuwatch::config::json::parse(&text, "fuzz.json") {
            for r in raw {
                if let Ok(rule) = r.validate("rules[0]") {
                    let rule = rule.condition().expect("a JSON rule has a GPU condition");
                    prop_assert!(rule.evaluation_periods <= MAX_EVALUATION_PERIODS);
                    prop_assert!(rule.threshold.is_finite());
                }
            }
        }
    }

    #[test]
    fn trace_rows_are_finite_or_refused(
        rows in proptest::collection::vec((nasty_value(), 0u32..4, nasty_value()), 0..20),
        junk in "\\PC{0,200}",
    ) {
        let _ = gpuwatch::simulate::parse_trace(&junk);
        let text: String = rows
            .iter()
            .map(|(t, g, u)| format!("{},{g},{}\n", t.trim_matches('"'), u.trim_matches('"')))
            .collect();
        if let Ok(parsed) = gpuwatch::simulate::parse_trace(&text) {
            for r in parsed {
                prop_assert!(r.t.is_finite() && (0.0..=gpuwatch::time::MAX_UNIX_SECONDS).contains(&r.t));
                prop_assert!(r.utilization.is_none_or(|u| (0.0..=1.0).contains(&u)));
            }
        }
    }

    #[test]
    fn rfc3339_is_strict_and_finite(
        base in "20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]",
        offset in prop_oneof![
            Just("Z".to_string()),
            "[+-][0-9]{2}:[0-9]{2}",
            "[+-][ -~]{1,6}",
            Just("+NaN:0".to_string()),
            Just("+inf:0".to_string()),
            Just("-1e9:0".to_string()),
        ],
        junk in "\\PC{0,40}",
    ) {
        prop_assert!(gpuwatch::time::parse_rfc3339(&junk).is_none_or(f64::is_finite));
        if let Some(t) = gpuwatch::time::parse_rfc3339(&format!("{base}{offset}")) {
            prop_assert!(t.is_finite());
            let ok = offset == "Z"
                || (offset.len() == 6
                    && offset[1..3].bytes().all(|b| b.is_ascii_digit())
                    && &offset[3..4] == ":"
                    && offset[4..].bytes().all(|b| b.is_ascii_digit()));
            prop_assert!(ok, "{offset} parsed");
        }
    }

    #[test]
    fn metadata_answers_never_panic(
        action in "[ -~]{0,20}",
        time in prop_oneof!["\\PC{0,30}", Just("2099-01-01T00:00:00+NaN:0".to_string())],
        junk in "\\PC{0,200}",
    ) {
        use gpuwatch::cloud::aws::imds::{parse_instance_action, parse_rebalance, Notice};
        let _ = parse_instance_action(&junk);
        let _ = parse_rebalance(&junk);
        let body = serde_json::json!({"action": action, "time": time}).to_string();
        if let Ok(Notice::Interruption { time, .. }) = parse_instance_action(&body) {
            prop_assert!(time.is_finite());
        }
        let body = serde_json::json!({"noticeTime": time}).to_string();
        if let Ok(Notice::Rebalance { time }) = parse_rebalance(&body) {
            prop_assert!(time.is_finite());
        }
    }

    #[test]
    fn state_and_hold_files_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        until in "\\PC{0,40}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        let sd = StateDir::new(dir.path());
        std::fs::write(dir.path().join("state.json"), &bytes).unwrap();
        let _ = sd.load();
        std::fs::write(dir.path().join("hold.json"), &bytes).unwrap();
        let _ = sd.hold();
        let hold = serde_json::json!({"until": until, "reason": "r"}).to_string();
        std::fs::write(dir.path().join("hold.json"), hold).unwrap();
        match sd.hold() {
            HoldStatus::Until(t, _) => prop_assert!(t.is_finite()),
            HoldStatus::Unreadable(_) => {}
            HoldStatus::None => prop_assert!(false, "a hold file that is there is a hold"),
            HoldStatus::Unknown(_) => prop_assert!(false, "a hold file that was read is known"),
        }
    }
}

/// A job id's shape: digits, or a SLUID.
fn is_job_id(j: &str) -> bool {
    (!j.is_empty() && j.len() <= 20 && j.bytes().all(|b| b.is_ascii_digit()))
        || (j.len() == 14 && j.starts_with('s'))
}

proptest! {
    #![proptest_config(config())]

    /// Every cgroup layout Slurm writes names its job (and v1 its user), whatever the prefix,
    /// the node name, the step and what follows.
    #[test]
    fn slurm_cgroup_paths_name_their_job(
        job in 1u64..=u64::from(u32::MAX),
        uid in 0u32..=65_534,
        step in prop_oneof![Just("batch".to_string()), Just("extern".to_string()), (0u32..100).prop_map(|s| s.to_string())],
        prefix in "(/[a-z0-9._-]{1,12}){0,3}",
        node in prop::option::of("[a-z0-9]{1,8}"),
        tail in "(/task_[0-9]{1,3}|/user/task_0)?",
    ) {
        let slurm = node.as_ref().map_or("slurm".to_string(), |n| format!("slurm_{n}"));
        let v1 = format!("4:memory:{prefix}/{slurm}/uid_{uid}/job_{job}/step_{step}{tail}\n");
        let h = gpuwatch::slurm::from_cgroup(&v1).unwrap();
        prop_assert_eq!(h.job, job.to_string());
        prop_assert_eq!(h.uid, Some(uid));
        let scope = node.as_ref().map_or("slurmstepd.scope".to_string(), |n| format!("{n}_slurmstepd.scope"));
        let v2 = format!("0::{prefix}/system.slice/{scope}/job_{job}/step_{step}{tail}\n");
        let h = gpuwatch::slurm::from_cgroup(&v2).unwrap();
        prop_assert_eq!(h.job, job.to_string());
        prop_assert_eq!(h.uid, None);
    }

    /// Any cgroup or environment text gives no job or a job id, never a panic; the job mapping
    /// directory's names and lines likewise.
    #[test]
    fn slurm_inputs_of_any_shape_are_a_job_id_or_nothing(
        text in prop_oneof![
            "[ -~\n]{0,200}",
            "([0-9]{1,2}:[a-z,=]{0,12}:(/[a-z0-9_.]{0,12}){0,6}\n){0,4}",
            any::<Vec<u8>>().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        ],
        environ in any::<Vec<u8>>(),
    ) {
        if let Some(h) = gpuwatch::slurm::from_cgroup(&text) {
            prop_assert!(is_job_id(&h.job), "{:?} from {:?}", h.job, text);
        }
        let mut env = b"SLURM_JOB_ID=".to_vec();
        env.extend(&environ);
        if let Some(j) = gpuwatch::slurm::from_environ(&env) {
            prop_assert!(is_job_id(&j), "{:?}", j);
        }
        let jobs = gpuwatch::slurm::mapping::jobs(&text);
        prop_assert!(jobs.ids.len() <= 1024);
        for j in jobs.ids {
            prop_assert!(j.len() <= 64 && !j.contains(['/', ' ', '\n']), "{:?}", j);
        }
        let _ = gpuwatch::slurm::mapping::device(&text);
    }
}
