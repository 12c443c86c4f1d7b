//! Idle rules acting on Azure VMs, end to end: the daemon over fake GPUs, against a fake
//! Instance Metadata Service, Resource Manager and Retail Prices API written from Microsoft's
//! documents and REST API specifications (`tests/azure/fake_azure.py`). The fake checks the
//! `Metadata: true` header and the managed identity's bearer token as Azure does.

mod common;

use std::time::Duration;

use common::aws::actions;
use common::azure::{Fake, VM};
use common::fake::{api_calls, assert_done_without_the_stamp, rule, start, start_in, BUSY, IDLE};
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
    // Done once the VM said it was deallocated: its instance view was read after the operation.
    let last_get = arm
        .iter()
        .rposition(|c| c["query"]["$expand"] == "instanceView");
    let post = arm.iter().position(|c| c["method"] == "POST");
    assert!(last_get > post, "{arm:?}");
    // Every metadata request said `Metadata: true` (the fake refuses any that does not), and
    // every ARM call carried a token the fake's IMDS issued for the ARM's own origin, the
    // audience the endpoint says (the fake refuses any other).
    assert!(fake.calls("imds").iter().all(|c| c["metadata"] == "true"));
    let token = fake
        .calls("imds")
        .into_iter()
        .find(|c| c["path"] == "/metadata/identity/oauth2/token")
        .unwrap();
    assert_eq!(token["query"]["resource"], format!("http://{}/", fake.arm));
    assert!(!d.log().contains("eyJ0eXAiOiJKV1Qi"), "a token was logged");
    // The Retail price of the VM's size in its region, the Linux pay-as-you-go meter.
    common::assert_price(&d, "pricing_api", 3.673);
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
    assert!(d.log().contains(
        "assign the role in config/azure-role.json to the VM's managed identity at the VM's scope"
    ));
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
    let config = fake.config(
        dir.path(),
        "mode = \"enforce\"\nwarning = \"1s\"",
        &rule("idle", "stop"),
    ) + "\n[cloud.azure]\nclient_id = \"be5947ed-0000-4000-8000-000000000000\"\n";
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

/// `AZURE_ACTIONS` names every Resource Manager operation the code calls, and the roles in
/// `config/` grant exactly their permissions, each at the scope where it works
/// (`azure-role.json` at the VM's, `azure-operations-role.json` at the subscription's,
/// `azure-budgets-role.json` at a budget's): no more, no fewer.
#[test]
fn the_shipped_roles_grant_exactly_the_calls_the_code_makes_where_they_work() {
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
    use gpuwatch::cloud::azure::arm::{Scope, AZURE_ACTIONS};
    let mut listed: Vec<String> = AZURE_ACTIONS
        .iter()
        .map(|(op, _, _)| op.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        called, listed,
        "AZURE_ACTIONS drifted from the calls in src/cloud/azure"
    );
    let mut files = Vec::new();
    for scope in [Scope::Vm, Scope::Subscription, Scope::Budget] {
        let file = scope.role_file();
        files.push(file.trim_start_matches("config/").to_string());
        let role: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(file)).unwrap()).unwrap();
        let mut granted: Vec<&str> = role["Actions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        granted.sort();
        let mut needed: Vec<&str> = AZURE_ACTIONS
            .iter()
            .filter(|(_, _, s)| *s == scope)
            .map(|(_, p, _)| *p)
            .collect();
        needed.sort();
        assert!(!needed.is_empty(), "{scope:?}");
        assert_eq!(granted, needed, "{file} drifted from AZURE_ACTIONS");
        assert_eq!(role["IsCustom"], true, "{file}");
        for key in ["NotActions", "DataActions", "NotDataActions"] {
            assert_eq!(role[key], serde_json::json!([]), "{file}: {key}");
        }
    }
    // No other Azure role is shipped.
    let mut shipped: Vec<String> = std::fs::read_dir(root.join("config"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("azure") && n.ends_with(".json"))
        .collect();
    shipped.sort();
    files.sort();
    assert_eq!(shipped, files);
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

/// A Scheduled Events read that hangs leaves no answer in force: once one "no events" answer
/// has come, reads that hang hold every action (a Spot eviction may be posted meanwhile), as
/// unknown, until the events answer again.
#[test]
fn scheduled_events_that_hang_after_an_answer_hold_every_action_until_they_answer() {
    let fake = Fake::start();
    fake.set(json!({"events_hang_after": 1}));
    let dir = tempfile::tempdir().unwrap();
    // Four idle periods and a warning: the action would run some five seconds in.
    let slow = rule("idle", "stop").replace("evaluation_periods = 2", "evaluation_periods = 4");
    let config = fake.config(dir.path(), "mode = \"enforce\"\nwarning = \"1s\"", &slow);
    let d = Daemon::start_scenario(dir, IDLE, &config);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_hold_until_timestamp_seconds")
            .label("source", "tag")
            .get(s)
            == Some(f64::INFINITY)
    });
    // Past when the action would have run: nothing was called.
    d.await_time(first["timestamp"].as_f64().unwrap() + 9.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert_eq!(fake.mutations(), Vec::<String>::new());
    let state = fake.state();
    assert_eq!(state["power"], "running");
    assert_eq!(state["events_reads"], 1, "one answer, then none");
    // They answer again, with no event: the action runs.
    fake.set(json!({"events_hang_after": null}));
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    assert_eq!(fake.state()["power"], "deallocated");
}

/// From api-version 2021-01-01 the instance document carries the VM's user data (up to 64 KiB,
/// base64) and its tags twice: more than a metadata answer may be. `compute` alone is read,
/// with room for all of it.
#[test]
fn a_vm_with_64_kib_of_user_data_is_identified_and_acts() {
    let fake = Fake::start();
    fake.set(json!({"user_data_kib": 64}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    let s = d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    metric("gpuwatch_node_info")
        .label("provider", "azure")
        .label("instance_id", "02aab8a4-74ef-476e-8182-f6d2ba4166a6")
        .value(1.0)
        .assert_in(&s);
    assert_eq!(fake.state()["power"], "deallocated");
    let read: Vec<String> = fake
        .calls("imds")
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_string())
        .filter(|p| p.starts_with("/metadata/instance"))
        .collect();
    assert!(!read.is_empty());
    assert!(
        read.iter().all(|p| p == "/metadata/instance/compute"),
        "{read:?}"
    );
}

/// A deallocate sent while another operation runs on the VM is refused with 409
/// `OperationNotAllowed`; that operation ends, so the deallocate is tried again at the pace
/// Azure asks (its `Retry-After`), and goes through.
#[test]
fn a_deallocate_refused_while_another_operation_runs_is_retried_until_accepted() {
    let fake = Fake::start();
    fake.set(json!({"conflict": {"deallocate": 2}}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let posts = fake
        .calls("arm")
        .iter()
        .filter(|c| c["method"] == "POST")
        .count();
    assert_eq!(posts, 3, "two refused, one accepted");
    assert_eq!(fake.state()["power"], "deallocated");
    let audit = d.audit();
    assert!(events(&audit, "api_error").is_empty(), "{audit:?}");
    assert_eq!(
        api_calls(&d),
        ["Tags_UpdateAtScope", "VirtualMachines_Deallocate"]
    );
    assert!(d.log().contains("since another operation is in progress"));
}

/// The deallocate was accepted and succeeded; reading the VM's power state back is throttled
/// twice: it is read again, and the deallocate is never sent twice.
#[test]
fn a_throttled_power_state_read_is_read_again_not_deallocated_again() {
    let fake = Fake::start();
    fake.set(json!({"throttle": {"get": 2}}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "done") == 1.0);
    let arm = fake.calls("arm");
    let posts = arm.iter().filter(|c| c["method"] == "POST").count();
    assert_eq!(posts, 1, "{arm:?}");
    let gets = arm
        .iter()
        .filter(|c| c["method"] == "GET" && c["path"].as_str().is_some_and(|p| p.ends_with(VM)))
        .count();
    assert!(gets >= 3, "{arm:?}");
    assert!(events(&d.audit(), "api_error").is_empty());
}

/// A Retail Prices row of $9,999/h beside the size's other rows (Windows $4.41, Dev/Test
/// $3.67, Spot $0.73) is no price: a small budget that stops at its end is not exhausted by it,
/// and the busy VM runs on.
#[test]
fn an_absurd_catalogue_price_is_unknown_and_exhausts_no_budget() {
    let fake = Fake::start();
    fake.set(json!({"absurd_price": 9999.0}));
    let budget =
        "[[budgets]]\nname = \"tiny\"\nlimit_usd = 1\nthresholds = [1.0]\non_exhausted = \"stop\"\n";
    let d = start(&fake, "enforce", "stop", budget, BUSY);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_price_implausible_total")
            .get(s)
            .is_some_and(|n| n >= 1.0)
    });
    assert!(metric("gpuwatch_instance_hourly_cost_dollars")
        .get(&s)
        .is_none());
    let log = d.await_log(LIMIT, "implausible price");
    assert!(log.contains("9999") && log.contains("4.409"), "{log}");
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 4.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert_eq!(fake.mutations(), Vec::<String>::new());
    assert!(metric("gpuwatch_instance_hourly_cost_dollars")
        .get(&d.scrape())
        .is_none());
}

/// Azure allows 50 tags on a VM, and the Tags API refuses a merge past them: the stamp is
/// refused, on record, and the VM is deallocated all the same.
#[test]
fn a_vm_with_a_full_tag_set_is_deallocated_without_the_stamp() {
    let fake = Fake::start();
    let names: Vec<String> = (0..49).map(|i| format!("cost-tag-{i:02}")).collect();
    let mut c = Fake::start_state_compute();
    c["tagsList"] = names
        .iter()
        .map(|n| json!({"name": n, "value": "x"}))
        .collect();
    let vm_tags: serde_json::Map<String, serde_json::Value> =
        names.iter().map(|n| (n.clone(), json!("x"))).collect();
    fake.set(json!({"compute": c, "vm_tags": vm_tags}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    assert_done_without_the_stamp(&d, "stop", "Tags_UpdateAtScope", "maximum of 50 tags");
    assert_eq!(api_calls(&d), ["VirtualMachines_Deallocate"]);
    let state = fake.state();
    assert_eq!(state["power"], "deallocated");
    assert_eq!(state["vm_tags"].as_object().unwrap().len(), 49);
}

/// A deallocate is done once the VM says it is deallocated: an operation that succeeded but
/// left it stopped (still billed) is a failed action that says so.
#[test]
fn a_deallocate_that_leaves_the_vm_stopped_is_a_failed_action() {
    let fake = Fake::start();
    fake.set(json!({"op_leaves": "stopped"}));
    let d = start(&fake, "enforce", "stop", "", IDLE);
    d.await_scrape(LIMIT, |s| actions(s, "stop", "failed") == 1.0);
    let audit = d.audit();
    let error = events(&audit, "api_error")[0];
    assert_eq!(error["operation"], "VirtualMachines_Deallocate");
    let said = error["error"].as_str().unwrap();
    assert!(
        said.contains("power state is \"stopped\", not deallocated"),
        "{said}"
    );
    assert_eq!(fake.state()["power"], "stopped");
}

/// From api-version 2023-01-01-preview the Retail Prices API's filter values are
/// case-sensitive: a size that instance metadata spells otherwise than the catalogue lists
/// nothing, and is asked again without regard to case.
#[test]
fn a_size_spelt_otherwise_than_the_catalogue_is_priced() {
    let fake = Fake::start();
    let mut c = Fake::start_state_compute();
    c["vmSize"] = json!("standard_nc24ads_a100_v4");
    fake.set(json!({"compute": c}));
    let d = start(&fake, "dry-run", "stop", "", BUSY);
    common::assert_price(&d, "pricing_api", 3.673);
    let asked: Vec<serde_json::Value> = fake
        .calls("prices")
        .iter()
        .map(|c| c["query"].clone())
        .collect();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[0]["api-version"], "2023-01-01-preview");
    assert_eq!(asked[1]["api-version"], "2021-10-01-preview");
    assert_eq!(asked[1]["meterRegion"], "'primary'");
}
