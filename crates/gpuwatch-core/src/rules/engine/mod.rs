//! The decision state machine: breach, warn, re-check, act or cancel.
//!
//! `ingest` feeds observations; `evaluate` turns the state and a `Context` (the time, the boot
//! grace, holds, the instance's lifecycle) into events. Both are pure. The state is what the
//! daemon persists, so a restart resumes mid-window and mid-warning.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::window::{Assessment, Window};
use super::{Action, Aggregation, Condition, Lifecycle, Metric, Observation, Rule, Trigger};

/// Engine settings that are not per rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub warning: Duration,
    /// The longest gap between samples that still counts as complete data, in seconds.
    pub slack: f64,
}

/// Everything the engine needs to know about the world at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    /// Unix seconds.
    pub now: f64,
    /// No warning and no action before this time (boot grace).
    pub grace_until: f64,
    /// A hold that postpones every action until it expires.
    pub hold_until: Option<f64>,
    /// Holds of one job or user (`job 42`, `user alice`): they postpone that subject's rules'
    /// actions only.
    pub subject_holds: BTreeMap<String, f64>,
    pub lifecycle: Option<Lifecycle>,
    /// A spot interruption is announced: gpuwatch takes no competing action.
    pub interruption: bool,
    /// Each budget's spend as a share of its limit; a budget that is absent is unknown.
    pub budgets: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub rules: BTreeMap<String, RuleState>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleState {
    pub window: Window,
    pub breaching: bool,
    pub pending: Option<Pending>,
    /// Periods that start before this time never count again (after a cancel or an action).
    /// It never goes back, whatever the wall clock does.
    pub not_before: f64,
    /// An action handed to the executor whose result is not recorded yet.
    pub in_flight: Option<InFlight>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub action: Action,
    pub warned_at: f64,
    pub due_at: f64,
    /// Activity seen since the warning: the GPUs came back, or data went missing.
    pub activity: Option<String>,
    /// The postponement by a hold or an interruption has been reported.
    pub postponed: bool,
    /// The time of the latest observation since the warning (0 until one arrives): a gap
    /// longer than the slack between observations, or before the due time, is missing data,
    /// and missing data during a warning calls the action off.
    #[serde(default, skip_serializing_if = "crate::is_zero")]
    pub seen_until: f64,
}

impl Pending {
    /// The end of the data seen since the warning: the warning itself, or a later observation.
    fn seen(&self) -> f64 {
        self.seen_until.max(self.warned_at)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    pub action: Action,
    pub at: f64,
    /// The warning that led to it and the re-arm time before it, so that an action whose
    /// record could not be made durable can be withdrawn (`withdraw`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
    #[serde(default)]
    pub not_before: f64,
}

/// What happened, for the log, the audit log, the metrics and `simulate`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Event {
    /// The rule started breaching.
    Breach { rule: String, evidence: Assessment },
    /// The rule stopped breaching.
    Recovered { rule: String },
    /// A warning period started; the action is due at `due_at` unless the GPUs come back.
    Warning {
        rule: String,
        action: Action,
        due_at: f64,
        evidence: Assessment,
    },
    /// A pending action was called off.
    Cancelled {
        rule: String,
        action: Action,
        reason: String,
    },
    /// A due action waits for a hold or a spot interruption.
    Postponed {
        rule: String,
        action: Action,
        reason: String,
    },
    /// The action is due now; the executor must carry it out exactly once.
    Action {
        rule: String,
        action: Action,
        evidence: Assessment,
    },
}

impl Event {
    pub fn rule(&self) -> &str {
        match self {
            Event::Breach { rule, .. }
            | Event::Recovered { rule }
            | Event::Warning { rule, .. }
            | Event::Cancelled { rule, .. }
            | Event::Postponed { rule, .. }
            | Event::Action { rule, .. } => rule,
        }
    }

    /// The event in the words every edge says it with (`gpuwatch audit`, `simulate`, and for
    /// a cancellation and a postponement the log and the webhook too), for the events whose
    /// words are their own: a breach (its evidence), a recovery, a cancellation and a
    /// postponement (their reason). `None` for a warning and an action, whose words depend on
    /// their rule (`Rule::calls_off`) or on how the action went.
    pub fn sentence(&self) -> Option<String> {
        match self {
            Event::Breach { evidence, .. } => Some(breached(
                evidence.breaching_periods as usize,
                evidence.periods.len(),
                evidence.threshold,
            )),
            Event::Recovered { .. } => Some(RECOVERED.to_string()),
            Event::Cancelled { action, reason, .. } => Some(cancelled(*action, reason)),
            Event::Postponed { action, reason, .. } => Some(postponed(*action, reason)),
            Event::Warning { .. } | Event::Action { .. } => None,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Event::Breach { .. } => "breach",
            Event::Recovered { .. } => "recovered",
            Event::Warning { .. } => "warning",
            Event::Cancelled { .. } => "cancelled",
            Event::Postponed { .. } => "postponed",
            Event::Action { .. } => "action",
        }
    }
}

/// Feeds one observation to every rule, and notes activity against pending actions: a sample
/// that shows the GPUs in use, or one that comes more than `slack` seconds after the last, as
/// the GPUs were unknown in between.
pub fn ingest(rules: &[Rule], state: &mut State, obs: &Observation, slack: f64) {
    for rule in rules {
        let rs = state.rules.entry(rule.name.clone()).or_default();
        // A budget limit has no GPU window: it acts even when busy.
        let Trigger::Idle(condition) = &rule.trigger else {
            continue;
        };
        // Judged against the devices seen before this observation joins the window. (Not for
        // health: a broken GPU in MIG mode loses its MIG devices, and nobody made that.)
        let relaid = condition.metric != Metric::GpuUnhealthy && rs.window.devices_changed(obs);
        rs.window.ingest(condition, obs);
        // A rule that breaches while its warning is held back (by a hold, the boot grace, a
        // spot notice, a budget gate or a warning not on record) must not warn later on
        // periods older than work seen meanwhile: activity re-arms it, as a cancellation does.
        if rs.breaching
            && rs.pending.is_none()
            && rs.in_flight.is_none()
            && activity(condition, obs).is_some()
        {
            rs.not_before = rs.not_before.max(obs.t);
        }
        if let Some(p) = rs.pending.as_mut() {
            if p.activity.is_none() {
                p.activity = clock_back(p.seen(), obs.t, slack)
                    .or_else(|| gap(p.seen(), obs.t, slack))
                    .or_else(|| activity(condition, obs))
                    .or_else(|| {
                        // New devices read idle at first: the change itself is the activity.
                        relaid.then(|| {
                            "the GPUs or their MIG layout changed during the warning".to_string()
                        })
                    });
            }
            p.seen_until = p.seen_until.max(obs.t);
        }
    }
}

/// A wall clock stepped back during a warning: samples are taken in order, so one older than
/// the warning or than a sample since is a clock step, not late data. The window ignores such
/// samples, and the due time no longer means the warning the operator was given: a step back
/// by more than the slack calls the warning off. (Within the slack, as for a gap, the sample is
/// still checked for activity.)
fn clock_back(seen: f64, t: f64, slack: f64) -> Option<String> {
    (seen - t > slack).then(|| {
        format!(
            "the clock went back {:.1} s during the warning (a sample at {})",
            seen - t,
            crate::time::rfc3339(t)
        )
    })
}

/// Missing data between two times: the GPUs were unknown for longer than the slack, and unknown
/// is busy.
fn gap(from: f64, to: f64, slack: f64) -> Option<String> {
    (to - from > slack).then(|| {
        format!(
            "no GPU data for {:.0} s during the warning (unknown is busy)",
            to - from
        )
    })
}

/// Why one observation shows the node active for a condition, if it does.
fn activity(rule: &Condition, obs: &Observation) -> Option<String> {
    if let Some(v) = &obs.veto {
        return Some(format!("activity veto: {v}"));
    }
    if !obs.complete || obs.gpus.is_empty() {
        return Some("GPU data went missing (unknown is busy)".into());
    }
    let mut idle = 0;
    for g in &obs.gpus {
        // As in the window, a reading that is not finite or is negative is no reading.
        match g.get(rule.metric).filter(|v| v.is_finite() && *v >= 0.0) {
            None => {
                return Some(format!(
                    "GPU {} has no {} reading",
                    g.index,
                    rule.metric.as_str()
                ))
            }
            Some(v) if rule.comparison.holds(v, rule.threshold) => idle += 1,
            Some(v) => {
                if rule.gpus == Aggregation::Every {
                    return Some(format!(
                        "GPU {} came back: {} {v:.3}",
                        g.index,
                        rule.metric.as_str()
                    ));
                }
            }
        }
    }
    (idle == 0).then(|| "no GPU meets the rule any more".to_string())
}

/// Advances every rule to `ctx.now` and returns what happened, in rule order.
pub fn evaluate(
    rules: &[Rule],
    settings: &Settings,
    state: &mut State,
    ctx: &Context,
) -> Vec<Event> {
    let mut events = Vec::new();
    for rule in rules {
        let rs = state.rules.entry(rule.name.clone()).or_default();
        if rule.lifecycle.is_some() && rule.lifecycle != ctx.lifecycle {
            // Not for this instance; a lifecycle that is unknown matches no filter. A warning
            // given while it matched rests on it too: it is called off, not left to fall due
            // whenever the lifecycle is known again.
            if let Some(pending) = rs.pending.take() {
                rs.not_before = rs.not_before.max(ctx.now).max(pending.seen());
                events.push(Event::Cancelled {
                    rule: rule.name.clone(),
                    action: pending.action,
                    reason: "the instance's lifecycle no longer matches the rule's (or is unknown)"
                        .into(),
                });
            }
            continue;
        }
        evaluate_rule(rule, settings, ctx, rs, &mut events);
    }
    events
}

/// Advances one rule that is for this instance: reports its breach or recovery, then warns,
/// postpones, cancels or acts.
fn evaluate_rule(
    rule: &Rule,
    settings: &Settings,
    ctx: &Context,
    rs: &mut RuleState,
    events: &mut Vec<Event>,
) {
    let (raw, shut) = assess(rule, rs, settings, ctx);
    if raw.breaching != rs.breaching {
        rs.breaching = raw.breaching;
        events.push(if raw.breaching {
            Event::Breach {
                rule: rule.name.clone(),
                evidence: raw.clone(),
            }
        } else {
            Event::Recovered {
                rule: rule.name.clone(),
            }
        });
    }
    let armed = armed(rule, rs, raw, settings, ctx);
    if rs.in_flight.is_some() {
        return;
    }
    let blocked = blocked(rule, ctx);
    let event = match rs.pending.take() {
        None if armed.breaching && blocked.is_none() => Some(warn(rule, settings, ctx, rs, armed)),
        None => None,
        Some(pending) => settle(
            rule,
            settings,
            ctx,
            rs,
            pending,
            Finding {
                armed,
                blocked,
                shut,
            },
        ),
    };
    events.extend(event);
}

/// Whether the rule breaches at all (reported), and why the budget the action rests on no
/// longer lets it act (its gate, or its limit), judged on every evaluation: a warning outlives
/// no reason it was given for.
fn assess(
    rule: &Rule,
    rs: &RuleState,
    settings: &Settings,
    ctx: &Context,
) -> (Assessment, Option<String>) {
    let mut raw = match &rule.trigger {
        Trigger::BudgetExhausted { budget } => exhausted(budget, ctx),
        Trigger::Idle(c) => rs
            .window
            .assess(c, ctx.now, settings.slack, f64::NEG_INFINITY),
    };
    let mut shut = None;
    if let Some(gate) = &rule.budget {
        // Unknown spend keeps the gate shut: a budget rule never acts on a guess.
        let ratio = ctx.budgets.get(&gate.name).copied();
        raw.budget = Some((gate.name.clone(), ratio));
        if !ratio.is_some_and(|r| r + 1e-12 >= gate.spent_at_least) {
            raw.breaching = false;
            shut = Some(budget_shut(&gate.name, ratio, gate.spent_at_least));
        }
    }
    if let Trigger::BudgetExhausted { budget } = &rule.trigger {
        if !raw.breaching {
            shut = Some(budget_shut(budget, ctx.budgets.get(budget).copied(), 1.0));
        }
    }
    (raw, shut)
}

/// Whether the rule breaches on periods since it was last re-armed: what it may act on.
fn armed(
    rule: &Rule,
    rs: &RuleState,
    raw: Assessment,
    settings: &Settings,
    ctx: &Context,
) -> Assessment {
    match &rule.trigger {
        Trigger::BudgetExhausted { .. } => {
            // A budget limit has no windows to refresh: after an action or a cancellation
            // it re-arms an hour later, so a failed stop is retried hourly, not in a loop.
            let mut armed = raw;
            armed.breaching &= rs.not_before <= 0.0 || ctx.now >= rs.not_before + EXHAUSTED_REARM;
            armed
        }
        Trigger::Idle(c) if rs.not_before > 0.0 => {
            let mut armed = rs.window.assess(c, ctx.now, settings.slack, rs.not_before);
            armed.breaching &= raw.breaching;
            armed.budget = raw.budget.clone();
            armed
        }
        Trigger::Idle(_) => raw,
    }
}

/// What holds the rule's action back now: a spot interruption, the boot grace, or a hold on
/// the node or on the rule's job or user.
fn blocked(rule: &Rule, ctx: &Context) -> Option<String> {
    if ctx.interruption {
        Some("a spot interruption is pending".to_string())
    } else if ctx.now < ctx.grace_until {
        // The grace after a start holds back an action carried over from before it too.
        Some(format!(
            "the start-up grace lasts until {}",
            crate::time::rfc3339(ctx.grace_until)
        ))
    } else {
        let subject = rule
            .hold_key()
            .and_then(|k| ctx.subject_holds.get(&k).copied());
        let hold = [ctx.hold_until, subject]
            .into_iter()
            .flatten()
            .reduce(f64::max);
        hold.filter(|&h| h > ctx.now).map(|h| {
            if h.is_finite() {
                format!("a hold is in place until {}", crate::time::rfc3339(h))
            } else {
                "a hold without a readable expiry is in place".to_string()
            }
        })
    }
}

/// Starts the warning period of a rule that breaches on fresh data with nothing pending.
fn warn(
    rule: &Rule,
    settings: &Settings,
    ctx: &Context,
    rs: &mut RuleState,
    armed: Assessment,
) -> Event {
    let due_at = ctx.now + settings.warning.as_secs_f64();
    rs.pending = Some(Pending {
        action: rule.action,
        warned_at: ctx.now,
        due_at,
        activity: None,
        postponed: false,
        seen_until: 0.0,
    });
    Event::Warning {
        rule: rule.name.clone(),
        action: rule.action,
        due_at,
        evidence: armed,
    }
}

/// What one evaluation finds of a rule, for the warning it has pending.
struct Finding {
    /// The assessment on periods since the rule was last re-armed.
    armed: Assessment,
    /// What holds a due action back (`blocked`).
    blocked: Option<String>,
    /// Why the budget the action rests on no longer lets it act.
    shut: Option<String>,
}

/// Settles a pending warning: calls it off, keeps it, postpones it, or hands out its action
/// once it is due.
fn settle(
    rule: &Rule,
    settings: &Settings,
    ctx: &Context,
    rs: &mut RuleState,
    mut pending: Pending,
    f: Finding,
) -> Option<Event> {
    let name = || rule.name.clone();
    // The rule now says another action (the config changed across a restart): the warning
    // given was for the old one.
    let changed = (pending.action != rule.action).then(|| {
        format!(
            "the rule's action changed from {} to {}",
            pending.action, rule.action
        )
    });
    let missing = match &rule.trigger {
        Trigger::Idle(_) if ctx.now >= pending.due_at => {
            gap(pending.seen(), ctx.now, settings.slack)
        }
        _ => None,
    };
    if let Some(reason) = changed.or(pending.activity.take()).or(f.shut).or(missing) {
        // The periods seen up to the cancellation never count again, even when it was the
        // clock that went back.
        rs.not_before = rs.not_before.max(ctx.now).max(pending.seen());
        Some(Event::Cancelled {
            rule: name(),
            action: pending.action,
            reason,
        })
    } else if ctx.now < pending.due_at {
        rs.pending = Some(pending);
        None
    } else if let Some(reason) = f.blocked {
        let event = (!pending.postponed).then(|| Event::Postponed {
            rule: name(),
            action: pending.action,
            reason,
        });
        pending.postponed = true;
        rs.pending = Some(pending);
        event
    } else if !f.armed.breaching {
        rs.not_before = rs.not_before.max(ctx.now);
        Some(Event::Cancelled {
            rule: name(),
            action: pending.action,
            reason: "the rule no longer breaches on fresh data".into(),
        })
    } else {
        let not_before = rs.not_before;
        rs.not_before = not_before.max(ctx.now);
        rs.in_flight = Some(InFlight {
            action: pending.action,
            at: ctx.now,
            pending: Some(pending.clone()),
            not_before,
        });
        Some(Event::Action {
            rule: name(),
            action: pending.action,
            evidence: f.armed,
        })
    }
}

/// Why a budget no longer lets an action run: its spend is unknown, or below `at_least` of
/// its limit.
fn budget_shut(budget: &str, ratio: Option<f64>, at_least: f64) -> String {
    match ratio {
        None => format!("the spend of budget \"{budget}\" is unknown (unknown holds)"),
        Some(r) => format!(
            "budget \"{budget}\" is {}% spent, under the {}% the action rests on",
            super::percent(r),
            super::percent(at_least)
        ),
    }
}

/// A breach in words, from its evidence: "2 of 2 periods breach the threshold 0.05".
pub fn breached(breaching_periods: usize, periods: usize, threshold: f64) -> String {
    format!("{breaching_periods} of {periods} periods breach the threshold {threshold}")
}

/// A recovery in words.
pub const RECOVERED: &str = "no longer breaching";

/// A cancellation in words: "stop cancelled: the GPUs came back ...".
pub fn cancelled(action: Action, reason: &str) -> String {
    format!("{action} cancelled: {reason}")
}

/// A postponement in words: "stop postponed: a hold is in place until ...".
pub fn postponed(action: Action, reason: &str) -> String {
    format!("{action} postponed: {reason}")
}

/// Seconds before a budget limit that acted (or was cancelled) may act again.
const EXHAUSTED_REARM: f64 = 3600.0;

/// The assessment of a budget's hard limit: breaching once its spend reaches the limit.
fn exhausted(budget: &str, ctx: &Context) -> Assessment {
    let ratio = ctx.budgets.get(budget).copied();
    Assessment {
        breaching: ratio.is_some_and(|r| r + 1e-12 >= 1.0),
        breaching_periods: 0,
        threshold: 1.0,
        periods: Vec::new(),
        budget: Some((budget.to_string(), ratio)),
        problems: Vec::new(),
        gpus: Vec::new(),
    }
}

/// Takes back an action that was handed out but never ran (its record could not be made
/// durable): the rule is pending again, as it was when the action fell due, so the action falls
/// due again at the next evaluation, if the rule still breaches then.
pub fn withdraw(state: &mut State, rule: &str) {
    if let Some(rs) = state.rules.get_mut(rule) {
        if let Some(f) = rs.in_flight.take() {
            rs.pending = f.pending;
            rs.not_before = f.not_before;
        }
    }
}

/// Takes back a warning that is not on record: the rule has nothing pending, and warns again
/// at its next evaluation if it still breaches.
pub fn unwarn(state: &mut State, rule: &str) {
    if let Some(rs) = state.rules.get_mut(rule) {
        rs.pending = None;
    }
}

/// Records that the executor finished the rule's in-flight action.
pub fn complete(state: &mut State, rule: &str) {
    if let Some(rs) = state.rules.get_mut(rule) {
        rs.in_flight = None;
    }
}

#[cfg(test)]
mod tests;
