//! A fleet under one real Prometheus: 24 daemons of 8 fake GPUs each, with team labels and
//! prices, some GPUs idle and some busy, scraped through file-based service discovery and
//! summed by `config/prometheus/fleet.yml`. The fleet totals are what the fakes were told to do,
//! and every query of `dashboards/gpuwatch-fleet.json` returns data.
//!
//! It prints what the fleet costs Prometheus and the nodes: series per node, the total scrape
//! time, and gpuwatch's resident memory summed over the fleet (`--nocapture` shows them).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::dashboards;
use common::prometheus::Prometheus;
use common::{Daemon, Scrape};

const NODES: usize = 24;
const GPUS: usize = 8;
const TEAMS: [&str; 3] = ["ml", "data", "infra"];

/// What node `i` is told to do: its team, how many of its GPUs idle, and its price per hour.
fn plan(i: usize) -> (&'static str, usize, f64) {
    (TEAMS[i % 3], i % 4, 10.0 + i as f64)
}

fn value(v: &serde_json::Value) -> f64 {
    v["value"][1].as_str().unwrap().parse().unwrap()
}

/// The query's result as team -> value.
fn by_team(result: &[serde_json::Value]) -> BTreeMap<String, f64> {
    result
        .iter()
        .map(|s| {
            (
                s["metric"]["team"].as_str().unwrap_or("").to_string(),
                value(s),
            )
        })
        .collect()
}

#[test]
fn a_fleet_sums_by_team_on_a_real_prometheus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut fleet = Vec::new();
    let mut gpus_want: BTreeMap<String, f64> = BTreeMap::new();
    let mut idle_want: BTreeMap<String, f64> = BTreeMap::new();
    let mut price_want: BTreeMap<String, f64> = BTreeMap::new();
    for i in 0..NODES {
        let (team, idle, price) = plan(i);
        let mut scenario: String = (0..GPUS)
            .map(|g| format!("[[gpu]]\nutilization = {}\n", if g < idle { 0 } else { 80 }))
            .collect();
        // One busy GPU of the first node (team ml) fell off the bus: unhealthy, and priced.
        if i == 0 {
            scenario.push_str(&format!(
                "[[fault]]\nat = \"0s\"\ngpu = {}\nkind = \"lost\"\n",
                GPUS - 1
            ));
        }
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "[actions]\nstate_dir = \"{}\"\n[cost]\nhourly_price_usd = {price:.1}\n[node]\nlabels = {{ team = \"{team}\" }}\n",
            dir.path().join("state").display()
        );
        fleet.push(Daemon::start_in(dir, &scenario, &config));
        *gpus_want.entry(team.into()).or_default() += GPUS as f64;
        *idle_want.entry(team.into()).or_default() += idle as f64;
        *price_want.entry(team.into()).or_default() += price;
    }

    let dir = tempfile::tempdir().unwrap();
    let targets: Vec<String> = fleet.iter().map(|d| d.addr.to_string()).collect();
    std::fs::write(
        dir.path().join("targets.json"),
        serde_json::json!([{ "targets": targets }]).to_string(),
    )
    .unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: gpuwatch\n    file_sd_configs:\n      - files: ['{targets}']\n",
        rules = root.join("config/prometheus/fleet.yml").display(),
        targets = dir.path().join("targets.json").display(),
    );
    let prom = Prometheus::start(dir, &config);

    let up = prom.await_query("sum(up{job=\"gpuwatch\"})", |r| {
        r.first().is_some_and(|s| value(s) == NODES as f64)
    });
    assert_eq!(value(&up[0]), NODES as f64);

    // GPUs and idle GPUs per team: exactly what the fakes were told.
    let gpus = prom.await_query("team:gpuwatch_gpus:sum", |r| by_team(r) == gpus_want);
    assert_eq!(by_team(&gpus), gpus_want);
    let idle = prom.await_query("team:gpuwatch_gpus_idle:sum", |r| by_team(r) == idle_want);
    assert_eq!(by_team(&idle), idle_want);
    // What each team's nodes cost: the sum of their prices.
    let cost = prom.await_query("team:gpuwatch_hourly_cost_dollars:sum", |r| {
        by_team(r)
            .iter()
            .zip(&price_want)
            .all(|((a, x), (b, y))| a == b && (x - y).abs() < 1e-9)
            && r.len() == TEAMS.len()
    });
    assert_eq!(cost.len(), TEAMS.len());

    // Spend per team, as Prometheus last recorded it, between the daemons' own figures read
    // just before and just after: behind by a sample, a scrape and an evaluation of accrual
    // (a few seconds, and more on a loaded machine; ten allowed).
    let direct = || {
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        for (i, d) in fleet.iter().enumerate() {
            let s = d.scrape();
            *sums.entry(plan(i).0.into()).or_default() +=
                common::metric("gpuwatch_spend_dollars").get(&s).unwrap();
        }
        sums
    };
    let before = direct();
    let spend = by_team(&prom.await_query("team:gpuwatch_spend_dollars:sum", |r| {
        r.len() == TEAMS.len()
    }));
    let after = direct();
    for (team, recorded) in &spend {
        let lag = price_want[team] * 10.0 / 3600.0;
        assert!(
            *recorded <= after[team] + 1e-9 && *recorded >= before[team] - lag,
            "{team}: Prometheus has {recorded}, the daemons {} then {} (at most {lag} behind)",
            before[team],
            after[team]
        );
    }

    // Every query of the fleet dashboard returns data, for every team ("All": `.*`).
    let mut queries = 0;
    for q in dashboards::queries(&root.join("dashboards/gpuwatch-fleet.json")) {
        let expr = dashboards::substitute(&q.expr, &[("team", ".*")]);
        if q.kind == dashboards::Kind::Variable {
            let (selector, label) = dashboards::label_values(&expr).unwrap();
            let teams = prom.try_label_values(selector, label).unwrap();
            assert_eq!(teams.len(), TEAMS.len(), "{:?}: {expr}", q.panel);
            continue;
        }
        let result = prom.await_query(&expr, |r| !r.is_empty());
        assert!(!result.is_empty(), "{}: {:?}: {expr}", q.dashboard, q.panel);
        queries += 1;
    }
    assert!(queries >= 12);
    // Wasted dollars accrue on the teams with idle GPUs.
    let wasted = prom.await_query("team:gpuwatch_gpu_idle_dollars:sum", |r| {
        r.len() == TEAMS.len() && r.iter().all(|s| value(s) > 0.0)
    });
    assert_eq!(wasted.len(), TEAMS.len());
    // The one lost GPU is the ml team's, and only its unhealthy dollars grow.
    let unhealthy_want: BTreeMap<String, f64> = TEAMS
        .iter()
        .map(|t| (t.to_string(), if *t == "ml" { 1.0 } else { 0.0 }))
        .collect();
    let unhealthy = prom.await_query("team:gpuwatch_gpus_unhealthy:sum", |r| {
        by_team(r) == unhealthy_want
    });
    assert_eq!(by_team(&unhealthy), unhealthy_want);
    let priced = prom.await_query("team:gpuwatch_gpu_unhealthy_dollars:sum", |r| {
        let t = by_team(r);
        t.len() == TEAMS.len() && t["ml"] > 0.0
    });
    let priced = by_team(&priced);
    assert_eq!((priced["data"], priced["infra"]), (0.0, 0.0));

    // What the fleet costs.
    let one: Scrape = fleet[0].scrape();
    let series = one.series.len();
    let scrape_time = value(
        &prom.await_query("sum(scrape_duration_seconds{job=\"gpuwatch\"})", |r| {
            !r.is_empty()
        })[0],
    );
    let rss_kib: u64 = fleet
        .iter()
        .map(|d| {
            std::fs::read_to_string(format!("/proc/{}/status", d.pid()))
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap()
        })
        .sum();
    println!(
        "fleet: {NODES} nodes x {GPUS} GPUs; {series} series per node; scrapes take {:.1} ms in all \
         ({:.2} ms per node); gpuwatch resident memory {:.1} MiB in all ({:.1} MiB per node, debug build)",
        scrape_time * 1e3,
        scrape_time * 1e3 / NODES as f64,
        rss_kib as f64 / 1024.0,
        rss_kib as f64 / 1024.0 / NODES as f64,
    );
}

/// Seconds between a node's queries of its team's spend.
const POLL: f64 = 2.0;
/// Team a's limit: a few dollars, which its twelve nodes at $1/h take hours to spend, and the
/// $10,000/h node that joins later a second or two.
const TEAM_A_LIMIT: f64 = 5.0;

/// A node of `team` whose budget is the team's spend, read from the fleet's Prometheus at
/// `prom`, and whose idle rule stops it (in dry-run) once that budget is spent.
fn team_node(
    dir: &Path,
    team: &str,
    prom: std::net::SocketAddr,
    price: f64,
    webhook: std::net::SocketAddr,
) -> String {
    let limit = if team == "a" { TEAM_A_LIMIT } else { 1e9 };
    format!(
        r#"[actions]
state_dir = "{state}"
boot_grace = "0s"
warning = "1s"
webhook_url = "http://{webhook}/node"
[cost]
hourly_price_usd = {price:.1}
[node]
labels = {{ team = "{team}" }}
[[budgets]]
name = "team"
source = "prometheus"
url = "http://{prom}"
query = 'team:gpuwatch_spend_dollars:sum{{team="{team}"}}'
limit_usd = {limit}
thresholds = [0.5, 0.8, 1.0]
poll_interval = "{POLL}s"
timeout = "1s"
[[budgets]]
name = "every-team"
source = "prometheus"
url = "http://{prom}"
query = "team:gpuwatch_spend_dollars:sum"
limit_usd = 1000000
poll_interval = "{POLL}s"
timeout = "1s"
[[rules]]
name = "idle-once-the-team-budget-is-gone"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "1s"
evaluation_periods = 2
action = "stop"
budget = {{ name = "team", spent_at_least = 1.0 }}
"#,
        state = dir.join("state").display(),
    )
}

/// The node's `team` budget in its status: the spent ratio, or why it is unknown.
fn team_budget(d: &Daemon) -> Result<f64, String> {
    let status = d.get("/api/v1/status").json();
    let b = status["cost"]["budgets"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["name"] == "team").cloned())
        .ok_or_else(|| "no budget yet".to_string())?;
    match (b["spent_ratio"].as_f64(), b["unknown"].as_str()) {
        (Some(r), None) => Ok(r),
        (_, Some(why)) => Err(why.to_string()),
        _ => Err(format!("neither known nor unknown: {b}")),
    }
}

/// Polls `cond` on every node until it holds on all of them; fails after `limit`.
fn await_all(
    fleet: &[Daemon],
    limit: std::time::Duration,
    what: &str,
    cond: impl Fn(&Daemon) -> bool,
) {
    let deadline = std::time::Instant::now() + limit;
    for (i, d) in fleet.iter().enumerate() {
        while !cond(d) {
            assert!(
                std::time::Instant::now() < deadline,
                "node {i}: never {what}: {:?}\n{}",
                team_budget(d),
                d.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

const IDLE_RULE: &str = "idle-once-the-team-budget-is-gone";

/// The rule's records in the node's audit log (breach, warning, attempt, result).
/// A body asked for with HTTP/1.0, so that it comes whole, never in chunks (Prometheus and
/// Alertmanager chunk what HTTP/1.1 asks for).
fn whole_body(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn rule_records(d: &Daemon) -> Vec<serde_json::Value> {
    d.audit()
        .into_iter()
        .filter(|r| r["rule"] == IDLE_RULE)
        .collect()
}

#[test]
fn a_team_budget_is_enforced_on_every_node_of_the_team_and_alerts_once() {
    use std::time::{Duration, Instant};
    if common::prometheus::near_a_month_boundary() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    const LIMIT: Duration = Duration::from_secs(90);

    // The webhook that the shipped Alertmanager route sends team budget alerts to, timed for
    // a test (a second, not minutes) and pointed here.
    let webhook = common::receiver::Receiver::start();
    let route = std::fs::read_to_string(root.join("config/alertmanager/gpuwatch.yml"))
        .unwrap()
        .replace(
            "http://127.0.0.1:9095/alerts",
            &format!("http://{}/alerts", webhook.addr),
        )
        .replace("group_wait: 30s", "group_wait: 1s")
        .replace("group_interval: 5m", "group_interval: 1s");
    assert!(route.contains(&webhook.addr.to_string()), "{route}");
    let am = common::alertmanager::Alertmanager::start(&route);

    // Prometheus first, with no targets yet: the nodes need its address.
    let dir = tempfile::tempdir().unwrap();
    let targets = dir.path().join("targets.json");
    std::fs::write(&targets, "[]").unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {fleet}\n  - {alerts}\n\
         alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am}']\n\
         scrape_configs:\n  - job_name: gpuwatch\n    file_sd_configs:\n      - files: ['{targets}']\n",
        fleet = root.join("config/prometheus/fleet.yml").display(),
        alerts = root.join("config/prometheus/alerts.yml").display(),
        am = am.addr,
        targets = targets.display(),
    );
    let mut prom = Prometheus::start(dir, &config);

    // 24 nodes, teams a and b alternately; in each team every other pair of nodes is idle.
    let idle = |i: usize| (i / 2) % 2 == 0;
    let team = |i: usize| if i % 2 == 0 { "a" } else { "b" };
    let mut fleet = Vec::new();
    for i in 0..NODES {
        let util = if idle(i) { 0 } else { 80 };
        let scenario = format!("[[gpu]]\nutilization = {util}\n[[gpu]]\nutilization = {util}\n");
        let dir = tempfile::tempdir().unwrap();
        let config = team_node(dir.path(), team(i), prom.addr, 1.0, webhook.addr);
        fleet.push(Daemon::start_in(dir, &scenario, &config));
    }
    let write_targets = |fleet: &[Daemon]| {
        let t: Vec<String> = fleet.iter().map(|d| d.addr.to_string()).collect();
        std::fs::write(&targets, serde_json::json!([{ "targets": t }]).to_string()).unwrap();
    };
    write_targets(&fleet);

    // Every node reads its team's spend, below its limit; the query over every team gives two
    // series, which is no one budget's spend.
    await_all(&fleet, LIMIT, "knew its team's spend", |d| {
        team_budget(d).is_ok_and(|r| r < 1.0)
    });
    // Awaited, not asserted once: while Prometheus first learns the targets, the rule may
    // give one team's series alone, and a node reads it for a poll.
    await_all(&fleet, LIMIT, "refused two series", |d| {
        let s = d.scrape();
        let refused = common::metric("gpuwatch_budget_query_failures_total")
            .label("budget", "every-team")
            .label("reason", "several_series")
            .get(&s)
            .is_some_and(|n| n >= 1.0);
        let unknown = common::metric("gpuwatch_budget_spent_ratio")
            .label("budget", "every-team")
            .get(&s)
            .is_none();
        refused && unknown
    });
    for d in &fleet {
        common::metric("gpuwatch_budget_info")
            .label("budget", "team")
            .label("source", "prometheus")
            .value(1.0)
            .assert_in(&d.scrape());
    }

    // Prometheus goes away: every node's team spend goes unknown, and nothing tightens.
    prom.stop();
    let stopped = Instant::now();
    await_all(&fleet, LIMIT, "lost its team's spend", |d| {
        team_budget(d).is_err_and(|why| why.contains("cannot ask"))
    });
    println!(
        "team budgets: Prometheus stopped; all {NODES} nodes showed the spend unknown within {:.1} s",
        stopped.elapsed().as_secs_f64()
    );
    let text = common::gpuwatch(&[&"status", &"--url", &format!("http://{}/", fleet[0].addr)]);
    assert!(
        text.contains(
            "Budget team: spend unknown, so no rule tightens on it (limit $5.00): cannot ask"
        ),
        "{text}"
    );
    prom.restart();
    await_all(&fleet, LIMIT, "knew its team's spend again", |d| {
        team_budget(d).is_ok_and(|r| r < 1.0)
    });
    for d in &fleet {
        assert!(rule_records(d).is_empty(), "{:?}", rule_records(d));
    }

    // A $10,000/h node (busy) joins team a: the team's spend crosses its limit in seconds.
    let dir = tempfile::tempdir().unwrap();
    let config = team_node(dir.path(), "a", prom.addr, 10_000.0, webhook.addr);
    fleet.push(Daemon::start_in(
        dir,
        "[[gpu]]\nutilization = 90\n[[gpu]]\nutilization = 90\n",
        &config,
    ));
    write_targets(&fleet);
    prom.await_query("team:gpuwatch_spend_dollars:sum{team=\"a\"}", |r| {
        r.first().is_some_and(|s| value(s) >= TEAM_A_LIMIT)
    });
    let crossed = Instant::now();
    // Every idle node of team a sees it within two poll intervals (and the time a loaded
    // machine adds), and its gated rule acts, with the budget as its evidence.
    let mut seen = Vec::new();
    for (i, d) in fleet.iter().enumerate().filter(|(i, _)| team(*i) == "a") {
        let deadline = crossed + LIMIT;
        while !team_budget(d).is_ok_and(|r| r >= 1.0) {
            assert!(Instant::now() < deadline, "node {i}: {:?}", team_budget(d));
            std::thread::sleep(Duration::from_millis(50));
        }
        seen.push(crossed.elapsed().as_secs_f64());
    }
    let slowest = seen.iter().copied().fold(0.0, f64::max);
    println!(
        "team budgets: team a crossed its limit; its {} nodes saw it within {slowest:.1} s (poll interval {POLL} s)",
        seen.len()
    );
    assert!(slowest <= 2.0 * POLL + 10.0, "{seen:?}");
    for (i, d) in fleet.iter().enumerate().take(NODES) {
        if team(i) == "a" && idle(i) {
            let result = d.await_action(LIMIT, IDLE_RULE);
            assert_eq!(result["result"], "dry_run", "{result}");
            let attempt = common::events(&d.audit(), "action_attempt")[0].clone();
            assert_eq!(attempt["evidence"]["budget"][0], "team", "{attempt}");
            assert!(attempt["evidence"]["budget"][1].as_f64().unwrap() >= 1.0);
        }
    }
    // The busy nodes of team a, and all of team b, have not acted: b is far from its limit.
    for (i, d) in fleet.iter().enumerate().take(NODES) {
        if team(i) == "b" {
            assert!(team_budget(d).is_ok_and(|r| r < 1.0), "node {i}");
        }
        if team(i) == "b" || !idle(i) {
            assert!(
                common::events(&d.audit(), "action_attempt").is_empty(),
                "node {i}: {:?}",
                rule_records(d)
            );
        }
    }

    // A node of team b is killed mid-period: the team's total keeps what it spent.
    let before = value(
        &prom.await_query("team:gpuwatch_spend_dollars:sum{team=\"b\"}", |r| {
            !r.is_empty()
        })[0],
    );
    fleet[1].kill();
    prom.await_query("up{job=\"gpuwatch\"} == 0", |r| r.len() == 1);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        let now = value(
            &prom.await_query("team:gpuwatch_spend_dollars:sum{team=\"b\"}", |r| {
                !r.is_empty()
            })[0],
        );
        assert!(now >= before - 1e-9, "team b fell from {before} to {now}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // The fleet's alerts went through Alertmanager once each: one notification per threshold
    // for team a (of 13 nodes reading it), none for team b; and no node sent its own.
    let deadline = Instant::now() + LIMIT;
    let thresholds = || {
        let mut got: Vec<(String, String)> = webhook
            .bodies("/alerts")
            .iter()
            .flat_map(|b| {
                let v: serde_json::Value = serde_json::from_str(b).unwrap();
                v["alerts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| {
                        (
                            a["labels"]["team"].as_str().unwrap_or("").to_string(),
                            a["labels"]["threshold"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        got.sort();
        got
    };
    let want: Vec<(String, String)> = ["0.5", "0.8", "1"]
        .iter()
        .map(|t| ("a".to_string(), t.to_string()))
        .collect();
    while thresholds() != want {
        assert!(
            Instant::now() < deadline && thresholds().len() <= want.len(),
            "{:?}",
            webhook.bodies("/alerts")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Several more group intervals and Prometheus evaluations bring no repeat: Alertmanager
    // flushes the group again (each flush asks its notification log whether to notify), and
    // Prometheus evaluates the rules again, and still nothing more is sent.
    let notified = webhook.bodies("/alerts").len();
    assert_eq!(notified, 3, "{:?}", webhook.bodies("/alerts"));
    let flushes = || {
        whole_body(am.addr, "/metrics")
            .lines()
            .filter(|l| l.starts_with("alertmanager_nflog_queries_total"))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .sum::<f64>()
    };
    let evaluated = || {
        let rules: serde_json::Value =
            serde_json::from_str(&whole_body(prom.addr, "/api/v1/rules")).unwrap();
        rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["lastEvaluation"].as_str().map(str::to_string))
            .min()
            .unwrap_or_default()
    };
    let flushed = flushes();
    let mut last = evaluated();
    let mut evaluations = 0;
    let deadline = Instant::now() + LIMIT;
    while flushes() < flushed + 3.0 || evaluations < 3 {
        assert!(
            Instant::now() < deadline,
            "Alertmanager or Prometheus stalled"
        );
        let now = evaluated();
        if now != last {
            evaluations += 1;
            last = now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(thresholds(), want, "{:?}", webhook.bodies("/alerts"));
    // Each node of team a still audited the crossing it acts on.
    for (i, d) in fleet.iter().enumerate() {
        let alerts = common::events(&d.audit(), "budget_alert").len();
        assert_eq!(alerts > 0, team(i) == "a", "node {i}: {alerts}");
    }
    // The nodes' webhook had their rules' warnings and actions, and no spend "at 50%".
    let sent = webhook.bodies("/node");
    assert!(sent.iter().any(|b| b.contains(IDLE_RULE)), "{sent:?}");
    assert!(!sent.iter().any(|b| b.contains("spend is at")), "{sent:?}");
}
