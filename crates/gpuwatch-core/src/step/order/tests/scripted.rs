//! The node's edge, as `drive` asks it of the order's tests: what the world of one cycle
//! allows, noted in the order it happens.

use super::*;

/// The node's edge for one cycle, as `drive` asks it: what the world allows, noted in order.
pub(super) struct Scripted<'a> {
    pub(super) node: &'a mut Node,
    pub(super) t: u32,
    pub(super) world: World,
    /// The actions of this step carried out so far, and how long they took.
    pub(super) ran: usize,
    pub(super) age: f64,
    pub(super) first_save: bool,
    /// The process died (after the save, before the step's first after-save event): nothing
    /// it does from then on reaches the disk.
    pub(super) dead: bool,
}

impl Scripted<'_> {
    fn note(&mut self, what: impl Into<String>) {
        if !self.dead {
            self.node.note(self.t, what);
        }
    }

    /// Whether the process dies here, before an after-save event.
    fn dies(&mut self) -> bool {
        if self.world.crash_before_actions {
            self.dead = true;
        }
        self.dead
    }
}

impl super::Edge for Scripted<'_> {
    async fn record(&mut self, e: &Event) -> bool {
        self.note(format!("before: {}", e.kind()));
        if matches!(e, Event::Warning { .. }) && !self.world.warning_recorded {
            self.note("warning not recorded");
            return false;
        }
        true
    }

    async fn save(&mut self, state: &State, save: Save) -> bool {
        if self.dead {
            return false;
        }
        if std::mem::take(&mut self.first_save) && save.durable {
            self.node.durable_steps.push(self.t);
        }
        self.node.save_state(state, self.t, save, self.world)
    }

    fn taken_back(&mut self, withdrawn: &[Withdrawn], alerts: usize) {
        for w in withdrawn {
            self.note(format!("withdrawn: {} {}", w.rule, w.action));
        }
        if alerts > 0 {
            self.note(format!("withheld: {alerts} alert"));
        }
    }

    async fn alert(&mut self, c: &Crossing) -> bool {
        if !self.world.alert_recorded {
            self.note(format!("alert not recorded: {}", c.budget));
            return false;
        }
        self.note(format!("alert: {} {}%", c.budget, c.threshold * 100.0));
        true
    }

    async fn announce(&mut self, e: &Event) {
        if !self.dies() {
            self.note(format!("after: {}", e.kind()));
        }
    }

    fn age(&self) -> f64 {
        self.age
    }

    async fn called_off(&mut self) -> Option<String> {
        (self.ran > 0 && self.world.hold_meanwhile).then(|| "a local hold was placed".into())
    }

    async fn deferred(&mut self, rule: &str, _action: Action, why: &str) {
        if self.dies() {
            return;
        }
        self.note("after: action");
        self.note(format!("because: {why}"));
        self.note(format!("deferred: {rule}"));
    }

    async fn act(&mut self, e: &Event) -> Executed {
        if self.dies() {
            return Executed::NotRecorded;
        }
        self.note(format!("after: {}", e.kind()));
        let rule = e.rule().to_string();
        self.ran += 1;
        self.age += self.world.action_secs;
        // No record, no action: the in-flight mark is on disk before anything runs.
        assert!(
            self.node.on_disk().engine.rules[&rule].in_flight.is_some(),
            "{}: {rule} runs unrecorded",
            self.t
        );
        let executed = if self.world.audit {
            Executed::Recorded
        } else {
            Executed::NotRecorded
        };
        self.note(format!("executed: {rule} {executed:?}"));
        executed
    }
}
