//! The order of one step's consequences around the save of the state.
//!
//! The edge saves the state after every step, and what the step decided is safe only in one
//! order around that save:
//!
//! - A warning is on record and sent before the state that makes its action possible is saved
//!   (as are the breaches, recoveries and postponements beside it): a crash in between means a
//!   repeated warning after the restart, never an action without one. A warning whose record
//!   cannot be written is taken back (`on_warned`) and given again at the next step.
//! - A cancellation and an action follow the save. An action must not run that a restart could
//!   not know about: one whose in-flight mark could not be saved did not run; it is withdrawn,
//!   and falls due again once the disk recovers (if the rule still breaches then). A cancellation
//!   is announced after the save is tried, whether it worked or not: it withdraws nothing, and a
//!   restart from the old state cancels (or re-warns) again.
//! - A budget alert is recorded before it is sent: it is sent only after a good save. After a
//!   failed one it is withheld and its thresholds are taken back, so they cross again once the
//!   state can be saved.
//!
//! `step` returns an `Unsaved`: the events to handle before the save, and whether the save must
//! be durable. Only `Unsaved::on_saved`, told whether the save worked, gives the rest (a
//! `Saved`). An action carried out is settled with `on_executed`, one that waited too long behind
//! another action of its step with `on_deferred` (see `defer`), and one left in flight by a
//! restart with `settle_in_flight`. None of this does I/O: the edge saves, logs and sends.

mod drive;
pub use drive::{drive, drive_at_once, Edge};

use crate::cost::budget::{Alerted, Crossing};
use crate::rules::engine::{self, Event, InFlight};
use crate::rules::Action;

use super::{Settings, State};

/// When the edge handles an event: before the state is saved, or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Breaches, recoveries, warnings and postponements.
    BeforeSave,
    /// Cancellations and actions.
    AfterSave,
}

impl Phase {
    pub fn of(event: &Event) -> Phase {
        match event {
            Event::Breach { .. }
            | Event::Recovered { .. }
            | Event::Warning { .. }
            | Event::Postponed { .. } => Phase::BeforeSave,
            Event::Cancelled { .. } | Event::Action { .. } => Phase::AfterSave,
        }
    }
}

/// How the edge must save the state next.
#[must_use = "the state must be saved"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Save {
    /// The save must reach the disk (fsync) before the edge goes on.
    pub durable: bool,
}

/// What one step decided, while the state that records it is not saved yet. Its after-save
/// part is reachable only through `on_saved`, which takes it, so that it cannot be handled
/// before the save nor twice.
#[must_use = "the step's events must be handled and the state saved"]
#[derive(Debug, PartialEq)]
pub struct Unsaved {
    /// Every event of the step, in engine order (rule order).
    events: Vec<Event>,
    /// The budget thresholds crossed, already marked alerted in the state.
    crossings: Vec<Crossing>,
    /// `State::alerted` as it was before the step, kept when the step crossed a threshold, so
    /// that a failed save can take the crossings back.
    alerted_before: Option<Alerted>,
}

impl Unsaved {
    pub(super) fn new(
        events: Vec<Event>,
        crossings: Vec<Crossing>,
        alerted_before: Alerted,
    ) -> Unsaved {
        let alerted_before = (!crossings.is_empty()).then_some(alerted_before);
        Unsaved {
            events,
            crossings,
            alerted_before,
        }
    }

    /// The events to handle (log, audit, notify) before the state is saved, in engine order.
    pub fn before_save(&self) -> impl Iterator<Item = &Event> {
        self.events
            .iter()
            .filter(|e| Phase::of(e) == Phase::BeforeSave)
    }

    /// How to save: durably when anything was decided or a threshold crossed. (The edge may
    /// make a save durable for reasons of its own as well, such as once a minute.)
    pub fn save(&self) -> Save {
        Save {
            durable: !self.events.is_empty() || !self.crossings.is_empty(),
        }
    }

    /// Takes what the step decided past the save; `ok` is whether the save worked.
    ///
    /// After a good save, everything stands. After a failed one, what a restart could not know
    /// about is taken back: each action is withdrawn in the state (and listed, for the edge to
    /// log and count), and the crossings are dropped with `State::alerted` restored. A
    /// cancellation still stands: it withdraws nothing, and the state no longer holds its
    /// pending action.
    pub fn on_saved(self, state: &mut State, ok: bool) -> Saved {
        let Unsaved {
            mut events,
            mut crossings,
            alerted_before,
        } = self;
        let mut withdrawn = Vec::new();
        let mut withheld_alerts = 0;
        if !ok {
            events.retain(|e| match e {
                Event::Action { rule, action, .. } => {
                    engine::withdraw(&mut state.engine, rule);
                    withdrawn.push(Withdrawn {
                        rule: rule.clone(),
                        action: *action,
                    });
                    false
                }
                _ => true,
            });
            if let Some(alerted) = alerted_before {
                state.alerted = alerted;
            }
            withheld_alerts = crossings.len();
            crossings.clear();
        }
        Saved {
            events,
            crossings,
            withdrawn,
            withheld_alerts,
        }
    }
}

/// What one step decided once the save is behind it.
#[must_use = "the step's after-save events and alerts must be handled"]
#[derive(Debug, PartialEq)]
pub struct Saved {
    /// The events that stand, in engine order: all of them after a good save, all but the
    /// actions after a failed one.
    events: Vec<Event>,
    crossings: Vec<Crossing>,
    withdrawn: Vec<Withdrawn>,
    withheld_alerts: usize,
}

impl Saved {
    /// The events to handle now (cancellations, and actions to carry out), in engine order.
    pub fn after_save(&self) -> impl Iterator<Item = &Event> {
        self.events
            .iter()
            .filter(|e| Phase::of(e) == Phase::AfterSave)
    }

    /// The budget alerts to send: their crossings are on record. Empty after a failed save.
    pub fn crossings(&self) -> &[Crossing] {
        &self.crossings
    }

    /// The actions the failed save withdrew: they did not run, and are retried once the disk
    /// recovers. Empty after a good save.
    pub fn withdrawn(&self) -> &[Withdrawn] {
        &self.withdrawn
    }

    /// How many budget alerts the failed save withheld (0 after a good save).
    pub fn withheld_alerts(&self) -> usize {
        self.withheld_alerts
    }

    /// Every event that stands, before-save and after-save ones together, in engine order: for
    /// a report of the whole step (as `gpuwatch simulate` makes), not to handle again.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

/// An action that did not run because its in-flight mark could not be saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withdrawn {
    pub rule: String,
    pub action: Action,
}

/// An action that did not run for want of its record, in words, as the daemon logs it and
/// `simulate` reports it: `record` is what could not be made durable (the state, or the audit
/// log).
pub fn not_recorded(action: Action, record: &str) -> String {
    format!(
        "the {action} did not run: its record in {record} could not be made durable; it is retried when the disk recovers"
    )
}

/// Budget alerts that a failed save of `record` withheld, in words, as the daemon logs them and
/// `simulate` reports them.
pub fn withheld(alerts: usize, record: &str) -> String {
    let s = if alerts == 1 { "" } else { "s" };
    format!("{alerts} budget alert{s} withheld until {record} can be made durable")
}

/// What became of an action the edge carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executed {
    /// Its audit record was written, whatever its result (done, failed, refused, a dry run):
    /// it is never repeated for this breach, and the rule re-arms on fresh data.
    Recorded,
    /// Its audit record could not be written, so it did not run: it is withdrawn, and falls
    /// due again at the next step if the rule still breaches.
    NotRecorded,
}

/// Takes back a budget alert whose audit record could not be made durable: it was not sent,
/// and is sent once its threshold crosses again (at the next step, while it still does).
pub fn on_alert_unrecorded(state: &mut State, crossing: &Crossing) {
    state.alerted.forget(crossing);
}

/// Settles a warning the edge handled before the save. One whose record could not be written
/// (a full disk, an I/O error) is taken back, and not sent: nothing is pending, and the rule
/// warns again at its next step once the record can be made, so that no action ever follows a
/// warning that is not on record.
pub fn on_warned(state: &mut State, rule: &str, recorded: bool) {
    if !recorded {
        engine::unwarn(&mut state.engine, rule);
    }
}

/// Settles the rule's in-flight action after the edge carried it out. Either way the state
/// changed, and the change must be durable before anything else is decided.
pub fn on_executed(state: &mut State, rule: &str, executed: Executed) -> Save {
    match executed {
        Executed::Recorded => engine::complete(&mut state.engine, rule),
        Executed::NotRecorded => engine::withdraw(&mut state.engine, rule),
    }
    Save { durable: true }
}

/// Why an action of a step is not carried out on that step's decision, if it is not.
///
/// An action runs on the world as it was when its step decided. While the actions before it in
/// the same step ran (an `exec` may take up to its timeout, EC2 calls their retries), a hold may
/// have been placed, a spot interruption announced, or the GPUs put back to work. So the rest
/// of a step's actions are deferred (`on_deferred`), to be decided again on the next sample,
/// once the actions before them took longer than one sampling interval, or once the edge, which
/// asks again before each of them, found a hold or a spot notice that came meanwhile
/// (`called_off`). The first action of a step always runs: what came before it was the save,
/// and a disk slower than the sampling interval must not keep every action from running.
pub fn defer(
    settings: &Settings,
    actions_before: usize,
    age_secs: f64,
    called_off: Option<&str>,
) -> Option<String> {
    if actions_before == 0 {
        return None;
    }
    if let Some(why) = called_off {
        return Some(format!("{why} while the actions before it ran"));
    }
    (age_secs > settings.interval)
        .then(|| format!("the actions before it in this step took {age_secs:.1} s"))
}

/// Takes back an action that `defer` kept from running: it is pending again, as it was when it
/// fell due, and the next step decides it on fresh data (acts, cancels it if the GPUs were used,
/// or postpones it for a hold). The change must be durable before anything else is decided.
pub fn on_deferred(state: &mut State, rule: &str) -> Save {
    engine::withdraw(&mut state.engine, rule);
    Save { durable: true }
}

/// Takes every in-flight mark out of a state loaded at start, by rule name: an action that was
/// handed out before a restart may have run, so it is never handed out again (its rule re-arms
/// on fresh data, as after an action). The edge audits each and then saves durably.
pub fn settle_in_flight(state: &mut State) -> Vec<(String, InFlight)> {
    state
        .engine
        .rules
        .iter_mut()
        .filter_map(|(name, rs)| Some((name.clone(), rs.in_flight.take()?)))
        .collect()
}

#[cfg(test)]
mod tests;
