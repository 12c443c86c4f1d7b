//! Idle rules acting on Alibaba Cloud ECS instances, end to end: the daemon over fake GPUs,
//! against a fake instance metadata service and ECS API written from Alibaba's documents
//! (`tests/alibaba/fake_alibaba.py`). The fake serves metadata in security hardening mode only
//! (a token for every read) and checks every ECS call's signature V3 as Alibaba does: the
//! STS AccessKey its metadata issued, with that key's security token, a fresh nonce and a date
//! within 15 minutes.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::alibaba::{tags_of, Fake, INSTANCE};
use common::aws::actions;
use common::fake::{api_calls, assert_done_without_the_stamp, start, start_in, BUSY, IDLE};
use common::{events, metric, secs, Response};
use gpuwatch::cloud::alibaba::sign::{sha256_hex, sign, Request};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);

/// The change to the fake's state that makes its instance a spot one.
fn spot() -> Value {
    json!({"spot_strategy": "SpotAsPriceGo"})
}

#[test]
fn an_idle_pay_as_you_go_instance_is_tagged_then_stopped_in_economical_mode_until_stopped() {
    let fake = Fake::start();
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_node_info")
        .label("provider", "alibaba")
        .label("instance_id", INSTANCE)
        .label("instance_type", "ecs.gn7i-c8g1.2xlarge")
        .label("availability_zone", "cn-hangzhou-i")
        .label("lifecycle", "on-demand")
        .value(1.0)
        .assert_in(&s);
    // Tagged, then stopped once, in economical mode, and followed until ECS said Stopped.
    let state = fake.state();
    assert_eq!(state["status"], "Stopped");
    assert_eq!(state["stopped_mode"], "StopCharging");
    assert_eq!(fake.mutations(), ["TagResources", "StopInstance"]);
    let tag = &fake.calls_of("TagResources")[0];
    assert_eq!(tag["query"]["RegionId"], "cn-hangzhou", "{tag}");
    assert_eq!(tag["query"]["ResourceType"], "instance", "{tag}");
    assert_eq!(tag["query"]["ResourceId.1"], INSTANCE, "{tag}");
    let asked = tags_of(tag);
    assert!(
        asked.contains(&("gpuwatch:action".to_string(), "stop".to_string())),
        "{asked:?}"
    );
    assert!(
        asked.contains(&("gpuwatch:rule".to_string(), "idle".to_string())),
        "{asked:?}"
    );
    // The tags were merged: the instance's own stay.
    assert_eq!(state["tags"]["team"], "ml");
    assert_eq!(state["tags"]["gpuwatch:action"], "stop");
    assert_eq!(state["tags"]["gpuwatch:rule"], "idle");
    let stop = &fake.calls_of("StopInstance")[0];
    assert_eq!(stop["query"]["InstanceId"], INSTANCE, "{stop}");
    assert_eq!(stop["query"]["StoppedMode"], "StopCharging", "{stop}");
    assert_ne!(
        stop["query"]["ForceStop"], "true",
        "a stop is not a power-off: {stop}"
    );
    let calls = fake.calls("ecs");
    let at = calls
        .iter()
        .position(|c| c["action"] == "StopInstance")
        .unwrap();
    let reads = calls[at..]
        .iter()
        .filter(|c| c["action"] == "DescribeInstanceStatus")
        .count();
    assert!(
        reads >= 2,
        "the status was read {reads} times after the stop"
    );
    assert_eq!(api_calls(&d), ["TagResources", "StopInstance"]);
    assert_eq!(
        events(&d.audit(), "api_call")[1]["request_id"],
        stop["request_id"]
    );
    // Every call was signed as Alibaba checks (the fake answers nothing else with 200), and
    // every metadata read carried a token (the fake refuses any other).
    for c in &calls {
        assert!(c["status"].is_null() || c["status"] == 200, "{c}");
    }
    assert!(fake
        .calls("metadata")
        .iter()
        .filter(|c| c["path"]
            .as_str()
            .unwrap()
            .starts_with("/latest/meta-data/"))
        .all(|c| c["token"] == true));
    // No secret the metadata service issued is in the log or the audit log.
    let keys = fake.state()["keys"].as_object().unwrap().clone();
    assert!(!keys.is_empty(), "no credentials were fetched");
    let log = d.log();
    let audit = std::fs::read_to_string(d.dir.path().join("state/audit.jsonl")).unwrap();
    for (id, key) in &keys {
        for secret in [&key["secret"], &key["token"]] {
            let secret = secret.as_str().unwrap();
            assert!(!log.contains(secret), "the log shows a secret of {id}");
            assert!(
                !audit.contains(secret),
                "the audit log shows a secret of {id}"
            );
        }
    }
    // DescribePrice's pay-as-you-go price of the instance type in its region.
    common::assert_price(&d, "pricing_api", 4.2);
    let price = &fake.calls_of("DescribePrice")[0]["query"];
    assert_eq!(price["RegionId"], "cn-hangzhou", "{price}");
    assert_eq!(price["InstanceType"], "ecs.gn7i-c8g1.2xlarge", "{price}");
    // The instance's own system disk, which current families need to be priced at all; the
    // price is the instance type's alone, without the disk's $0.11 that DescribePrice adds.
    assert_eq!(price["SystemDisk.Category"], "cloud_essd", "{price}");
    assert_eq!(price["SystemDisk.Size"], "100", "{price}");
    assert!(
        price["PriceUnit"].is_null() || price["PriceUnit"] == "Hour",
        "{price}"
    );
}

#[test]
fn busy_gpus_and_dry_run_call_nothing() {
    let fake = Fake::start();
    let d = start(&fake, "dry-run", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "dry_run") == 1.0);
    let result = events(&d.audit(), "action_result")[0].clone();
    assert_eq!(result["detail"], "would StopInstance", "{result}");
    assert_eq!(fake.mutations(), Vec::<String>::new());
    drop(d);
    let d = start(&fake, "enforce", "stop", "", BUSY);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert_eq!(fake.mutations(), Vec::<String>::new());
    assert_eq!(fake.state()["status"], "Running");
}

#[test]
fn a_spot_termination_time_blocks_the_action_and_runs_the_hook_once() {
    let fake = Fake::start();
    let when = gpuwatch::time::now().floor() + 300.0;
    let mut change = spot();
    change["termination_time"] = json!(gpuwatch::time::rfc3339(when));
    fake.set(change);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("hook-ran");
    let extra = format!(
        "[spot]\ninterruption_hook = [\"touch\", \"{}\"]\nhook_timeout = \"5s\"",
        marker.display()
    );
    let d = start_in(dir, &fake, "enforce", "terminate", &extra, IDLE);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_spot_interruption_pending").get(s) == Some(1.0)
    });
    metric("gpuwatch_spot_interruption_timestamp_seconds")
        .value(when)
        .assert_in(&s);
    d.await_sample(LIMIT, |_| marker.exists());
    d.await_time(gpuwatch::time::now() + 4.0);
    let audit = d.audit();
    assert_eq!(events(&audit, "interruption_hook").len(), 1);
    assert_eq!(events(&audit, "interruption_hook")[0]["result"], "done");
    assert!(events(&audit, "action_attempt").is_empty(), "{audit:?}");
    assert_eq!(fake.mutations(), Vec::<String>::new());
    // Cleared: the action follows.
    fake.set(json!({"termination_time": ""}));
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "done") == 1.0);
    assert_eq!(fake.state()["deleted"], true);
    assert_eq!(events(&d.audit(), "interruption_hook").len(), 1);
}

#[test]
fn a_hold_tag_holds_until_it_expires() {
    let fake = Fake::start();
    fake.set(json!({"tags": {"team": "ml", "gpuwatch:hold": "after lunch"}}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .value(f64::INFINITY)
        .assert_in(&d.scrape());
    assert_eq!(fake.mutations(), Vec::<String>::new());
    // The tag is read where ECS keeps it.
    let read = fake.calls_of("DescribeInstances");
    assert!(!read.is_empty());
    assert_eq!(read[0]["query"]["RegionId"], "cn-hangzhou");
    let ids: Value =
        serde_json::from_str(read[0]["query"]["InstanceIds"].as_str().unwrap()).unwrap();
    assert_eq!(ids, json!([INSTANCE]));
    let until = gpuwatch::time::now().ceil() + 3.0;
    fake.set(json!({"tags": {"team": "ml", "gpuwatch:hold": gpuwatch::time::rfc3339(until)}}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert!(secs(&events(&d.audit(), "action_attempt")[0]["time"]) >= until);
}

#[test]
fn metadata_down_at_start_holds_every_action_and_acts_once_it_answers() {
    let fake = Fake::start();
    fake.set(json!({"metadata_down": true}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_log(LIMIT, "instance metadata is unavailable");
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert!(fake.calls("ecs").is_empty());
    fake.set(json!({"metadata_down": false}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(fake.state()["status"], "Stopped");
    assert_eq!(fake.mutations(), ["TagResources", "StopInstance"]);
}

#[test]
fn a_denied_stop_fails_the_action_naming_the_ram_action() {
    let fake = Fake::start();
    // ECS's message quotes the security token it was sent: it goes no further.
    fake.set(json!({"denied": ["ecs:StopInstance"], "quote_token": true}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    let audit_text = std::fs::read_to_string(d.dir.path().join("state/audit.jsonl")).unwrap();
    for key in fake.state()["keys"].as_object().unwrap().values() {
        let token = key["token"].as_str().unwrap();
        assert!(!audit_text.contains(token), "the audit log shows a token");
        assert!(!d.log().contains(token), "the log shows a token");
    }
    assert!(
        audit_text.contains("SecurityToken [redacted]"),
        "{audit_text}"
    );
    let audit = d.audit();
    let error = events(&audit, "api_error")[0];
    assert_eq!(error["operation"], "StopInstance", "{error}");
    let said = error["error"].as_str().unwrap();
    assert!(said.contains("Forbidden.RAM"), "{said}");
    assert!(said.contains("ecs:StopInstance"), "{said}");
    let result = events(&audit, "action_result")[0];
    assert_eq!(result["result"], "failed");
    assert_eq!(fake.state()["status"], "Running");
    let stop = &fake.calls_of("StopInstance")[0];
    assert_eq!(stop["code"], "Forbidden.RAM", "{stop}");
}

#[test]
fn terminate_deletes_the_instance_forcing_it_while_it_runs() {
    let fake = Fake::start();
    let d = start(&fake, "enforce", "terminate", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "done") == 1.0);
    assert_eq!(fake.state()["deleted"], true);
    assert_eq!(fake.mutations(), ["TagResources", "DeleteInstance"]);
    let delete = &fake.calls_of("DeleteInstance")[0];
    assert_eq!(delete["query"]["InstanceId"], INSTANCE, "{delete}");
    assert_eq!(delete["query"]["Force"], "true", "{delete}");
    assert_eq!(api_calls(&d), ["TagResources", "DeleteInstance"]);
}

#[test]
fn a_spot_instance_is_priced_from_the_spot_market_in_dollars_only() {
    let fake = Fake::start();
    fake.set(spot());
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    let s = common::assert_price(&d, "spot", 0.85);
    metric("gpuwatch_node_info")
        .label("provider", "alibaba")
        .label("lifecycle", "spot")
        .value(1.0)
        .assert_in(&s);
    let asked = &fake.calls_of("DescribeSpotPriceHistory")[0]["query"];
    assert_eq!(asked["RegionId"], "cn-hangzhou", "{asked}");
    assert_eq!(asked["ZoneId"], "cn-hangzhou-i", "{asked}");
    assert_eq!(asked["InstanceType"], "ecs.gn7i-c8g1.2xlarge", "{asked}");
    assert_eq!(asked["NetworkType"], "vpc", "{asked}");
    drop(d);

    // A China-site account is answered in yuan: no dollar price is known.
    let fake = Fake::start();
    let mut change = spot();
    change["currency"] = json!("CNY");
    fake.set(change);
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    d.await_log(LIMIT, "CNY");
    assert!(!fake.calls_of("DescribeSpotPriceHistory").is_empty());
    d.await_time(gpuwatch::time::now() + 2.0);
    assert!(
        metric("gpuwatch_instance_hourly_cost_dollars")
            .get(&d.scrape())
            .is_none(),
        "{}",
        d.scrape().text
    );
}

#[test]
fn economical_mode_that_does_not_apply_is_audited_as_keep_charging() {
    let fake = Fake::start();
    fake.set(json!({"economical": false}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_action(LIMIT, "idle");
    // The provider reads StoppedMode back after the stop, and the audit log says what it was.
    let said = |audit: &[Value]| -> String {
        audit
            .iter()
            .filter(|r| {
                let event = r["event"].as_str().unwrap_or_default();
                event.starts_with("action_") || event.starts_with("api_") || r["rule"] == "idle"
            })
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    };
    d.await_scrape(LIMIT, |_| said(&d.audit()).contains("KeepCharging"));
    if let Some(stop) = fake.calls_of("StopInstance").first() {
        assert_eq!(stop["query"]["StoppedMode"], "StopCharging", "{stop}");
        assert_eq!(fake.state()["stopped_mode"], "KeepCharging");
    }
}

/// A `DescribeInstances` that answers 200 without the instance (an eventually consistent read)
/// says nothing of its tags: a `gpuwatch:hold` tag read before still holds, then the hold is
/// unknown, and unknown holds. Once ECS names the instance again without the tag, it acts.
#[test]
fn an_answer_that_does_not_name_the_instance_is_unread_tags_which_hold() {
    let fake = Fake::start();
    let until = gpuwatch::time::rfc3339(gpuwatch::time::now() + 3600.0);
    fake.set(json!({"tags": {"team": "ml", "gpuwatch:hold": until}}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_hold_until_timestamp_seconds")
            .label("source", "tag")
            .get(s)
            .is_some_and(|t| t < f64::INFINITY)
    });
    fake.set(json!({"describe_empty": -1}));
    let empty = fake.calls_of("DescribeInstances").len();
    d.await_scrape(LIMIT, |_| {
        fake.calls_of("DescribeInstances").len() >= empty + 10
    });
    d.await_time(gpuwatch::time::now() + 3.0);
    assert!(
        events(&d.audit(), "action_attempt").is_empty(),
        "{:?}",
        d.audit()
    );
    assert_eq!(fake.mutations(), Vec::<String>::new());
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .label("reason", "unread tag")
        .value(f64::INFINITY)
        .assert_in(&d.scrape());
    // Named again, without the hold: the idle instance is stopped.
    fake.set(json!({"describe_empty": 0, "tags": {"team": "ml"}}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(fake.mutations(), ["TagResources", "StopInstance"]);
}

/// ECS accepted the stop; reads that lag it (the instance missing from `DescribeInstances`)
/// are read again until they name it, and the stop is audited as what it was: done, in
/// economical mode, never failed with an empty `StoppedMode`.
#[test]
fn a_stop_is_read_back_until_ecs_names_the_instance() {
    let fake = Fake::start();
    fake.set(json!({"empty_after_stop": -1}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    fake.await_state(LIMIT, |s| s["status"] == "Stopped");
    let stopped = fake.calls_of("DescribeInstances").len();
    d.await_scrape(LIMIT, |_| {
        fake.calls_of("DescribeInstances").len() >= stopped + 5
    });
    let s = d.scrape();
    assert_eq!(actions(&s, "stop", "failed"), 0.0, "{}", d.log());
    assert!(
        events(&d.audit(), "action_result").is_empty(),
        "{:?}",
        d.audit()
    );
    fake.set(json!({"describe_empty": 0, "empty_after_stop": 0}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(fake.state()["stopped_mode"], "StopCharging");
    assert_eq!(fake.mutations(), ["TagResources", "StopInstance"]);
    assert_eq!(events(&d.audit(), "action_result")[0]["result"], "done");
}

/// A throttled `DescribeInstances` at start does not leave the lifecycle, and so the price,
/// unknown for the process's life: it is read again, with backoff, until it answers.
#[test]
fn a_throttled_lifecycle_read_is_read_again_until_the_price_is_known() {
    let fake = Fake::start();
    fake.set(json!({"throttle": {"DescribeInstances": 5}}));
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    let s = common::assert_price(&d, "pricing_api", 4.2);
    metric("gpuwatch_node_info")
        .label("provider", "alibaba")
        .label("lifecycle", "on-demand")
        .value(1.0)
        .assert_in(&s);
    let throttled = fake
        .calls_of("DescribeInstances")
        .iter()
        .filter(|c| c["code"] == "Throttling")
        .count();
    assert_eq!(throttled, 5);
}

/// The daemon serves before ECS answers anything: identity comes from metadata alone, and the
/// lifecycle follows once `DescribeInstances` answers.
#[test]
fn the_daemon_serves_while_ecs_has_not_answered() {
    let fake = Fake::start();
    fake.set(json!({"stall": ["DescribeInstances"]}));
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    let s = d.await_scrape(LIMIT, |s| metric("gpuwatch_node_info").get(s).is_some());
    metric("gpuwatch_node_info")
        .label("provider", "alibaba")
        .label("instance_id", INSTANCE)
        .label("lifecycle", "unknown")
        .value(1.0)
        .assert_in(&s);
    fake.await_state(LIMIT, |s| s["stalled"].as_u64() >= Some(1));
    assert!(
        fake.calls_of("DescribeInstances")
            .iter()
            .all(|c| c["status"].is_null()),
        "ECS answered before the daemon served"
    );
    fake.set(json!({"stall": []}));
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_node_info")
            .label("lifecycle", "on-demand")
            .get(s)
            == Some(1.0)
    });
}

/// An instance with 19 of ECS's 20 tags refuses the two `gpuwatch:` stamps: the refusal is on
/// record and counted, and the idle instance is stopped all the same.
#[test]
fn a_full_tag_set_refuses_the_stamp_and_the_stop_goes_on() {
    let fake = Fake::start();
    let tags: serde_json::Map<String, Value> = (0..19)
        .map(|i| (format!("k{i}"), json!(format!("v{i}"))))
        .collect();
    fake.set(json!({ "tags": tags }));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    assert_done_without_the_stamp(&d, "stop", "TagResources", "NumberExceed.Tags");
    assert_eq!(fake.state()["status"], "Stopped");
    assert_eq!(
        fake.calls_of("TagResources")[0]["code"],
        "NumberExceed.Tags"
    );
    assert_eq!(fake.state()["tags"].as_object().unwrap().len(), 19);
    assert_eq!(api_calls(&d), ["StopInstance"]);
}

/// ECS carried the stop out, but its answer was lost (the connection closed before it): the
/// stop is never sent again, and the action says its outcome is unknown rather than calling a
/// second stop's refusal its result.
#[test]
fn a_stop_whose_answer_was_lost_is_never_sent_again() {
    let fake = Fake::start();
    fake.set(json!({"drop_answer": ["StopInstance"]}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    assert_eq!(fake.calls_of("StopInstance").len(), 1);
    let audit = d.audit();
    let error = events(&audit, "api_error")[0]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(error.contains("its outcome is unknown"), "{error}");
    assert_ne!(fake.state()["status"], "Running");
}

/// The interruption hook runs once per notice, not once per process: a restart while the same
/// notice is in force does not run it again (the state directory keeps the notices whose hook
/// ran).
#[test]
fn a_restart_during_a_notice_does_not_run_its_hook_again() {
    let fake = Fake::start();
    let mut change = spot();
    change["termination_time"] = json!(gpuwatch::time::rfc3339(
        gpuwatch::time::now().floor() + 300.0
    ));
    fake.set(change);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let ran = root.join("hook-ran");
    let extra = format!(
        "[spot]\ninterruption_hook = [\"sh\", \"-c\", \"echo ran >> {}\"]\nhook_timeout = \"5s\"",
        ran.display()
    );
    let config = fake.config(
        &root,
        "mode = \"enforce\"\nwarning = \"1s\"",
        &format!("{extra}\n{}", common::fake::rule("idle", "terminate")),
    );
    let mut d = common::Daemon::start_scenario(dir, BUSY, &config);
    // The hook ran, and its notice is on record (after it ran: a crash in between runs the
    // hook again, which does less harm than never).
    let hooks = root.join("state/hooks.json");
    d.await_sample(LIMIT, |_| {
        std::fs::read_to_string(&hooks).is_ok_and(|h| h.contains("Z"))
    });
    assert!(ran.exists());
    d.kill();
    let d2 = common::Daemon::start_with(common::reuse_dir(&root), &config);
    d2.await_scrape(LIMIT, |s| {
        metric("gpuwatch_spot_interruption_pending").get(s) == Some(1.0)
    });
    let polls = fake.calls("metadata").len();
    d2.await_scrape(LIMIT, |_| fake.calls("metadata").len() >= polls + 20);
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "ran\n");
    assert!(!d2.log().contains("pre-interruption hook"), "{}", d2.log());
}

/// A RAM policy from before `DescribeDisks` was granted: the system disk is not known, and the
/// categories the current families take are tried in turn; the instance type's own row is the
/// price whatever the disk.
#[test]
fn without_the_system_disk_the_price_is_asked_with_the_current_categories() {
    let fake = Fake::start();
    fake.set(json!({"denied": ["ecs:DescribeDisks"]}));
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    common::assert_price(&d, "pricing_api", 4.2);
    let asked: Vec<Value> = fake
        .calls_of("DescribePrice")
        .iter()
        .map(|c| c["query"]["SystemDisk.Category"].clone())
        .collect();
    assert_eq!(asked[..2], [Value::Null, json!("cloud_essd")], "{asked:?}");
    assert_eq!(
        fake.calls_of("DescribePrice")[0]["code"],
        "InvalidSystemDiskCategory.ValueNotSupported"
    );
}

/// One HTTP/1.1 exchange by hand: `head` holds the request line and headers, without the
/// blank line.
fn exchange(addr: SocketAddr, head: &str) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    write!(
        s,
        "{head}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Response {
        status: head.split(' ').nth(1).unwrap().parse().unwrap(),
        headers: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

/// RFC 3986, as signature V3 encodes a query.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A DescribeInstances call signed with `id` and `secret` (and the security `token`), dated
/// `date`, with `nonce`.
fn describe(
    ecs: SocketAddr,
    (id, secret, token): (&str, &str, &str),
    date: &str,
    nonce: &str,
) -> Response {
    let query: Vec<(String, String)> = [
        ("RegionId", "cn-hangzhou".to_string()),
        ("InstanceIds", format!("[\"{INSTANCE}\"]")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let headers: Vec<(String, String)> = [
        ("host", ecs.to_string()),
        ("x-acs-action", "DescribeInstances".to_string()),
        ("x-acs-version", "2014-05-26".to_string()),
        ("x-acs-date", date.to_string()),
        ("x-acs-signature-nonce", nonce.to_string()),
        ("x-acs-content-sha256", sha256_hex(b"")),
        ("x-acs-security-token", token.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let signed = sign(
        &Request {
            method: "POST",
            path: "/",
            query: &query,
            headers: &headers,
            body: b"",
        },
        id,
        secret,
    );
    let url = query
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let mut head = format!("POST /?{url} HTTP/1.1");
    for (k, v) in &headers {
        head.push_str(&format!("\r\n{k}: {v}"));
    }
    head.push_str(&format!("\r\nAuthorization: {}", signed.authorization));
    exchange(ecs, &head)
}

/// The fake checks what it claims to: hardened metadata (a token for every read, the TTL in
/// range, no `X-Forwarded-For`), and signature V3 with the STS credentials its metadata issued,
/// refusing a replayed nonce, a stale date, a wrong secret, token or key.
#[test]
fn the_fake_checks_dates_nonces_and_signatures_as_alibaba_does() {
    let fake = Fake::start();
    let md = fake.metadata;
    let ttl = "X-aliyun-ecs-metadata-token-ttl-seconds";
    let put = |extra: &str| {
        exchange(
            md,
            &format!("PUT /latest/api/token HTTP/1.1\r\nHost: 100.100.100.200{extra}"),
        )
    };
    assert_eq!(put("").status, 400, "no TTL");
    assert_eq!(put(&format!("\r\n{ttl}: 21601")).status, 400);
    assert_eq!(put(&format!("\r\n{ttl}: 0")).status, 400);
    assert_eq!(
        put(&format!("\r\n{ttl}: 60\r\nX-Forwarded-For: 10.0.0.1")).status,
        403
    );
    let r = put(&format!("\r\n{ttl}: 21600"));
    assert_eq!(r.status, 200, "{}", r.body);
    let token = r.body;
    let read = |path: &str, token: Option<&str>| {
        let header = token.map_or(String::new(), |t| {
            format!("\r\nX-aliyun-ecs-metadata-token: {t}")
        });
        exchange(
            md,
            &format!("GET /latest/meta-data/{path} HTTP/1.1\r\nHost: 100.100.100.200{header}"),
        )
    };
    assert_eq!(read("instance-id", None).status, 403, "normal mode is off");
    assert_eq!(read("instance-id", Some("aaa")).status, 401);
    assert_eq!(read("instance-id", Some(&token)).body, INSTANCE);
    assert_eq!(
        read("instance/spot/termination-time", Some(&token)).status,
        404
    );
    let role = read("ram/security-credentials/", Some(&token)).body;
    assert_eq!(role, "GpuwatchRole");
    let creds: Value =
        serde_json::from_str(&read(&format!("ram/security-credentials/{role}"), Some(&token)).body)
            .unwrap();
    assert_eq!(creds["Code"], "Success");
    let id = creds["AccessKeyId"].as_str().unwrap();
    assert!(id.starts_with("STS."), "{id}");
    let secret = creds["AccessKeySecret"].as_str().unwrap();
    let sts = creds["SecurityToken"].as_str().unwrap();
    assert!(secs(&creds["Expiration"]) > gpuwatch::time::now() + 3000.0);

    let now = gpuwatch::time::now().floor();
    let date = gpuwatch::time::rfc3339(now);
    let nonce = |n: u32| format!("{:016x}{n:016x}", std::process::id());
    let code = |r: &Response| r.json()["Code"].as_str().unwrap_or_default().to_string();
    let good = (id, secret, sts);

    let r = describe(fake.ecs, good, &date, &nonce(1));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["Instances"]["Instance"][0]["InstanceId"], INSTANCE);
    // The same request again: a replay.
    let r = describe(fake.ecs, good, &date, &nonce(1));
    assert_eq!(
        (r.status, code(&r)),
        (400, "SignatureNonceUsed".into()),
        "{}",
        r.body
    );
    // Dated 20 minutes ago.
    let r = describe(
        fake.ecs,
        good,
        &gpuwatch::time::rfc3339(now - 1200.0),
        &nonce(2),
    );
    assert_eq!(
        (r.status, code(&r)),
        (400, "InvalidTimeStamp.Expired".into()),
        "{}",
        r.body
    );
    let r = describe(fake.ecs, (id, "not-the-secret", sts), &date, &nonce(3));
    assert_eq!(
        (r.status, code(&r)),
        (400, "SignatureDoesNotMatch".into()),
        "{}",
        r.body
    );
    let r = describe(fake.ecs, (id, secret, "not-the-token"), &date, &nonce(4));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(code(&r).starts_with("InvalidSecurityToken."), "{}", r.body);
    let r = describe(fake.ecs, ("STS.NotIssued", secret, sts), &date, &nonce(5));
    assert_eq!(
        (r.status, code(&r)),
        (404, "InvalidAccessKeyId.NotFound".into()),
        "{}",
        r.body
    );
    // A fresh nonce with the right key still passes: the refusals were of what they name.
    let r = describe(fake.ecs, good, &date, &nonce(6));
    assert_eq!(r.status, 200, "{}", r.body);
    let error = describe(fake.ecs, good, &date, &nonce(6)).json();
    for field in ["RequestId", "HostId", "Code", "Message", "Recommend"] {
        assert!(error[field].is_string(), "{field}: {error}");
    }
}

/// `RAM_ACTIONS` names every ECS action the code calls, and `config/alibaba-ram-policy.json`
/// grants exactly their RAM actions: no more, no fewer.
#[test]
fn the_shipped_policy_grants_exactly_the_calls_the_code_makes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut called = Vec::new();
    let mut dirs = vec![root.join("src/cloud/alibaba")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(path).unwrap();
            let squeezed: String = source.split_whitespace().collect();
            called.extend(
                squeezed
                    .split(".call(\"")
                    .skip(1)
                    .filter_map(|rest| rest.split('"').next())
                    .map(str::to_string),
            );
        }
    }
    called.sort();
    called.dedup();
    assert!(
        !called.is_empty(),
        "no .call(\"Action\" in src/cloud/alibaba"
    );
    let table = gpuwatch::cloud::alibaba::ecs::RAM_ACTIONS;
    let mut listed: Vec<String> = table.iter().map(|(a, _)| a.to_string()).collect();
    listed.sort();
    assert_eq!(
        called, listed,
        "RAM_ACTIONS drifted from the calls in src/cloud/alibaba"
    );
    for (action, ram) in table {
        assert_eq!(*ram, format!("ecs:{action}"), "RAM_ACTIONS");
    }
    let policy: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("config/alibaba-ram-policy.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(policy["Version"], "1");
    let mut granted: Vec<String> = Vec::new();
    for statement in policy["Statement"].as_array().unwrap() {
        assert_eq!(statement["Effect"], "Allow", "{statement}");
        match &statement["Action"] {
            Value::String(a) => granted.push(a.clone()),
            Value::Array(list) => {
                granted.extend(list.iter().map(|a| a.as_str().unwrap().to_string()))
            }
            other => panic!("Action is {other}"),
        }
    }
    granted.sort();
    granted.dedup();
    let mut needed: Vec<String> = table.iter().map(|(_, r)| r.to_string()).collect();
    needed.sort();
    assert_eq!(
        granted, needed,
        "config/alibaba-ram-policy.json drifted from RAM_ACTIONS"
    );
}
