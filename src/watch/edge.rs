//! The daemon's edge of the safety order: what `order::drive` asks of it, done for real (the
//! audit log, the webhook and terminals, the executor, `state.json`). It answers how each went;
//! `order::drive` settles the state from the answers, as it does for `gpuwatch simulate`.

use std::time::Instant;

use gpuwatch_core::cost::budget::Crossing;
use gpuwatch_core::step::order::{withheld, Edge, Executed, Save, Withdrawn};
use gpuwatch_core::step::State;

use crate::rules::engine::Event;
use crate::rules::{Action, Rule};

/// One step's edge.
pub(super) struct Live<'a> {
    pub watch: &'a mut super::Watch,
    /// The rules the step judged.
    pub rules: &'a [Rule],
    /// The sample's time, which the records carry.
    pub at: f64,
    pub decided: Instant,
    /// The step's first save must be durable whatever the order says (a new XID hold, a
    /// minute since the last durable save).
    pub durable: bool,
    /// Whether a save of this step reached the disk durably.
    pub saved_durably: bool,
}

impl Edge for Live<'_> {
    async fn record(&mut self, event: &Event) -> bool {
        self.watch.record(self.rules, event, self.at).await
    }

    async fn save(&mut self, state: &State, save: Save) -> bool {
        let durable = save.durable || std::mem::take(&mut self.durable);
        let ok = self.watch.save(state, durable).await;
        self.saved_durably |= ok && durable;
        ok
    }

    fn taken_back(&mut self, withdrawn: &[Withdrawn], alerts: usize) {
        if alerts > 0 {
            // No record, no alert: a restart could not know it had been sent. They are sent
            // once the disk recovers, as the thresholds cross again.
            tracing::error!(alerts, "{}", withheld(alerts, crate::state::STATE_FILE));
        }
        for w in withdrawn {
            // No record, no action: a restart could not know it had run.
            self.watch
                .not_recorded(&w.rule, w.action, crate::state::STATE_FILE);
        }
    }

    async fn alert(&mut self, crossing: &Crossing) -> bool {
        self.watch.alert(crossing)
    }

    async fn announce(&mut self, event: &Event) {
        self.watch.announce(self.rules, event, self.at).await;
    }

    fn age(&self) -> f64 {
        self.decided.elapsed().as_secs_f64()
    }

    async fn called_off(&mut self) -> Option<String> {
        self.watch.called_off().await
    }

    async fn deferred(&mut self, rule: &str, action: Action, why: &str) {
        self.watch.deferred(rule, action, why, self.at).await;
    }

    async fn act(&mut self, event: &Event) -> Executed {
        self.watch.act(self.rules, event, self.at).await
    }
}
