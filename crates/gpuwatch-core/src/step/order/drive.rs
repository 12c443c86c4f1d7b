//! The order of one step's consequences, run once for both edges: the daemon's loop and
//! `gpuwatch simulate` each hand `drive` an `Edge` that does their I/O (or records a report),
//! and `drive` alone settles the state around it (`on_warned`, `on_saved`,
//! `on_alert_unrecorded`, `on_deferred`, `on_executed`), so that the rehearsal keeps the very
//! order the daemon keeps. An edge that never waits (the rehearsal, the order's scripted tests)
//! runs it with `drive_at_once`, without a runtime.

use crate::cost::budget::Crossing;
use crate::rules::engine::Event;
use crate::rules::Action;

use super::{
    defer, on_alert_unrecorded, on_deferred, on_executed, on_warned, Executed, Save, Unsaved,
    Withdrawn,
};
use crate::step::{Settings, State};

/// What an edge does for one step, each call saying how it went. No method touches the state:
/// `drive` settles it from the answers.
#[allow(async_fn_in_trait)] // Each edge is one concrete type; no caller is generic over Send.
pub trait Edge {
    /// Logs, records and sends an event of the before-save phase (a breach, a recovery, a
    /// warning, a postponement). Returns whether it is on record.
    async fn record(&mut self, event: &Event) -> bool;
    /// Saves the state, durably when `save.durable` (or when the edge wants it so). Returns
    /// whether it is saved.
    async fn save(&mut self, state: &State, save: Save) -> bool;
    /// A failed save took these back: the actions withdrawn, and how many budget alerts.
    fn taken_back(&mut self, withdrawn: &[Withdrawn], alerts: usize);
    /// Records and sends a budget alert. Returns whether it was on record (and so sent).
    async fn alert(&mut self, crossing: &Crossing) -> bool;
    /// Announces an event of the after-save phase that is not an action (a cancellation).
    async fn announce(&mut self, event: &Event);
    /// Seconds since the step decided.
    fn age(&self) -> f64;
    /// Asked before each action after a step's first: a hold or a spot notice that came since
    /// the step decided.
    async fn called_off(&mut self) -> Option<String>;
    /// Logs and records an action that `defer` kept for the next sample.
    async fn deferred(&mut self, rule: &str, action: Action, why: &str);
    /// Carries out an action. Returns whether its record was made (and so whether it ran).
    async fn act(&mut self, event: &Event) -> Executed;
}

/// Runs one step's consequences in the safety order: the before-save events, the save, what
/// the save lets through (budget alerts, then cancellations and actions, each action deferred
/// when the ones before it took too long or were overtaken by a hold or a spot notice), saving
/// after each action. Returns the budget alerts sent.
pub async fn drive<E: Edge>(
    settings: &Settings,
    state: &mut State,
    unsaved: Unsaved,
    edge: &mut E,
) -> Vec<Crossing> {
    for event in unsaved.before_save() {
        let recorded = edge.record(event).await;
        if let Event::Warning { rule, .. } = event {
            on_warned(state, rule, recorded);
        }
    }
    let ok = edge.save(state, unsaved.save()).await;
    let after = unsaved.on_saved(state, ok);
    if !after.withdrawn().is_empty() || after.withheld_alerts() > 0 {
        edge.taken_back(after.withdrawn(), after.withheld_alerts());
    }
    let mut sent = Vec::with_capacity(after.crossings().len());
    for c in after.crossings() {
        if edge.alert(c).await {
            sent.push(c.clone());
        } else {
            on_alert_unrecorded(state, c);
        }
    }
    if sent.len() < after.crossings().len() {
        // The thresholds taken back are saved at once: a crash now must not leave them marked
        // as alerted with no alert sent.
        let _ = edge.save(state, Save { durable: true }).await;
    }
    let mut actions = 0;
    for event in after.after_save() {
        let Event::Action { rule, action, .. } = event else {
            edge.announce(event).await;
            continue;
        };
        let called_off = match actions {
            0 => None,
            _ => edge.called_off().await,
        };
        if let Some(why) = defer(settings, actions, edge.age(), called_off.as_deref()) {
            edge.deferred(rule, *action, &why).await;
            let save = on_deferred(state, rule);
            let _ = edge.save(state, save).await;
            continue;
        }
        actions += 1;
        let executed = edge.act(event).await;
        let save = on_executed(state, rule, executed);
        let _ = edge.save(state, save).await;
    }
    sent
}

/// Runs `drive` to its end at once, without a runtime, on an edge whose every call answers
/// without waiting (`gpuwatch simulate`'s rehearsal, the order's scripted tests). Returns the
/// budget alerts sent.
///
/// # Panics
///
/// If the edge waits: such an edge belongs on a runtime, with `drive`.
pub fn drive_at_once<E: Edge>(
    settings: &Settings,
    state: &mut State,
    unsaved: Unsaved,
    edge: &mut E,
) -> Vec<Crossing> {
    let mut run = std::pin::pin!(drive(settings, state, unsaved, edge));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::future::Future::poll(run.as_mut(), &mut cx) {
        std::task::Poll::Ready(sent) => sent,
        std::task::Poll::Pending => panic!("an edge driven at once waited"),
    }
}
