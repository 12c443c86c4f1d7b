//! Team budgets whose spend is read from Prometheus (`source = "prometheus"`), end to end: a
//! fake Prometheus that answers badly in every way a real one (or a proxy before it) can, a
//! real Prometheus behind TLS and basic auth, and a team of two nodes on moto whose shared
//! spend, summed by `config/prometheus/fleet.yml`, opens an idle rule's budget gate.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::aws::{self, Kind};
use common::prometheus::Prometheus;
use common::{events, metric, secs, Daemon, Scrape};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(90);

// ---- a fake Prometheus --------------------------------------------------------------------------

/// One request the fake had: a query (its `X-Test-Mode` header, and the PromQL, decoded), or
/// a webhook's POST (its body).
#[derive(Debug, Clone)]
struct Asked {
    method: String,
    path: String,
    mode: Option<String>,
    query: Option<String>,
    body: String,
}

/// An HTTP server on a loopback port that answers `/api/v1/query` as its `X-Test-Mode` header
/// says, and takes webhook POSTs on any other path. One thread accepts; one thread serves each connection (one request, then close). On
/// drop, every thread is told to stop and joined.
struct FakeProm {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<Asked>>>,
    accept: Option<JoinHandle<()>>,
}

impl FakeProm {
    fn start() -> FakeProm {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let asked: Arc<Mutex<Vec<Asked>>> = Arc::default();
        let (s, a) = (Arc::clone(&stop), Arc::clone(&asked));
        let accept = std::thread::spawn(move || {
            let mut serving: Vec<JoinHandle<()>> = Vec::new();
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (s, a) = (Arc::clone(&s), Arc::clone(&a));
                        serving.push(std::thread::spawn(move || serve(conn, &s, &a)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
                serving.retain(|t| !t.is_finished());
            }
            for t in serving {
                let _ = t.join();
            }
        });
        FakeProm {
            addr,
            stop,
            asked,
            accept: Some(accept),
        }
    }

    fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}

impl Drop for FakeProm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Sleeps `d` in small steps; false if told to stop meanwhile.
fn pause(d: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// `%XX` and `+` decoded, as a query string carries them.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or(""), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn now() -> f64 {
    gpuwatch::time::now()
}

/// A successful instant query's answer: a vector with these (team, value) series at `at`.
fn vector(series: &[(&str, &str)], at: f64) -> String {
    let result: Vec<Value> = series
        .iter()
        .map(|(team, v)| serde_json::json!({"metric": {"team": team}, "value": [at, v]}))
        .collect();
    serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
        .to_string()
}

/// A good answer padded with whitespace (still valid JSON) to `size` bytes: were the size not
/// refused, it would read as a spend of 150.
fn padded(size: usize) -> String {
    let body = vector(&[("ml", "150")], now());
    format!("{{{}{}", " ".repeat(size - body.len()), &body[1..])
}

fn head(status: &str, content_type: &str, length: Option<usize>) -> String {
    let length = length.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{length}Connection: close\r\n\r\n"
    )
}

fn answer(conn: &mut TcpStream, status: &str, content_type: &str, body: &str) {
    let _ = conn.write_all(head(status, content_type, Some(body.len())).as_bytes());
    let _ = conn.write_all(body.as_bytes());
}

const JSON: &str = "application/json";
const OK: &str = "200 OK";

/// Serves one request on `conn`, as its `X-Test-Mode` header asks.
fn serve(mut conn: TcpStream, stop: &AtomicBool, asked: &Mutex<Vec<Asked>>) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let method = request_line.split(' ').next().unwrap_or("").to_string();
    let target = request_line.split(' ').nth(1).unwrap_or("");
    let mut body = vec![
        0;
        headers
            .get("content-length")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    ];
    if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
        return;
    }
    let query = target
        .split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|p| p.strip_prefix("query=")))
        .map(decode);
    let mode = headers.get("x-test-mode").cloned();
    asked.lock().unwrap().push(Asked {
        method: method.clone(),
        path: target.split('?').next().unwrap_or("").to_string(),
        mode: mode.clone(),
        query: query.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    if method == "POST" {
        return answer(&mut conn, OK, "text/plain", "ok");
    }
    if !target.starts_with("/api/v1/query?") {
        return answer(&mut conn, "404 Not Found", "text/plain", "not found");
    }
    let forecast = query.as_deref().unwrap_or("").contains("forecast");
    let spend = if forecast { "180" } else { "150" };
    match mode.as_deref().unwrap_or("") {
        // Half spent; its forecast query fails.
        "half" if forecast => answer(&mut conn, "503 Service Unavailable", "text/plain", "down"),
        "half" => answer(&mut conn, OK, JSON, &vector(&[("ml", "50")], now())),
        "good" => answer(&mut conn, OK, JSON, &vector(&[("ml", spend)], now())),
        // A good answer, but 3 s late: the budget's timeout is 300 ms.
        "slow" => {
            if pause(Duration::from_secs(3), stop) {
                answer(&mut conn, OK, JSON, &vector(&[("ml", "150")], now()));
            }
        }
        // The head at once, then the body a byte every 100 ms.
        "trickle" => {
            let body = vector(&[("ml", "150")], now());
            let _ = conn.write_all(head(OK, JSON, Some(body.len())).as_bytes());
            for b in body.as_bytes() {
                if conn.write_all(&[*b]).is_err() || !pause(Duration::from_millis(100), stop) {
                    return;
                }
            }
        }
        "garbage" => answer(&mut conn, OK, "text/html", "<html>not json"),
        "empty" => answer(&mut conn, OK, JSON, &vector(&[], now())),
        "two" => answer(
            &mut conn,
            OK,
            JSON,
            &vector(&[("ml", "150"), ("cv", "20")], now()),
        ),
        "nan" => answer(&mut conn, OK, JSON, &vector(&[("ml", "NaN")], now())),
        "negative" => answer(&mut conn, OK, JSON, &vector(&[("ml", "-5")], now())),
        "vast" => answer(&mut conn, OK, JSON, &vector(&[("ml", "1e308")], now())),
        "error" => answer(
            &mut conn,
            "503 Service Unavailable",
            JSON,
            r#"{"status":"error","errorType":"unavailable","error":"the store is down for a test"}"#,
        ),
        "stale" => answer(
            &mut conn,
            OK,
            JSON,
            &vector(&[("ml", "150")], now() - 3600.0),
        ),
        // 300 KiB, its length declared.
        "huge" => answer(&mut conn, OK, JSON, &padded(300 << 10)),
        // 300 KiB, no length declared: read until the connection closes.
        "huge-stream" => {
            let body = padded(300 << 10);
            let _ = conn.write_all(head(OK, JSON, None).as_bytes());
            for piece in body.as_bytes().chunks(16 << 10) {
                if conn.write_all(piece).is_err() {
                    return;
                }
            }
        }
        _ => answer(&mut conn, "400 Bad Request", "text/plain", "no X-Test-Mode"),
    }
}

// ---- helpers ------------------------------------------------------------------------------------

fn ratio(s: &Scrape, budget: &str) -> Option<f64> {
    metric("gpuwatch_budget_spent_ratio")
        .label("budget", budget)
        .get(s)
}

/// The failure counters of one budget, by reason.
fn failures(s: &Scrape, budget: &str) -> BTreeMap<String, f64> {
    s.named("gpuwatch_budget_query_failures_total")
        .into_iter()
        .filter(|x| x.labels.get("budget").map(String::as_str) == Some(budget))
        .map(|x| (x.labels["reason"].clone(), x.value))
        .collect()
}

/// The budget's entry in `/api/v1/status`.
fn budget_status(d: &Daemon, budget: &str) -> Value {
    let status = d.get("/api/v1/status").json();
    status["cost"]["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == budget)
        .cloned()
        .unwrap_or_else(|| panic!("no budget {budget} in {status}"))
}

/// Audit records of these kinds about rule `rule`.
fn rule_records<'a>(audit: &'a [Value], rule: &str) -> Vec<&'a Value> {
    audit
        .iter()
        .filter(|r| r["rule"] == rule)
        .filter(|r| {
            [
                "breach",
                "warning",
                "postponed",
                "action_attempt",
                "action_result",
            ]
            .contains(&r["event"].as_str().unwrap_or(""))
        })
        .collect()
}

/// A rule on idle GPUs (1 s periods, two of them), gated on `budget` being fully spent.
fn gated_rule(name: &str, budget: &str, action: &str) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"{action}\"\n\
         budget = {{ name = \"{budget}\", spent_at_least = 1.0 }}\n"
    )
}

/// `gpuwatch status --url`: what it printed.
fn status_text(d: &Daemon) -> String {
    let out = std::process::Command::new(common::BIN)
        .args(["status", "--url", &format!("http://{}/", d.addr)])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const IDLE2: &str = "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n";
const BUSY2: &str = "[[gpu]]\nutilization = 80\n[[gpu]]\nutilization = 90\n";

/// Whether `text` has one of the `|`-separated `words`.
fn says(text: &str, words: &str) -> bool {
    words.split('|').any(|w| text.contains(w))
}

// ---- 1: bad answers -----------------------------------------------------------------------------

/// Each bad mode of the fake, the failure reason it must be counted under, and words of the
/// reason the status gives (one of them, where `|` separates them).
const BAD: &[(&str, &str, &str)] = &[
    // reqwest's own timeout, or the one around the whole exchange, whichever fires first.
    (
        "slow",
        "timeout",
        "did not answer within 300ms|operation timed out",
    ),
    (
        "trickle",
        "timeout",
        "did not answer within 300ms|operation timed out",
    ),
    ("garbage", "malformed", "is not JSON"),
    ("empty", "empty", "matched no series"),
    ("two", "several_series", "gave 2 series, not one"),
    ("nan", "not_finite", "gave NaN, not a finite amount"),
    ("negative", "negative", "gave -5, a negative amount"),
    (
        "error",
        "http_status",
        "answered 503 Service Unavailable: the store is down for a test",
    ),
    ("stale", "stale", "more than two poll intervals behind"),
    ("huge", "too_large", "answered more than 256 KiB"),
    ("huge-stream", "too_large", "answered more than 256 KiB"),
    // Finite, but no spend: a wrong query, said as an amount a person can read.
    (
        "vast",
        "implausible",
        "gave $1.000e308, more than 10 times the limit",
    ),
];

#[test]
fn bad_answers_leave_the_spend_unknown_and_nothing_stalls() {
    if common::prometheus::near_a_month_boundary() {
        return;
    }
    let fake = FakeProm::start();
    let dir = tempfile::tempdir().unwrap();
    let mut config = format!(
        "[sampling]\ninterval = \"100ms\"\ntimeout = \"1s\"\n\
         [actions]\nstate_dir = \"{}\"\nmode = \"dry-run\"\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\n\
         webhook_url = \"http://{}/hook\"\n[cost]\nhourly_price_usd = 1.0\n",
        dir.path().join("state").display(),
        fake.addr
    );
    let modes: Vec<&str> = BAD.iter().map(|b| b.0).chain(["half", "good"]).collect();
    for mode in &modes {
        let forecast = if ["good", "half"].contains(mode) {
            format!("forecast_query = 'team:gpuwatch_spend_forecast_dollars:month{{team=\"{mode}\"}}'\n")
        } else {
            String::new()
        };
        // Only the slow answers are timed out: the others have time to spare on a loaded
        // machine, so that each fails for its own reason alone.
        let (poll, timeout) = if ["slow", "trickle"].contains(mode) {
            ("1s", "300ms")
        } else {
            ("2s", "1500ms")
        };
        config.push_str(&format!(
            "[[budgets]]\nname = \"team-{mode}\"\nsource = \"prometheus\"\nurl = \"http://{addr}/\"\n\
             query = 'team:gpuwatch_spend_dollars:sum{{team=\"{mode}\"}}'\n{forecast}\
             limit_usd = 100\nthresholds = [0.5, 0.8, 1.0]\npoll_interval = \"{poll}\"\ntimeout = \"{timeout}\"\n\
             headers = {{ \"X-Test-Mode\" = \"{mode}\", \"X-Scope-OrgID\" = \"team-{mode}\" }}\n",
            addr = fake.addr
        ));
    }
    for mode in &modes {
        config.push_str(&gated_rule(
            &format!("gated-{mode}"),
            &format!("team-{mode}"),
            "alert",
        ));
    }
    let d = Daemon::start_in(dir, IDLE2, &config);

    // Every bad budget has failed for its reason, the good one is known, and its rule acted.
    d.await_scrape(LIMIT, |s| {
        BAD.iter().all(|(mode, reason, _)| {
            failures(s, &format!("team-{mode}"))
                .get(*reason)
                .is_some_and(|n| *n >= 1.0)
        }) && ratio(s, "team-good") == Some(1.5)
            && ratio(s, "team-half") == Some(0.5)
    });
    let acted = d.await_action(LIMIT, "gated-good");
    assert_eq!(acted["result"], "done", "{acted}");
    assert_eq!(acted["action"], "alert", "{acted}");
    let s = d.scrape();

    // The good budget: 150 of 100 spent, 180 forecast, no failures; its alerts are audited.
    metric("gpuwatch_budget_spent_ratio")
        .label("budget", "team-good")
        .value(1.5)
        .assert_in(&s);
    metric("gpuwatch_budget_forecast_ratio")
        .label("budget", "team-good")
        .value(1.8)
        .assert_in(&s);
    assert_eq!(failures(&s, "team-good"), BTreeMap::new(), "{}", s.text);
    let good = budget_status(&d, "team-good");
    assert_eq!(good["spent_ratio"], 1.5, "{good}");
    assert_eq!(good["forecast_ratio"], 1.8, "{good}");
    assert_eq!(good["limit_usd"], 100.0, "{good}");
    assert!(good.get("unknown").is_none(), "{good}");

    // Half spent, its forecast failing: the spend is known without a forecast, and a gate at
    // the full limit stays shut.
    metric("gpuwatch_budget_forecast_ratio")
        .label("budget", "team-half")
        .absent()
        .assert_in(&s);
    let half = budget_status(&d, "team-half");
    assert_eq!(half["spent_ratio"], 0.5, "{half}");
    assert!(
        half["forecast_ratio"].is_null() && half.get("unknown").is_none(),
        "{half}"
    );

    // Each bad budget: unknown, for its reason only, with its limit but no ratio.
    for (mode, reason, words) in BAD {
        let name = format!("team-{mode}");
        let f = failures(&s, &name);
        assert_eq!(
            f.keys().map(String::as_str).collect::<Vec<_>>(),
            [*reason],
            "{name}: {f:?}"
        );
        assert!(ratio(&s, &name).is_none(), "{name}:\n{}", s.text);
        metric("gpuwatch_budget_forecast_ratio")
            .label("budget", &name)
            .absent()
            .assert_in(&s);
        metric("gpuwatch_budget_limit_dollars")
            .label("budget", &name)
            .value(100.0)
            .assert_in(&s);
        let b = budget_status(&d, &name);
        let why = b["unknown"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} is not unknown: {b}"));
        println!("{name}: {why}");
        assert!(says(why, words), "{name}: {why}");
        assert!(why.contains(&fake.addr.to_string()), "{name}: {why}");
        assert!(b["spent_ratio"].is_null(), "{b}");
        assert_eq!(b["limit_usd"], 100.0, "{b}");
        assert_eq!(
            b["thresholds"],
            serde_json::json!([0.5, 0.8, 1.0]),
            "{name}: {b}"
        );
    }
    for mode in &modes {
        metric("gpuwatch_budget_info")
            .label("budget", format!("team-{mode}"))
            .label("source", "prometheus")
            .value(1.0)
            .assert_in(&s);
    }

    // No rule gated on an unknown budget breached, warned or acted; only the good budget
    // crossed its thresholds (logged and audited, not sent: notify is off by default).
    let audit = d.audit();
    for mode in BAD.iter().map(|b| b.0).chain(["half"]) {
        let records = rule_records(&audit, &format!("gated-{mode}"));
        assert!(records.is_empty(), "gated-{mode}: {records:?}");
    }
    let kinds: Vec<&str> = rule_records(&audit, "gated-good")
        .iter()
        .map(|r| r["event"].as_str().unwrap())
        .collect();
    // (It alerts again a few seconds later while the GPUs stay idle: only the first round.)
    assert_eq!(
        kinds[..4],
        ["breach", "warning", "action_attempt", "action_result"],
        "{audit:?}"
    );
    let attempt = events(&audit, "action_attempt")[0];
    assert_eq!(attempt["evidence"]["budget"][0], "team-good", "{attempt}");
    assert_eq!(attempt["evidence"]["budget"][1], 1.5, "{attempt}");
    // Each threshold crossed once on the spend (150 of 100) and once on the forecast (180).
    let alerts: Vec<(String, String, f64, f64)> = events(&audit, "budget_alert")
        .iter()
        .map(|r| {
            (
                r["budget"].as_str().unwrap().to_string(),
                r["basis"].as_str().unwrap().to_string(),
                r["threshold"].as_f64().unwrap(),
                r["ratio"].as_f64().unwrap(),
            )
        })
        .collect();
    // The half-spent budget crossed 0.5 on its spend alone (any order between the budgets).
    let mut want: Vec<(String, String, f64, f64)> = [("actual", 1.5), ("forecast", 1.8)]
        .iter()
        .flat_map(|(basis, ratio)| {
            [0.5, 0.8, 1.0]
                .iter()
                .map(|t| ("team-good".to_string(), basis.to_string(), *t, *ratio))
        })
        .collect();
    want.push(("team-half".into(), "actual".into(), 0.5, 0.5));
    let mut alerts = alerts;
    let key = |a: &(String, String, f64, f64)| (a.0.clone(), a.1.clone(), (a.2 * 10.0) as i64);
    alerts.sort_by_key(key);
    want.sort_by_key(key);
    assert_eq!(alerts, want, "{audit:?}");

    // The webhook had the rule's alert, and none of the budget alerts: a team budget's
    // alerts are the fleet's (Alertmanager), unless it says notify = true.
    let alerted = "gpuwatch: rule \"gated-good\" breached: GPUs idle";
    let hooks = || -> Vec<String> {
        fake.asked()
            .iter()
            .filter(|a| a.method == "POST")
            .map(|a| {
                assert_eq!(a.path, "/hook");
                serde_json::from_str::<Value>(&a.body).unwrap()["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    d.await_sample(LIMIT, |_| hooks().iter().any(|h| h == alerted));
    // The rule's warnings and alerts (it alerts again while the GPUs stay idle); none of the
    // budget alerts, though they were audited first.
    let hooks = hooks();
    let warned = |h: &String| {
        h.contains("this instance will alert at") && h.contains("(rule \"gated-good\", dry-run)")
    };
    assert!(hooks.iter().any(warned), "{hooks:?}");
    assert!(hooks.iter().all(|h| h == alerted || warned(h)), "{hooks:?}");

    // `gpuwatch status` says why each unknown spend is unknown.
    let text = status_text(&d);
    for (mode, _, words) in BAD {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("Budget team-{mode}: ")))
            .unwrap_or_else(|| panic!("no line for team-{mode}:\n{text}"));
        assert!(
            line.starts_with(&format!(
                "Budget team-{mode}: spend unknown, so no rule tightens on it (limit $100.00): "
            )) && says(line, words),
            "{line}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("Budget team-good: ") && !l.contains("spend unknown")),
        "{text}"
    );

    // Scrapes stay fast and samples keep coming while the slow and trickling answers hang.
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let t = Instant::now();
        let r = d.get("/metrics");
        assert_eq!(r.status, 200);
        slowest = slowest.max(t.elapsed());
    }
    let first = d.snapshot_after(0);
    let seq = first["seq"].as_u64().unwrap();
    let t = Instant::now();
    let later = d.await_sample(Duration::from_secs(20), |x| {
        x["seq"].as_u64().unwrap() >= seq + 20
    });
    let took = t.elapsed();
    let span = later["timestamp"].as_f64().unwrap() - first["timestamp"].as_f64().unwrap();
    println!(
        "slowest of 10 scrapes: {:.1} ms; 20 samples (100 ms interval) came in {:.2} s, spanning {span:.2} s of sample time",
        slowest.as_secs_f64() * 1e3,
        took.as_secs_f64()
    );
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(span > 1.0, "{span}");

    // Every query carried its budget's headers and query (the headers name the mode).
    let asked = fake.asked();
    let queries: Vec<&Asked> = asked.iter().filter(|a| a.method == "GET").collect();
    for mode in &modes {
        let mine: Vec<&&Asked> = queries
            .iter()
            .filter(|a| a.mode.as_deref() == Some(mode))
            .collect();
        assert!(!mine.is_empty(), "{mode} was never asked");
        assert!(
            mine.iter().all(|a| {
                let q = a.query.as_deref().unwrap_or("");
                q == format!("team:gpuwatch_spend_dollars:sum{{team=\"{mode}\"}}")
                    || (["good", "half"].contains(mode)
                        && q == format!(
                            "team:gpuwatch_spend_forecast_dollars:month{{team=\"{mode}\"}}"
                        ))
            }),
            "{mode}: {mine:?}"
        );
    }
    assert!(
        queries
            .iter()
            .all(|a| a.mode.is_some() && a.path == "/api/v1/query"),
        "a query without its header: {queries:?}"
    );
    drop(d);
    let t = Instant::now();
    drop(fake);
    println!(
        "the fake Prometheus stopped in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
}

// ---- 2: TLS and basic auth ----------------------------------------------------------------------

#[test]
fn over_tls_with_basic_auth() {
    if common::prometheus::near_a_month_boundary() {
        return;
    }
    const PASSWORD: &str = "budget-pass-7d1f";
    const WRONG: &str = "not-the-pass-93c2";
    let prom_dir = tempfile::tempdir().unwrap();
    let ca = common::certs::Ca::new("gpuwatch budget test CA");
    let ca_pem = ca.write(prom_dir.path(), "ca.pem");
    let server = ca.issue(prom_dir.path(), "server", false, false);
    let hash = bcrypt::hash(PASSWORD, 4).unwrap();
    let web = prom_dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  gpuwatch: {hash}\n",
            server.cert.display(),
            server.key.display()
        ),
    )
    .unwrap();
    let prom = Prometheus::start_with_args(
        prom_dir,
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs: []\n",
        &[format!("--web.config.file={}", web.display())],
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&ca_pem, dir.path().join("ca.pem")).unwrap();
    std::fs::write(dir.path().join("pw"), format!("{PASSWORD}\n")).unwrap();
    std::fs::write(dir.path().join("wrong-pw"), WRONG).unwrap();
    let budget = |name: &str, extra: &str| {
        format!(
            "[[budgets]]\nname = \"{name}\"\nsource = \"prometheus\"\nurl = \"https://{}\"\n\
             query = 'vector(42)'\nlimit_usd = 100\npoll_interval = \"1s\"\ntimeout = \"800ms\"\n{extra}",
            prom.addr
        )
    };
    let config = format!(
        "[sampling]\ninterval = \"100ms\"\ntimeout = \"1s\"\n[actions]\nstate_dir = \"{}\"\n{}{}{}",
        dir.path().join("state").display(),
        budget(
            "right",
            "ca_file = \"ca.pem\"\nusername = \"gpuwatch\"\npassword_file = \"pw\"\n"
        ),
        budget(
            "wrong-password",
            "ca_file = \"ca.pem\"\nusername = \"gpuwatch\"\npassword_file = \"wrong-pw\"\n"
        ),
        budget(
            "public-roots",
            "username = \"gpuwatch\"\npassword_file = \"pw\"\n"
        ),
    );
    let d = Daemon::start_in(dir, BUSY2, &config);

    // Prometheus takes a few seconds to start: unreachable until then. Each budget polls on
    // its own, so the public-roots budget may still hold the refused connection of a poll from
    // before Prometheus listened when the others already have their answers: wait for its
    // certificate failure too,
    // and the status (filled in by the decision loop's next step) for the other's 401.
    let s = d.await_scrape(LIMIT, |s| {
        ratio(s, "right").is_some()
            && failures(s, "wrong-password").contains_key("http_status")
            && failures(s, "public-roots").contains_key("unreachable")
            && budget_status(&d, "public-roots")["unknown"]
                .as_str()
                .is_some_and(|why| why.to_ascii_lowercase().contains("certificate"))
            && budget_status(&d, "wrong-password")["unknown"]
                .as_str()
                .is_some_and(|why| why.contains("answered 401"))
    });
    metric("gpuwatch_budget_spent_ratio")
        .label("budget", "right")
        .value(0.42)
        .assert_in(&s);
    assert_eq!(budget_status(&d, "right")["spent_ratio"], 0.42);

    // The setup holds: Prometheus wants the password (a check that it is not open to all).
    let q = "/api/v1/query?query=vector(42)";
    let open = common::certs::tls_get(prom.addr, q, &ca_pem, None, None);
    assert_eq!(open.status, Some(401), "{:?}", open.error);
    let ok = common::certs::tls_get(prom.addr, q, &ca_pem, None, Some(("gpuwatch", PASSWORD)));
    assert_eq!(ok.status, Some(200), "{:?}", ok.error);

    let wrong = budget_status(&d, "wrong-password");
    let why = wrong["unknown"]
        .as_str()
        .unwrap_or_else(|| panic!("{wrong}"));
    println!("wrong-password: {why}");
    assert!(why.contains("answered 401 Unauthorized"), "{why}");
    assert!(ratio(&s, "wrong-password").is_none());

    let public = budget_status(&d, "public-roots");
    let why = public["unknown"]
        .as_str()
        .unwrap_or_else(|| panic!("{public}"));
    println!("public-roots: {why}");
    assert!(why.to_ascii_lowercase().contains("certificate"), "{why}");
    assert!(ratio(&s, "public-roots").is_none());
    // Once Prometheus was up, the public-roots budget failed on the certificate alone (its
    // password was never sent, so it never saw a 401).
    assert!(
        !failures(&s, "public-roots").contains_key("http_status"),
        "{}",
        s.text
    );

    // The passwords are never logged.
    let log = d.log();
    assert!(!log.contains(PASSWORD) && !log.contains(WRONG), "{log}");
    let audit = std::fs::read_to_string(d.dir.path().join("state/audit.jsonl")).unwrap_or_default();
    assert!(!audit.contains(PASSWORD) && !audit.contains(WRONG));
}

// ---- 3: a team's budget, enforced ---------------------------------------------------------------

/// The team's limit: two nodes at $10,000/h spend $5.56 a second, so it is crossed some 11 s
/// after they start.
const TEAM_LIMIT: f64 = 60.0;
const PRICE: f64 = 10_000.0;

#[test]
fn with_enforcement_the_teams_idle_node_is_stopped_and_its_busy_node_is_not() {
    if common::prometheus::near_a_month_boundary() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Prometheus first, its targets in a file (the daemons' ports are theirs to choose), so
    // that the daemons can be told where it is.
    let prom_dir = tempfile::tempdir().unwrap();
    let targets = prom_dir.path().join("targets.json");
    std::fs::write(&targets, "[]").unwrap();
    let prom_config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: gpuwatch\n    file_sd_configs:\n      - files: ['{targets}']\n        refresh_interval: 1s\n",
        rules = root.join("config/prometheus/fleet.yml").display(),
        targets = targets.display(),
    );
    let prom = Prometheus::start(prom_dir, &prom_config);

    let team = format!(
        "[cost]\nhourly_price_usd = {PRICE:.1}\n[node]\nlabels = {{ team = \"a\" }}\n\
         [[budgets]]\nname = \"team-a\"\nsource = \"prometheus\"\nurl = \"http://{}\"\n\
         query = 'team:gpuwatch_spend_dollars:sum{{team=\"a\"}}'\nlimit_usd = {TEAM_LIMIT:.1}\n\
         thresholds = [1.0]\npoll_interval = \"1s\"\ntimeout = \"500ms\"\n{}",
        prom.addr,
        gated_rule("idle-over-budget", "team-a", "stop"),
    );
    let start = |scenario: &str| {
        let inst = aws::launch(Kind::OnDemand);
        let imds = aws::imds(&inst.id, "on-demand");
        let dir = tempfile::tempdir().unwrap();
        let config = aws::daemon_config(
            dir.path(),
            &imds,
            aws::moto().addr,
            "mode = \"enforce\"\nwarning = \"1s\"",
            &team,
        );
        let d = Daemon::start_scenario(dir, scenario, &config);
        (inst, imds, d)
    };
    let (idle_inst, _idle_imds, idle) = start(IDLE2);
    let (busy_inst, _busy_imds, busy) = start(BUSY2);
    let started = now();
    let tmp = targets.with_extension("tmp");
    std::fs::write(
        &tmp,
        serde_json::json!([{ "targets": [idle.addr.to_string(), busy.addr.to_string()] }])
            .to_string(),
    )
    .unwrap();
    std::fs::rename(&tmp, &targets).unwrap();

    // The idle node: its rule waits for the team's spend to reach the limit, then stops it.
    let first_full = std::cell::Cell::new(None::<f64>);
    let under_limit_seen = std::cell::Cell::new(false);
    idle.await_scrape(Duration::from_secs(120), |s| {
        match ratio(s, "team-a") {
            Some(r) if r >= 1.0 && first_full.get().is_none() => first_full.set(Some(now())),
            Some(r) if r < 1.0 => under_limit_seen.set(true),
            _ => {}
        }
        aws::actions(s, "stop", "done") == 1.0
    });
    let acted_at = now();
    idle.await_sample(Duration::from_secs(30), |_| {
        aws::instance_state(&idle_inst.id) == "stopped"
    });
    assert_eq!(aws::instance_state(&idle_inst.id), "stopped");
    assert!(
        under_limit_seen.get(),
        "the node never saw the team under its limit"
    );

    // When Prometheus first had the team at its limit: the raw samples of the recorded series.
    let recorded = prom
        .try_query("team:gpuwatch_spend_dollars:sum{team=\"a\"}[10m]", None)
        .unwrap();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let samples: Vec<(f64, f64)> = recorded[0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_f64().unwrap(),
                p[1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    let crossed = samples
        .iter()
        .find(|(_, v)| *v >= TEAM_LIMIT)
        .map(|(t, _)| *t)
        .unwrap_or_else(|| panic!("Prometheus never had the team at its limit: {samples:?}"));

    let audit = idle.audit();
    let attempt = events(&audit, "action_attempt")
        .into_iter()
        .find(|r| r["rule"] == "idle-over-budget")
        .unwrap_or_else(|| panic!("{audit:?}"));
    assert_eq!(attempt["action"], "stop", "{attempt}");
    assert_eq!(attempt["mode"], "enforce", "{attempt}");
    assert_eq!(attempt["evidence"]["budget"][0], "team-a", "{attempt}");
    let seen = attempt["evidence"]["budget"][1].as_f64().unwrap();
    assert!(seen >= 1.0, "the ratio in the evidence: {seen}");
    let result = events(&audit, "action_result")[0];
    assert_eq!(result["result"], "done", "{result}");
    // Nothing breached before the team's spend was at its limit, as Prometheus saw it.
    for r in rule_records(&audit, "idle-over-budget") {
        if let Some(at) = r["at"].as_f64() {
            assert!(at >= crossed, "{r} before the crossing at {crossed}");
        }
    }
    // The sample it was decided on (`time` is to the second only).
    let attempted = attempt["at"].as_f64().unwrap();
    assert!(
        (secs(&attempt["time"]) - attempted).abs() < 1.5,
        "{attempt}"
    );
    assert!(attempted >= crossed, "{attempted} < {crossed}");
    let alert = events(&audit, "budget_alert");
    assert_eq!(alert.len(), 1, "{audit:?}");
    assert_eq!(alert[0]["budget"], "team-a");
    assert_eq!(alert[0]["threshold"], 1.0);
    println!(
        "the team crossed ${TEAM_LIMIT} {:.1} s after the nodes started (as Prometheus recorded it); \
         the idle node's ratio was first seen >= 1 {:.1} s after that; its stop was attempted {:.1} s \
         after the crossing and done (seen) {:.1} s after it",
        crossed - started,
        first_full.get().map_or(f64::NAN, |t| t - crossed),
        attempted - crossed,
        acted_at - crossed,
    );

    // The busy node: the same team figure opens its gate too, but busy GPUs never breach.
    let s = busy.await_scrape(Duration::from_secs(60), |s| {
        ratio(s, "team-a").is_some_and(|r| r >= 1.0)
    });
    assert!(ratio(&s, "team-a").unwrap() >= 1.0);
    // Longer than the rule's periods and warning after its gate opened.
    busy.await_time(now() + 4.0);
    let busy_audit = busy.audit();
    let records = rule_records(&busy_audit, "idle-over-budget");
    assert!(records.is_empty(), "{records:?}");
    assert!(events(&busy_audit, "action_attempt").is_empty());
    assert_eq!(
        events(&busy_audit, "budget_alert").len(),
        1,
        "{busy_audit:?}"
    );
    assert_eq!(aws::instance_state(&busy_inst.id), "running");
    assert_eq!(aws::actions(&busy.scrape(), "stop", "done"), 0.0);

    // Prometheus sees one team budget, at its limit or past it, through both nodes.
    let limit = prom.await_query("team_budget:gpuwatch_budget_limit_dollars:max", |r| {
        !r.is_empty()
    });
    assert_eq!(limit.len(), 1, "{limit:?}");
    assert_eq!(limit[0]["metric"]["team"], "a");
    assert_eq!(limit[0]["metric"]["budget"], "team-a");
    assert_eq!(limit[0]["value"][1], "60");
    let nodes: BTreeSet<String> = prom
        .await_query("gpuwatch_budget_info{source=\"prometheus\"}", |r| {
            r.len() == 2
        })
        .iter()
        .map(|x| x["metric"]["instance"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 2);
}
