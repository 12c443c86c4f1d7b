//! The one decision step. The daemon runs it on every sample; `gpuwatch simulate` runs it on
//! every timestamp of a trace. Both build their `Settings` with `Settings::new` and call `step`,
//! so the slack between samples, spend accrual, budget crossings and alert text cannot differ.
//!
//! `step` takes the persisted state, one observation and the world at that moment (`Inputs`),
//! and returns everything the edge has to log, record, send, carry out and export (`Decision`),
//! with the order it must do so in around the save of the state (`order`). It does no I/O and
//! reads no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cost::budget::{Alerted, Crossing, Reading};
use crate::cost::calendar::Period;
use crate::cost::ledger::{Closed, Ledger};
use crate::cost::price::{Price, Source};
use crate::rules::engine::{self, Context, Event};
use crate::rules::{Comparison, DeviceKey, Lifecycle, Metric, MigDevice, Observation, Rule, Scope};

mod budgets;
mod health;
pub mod order;
mod subjects;
use budgets::judge_budgets;
use order::Unsaved;
use subjects::subject_observation;
pub use subjects::{rules_for, verdict_stands};

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
    /// The sample up to which `idle_dollars` (and `unhealthy_dollars`) is accrued.
    #[serde(default)]
    pub idle_accrued_until: f64,
    /// USD spent on GPUs while they were unhealthy, since the state began: the price times
    /// the unhealthy GPUs' share of the node's GPUs.
    #[serde(default)]
    pub unhealthy_dollars: f64,
    /// What GPU health remembers across restarts: the XIDs held against GPUs until they are
    /// reset. The sampler judges health; the state only keeps this for it.
    #[serde(default)]
    pub health: crate::health::Memory,
    /// Each Slurm job holding a GPU now: how long its GPUs sat idle, and what that cost. A job
    /// that holds no GPU any more is dropped.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<String, Tally>,
    /// The same for each user whose processes (or jobs) run on a GPU now.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub users: BTreeMap<String, Tally>,
    /// Since when each device (GPU or MIG device) has been idle (for the idle-time view; not
    /// persisted).
    #[serde(skip)]
    pub idle_since: BTreeMap<DeviceKey, f64>,
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
    /// The sampling interval, in seconds.
    pub interval: f64,
    /// The longest gap between samples that still counts as complete data, in seconds.
    pub slack: f64,
    /// No warning and no action before this time (boot grace).
    pub grace_until: f64,
    /// When the machine started running: spend accrues from here at the earliest.
    pub running_since: f64,
    /// What makes a device count as idle in the view (idle time, idle dollars).
    pub idle_by: IdleBy,
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
        let idle_by = IdleBy::from_rules(&rules);
        Settings {
            rules,
            budgets,
            period,
            warning,
            interval: interval.as_secs_f64(),
            slack: slack(interval, timeout),
            grace_until,
            running_since,
            idle_by,
        }
    }
}

/// The longest gap between samples that still counts as complete data.
pub fn slack(interval: Duration, timeout: Duration) -> f64 {
    (interval.as_secs_f64() * 2.5).max(timeout.as_secs_f64())
}

/// What makes a device count as idle for the view: readings below thresholds, in order. The
/// first of them the device has decides, so that a MIG device (which has no utilization) is
/// judged by its SM activity, and a GPU without GPM by its utilization.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleBy(pub Vec<(Metric, Comparison, f64)>);

impl IdleBy {
    /// The rules' own "below" conditions, the lowest threshold of each metric, in the order
    /// the rules name them; then `gpu_utilization` and `sm_active` below 5% where no rule
    /// names them.
    pub fn from_rules(rules: &[Rule]) -> IdleBy {
        let mut by: Vec<(Metric, Comparison, f64)> = Vec::new();
        let below = rules.iter().filter_map(Rule::condition).filter(|c| {
            matches!(
                c.comparison,
                Comparison::LessThan | Comparison::LessThanOrEqual
            )
        });
        for c in below {
            match by.iter_mut().find(|(m, _, _)| *m == c.metric) {
                // The stricter of two: the lower threshold; at a tie, "below" over "at most".
                Some((_, cmp, t)) => {
                    if c.threshold < *t
                        || (c.threshold == *t && c.comparison == Comparison::LessThan)
                    {
                        (*cmp, *t) = (c.comparison, c.threshold);
                    }
                }
                None => by.push((c.metric, c.comparison, c.threshold)),
            }
        }
        for m in [Metric::GpuUtilization, Metric::SmActive] {
            if !by.iter().any(|(x, _, _)| *x == m) {
                by.push((m, Comparison::LessThan, 0.05));
            }
        }
        IdleBy(by)
    }

    /// Whether the reading counts as idle; `None` when it has none of the readings.
    pub fn judge(&self, g: &crate::rules::GpuReading) -> Option<bool> {
        self.0
            .iter()
            .find_map(|(m, cmp, t)| g.get(*m).map(|v| cmp.holds(v, *t)))
    }
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
    /// Why an external budget has no reading, by budget name: shown in its view. An unknown
    /// spend crosses no threshold, opens no gate and exhausts nothing.
    pub unknown: BTreeMap<String, String>,
    /// Holds in force of one job or one user (`job 42`, `user alice`), until when.
    pub subject_holds: BTreeMap<String, f64>,
    /// Seconds the machine has been asleep (suspended or hibernated) since it booted: that
    /// time accrues no spend.
    pub suspended: f64,
    /// The monotonic clock when the observation was taken (seconds, any origin), which bounds
    /// how much time it accrues (`Ledger::skip_unrun`); `None` for a replayed trace.
    pub monotonic: Option<f64>,
}

/// What a job's or a user's GPUs cost while idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// GPU-seconds idle while held: each idle GPU adds the time, a MIG device its share of it.
    pub idle_seconds: f64,
    /// USD: the node's price times each idle device's share of the node, split evenly among
    /// the holders of the device.
    pub idle_dollars: f64,
}

/// What one step produced.
#[derive(Debug, PartialEq)]
pub struct Decision {
    /// The rules this step judged: every configured node rule, and each pod-scoped rule once
    /// per pod that held a GPU. Events name one of these.
    pub rules: Vec<Rule>,
    /// The rule events (in rule order) and the budget thresholds crossed for the first time
    /// this period (recorded in the state), to handle around the save of the state: some
    /// before it, the rest once `on_saved` has been told how it went. An `Event::Action` is in
    /// flight in the state until `order::on_executed` settles it.
    pub order: Unsaved,
    /// Budget periods that ended, with their totals.
    pub closed: Vec<Closed>,
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
    /// Each device (GPU, or MIG device) with a reading `IdleBy` judges: how long it has been
    /// idle.
    pub gpu_idle: Vec<GpuIdle>,
    /// USD spent on idle GPUs so far (a counter).
    pub idle_dollars: f64,
    /// USD spent on unhealthy GPUs so far (a counter).
    pub unhealthy_dollars: f64,
    /// Each job holding a GPU now, with its tally.
    pub jobs: BTreeMap<String, Tally>,
    /// Each user holding a GPU now, with its tally.
    pub users: BTreeMap<String, Tally>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuIdle {
    pub index: u32,
    /// The MIG device, for one of a GPU in MIG mode.
    pub mig: Option<MigDevice>,
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
    /// Why the spend is unknown, for an external budget without a reading.
    pub unknown: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuleView {
    pub name: String,
    /// The rule in words.
    pub summary: String,
    pub breaching: bool,
    /// For a rule on the GPUs' readings: its last complete periods, as they count now.
    pub counted: Option<Counted>,
    /// The pending action: which, and when it is due.
    pub pending: Option<engine::Pending>,
    /// What calls the pending action off (`Rule::calls_off`), the words after "unless".
    pub calls_off: String,
}

/// How a rule's last periods count: `breaching` of `of` complete periods breach, and it takes
/// `needed` of them to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counted {
    pub breaching: u32,
    pub of: u32,
    pub needed: u32,
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
    // Kept so that a failed save can take this step's budget alerts back.
    let alerted_before = state.alerted.clone();
    let rules = rules_for(&settings.rules, obs);
    let idle_obs = health::for_idle(obs);
    let health_obs = rules
        .iter()
        .any(judges_health)
        .then(|| health::for_health(obs));
    feed_rules(settings, state, obs, &rules, &idle_obs, health_obs.as_ref());
    let (closed, spent, forecast) = accrue_spend(settings, state, inputs);
    let judged = judge_budgets(settings, state, inputs, &closed, (spent, forecast));

    let ctx = Context {
        now,
        grace_until: settings.grace_until,
        hold_until: inputs.hold_until,
        subject_holds: inputs.subject_holds.clone(),
        lifecycle: inputs.lifecycle,
        interruption: inputs.interruption,
        budgets: judged.ratios,
    };
    let engine_settings = engine::Settings {
        warning: settings.warning,
        slack: settings.slack,
    };
    let mut events = engine::evaluate(&rules, &engine_settings, &mut state.engine, &ctx);
    name_subject_devices(&mut events, &rules, obs);
    if let Some(h) = &health_obs {
        name_problems(&mut events, &rules, h);
    }

    let gpu_idle = idle_runs(settings, state, &idle_obs, now);
    let mut indices: Vec<u32> = obs.gpus.iter().map(|g| g.index).collect();
    indices.sort_unstable();
    indices.dedup();
    let held = accrue_waste(
        settings,
        state,
        inputs,
        (&idle_obs.gpus, &gpu_idle),
        health::unhealthy_gpus(obs),
        indices.len(),
    );
    // Holders that hold no GPU any more are done with (unless holders are unknown now).
    if !obs.holders_unknown {
        state.jobs.retain(|j, _| held.0.contains(j.as_str()));
        state.users.retain(|u, _| held.1.contains(u.as_str()));
    }
    let views = rule_views(&rules, state, settings, now);

    Decision {
        rules,
        order: Unsaved::new(events, judged.crossings, alerted_before),
        closed,
        view: View {
            price: inputs.price,
            spent,
            forecast,
            budgets: judged.views,
            rules: views,
            gpu_idle,
            idle_dollars: state.idle_dollars,
            unhealthy_dollars: state.unhealthy_dollars,
            jobs: state.jobs.clone(),
            users: state.users.clone(),
        },
    }
}

/// Feeds each rule the observation it judges: a rule on health the one with health readings,
/// a job's, pod's or user's rule its holder's part; then drops the state of rules gone.
fn feed_rules(
    settings: &Settings,
    state: &mut State,
    obs: &Observation,
    rules: &[Rule],
    idle_obs: &Observation,
    health_obs: Option<&Observation>,
) {
    for rule in rules {
        let one = std::slice::from_ref(rule);
        let o = match health_obs {
            Some(h) if judges_health(rule) => h,
            _ => idle_obs,
        };
        match &rule.subject {
            None => engine::ingest(one, &mut state.engine, o, settings.slack),
            Some(who) => engine::ingest(
                one,
                &mut state.engine,
                &subject_observation(o, rule.scope, who),
                settings.slack,
            ),
        }
    }
    // A pod, job or user that holds no GPU any more is done with: its rules' state goes
    // (unless an action of it is in flight, which the edge settles).
    // While holders are unknown, a job's or user's state is kept: it may hold them still.
    let keep = |name: &str| {
        obs.holders_unknown
            && settings
                .rules
                .iter()
                .any(|r| matches!(r.scope, Scope::Job | Scope::User) && r.owns_state(name))
    };
    state.engine.rules.retain(|name, rs| {
        rules.iter().any(|r| &r.name == name) || rs.in_flight.is_some() || keep(name)
    });
}

/// Keeps a spot price, and accrues the ledger up to now. Returns the periods that closed, the
/// spend of this period (`None` while the price is unknown) and its forecast.
fn accrue_spend(
    settings: &Settings,
    state: &mut State,
    inputs: &Inputs,
) -> (Vec<Closed>, Option<f64>, Option<f64>) {
    let now = inputs.now;
    if let (Some(p), Some(Lifecycle::Spot)) = (inputs.price, inputs.lifecycle) {
        if p.source == Source::Spot {
            state.spot_price = Some(p.usd_per_hour);
        }
    }
    state.ledger.skip_asleep(inputs.suspended);
    state.ledger.skip_unrun(now, inputs.monotonic);
    let closed = state.ledger.accrue(
        now,
        inputs.price.map(|p| p.usd_per_hour),
        settings.period,
        settings.running_since,
    );
    let spent = inputs.price.map(|_| state.ledger.spent);
    let forecast = state.ledger.forecast(now, settings.period);
    (closed, spent, forecast)
}

/// The evidence a rule's event carries, to fill in.
fn evidence(e: &mut Event) -> Option<&mut crate::rules::window::Assessment> {
    match e {
        Event::Breach { evidence, .. }
        | Event::Warning { evidence, .. }
        | Event::Action { evidence, .. } => Some(evidence),
        _ => None,
    }
}

/// A pod's, job's or user's rule names the devices it judged, for its evidence, its command
/// and a pod's reclaim verdict.
fn name_subject_devices(events: &mut [Event], rules: &[Rule], obs: &Observation) {
    for e in events {
        let Some(rule) = rules.iter().find(|r| r.name == e.rule()) else {
            continue;
        };
        let (Scope::Pod | Scope::Job | Scope::User, Some(who)) = (rule.scope, &rule.subject) else {
            continue;
        };
        if let Some(evidence) = evidence(e) {
            evidence.gpus = subjects::devices(obs, rule.scope, who);
        }
    }
}

/// A rule on health names each problem of `health_obs` in its evidence.
fn name_problems(events: &mut [Event], rules: &[Rule], health_obs: &Observation) {
    let problems = health::problems(health_obs);
    for e in events {
        if !rules.iter().any(|r| r.name == e.rule() && judges_health(r)) {
            continue;
        }
        if let Some(evidence) = evidence(e) {
            evidence.problems.clone_from(&problems);
        }
    }
}

/// How long each device `IdleBy` judges has been idle without a break. Only devices idle now
/// keep their start: one that is busy, unknown or gone (a MIG layout changed, a GPU lost)
/// starts over.
fn idle_runs(
    settings: &Settings,
    state: &mut State,
    idle_obs: &Observation,
    now: f64,
) -> Vec<GpuIdle> {
    let before = std::mem::take(&mut state.idle_since);
    let mut gpu_idle = Vec::with_capacity(idle_obs.gpus.len());
    for g in &idle_obs.gpus {
        let Some(idle) = settings.idle_by.judge(g) else {
            continue;
        };
        let key = g.key();
        // A start after now (the wall clock stepped back) starts over: never a negative run.
        let start = before.get(&key).copied().filter(|s| *s <= now);
        let since = idle.then(|| start.unwrap_or(now));
        if let Some(s) = since {
            state.idle_since.insert(key, s);
        }
        gpu_idle.push(GpuIdle {
            index: g.index,
            mig: g.mig,
            idle,
            seconds: since.map_or(0.0, |s| now - s),
        });
    }
    gpu_idle
}

/// Accrues the money spent on idle GPUs since the last sample: the price times the share of the
/// node's GPUs that are idle now (a MIG device counts as its share of its GPU); and on
/// unhealthy GPUs, the price times their share. Each idle device's time and cost also go to
/// the jobs and users holding it. A gap longer than the slack, or an unknown price, accrues
/// nothing (unknown is neither idle nor unhealthy; idle time needs no price).
///
/// Returns the jobs and the users that hold a device now.
fn accrue_waste<'a>(
    settings: &Settings,
    state: &mut State,
    inputs: &Inputs,
    (readings, gpu_idle): (&'a [crate::rules::GpuReading], &[GpuIdle]),
    unhealthy: usize,
    gpus: usize,
) -> (BTreeSet<&'a str>, BTreeSet<&'a str>) {
    let now = inputs.now;
    let dt = now - state.idle_accrued_until;
    let accrues = state.idle_accrued_until > 0.0 && dt > 0.0 && dt <= settings.slack && gpus > 0;
    if let (Some(price), true) = (inputs.price, accrues) {
        let idle: f64 = gpu_idle
            .iter()
            .filter(|g| g.idle)
            .map(|g| g.mig.map_or(1.0, |m| m.share))
            .sum();
        state.idle_dollars += price.usd_per_hour * idle / gpus as f64 * dt / 3600.0;
        state.unhealthy_dollars +=
            price.usd_per_hour * unhealthy as f64 / gpus as f64 * dt / 3600.0;
    }
    let mut held = (BTreeSet::new(), BTreeSet::new());
    for g in readings {
        held.0.extend(g.jobs.iter().map(String::as_str));
        held.1.extend(g.users.iter().map(String::as_str));
        let idle = gpu_idle
            .iter()
            .any(|i| i.idle && i.index == g.index && i.mig == g.mig);
        let share = g.mig.map_or(1.0, |m| m.share);
        let (seconds, dollars) = if idle && accrues {
            let usd = inputs
                .price
                .map_or(0.0, |p| p.usd_per_hour * share / gpus as f64 * dt / 3600.0);
            (dt * share, usd)
        } else {
            (0.0, 0.0)
        };
        for (holders, tallies) in [(&g.jobs, &mut state.jobs), (&g.users, &mut state.users)] {
            for h in holders {
                let t = tallies.entry(h.clone()).or_default();
                t.idle_seconds += seconds;
                t.idle_dollars += dollars / holders.len() as f64;
            }
        }
    }
    // Even when the wall clock stepped back: the next sample accrues from this one.
    state.idle_accrued_until = now;
    held
}

/// Whether a rule judges GPU health rather than idleness.
fn judges_health(rule: &Rule) -> bool {
    rule.condition()
        .is_some_and(|c| c.metric == Metric::GpuUnhealthy)
}

/// Each rule as the state has it now: breaching, and its pending action. The edge calls this
/// again after it has carried out (or withdrawn) the step's actions.
pub fn rule_views(rules: &[Rule], state: &State, settings: &Settings, now: f64) -> Vec<RuleView> {
    rules
        .iter()
        .map(|r| {
            let rs = state.engine.rules.get(&r.name);
            let counted = r.condition().map(|c| {
                let a = rs.map(|s| {
                    s.window
                        .assess(c, now, settings.slack, f64::NEG_INFINITY)
                        .breaching_periods
                });
                Counted {
                    breaching: a.unwrap_or(0),
                    of: c.evaluation_periods,
                    needed: c.datapoints_to_alarm,
                }
            });
            RuleView {
                name: r.name.clone(),
                summary: r.describe(),
                breaching: rs.is_some_and(|s| s.breaching),
                counted,
                pending: rs.and_then(|s| s.pending.clone()),
                calls_off: r.calls_off(),
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
mod budget_tests;
#[cfg(test)]
mod tests;
