//! Cost and budgets end to end: prices from moto's spot history and a Pricing API fixture, spend
//! with an injected clock, budget alerts through a webhook and SNS, budget-gated rules, the hard
//! budget limit, and CloudWatch publishing read back from moto.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::aws::{self, rt, Kind, ProxyMode};
use common::receiver::Receiver;
use common::{events, metric, secs, Daemon};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);
const ACCOUNT: &str = "123456789012";

fn base_config(
    dir: &std::path::Path,
    imds: &aws::Imds,
    endpoint: SocketAddr,
    extra: &str,
) -> String {
    aws::daemon_config(
        dir,
        imds,
        endpoint,
        "mode = \"enforce\"\nwarning = \"1s\"",
        extra,
    )
}

const BUSY2: &str = "[[gpu]]\nutilization = 80\n[[gpu]]\nutilization = 90\n";
const IDLE2: &str = "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n";

fn start(dir: tempfile::TempDir, scenario: &str, config: String) -> Daemon {
    Daemon::start_scenario(dir, scenario, &config)
}

/// State with a ledger already this far into the current month, as a running daemon leaves it.
fn seed_ledger(dir: &std::path::Path, period_start: f64, spent: f64, accrued_until: f64) {
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(
        dir.join("state/state.json"),
        format!(
            r#"{{"engine":{{"rules":{{}}}},"ledger":{{"period_start":{period_start},"spent":{spent},"accrued_until":{accrued_until},"last_price":null}}}}"#
        ),
    )
    .unwrap();
}

fn month_start(t: f64) -> f64 {
    gpuwatch::cost::calendar::Period::Month.start(t)
}

#[test]
fn spend_over_a_simulated_day_at_moto_s_spot_price_survives_a_restart() {
    use gpuwatch::cloud::Node;
    use gpuwatch::rules::Observation;
    use gpuwatch::spend::{PollerReadings, Tracker};
    use gpuwatch::state::Persisted;
    use gpuwatch::step::Inputs;
    use std::time::Duration;

    // The spot price, as the daemon reads it: DescribeSpotPriceHistory from moto.
    let ec2 =
        gpuwatch::cloud::aws::ec2::Ec2::new(&aws::sdk_config(aws::moto().addr).into(), "i-unused");
    let price = rt()
        .block_on(ec2.spot_price("p4d.24xlarge", "us-east-1a"))
        .unwrap()
        .expect("moto has a spot price for p4d.24xlarge");
    assert!(price > 0.0);

    let config = gpuwatch::config::Config::default();
    let node = Node {
        instance_id: "i-unused".into(),
        region: aws::REGION.into(),
        instance_type: "p4d.24xlarge".into(),
        availability_zone: "us-east-1a".into(),
        lifecycle: Some(gpuwatch::rules::Lifecycle::Spot),
    };
    let known = Arc::new(PollerReadings::default());
    *known.spot.lock().unwrap() = Some(price);
    let mut tracker = Tracker::new(config.clone(), Some(node.clone()), Arc::clone(&known));
    let settings = config.step_settings(Duration::from_secs(1), 0.0, 0.0);
    // One step of the daemon's decision loop, at `now`, with the price the tracker knows.
    let step = |tracker: &mut Tracker, p: &mut Persisted, now: f64| {
        let mut inputs = Inputs {
            now,
            lifecycle: node.lifecycle,
            ..Inputs::default()
        };
        tracker.fill(p, &mut inputs);
        gpuwatch::step::step(&settings, p, &Observation::default(), &inputs)
    };
    let t0 = gpuwatch::time::parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
    let mut p = Persisted::default();
    // An injected clock: one sample a second for 12 hours...
    for s in 0..=43_200u32 {
        let out = step(&mut tracker, &mut p, t0 + f64::from(s));
        let price = out.view.price.unwrap();
        assert_eq!(price.source, gpuwatch::cost::price::Source::Spot);
    }
    // ...a restart (state through JSON; the spot price is not known yet in the new process, the
    // last one is kept), two minutes down, then the rest of the day.
    let json = serde_json::to_string(&p).unwrap();
    let mut p: Persisted = serde_json::from_str(&json).unwrap();
    let mut tracker = Tracker::new(
        config.clone(),
        Some(node.clone()),
        Arc::new(PollerReadings::default()),
    );
    for s in (43_320..=86_400u32).step_by(5) {
        step(&mut tracker, &mut p, t0 + f64::from(s));
    }
    let want = price * 24.0;
    assert!(
        (p.ledger.spent - want).abs() < 1e-9 * want.max(1.0),
        "{} != {want}",
        p.ledger.spent
    );
}

#[test]
fn month_rollover_resets_spend_and_audits_the_old_total() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let now = gpuwatch::time::now();
    let this_month = month_start(now);
    let last_month = month_start(this_month - 86_400.0);
    // The daemon last accrued one second before the month turned, with $123.45 spent.
    seed_ledger(dir.path(), last_month, 123.45, this_month - 1.0);
    let config = base_config(
        dir.path(),
        &imds,
        aws::moto().addr,
        "[cost]\nhourly_price_usd = 3.6\n",
    );
    let d = start(dir, IDLE2, config);
    let s = d.await_scrape(LIMIT, |s| metric("gpuwatch_spend_dollars").get(s).is_some());
    // Spend restarts at the turn of the month: $3.60/h since then, or since the boot if later.
    let spent = metric("gpuwatch_spend_dollars").get(&s).unwrap();
    assert!(spent < 3.6 * (now - this_month) / 3600.0 + 0.01, "{spent}");
    metric("gpuwatch_instance_hourly_cost_dollars")
        .label("source", "config")
        .value(3.6)
        .assert_in(&s);
    let audit = d.audit();
    let closed = events(&audit, "period_closed");
    assert_eq!(closed.len(), 1, "{audit:?}");
    assert_eq!(
        closed[0]["period_start"],
        gpuwatch::time::rfc3339(last_month)
    );
    assert_eq!(closed[0]["period_end"], gpuwatch::time::rfc3339(this_month));
    let total = closed[0]["spent_usd"].as_f64().unwrap();
    assert!((123.45..123.46).contains(&total), "{total}");
}

#[test]
fn aws_budget_alerts_reach_the_webhook_and_sns_once_each() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let receiver = Receiver::start();
    let shared = aws::sdk_config(aws::moto().addr);
    let budgets = aws_sdk_budgets::Client::new(&shared);
    let sns = aws_sdk_sns::Client::new(&shared);
    let name = format!("team-{}", inst.id);
    let set_spend = |amount: &str| {
        rt().block_on(async {
            let _ = budgets
                .delete_budget()
                .account_id(ACCOUNT)
                .budget_name(&name)
                .send()
                .await;
            let spend = |a: &str| {
                aws_sdk_budgets::types::Spend::builder()
                    .amount(a)
                    .unit("USD")
                    .build()
                    .unwrap()
            };
            budgets
                .create_budget()
                .account_id(ACCOUNT)
                .budget(
                    aws_sdk_budgets::types::Budget::builder()
                        .budget_name(&name)
                        .budget_type(aws_sdk_budgets::types::BudgetType::Cost)
                        .time_unit(aws_sdk_budgets::types::TimeUnit::Monthly)
                        .budget_limit(spend("100"))
                        .calculated_spend(
                            aws_sdk_budgets::types::CalculatedSpend::builder()
                                .actual_spend(spend(amount))
                                .build(),
                        )
                        .build()
                        .unwrap(),
                )
                .send()
                .await
                .unwrap();
        })
    };
    set_spend("45");
    let topic = rt().block_on(async {
        let t = sns
            .create_topic()
            .name(format!("gpuwatch-{}", inst.id))
            .send()
            .await
            .unwrap();
        let arn = t.topic_arn().unwrap().to_string();
        sns.subscribe()
            .topic_arn(&arn)
            .protocol("http")
            .endpoint(format!("http://{}/sns", receiver.addr))
            .send()
            .await
            .unwrap();
        arn
    });
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "webhook_url = \"http://{}/hook\"\n[[budgets]]\nname = \"team\"\nsource = \"aws_budgets\"\naws_budget_name = \"{name}\"\naccount_id = \"{ACCOUNT}\"\nsns_topic_arn = \"{topic}\"\npoll_interval = \"1s\"\n",
        receiver.addr
    );
    let config = base_config(dir.path(), &imds, aws::moto().addr, &extra);
    let state_dir = dir.path().join("state");
    let keep = dir.path().to_path_buf();
    let mut d = start(dir, BUSY2, config.clone());
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_budget_spent_ratio")
            .label("budget", "team")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_budget_spent_ratio")
        .label("budget", "team")
        .value(0.45)
        .assert_in(&s);
    metric("gpuwatch_budget_limit_dollars")
        .label("budget", "team")
        .value(100.0)
        .assert_in(&s);
    assert!(receiver.bodies("/hook").is_empty());

    set_spend("85");
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_budget_alerts_total")
            .label("budget", "team")
            .label("threshold", "0.8")
            .get(s)
            == Some(1.0)
    });
    // The webhook and SNS deliveries travel apart: wait for both.
    d.await_sample(LIMIT, |_| {
        receiver.bodies("/sns").len() >= 2 && receiver.bodies("/hook").len() >= 2
    });
    let hooks = receiver.bodies("/hook");
    assert_eq!(hooks.len(), 2, "{hooks:?}");
    let texts: Vec<String> = hooks
        .iter()
        .map(|b| {
            serde_json::from_str::<Value>(b).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        texts[0].contains("(threshold 50%)") && texts[1].contains("(threshold 80%)"),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .all(|t| t.contains("budget \"team\" actual spend is at 85%")),
        "{texts:?}"
    );
    let sns_msgs: Vec<Value> = receiver
        .bodies("/sns")
        .iter()
        .map(|b| serde_json::from_str(b).unwrap())
        .collect();
    assert_eq!(sns_msgs.len(), 2);
    assert!(sns_msgs.iter().all(|m| m["TopicArn"] == topic.as_str()));
    assert_eq!(events(&d.audit(), "budget_alert").len(), 2);

    // A restart does not send them again.
    d.kill();
    let d2 = Daemon::start_with(common::reuse_dir(&keep), &config);
    let first = d2.await_scrape(LIMIT, |s| {
        metric("gpuwatch_budget_spent_ratio")
            .label("budget", "team")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_budget_spent_ratio")
        .label("budget", "team")
        .value(0.85)
        .assert_in(&first);
    d2.await_time(gpuwatch::time::now() + 2.0);
    assert_eq!(receiver.bodies("/hook").len(), 2);
    assert_eq!(receiver.bodies("/sns").len(), 2);
    assert_eq!(
        events(
            &common::audit_records(&state_dir.join("audit.jsonl")),
            "budget_alert"
        )
        .len(),
        2
    );
}

fn gated_rule(ratio: &str) -> String {
    format!(
        r#"[cost]
hourly_price_usd = 0.0001
[[budgets]]
name = "team"
limit_usd = 100
thresholds = [0.5]
[[rules]]
name = "gated"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "1s"
evaluation_periods = 2
action = "stop"
budget = {{ name = "team", spent_at_least = {ratio} }}
"#
    )
}

#[test]
fn a_budget_gated_rule_acts_at_80_percent_and_not_at_79() {
    let now = gpuwatch::time::now();
    let mut daemons = Vec::new();
    for spent in [79.0, 80.0] {
        let inst = aws::launch(Kind::OnDemand);
        let imds = aws::imds(&inst.id, "on-demand");
        let dir = tempfile::tempdir().unwrap();
        seed_ledger(dir.path(), month_start(now), spent, now);
        let config = base_config(dir.path(), &imds, aws::moto().addr, &gated_rule("0.8"));
        daemons.push((spent, inst, imds, start(dir, IDLE2, config)));
    }
    let (_, stopped, _, d80) = &daemons[1];
    d80.await_scrape(LIMIT, |s| {
        metric("gpuwatch_actions_total")
            .label("action", "stop")
            .label("result", "done")
            .get(s)
            == Some(1.0)
    });
    assert!(["stopping", "stopped"].contains(&aws::instance_state(&stopped.id).as_str()));
    let attempt = events(&d80.audit(), "action_attempt")[0].clone();
    assert_eq!(attempt["evidence"]["budget"][0], "team");
    assert!(attempt["evidence"]["budget"][1].as_f64().unwrap() >= 0.8);

    let (_, running, _, d79) = &daemons[0];
    let t = gpuwatch::time::now();
    d79.await_time(t + 3.0);
    let s = d79.scrape();
    let ratio = metric("gpuwatch_budget_spent_ratio")
        .label("budget", "team")
        .get(&s)
        .unwrap();
    assert!((0.79..0.7901).contains(&ratio), "{ratio}");
    assert!(events(&d79.audit(), "warning").is_empty());
    assert_eq!(aws::instance_state(&running.id), "running");
}

fn exhausted() -> String {
    "[cost]\nhourly_price_usd = 0.0001\n[[budgets]]\nname = \"team\"\nlimit_usd = 100\nthresholds = [1.0]\non_exhausted = \"stop\"\n"
        .to_string()
}

#[test]
fn an_exhausted_budget_stops_the_instance_even_when_busy() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let now = gpuwatch::time::now();
    seed_ledger(dir.path(), month_start(now), 100.0, now);
    let config = base_config(dir.path(), &imds, aws::moto().addr, &exhausted());
    let d = start(dir, BUSY2, config);
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_actions_total")
            .label("action", "stop")
            .label("result", "done")
            .get(s)
            == Some(1.0)
    });
    assert!(["stopping", "stopped"].contains(&aws::instance_state(&inst.id).as_str()));
    let audit = d.audit();
    let warning = events(&audit, "warning")[0];
    assert_eq!(warning["rule"], "budget team exhausted");
    assert!(secs(&events(&audit, "action_attempt")[0]["time"]) >= secs(&warning["due_at"]) - 0.5);
    // Its warning says its own cause, on busy GPUs, and what calls it off.
    assert_eq!(
        warning["unless"],
        "its spend falls under the limit or cannot be known"
    );
    let log = d.log();
    assert!(
        log.contains("gpuwatch: budget \"team\" is spent; this instance will stop at"),
        "{log}"
    );
    assert!(!log.contains("GPUs idle"), "{log}");
}

#[test]
fn an_exhausted_budget_waits_for_a_hold() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let now = gpuwatch::time::now();
    seed_ledger(dir.path(), month_start(now), 100.0, now);
    let config = base_config(dir.path(), &imds, aws::moto().addr, &exhausted());
    let config_path = dir.path().join("hold.toml");
    std::fs::write(&config_path, &config).unwrap();
    common::gpuwatch(&[
        &"hold",
        &"1h",
        &"--reason",
        &"finishing an epoch",
        &"--config",
        &config_path,
    ]);
    let d = start(dir, BUSY2, config);
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 4.0);
    assert!(events(&d.audit(), "action_attempt").is_empty());
    assert_eq!(aws::instance_state(&inst.id), "running");
    // Released, it goes through its warning and acts.
    common::gpuwatch(&[&"release", &"--config", &config_path]);
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_actions_total")
            .label("action", "stop")
            .label("result", "done")
            .get(s)
            == Some(1.0)
    });
}

/// A Pricing API fixture answering GetProducts with a real response shape.
fn pricing_fixture(usd: &str) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    use axum::http::HeaderMap;
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&requests);
    let entry = serde_json::json!({
        "product": {"productFamily": "Compute Instance", "attributes": {"instanceType": "p4d.24xlarge",
            "regionCode": "us-east-1", "operatingSystem": "Linux", "tenancy": "Shared"}, "sku": "SKU1"},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {"SKU1.JRTCKXETXF": {"offerTermCode": "JRTCKXETXF", "sku": "SKU1",
            "priceDimensions": {"SKU1.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "description": "p4d.24xlarge",
                "pricePerUnit": {"USD": usd}}}}}}
    })
    .to_string();
    let body = serde_json::json!({"FormatVersion": "aws_v1", "PriceList": [entry]}).to_string();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |headers: HeaderMap, req: String| {
            let body = body.clone();
            let seen = Arc::clone(&seen);
            async move {
                let target = headers
                    .get("x-amz-target")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                seen.lock().unwrap().push(format!("{target} {req}"));
                ([("content-type", "application/x-amz-json-1.1")], body)
            }
        },
    ));
    (common::receiver::serve(app), requests)
}

#[test]
fn the_pricing_api_price_is_parsed_and_used() {
    let (addr, requests) = pricing_fixture("32.7726000000");
    let services = gpuwatch::cloud::aws::services::Services::new(
        &aws::sdk_config(aws::moto().addr).into(),
        Some(&format!("http://{addr}")),
    );
    let price = rt()
        .block_on(services.on_demand_price("us-east-1", "p4d.24xlarge"))
        .unwrap();
    assert_eq!(price, Some(32.7726));
    let req = requests.lock().unwrap()[0].clone();
    assert!(req.starts_with("AWSPriceListService.GetProducts "), "{req}");
    assert!(
        req.contains("\"AmazonEC2\"") && req.contains("\"p4d.24xlarge\""),
        "{req}"
    );

    // And the daemon on an on-demand instance uses it over the bundled table.
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let (addr, _) = pricing_fixture("31.0000000000");
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("[cost]\npricing_endpoint_url = \"http://{addr}\"\n");
    let config = base_config(dir.path(), &imds, aws::moto().addr, &extra);
    let d = start(dir, BUSY2, config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_instance_hourly_cost_dollars")
            .label("source", "pricing_api")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_instance_hourly_cost_dollars")
        .label("source", "pricing_api")
        .value(31.0)
        .assert_in(&s);
}

/// EC2's built-in table prices an on-demand instance while the Pricing API is off, and is what
/// a Pricing API answer is checked against: one twentyfold from the table's price is
/// implausible (counted, unknown), and the table's price stands.
#[test]
fn ec2_s_built_in_table_prices_an_on_demand_instance_and_checks_the_pricing_api() {
    let table = |d: &Daemon| {
        d.await_scrape(LIMIT, |s| {
            metric("gpuwatch_instance_hourly_cost_dollars")
                .label("source", "table")
                .get(s)
                .is_some()
        })
    };
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(
        dir.path(),
        &imds,
        aws::moto().addr,
        "[cost]\npricing_api = false\n",
    );
    let d = start(dir, BUSY2, config);
    metric("gpuwatch_instance_hourly_cost_dollars")
        .label("source", "table")
        .value(32.7726)
        .assert_in(&table(&d));
    drop(d);

    let (addr, requests) = pricing_fixture("9999.0000000000");
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("[cost]\npricing_endpoint_url = \"http://{addr}\"\n");
    let config = base_config(dir.path(), &imds, aws::moto().addr, &extra);
    let d = start(dir, BUSY2, config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_price_implausible_total")
            .get(s)
            .unwrap_or(0.0)
            >= 1.0
    });
    assert!(!requests.lock().unwrap().is_empty());
    metric("gpuwatch_instance_hourly_cost_dollars")
        .label("source", "pricing_api")
        .absent()
        .assert_in(&s);
    metric("gpuwatch_instance_hourly_cost_dollars")
        .label("source", "table")
        .value(32.7726)
        .assert_in(&table(&d));
}

/// Instance metadata calls the instance neither on-demand nor spot (a Capacity Block for ML is
/// paid for otherwise): no on-demand price applies, though the bundled table has its type, so
/// spend is unknown, and the log names the lifecycle.
#[test]
fn an_instance_neither_on_demand_nor_spot_gets_no_on_demand_price() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "capacity-block");
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(dir.path(), &imds, aws::moto().addr, "");
    let d = start(dir, BUSY2, config);
    let log = d.await_log(LIMIT, "neither on-demand nor spot");
    assert!(log.contains("capacity-block"), "{log}");
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    d.await_time(first["timestamp"].as_f64().unwrap() + 1.0);
    let s = d.scrape();
    metric("gpuwatch_node_info")
        .label("instance_id", &inst.id)
        .label("lifecycle", "unknown")
        .value(1.0)
        .assert_in(&s);
    metric("gpuwatch_instance_hourly_cost_dollars")
        .absent()
        .assert_in(&s);
}

fn cloudwatch_config(
    dir: &std::path::Path,
    imds: &aws::Imds,
    endpoint: SocketAddr,
    queue: &str,
) -> String {
    base_config(
        dir,
        imds,
        endpoint,
        &format!("[cloud.aws.cloudwatch]\nenabled = true\nnamespace = \"gpuwatch-test\"\ninterval = \"1s\"\nmax_queue = \"{queue}\"\n"),
    )
}

#[test]
fn cloudwatch_gets_the_minute_averages_and_maxima_per_gpu_and_instance() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let scenario = "[[gpu]]\nutilization = 37\n[[gpu]]\nutilization = 61\n[[gpu]]\nutilization = { kind = \"bursts\", busy = 90, idle = 10, period = \"2s\", duty = 0.5 }\n";
    let dir = tempfile::tempdir().unwrap();
    let config = cloudwatch_config(dir.path(), &imds, aws::moto().addr, "30m");
    let d = start(dir, scenario, config);
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_cloudwatch_datums_total")
            .get(s)
            .unwrap_or(0.0)
            >= 80.0
    });
    let cw = aws_sdk_cloudwatch::Client::new(&aws::sdk_config(aws::moto().addr));
    let query = |id: &str, name: &str, gpu: Option<&str>, stat: &str| {
        use aws_sdk_cloudwatch::types::{Dimension, Metric, MetricDataQuery, MetricStat};
        let mut dims = vec![Dimension::builder()
            .name("InstanceId")
            .value(&inst.id)
            .build()];
        if let Some(g) = gpu {
            dims.push(
                Dimension::builder()
                    .name("InstanceType")
                    .value("p4d.24xlarge")
                    .build(),
            );
            dims.push(Dimension::builder().name("GPU").value(g).build());
        }
        MetricDataQuery::builder()
            .id(id)
            .metric_stat(
                MetricStat::builder()
                    .metric(
                        Metric::builder()
                            .namespace("gpuwatch-test")
                            .metric_name(name)
                            .set_dimensions(Some(dims))
                            .build(),
                    )
                    .period(60)
                    .stat(stat)
                    .build(),
            )
            .build()
    };
    let now = gpuwatch::time::now() as i64;
    let out = rt()
        .block_on(
            cw.get_metric_data()
                .metric_data_queries(query("gpu0avg", "GPUUtilization", Some("0"), "Average"))
                .metric_data_queries(query("gpu1max", "GPUUtilization", Some("1"), "Maximum"))
                .metric_data_queries(query("gpu2max", "GPUUtilization", Some("2"), "Maximum"))
                .metric_data_queries(query("gpu2min", "GPUUtilization", Some("2"), "Minimum"))
                .metric_data_queries(query("nodemax", "GPUUtilizationMax", None, "Maximum"))
                .metric_data_queries(query("nodeavgmin", "GPUUtilization", None, "Minimum"))
                .start_time(aws_sdk_cloudwatch::primitives::DateTime::from_secs(
                    now - 600,
                ))
                .end_time(aws_sdk_cloudwatch::primitives::DateTime::from_secs(
                    now + 120,
                ))
                .send(),
        )
        .unwrap();
    let value = |id: &str| -> Vec<f64> {
        out.metric_data_results()
            .iter()
            .find(|r| r.id() == Some(id))
            .map(|r| r.values().to_vec())
            .unwrap_or_default()
    };
    let all = |id: &str, want: f64| {
        let v = value(id);
        assert!(
            !v.is_empty() && v.iter().all(|x| (x - want).abs() < 1e-6),
            "{id}: {v:?} != {want}"
        );
    };
    all("gpu0avg", 37.0);
    all("gpu1max", 61.0);
    assert!(value("gpu2max").contains(&90.0), "{:?}", value("gpu2max"));
    assert!(value("gpu2min").contains(&10.0), "{:?}", value("gpu2min"));
    // Per instance: the maximum across GPUs reaches the bursty GPU's peak; the average across
    // GPUs is never below (37 + 61 + 10) / 3.
    assert!(value("nodemax").contains(&90.0), "{:?}", value("nodemax"));
    let nodemin = value("nodeavgmin");
    assert!(
        !nodemin.is_empty() && nodemin.iter().all(|m| *m >= 36.0 - 1e-6),
        "{nodemin:?}"
    );
}

#[test]
fn with_cloudwatch_down_the_queue_stays_bounded_and_recovers() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let proxy = aws::Proxy::start(ProxyMode::Refuse);
    let dir = tempfile::tempdir().unwrap();
    // Two GPUs: 5 metrics × 2 GPUs + 10 instance series = 20 datums a second; 3 s are kept.
    let config = cloudwatch_config(dir.path(), &imds, proxy.addr, "3s");
    let d = start(dir, BUSY2, config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_cloudwatch_dropped_datums_total")
            .get(s)
            .unwrap_or(0.0)
            > 0.0
    });
    assert!(
        metric("gpuwatch_cloudwatch_queue_datums").get(&s).unwrap() <= 60.0,
        "{}",
        s.text
    );
    assert!(metric("gpuwatch_cloudwatch_errors_total").get(&s).unwrap() >= 1.0);
    assert_eq!(
        metric("gpuwatch_cloudwatch_datums_total").get(&s),
        Some(0.0)
    );
    proxy.set(ProxyMode::Forward);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_cloudwatch_datums_total")
            .get(s)
            .unwrap_or(0.0)
            >= 40.0
            && metric("gpuwatch_cloudwatch_queue_datums").get(s) == Some(0.0)
    });
    d.await_log(LIMIT, "CloudWatch publishing recovered");
    drop(s);
}

/// Cost by team: `[node] labels` and the instance tags named in `[cloud] tag_labels` label
/// `gpuwatch_node_info` (tag values escaped and cut to 256 characters), and
/// `gpuwatch_gpu_idle_dollars_total` is the price times the idle GPUs' share: with one GPU of
/// two idle, exactly half of the spend.
#[test]
fn node_info_carries_team_labels_and_idle_dollars_are_the_idle_share_of_spend() {
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let hostile = format!("a\"b\\c\nd}} {}", "x".repeat(400));
    {
        let mut st = imds.state.lock().unwrap();
        st.tags.insert("cost-center".into(), hostile.clone());
        st.tags.insert("owner".into(), "not copied".into());
    }
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(
        dir.path(),
        &imds,
        aws::moto().addr,
        "[cost]\nhourly_price_usd = 3600.0\n[node]\nlabels = { team = \"ml\" }\n",
    )
    .replace(
        "tag_poll_interval = \"200ms\"",
        "tag_poll_interval = \"200ms\"\ntag_labels = [\"cost-center\", \"project\"]",
    );
    // GPU 0 idles, GPU 1 works.
    let d = start(
        dir,
        "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 80\n",
        config,
    );
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_spend_dollars").get(s).unwrap_or(0.0) >= 3.0
            && metric("gpuwatch_node_info")
                .label("team", "ml")
                .get(s)
                .is_some()
            && s.named("gpuwatch_node_info")
                .iter()
                .any(|x| x.labels.contains_key("cost_center"))
    });
    let info = s.named("gpuwatch_node_info");
    assert_eq!(info.len(), 1, "{}", s.text);
    let labels = &info[0].labels;
    assert_eq!(labels["instance_id"], inst.id);
    assert_eq!(labels["team"], "ml");
    // The value, escaped as the exposition format wants, ends the label where it should.
    let want: String = hostile.chars().take(256).collect();
    let escaped = want
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    assert!(
        s.text.contains(&format!("cost_center=\"{escaped}\"}} 1")),
        "{}",
        s.text
    );
    assert!(!s.text.contains("project="), "a missing tag is no label");
    assert!(!s.text.contains("owner="), "only the named tags are copied");
    common::assert_promtool_accepts(&s.text);

    let spend = metric("gpuwatch_spend_dollars").get(&s).unwrap();
    let idle = metric("gpuwatch_gpu_idle_dollars_total").get(&s).unwrap();
    // Half, but for a sample gap longer than the slack that a loaded machine may cause: the
    // ledger accrues across it, idle dollars do not (unknown is not idle).
    assert!(
        idle <= spend / 2.0 + 1e-9 && idle >= spend / 2.0 * 0.9,
        "idle {idle} is not half of spend {spend}"
    );
}
