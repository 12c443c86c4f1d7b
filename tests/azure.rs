//! Idle rules acting on Azure VMs, end to end: the daemon over fake GPUs, against a fake
//! Instance Metadata Service, Resource Manager and Retail Prices API written from Microsoft's
//! documents and REST API specifications (`tests/azure/fake_azure.py`). The fake checks the
//! `Metadata: true` header and the managed identity's bearer token as Azure does.

mod common;

use std::time::Duration;

use common::aws::actions;
use common::azure::{Fake, VM};
use common::fake::{api_calls, rule, start, start_in, BUSY, IDLE};
use common::{events, metric, secs, Daemon};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn an_idle_vm_is_tagged_then_deallocated_once_its_operation_followed_to_the_end() {
    let fake = Fake::start();
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_node_info")
        .label("provider", "azure")
        .label("instance_id", "02aab8a4-74ef-476e-8182-f6d2ba4166a6")
        .label("instance_type", "Standard_NC24ads_A100_v4")
        .label("availability_zone", "1")
        .label("lifecycle", "on-demand")
        .value(1.0)
        .assert_in(&s);
    // The operation was followed until Azure said it ended: the VM is deallocated now, and
    // was deallocated once, never powered off (a powered-off VM keeps billing).
    let state = fake.state();
    assert_eq!(state["power"], "deallocated");
    assert_eq!(
        fake.mutations(),
        [
            format!("PATCH {VM}/providers/Microsoft.Resources/tags/default"),
            format!("POST {VM}/deallocate"),
        ]
    );
    let arm = fake.calls("arm");
    let deallocate = arm.iter().find(|c| c["method"] == "POST").unwrap();
    assert_eq!(deallocate["content_length"], "0");
    assert!(
        deallocate["query"].get("hibernate").is_none(),
        "{deallocate}"
    );
    let op = deallocate["operation_id"].as_str().unwrap();
    let reads = arm
        .iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with(op))
        .count();
    assert!(reads >= 2, "the operation's status was read {reads} times");
    // The tags were merged: the VM's own stay.
    let tags = &state["vm_tags"];
    assert_eq!(tags["team"], "ml");
    assert_eq!(tags["gpuwatch:action"], "stop");
    assert_eq!(tags["gpuwatch:rule"], "idle");
    let patch = arm.iter().find(|c| c["method"] == "PATCH").unwrap();
    let body: serde_json::Value = serde_json::from_str(patch["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["operation"], "Merge");
    assert_eq!(
        api_calls(&d),
        ["Tags_UpdateAtScope", "VirtualMachines_Deallocate"]
    );
    let audit = d.audit();
    let call = events(&audit, "api_call")[1];
    assert_eq!(call["request_id"], op);
    // Every metadata request said `Metadata: true` (the fake refuses any that does not), and
    // every ARM call carried a token the fake's IMDS issued (it refuses any other).
    assert!(fake.calls("imds").iter().all(|c| c["metadata"] == "true"));
    assert!(!d.log().contains("eyJ0eXAiOiJKV1Qi"), "a token was logged");
    // The Retail price of the VM's size in its region, the Linux pay-as-you-go meter.
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_instance_hourly_cost_dollars")
            .label("source", "pricing_api")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_instance_hourly_cost_dollars")
        .label("source", "pricing_api")
        .value(3.673)
        .assert_in(&s);
    let asked = &fake.calls("prices")[0]["query"];
    assert_eq!(asked["currencyCode"], "'USD'");
    assert!(asked["$filter"]
        .as_str()
        .unwrap()
        .contains("armSkuName eq 'Standard_NC24ads_A100_v4'"));
}

#[test]
fn busy_gpus_and_dry_run_call_nothing() {
    let fake = Fake::start();
    let d = start(&fake, "dry-run", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "dry_run") == 1.0);
    let result = events(&d.audit(), "action_result")[0].clone();
    assert_eq!(
        result["detail"], "would VirtualMachines_Deallocate",
        "{result}"
    );
    drop(d);
    let d = start(&fake, "enforce", "stop", "", BUSY);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert_eq!(fake.mutations(), Vec::<String>::new());
    assert_eq!(fake.state()["power"], "running");
}

#[test]
fn a_preempt_event_for_this_vm_blocks_the_action_and_runs_the_hook_once() {
    let fake = Fake::start();
    let not_before = "Mon, 11 Apr 2033 22:26:58 GMT";
    fake.set(json!({"compute": spot_compute(), "events": [
        {"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "EventStatus": "Scheduled",
         "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": ["gpu-vm-1"],
         "NotBefore": not_before, "Description": "Virtual machine is being paused.",
         "EventSource": "Platform", "DurationInSeconds": 5},
        {"EventId": "A1B2C3D4-0000-4000-8000-000000000001", "EventStatus": "Scheduled",
         "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["gpu-vm-1"],
         "NotBefore": not_before, "Description": "The Spot VM is being evicted.",
         "EventSource": "Platform", "DurationInSeconds": -1},
    ]}));
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
        .value(secs(&json!("2033-04-11T22:26:58Z")))
        .assert_in(&s);
    d.await_sample(LIMIT, |_| marker.exists());
    d.await_time(gpuwatch::time::now() + 4.0);
    let audit = d.audit();
    assert_eq!(events(&audit, "interruption_hook").len(), 1);
    assert_eq!(events(&audit, "interruption_hook")[0]["result"], "done");
    assert!(events(&audit, "action_attempt").is_empty(), "{audit:?}");
    // The Freeze is said and audited, and blocks nothing by itself.
    assert_eq!(events(&audit, "scheduled_event")[0]["event_type"], "Freeze");
    assert_eq!(fake.mutations(), Vec::<String>::new());

    // The eviction is over (it named another VM all along, say): the action follows.
    fake.set(json!({"events": [
        {"EventId": "A1B2C3D4-0000-4000-8000-000000000002", "EventStatus": "Scheduled",
         "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["gpu-vm-2"],
         "NotBefore": not_before, "Description": "", "EventSource": "Platform", "DurationInSeconds": -1},
    ]}));
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "done") == 1.0);
    let deleted = fake.state();
    assert_eq!(deleted["deleted"], true);
    let delete = fake
        .calls("arm")
        .into_iter()
        .find(|c| c["method"] == "DELETE")
        .unwrap();
    assert_eq!(delete["query"]["forceDeletion"], "false", "{delete}");
    assert_eq!(
        api_calls(&d),
        ["Tags_UpdateAtScope", "VirtualMachines_Delete"]
    );
}

fn spot_compute() -> serde_json::Value {
    let mut c = Fake::start_state_compute();
    c["priority"] = json!("Spot");
    c["evictionPolicy"] = json!("Deallocate");
    c
}

#[test]
fn a_hold_tag_holds_until_it_expires() {
    let fake = Fake::start();
    let mut c = Fake::start_state_compute();
    c["tagsList"] = json!([{"name": "gpuwatch:hold", "value": "after lunch"}]);
    fake.set(json!({"compute": c}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .value(f64::INFINITY)
        .assert_in(&d.scrape());
    let until = gpuwatch::time::now().ceil() + 3.0;
    c["tagsList"] = json!([{"name": "gpuwatch:hold", "value": gpuwatch::time::rfc3339(until)}]);
    fake.set(json!({"compute": c}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert!(secs(&events(&d.audit(), "action_attempt")[0]["time"]) >= until);
}

#[test]
fn metadata_down_at_start_holds_every_action_and_acts_once_it_answers() {
    let fake = Fake::start();
    fake.set(json!({"imds_down": true}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_log(LIMIT, "instance metadata is unavailable");
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert!(fake.calls("arm").is_empty());
    fake.set(json!({"imds_down": false}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(fake.state()["power"], "deallocated");
}

#[test]
fn a_denied_call_fails_the_action_naming_the_permission() {
    let fake = Fake::start();
    fake.set(json!({"denied": ["Microsoft.Compute/virtualMachines/deallocate/action"]}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    let audit = d.audit();
    let error = events(&audit, "api_error")[0];
    assert_eq!(error["operation"], "VirtualMachines_Deallocate");
    let said = error["error"].as_str().unwrap();
    assert!(said.starts_with("AuthorizationFailed (HTTP 403)"), "{said}");
    assert!(
        said.contains("needs Microsoft.Compute/virtualMachines/deallocate/action"),
        "{said}"
    );
    let result = events(&audit, "action_result")[0];
    assert_eq!(result["result"], "failed");
    assert!(result["detail"]
        .as_str()
        .unwrap()
        .contains("Microsoft.Compute/virtualMachines/deallocate/action"));
    assert!(d
        .log()
        .contains("assign the role in config/azure-role.json"));
    assert_eq!(fake.state()["power"], "running");
}

#[test]
fn throttling_is_retried_and_a_failed_operation_is_a_failed_action() {
    let fake = Fake::start();
    fake.set(json!({"throttle": {"deallocate": 1}, "op_outcome": "Failed"}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    let posts = fake
        .calls("arm")
        .iter()
        .filter(|c| c["method"] == "POST")
        .count();
    assert_eq!(posts, 2, "one throttled, one accepted");
    let audit = d.audit();
    let error = events(&audit, "api_error")[0];
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("the operation ended Failed: InternalExecutionError"),
        "{error}"
    );
}

#[test]
fn spot_hibernation_and_scale_set_instances_are_refused_with_their_reason() {
    let fake = Fake::start();
    fake.set(json!({"compute": spot_compute()}));
    let d = start(&fake, "enforce", "hibernate", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "hibernate", "refused") == 1.0);
    let detail = events(&d.audit(), "action_result")[0]["detail"].clone();
    assert!(
        detail
            .as_str()
            .unwrap()
            .contains("does not hibernate Spot VMs"),
        "{detail}"
    );
    drop(d);
    let mut c = Fake::start_state_compute();
    c["vmScaleSetName"] = json!("gpu-pool");
    fake.set(json!({"compute": c}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "refused") == 1.0);
    let detail = events(&d.audit(), "action_result")[0]["detail"].clone();
    assert!(
        detail.as_str().unwrap().contains("scale set \"gpu-pool\""),
        "{detail}"
    );
    assert_eq!(fake.mutations(), Vec::<String>::new());
}

#[test]
fn an_identity_the_vm_lacks_fails_the_action_and_no_token_is_shown() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let config = fake
        .config(
            dir.path(),
            "mode = \"enforce\"\nwarning = \"1s\"",
            &rule("idle", "stop"),
        )
        .replace(
            "poll_interval = \"200ms\"",
            "poll_interval = \"200ms\"\nclient_id = \"be5947ed-0000-4000-8000-000000000000\"",
        );
    let d = Daemon::start_scenario(dir, IDLE, &config);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    let token = fake
        .calls("imds")
        .into_iter()
        .rfind(|c| c["path"] == "/metadata/identity/oauth2/token")
        .unwrap();
    assert_eq!(
        token["query"]["client_id"],
        "be5947ed-0000-4000-8000-000000000000"
    );
    let result = events(&d.audit(), "action_result")[0].clone();
    assert!(
        result["detail"]
            .as_str()
            .unwrap()
            .contains("invalid_request: Identity not found"),
        "{result}"
    );
    // Tokens were issued to the system-assigned identity's asks only: none here, and none in
    // the log, the audit log or an error.
    assert!(fake.state()["tokens"].as_object().unwrap().is_empty());
    assert!(!d.log().contains("eyJ0eXAiOiJKV1Qi"));
    assert!(
        !std::fs::read_to_string(d.dir.path().join("state/audit.jsonl"))
            .unwrap()
            .contains("eyJ0eXAiOiJKV1Qi")
    );
}

/// `AZURE_ACTIONS` names every Resource Manager operation the code calls, and
/// `config/azure-role.json` grants exactly their permissions: no more, no fewer.
#[test]
fn the_shipped_role_grants_exactly_the_calls_the_code_makes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut called = Vec::new();
    for entry in std::fs::read_dir(root.join("src/cloud/azure")).unwrap() {
        let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let squeezed: String = source.split_whitespace().collect();
        for call in [".send(\"", ".act(\""] {
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
    let table = gpuwatch::cloud::azure::arm::AZURE_ACTIONS;
    let mut listed: Vec<String> = table.iter().map(|(op, _)| op.to_string()).collect();
    listed.sort();
    assert_eq!(
        called, listed,
        "AZURE_ACTIONS drifted from the calls in src/cloud/azure"
    );
    let role: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("config/azure-role.json")).unwrap(),
    )
    .unwrap();
    let mut granted: Vec<&str> = role["Actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    granted.sort();
    let mut needed: Vec<&str> = table.iter().map(|(_, p)| *p).collect();
    needed.sort();
    assert_eq!(
        granted, needed,
        "config/azure-role.json drifted from AZURE_ACTIONS"
    );
    assert_eq!(role["IsCustom"], true);
    for key in ["NotActions", "DataActions", "NotDataActions"] {
        assert_eq!(role[key], serde_json::json!([]), "{key}");
    }
}

#[test]
fn the_budget_gate_opens_on_a_consumption_budget_s_spend_and_never_on_an_unknown_one() {
    let fake = Fake::start();
    let scope = "/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/gpu-rg";
    fake.set(json!({
        "denied": ["Microsoft.Consumption/budgets/read"],
        "budgets": {format!("{}/team", scope.to_lowercase()): {
            "category": "Cost", "amount": 100.0, "timeGrain": "Monthly",
            "timePeriod": {"startDate": "2026-01-01T00:00:00Z", "endDate": "2030-12-31T00:00:00Z"},
            "currentSpend": {"amount": 150.0, "unit": "USD"},
            "forecastSpend": {"amount": 180.0, "unit": "USD"}}},
    }));
    let dir = tempfile::tempdir().unwrap();
    let budget = format!(
        "[[budgets]]\nname = \"team\"\nsource = \"azure_budgets\"\nscope = \"{scope}\"\npoll_interval = \"1s\"\n"
    );
    let gated =
        "[[rules]]\nname = \"over\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"stop\"\n\
         budget = { name = \"team\", spent_at_least = 1.0 }\n";
    let config = fake.config(
        dir.path(),
        "mode = \"enforce\"\nwarning = \"1s\"",
        &format!("{budget}\n{gated}"),
    );
    let d = Daemon::start_scenario(dir, IDLE, &config);
    // Denied: the spend is unknown, and unknown opens no gate.
    d.await_log(LIMIT, "cannot read the Azure budget");
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert!(metric("gpuwatch_budget_spent_ratio")
        .label("budget", "team")
        .get(&d.scrape())
        .is_none());
    let get = fake
        .calls("arm")
        .into_iter()
        .find(|c| {
            c["path"]
                .as_str()
                .unwrap()
                .contains("Microsoft.Consumption")
        })
        .unwrap();
    assert_eq!(
        get["path"],
        format!("{scope}/providers/Microsoft.Consumption/budgets/team")
    );
    // Readable, and over: the gate opens and the VM is deallocated.
    fake.set(json!({"denied": []}));
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_budget_spent_ratio")
        .label("budget", "team")
        .value(1.5)
        .assert_in(&s);
    assert_eq!(fake.state()["power"], "deallocated");
}

#[test]
fn an_identity_that_fails_at_first_holds_the_action_until_it_answers() {
    let fake = Fake::start();
    fake.set(json!({"token_down": true}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    // The action is decided, and waits on its first call: no token, no call.
    d.await_log(LIMIT, "no managed identity token");
    assert!(fake.calls("arm").is_empty());
    assert_eq!(fake.state()["power"], "running");
    fake.set(json!({"token_down": false}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(
        fake.mutations(),
        [
            format!("PATCH {VM}/providers/Microsoft.Resources/tags/default"),
            format!("POST {VM}/deallocate"),
        ]
    );
}

#[test]
fn an_operation_with_a_location_alone_is_followed_to_its_end() {
    let fake = Fake::start();
    fake.set(json!({"location_only": true, "op_polls": 3}));
    let d = start(&fake, "enforce", "terminate", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "terminate", "done") == 1.0);
    let state = fake.state();
    assert_eq!(state["deleted"], true);
    let monitors = fake
        .calls("arm")
        .iter()
        .filter(|c| c["query"]["monitor"] == "true")
        .count();
    assert!(monitors >= 3, "the Location URL was read {monitors} times");
}

#[test]
fn a_mixed_case_hold_tag_holds_as_azure_reads_tag_names() {
    let fake = Fake::start();
    let mut c = Fake::start_state_compute();
    let until = gpuwatch::time::now().ceil() + 4.0;
    c["tagsList"] = json!([{"name": "GPUWatch:Hold", "value": gpuwatch::time::rfc3339(until)}]);
    fake.set(json!({"compute": c}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert!(secs(&events(&d.audit(), "action_attempt")[0]["time"]) >= until);
}

#[test]
fn scheduled_events_that_never_answer_hold_every_action() {
    let fake = Fake::start();
    fake.set(json!({"events_down": true}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 5.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    metric("gpuwatch_hold_until_timestamp_seconds")
        .label("source", "tag")
        .value(f64::INFINITY)
        .assert_in(&d.scrape());
    fake.set(json!({"events_down": false}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
}
