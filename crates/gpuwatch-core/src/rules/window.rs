//! Per-rule period aggregates: the sample history a rule needs, and nothing more.
//!
//! Periods are aligned to multiples of the rule's period since the Unix epoch, as CloudWatch
//! aligns them. A rule keeps at most `evaluation_periods + 1` buckets, so memory does not grow
//! with the length of its periods.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{Aggregation, Condition, DeviceKey, Observation, Statistic};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    buckets: VecDeque<Bucket>,
    /// The devices of the latest observation taken in, in its order (empty before the first,
    /// and in state saved before this was kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    devices: Vec<DeviceKey>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Bucket {
    idx: i64,
    first_t: f64,
    last_t: f64,
    max_gap: f64,
    samples: u32,
    /// Why the period's data cannot be trusted, if it cannot.
    unknown: Option<String>,
    veto: Option<String>,
    gpus: Vec<GpuStat>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct GpuStat {
    index: u32,
    /// The MIG device's GPU and compute instance, for one of a GPU in MIG mode: devices are
    /// matched by both, never by position, so that a layout that changes within a period makes
    /// the period unknown rather than mixing two devices' readings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mig: Option<(u32, u32)>,
    sum: f64,
    count: u32,
    /// The largest reading, once there is one. (A float that starts at minus infinity would
    /// be written as `null` in the state file, which then no longer reads.)
    max: Option<f64>,
}

/// One evaluated period (a datapoint, as CloudWatch calls it), as evidence for a decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Datapoint {
    /// Unix seconds at which the period starts (RFC 3339 when serialized).
    #[serde(serialize_with = "crate::time::serialize_rfc3339")]
    pub start: f64,
    /// The statistic of each GPU over the period, by GPU index; empty when unknown.
    pub values: Vec<(u32, f64)>,
    pub state: DatapointState,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "reason")]
pub enum DatapointState {
    Breaching,
    NotBreaching,
    /// Missing, incomplete or vetoed data: counts as not breaching (unknown is busy).
    Unknown(String),
}

/// The outcome of evaluating a rule's last `evaluation_periods` complete periods.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assessment {
    pub breaching: bool,
    pub breaching_periods: u32,
    pub threshold: f64,
    pub periods: Vec<Datapoint>,
    /// For budget-gated and budget-limit rules: the budget and its spend ratio (null: unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<(String, Option<f64>)>,
    /// For a rule on GPU health: each problem of the unhealthy GPUs, in words ("GPU 1: XID
    /// 79: ..."), as the last sample showed them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// For a job's or a user's rule: the devices it judged (`0`, or `0:1` for GPU instance 1
    /// of GPU 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
}

impl Bucket {
    /// Whether an observation has the devices this period began with (matched by GPU index and
    /// MIG instance, never by position).
    fn same_devices(&self, obs: &Observation) -> bool {
        obs.gpus.len() == self.gpus.len()
            && obs
                .gpus
                .iter()
                .zip(&self.gpus)
                .all(|(o, s)| o.key() == (s.index, s.mig))
    }
}

impl Window {
    /// Whether an observation has other devices than the one before it: a GPU came or went, or
    /// its MIG layout changed (which someone does to start work).
    pub fn devices_changed(&self, obs: &Observation) -> bool {
        !self.devices.is_empty()
            && !obs
                .gpus
                .iter()
                .map(|g| g.key())
                .eq(self.devices.iter().copied())
    }

    /// Adds one observation. Observations older than the newest bucket are ignored.
    pub fn ingest(&mut self, rule: &Condition, obs: &Observation) {
        let period = rule.period.as_secs_f64();
        let idx = (obs.t / period).floor() as i64;
        if let Some(last) = self.buckets.back() {
            if idx < last.idx || (idx == last.idx && obs.t < last.last_t) {
                return;
            }
        }
        if self.buckets.back().is_none_or(|b| b.idx != idx) {
            self.buckets.push_back(Bucket {
                idx,
                first_t: obs.t,
                last_t: obs.t,
                max_gap: 0.0,
                samples: 0,
                unknown: None,
                veto: None,
                gpus: obs
                    .gpus
                    .iter()
                    .map(|g| GpuStat {
                        index: g.index,
                        mig: g.key().1,
                        sum: 0.0,
                        count: 0,
                        max: None,
                    })
                    .collect(),
            });
        }
        let keep = rule.evaluation_periods as i64 + 1;
        while self.buckets.front().is_some_and(|b| b.idx <= idx - keep) {
            self.buckets.pop_front();
        }
        self.devices.clear();
        self.devices.extend(obs.gpus.iter().map(|g| g.key()));
        let Some(b) = self.buckets.back_mut() else {
            return;
        };
        b.max_gap = b.max_gap.max(obs.t - b.last_t);
        b.last_t = obs.t;
        b.samples += 1;
        if let Some(v) = &obs.veto {
            b.veto.get_or_insert_with(|| v.clone());
        }
        if b.unknown.is_some() {
            return;
        }
        if !obs.complete {
            b.unknown = Some("a sample was incomplete (NVML down or a GPU lost)".into());
            return;
        }
        if !b.same_devices(obs) {
            b.unknown = Some("the set of GPUs changed".into());
            return;
        }
        for (o, s) in obs.gpus.iter().zip(b.gpus.iter_mut()) {
            match o.get(rule.metric) {
                // Every metric is finite and never negative: anything else is no reading.
                Some(v) if v.is_finite() && v >= 0.0 => {
                    s.sum += v;
                    s.count += 1;
                    s.max = Some(s.max.map_or(v, |m| m.max(v)));
                }
                Some(v) => {
                    b.unknown = Some(format!(
                        "{} read {v} for {}, which is no reading",
                        o.name(),
                        rule.metric.as_str()
                    ));
                    return;
                }
                None => {
                    b.unknown = Some(format!(
                        "{} had no {} reading",
                        o.name(),
                        rule.metric.as_str()
                    ));
                    return;
                }
            }
        }
    }

    /// Evaluates the last `evaluation_periods` complete periods before `now`. A period counts as
    /// breaching only with complete data: samples cover it to within `slack` seconds at both
    /// ends and between samples, every sample was complete, and no veto was seen. Periods that
    /// start before `not_before` never count (they predate a cancellation or an action).
    pub fn assess(&self, rule: &Condition, now: f64, slack: f64, not_before: f64) -> Assessment {
        let period = rule.period.as_secs_f64();
        let last = (now / period).floor() as i64 - 1;
        let first = last - rule.evaluation_periods as i64 + 1;
        let mut periods = Vec::with_capacity(rule.evaluation_periods as usize);
        // Buckets are in period order: one pass over both, so that the cost is linear in the
        // periods and buckets, not their product.
        let mut buckets = self.buckets.iter().peekable();
        for idx in first..=last {
            let start = idx as f64 * period;
            while buckets.next_if(|b| b.idx < idx).is_some() {}
            let bucket = buckets.peek().copied().filter(|b| b.idx == idx);
            periods.push(evaluate_period(
                rule, bucket, start, period, slack, not_before,
            ));
        }
        let breaching_periods = periods
            .iter()
            .filter(|p| p.state == DatapointState::Breaching)
            .count() as u32;
        Assessment {
            breaching: breaching_periods >= rule.datapoints_to_alarm,
            breaching_periods,
            threshold: rule.threshold,
            periods,
            budget: None,
            problems: Vec::new(),
            gpus: Vec::new(),
        }
    }
}

fn evaluate_period(
    rule: &Condition,
    bucket: Option<&Bucket>,
    start: f64,
    period: f64,
    slack: f64,
    not_before: f64,
) -> Datapoint {
    let unknown = |reason: String| Datapoint {
        start,
        values: Vec::new(),
        state: DatapointState::Unknown(reason),
    };
    let Some(b) = bucket else {
        return unknown("no samples".into());
    };
    if start < not_before {
        return unknown("before the rule was re-armed".into());
    }
    if let Some(reason) = &b.unknown {
        return unknown(reason.clone());
    }
    if let Some(v) = &b.veto {
        return unknown(format!("activity veto: {v}"));
    }
    let end = start + period;
    if b.first_t - start > slack || end - b.last_t > slack || b.max_gap > slack {
        return unknown("samples do not cover the period".into());
    }
    if b.gpus.is_empty() {
        return unknown("no GPUs".into());
    }
    let values: Option<Vec<(u32, f64)>> = b
        .gpus
        .iter()
        .map(|s| {
            let v = match rule.statistic {
                Statistic::Average => (s.count > 0).then(|| s.sum / f64::from(s.count)),
                Statistic::Maximum => s.max,
            };
            Some((s.index, v?))
        })
        .collect();
    let Some(values) = values else {
        return unknown("a device had no reading".into());
    };
    let holds = |v: &f64| rule.comparison.holds(*v, rule.threshold);
    let breaching = match rule.gpus {
        Aggregation::Every => values.iter().all(|(_, v)| holds(v)),
        Aggregation::Any => values.iter().any(|(_, v)| holds(v)),
    };
    Datapoint {
        start,
        values,
        state: if breaching {
            DatapointState::Breaching
        } else {
            DatapointState::NotBreaching
        },
    }
}
