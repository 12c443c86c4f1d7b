//! Rules on GPU health acting on EC2, end to end: the daemon over fake GPUs, an IMDSv2 fake,
//! and a moto server speaking the real EC2 wire protocol. A GPU that falls off the bus makes a
//! rule on `gpu_unhealthy` warn, re-check and stop the instance (on EC2 a stop and a start
//! moves it to new hardware), naming the problem in its evidence; a hold postpones it; and an
//! idle rule on the same node never acts because of the lost GPU.

mod common;

use std::time::Duration;

use common::aws::{self, actions, Kind};
use common::{events, metric, secs, Daemon};

const LIMIT: Duration = Duration::from_secs(60);

/// Four idle GPUs, GPU 1 fallen off the bus for good from the start.
const ONE_LOST: &str = "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n[[fault]]\nat = \"0s\"\ngpu = 1\nkind = \"lost\"\n";

/// An idle rule and a rule on health, both stopping the instance, with one-second periods.
const RULES: &str = r#"
[[rules]]
name = "idle"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "1s"
evaluation_periods = 2
action = "stop"

[[rules]]
name = "broken"
metric = "gpu_unhealthy"
period = "1s"
evaluation_periods = 2
action = "stop"
"#;

fn config(dir: &std::path::Path, imds: &aws::Imds, mode: &str) -> String {
    aws::daemon_config(
        dir,
        imds,
        aws::moto().addr,
        &format!("mode = \"{mode}\"\nwarning = \"1s\""),
        RULES,
    )
}

#[test]
fn a_lost_gpu_stops_the_instance_through_the_health_rule_never_the_idle_one() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &imds, "enforce");
    let d = Daemon::start_scenario(dir, ONE_LOST, &config);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert!(["stopping", "stopped"].contains(&aws::instance_state(&inst.id).as_str()));
    assert_eq!(
        aws::instance_tags(&inst.id)
            .get("gpuwatch:rule")
            .map(String::as_str),
        Some("broken")
    );
    metric("gpu_health")
        .gpu(1)
        .label("state", "unhealthy")
        .value(1.0)
        .assert_in(&s);

    let audit = d.audit();
    let warnings = events(&audit, "warning");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["rule"], "broken");
    let attempt = events(&audit, "action_attempt")[0];
    assert_eq!(attempt["rule"], "broken");
    assert!(secs(&attempt["time"]) >= secs(&warnings[0]["due_at"]) - 0.5);
    let problems = attempt["evidence"]["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{attempt}");
    assert!(
        problems[0]
            .as_str()
            .unwrap()
            .starts_with("GPU 1: the GPU fell off the bus"),
        "{attempt}"
    );
    // The idle rule saw the lost GPU as unknown, which is busy: it never breached.
    assert!(
        !audit.iter().any(|r| r["rule"] == "idle"),
        "the idle rule acted on a lost GPU: {audit:?}"
    );
}

#[test]
fn in_dry_run_the_health_rule_says_what_it_would_do_and_changes_nothing() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &imds, "dry-run");
    let d = Daemon::start_scenario(dir, ONE_LOST, &config);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "dry_run") == 1.0);
    assert_eq!(aws::instance_state(&inst.id), "running");
    let audit = d.audit();
    let result = events(&audit, "action_result")[0];
    assert_eq!(result["rule"], "broken");
    assert_eq!(result["mode"], "dry-run");
    assert!(
        result["detail"]
            .as_str()
            .unwrap()
            .starts_with("would StopInstances"),
        "{result}"
    );
    assert!(events(&audit, "api_call").is_empty());
}

#[test]
fn a_hold_postpones_the_health_rule_until_it_expires() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuwatch.toml");
    std::fs::write(&path, config(dir.path(), &imds, "enforce")).unwrap();
    common::gpuwatch(&[&"hold", &"5s", &"--reason", &"draining", &"--config", &path]);
    let hold: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("state/hold.json")).unwrap())
            .unwrap();
    let until = secs(&hold["until"]);
    let config = std::fs::read_to_string(&path).unwrap();
    let d = Daemon::start_scenario(dir, ONE_LOST, &config);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let audit = d.audit();
    let attempt = events(&audit, "action_attempt")[0];
    assert_eq!(attempt["rule"], "broken");
    assert!(
        secs(&attempt["time"]) >= until,
        "stopped at {} during the hold (until {until})",
        attempt["time"]
    );
}

/// Four idle GPUs that all answer, one of them with an XID that needs a reset: the idle rule
/// would stop the node were it healthy, but an unhealthy GPU's readings are unknown to it, so
/// only the rule on health acts.
#[test]
fn an_unhealthy_gpu_that_answers_never_makes_the_idle_rule_act() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &imds, "dry-run");
    let scenario = ONE_LOST.replace("kind = \"lost\"\n", "kind = \"xid\"\nxid = 48\n");
    let d = Daemon::start_scenario(dir, &scenario, &config);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "dry_run") == 1.0);
    metric("gpu_up").gpu(1).value(1.0).assert_in(&s);
    metric("gpu_health_problem")
        .gpu(1)
        .label("problem", "xid_48")
        .value(1.0)
        .assert_in(&s);
    // Past two more of the idle rule's periods and its warning: still nothing from it.
    let t = s
        .named("gpuwatch_last_sample_timestamp_seconds")
        .first()
        .map_or(0.0, |x| x.value);
    d.await_time(t + 4.0);
    let audit = d.audit();
    let result = events(&audit, "action_result")[0];
    assert_eq!(result["rule"], "broken");
    assert!(
        !audit.iter().any(|r| r["rule"] == "idle"),
        "the idle rule judged an unhealthy GPU idle: {audit:?}"
    );
}
