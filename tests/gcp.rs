//! Idle rules acting on Compute Engine VMs, end to end: the daemon over fake GPUs, against a
//! fake metadata server and Compute Engine API written from Google's documents and the API's
//! discovery document (`tests/gcp/fake_gcp.py`). The fake checks `Metadata-Flavor: Google` and
//! the service account's bearer token as Google does.

mod common;

use std::time::Duration;

use common::aws::actions;
use common::fake::{api_calls, assert_done_without_the_stamp, rule, start, start_in, BUSY, IDLE};
use common::gcp::{Fake, VM};
use common::{events, metric, secs, Daemon};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn an_idle_vm_is_labelled_then_stopped_once_its_operation_followed_to_done() {
    let fake = Fake::start();
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_node_info")
        .label("provider", "gcp")
        .label("instance_id", "4567890123456789012")
        .label("instance_type", "a2-highgpu-1g")
        .label("availability_zone", "us-central1-a")
        .label("lifecycle", "on-demand")
        .value(1.0)
        .assert_in(&s);
    let state = fake.state();
    assert_eq!(state["status"], "TERMINATED");
    assert_eq!(
        fake.mutations(),
        [format!("POST {VM}/setLabels"), format!("POST {VM}/stop")]
    );
    let calls = fake.calls("compute");
    let stop = calls
        .iter()
        .find(|c| c["path"].as_str().unwrap().ends_with("/stop"))
        .unwrap();
    assert_eq!(stop["query"]["discardLocalSsd"], "false");
    let op = stop["operation"].as_str().unwrap();
    let reads = calls
        .iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with(op))
        .count();
    assert!(reads >= 2, "the operation was read {reads} times");
    // The labels were set with the fingerprint read, the VM's own kept, values as GCP takes them.
    assert_eq!(state["labels"]["team"], "ml");
    assert_eq!(state["labels"]["gpuwatch-action"], "stop");
    assert_eq!(state["labels"]["gpuwatch-rule"], "idle_2h");
    assert_eq!(api_calls(&d), ["instances.setLabels", "instances.stop"]);
    assert_eq!(events(&d.audit(), "api_call")[1]["request_id"], op);
    assert!(fake
        .calls("metadata")
        .iter()
        .all(|c| c["flavor"] == "Google"));
    assert!(!d.log().contains("ya29."), "a token was logged");
    // The table's price of the machine type in its region.
    common::assert_price(&d, "table", 3.67339);
}

#[test]
fn busy_gpus_and_dry_run_call_nothing() {
    let fake = Fake::start();
    let d = start(&fake, "dry-run", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "dry_run") == 1.0);
    assert_eq!(
        events(&d.audit(), "action_result")[0]["detail"],
        "would instances.stop"
    );
    drop(d);
    let d = start(&fake, "enforce", "stop", "", BUSY);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert_eq!(fake.mutations(), Vec::<String>::new());
}

#[test]
fn preemption_and_maintenance_block_the_action_and_run_the_hook_once() {
    for (change, key) in [
        (
            json!({"preempted": "TRUE", "provisioning_model": "SPOT"}),
            "preempted",
        ),
        (
            json!({"maintenance_event": "TERMINATE_ON_HOST_MAINTENANCE"}),
            "maintenance",
        ),
    ] {
        let fake = Fake::start();
        fake.set(change);
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("hook-ran");
        let extra = format!(
            "[spot]\ninterruption_hook = [\"touch\", \"{}\"]\nhook_timeout = \"5s\"",
            marker.display()
        );
        let d = start_in(dir, &fake, "enforce", "stop", &extra, IDLE);
        d.await_scrape(LIMIT, |s| {
            metric("gpuwatch_spot_interruption_pending").get(s) == Some(1.0)
        });
        d.await_sample(LIMIT, |_| marker.exists());
        d.await_time(gpuwatch::time::now() + 4.0);
        let audit = d.audit();
        assert_eq!(events(&audit, "interruption_hook").len(), 1, "{key}");
        assert!(
            events(&audit, "action_attempt").is_empty(),
            "{key}: {audit:?}"
        );
        assert_eq!(fake.mutations(), Vec::<String>::new(), "{key}");
        // Over: the action follows.
        fake.set(json!({"preempted": "FALSE", "maintenance_event": "NONE"}));
        d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    }
}

#[test]
fn a_hold_attribute_holds_until_it_expires() {
    let fake = Fake::start();
    fake.set(json!({"attributes": {"gpuwatch-hold": "after lunch"}}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .value(f64::INFINITY)
        .assert_in(&d.scrape());
    let until = gpuwatch::time::now().ceil() + 3.0;
    fake.set(json!({"attributes": {"gpuwatch-hold": gpuwatch::time::rfc3339(until)}}));
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
    assert!(fake.calls("compute").is_empty());
    fake.set(json!({"metadata_down": false}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(fake.state()["status"], "TERMINATED");
}

#[test]
fn an_insufficient_scope_is_a_failed_action_naming_the_scope() {
    let fake = Fake::start();
    fake.set(json!({"scopes_ok": false}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    let audit = d.audit();
    let error = events(&audit, "api_error")[0];
    let said = error["error"].as_str().unwrap();
    assert!(
        said.contains("insufficient authentication scopes"),
        "{said}"
    );
    assert!(said.contains("--scopes=compute-rw"), "{said}");
    let result = events(&audit, "action_result")[0];
    assert!(result["detail"].as_str().unwrap().contains("access scopes"));
    assert_eq!(fake.state()["status"], "RUNNING");
}

#[test]
fn a_missing_permission_names_it_and_terminate_deletes() {
    let fake = Fake::start();
    fake.set(json!({"denied": ["compute.instances.delete"]}));
    let d = start(&fake, "enforce", "terminate", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "failed") == 1.0);
    let audit = d.audit();
    let said = events(&audit, "api_error")[0]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        said.contains("Required 'compute.instances.delete' permission"),
        "{said}"
    );
    assert!(said.contains("needs compute.instances.delete"), "{said}");
    drop(d);
    let fake = Fake::start();
    let d = start(&fake, "enforce", "terminate", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "done") == 1.0);
    assert_eq!(fake.state()["deleted"], true);
    assert_eq!(api_calls(&d), ["instances.setLabels", "instances.delete"]);
}

#[test]
fn a_stale_fingerprint_is_read_again_and_local_ssd_data_is_kept_by_default() {
    let fake = Fake::start();
    // Another writer changes the labels between gpuwatch's read and its write, once.
    fake.set(json!({"local_ssd": true, "stale_once": true}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let stop = fake
        .calls("compute")
        .into_iter()
        .find(|c| c["path"].as_str().unwrap().ends_with("/stop"))
        .unwrap();
    assert_eq!(stop["query"]["discardLocalSsd"], "false");
    let labels = fake
        .calls("compute")
        .iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with("/setLabels"))
        .count();
    assert_eq!(labels, 2, "the stale fingerprint was read again, once");
    assert_eq!(fake.state()["labels"]["gpuwatch-action"], "stop");
    drop(d);
    let fake = Fake::start();
    fake.set(json!({"local_ssd": true}));
    let dir = tempfile::tempdir().unwrap();
    let config = fake.config(
        dir.path(),
        "mode = \"enforce\"\nwarning = \"1s\"",
        &rule("Idle 2h", "stop"),
    ) + "\n[cloud.gcp]\nlocal_ssd = \"discard\"\n";
    let d = Daemon::start_scenario(dir, IDLE, &config);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(
        api_calls(&d),
        [
            "instances.setLabels",
            "instances.stop (discarding local SSD data)"
        ]
    );
}

#[test]
fn a_failed_operation_is_a_failed_action_with_its_errors() {
    let fake = Fake::start();
    // Throttled the other way Google answers: 429 RESOURCE_EXHAUSTED.
    fake.set(json!({"op_error": {"code": "RESOURCE_NOT_READY", "message": "The resource is not ready"}, "throttle": {"stop": 1}, "throttle_status": 429}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    let said = events(&d.audit(), "api_error")[0]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        said.contains("RESOURCE_NOT_READY: The resource is not ready"),
        "{said}"
    );
    let stops = fake
        .calls("compute")
        .iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with("/stop"))
        .count();
    assert_eq!(stops, 2, "one throttled, one accepted");
}

/// The calls to the VM's `suffix` (`/stop`), and how many of them Compute Engine accepted.
fn calls_to(fake: &Fake, suffix: &str) -> (usize, usize) {
    let calls: Vec<_> = fake
        .calls("compute")
        .into_iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with(suffix))
        .collect();
    let accepted = calls.iter().filter(|c| c["operation"].is_string()).count();
    (calls.len(), accepted)
}

#[test]
fn a_stop_throttled_with_403_is_retried_and_done_once_without_a_permission_hint() {
    let fake = Fake::start();
    // Compute Engine says a spent rate quota with 403 rateLimitExceeded, twice.
    fake.set(json!({"throttle": {"stop": 2}}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(calls_to(&fake, "/stop"), (3, 1), "stopped once");
    assert_eq!(fake.state()["status"], "TERMINATED");
    assert_eq!(api_calls(&d), ["instances.setLabels", "instances.stop"]);
    assert!(events(&d.audit(), "api_error").is_empty());
    let log = d.log();
    assert!(log.contains("rateLimitExceeded (HTTP 403)"), "{log}");
    assert!(!log.contains("needs compute."), "{log}");
    assert!(!log.contains("grant the role"), "{log}");
}

#[test]
fn operation_reads_throttled_with_403_are_read_again_and_the_action_is_done() {
    let fake = Fake::start();
    fake.set(json!({"throttle": {"operation": 3}}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let state = fake.state();
    assert_eq!(
        state["throttle"]["operation"], 0,
        "every throttled read was read again"
    );
    assert_eq!(state["status"], "TERMINATED");
    assert_eq!(calls_to(&fake, "/stop"), (1, 1));
    assert!(events(&d.audit(), "api_error").is_empty());
    assert_eq!(api_calls(&d), ["instances.setLabels", "instances.stop"]);
}

/// A role bound on the VM cannot grant `compute.zoneOperations.get`: the instance is read until
/// it shows what the operation did (stopped; gone for a delete).
#[test]
fn a_denied_operation_read_is_followed_on_the_instance() {
    for (action, done) in [("stop", "TERMINATED"), ("terminate", "deleted")] {
        let fake = Fake::start();
        fake.set(json!({"denied": ["compute.zoneOperations.get"], "op_seconds": 3}));
        let d = start(&fake, "enforce", action, "", IDLE);
        d.await_scrape(LIMIT, |s| actions(s, action, "done") == 1.0);
        let state = fake.state();
        if done == "deleted" {
            assert_eq!(state["deleted"], true);
        } else {
            assert_eq!(state["status"], done);
        }
        let audit = d.audit();
        assert!(events(&audit, "api_error").is_empty(), "{audit:?}");
        let calls = events(&audit, "api_call");
        assert_eq!(calls.len(), 2, "{audit:?}");
        assert!(calls[1]["request_id"]
            .as_str()
            .unwrap()
            .starts_with("operation-"));
        d.await_log(
            LIMIT,
            "grant compute.zoneOperations.get on the project (config/gcp-operations-role.yaml)",
        );
    }
}

/// An N1 VM's price counts the GPUs `instances.get` says are attached: a read throttled at start
/// is read again (backing off) until it answers, never leaving the price unknown for good.
#[test]
fn an_n1_vm_s_attached_gpus_are_read_again_until_they_answer() {
    let fake = Fake::start();
    fake.set(json!({
        "machine_type": "n1-standard-8",
        "accelerators": [{"type": "nvidia-tesla-t4", "count": 2}],
        "throttle": {"get": 4},
        "throttle_status": 429,
    }));
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    // n1-standard-8 and two T4s in us-central1.
    common::assert_price(&d, "table", 0.38 + 2.0 * 0.35);
    d.await_log(LIMIT, "cannot read the VM's attached GPUs");
}

/// A Spot VM's price comes from the table's Spot column, and the log says the date that column
/// is as of: Compute Engine changes Spot prices up to monthly.
#[test]
fn a_spot_vm_is_priced_from_the_table_and_the_log_says_as_of_when() {
    let fake = Fake::start();
    fake.set(json!({"provisioning_model": "SPOT"}));
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    common::assert_price(&d, "spot", 1.80385);
    let date = gpuwatch::cloud::gcp::prices::as_of("spot");
    d.await_log(
        LIMIT,
        &format!("Spot price from the built-in Compute Engine table, as of {date}"),
    );
}

/// A VM may have 64 labels: with 63, the stamp's two are refused, and the action goes on.
#[test]
fn a_vm_with_a_full_label_set_is_stopped_without_the_stamp() {
    let fake = Fake::start();
    let labels: serde_json::Map<String, serde_json::Value> = (0..63)
        .map(|i| (format!("label-{i}"), json!("x")))
        .collect();
    fake.set(json!({ "labels": labels }));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let audit = assert_done_without_the_stamp(
        &d,
        "stop",
        "instances.setLabels",
        "Invalid value for field 'labels'",
    );
    let said = events(&audit, "stamp_refused")[0]["error"].to_string();
    assert!(said.contains("would have 65, more than the 64"), "{said}");
    let state = fake.state();
    assert_eq!(state["status"], "TERMINATED");
    assert_eq!(state["labels"].as_object().unwrap().len(), 63);
    assert_eq!(api_calls(&d), ["instances.stop"]);
    assert!(events(&audit, "api_error").is_empty());
}

/// `GCP_PERMISSIONS` names every Compute Engine method the code calls, and the roles in
/// `config/` grant exactly their permissions, each where it works: the VM's on the VM
/// (`gcp-role.yaml`), an operation's on the project (`gcp-operations-role.yaml`).
#[test]
fn the_shipped_role_grants_exactly_the_calls_the_code_makes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut called = Vec::new();
    for entry in std::fs::read_dir(root.join("src/cloud/gcp")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(path).unwrap();
        let squeezed: String = source.split_whitespace().collect();
        for call in [".act(\"", ".send(\"", ".read(\"", "letmethod=\""] {
            called.extend(
                squeezed
                    .split(call)
                    .skip(1)
                    .filter_map(|rest| rest.split('"').next())
                    .map(str::to_string),
            );
        }
    }
    called.sort();
    called.dedup();
    let table = gpuwatch::cloud::gcp::compute::GCP_PERMISSIONS;
    let mut listed: Vec<String> = table.iter().map(|(m, _)| m.to_string()).collect();
    listed.sort();
    assert_eq!(
        called, listed,
        "GCP_PERMISSIONS drifted from the calls in src/cloud/gcp"
    );
    // Each role grants exactly the permissions that work where it is bound.
    let mut granted_all: Vec<String> = Vec::new();
    for file in ["config/gcp-role.yaml", "config/gcp-operations-role.yaml"] {
        let role = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(role.contains("includedPermissions:"), "{file}: {role}");
        let mut granted: Vec<&str> = role
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- "))
            .collect();
        granted.sort();
        let mut needed: Vec<&str> = table
            .iter()
            .map(|(_, p)| *p)
            .filter(|p| gpuwatch::cloud::gcp::compute::role_file(p) == file)
            .collect();
        needed.sort();
        assert_eq!(granted, needed, "{file} drifted from GCP_PERMISSIONS");
        granted_all.extend(granted.iter().map(|g| g.to_string()));
    }
    granted_all.sort();
    let mut needed: Vec<String> = table.iter().map(|(_, p)| p.to_string()).collect();
    needed.sort();
    assert_eq!(
        granted_all, needed,
        "the roles drifted from GCP_PERMISSIONS"
    );
}

#[test]
fn tag_labels_are_the_vm_s_labels() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let config = fake.config(dir.path(), "mode = \"dry-run\"", "").replace(
        "provider = \"gcp\"",
        "provider = \"gcp\"\ntag_labels = [\"team\"]",
    );
    let d = Daemon::start_scenario(dir, IDLE, &config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_node_info").label("team", "ml").get(s) == Some(1.0)
    });
    metric("gpuwatch_node_info")
        .label("provider", "gcp")
        .label("team", "ml")
        .value(1.0)
        .assert_in(&s);
}
