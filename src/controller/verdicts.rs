//! The node daemons' verdicts, read from the fleet's Prometheus. The controller asks for each
//! standing verdict's own sample time (`timestamp(gpuwatch_pod_reclaim_verdict)`: of the
//! selector itself, since an operator in between would stamp every sample with the query's
//! time) and judges its age itself: a Prometheus that has just restarted answers instant
//! queries with samples up to five minutes old and no staleness marker, and a node whose daemon
//! is down leaves its last sample behind. A verdict older than two scrape intervals, or timed
//! ahead of this clock, counts as none (busy).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::controller::ControllerConfig;
use crate::config::PrometheusSource;
use crate::spend::query::Unknown;

/// The largest answer read: about 30 000 verdicts.
pub const MAX_ANSWER_BYTES: usize = 8 << 20;
/// The most a sample may be timed ahead of this clock, in seconds.
pub const MAX_SKEW: f64 = 60.0;

/// One pod's fresh verdict of idleness.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub rule: String,
    /// The devices the pod holds on its node (`0,1`).
    pub gpus: String,
    /// The node daemon that gave it (Prometheus's `instance`).
    pub instance: String,
    /// The node it is of, as the daemon names it (`NODE_NAME`): it counts only for a pod on
    /// that node.
    pub node: String,
    /// When the daemon gave it (Unix seconds): it counts only for a pod created before.
    pub since: Option<f64>,
    /// The node daemon's mode (`dry-run` or `enforce`).
    pub mode: String,
    /// Its sample's time, Unix seconds.
    pub at: f64,
    /// Its sample's age when Prometheus answered, in seconds.
    pub age: f64,
    /// What its GPUs cost, where the node's price is known: the node's hourly price times the
    /// pod's share of the node's GPUs.
    pub usd_per_hour: Option<f64>,
}

/// The fresh verdicts, by `(namespace, pod)`, and how many were stale.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdicts {
    pub fresh: BTreeMap<(String, String), Verdict>,
    pub stale: usize,
}

/// Asks Prometheus for the verdicts standing at `now`, and when each was given.
pub async fn read(
    client: &reqwest::Client,
    c: &ControllerConfig,
    now: f64,
) -> Result<Verdicts, Unknown> {
    let q = &c.prometheus;
    let body = crate::spend::query::fetch(client, q, &c.verdict_query(), MAX_ANSWER_BYTES).await?;
    let mut verdicts = parse(&body, c.scrape_interval, now)?;
    let body = crate::spend::query::fetch(client, q, &c.since_query(), MAX_ANSWER_BYTES).await?;
    let since = values(&body, &["namespace", "pod", "rule", "instance"]);
    for ((ns, pod), v) in verdicts.fresh.iter_mut() {
        let key = [ns.clone(), pod.clone(), v.rule.clone(), v.instance.clone()];
        v.since = since.get(&key[..]).copied();
    }
    Ok(verdicts)
}

/// Each node's price per GPU-hour, by `instance`: its hourly price over its GPU count.
pub const GPU_PRICE_QUERY: &str =
    "max by (instance) (gpuwatch_instance_hourly_cost_dollars) / max by (instance) (gpuwatch_gpus > 0)";

/// Fills in each verdict's dollars per hour from the nodes' prices, where they are known; a
/// failed query leaves them unknown (it says so in words, and decides nothing).
pub async fn price(client: &reqwest::Client, q: &PrometheusSource, verdicts: &mut Verdicts) {
    let body = crate::spend::query::fetch(client, q, GPU_PRICE_QUERY, MAX_ANSWER_BYTES).await;
    let body = match body {
        Ok(b) => b,
        Err(u) => {
            tracing::debug!(error = %u.detail, "the nodes' prices are unknown this round");
            return;
        }
    };
    fill(verdicts, &per_gpu(&body));
}

/// Each verdict's dollars per hour: its node's price per GPU times the pod's GPUs.
pub fn fill(verdicts: &mut Verdicts, prices: &BTreeMap<String, f64>) {
    for v in verdicts.fresh.values_mut() {
        let gpus = v.gpus.split(',').filter(|g| !g.is_empty()).count();
        v.usd_per_hour = prices
            .get(&v.instance)
            .map(|p| p * gpus as f64)
            .filter(|usd| usd.is_finite() && *usd >= 0.0);
    }
}

/// The per-GPU prices of `GPU_PRICE_QUERY`'s answer, by instance.
pub fn per_gpu(body: &[u8]) -> BTreeMap<String, f64> {
    values(body, &["instance"])
        .into_iter()
        .filter_map(|(mut k, v)| Some((k.pop()?, v)))
        .collect()
}

/// The finite values of an instant query's vector, by the values of `labels`.
fn values(body: &[u8], labels: &[&str]) -> BTreeMap<Vec<String>, f64> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let key: Option<Vec<String>> = labels
                .iter()
                .map(|l| r["metric"][*l].as_str().map(String::from))
                .collect();
            let value = r["value"][1].as_str()?.parse::<f64>().ok()?;
            Some((key?, value).clone()).filter(|(_, v)| v.is_finite())
        })
        .collect()
}

/// The fresh verdicts of an instant query's answer.
pub fn parse(body: &[u8], scrape_interval: Duration, now: f64) -> Result<Verdicts, Unknown> {
    let malformed = |what: &str| Unknown::new("malformed", format!("the answer {what}"));
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| malformed("is not JSON"))?;
    if v["status"] != "success" {
        return Err(malformed("is not a success"));
    }
    if v["data"]["resultType"] != "vector" {
        return Err(malformed("is not a vector"));
    }
    let results = v["data"]["result"]
        .as_array()
        .ok_or_else(|| malformed("has no result"))?;
    let most = 2.0 * scrape_interval.as_secs_f64();
    let mut out = Verdicts::default();
    for r in results {
        // Prometheus's own time of the query: the sample's age is judged against it, and it
        // against this clock.
        let evaluated = r["value"][0].as_f64().filter(|t| t.is_finite());
        let Some(evaluated) = evaluated.filter(|t| (t - now).abs() <= MAX_SKEW) else {
            return Err(Unknown::new(
                "clock",
                format!("Prometheus answered for a time more than {MAX_SKEW:.0}s from this clock ({now:.0}): are the clocks apart?"),
            ));
        };
        let label = |k: &str| r["metric"][k].as_str().unwrap_or("").to_string();
        let (namespace, pod) = (label("namespace"), label("pod"));
        if namespace.is_empty() || pod.is_empty() {
            continue;
        }
        let at = r["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|t| t.is_finite());
        let Some(at) = at.filter(|at| evaluated - at <= most && *at <= evaluated) else {
            out.stale += 1;
            continue;
        };
        let verdict = Verdict {
            rule: label("rule"),
            gpus: label("gpus"),
            instance: label("instance"),
            node: label("node"),
            mode: label("mode"),
            since: None,
            at,
            age: evaluated - at,
            usd_per_hour: None,
        };
        // Two verdicts of one pod (two rules): the newest stands for it.
        match out.fresh.entry((namespace, pod)) {
            std::collections::btree_map::Entry::Occupied(mut e) => {
                if e.get().at < at {
                    e.insert(verdict);
                }
            }
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(verdict);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(samples: &[(&str, &str, f64)]) -> Vec<u8> {
        answer_at(samples, 10_000.0)
    }

    /// An answer Prometheus evaluated at `evaluated`.
    fn answer_at(samples: &[(&str, &str, f64)], evaluated: f64) -> Vec<u8> {
        let result: Vec<serde_json::Value> = samples
            .iter()
            .map(|(ns, pod, at)| {
                serde_json::json!({
                    "metric": {"namespace": ns, "pod": pod, "rule": "idle", "gpus": "0", "instance": "node-a:9400"},
                    "value": [evaluated, format!("{at}")],
                })
            })
            .collect();
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
            .to_string()
            .into_bytes()
    }

    /// A verdict counts only while its sample is at most two scrape intervals old, and not
    /// timed ahead of this clock by more than a minute: a restarted Prometheus's five-minute
    /// old sample, or a node whose daemon is down, is busy.
    #[test]
    fn only_fresh_verdicts_count() {
        let now = 10_000.0;
        let body = answer(&[
            ("ml", "fresh", now - 10.0),
            ("ml", "edge", now - 60.0),
            ("ml", "stale", now - 61.0),
            ("ml", "restart", now - 290.0),
            ("ml", "ahead", now + 120.0),
        ]);
        let v = parse(&body, Duration::from_secs(30), now).unwrap();
        let pods: Vec<&str> = v.fresh.keys().map(|(_, p)| p.as_str()).collect();
        assert_eq!(pods, ["edge", "fresh"]);
        assert_eq!(v.stale, 3);
        let f = &v.fresh[&("ml".to_string(), "fresh".to_string())];
        assert_eq!(f.usd_per_hour, None);
        assert_eq!(
            (f.rule.as_str(), f.gpus.as_str(), f.instance.as_str(), f.at),
            ("idle", "0", "node-a:9400", now - 10.0)
        );
    }

    /// A pod's dollars per hour are its node's price per GPU times its GPUs; a node without a
    /// price leaves them unknown.
    #[test]
    fn prices_are_per_gpu_of_the_node() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"instance":"node-a:9400"},"value":[1000,"4.1"]}]}}"#;
        let prices = per_gpu(body);
        assert_eq!(prices.get("node-a:9400"), Some(&4.1));
        assert!(per_gpu(b"<html>").is_empty());
        let now = 10_000.0;
        let mut v = parse(&answer(&[("ml", "a", now)]), Duration::from_secs(30), now).unwrap();
        v.fresh.values_mut().for_each(|x| x.gpus = "0,1".into());
        fill(&mut v, &prices);
        assert_eq!(v.fresh.values().next().unwrap().usd_per_hour, Some(8.2));
        fill(&mut v, &BTreeMap::new());
        assert_eq!(v.fresh.values().next().unwrap().usd_per_hour, None);
    }

    /// A Prometheus whose clock is more than a minute from this one: its ages cannot be
    /// trusted, and nothing is known.
    #[test]
    fn a_prometheus_with_another_clock_is_unknown() {
        let now = 10_000.0;
        let body = answer_at(&[("ml", "a", now + 100.0)], now + 110.0);
        let e = parse(&body, Duration::from_secs(30), now).unwrap_err();
        assert_eq!(e.reason, "clock");
        // Within a minute, each sample's age is judged against Prometheus's own time.
        let body = answer_at(&[("ml", "a", now + 45.0)], now + 50.0);
        assert_eq!(
            parse(&body, Duration::from_secs(30), now)
                .unwrap()
                .fresh
                .len(),
            1
        );
    }

    #[test]
    fn a_malformed_answer_is_unknown() {
        for body in [
            &b"<html>"[..],
            br#"{"status":"error"}"#,
            br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
        ] {
            assert_eq!(
                parse(body, Duration::from_secs(30), 0.0)
                    .unwrap_err()
                    .reason,
                "malformed"
            );
        }
    }
}
