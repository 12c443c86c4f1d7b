//! `gpuwatch simulate`: replays a recorded trace through the rule engine and reports what it
//! would have done, as `promtool test rules` does for alert rules.
//!
//! The trace is CSV,
//! `timestamp,gpu,utilization[,memory_used_bytes,power_watts,pod,sm_active,tensor_active,job,user]`,
//! with an optional header; `pod` (`namespace/pod`) is who held the GPU, for pod-scoped rules
//! (`job` and `user` for job- and user-scoped ones), and
//! `sm_active` and `tensor_active` are GPM's activities (ratios or percents), for rules on them. Timestamps are RFC 3339 or Unix seconds; utilization is a ratio or a percent (`37%`).
//! A timestamp with no row for some GPU is unknown data for that GPU, which counts as busy: the
//! sample is incomplete, as the daemon's is when a GPU is lost. An empty column is a GPU read
//! without that reading, as when NVML fails to give it. The memory and power columns become
//! ratios given the GPU's memory and power limit; without them (or the columns) rules on those
//! metrics see unknown data. Process counts are not in traces.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use gpuwatch_core::cost::budget::Crossing;
use gpuwatch_core::cost::price::Price;
use gpuwatch_core::step::order::{
    drive_at_once, not_recorded, withheld, Edge, Executed, Save, Withdrawn,
};
use gpuwatch_core::step::{crossing_text, step, Inputs, State};

use crate::cloud::plan::Down;
use crate::config::Config;
use crate::rules::engine::Event;
use crate::rules::{Action, GpuReading, Lifecycle, Metric, Observation, Rule};
use crate::state::audit::action_result;
use crate::state::STATE_FILE;

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub t: f64,
    pub gpu: u32,
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub power_watts: Option<f64>,
    /// The pod holding the GPU (`namespace/pod`), for pod-scoped rules.
    pub pod: Option<String>,
    /// The Slurm job and the user holding the GPU, for job- and user-scoped rules.
    pub job: Option<String>,
    pub user: Option<String>,
    /// GPM SM and tensor activity, ratios, for rules on `sm_active` and `tensor_active`.
    pub sm_active: Option<f64>,
    pub tensor_active: Option<f64>,
}

/// A trace line that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("trace line {line}: {message}")]
pub struct TraceError {
    pub line: usize,
    pub message: String,
}

/// The largest trace read: millions of rows, and a bound against `/dev/zero`.
pub const MAX_TRACE_BYTES: u64 = 1 << 30;

/// Reads a trace file (a regular file, never a FIFO or a device) of at most `MAX_TRACE_BYTES`.
pub fn read_trace(path: &std::path::Path) -> std::io::Result<String> {
    crate::files::read_text(path, MAX_TRACE_BYTES, crate::files::Links::Follow)
}

pub fn parse_trace(text: &str) -> Result<Vec<Row>, TraceError> {
    let mut rows = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let cols = Cols {
            cols: line.split(',').map(str::trim).collect(),
            line: n + 1,
        };
        if cols.cols.len() < 3 {
            return Err(cols.err(format!(
                "\"{line}\" has fewer than 3 columns (timestamp,gpu,utilization)"
            )));
        }
        let Some(t) = cols.time()? else {
            continue; // a header
        };
        rows.push(cols.row(t)?);
    }
    Ok(rows)
}

/// The columns of one line of a trace, and its number, for errors.
struct Cols<'a> {
    cols: Vec<&'a str>,
    line: usize,
}

impl Cols<'_> {
    fn err(&self, message: String) -> TraceError {
        TraceError {
            line: self.line,
            message,
        }
    }

    /// The timestamp, RFC 3339 or Unix seconds, between 1970 and 9999; `Ok(None)` for a header
    /// (a first line without one).
    fn time(&self) -> Result<Option<f64>, TraceError> {
        let c = self.cols[0];
        let t = match c.parse::<f64>() {
            Ok(t) => Some(t),
            Err(_) => crate::time::parse_rfc3339(c),
        };
        let Some(t) = t else {
            if self.line == 1 {
                return Ok(None);
            }
            return Err(self.err(format!(
                "timestamp \"{c}\" is neither RFC 3339 nor Unix seconds"
            )));
        };
        if !(0.0..=crate::time::MAX_UNIX_SECONDS).contains(&t) {
            return Err(self.err(format!(
                "timestamp \"{c}\" is not a time between 1970 and 9999"
            )));
        }
        Ok(Some(t))
    }

    /// A ratio from 0 to 1, or a percent (`37%`); empty or absent is unknown.
    fn ratio(&self, i: usize, what: &str) -> Result<Option<f64>, TraceError> {
        let Some(c) = self.cols.get(i).filter(|c| !c.is_empty()) else {
            return Ok(None);
        };
        let v = match c.strip_suffix('%') {
            Some(p) => {
                p.trim()
                    .parse::<f64>()
                    .map_err(|_| self.err(format!("{what} \"{c}\" is not a percent")))?
                    / 100.0
            }
            None => c
                .parse::<f64>()
                .map_err(|_| self.err(format!("{what} \"{c}\" is not a ratio")))?,
        };
        if !(0.0..=1.0).contains(&v) {
            return Err(self.err(format!(
                "{what} \"{c}\" is not between 0 and 1 (or 0% and 100%)"
            )));
        }
        Ok(Some(v))
    }

    /// A number of 0 or more; empty or absent is unknown.
    fn number(&self, i: usize, what: &str) -> Result<Option<f64>, TraceError> {
        match self.cols.get(i).filter(|c| !c.is_empty()) {
            None => Ok(None),
            Some(c) => match c.parse::<f64>() {
                Ok(v) if v >= 0.0 && v.is_finite() => Ok(Some(v)),
                _ => Err(self.err(format!("{what} \"{c}\" is not a number of 0 or more"))),
            },
        }
    }

    /// The pod column: `namespace/pod`.
    fn pod(&self) -> Result<Option<String>, TraceError> {
        let Some(p) = self.cols.get(5).filter(|c| !c.is_empty()) else {
            return Ok(None);
        };
        match p.split_once('/') {
            Some((ns, name))
                if !ns.is_empty()
                    && !name.is_empty()
                    && p.len() <= 507
                    && !p.chars().any(char::is_control) =>
            {
                Ok(Some(p.to_string()))
            }
            _ => Err(self.err(format!("pod \"{p}\" is not namespace/pod"))),
        }
    }

    /// The job and user columns.
    fn job_and_user(&self) -> Result<[Option<String>; 2], TraceError> {
        let job = match self.cols.get(8).filter(|c| !c.is_empty()) {
            None => None,
            Some(j) if crate::state::is_job_id(j) => Some(j.to_string()),
            Some(j) => return Err(self.err(format!("job \"{j}\" is not a Slurm job id"))),
        };
        let user = match self.cols.get(9).filter(|c| !c.is_empty()) {
            None => None,
            Some(u) if crate::metrics::plain_name(u) => Some(u.to_string()),
            Some(u) => return Err(self.err(format!("user \"{u}\" is not a user name"))),
        };
        Ok([job, user])
    }

    /// The row at time `t`.
    fn row(&self, t: f64) -> Result<Row, TraceError> {
        let gpu = self.cols[1]
            .parse::<u32>()
            .map_err(|_| self.err(format!("gpu \"{}\" is not a GPU index", self.cols[1])))?;
        let utilization = self.ratio(2, "utilization")?;
        let pod = self.pod()?;
        let [job, user] = self.job_and_user()?;
        Ok(Row {
            t,
            gpu,
            job,
            user,
            utilization,
            memory_used_bytes: self.number(3, "memory_used_bytes")?,
            power_watts: self.number(4, "power_watts")?,
            pod,
            sm_active: self.ratio(6, "sm_active")?,
            tensor_active: self.ratio(7, "tensor_active")?,
        })
    }
}

/// One line of the replay's report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    pub time: String,
    /// The same time in Unix seconds, exactly (the trace's own timestamp).
    pub at: f64,
    pub rule: String,
    pub kind: &'static str,
    pub action: Option<String>,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<serde_json::Value>,
}

/// A price and a starting spend, so that budget-gated rules and budget alerts replay too.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spend {
    pub usd_per_hour: f64,
    /// Spent in the budget period before the trace starts.
    pub start_usd: f64,
}

/// How to replay, beyond the config.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Options {
    /// The instance's lifecycle, for rules with a lifecycle filter.
    pub lifecycle: Option<Lifecycle>,
    /// Spend accruing at a price over the trace; local budgets are then checked.
    pub spend: Option<Spend>,
    /// With it, the trace's memory_used_bytes become `memory_used_ratio`.
    pub memory_total_bytes: Option<f64>,
    /// With it, the trace's power_watts become `power_ratio`.
    pub power_limit_watts: Option<f64>,
    /// A span of the trace in Unix seconds (from its first time up to, not including, its
    /// second) over which `state.json` cannot be written, as on a full or read-only state
    /// directory: every save of those steps fails, and the order withholds what needs a durable
    /// record (each action due is withdrawn and falls due again, budget alerts wait), as the
    /// daemon's does.
    pub state_unwritable: Option<(f64, f64)>,
}

/// Replays the trace through the config's rules with the given options. Boot grace counts from
/// the first timestamp.
pub fn replay_with(config: &Config, rows: &[Row], options: &Options) -> Vec<Report> {
    let Options {
        lifecycle,
        spend,
        memory_total_bytes,
        power_limit_watts,
        state_unwritable,
    } = *options;
    let gpus: BTreeSet<u32> = rows.iter().map(|r| r.gpu).collect();
    let mut times: Vec<f64> = rows.iter().map(|r| r.t).collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let mut grouped: BTreeMap<usize, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        if let Ok(i) = times.binary_search_by(|t| t.total_cmp(&r.t)) {
            grouped.entry(i).or_default().push(r);
        }
    }
    // Sorted by GPU, each timestamp's rows are found by binary search: the lookup stays
    // linear-logarithmic in the number of GPUs, not quadratic.
    for at in grouped.values_mut() {
        at.sort_by_key(|r| r.gpu);
    }
    let start = times.first().copied().unwrap_or(0.0);
    let interval = std::time::Duration::from_secs_f64(typical_step(&times));
    // Boot grace counts from the first timestamp, as if the node booted then.
    let grace_until = start + config.actions.boot_grace.as_secs_f64();
    let settings = config.step_settings(interval, grace_until, start);
    let mut state = State::default();
    if let Some(sp) = spend {
        state.ledger = crate::cost::ledger::Ledger {
            period_start: config.cost.period.start(start),
            spent: sp.start_usd,
            accrued_until: start,
            last_price: None,
            suspended: 0.0,
            monotonic: None,
        };
    }
    // A node that is down costs nothing: spend stops accruing once it went down.
    let inputs = |now: f64, down: bool| Inputs {
        now,
        lifecycle,
        price: spend.filter(|_| !down).map(|s| Price {
            usd_per_hour: s.usd_per_hour,
            source: crate::cost::price::Source::Config,
        }),
        ..Inputs::default()
    };
    let mut out = Vec::new();
    // What the call that took the node down left it as, once one has.
    let mut down: Option<Down> = None;
    for (i, t) in times.iter().enumerate() {
        let at = grouped.get(&i).map(Vec::as_slice).unwrap_or(&[]);
        let obs = observation(*t, &gpus, at, memory_total_bytes, power_limit_watts);
        let outcome = step(&settings, &mut state, &obs, &inputs(*t, down.is_some()));
        // The daemon's order, through the same function, on an edge that writes nothing and
        // whose every record works, and every save but those of an unwritable span.
        let mut rehearsal = Rehearsal {
            out: &mut out,
            rules: &outcome.rules,
            t: *t,
            saves: !state_unwritable.is_some_and(|(from, until)| (from..until).contains(t)),
            down: &mut down,
            lifecycle,
            spot_stop: config.actions.spot_stop,
            cloud: &config.cloud,
        };
        drive_at_once(&settings, &mut state, outcome.order, &mut rehearsal);
    }
    out
}

/// `simulate`'s edge of the safety order (`order::drive`, as the daemon's loop runs it): each
/// event becomes a line of the report, every record works, every save works unless the state
/// is unwritable then, and an action is planned as the daemon would plan it, never carried out.
struct Rehearsal<'a> {
    out: &'a mut Vec<Report>,
    rules: &'a [Rule],
    t: f64,
    /// Whether this step's saves of the state work.
    saves: bool,
    /// What the call that took the node down left it as, once one has: no instance action is reported
    /// after it.
    down: &'a mut Option<Down>,
    lifecycle: Option<Lifecycle>,
    spot_stop: crate::config::SpotStop,
    /// The cloud whose plan the daemon would follow.
    cloud: &'a crate::config::CloudConfig,
}

impl Rehearsal<'_> {
    fn rule(&self, event: &Event) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == event.rule())
    }

    /// Whether what `rule` does goes unreported: the node is down, and the rule acts on the
    /// instance.
    fn silent(&self, rule: Option<&Rule>) -> bool {
        self.down.is_some() && rule.is_some_and(|r| r.action.is_instance_action())
    }

    /// Reports an event, unless its rule is silent now.
    fn report(&mut self, event: &Event) {
        let rule = self.rule(event);
        if self.silent(rule) {
            return;
        }
        let line = report(self.t, event, rule);
        self.out.push(line);
    }

    /// Reports a line of this step that is no event of a rule's.
    fn note(&mut self, rule: &str, kind: &'static str, action: Option<Action>, detail: String) {
        self.out.push(Report {
            time: crate::time::rfc3339(self.t),
            at: self.t,
            rule: rule.to_string(),
            kind,
            action: action.map(|a| a.to_string()),
            detail,
            evidence: None,
        });
    }
}

impl Edge for Rehearsal<'_> {
    async fn record(&mut self, event: &Event) -> bool {
        self.report(event);
        true
    }

    async fn save(&mut self, _state: &State, _save: Save) -> bool {
        self.saves
    }

    fn taken_back(&mut self, withdrawn: &[Withdrawn], alerts: usize) {
        for w in withdrawn {
            if !self.silent(self.rules.iter().find(|r| r.name == w.rule)) {
                let detail = not_recorded(w.action, STATE_FILE);
                self.note(&w.rule, "withdrawn", Some(w.action), detail);
            }
        }
        if alerts > 0 {
            self.note("", "withheld", None, withheld(alerts, STATE_FILE));
        }
    }

    async fn alert(&mut self, c: &Crossing) -> bool {
        self.note(&c.budget, "budget_alert", None, crossing_text(c));
        true
    }

    async fn announce(&mut self, event: &Event) {
        self.report(event);
    }

    fn age(&self) -> f64 {
        // A replay takes no time: no action waits behind another.
        0.0
    }

    async fn called_off(&mut self) -> Option<String> {
        None
    }

    async fn deferred(&mut self, _rule: &str, _action: Action, _why: &str) {}

    async fn act(&mut self, event: &Event) -> Executed {
        let was_down = self.down.is_some();
        self.report(event);
        let Event::Action { rule, action, .. } = event else {
            return Executed::Recorded;
        };
        if !action.is_instance_action() || was_down {
            return Executed::Recorded;
        }
        // What the daemon would call on this instance, as its cloud's plan says.
        let (kind, detail) = match crate::cloud::rehearse(
            self.cloud,
            *action,
            self.lifecycle,
            self.spot_stop,
        ) {
            Err(why) => (
                "refused",
                action_result(*action, "refused", &format!("{why}; the node stays up")),
            ),
            Ok(last) => {
                *self.down = Some(last);
                let what = last.as_str();
                (
                    "node_down",
                    format!(
                        "the node is {what} here: the rest of the trace comes after it, so no further instance action is reported and spend stops (alerts and exec go on as in the daemon)"
                    ),
                )
            }
        };
        self.note(rule, kind, Some(*action), detail);
        // The daemon completes an action once it has run (and recorded it); a replay runs
        // none, and settles it the same way.
        Executed::Recorded
    }
}

/// The observation of one timestamp: a reading for every GPU of the trace, unknown where the
/// timestamp has no row for it (and the sample then incomplete, as the daemon's is without a
/// GPU). `at` is sorted by GPU.
fn observation(
    t: f64,
    gpus: &BTreeSet<u32>,
    at: &[&Row],
    memory_total_bytes: Option<f64>,
    power_limit_watts: Option<f64>,
) -> Observation {
    let ratio = |v: Option<f64>, total: Option<f64>| match (v, total) {
        (Some(v), Some(t)) if t > 0.0 => Some(v / t),
        _ => None,
    };
    let mut complete = true;
    let readings: Vec<GpuReading> = gpus
        .iter()
        .map(|&g| {
            let mut r = GpuReading {
                index: g,
                ..GpuReading::default()
            };
            let row = at
                .binary_search_by_key(&g, |row| row.gpu)
                .ok()
                .map(|i| at[i]);
            complete &= row.is_some();
            r.set(Metric::GpuUtilization, row.and_then(|row| row.utilization));
            r.set(
                Metric::MemoryUsedRatio,
                ratio(row.and_then(|r| r.memory_used_bytes), memory_total_bytes),
            );
            r.set(
                Metric::PowerRatio,
                ratio(row.and_then(|r| r.power_watts), power_limit_watts),
            );
            r.set(Metric::SmActive, row.and_then(|r| r.sm_active));
            r.set(Metric::TensorActive, row.and_then(|r| r.tensor_active));
            r.holders = row.and_then(|r| r.pod.clone()).into_iter().collect();
            r.jobs = row.and_then(|r| r.job.clone()).into_iter().collect();
            r.users = row.and_then(|r| r.user.clone()).into_iter().collect();
            r
        })
        .collect();
    Observation {
        t,
        complete,
        gpus: readings,
        veto: None,
        holders_unknown: false,
    }
}

fn typical_step(times: &[f64]) -> f64 {
    let mut steps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    if steps.is_empty() {
        return 1.0;
    }
    steps.sort_by(f64::total_cmp);
    steps[steps.len() / 2]
}

fn report(t: f64, e: &Event, rule: Option<&Rule>) -> Report {
    let (action, detail, evidence) = match e {
        Event::Breach { evidence, .. } => (
            None,
            e.sentence().unwrap_or_default(),
            serde_json::to_value(evidence).ok(),
        ),
        Event::Recovered { .. } => (None, e.sentence().unwrap_or_default(), None),
        Event::Warning {
            action,
            due_at,
            evidence,
            ..
        } => (
            Some(*action),
            format!(
                "{action} at {} unless {}",
                crate::time::rfc3339(*due_at),
                rule.map_or_else(|| "the GPUs are used again".to_string(), Rule::calls_off)
            ),
            serde_json::to_value(evidence).ok(),
        ),
        Event::Cancelled { action, .. } | Event::Postponed { action, .. } => {
            (Some(*action), e.sentence().unwrap_or_default(), None)
        }
        // A replay runs nothing: each action's result is a rehearsal's, in its record's words.
        Event::Action {
            action, evidence, ..
        } => (
            Some(*action),
            action_result(*action, "dry_run", &format!("would {action}")),
            serde_json::to_value(evidence).ok(),
        ),
    };
    Report {
        time: crate::time::rfc3339(t),
        at: t,
        rule: e.rule().to_string(),
        kind: e.kind(),
        action: action.map(|a| a.to_string()),
        detail,
        evidence,
    }
}

/// The human-readable timeline.
pub fn render(reports: &[Report]) -> String {
    let mut out = String::new();
    if reports.is_empty() {
        out.push_str("no rule breached: no warning, no action\n");
    }
    for r in reports {
        let _ = writeln!(out, "{}  {:<10} {}: {}", r.time, r.kind, r.rule, r.detail);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_formats() {
        let rows = parse_trace(
            "timestamp,gpu,utilization,memory_used_bytes,power_watts\n\
             2026-11-30T00:53:20Z,0,37%,1024,300.5\n1796000001,1,0.5\n1796000002,0,\n",
        )
        .unwrap();
        let row = |t: f64, gpu, utilization, memory_used_bytes, power_watts| Row {
            t,
            gpu,
            utilization,
            memory_used_bytes,
            power_watts,
            pod: None,
            job: None,
            user: None,
            sm_active: None,
            tensor_active: None,
        };
        assert_eq!(
            rows,
            vec![
                row(1_796_000_000.0, 0, Some(0.37), Some(1024.0), Some(300.5)),
                row(1_796_000_001.0, 1, Some(0.5), None, None),
                row(1_796_000_002.0, 0, None, None, None),
            ]
        );
        let e = parse_trace("1,0,0.5,-3\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "trace line 1: memory_used_bytes \"-3\" is not a number of 0 or more"
        );
        for bad in ["inf", "NaN", "-inf", "1e300", "-1"] {
            let e = parse_trace(&format!("1,0,0.1\n{bad},0,0.1\n")).unwrap_err();
            assert_eq!(e.line, 2, "{bad}");
            assert!(e.message.contains("between 1970 and 9999"), "{bad}: {e}");
        }
        let rows = parse_trace("1,0,0.5,,,ml/train-a\n2,0,0.5\n").unwrap();
        assert_eq!(rows[0].pod.as_deref(), Some("ml/train-a"));
        let held = parse_trace("1,0,0.5,,,,,,4242,alice\n").unwrap();
        assert_eq!(held[0].job.as_deref(), Some("4242"));
        assert_eq!(held[0].user.as_deref(), Some("alice"));
        for (bad, why) in [("../x,alice", "job"), ("42,a b", "user")] {
            let e = parse_trace(&format!("1,0,0.5,,,,,,{bad}\n")).unwrap_err();
            assert!(e.message.starts_with(why), "{e}");
        }
        assert_eq!(rows[1].pod, None);
        let e = parse_trace("1,0,0.5,,,train-a\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "trace line 1: pod \"train-a\" is not namespace/pod"
        );
        let e = parse_trace("1,0,150%\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "trace line 1: utilization \"150%\" is not between 0 and 1 (or 0% and 100%)"
        );
        let e = parse_trace("1,0,0.1\nyesterday,0,0.1\n").unwrap_err();
        assert!(e
            .to_string()
            .contains("\"yesterday\" is neither RFC 3339 nor Unix seconds"));
    }
}
