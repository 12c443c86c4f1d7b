//! Every query of the shipped Grafana dashboards returns data on a real Prometheus.
//!
//! One daemon runs the demo's four GPUs (GPU 3 idle from the start) with a price, a local
//! budget whose alerts fire (on forecast at once, on actual spend seconds later), and the demo's
//! idle rule in dry-run with short periods: its warning comes, the dry-run stop follows, the
//! warning comes again, and a hold placed then keeps that action pending. A Prometheus scrapes
//! it every second. Then every panel, annotation and variable query of every dashboard in
//! `dashboards/` (but the fleet one, which `tests/fleet.rs` runs over a fleet) is run as
//! Grafana would run it, its template variables substituted, and must return data.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::dashboards::{self, Kind, Query};
use common::prometheus::{Prometheus, QueryError};
use common::{metric, Daemon};

/// The fleet dashboard needs the fleet's recording rules and team labels: tests/fleet.rs.
const ELSEWHERE: &[&str] = &["gpuwatch-fleet.json"];

/// How long the queries, together, may take to return data.
const LIMIT: Duration = Duration::from_secs(60);

/// The demo's rule (src/cmd/demo.rs), with seconds for its periods and warning, a price whose
/// forecast passes the budget at once and whose spend passes it within ten seconds ($0.01 a
/// second against $0.10).
fn config(state: &Path) -> String {
    format!(
        r#"
[sampling]
interval = "1s"

[actions]
mode = "dry-run"
boot_grace = "0s"
warning = "8s"
wall = false
state_dir = "{}"

[cost]
hourly_price_usd = 36.0

[[budgets]]
name = "team-gpu"
source = "local"
limit_usd = 0.10
thresholds = [0.5, 1.0]

[[rules]]
name = "demo-any-gpu-idle"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "1s"
evaluation_periods = 2
gpus = "any"
action = "stop"
"#,
        state.display()
    )
}

#[test]
fn every_dashboard_query_returns_data() {
    let started = Instant::now();

    // The demo's scenario, a minute in: GPU 3's job has finished and it idles.
    let scenario = format!(
        "time = {{ speed = 1.0, start = \"60s\" }}\n{}",
        gpuwatch_fake_nvml::DEMO_SCENARIO
    );
    let dir = tempfile::tempdir().unwrap();
    let config_text = config(&dir.path().join("state"));
    let d = Daemon::start_in(dir, &scenario, &config_text);
    let t0 = gpuwatch::time::now();
    let prom = Prometheus::scraping(d.addr);
    let instance = d.addr.to_string();

    // The states the cost dashboard shows, each awaited. Both budget thresholds alerted twice:
    // on the forecast at the first step, on actual spend later.
    prom.await_query("gpuwatch_budget_alerts_total >= 2", |r| r.len() == 2);
    prom.await_query(
        "gpuwatch_actions_total{action=\"stop\",result=\"dry_run\"} >= 1",
        |r| r.len() == 1,
    );
    // The warning again, with time left to place a hold before it is due: under the hold it
    // stays pending.
    d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_action_due_timestamp_seconds")
            .label("rule", "demo-any-gpu-idle")
            .get(s)
            .is_some_and(|due| due - gpuwatch::time::now() > 4.0)
    });
    common::gpuwatch(&[
        &"hold",
        &"1h",
        &"--reason",
        &"dashboards test",
        &"--config",
        &d.dir.path().join("gpuwatch.toml"),
    ]);
    let due = prom.await_query("gpuwatch_action_due_timestamp_seconds", |r| r.len() == 1);
    let due: f64 = due[0]["value"][1].as_str().unwrap().parse().unwrap();
    prom.await_query("gpuwatch_hold_until_timestamp_seconds", |r| r.len() == 1);
    // Past the due time the action is postponed, not taken: still pending.
    d.await_time(due + 1.0);
    let s = d.scrape();
    metric("gpuwatch_action_pending")
        .label("rule", "demo-any-gpu-idle")
        .label("action", "stop")
        .value(1.0)
        .assert_in(&s);
    prom.await_query("gpuwatch_action_pending", |r| r.len() == 1);
    let states = started.elapsed();

    let gpus = prom
        .try_label_values(&format!("gpu_info{{instance=\"{instance}\"}}"), "gpu")
        .unwrap();
    assert_eq!(gpus, ["0", "1", "2", "3"]);

    // Each dashboard's queries, with each variable's value: the node, and the GPUs as "All"
    // (the variable's allValue, `.*`) and as the idle GPU alone, which also shows that a query
    // filtering by GPU is not one of a series without that label.
    let mut checks = Vec::new();
    let files = common::files_in("dashboards", "json");
    assert!(files.len() >= 3, "{files:?}");
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy();
        if ELSEWHERE.contains(&name.as_ref()) {
            continue;
        }
        let dash = dashboards::load(file);
        let vars = dashboards::variables(&dash);
        assert!(
            vars.iter().any(|v| v == "datasource") && vars.iter().any(|v| v == "instance"),
            "{name}: no datasource or instance variable: {vars:?}"
        );
        let gpu_values: &[&str] = if vars.iter().any(|v| v == "gpu") {
            &[".*", "3"]
        } else {
            &[".*"]
        };
        let queries = dashboards::queries(file);
        assert!(
            queries.iter().any(|q| q.kind == Kind::Panel),
            "{name}: no panels"
        );
        for q in queries {
            for gpu in gpu_values {
                checks.push(Check {
                    vars: vars.clone(),
                    gpu,
                    query: q.clone(),
                });
            }
        }
    }
    // The GPM row's panels are among them: the demo's GPUs have GPM.
    assert!(
        checks
            .iter()
            .any(|c| c.query.row.as_deref() == Some("GPM (Hopper and later)")),
        "no GPM panels"
    );

    // All queries are run, then the ones without data again, until all have data or the
    // time is up; then every one still without data is reported.
    let deadline = Instant::now() + LIMIT;
    let mut pending: Vec<&Check> = checks.iter().collect();
    let mut refused = Vec::new();
    loop {
        let now = gpuwatch::time::now();
        let range = (t0, now);
        // Grafana's built-in variables for a range from t0 to now, 1 s steps and a 1 s scrape.
        let span = format!("{}s", (now - t0).ceil() as u64);
        let builtins = [
            ("datasource", "prometheus"),
            ("instance", instance.as_str()),
            // The vendor selector at "All".
            ("vendor", ".*"),
            ("__interval", "1s"),
            ("__interval_ms", "1000"),
            ("__rate_interval", "4s"),
            ("__range", span.as_str()),
        ];
        pending.retain(|c| {
            let vars: Vec<(&str, &str)> = builtins
                .iter()
                .copied()
                .chain([("gpu", c.gpu)])
                .filter(|(n, _)| n.starts_with("__") || c.vars.iter().any(|v| v == n))
                .collect();
            let expr = dashboards::substitute(&c.query.expr, &vars);
            let answer = if c.query.kind == Kind::Variable {
                let (selector, label) = dashboards::label_values(&expr).unwrap_or_else(|| {
                    panic!("{}: not label_values(SELECTOR, LABEL)", c.describe(&expr))
                });
                prom.try_label_values(selector, label).map(|v| v.len())
            } else {
                prom.try_query(&expr, (!c.query.instant).then_some(range))
                    .map(|r| r.len())
            };
            match answer {
                Ok(n) => n == 0,
                Err(QueryError::NotYet(_)) => true,
                Err(QueryError::Refused(why)) => {
                    refused.push(format!("{}\n    {why}", c.describe(&expr)));
                    false
                }
            }
        });
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let empty: Vec<String> = pending.iter().map(|c| c.describe(&c.query.expr)).collect();
    assert!(
        refused.is_empty() && empty.is_empty(),
        "Prometheus refused:\n{}\nno data within {LIMIT:?}:\n{}",
        refused.join("\n"),
        empty.join("\n")
    );
    println!(
        "dashboards: {} queries over {} dashboards returned data; \
         states reached in {:.1} s, {:.1} s in all",
        checks.len(),
        files.len() - ELSEWHERE.len(),
        states.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// One query to run, with the value of `$gpu`.
struct Check {
    vars: Vec<String>,
    gpu: &'static str,
    query: Query,
}

impl Check {
    fn describe(&self, expr: &str) -> String {
        format!(
            "{}: {:?} (gpu {:?}, {}): {expr}",
            self.query.dashboard,
            self.query.panel,
            self.gpu,
            if self.query.instant {
                "instant"
            } else {
                "range"
            },
        )
    }
}

#[test]
fn substitution_replaces_every_form() {
    let vars = [("gpu", "3"), ("__rate_interval", "4s"), ("instance", "a:1")];
    assert_eq!(
        dashboards::substitute(
            "rate(x{instance=~\"$instance\", gpu=~\"${gpu:regex}\"}[$__rate_interval])",
            &vars
        ),
        "rate(x{instance=~\"a:1\", gpu=~\"3\"}[4s])"
    );
    assert_eq!(
        dashboards::label_values("label_values(gpu_info{instance=~\"$instance\"}, gpu)"),
        Some(("gpu_info{instance=~\"$instance\"}", "gpu"))
    );
}

/// The provider file loads the dashboards from where the packages put them, into one folder.
#[test]
fn the_provisioning_file_names_the_dashboards_directory() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("dashboards/provisioning.yml")).unwrap();
    for line in [
        "apiVersion: 1",
        "folder: gpuwatch",
        "type: file",
        "path: /usr/share/gpuwatch/dashboards",
        "foldersFromFilesStructure: false",
    ] {
        assert!(
            text.lines().any(|l| l.trim() == line),
            "provisioning.yml has no line {line:?}"
        );
    }
    // Every dashboard has a uid of its own and the data source variable Grafana asks for.
    let mut uids = std::collections::BTreeSet::new();
    for file in common::files_in("dashboards", "json") {
        let dash = dashboards::load(&file);
        let uid = dash["uid"].as_str().unwrap().to_string();
        assert!(
            uids.insert(uid.clone()),
            "{}: uid {uid} twice",
            file.display()
        );
        assert_eq!(dash["schemaVersion"], 39, "{}", file.display());
    }
}
