//! Idle rules acting on EC2, end to end: the daemon over fake GPUs, an IMDSv2 fake, and a moto
//! server speaking the real EC2 wire protocol. Rule periods are one second long.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::aws::{self, actions, Kind, ProxyMode};
use common::{events, metric, secs, Daemon};
use serde_json::Value;

const IDLE4: &str = "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n";
const LIMIT: Duration = Duration::from_secs(60);

struct Setup<'a> {
    imds: &'a aws::Imds,
    endpoint: SocketAddr,
    mode: &'a str,
    action: &'a str,
    /// Lines added to [actions].
    actions: &'a str,
    /// Extra top-level sections.
    extra: &'a str,
    period: &'a str,
    evaluation_periods: u32,
}

impl<'a> Setup<'a> {
    fn new(imds: &'a aws::Imds, action: &'a str) -> Setup<'a> {
        Setup {
            imds,
            endpoint: aws::moto().addr,
            mode: "enforce",
            action,
            actions: "warning = \"1s\"",
            extra: "",
            period: "1s",
            evaluation_periods: 2,
        }
    }

    fn config(&self, dir: &std::path::Path) -> String {
        let rule = format!(
            "[[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\nperiod = \"{}\"\nevaluation_periods = {}\naction = \"{}\"\n",
            self.period, self.evaluation_periods, self.action
        );
        aws::daemon_config(
            dir,
            self.imds,
            self.endpoint,
            &format!("mode = \"{}\"\n{}", self.mode, self.actions),
            &format!("{}\n{rule}", self.extra),
        )
    }

    fn start(&self, scenario: &str) -> Daemon {
        self.start_in(tempfile::tempdir().unwrap(), scenario)
    }

    fn start_in(&self, dir: tempfile::TempDir, scenario: &str) -> Daemon {
        let config = self.config(dir.path());
        Daemon::start_scenario(dir, scenario, &config)
    }
}

fn api_calls(audit: &[Value]) -> Vec<String> {
    events(audit, "api_call")
        .iter()
        .map(|r| r["operation"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_on_demand_instance_is_stopped_after_a_warning() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let d = Setup::new(&imds, "stop").start(IDLE4);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_node_info")
        .label("instance_id", &inst.id)
        .label("instance_type", "p4d.24xlarge")
        .label("lifecycle", "on-demand")
        .value(1.0)
        .assert_in(&s);

    assert!(["stopping", "stopped"].contains(&aws::instance_state(&inst.id).as_str()));
    let tags = aws::instance_tags(&inst.id);
    assert_eq!(
        tags.get("gpuwatch:action").map(String::as_str),
        Some("stop")
    );
    assert_eq!(tags.get("gpuwatch:rule").map(String::as_str), Some("idle"));

    let audit = d.audit();
    let warning = events(&audit, "warning")[0];
    let attempt = events(&audit, "action_attempt")[0];
    assert!(
        secs(&attempt["time"]) >= secs(&warning["due_at"]) - 0.5,
        "{warning} {attempt}"
    );
    assert_eq!(attempt["mode"], "enforce");
    assert_eq!(attempt["evidence"]["periods"].as_array().unwrap().len(), 2);
    // Tag first, then the call, each with its request id.
    assert_eq!(api_calls(&audit), ["CreateTags", "StopInstances"]);
    for call in events(&audit, "api_call") {
        assert!(call["request_id"].is_string(), "{call}");
        assert_eq!(call["instance_id"], inst.id.as_str());
    }
    assert_eq!(events(&audit, "action_result")[0]["result"], "done");
}

/// An instance with 49 of EC2's 50 tags refuses the two `gpuwatch:` stamps
/// (`TagLimitExceeded`): the refusal is on record and counted, and the idle instance is
/// stopped all the same.
#[test]
fn a_full_tag_set_refuses_the_stamp_and_the_stop_goes_on() {
    let inst = aws::launch(Kind::OnDemand);
    for i in 0..49 - aws::instance_tags(&inst.id).len() {
        aws::tag_instance(&inst.id, &format!("k{i}"), "v");
    }
    assert_eq!(aws::instance_tags(&inst.id).len(), 49);
    let imds = aws::imds(&inst.id, "on-demand");
    let d = Setup::new(&imds, "stop").start(IDLE4);
    let audit =
        common::fake::assert_done_without_the_stamp(&d, "stop", "CreateTags", "TagLimitExceeded");
    assert!(["stopping", "stopped"].contains(&aws::instance_state(&inst.id).as_str()));
    assert!(!aws::instance_tags(&inst.id).contains_key("gpuwatch:action"));
    assert_eq!(api_calls(&audit), ["StopInstances"]);
}

#[test]
fn a_one_time_spot_instance_is_terminated_when_stop_is_asked() {
    let inst = aws::launch(Kind::OneTimeSpot);
    let imds = aws::imds(&inst.id, "spot");
    let mut setup = Setup::new(&imds, "stop");
    setup.actions = "warning = \"1s\"\nspot_stop = \"terminate\"";
    let d = setup.start(IDLE4);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert!(["shutting-down", "terminated"].contains(&aws::instance_state(&inst.id).as_str()));
    assert_eq!(api_calls(&d.audit()), ["CreateTags", "TerminateInstances"]);
}

#[test]
fn a_one_time_spot_instance_is_not_stopped_without_permission() {
    let inst = aws::launch(Kind::OneTimeSpot);
    let imds = aws::imds(&inst.id, "spot");
    let d = Setup::new(&imds, "stop").start(IDLE4);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "refused") == 1.0);
    assert_eq!(aws::instance_state(&inst.id), "running");
    let audit = d.audit();
    assert!(api_calls(&audit).is_empty());
    let result = events(&audit, "action_result")[0];
    assert!(
        result["detail"].as_str().unwrap().contains("cannot stop"),
        "{result}"
    );
}

/// The instance is going or gone, and its spot request is no longer active (moto drops a
/// cancelled request; AWS shows it as cancelled).
fn assert_cancelled_and_terminated(instance: &str, request: &str) {
    assert!(["shutting-down", "terminated"].contains(&aws::instance_state(instance).as_str()));
    let state = aws::spot_request_state(request);
    assert!(
        state.is_none() || state.as_deref() == Some("cancelled"),
        "{state:?}"
    );
}

#[test]
fn a_persistent_spot_request_is_cancelled_then_its_instance_terminated() {
    let inst = aws::launch(Kind::PersistentSpot);
    let request = inst.spot_request.clone().unwrap();
    assert_eq!(aws::spot_request_state(&request).as_deref(), Some("active"));
    let imds = aws::imds(&inst.id, "spot");
    let d = Setup::new(&imds, "terminate").start(IDLE4);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "done") == 1.0);
    assert_cancelled_and_terminated(&inst.id, &request);
    assert_eq!(
        api_calls(&d.audit()),
        [
            "CreateTags",
            &format!("CancelSpotInstanceRequests {request}"),
            "TerminateInstances"
        ]
    );
}

#[test]
fn dry_run_changes_nothing_and_says_would() {
    let inst = aws::launch(Kind::PersistentSpot);
    let imds = aws::imds(&inst.id, "spot");
    let mut setup = Setup::new(&imds, "terminate");
    setup.mode = "dry-run";
    let d = setup.start(IDLE4);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "dry_run") == 1.0);
    assert_eq!(aws::instance_state(&inst.id), "running");
    assert_eq!(
        aws::spot_request_state(inst.spot_request.as_deref().unwrap()).as_deref(),
        Some("active")
    );
    assert!(!aws::instance_tags(&inst.id).contains_key("gpuwatch:action"));
    let audit = d.audit();
    assert!(api_calls(&audit).is_empty());
    let result = events(&audit, "action_result")[0];
    assert_eq!(result["mode"], "dry-run");
    assert!(
        result["detail"]
            .as_str()
            .unwrap()
            .starts_with("would CancelSpotInstanceRequests"),
        "{result}"
    );
}

#[test]
fn one_busy_gpu_of_four_keeps_the_node() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let scenario = "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 50\n[[gpu]]\nutilization = 0\n";
    let d = Setup::new(&imds, "stop").start(scenario);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    // Long past when an idle node would have been stopped: two periods, the warning, margin.
    d.await_time(first["timestamp"].as_f64().unwrap() + 6.0);
    let s = d.scrape();
    metric("gpuwatch_rule_breaching")
        .label("rule", "idle")
        .value(0.0)
        .assert_in(&s);
    assert!(events(&d.audit(), "warning").is_empty());
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert_eq!(aws::instance_state(&inst.id), "running");
    // The idle GPUs are idle, the busy one is not.
    assert!(metric("gpuwatch_gpu_idle_seconds").gpu(0).get(&s).unwrap() > 3.0);
    metric("gpuwatch_gpu_idle_seconds")
        .gpu(2)
        .value(0.0)
        .assert_in(&s);
}

#[test]
fn a_gpu_lost_in_the_window_delays_the_action_until_fresh_complete_data() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let scenario =
        format!("{IDLE4}[[fault]]\nat = \"500ms\"\nuntil = \"3s\"\ngpu = 1\nkind = \"lost\"\n");
    let d = Setup::new(&imds, "stop").start(&scenario);
    d.await_sample(LIMIT, |s| s["gpus"][1]["up"] == false);
    let back = d.await_sample(LIMIT, |s| s["gpus"][1]["up"] == true);
    let back_at = back["timestamp"].as_f64().unwrap();
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let audit = d.audit();
    let attempt = events(&audit, "action_attempt")[0];
    for p in attempt["evidence"]["periods"].as_array().unwrap() {
        assert!(
            secs(&p["start"]) >= back_at.floor(),
            "period {p} predates the GPU's return at {back_at}"
        );
    }
    let warning = events(&audit, "warning")[0];
    assert!(
        secs(&warning["time"]) > back_at,
        "warned at {} before the GPU was back at {back_at}",
        warning["time"]
    );
}

#[test]
fn gpus_coming_back_during_the_warning_cancel_the_action() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    // GPU 0 idles until the test sees the warning, then gets busy.
    let live = dir.path().join("u.txt");
    std::fs::write(&live, "0").unwrap();
    let scenario =
        "[[gpu]]\nutilization = { kind = \"live\", file = \"u.txt\" }\n[[gpu]]\nutilization = 0\n";
    let mut setup = Setup::new(&imds, "stop");
    setup.actions = "warning = \"30s\"";
    let d = setup.start_in(dir, scenario);
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_action_pending")
            .label("rule", "idle")
            .get(s)
            == Some(1.0)
    });
    std::fs::write(&live, "80").unwrap();
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "cancelled") == 1.0);
    assert_eq!(actions(&s, "stop", "done"), 0.0);
    metric("gpuwatch_action_pending")
        .label("rule", "idle")
        .absent()
        .assert_in(&s);
    let audit = d.audit();
    assert_eq!(events(&audit, "warning").len(), 1);
    let cancelled = events(&audit, "cancelled")[0];
    assert!(
        cancelled["reason"]
            .as_str()
            .unwrap()
            .contains("GPU 0 came back"),
        "{cancelled}"
    );
    assert!(events(&audit, "action_attempt").is_empty());
    assert_eq!(aws::instance_state(&inst.id), "running");
}

#[test]
fn a_local_hold_postpones_the_action_until_it_expires() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let setup = Setup::new(&imds, "stop");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hold.toml");
    std::fs::write(&config, setup.config(dir.path())).unwrap();
    common::gpuwatch(&[
        &"hold",
        &"5s",
        &"--reason",
        &"checkpointing",
        &"--config",
        &config,
    ]);
    let hold: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("state/hold.json")).unwrap())
            .unwrap();
    let until = secs(&hold["until"]);
    assert_eq!(hold["reason"], "checkpointing");

    let d = setup.start_in(dir, IDLE4);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_hold_until_timestamp_seconds")
            .label("source", "local")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "local")
        .label("reason", "expires")
        .value(until)
        .assert_in(&s);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let audit = d.audit();
    let warning = events(&audit, "warning")[0];
    assert!(
        secs(&warning["time"]) >= until,
        "warned at {} during the hold (until {until})",
        warning["time"]
    );
    assert!(secs(&events(&audit, "action_attempt")[0]["time"]) >= until);
}

/// Two actions fall due in one step: a checkpoint command, then the stop. The operator holds
/// the node while the checkpoint runs. The stop is not carried out on the decision taken before
/// the hold: it is decided again on the next sample, which sees the hold and postpones it.
#[test]
fn an_action_behind_a_slow_one_is_decided_again_and_sees_a_hold() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let (started, release) = (dir.path().join("started"), dir.path().join("release"));
    // The checkpoint says it started, then runs until the test releases it.
    let checkpoint = format!(
        "[[rules]]\nname = \"checkpoint\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"exec\"\n\
         command = [\"sh\", \"-c\", \"touch {}; while [ ! -e {} ]; do sleep 0.05; done\"]\n",
        started.display(),
        release.display()
    );
    let mut setup = Setup::new(&imds, "stop");
    setup.extra = &checkpoint;
    let config = dir.path().join("gpuwatch.toml");
    let d = setup.start_in(dir, IDLE4);
    let deadline = std::time::Instant::now() + LIMIT;
    while !started.exists() {
        assert!(std::time::Instant::now() < deadline, "{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    common::gpuwatch(&[
        &"hold",
        &"1h",
        &"--reason",
        &"checkpoint",
        &"--config",
        &config,
    ]);
    std::fs::write(&release, "").unwrap();
    d.await_log(LIMIT, "action deferred");
    // The next step reads the hold, and postpones the stop for it.
    let held = |r: &&Value| r["rule"] == "idle" && r["reason"].as_str().unwrap().contains("hold");
    let deadline = std::time::Instant::now() + LIMIT;
    let audit = loop {
        let audit = d.audit();
        if events(&audit, "postponed").iter().any(held) {
            break audit;
        }
        assert!(std::time::Instant::now() < deadline, "{audit:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let of = |kind: &str| -> Vec<String> {
        events(&audit, kind)
            .iter()
            .map(|r| r["rule"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(of("action_attempt"), ["checkpoint"], "{audit:?}");
    let postponed = events(&audit, "postponed");
    assert!(
        postponed.iter().any(|r| r["rule"] == "idle"
            && r["reason"]
                .as_str()
                .unwrap()
                .contains("decided again on the next sample")),
        "{audit:?}"
    );
    assert!(api_calls(&audit).is_empty(), "{audit:?}");
    assert_eq!(aws::instance_state(&inst.id), "running");
}

#[test]
fn an_instance_tag_hold_is_honoured_and_an_unreadable_one_holds() {
    let inst = aws::launch(Kind::OnDemand);
    aws::tag_instance(&inst.id, "gpuwatch:hold", "after lunch");
    let imds = aws::imds(&inst.id, "on-demand");
    let d = Setup::new(&imds, "stop").start(IDLE4);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    let t0 = first["timestamp"].as_f64().unwrap();
    d.await_time(t0 + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert!(
        d.log()
            .contains("a hold with an unreadable expiry counts as a hold"),
        "{}",
        d.log()
    );
    // Prometheus sees it too: a hold without end, from the tag, for want of a readable expiry.
    let s = d.scrape();
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .label("reason", "unparsable tag")
        .value(f64::INFINITY)
        .assert_in(&s);

    // A readable expiry 3 s ahead: the action follows once it passes.
    let until = gpuwatch::time::now().ceil() + 3.0;
    aws::tag_instance(&inst.id, "gpuwatch:hold", &gpuwatch::time::rfc3339(until));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert!(secs(&events(&d.audit(), "action_attempt")[0]["time"]) >= until);
}

#[test]
fn a_restart_mid_window_keeps_the_window() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let mut setup = Setup::new(&imds, "stop");
    setup.period = "2s";
    setup.evaluation_periods = 3;
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let scenario_dir = dir.path().to_path_buf();
    // A generous slack (the cycle timeout) so that the restart's gap does not make the period
    // it falls in unknown even on a loaded machine.
    let config = setup
        .config(dir.path())
        .replace("timeout = \"1s\"", "timeout = \"3s\"");
    let mut d = Daemon::start_scenario(dir, IDLE4, &config);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 4.5);
    d.kill();
    let restarted_at = gpuwatch::time::now();
    // The same state directory, a new process.
    let d2 = Daemon::start_with(common::reuse_dir(&scenario_dir), &config);
    d2.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let audit = common::audit_records(&state_dir.join("audit.jsonl"));
    let attempt = events(&audit, "action_attempt")[0];
    let oldest = attempt["evidence"]["periods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| secs(&p["start"]))
        .fold(f64::INFINITY, f64::min);
    assert!(
        oldest < restarted_at,
        "no period from before the restart ({restarted_at}) counted: {attempt}"
    );
    assert_eq!(api_calls(&audit), ["CreateTags", "StopInstances"]);
}

/// The state a daemon leaves in `dir` when it is killed after sending `rule`'s `action` and
/// before recording the result.
fn seed_in_flight(dir: &std::path::Path, rule: &str, action: &str) {
    let now = gpuwatch::time::now();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(
        dir.join("state/state.json"),
        format!(
            r#"{{"engine":{{"rules":{{"{rule}":{{"window":{{"buckets":[]}},"breaching":true,"pending":null,"not_before":{now},"in_flight":{{"action":"{action}","at":{now}}}}}}}}}}}"#
        ),
    )
    .unwrap();
}

#[test]
fn a_restart_after_an_action_was_sent_does_not_repeat_it() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let mut setup = Setup::new(&imds, "stop");
    setup.actions = "warning = \"1h\"";
    let dir = tempfile::tempdir().unwrap();
    seed_in_flight(dir.path(), "idle", "stop");
    let d = setup.start_in(dir, IDLE4);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 4.0);
    let audit = d.audit();
    let resumed = events(&audit, "in_flight_at_restart");
    assert_eq!(resumed.len(), 1, "{audit:?}");
    assert_eq!(resumed[0]["repeated"], false);
    assert_eq!(resumed[0]["instance_state"], "running");
    assert!(events(&audit, "action_attempt").is_empty());
    assert!(api_calls(&audit).is_empty());
}

/// A crash while a rule's action was in flight, then a config without that rule: the action is
/// still on record as sent before the restart, not forgotten with the rule.
#[test]
fn an_action_in_flight_is_on_record_even_when_its_rule_left_the_config() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let mut setup = Setup::new(&imds, "stop");
    setup.actions = "warning = \"1h\"";
    let dir = tempfile::tempdir().unwrap();
    seed_in_flight(dir.path(), "renamed", "terminate");
    let d = setup.start_in(dir, IDLE4);
    d.await_log(LIMIT, "cost watch started");
    let audit = d.audit();
    let resumed = events(&audit, "in_flight_at_restart");
    assert_eq!(resumed.len(), 1, "{audit:?}");
    assert_eq!(resumed[0]["rule"], "renamed");
    assert_eq!(resumed[0]["action"], "terminate");
    assert_eq!(resumed[0]["repeated"], false);
    assert!(api_calls(&audit).is_empty());
}

/// Instance metadata tags are off and EC2 cannot be reached from the start: the instance's
/// `gpuwatch:hold` tag is unknown, and an unknown hold holds. Once DescribeInstances answers
/// (no hold tag), the rule warns and acts.
#[test]
fn tags_never_read_hold_every_action_until_they_are() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let proxy = aws::Proxy::start(ProxyMode::Refuse);
    let mut setup = Setup::new(&imds, "stop");
    setup.endpoint = proxy.addr;
    let d = setup.start(IDLE4);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    // Two idle periods and the warning would have passed by now.
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    let audit = d.audit();
    assert!(events(&audit, "warning").is_empty(), "{audit:?}");
    assert!(events(&audit, "action_attempt").is_empty(), "{audit:?}");
    assert!(d.log().contains("have not been read yet"), "{}", d.log());
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .label("reason", "unread tag")
        .value(f64::INFINITY)
        .assert_in(&d.scrape());
    proxy.set(ProxyMode::Forward);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let audit = d.audit();
    assert_eq!(events(&audit, "warning").len(), 1, "{audit:?}");
    assert_eq!(api_calls(&audit), ["CreateTags", "StopInstances"]);
}

/// Instance metadata does not answer at start (the network not up yet at boot): the instance
/// is unknown and its tags unread, so nothing is warned of or done, and metadata is asked
/// again. Once it answers, the instance is known, its tags are read, and the rule warns and
/// stops it.
#[test]
fn instance_metadata_that_answers_late_is_asked_again_and_the_rule_acts() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let proxy = aws::Proxy::to(imds.addr, ProxyMode::Refuse);
    let dir = tempfile::tempdir().unwrap();
    let config = Setup::new(&imds, "stop").config(dir.path()).replace(
        &format!("imds_endpoint = \"http://{}\"", imds.addr),
        &format!("imds_endpoint = \"http://{}\"", proxy.addr),
    );
    assert!(config.contains(&proxy.addr.to_string()), "{config}");
    let d = Daemon::start_scenario(dir, IDLE4, &config);
    d.await_log(LIMIT, "asked again in the background");
    let refused = || proxy.refused.load(std::sync::atomic::Ordering::SeqCst);
    // Asked at start, then again: each ask a connection the proxy drops.
    let first = d.await_sample(LIMIT, |_| refused() >= 3);
    // Two idle periods and the warning would have passed by now.
    d.await_time(first["timestamp"].as_f64().unwrap() + 3.0);
    let s = d.scrape();
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .label("reason", "unread tag")
        .value(f64::INFINITY)
        .assert_in(&s);
    assert!(!s.text.contains(&inst.id), "the instance is not known yet");
    let audit = d.audit();
    assert!(events(&audit, "warning").is_empty(), "{audit:?}");
    assert!(events(&audit, "action_attempt").is_empty(), "{audit:?}");

    proxy.set(ProxyMode::Forward);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_node_info")
        .label("instance_id", &inst.id)
        .label("lifecycle", "on-demand")
        .value(1.0)
        .assert_in(&s);
    d.await_log(LIMIT, "instance metadata answers");
    let audit = d.audit();
    assert_eq!(events(&audit, "warning").len(), 1, "{audit:?}");
    assert_eq!(api_calls(&audit), ["CreateTags", "StopInstances"]);
    assert_eq!(
        events(&audit, "action_attempt")[0]["instance_id"],
        inst.id.as_str()
    );
    assert!(["stopping", "stopped"].contains(&aws::instance_state(&inst.id).as_str()));
}

/// A `gpuwatch:hold` tag already on the instance when instance metadata answers late holds
/// from the first step that knows the instance: nothing is ever attempted.
#[test]
fn a_hold_tag_in_place_when_instance_metadata_answers_late_holds() {
    let inst = aws::launch(Kind::OnDemand);
    aws::tag_instance(&inst.id, "gpuwatch:hold", "after lunch");
    let imds = aws::imds(&inst.id, "on-demand");
    let proxy = aws::Proxy::to(imds.addr, ProxyMode::Refuse);
    let dir = tempfile::tempdir().unwrap();
    let config = Setup::new(&imds, "stop").config(dir.path()).replace(
        &format!("imds_endpoint = \"http://{}\"", imds.addr),
        &format!("imds_endpoint = \"http://{}\"", proxy.addr),
    );
    let d = Daemon::start_scenario(dir, IDLE4, &config);
    let refused = || proxy.refused.load(std::sync::atomic::Ordering::SeqCst);
    d.await_sample(LIMIT, |_| refused() >= 2);
    proxy.set(ProxyMode::Forward);
    // The tag is read: its hold (without end, for want of a readable expiry) replaces the
    // unknown one.
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_hold_until_timestamp_seconds")
            .label("reason", "unparsable tag")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_node_info")
        .label("instance_id", &inst.id)
        .value(1.0)
        .assert_in(&s);
    let now = d.await_sample(LIMIT, |_| true)["timestamp"]
        .as_f64()
        .unwrap();
    // Two idle periods and the warning would have passed by now.
    d.await_time(now + 4.0);
    let audit = d.audit();
    assert!(events(&audit, "action_attempt").is_empty(), "{audit:?}");
    assert!(api_calls(&audit).is_empty(), "{audit:?}");
    assert_eq!(aws::instance_state(&inst.id), "running");
}

/// Tags read with DescribeInstances (no hold), then EC2 stops answering: the tags read last
/// count for three tag poll intervals, then a hold tag placed since may be there, and the
/// unknown hold holds every action until the tags are read again.
#[test]
fn tags_that_stop_being_read_hold_again() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let proxy = aws::Proxy::start(ProxyMode::Forward);
    let mut setup = Setup::new(&imds, "stop");
    setup.endpoint = proxy.addr;
    // A breach warns and waits; nothing here is meant to act.
    setup.actions = "warning = \"1h\"";
    let d = setup.start(IDLE4);
    let tag_hold = || {
        metric("gpuwatch_hold_until_timestamp_seconds")
            .label("source", "tag")
            .label("reason", "unread tag")
    };
    // A warning is given only once no hold is in force: the tags were read.
    d.await_sample(LIMIT, |_| !events(&d.audit(), "warning").is_empty());
    tag_hold().absent().assert_in(&d.scrape());
    proxy.set(ProxyMode::Refuse);
    let held = d.await_scrape(LIMIT, |s| tag_hold().get(s).is_some());
    tag_hold().value(f64::INFINITY).assert_in(&held);
    // The log is read on its own thread: wait for the line rather than expect it yet.
    d.await_log(LIMIT, "have not been read for 600ms");
    proxy.set(ProxyMode::Forward);
    d.await_scrape(LIMIT, |s| tag_hold().get(s).is_none());
    d.await_log(LIMIT, "tags are read again");
    assert!(api_calls(&d.audit()).is_empty(), "{:?}", d.audit());
}

#[test]
fn aws_outage_then_errors_then_recovery_acts_exactly_once() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    // Tags come from instance metadata, so no hold tag is unknown while EC2 is down.
    imds.state
        .lock()
        .unwrap()
        .tags
        .insert("team".into(), "ml".into());
    let proxy = aws::Proxy::start(ProxyMode::Refuse);
    let mut setup = Setup::new(&imds, "stop");
    setup.endpoint = proxy.addr;
    let d = setup.start(IDLE4);
    // Unreachable: the action is attempted, and retried (each try a connection the proxy drops).
    let refused = || proxy.refused.load(std::sync::atomic::Ordering::SeqCst);
    d.await_sample(LIMIT, |_| !events(&d.audit(), "action_attempt").is_empty());
    let before = refused();
    d.await_sample(LIMIT, |_| refused() >= before + 2);
    // Then errors: 503s are retried too.
    proxy.set(ProxyMode::Unavailable);
    d.await_sample(LIMIT, |_| {
        proxy
            .unavailable_answers
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 2
    });
    proxy.set(ProxyMode::Forward);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let audit = d.audit();
    assert_eq!(api_calls(&audit), ["CreateTags", "StopInstances"]);
    assert_eq!(events(&audit, "action_attempt").len(), 1);
    assert!(["stopping", "stopped"].contains(&aws::instance_state(&inst.id).as_str()));
}

#[test]
fn a_hold_placed_while_ec2_calls_are_retried_calls_the_action_off() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    imds.state
        .lock()
        .unwrap()
        .tags
        .insert("team".into(), "ml".into());
    let proxy = aws::Proxy::start(ProxyMode::Unavailable);
    let mut setup = Setup::new(&imds, "stop");
    setup.endpoint = proxy.addr;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hold.toml");
    std::fs::write(&config, setup.config(dir.path())).unwrap();
    let d = setup.start_in(dir, IDLE4);
    // The action was decided, and its first call is being retried through 503s.
    let unavailable = || {
        proxy
            .unavailable_answers
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    d.await_sample(LIMIT, |_| {
        !events(&d.audit(), "action_attempt").is_empty() && unavailable() >= 2
    });
    // The user sees the warning and holds the node; then EC2 recovers.
    common::gpuwatch(&[
        &"hold",
        &"1h",
        &"--reason",
        &"still needed",
        &"--config",
        &config,
    ]);
    proxy.set(ProxyMode::Forward);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "refused") == 1.0);
    let audit = d.audit();
    let result = events(&audit, "action_result")[0];
    let detail = result["detail"].as_str().unwrap();
    assert!(
        detail.contains("called off") && detail.contains("still needed"),
        "{detail}"
    );
    assert!(!api_calls(&audit).contains(&"StopInstances".to_string()));
    assert_eq!(aws::instance_state(&inst.id), "running");
}

#[test]
fn a_spot_interruption_notice_sets_the_metric_runs_the_hook_and_blocks_actions() {
    let inst = aws::launch(Kind::OneTimeSpot);
    let imds = aws::imds(&inst.id, "spot");
    let notice_at = gpuwatch::time::now().floor() + 120.0;
    imds.state.lock().unwrap().instance_action = Some(format!(
        r#"{{"action": "terminate", "time": "{}"}}"#,
        gpuwatch::time::rfc3339(notice_at)
    ));
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("hook-ran");
    let mut setup = Setup::new(&imds, "terminate");
    let extra = format!(
        "[spot]\ninterruption_hook = [\"touch\", \"{}\"]\nhook_timeout = \"5s\"",
        marker.display()
    );
    setup.extra = &extra;
    let d = setup.start_in(dir, IDLE4);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_spot_interruption_pending").get(s) == Some(1.0)
    });
    metric("gpuwatch_spot_interruption_timestamp_seconds")
        .value(notice_at)
        .assert_in(&s);
    d.await_sample(LIMIT, |_| marker.exists());
    d.await_time(gpuwatch::time::now() + 4.0);
    let audit = d.audit();
    assert_eq!(events(&audit, "interruption_hook")[0]["result"], "done");
    assert!(
        events(&audit, "action_attempt").is_empty(),
        "gpuwatch must not compete with AWS"
    );
    assert_eq!(aws::instance_state(&inst.id), "running");
}

#[test]
fn a_revoked_metadata_token_is_replaced_and_notices_are_still_seen() {
    let inst = aws::launch(Kind::OneTimeSpot);
    let imds = aws::imds(&inst.id, "spot");
    let d = Setup::new(&imds, "terminate").start(IDLE4);
    d.await_scrape(LIMIT, |s| metric("gpuwatch_node_info").get(s) == Some(1.0));
    let before = imds.state.lock().unwrap().token_requests;
    // Every token issued so far now answers 401.
    imds.state.lock().unwrap().token_generation += 1;
    let notice_at = gpuwatch::time::now().floor() + 120.0;
    imds.state.lock().unwrap().instance_action = Some(format!(
        r#"{{"action": "terminate", "time": "{}"}}"#,
        gpuwatch::time::rfc3339(notice_at)
    ));
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_spot_interruption_pending").get(s) == Some(1.0)
    });
    metric("gpuwatch_spot_interruption_timestamp_seconds")
        .value(notice_at)
        .assert_in(&s);
    // One new token, not one per request.
    let after = imds.state.lock().unwrap().token_requests;
    assert!(after > before && after <= before + 3, "{before} -> {after}");
    metric("gpuwatch_imds_errors_total")
        .value(0.0)
        .assert_in(&s);
}

#[test]
fn a_rebalance_recommendation_is_exported_and_blocks_nothing() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    imds.state.lock().unwrap().rebalance = Some(format!(
        r#"{{"noticeTime": "{}"}}"#,
        gpuwatch::time::rfc3339(gpuwatch::time::now().floor())
    ));
    let d = Setup::new(&imds, "stop").start(IDLE4);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_spot_rebalance_recommended")
        .value(1.0)
        .assert_in(&s);
    metric("gpuwatch_spot_interruption_pending")
        .value(0.0)
        .assert_in(&s);
    assert_eq!(events(&d.audit(), "spot_rebalance").len(), 1);
}

#[test]
fn the_iam_policy_grants_exactly_the_calls_in_the_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let policy: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("config/iam-policy.json")).unwrap(),
    )
    .unwrap();
    let mut granted: Vec<String> = policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["Action"].as_array().unwrap().iter())
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    granted.sort();
    // Every `<client>.<operation>()` call in the cloud modules, in PascalCase.
    let mut called: Vec<String> = Vec::new();
    for (file, clients) in [
        ("src/cloud/aws/ec2.rs", &[".client().await."][..]),
        (
            "src/cloud/aws/services.rs",
            &[
                ".budgets().await.",
                ".sns().await.",
                ".cloudwatch().await.",
                ".pricing().await.",
            ][..],
        ),
    ] {
        let source = std::fs::read_to_string(root.join(file)).unwrap();
        let squeezed: String = source.split_whitespace().collect();
        for client in clients {
            called.extend(
                squeezed
                    .split(client)
                    .skip(1)
                    .filter_map(|rest| rest.split('(').next())
                    .filter(|op| {
                        !op.is_empty() && op.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    })
                    .map(|snake| {
                        snake
                            .split('_')
                            .map(|w| w[..1].to_uppercase() + &w[1..])
                            .collect::<String>()
                    }),
            );
        }
    }
    called.sort();
    called.dedup();
    let table = gpuwatch::cloud::aws::services::IAM_ACTIONS;
    let mut listed: Vec<String> = table.iter().map(|(op, _)| op.to_string()).collect();
    listed.sort();
    assert_eq!(
        called, listed,
        "IAM_ACTIONS drifted from the calls in src/cloud/aws"
    );
    let mut actions: Vec<String> = table.iter().map(|(_, a)| a.to_string()).collect();
    actions.sort();
    assert_eq!(
        granted, actions,
        "config/iam-policy.json drifted from IAM_ACTIONS"
    );
}

/// The bounds of config/iam-policy.json, judged by the evaluator in `common/iam.rs` (moto
/// evaluates no conditions): the instance role may tag only its own instance, and only with the
/// keys gpuwatch writes (never its `gpuwatch:hold`, team or cost tags), and may cancel only spot
/// requests tagged `gpuwatch:managed=true`.
#[test]
fn the_iam_policy_tags_only_gpuwatch_keys_and_cancels_only_tagged_spot_requests() {
    use aws::iam::{ec2_arn, Policy, Request};
    let policy = Policy::shipped();
    let me = "i-0123456789abcdef0";
    let other = "i-0fedcba9876543210";
    // The keys `tag_action` writes.
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/cloud/aws/ec2.rs"))
            .unwrap();
    let written: Vec<(&str, &str)> = source
        .split(".key(\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(|key| (key, "value"))
        .collect();
    assert_eq!(
        written.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        ["gpuwatch:action", "gpuwatch:rule"]
    );
    let tag = |on: &str, tags: &[(&str, &str)]| {
        Request::ec2_by_instance("ec2:CreateTags", on, me).with_request_tags(tags)
    };
    let cancel = |request: &str, tags: &[(&str, &str)]| {
        tags.iter().fold(
            Request::ec2_by_instance("ec2:CancelSpotInstanceRequests", request, me),
            |r, (k, v)| r.with_resource_tag(k, v),
        )
    };
    let cases = [
        ("its own keys, on itself", tag(me, &written), true),
        (
            "one of its keys, on itself",
            tag(me, &[("gpuwatch:action", "stop")]),
            true,
        ),
        (
            "its hold tag",
            tag(me, &[("gpuwatch:hold", "2099-01-01T00:00:00Z")]),
            false,
        ),
        (
            "its own keys and the hold tag",
            tag(
                me,
                &[("gpuwatch:action", "stop"), ("gpuwatch:hold", "2099-01-01")],
            ),
            false,
        ),
        ("a cost tag", tag(me, &[("team", "someone-else")]), false),
        (
            "no tag keys at all",
            Request::ec2_by_instance("ec2:CreateTags", me, me),
            false,
        ),
        (
            "its own keys, on another instance",
            tag(other, &[("gpuwatch:action", "stop")]),
            false,
        ),
        (
            "its own keys, from outside any instance",
            Request::new("ec2:CreateTags", &ec2_arn(me))
                .with("aws:ARN", &ec2_arn(me))
                .with_request_tags(&[("gpuwatch:action", "stop")]),
            false,
        ),
        (
            "a spot request tagged gpuwatch:managed=true",
            cancel("sir-tagged1", &[("gpuwatch:managed", "true")]),
            true,
        ),
        (
            "an untagged spot request",
            cancel("sir-untagged", &[]),
            false,
        ),
        (
            "a spot request tagged otherwise",
            cancel(
                "sir-other123",
                &[("gpuwatch:managed", "false"), ("team", "ml")],
            ),
            false,
        ),
        (
            "stopping itself",
            Request::ec2_by_instance("ec2:StopInstances", me, me),
            true,
        ),
        (
            "terminating another instance",
            Request::ec2_by_instance("ec2:TerminateInstances", other, me),
            false,
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(_, req, allowed)| policy.allows(req) != *allowed)
        .map(|(what, req, allowed)| {
            format!(
                "{what}: {} on {} should be {}",
                req.action,
                req.resource,
                if *allowed { "allowed" } else { "denied" }
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "config/iam-policy.json:\n{}",
        wrong.join("\n")
    );
}

/// Through the policy, end to end: the gate in `common/iam.rs` passes to moto only what
/// config/iam-policy.json allows this instance's role. With the README's tag on its persistent
/// spot request, the request is cancelled and the instance terminated, every call allowed; the
/// same role cannot lift a hold by setting the instance's `gpuwatch:hold` tag.
#[test]
fn through_the_iam_policy_a_tagged_persistent_spot_request_is_cancelled_then_terminated() {
    use aws_sdk_ec2::error::ProvideErrorMetadata;
    let inst = aws::launch_tagged_spot_request(&[("gpuwatch:managed", "true")]);
    let request = inst.spot_request.clone().unwrap();
    let gate = aws::iam::Gate::start(aws::iam::Policy::shipped(), &inst.id);
    let node = aws::ec2_client(gate.addr);
    let hold = aws::rt()
        .block_on(
            node.create_tags()
                .resources(&inst.id)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("gpuwatch:hold")
                        .value("2099-01-01T00:00:00Z")
                        .build(),
                )
                .send(),
        )
        .unwrap_err();
    assert_eq!(hold.code(), Some("UnauthorizedOperation"), "{hold:?}");
    assert!(!aws::instance_tags(&inst.id).contains_key("gpuwatch:hold"));

    let imds = aws::imds(&inst.id, "spot");
    let mut setup = Setup::new(&imds, "terminate");
    setup.endpoint = gate.addr;
    let d = setup.start(IDLE4);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "done") == 1.0);
    assert_cancelled_and_terminated(&inst.id, &request);
    let decisions = gate.decisions();
    // The first is the hold tag above.
    assert!(
        decisions[0].operation == "CreateTags" && !decisions[0].allowed,
        "{decisions:#?}"
    );
    let denied: Vec<_> = decisions.iter().skip(1).filter(|d| !d.allowed).collect();
    assert!(
        denied.is_empty(),
        "the policy denied the daemon {denied:#?}"
    );
    let mutating: Vec<&str> = decisions
        .iter()
        .skip(1)
        .map(|d| d.operation.as_str())
        .filter(|op| !op.starts_with("Describe") && *op != "GetProducts")
        .collect();
    assert_eq!(
        mutating,
        [
            "CreateTags",
            "CancelSpotInstanceRequests",
            "TerminateInstances"
        ]
    );
}

/// Without the tag, the policy denies the cancel, and gpuwatch then terminates nothing (the
/// persistent request would launch a replacement): the action fails, on the record.
#[test]
fn through_the_iam_policy_an_untagged_persistent_spot_request_keeps_its_instance() {
    let inst = aws::launch(Kind::PersistentSpot);
    let request = inst.spot_request.clone().unwrap();
    let gate = aws::iam::Gate::start(aws::iam::Policy::shipped(), &inst.id);
    let imds = aws::imds(&inst.id, "spot");
    let mut setup = Setup::new(&imds, "terminate");
    setup.endpoint = gate.addr;
    let d = setup.start(IDLE4);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "failed") >= 1.0);
    assert_eq!(aws::instance_state(&inst.id), "running");
    assert_eq!(aws::spot_request_state(&request).as_deref(), Some("active"));
    let decisions = gate.decisions();
    let cancels: Vec<_> = decisions
        .iter()
        .filter(|d| d.operation == "CancelSpotInstanceRequests")
        .collect();
    assert!(
        !cancels.is_empty() && cancels.iter().all(|d| !d.allowed),
        "{decisions:#?}"
    );
    assert!(
        decisions
            .iter()
            .all(|d| d.operation != "TerminateInstances"),
        "{decisions:#?}"
    );
    let audit = d.audit();
    let error = events(&audit, "api_error")[0];
    assert_eq!(error["operation"], "CancelSpotInstanceRequests", "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("UnauthorizedOperation"),
        "{error}"
    );
}
