//! The one decision step. The daemon runs it on every sample; `gpuwatch simulate` runs it on
//! every timestamp of a trace. Both build their `Settings` with `Settings::new` and call `step`,
//! so the slack between samples, spend accrual, budget crossings and alert text cannot differ.
//!
//! `step` takes the persisted state, one observation and the world at that moment (`Inputs`),
//! and returns everything the edge has to log, record, send, carry out and export (`Decision`).
//! It does no I/O and reads no clock.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cost::budget::{Alerted, Crossing, Reading};
use crate::cost::calendar::Period;
use crate::cost::ledger::{Closed, Ledger};
use crate::cost::price::{Price, Source};
use crate::rules::engine::{self, Context, Event};
use crate::rules::{Comparison, Lifecycle, Metric, Observation, Rule, Scope};

/// Everything the step remembers between samples. The daemon keeps it in `state.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub engine: engine::State,
    #[serde(default)]
    pub ledger: Ledger,
    #[serde(default)]
    pub alerted: Alerted,
    /// The last known spot price, kept across restarts.
    #[serde(default)]
    pub spot_price: Option<f64>,
    /// USD spent on GPUs while they were idle, since the state began: the instance's price
    /// times the idle GPUs' share of its GPUs, accrued per sample.
    #[serde(default)]
    pub idle_dollars: f64,
    /// The sample up to which `idle_dollars` is accrued.
    #[serde(default)]
    pub idle_accrued_until: f64,
    /// Since when each GPU has been idle, by index (for the idle-time view; not persisted).
    #[serde(skip)]
    pub idle_since: BTreeMap<u32, f64>,
}

/// Whose spend a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    /// This node's own ledger.
    Local,
    /// A reading from outside (AWS Budgets), passed in through `Inputs::external`.
    External,
}

/// A budget as the step judges it.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub name: String,
    pub source: BudgetSource,
    /// The limit; an external reading's own limit is used when this is `None`.
    pub limit_usd: Option<f64>,
    pub thresholds: Vec<f64>,
}

/// What does not change from one step to the next.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub rules: Vec<Rule>,
    pub budgets: Vec<Budget>,
    pub period: Period,
    /// How long a warning lasts before its action.
    pub warning: Duration,
    /// The longest gap between samples that still counts as complete data, in seconds.
    pub slack: f64,
    /// No warning and no action before this time (boot grace).
    pub grace_until: f64,
    /// When the machine started running: spend accrues from here at the earliest.
    pub running_since: f64,
    /// The utilization below which a GPU counts as idle in the view.
    pub idle_threshold: f64,
}

impl Settings {
    /// The settings for samples taken every `interval`, each allowed `timeout`. The slack is
    /// two and a half intervals (one late sample is not a gap), and never less than the timeout.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rules: Vec<Rule>,
        budgets: Vec<Budget>,
        period: Period,
        warning: Duration,
        interval: Duration,
        timeout: Duration,
        grace_until: f64,
        running_since: f64,
    ) -> Settings {
        let idle_threshold = idle_threshold(&rules);
        Settings {
            rules,
            budgets,
            period,
            warning,
            slack: slack(interval, timeout),
            grace_until,
            running_since,
            idle_threshold,
        }
    }
}

/// The longest gap between samples that still counts as complete data.
pub fn slack(interval: Duration, timeout: Duration) -> f64 {
    (interval.as_secs_f64() * 2.5).max(timeout.as_secs_f64())
}

/// The utilization below which a GPU counts as idle for the view: the lowest threshold of the
/// `gpu_utilization < x` rules, or 5%.
fn idle_threshold(rules: &[Rule]) -> f64 {
    rules
        .iter()
        .filter_map(Rule::condition)
        .filter(|c| c.metric == Metric::GpuUtilization)
        .filter(|c| {
            matches!(
                c.comparison,
                Comparison::LessThan | Comparison::LessThanOrEqual
            )
        })
        .map(|c| c.threshold)
        .fold(None, |acc: Option<f64>, t| {
            Some(acc.map_or(t, |a| a.min(t)))
        })
        .unwrap_or(0.05)
}

/// The world at the moment of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inputs {
    /// Unix seconds: the observation's time.
    pub now: f64,
    /// The latest hold in force (local file or instance tag); infinite for one without a
    /// readable expiry.
    pub hold_until: Option<f64>,
    pub lifecycle: Option<Lifecycle>,
    /// A spot interruption notice is in effect.
    pub interruption: bool,
    /// The hourly price, as chosen from its sources; `None` is unknown.
    pub price: Option<Price>,
    /// Readings of external budgets, by budget name.
    pub external: BTreeMap<String, Reading>,
}

/// What one step produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// The rules this step judged: every configured node rule, and each pod-scoped rule once
    /// per pod that held a GPU. Events name one of these.
    pub rules: Vec<Rule>,
    /// Rule events, in rule order. An `Event::Action` is in flight in the state: the edge must
    /// make that durable, then `complete` or `withdraw` it.
    pub events: Vec<Event>,
    /// Budget periods that ended, with their totals.
    pub closed: Vec<Closed>,
    /// Budget thresholds crossed for the first time this period (recorded in the state).
    pub crossings: Vec<Crossing>,
    pub view: View,
}

/// What the metrics show after a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct View {
    pub price: Option<Price>,
    /// Spent this period; `None` while the price is unknown.
    pub spent: Option<f64>,
    pub forecast: Option<f64>,
    /// Each budget with a reading.
    pub budgets: Vec<BudgetView>,
    pub rules: Vec<RuleView>,
    /// Each GPU with a utilization reading: how long it has been idle.
    pub gpu_idle: Vec<GpuIdle>,
    /// USD spent on idle GPUs so far (a counter).
    pub idle_dollars: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuIdle {
    pub index: u32,
    /// Below the idle threshold in this sample.
    pub idle: bool,
    /// Seconds idle without a break; 0 while busy (and in the first idle sample).
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetView {
    pub name: String,
    pub limit: f64,
    pub spent_ratio: Option<f64>,
    pub forecast_ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuleView {
    pub name: String,
    pub breaching: bool,
    /// The pending action: which, and when it is due.
    pub pending: Option<engine::Pending>,
}

/// Runs one step: feeds the observation to the rules, accrues spend, checks budgets, and
/// evaluates every rule at `inputs.now`.
pub fn step(
    settings: &Settings,
    state: &mut State,
    obs: &Observation,
    inputs: &Inputs,
) -> Decision {
    let now = inputs.now;
    let rules = rules_for(&settings.rules, obs);
    for rule in &rules {
        let one = std::slice::from_ref(rule);
        match &rule.subject {
            None => engine::ingest(one, &mut state.engine, obs),
            Some(pod) => engine::ingest(one, &mut state.engine, &pod_observation(obs, pod)),
        }
    }
    // A pod that holds no GPU any more is done with: its rules' state goes (unless an action
    // of it is in flight, which the edge settles).
    state
        .engine
        .rules
        .retain(|name, rs| rules.iter().any(|r| &r.name == name) || rs.in_flight.is_some());

    if let (Some(p), Some(Lifecycle::Spot)) = (inputs.price, inputs.lifecycle) {
        if p.source == Source::Spot {
            state.spot_price = Some(p.usd_per_hour);
        }
    }
    let closed = state.ledger.accrue(
        now,
        inputs.price.map(|p| p.usd_per_hour),
        settings.period,
        settings.running_since,
    );
    let spent = inputs.price.map(|_| state.ledger.spent);
    let forecast = state.ledger.forecast(now, settings.period);

    let mut crossings = Vec::new();
    let mut ratios = BTreeMap::new();
    let mut budgets = Vec::new();
    for b in &settings.budgets {
        let reading = match b.source {
            BudgetSource::Local => spent.map(|spent| Reading {
                spent,
                forecast,
                limit: b.limit_usd.unwrap_or(0.0),
                period_start: state.ledger.period_start,
            }),
            BudgetSource::External => inputs.external.get(&b.name).map(|r| Reading {
                limit: b.limit_usd.unwrap_or(r.limit),
                ..r.clone()
            }),
        };
        let Some(reading) = reading else { continue };
        state.alerted.prune(&b.name, reading.period_start);
        crossings.extend(state.alerted.crossings(&b.name, &b.thresholds, &reading));
        if let Some(r) = reading.spent_ratio() {
            ratios.insert(b.name.clone(), r);
        }
        budgets.push(BudgetView {
            name: b.name.clone(),
            limit: reading.limit,
            spent_ratio: reading.spent_ratio(),
            forecast_ratio: reading.forecast_ratio(),
        });
    }

    let ctx = Context {
        now,
        grace_until: settings.grace_until,
        hold_until: inputs.hold_until,
        lifecycle: inputs.lifecycle,
        interruption: inputs.interruption,
        budgets: ratios,
    };
    let engine_settings = engine::Settings {
        warning: settings.warning,
        slack: settings.slack,
    };
    let events = engine::evaluate(&rules, &engine_settings, &mut state.engine, &ctx);

    let mut gpu_idle = Vec::with_capacity(obs.gpus.len());
    for g in &obs.gpus {
        match g.get(Metric::GpuUtilization) {
            Some(u) if u < settings.idle_threshold => {
                let since = *state.idle_since.entry(g.index).or_insert(now);
                gpu_idle.push(GpuIdle {
                    index: g.index,
                    idle: true,
                    seconds: now - since,
                });
            }
            Some(_) => {
                state.idle_since.remove(&g.index);
                gpu_idle.push(GpuIdle {
                    index: g.index,
                    idle: false,
                    seconds: 0.0,
                });
            }
            None => {
                state.idle_since.remove(&g.index);
            }
        }
    }
    accrue_idle_dollars(settings, state, inputs, &gpu_idle, obs.gpus.len());
    let views = rule_views(&rules, state);

    Decision {
        rules,
        events,
        closed,
        crossings,
        view: View {
            price: inputs.price,
            spent,
            forecast,
            budgets,
            rules: views,
            gpu_idle,
            idle_dollars: state.idle_dollars,
        },
    }
}

/// Accrues the money spent on idle GPUs since the last sample: the price times the share of the
/// node's GPUs that are idle now. A gap longer than the slack, or an unknown price, accrues
/// nothing (unknown is not idle).
fn accrue_idle_dollars(
    settings: &Settings,
    state: &mut State,
    inputs: &Inputs,
    gpu_idle: &[GpuIdle],
    gpus: usize,
) {
    let now = inputs.now;
    let dt = now - state.idle_accrued_until;
    if let Some(price) = inputs.price {
        if state.idle_accrued_until > 0.0 && dt > 0.0 && dt <= settings.slack && gpus > 0 {
            let idle = gpu_idle.iter().filter(|g| g.idle).count();
            state.idle_dollars += price.usd_per_hour * idle as f64 / gpus as f64 * dt / 3600.0;
        }
    }
    if now > state.idle_accrued_until {
        state.idle_accrued_until = now;
    }
}

/// The rules one sample is judged by: every node rule, and each pod-scoped rule once for each
/// pod that holds a GPU now, named `rule namespace/pod` and judged on that pod's GPUs only.
pub fn rules_for(rules: &[Rule], obs: &Observation) -> Vec<Rule> {
    let mut pods: Vec<&str> = obs
        .gpus
        .iter()
        .flat_map(|g| g.holders.iter().map(String::as_str))
        .collect();
    pods.sort_unstable();
    pods.dedup();
    let mut out = Vec::with_capacity(rules.len());
    for rule in rules {
        match rule.scope {
            Scope::Node => out.push(rule.clone()),
            Scope::Pod => out.extend(pods.iter().map(|pod| Rule {
                name: format!("{} {pod}", rule.name),
                subject: Some((*pod).to_string()),
                ..rule.clone()
            })),
        }
    }
    out
}

/// What a pod's rules see: the GPUs the pod holds, nothing else.
fn pod_observation(obs: &Observation, pod: &str) -> Observation {
    Observation {
        t: obs.t,
        complete: obs.complete,
        gpus: obs
            .gpus
            .iter()
            .filter(|g| g.holders.iter().any(|h| h == pod))
            .cloned()
            .collect(),
        veto: obs.veto.clone(),
    }
}

/// Each rule as the state has it now: breaching, and its pending action. The edge calls this
/// again after it has carried out (or withdrawn) the step's actions.
pub fn rule_views(rules: &[Rule], state: &State) -> Vec<RuleView> {
    rules
        .iter()
        .map(|r| {
            let rs = state.engine.rules.get(&r.name);
            RuleView {
                name: r.name.clone(),
                breaching: rs.is_some_and(|s| s.breaching),
                pending: rs.and_then(|s| s.pending.clone()),
            }
        })
        .collect()
}

/// The text of a budget alert, as logged and sent.
pub fn alert_text(c: &Crossing) -> String {
    format!("budget \"{}\" {}", c.budget, crossing_text(c))
}

/// What a crossing says, without the budget's name (as `simulate` reports it).
pub fn crossing_text(c: &Crossing) -> String {
    format!(
        "{} spend is at {:.0}% of ${:.2} (threshold {:.0}%)",
        c.basis.as_str(),
        c.ratio * 100.0,
        c.limit,
        c.threshold * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Action, Aggregation, Condition, GpuReading, Statistic, Trigger};

    fn settings(budgets: Vec<Budget>) -> Settings {
        let idle = Rule {
            name: "idle".into(),
            scope: Scope::Node,
            subject: None,
            trigger: Trigger::Idle(Condition {
                metric: Metric::GpuUtilization,
                statistic: Statistic::Average,
                comparison: Comparison::LessThan,
                threshold: 0.05,
                period: Duration::from_secs(10),
                evaluation_periods: 1,
                datapoints_to_alarm: 1,
                gpus: Aggregation::Every,
            }),
            lifecycle: None,
            action: Action::Stop,
            command: Vec::new(),
            budget: None,
        };
        Settings::new(
            vec![idle],
            budgets,
            Period::Month,
            Duration::from_secs(5),
            Duration::from_secs(1),
            Duration::from_secs(1),
            0.0,
            0.0,
        )
    }

    fn obs(t: f64, u: f64) -> Observation {
        let mut g = GpuReading {
            index: 0,
            ..GpuReading::default()
        };
        g.set(Metric::GpuUtilization, Some(u));
        Observation {
            t,
            complete: true,
            gpus: vec![g],
            veto: None,
        }
    }

    #[test]
    fn the_slack_is_two_and_a_half_samples_or_the_timeout() {
        let s = |i, t| slack(Duration::from_millis(i), Duration::from_millis(t));
        assert_eq!(s(1000, 1000), 2.5);
        assert_eq!(s(1000, 5000), 5.0);
        assert_eq!(s(10, 10), 0.025);
    }

    #[test]
    fn one_step_warns_acts_and_shows_its_view() {
        let settings = settings(Vec::new());
        let mut state = State::default();
        let mut kinds = Vec::new();
        for t in 0..20 {
            let out = step(
                &settings,
                &mut state,
                &obs(t as f64, 0.0),
                &Inputs {
                    now: t as f64,
                    ..Inputs::default()
                },
            );
            kinds.extend(out.events.iter().map(|e| (t, e.kind())));
            if t == 12 {
                assert_eq!(
                    out.view.gpu_idle,
                    vec![GpuIdle {
                        index: 0,
                        idle: true,
                        seconds: 12.0
                    }]
                );
                let rule = &out.view.rules[0];
                assert!(rule.breaching);
                let pending = rule.pending.as_ref().unwrap();
                assert_eq!((pending.action, pending.due_at), (Action::Stop, 15.0));
                assert_eq!(out.view.spent, None, "no price, no spend");
            }
        }
        assert_eq!(kinds, vec![(10, "breach"), (10, "warning"), (15, "action")]);
    }

    #[test]
    fn budgets_cross_once_with_one_text_and_external_limits_apply() {
        let local = Budget {
            name: "team".into(),
            source: BudgetSource::Local,
            limit_usd: Some(10.0),
            thresholds: vec![0.5, 1.0],
        };
        let aws = Budget {
            name: "org".into(),
            source: BudgetSource::External,
            limit_usd: None,
            thresholds: vec![0.8],
        };
        let settings = settings(vec![local, aws]);
        let mut state = State::default();
        let price = Some(Price {
            usd_per_hour: 3600.0,
            source: Source::Config,
        });
        let external: BTreeMap<String, Reading> = [(
            "org".to_string(),
            Reading {
                spent: 90.0,
                forecast: None,
                limit: 100.0,
                period_start: 0.0,
            },
        )]
        .into();
        let mut texts = Vec::new();
        // $1 a second, from 2026-11-30 on.
        for t in 0..12 {
            let now = 1_796_000_000.0 + t as f64;
            let out = step(
                &settings,
                &mut state,
                &obs(now, 0.9),
                &Inputs {
                    now,
                    price,
                    external: external.clone(),
                    ..Inputs::default()
                },
            );
            texts.extend(
                out.crossings
                    .iter()
                    .filter(|c| c.basis == crate::cost::budget::Basis::Actual)
                    .map(alert_text),
            );
        }
        assert_eq!(
            texts,
            vec![
                "budget \"org\" actual spend is at 90% of $100.00 (threshold 80%)",
                "budget \"team\" actual spend is at 50% of $10.00 (threshold 50%)",
                "budget \"team\" actual spend is at 100% of $10.00 (threshold 100%)",
            ]
        );
    }

    #[test]
    fn idle_dollars_are_the_price_times_the_idle_share_and_skip_gaps_and_unknown_prices() {
        let settings = settings(Vec::new());
        let mut state = State::default();
        let price = Some(Price {
            usd_per_hour: 36.0,
            source: Source::Config,
        });
        let two = |t: f64, a: f64, b: f64| {
            let mut o = obs(t, a);
            let mut g = GpuReading {
                index: 1,
                ..GpuReading::default()
            };
            g.set(Metric::GpuUtilization, Some(b));
            o.gpus.push(g);
            o
        };
        let mut run = |t: f64, a: f64, b: f64, price: Option<Price>| {
            let inputs = Inputs {
                now: t,
                price,
                ..Inputs::default()
            };
            step(&settings, &mut state, &two(t, a, b), &inputs)
                .view
                .idle_dollars
        };
        // One GPU of two idle for 100 s at $36/h: $0.50. The first sample only starts the clock.
        assert_eq!(run(1000.0, 0.0, 0.9, price), 0.0);
        let mut total = 0.0;
        for t in 1..=100 {
            total = run(1000.0 + f64::from(t), 0.0, 0.9, price);
        }
        assert!((total - 0.5).abs() < 1e-9, "{total}");
        // Both idle for 10 s more: $0.10 more.
        for t in 101..=110 {
            total = run(1000.0 + f64::from(t), 0.0, 0.0, price);
        }
        assert!((total - 0.6).abs() < 1e-9, "{total}");
        // A gap longer than the slack (2.5 s here) and an unknown price accrue nothing.
        assert!((run(1120.0, 0.0, 0.0, price) - 0.6).abs() < 1e-9);
        assert!((run(1121.0, 0.0, 0.0, None) - 0.6).abs() < 1e-9);
        // Busy GPUs cost, but are not waste.
        assert!((run(1122.0, 0.9, 0.9, price) - 0.6).abs() < 1e-9);
    }

    #[test]
    fn a_pod_rule_judges_each_pod_on_its_own_gpus_and_forgets_pods_that_go() {
        let mut settings = settings(Vec::new());
        settings.rules[0].scope = Scope::Pod;
        settings.rules[0].action = Action::Alert;
        let mut state = State::default();
        // GPU 0 held by ml/idle (unused), GPU 1 by ml/busy (at work), GPU 2 by nobody (idle).
        let sample = |t: f64, busy_pod_there: bool| {
            let gpu = |index: u32, u: f64, holder: Option<&str>| {
                let mut g = GpuReading {
                    index,
                    holders: holder.map(String::from).into_iter().collect(),
                    ..GpuReading::default()
                };
                g.set(Metric::GpuUtilization, Some(u));
                g
            };
            Observation {
                t,
                complete: true,
                gpus: vec![
                    gpu(0, 0.0, Some("ml/idle")),
                    gpu(1, 0.9, busy_pod_there.then_some("ml/busy")),
                    gpu(2, 0.0, None),
                ],
                veto: None,
            }
        };
        let mut events = Vec::new();
        for t in 0..20 {
            let out = step(
                &settings,
                &mut state,
                &sample(f64::from(t), true),
                &Inputs {
                    now: f64::from(t),
                    ..Inputs::default()
                },
            );
            let names: Vec<&str> = out.rules.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(names, ["idle ml/busy", "idle ml/idle"]);
            events.extend(
                out.events
                    .iter()
                    .map(|e| (t, e.rule().to_string(), e.kind())),
            );
        }
        // Only the pod that holds an idle GPU breaches; the node as a whole (GPU 1 at work)
        // would not, and the unheld idle GPU 2 is no pod's.
        assert_eq!(
            events,
            [
                (10, "idle ml/idle".to_string(), "breach"),
                (10, "idle ml/idle".to_string(), "warning"),
                (15, "idle ml/idle".to_string(), "action"),
            ]
        );
        assert!(state.engine.rules.contains_key("idle ml/busy"));
        // ml/busy is gone: its rule and state go with it.
        let out = step(
            &settings,
            &mut state,
            &sample(20.0, false),
            &Inputs {
                now: 20.0,
                ..Inputs::default()
            },
        );
        assert_eq!(out.rules.len(), 1);
        assert!(!state.engine.rules.contains_key("idle ml/busy"));
    }
}
