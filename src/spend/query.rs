//! Team budgets whose spend is read from the fleet's Prometheus: one poller per budget, off the
//! decision loop, asking `/api/v1/query` every `poll_interval` (with jitter, so that a fleet
//! does not ask in step). An answer counts only if it is exactly one finite, non-negative
//! sample, fresh, and not from the first minutes of a period. Anything else is an unknown
//! spend, with its reason: counted, logged once per kind, and shown in the status. Unknown is
//! never exhausted: it tightens no rule.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::config::{BudgetConfig, BudgetSource, PrometheusSource, QueryAuth};
use crate::cost::budget::Reading;
use crate::metrics::encode::*;
use crate::metrics::Text;

/// The largest answer read. One sample is a few hundred bytes; a query that matches thousands
/// of series is refused here rather than parsed.
pub const MAX_ANSWER_BYTES: usize = 256 << 10;

/// Answers from this long after a period began are not trusted: the fleet's figure for the new
/// period settles once every node has been scraped in it and the rules have run.
pub const SETTLE_SECONDS: f64 = 300.0;

/// The most a sample may be timed ahead of this node's clock, in seconds.
pub const MAX_SKEW: f64 = 60.0;

/// A spend more than this many times the limit is taken for a wrong query (a sum over the
/// wrong labels, a price typed in cents) rather than acted on: unknown, not exhausted.
pub const IMPLAUSIBLE: f64 = 10.0;

fn settling() -> String {
    format!(
        "the budget period began less than {SETTLE_SECONDS:.0}s ago; the fleet's spend for it settles first"
    )
}

/// A sample the query answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// USD spent this period.
    pub spent: f64,
    pub forecast: Option<f64>,
    /// The sample's timestamp (Unix seconds).
    pub at: f64,
    /// Why there is no forecast, where a `forecast_query` gave none.
    pub forecast_unknown: Option<Unknown>,
}

/// Why a budget's spend is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// A fixed word, for the failure counter's `reason` label.
    pub reason: &'static str,
    /// In words, for the log and the status. Never holds a secret.
    pub detail: String,
}

impl Unknown {
    pub fn new(reason: &'static str, detail: impl Into<String>) -> Unknown {
        Unknown {
            reason,
            detail: detail.into(),
        }
    }
}

/// What the pollers last learnt of one budget.
#[derive(Debug, Clone, Default)]
struct Known {
    last: Option<Result<Answer, Unknown>>,
    /// Failed queries by reason, since start.
    failures: BTreeMap<&'static str, u64>,
}

/// The pollers' readings, shared with the decision loop and the metrics.
#[derive(Debug, Default)]
pub struct QueryReadings(Mutex<BTreeMap<String, Known>>);

impl QueryReadings {
    pub fn record(&self, budget: &str, result: Result<Answer, Unknown>) {
        if let Ok(mut m) = self.0.lock() {
            let k = m.entry(budget.to_string()).or_default();
            if let Err(u) = &result {
                *k.failures.entry(u.reason).or_default() += 1;
            }
            k.last = Some(result);
        }
    }

    /// The budget's reading at `now`, or why there is none: an answer older than two poll
    /// intervals is stale, whatever the poller is doing.
    pub fn reading(&self, b: &BudgetConfig, now: f64) -> Result<Reading, String> {
        let BudgetSource::Prometheus(q) = &b.source else {
            return Err("not a prometheus budget".into());
        };
        let last = self
            .0
            .lock()
            .ok()
            .and_then(|m| m.get(&b.name).and_then(|k| k.last.clone()));
        let a = match last {
            None => return Err(format!("{} has not answered yet", q.url)),
            Some(Err(u)) => return Err(u.detail),
            Some(Ok(a)) => a,
        };
        let age = now - a.at;
        let most = 2.0 * b.poll_interval.as_secs_f64();
        if age > most {
            return Err(format!(
                "the last answer from {} is {age:.0}s old, more than two poll intervals",
                q.url
            ));
        }
        if age < -MAX_SKEW {
            return Err(format!(
                "the last answer from {} is timed {:.0}s ahead of this node's clock; are the clocks apart?",
                q.url, -age
            ));
        }
        // The period is this node's: an answer from the end of the last one is no reading in
        // this one, nor is any answer from the first minutes of a period.
        let start = q.period.start(now);
        if q.period.start(a.at) != start {
            return Err(format!(
                "the last answer from {} is from the previous budget period",
                q.url
            ));
        }
        if now - start < SETTLE_SECONDS {
            return Err(settling());
        }
        let limit = b.limit_usd.unwrap_or(0.0);
        if let Err(u) = plausible(&q.url, a.spent, limit) {
            return Err(u.detail);
        }
        Ok(Reading {
            spent: a.spent,
            // A forecast as implausible as such a spend is unknown, not a crossing.
            forecast: a.forecast.filter(|f| *f <= IMPLAUSIBLE * limit),
            limit,
            period_start: start,
        })
    }
}

/// An amount in a message: cents, or (for one too large to read as digits) its order.
fn dollars(v: f64) -> String {
    if v.abs() < 1e12 {
        format!("${v:.2}")
    } else {
        format!("${v:.3e}")
    }
}

/// A spend more than `IMPLAUSIBLE` times the limit is taken for a wrong query: unknown.
fn plausible(url: &str, spent: f64, limit: f64) -> Result<(), Unknown> {
    if spent > IMPLAUSIBLE * limit {
        return Err(Unknown::new(
            "implausible",
            format!(
                "{url} gave {}, more than {IMPLAUSIBLE:.0} times the limit: taken for a wrong query, not a spend",
                dollars(spent)
            ),
        ));
    }
    Ok(())
}

/// `gpuwatch_budget_query_failures_total{budget,reason}`.
#[derive(Debug)]
pub struct QueryCollector(pub Arc<QueryReadings>);

impl Collector for QueryCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = match self.0 .0.lock() {
            Ok(m) => m.clone(),
            Err(_) => return Ok(()),
        };
        counters(
            &mut enc,
            desc(
                "gpuwatch_budget_query_failures",
                "Queries of a prometheus budget's spend that gave no usable answer, by reason (unreachable, timeout, http_status, too_large, malformed, empty, several_series, not_finite, negative, implausible, stale, settling, secret, setup)",
                None,
            ),
            m.iter().flat_map(|(budget, k)| {
                k.failures.iter().map(move |(reason, n)| {
                    (
                        [("budget", Text(budget)), ("reason", Text(reason))],
                        *n,
                    )
                })
            }),
        )
    }
}

/// Polls one Prometheus budget until the watch stops.
pub async fn poll(budget: BudgetConfig, readings: Arc<QueryReadings>) {
    let BudgetSource::Prometheus(q) = &budget.source else {
        return;
    };
    let every = budget.poll_interval;
    let mut jitter = Jitter::new(&budget.name);
    // The first query comes at a moment of its own within the first interval, so that a
    // fleet restarted together does not ask at once; then one every interval, give or take a
    // tenth.
    tokio::time::sleep(every.mul_f64(jitter.next())).await;
    let client = loop {
        match client(q) {
            Ok(c) => break c,
            Err(e) => {
                tracing::error!(budget = %budget.name, error = %e, "cannot set up the Prometheus client; the budget's spend stays unknown (tried again every poll interval)");
                readings.record(&budget.name, Err(Unknown::new("setup", e)));
                tokio::time::sleep(every).await;
            }
        }
    };
    let mut failing: Option<&'static str> = None;
    let mut delay = every;
    let mut forecast_failing: Option<&'static str> = None;
    loop {
        let limit = budget.limit_usd.unwrap_or(0.0);
        // An implausible answer is a failure like any other: counted, and no spend known.
        let result = ask(&client, q, every, crate::time::now())
            .await
            .and_then(|a| plausible(&q.url, a.spent, limit).map(|()| a));
        match &result {
            Ok(a) => {
                if failing.take().is_some() {
                    tracing::info!(budget = %budget.name, spent = a.spent, "the budget's spend is known again");
                }
                let why = a.forecast_unknown.as_ref();
                if why.map(|u| u.reason) != forecast_failing {
                    forecast_failing = why.map(|u| u.reason);
                    if let Some(u) = why {
                        tracing::warn!(budget = %budget.name, reason = u.reason, "the budget's forecast is unknown: {}", u.detail);
                    }
                }
            }
            Err(u) if failing != Some(u.reason) => {
                failing = Some(u.reason);
                tracing::warn!(budget = %budget.name, reason = u.reason, "the budget's spend is unknown: {}; no rule tightens on it", u.detail);
            }
            Err(_) => {}
        }
        // An API that is down or overloaded is asked less often, up to every four intervals
        // (its answer is stale, so unknown, long before).
        delay = match &result {
            Err(u) if ["unreachable", "timeout", "http_status"].contains(&u.reason) => {
                (delay * 2).min(every * 4)
            }
            _ => every,
        };
        readings.record(&budget.name, result);
        tokio::time::sleep(delay.mul_f64(0.9 + 0.2 * jitter.next())).await;
    }
}

/// A small generator of numbers in [0, 1), seeded from the clock, the process and the budget:
/// spreading queries needs no more.
struct Jitter(u64);

impl Jitter {
    fn new(name: &str) -> Jitter {
        let nanos = (crate::time::now().fract() * 1e9) as u64;
        let mut seed = nanos ^ (u64::from(std::process::id()) << 32);
        for b in name.bytes() {
            seed = (seed ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        Jitter(seed | 1)
    }

    fn next(&mut self) -> f64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The HTTP client for `q`: its timeout, its CA, no redirects and no proxy.
pub fn client(q: &PrometheusSource) -> Result<reqwest::Client, String> {
    let mut builder = crate::client::http_client()
        .timeout(q.timeout)
        .connect_timeout(q.timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if let Some(ca) = &q.ca_file {
        builder = builder.tls_built_in_root_certs(false);
        for c in crate::config::read_ca(ca)? {
            builder = builder.add_root_certificate(c);
        }
    }
    builder
        .build()
        .map_err(|e| format!("cannot set up an HTTP client: {e}"))
}

/// Asks for the spend (and the forecast, where a query gives it) at `now`.
pub async fn ask(
    client: &reqwest::Client,
    q: &PrometheusSource,
    every: Duration,
    now: f64,
) -> Result<Answer, Unknown> {
    let (spent, at) = instant(client, q, &q.query, every, now).await?;
    if at - q.period.start(at) < SETTLE_SECONDS {
        return Err(Unknown::new("settling", settling()));
    }
    // A forecast that fails leaves the spend known, without a forecast (and says why).
    let (forecast, forecast_unknown) = match &q.forecast_query {
        None => (None, None),
        Some(f) => match instant(client, q, f, every, now).await {
            Ok((v, _)) => (Some(v), None),
            Err(u) => (None, Some(u)),
        },
    };
    Ok(Answer {
        spent,
        forecast,
        at,
        forecast_unknown,
    })
}

/// One instant query: its one sample's value and timestamp.
async fn instant(
    client: &reqwest::Client,
    q: &PrometheusSource,
    expr: &str,
    every: Duration,
    now: f64,
) -> Result<(f64, f64), Unknown> {
    let url = format!("{}/api/v1/query", q.url);
    let body = fetch(client, q, expr, MAX_ANSWER_BYTES).await?;
    let (value, at) = sample(&body).map_err(|u| Unknown {
        detail: format!("{url}: {}", u.detail),
        ..u
    })?;
    if !value.is_finite() {
        return Err(Unknown::new(
            "not_finite",
            format!("{url}: the query gave {value}, not a finite amount"),
        ));
    }
    if value < 0.0 {
        return Err(Unknown::new(
            "negative",
            format!("{url}: the query gave {value}, a negative amount"),
        ));
    }
    let most = 2.0 * every.as_secs_f64();
    if !at.is_finite() || now - at > most || at - now > MAX_SKEW {
        return Err(Unknown::new(
            "stale",
            format!(
                "{url}: the sample is timed {at:.0}, too far from this node's clock ({now:.0}): more than two poll intervals behind, or a minute ahead; are the clocks apart?"
            ),
        ));
    }
    Ok((value, at))
}

/// Asks `expr` at `/api/v1/query` with the source's auth, headers and timeout: the answer's
/// body, whole and at most `cap` bytes, or why there is none.
pub async fn fetch(
    client: &reqwest::Client,
    q: &PrometheusSource,
    expr: &str,
    cap: usize,
) -> Result<Vec<u8>, Unknown> {
    let url = format!("{}/api/v1/query", q.url);
    let mut request = client.get(&url).query(&[("query", expr)]);
    for (name, value) in &q.headers {
        request = request.header(name, value);
    }
    let exchange = async {
        // Secrets are read at every query (a rotated token is picked up), off the async
        // worker: a file on a hung mount blocks only its own thread, and the timeout ends it.
        match &q.auth {
            QueryAuth::None => {}
            QueryAuth::Basic {
                username,
                password_file,
            } => {
                let password = secret(password_file, "the password file").await?;
                request = request.basic_auth(username, Some(password));
            }
            QueryAuth::Bearer { token_file } => {
                let token = secret(token_file, "the bearer token file").await?;
                request = request.bearer_auth(token);
            }
        }
        let response = request
            .send()
            .await
            .map_err(|e| failed(&url, &e, q.timeout))?;
        let code = response.status();
        let body = crate::client::read_body(response, cap)
            .await
            .map_err(|e| failed(&url, &e, q.timeout))?;
        // An error is reported as one, whatever its body (a proxy's page may be large).
        if !code.is_success() {
            let said = body.as_deref().map(api_error).unwrap_or_default();
            return Err(Unknown::new(
                "http_status",
                format!("{url} answered {code}{said}"),
            ));
        }
        body.ok_or_else(|| {
            Unknown::new(
                "too_large",
                format!("{url} answered more than {} KiB", cap >> 10),
            )
        })
    };
    // The client's timeout bounds the request; this bounds a body that trickles in too.
    tokio::time::timeout(q.timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(timed_out(&url, q.timeout)))
}

async fn secret(path: &std::path::Path, what: &str) -> Result<String, Unknown> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || crate::config::read_secret(&path))
        .await
        .map_err(|e| Unknown::new("secret", format!("{what}: {e}")))?
        .map_err(|e| Unknown::new("secret", format!("{what}: {e}")))
}

fn failed(url: &str, e: &reqwest::Error, timeout: Duration) -> Unknown {
    // A timeout, while connecting or while the body trickles in, is said as one.
    if e.is_timeout() {
        return timed_out(url, timeout);
    }
    // reqwest names the URL (with the query) itself; headers and credentials never appear.
    Unknown::new(
        "unreachable",
        format!("cannot ask {url}: {}", crate::notify::error_chain(e)),
    )
}

fn timed_out(url: &str, timeout: Duration) -> Unknown {
    Unknown::new(
        "timeout",
        format!(
            "{url} did not answer within {}",
            humantime::format_duration(timeout)
        ),
    )
}

/// The API's own `error`, where an error answer has one: a few words, control characters
/// replaced.
fn api_error(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let Some(e) = v["error"].as_str() else {
        return String::new();
    };
    format!(": {}", crate::redact::brief(e, 200))
}

/// The one sample of an instant query's answer (a vector of one series, or a scalar).
pub fn sample(body: &[u8]) -> Result<(f64, f64), Unknown> {
    let malformed = |what: &str| Unknown::new("malformed", format!("the answer {what}"));
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| malformed(&format!("is not JSON ({e})")))?;
    if v["status"] != "success" {
        return Err(malformed("is not a success"));
    }
    let data = &v["data"];
    let pair = match data["resultType"].as_str() {
        Some("vector") => {
            let result = data["result"]
                .as_array()
                .ok_or_else(|| malformed("has no result list"))?;
            match result.len() {
                0 => {
                    return Err(Unknown::new(
                        "empty",
                        "the query matched no series (no node of the team reports, or the rules have not run)",
                    ))
                }
                1 => &result[0]["value"],
                n => {
                    return Err(Unknown::new(
                        "several_series",
                        format!("the query gave {n} series, not one; aggregate it (sum by ...) or narrow its labels"),
                    ))
                }
            }
        }
        Some("scalar") => &data["result"],
        Some(other) => {
            return Err(malformed(&format!(
                "is a {}, not one instant sample",
                crate::redact::plain(&other.chars().take(32).collect::<String>())
            )))
        }
        None => return Err(malformed("has no resultType")),
    };
    let at = pair[0]
        .as_f64()
        .ok_or_else(|| malformed("has a sample without a timestamp"))?;
    let value = pair[1]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| malformed("has a sample whose value is not a number"))?;
    Ok((value, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(series: &[(&str, f64, &str)]) -> Vec<u8> {
        let result: Vec<serde_json::Value> = series
            .iter()
            .map(|(team, at, v)| serde_json::json!({"metric": {"team": team}, "value": [at, v]}))
            .collect();
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn one_sample_is_read_from_a_vector_or_a_scalar() {
        assert_eq!(
            sample(&vector(&[("ml", 1700000000.5, "123.25")])).unwrap(),
            (123.25, 1700000000.5)
        );
        let scalar =
            br#"{"status":"success","data":{"resultType":"scalar","result":[1700000000,"7"]}}"#;
        assert_eq!(sample(scalar).unwrap(), (7.0, 1700000000.0));
    }

    #[test]
    fn anything_but_one_sample_is_unknown_with_its_reason() {
        let reason = |b: &[u8]| sample(b).unwrap_err().reason;
        assert_eq!(reason(&vector(&[])), "empty");
        assert_eq!(
            reason(&vector(&[("ml", 1.0, "1"), ("cv", 1.0, "2")])),
            "several_series"
        );
        assert_eq!(reason(b"<html>"), "malformed");
        assert_eq!(
            reason(b"{\"status\":\"error\",\"error\":\"x\"}"),
            "malformed"
        );
        assert_eq!(
            reason(br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#),
            "malformed"
        );
        assert_eq!(reason(&vector(&[("ml", 1.0, "lots")])), "malformed");
        // NaN and infinities parse as numbers: the caller refuses them as not finite.
        assert!(sample(&vector(&[("ml", 1.0, "NaN")])).unwrap().0.is_nan());
        assert!(sample(&vector(&[("ml", 1.0, "+Inf")]))
            .unwrap()
            .0
            .is_infinite());
    }

    #[test]
    fn an_api_error_is_quoted_plainly_and_briefly() {
        let body = serde_json::json!({"status": "error", "error": format!("bad\nquery {}", "x".repeat(300))});
        let text = api_error(body.to_string().as_bytes());
        assert!(text.starts_with(": bad\u{fffd}query x"), "{text}");
        assert!(text.len() < 220, "{}", text.len());
        assert_eq!(api_error(b"not json"), "");
    }

    fn budget() -> BudgetConfig {
        let text = "[[budgets]]\nname = \"team-ml\"\nsource = \"prometheus\"\nurl = \"http://127.0.0.1:9090\"\nquery = \"sum(x)\"\nlimit_usd = 100\npoll_interval = \"60s\"\n";
        crate::cloud::parse_config(text, std::path::Path::new("gpuwatch.toml"))
            .unwrap()
            .budgets
            .remove(0)
    }

    fn answered(spent: f64, at: f64) -> QueryReadings {
        let r = QueryReadings::default();
        r.record(
            "team-ml",
            Ok(Answer {
                spent,
                forecast: None,
                at,
                forecast_unknown: None,
            }),
        );
        r
    }

    /// 2026-12-15T12:00:00Z, well inside a month.
    const MID: f64 = 1_797_336_000.0;
    /// 2027-01-01T00:00:00Z.
    const NEW_YEAR: f64 = 1_798_761_600.0;

    #[test]
    fn a_fresh_answer_is_a_reading_of_this_nodes_period() {
        let b = budget();
        let r = answered(150.0, MID - 30.0).reading(&b, MID).unwrap();
        assert_eq!((r.spent, r.limit), (150.0, 100.0));
        assert_eq!(
            r.period_start,
            crate::cost::calendar::Period::Month.start(MID)
        );
    }

    #[test]
    fn an_answer_is_no_reading_when_old_ahead_implausible_or_from_another_period() {
        let b = budget();
        let why = |spent: f64, at: f64, now: f64| answered(spent, at).reading(&b, now).unwrap_err();
        assert!(why(150.0, MID - 121.0, MID).contains("more than two poll intervals"));
        assert!(why(150.0, MID + 61.0, MID).contains("ahead of this node's clock"));
        assert!(why(1000.01, MID, MID).contains("more than 10 times the limit"));
        // Exhausted at the end of December: no reading in January, nor in its first minutes.
        assert!(why(150.0, NEW_YEAR - 10.0, NEW_YEAR + 50.0).contains("previous budget period"));
        assert!(why(150.0, NEW_YEAR + 60.0, NEW_YEAR + 100.0).contains("settles first"));
        assert!(answered(150.0, NEW_YEAR + 400.0)
            .reading(&b, NEW_YEAR + 410.0)
            .is_ok());
        assert!(QueryReadings::default()
            .reading(&b, MID)
            .unwrap_err()
            .contains("has not answered yet"));
    }

    #[test]
    fn an_implausible_forecast_is_unknown() {
        let b = budget();
        let r = QueryReadings::default();
        let forecast = |f: f64| {
            r.record(
                "team-ml",
                Ok(Answer {
                    spent: 50.0,
                    forecast: Some(f),
                    at: MID,
                    forecast_unknown: None,
                }),
            );
            r.reading(&b, MID).unwrap().forecast
        };
        assert_eq!(forecast(120.0), Some(120.0));
        assert_eq!(forecast(1e12), None);
    }

    #[test]
    fn jitter_stays_in_its_range_and_differs_by_budget() {
        let mut a = Jitter::new("team-ml");
        let xs: Vec<f64> = (0..1000).map(|_| a.next()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean), "{mean}");
        assert_ne!(Jitter::new("team-ml").0, Jitter::new("team-cv").0);
    }
}
