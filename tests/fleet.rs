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
