//! Each invariant of the order, as the edge lives it: a small edge that steps, saves to a
//! "disk" (the state as JSON), handles events and carries out actions as the daemon does, and
//! writes down what it did, in the order it did it.

use std::time::Duration;

use super::*;
use crate::cost::budget::Reading;
use crate::rules::window::Assessment;
use crate::rules::Trigger;
use crate::step::tests::{obs, settings};
use crate::step::{step, Budget, BudgetSource, Inputs, Settings};

mod scripted;
use scripted::Scripted;

/// The world around one step.
#[derive(Debug, Clone, Copy)]
struct World {
    /// GPU 0's utilization.
    utilization: f64,
    /// Whether state saves work.
    disk: bool,
    /// Whether an action's audit record can be written.
    audit: bool,
    /// Whether a warning's audit record can be written.
    warning_recorded: bool,
    /// The process dies once the state is saved, before the step's actions run.
    crash_before_actions: bool,
    /// How long each action takes to carry out, in seconds.
    action_secs: f64,
    /// A hold is placed while the step's first action runs.
    hold_meanwhile: bool,
    /// Whether a budget alert's audit record can be written.
    alert_recorded: bool,
}

const NORMAL: World = World {
    utilization: 0.0,
    disk: true,
    audit: true,
    warning_recorded: true,
    crash_before_actions: false,
    action_secs: 0.0,
    hold_meanwhile: false,
    alert_recorded: true,
};

/// A budget "org", read from outside at 90% spent, that alerts at 80%.
fn org() -> Budget {
    Budget {
        name: "org".into(),
        source: BudgetSource::External,
        limit_usd: None,
        thresholds: vec![0.8],
    }
}

struct Node {
    settings: Settings,
    state: State,
    /// The state as last saved.
    disk: String,
    /// What the edge did, by the step's time.
    log: Vec<(u32, String)>,
    /// The steps whose own save was durable.
    durable_steps: Vec<u32>,
}

impl Node {
    fn new(settings: Settings) -> Node {
        Node {
            settings,
            state: State::default(),
            disk: serde_json::to_string(&State::default()).unwrap(),
            log: Vec::new(),
            durable_steps: Vec::new(),
        }
    }

    fn note(&mut self, t: u32, what: impl Into<String>) {
        self.log.push((t, what.into()));
    }

    fn on_disk(&self) -> State {
        serde_json::from_str(&self.disk).unwrap()
    }

    /// Saves `state`; notes a durable save and a failed one.
    fn save_state(&mut self, state: &State, t: u32, save: Save, world: World) -> bool {
        if world.disk {
            self.disk = serde_json::to_string(state).unwrap();
        }
        match (save.durable, world.disk) {
            (true, true) => self.note(t, "saved durably"),
            (true, false) => self.note(t, "durable save failed"),
            (false, true) => {}
            (false, false) => self.note(t, "save failed"),
        }
        world.disk
    }

    /// One cycle of the daemon's loop at `t`, its order run by `drive` itself on a scripted
    /// edge. Returns false when the process died.
    fn cycle(&mut self, t: u32, world: World) -> bool {
        let now = f64::from(t);
        let inputs = Inputs {
            now,
            external: [(
                "org".to_string(),
                Reading {
                    spent: 90.0,
                    forecast: None,
                    limit: 100.0,
                    period_start: 0.0,
                },
            )]
            .into(),
            ..Inputs::default()
        };
        let order = step(
            &self.settings,
            &mut self.state,
            &obs(now, world.utilization),
            &inputs,
        )
        .order;
        let settings = self.settings.clone();
        let mut state = std::mem::take(&mut self.state);
        let mut edge = Scripted {
            node: self,
            t,
            world,
            ran: 0,
            age: 0.0,
            first_save: true,
            dead: false,
        };
        drive_at_once(&settings, &mut state, order, &mut edge);
        let alive = !edge.dead;
        self.state = state;
        alive
    }

    /// Cycles through `times`, the world at each as `world` says.
    fn run(&mut self, times: std::ops::Range<u32>, world: impl Fn(u32) -> World) {
        for t in times {
            assert!(self.cycle(t, world(t)), "{t}: the process died");
        }
    }

    /// The process starts again at `t`, from what the disk holds.
    fn restart(&mut self, t: u32) -> Vec<(String, InFlight)> {
        self.state = self.on_disk();
        let settled = settle_in_flight(&mut self.state);
        for (rule, f) in &settled {
            self.note(t, format!("settled: {rule} {} at {}", f.action, f.at));
        }
        let state = self.state.clone();
        self.save_state(&state, t, Save { durable: true }, NORMAL);
        settled
    }

    /// The rule's action is pending on disk, due at `due_at`, and not in flight: it was taken
    /// back, to fall due again.
    fn assert_pending_on_disk(&self, rule: &str, action: Action, due_at: f64) {
        let rs = &self.on_disk().engine.rules[rule];
        assert_eq!(rs.in_flight, None);
        assert_eq!(
            rs.pending.as_ref().map(|p| (p.action, p.due_at)),
            Some((action, due_at)),
            "pending again, on disk"
        );
    }

    fn log_from(&self, t: u32) -> Vec<(u32, &str)> {
        self.log
            .iter()
            .filter(|(at, _)| *at >= t)
            .map(|(at, what)| (*at, what.as_str()))
            .collect()
    }
}

#[test]
fn a_failed_save_withdraws_the_action_and_withholds_the_alert() {
    let mut edge = Node::new(settings(vec![org()]));
    let failing = |t| World {
        disk: ![0, 10, 15].contains(&t),
        ..NORMAL
    };
    edge.run(0..1, failing);
    assert_eq!(
        edge.state.alerted,
        Alerted::default(),
        "the alert is taken back"
    );
    edge.run(1..16, failing);
    let rs = &edge.state.engine.rules["idle"];
    assert_eq!(rs.in_flight, None, "withdrawn");
    assert_eq!(rs.pending.as_ref().map(|p| p.due_at), Some(15.0));
    edge.run(16..30, failing);
    assert_eq!(
        edge.log_from(0),
        [
            (0, "durable save failed"),
            (0, "withheld: 1 alert"),
            // The same threshold crosses again once a save works.
            (1, "saved durably"),
            (1, "alert: org 80%"),
            // The warning goes out before the save, even one that fails.
            (10, "before: breach"),
            (10, "before: warning"),
            (10, "durable save failed"),
            (15, "durable save failed"),
            (15, "withdrawn: idle stop"),
            // Retried once the disk recovers, the rule still breaching; then never again.
            (16, "saved durably"),
            (16, "after: action"),
            (16, "executed: idle Recorded"),
            (16, "saved durably"),
        ]
    );
}

/// A budget alert whose record cannot be written is not sent: its threshold is taken back and
/// saved so at once, and it alerts at the next step that can record it.
#[test]
fn an_alert_that_cannot_be_recorded_is_taken_back_and_sent_later() {
    let mut edge = Node::new(settings(vec![org()]));
    edge.run(0..1, |_| World {
        utilization: 0.9,
        alert_recorded: false,
        ..NORMAL
    });
    let log = edge.log_from(0);
    let unrecorded = log
        .iter()
        .position(|l| l.1 == "alert not recorded: org")
        .unwrap();
    assert_eq!(log[unrecorded + 1], (0, "saved durably"), "{log:?}");
    assert!(edge.on_disk().alerted == edge.state.alerted);
    assert!(!log.iter().any(|l| l.1.starts_with("alert: ")), "{log:?}");
    edge.run(1..2, |_| World {
        utilization: 0.9,
        ..NORMAL
    });
    assert!(
        edge.log_from(1).contains(&(1, "alert: org 80%")),
        "{:?}",
        edge.log_from(1)
    );
}

#[test]
fn a_good_save_releases_the_action_and_the_alert_after_it() {
    let mut edge = Node::new(settings(vec![org()]));
    edge.run(0..30, |_| NORMAL);
    assert_eq!(
        edge.log_from(0),
        [
            (0, "saved durably"),
            (0, "alert: org 80%"),
            (10, "before: breach"),
            (10, "before: warning"),
            (10, "saved durably"),
            (15, "saved durably"),
            (15, "after: action"),
            (15, "executed: idle Recorded"),
            (15, "saved durably"),
        ]
    );
    assert_eq!(edge.disk, serde_json::to_string(&edge.state).unwrap());
}

#[test]
fn the_save_is_durable_when_anything_was_decided_or_alerted() {
    // GPU 0's utilization at each second.
    type Utilization = fn(u32) -> f64;
    // (budgets, utilization, the steps whose save is durable)
    let cases: [(Vec<Budget>, Utilization, &[u32]); 3] = [
        (Vec::new(), |_| 0.9, &[]),
        (vec![org()], |_| 0.9, &[0]),
        // Breach and warning, the cancellation, the recovery, breach and warning again.
        (
            Vec::new(),
            |t| if t == 12 { 0.9 } else { 0.0 },
            &[10, 12, 20, 30],
        ),
    ];
    for (budgets, utilization, want) in cases {
        let mut edge = Node::new(settings(budgets));
        edge.run(0..31, |t| World {
            utilization: utilization(t),
            ..NORMAL
        });
        assert_eq!(edge.durable_steps, want);
    }
}

#[test]
fn a_cancellation_is_announced_after_the_save_even_a_failed_one() {
    let mut edge = Node::new(settings(Vec::new()));
    edge.run(0..21, |t| World {
        utilization: if t == 12 { 0.9 } else { 0.0 },
        disk: t != 12,
        ..NORMAL
    });
    assert_eq!(
        edge.log_from(0),
        [
            (10, "before: breach"),
            (10, "before: warning"),
            (10, "saved durably"),
            (12, "durable save failed"),
            (12, "after: cancelled"),
            (20, "before: recovered"),
            (20, "saved durably"),
        ]
    );
}

#[test]
fn a_failed_action_is_completed_not_repeated_and_rearms_on_fresh_data() {
    // A stop that EC2 refused still has its audit record: the edge reports it recorded.
    let mut edge = Node::new(settings(Vec::new()));
    edge.run(0..36, |_| NORMAL);
    assert_eq!(
        edge.log_from(15),
        [
            (15, "saved durably"),
            (15, "after: action"),
            (15, "executed: idle Recorded"),
            (15, "saved durably"),
            // Only the periods after the action count: [20, 30) is the first.
            (30, "before: warning"),
            (30, "saved durably"),
            (35, "saved durably"),
            (35, "after: action"),
            (35, "executed: idle Recorded"),
            (35, "saved durably"),
        ]
    );
}

#[test]
fn an_action_whose_record_cannot_be_written_is_withdrawn_and_retried() {
    let mut edge = Node::new(settings(Vec::new()));
    edge.run(0..16, |t| World {
        audit: t != 15,
        ..NORMAL
    });
    edge.assert_pending_on_disk("idle", Action::Stop, 15.0);
    edge.run(16..30, |_| NORMAL);
    assert_eq!(
        edge.log_from(15),
        [
            (15, "saved durably"),
            (15, "after: action"),
            (15, "executed: idle NotRecorded"),
            (15, "saved durably"),
            (16, "saved durably"),
            (16, "after: action"),
            (16, "executed: idle Recorded"),
            (16, "saved durably"),
        ]
    );
}

/// Two rules whose actions fall due in the same step: "checkpoint" (an `exec`) before "idle".
fn two_rules() -> Settings {
    let base = settings(Vec::new());
    let idle = base.rules[0].clone();
    let checkpoint = crate::rules::Rule {
        name: "checkpoint".into(),
        action: Action::Exec,
        command: vec!["checkpoint".into()],
        ..idle.clone()
    };
    Settings {
        rules: vec![checkpoint, idle],
        ..base
    }
}

#[test]
fn an_action_behind_a_slow_one_is_decided_again_on_fresh_data() {
    // The checkpoint takes 30 s, far more than the 1 s between samples; meanwhile GPU 0 went
    // back to work. The stop is not carried out on the old decision: it is deferred, pending
    // on disk, and the next step, which sees the work, cancels it.
    let mut edge = Node::new(two_rules());
    edge.run(0..15, |_| NORMAL);
    assert!(edge.cycle(
        15,
        World {
            action_secs: 30.0,
            ..NORMAL
        }
    ));
    edge.assert_pending_on_disk("idle", Action::Stop, 15.0);
    edge.run(16..17, |_| World {
        utilization: 0.9,
        ..NORMAL
    });
    assert_eq!(
        edge.log_from(15),
        [
            (15, "saved durably"),
            (15, "after: action"),
            (15, "executed: checkpoint Recorded"),
            (15, "saved durably"),
            (15, "after: action"),
            (
                15,
                "because: the actions before it in this step took 30.0 s"
            ),
            (15, "deferred: idle"),
            (15, "saved durably"),
            (16, "saved durably"),
            (16, "after: cancelled"),
        ]
    );
}

#[test]
fn an_action_behind_a_quick_one_runs_in_the_same_step() {
    // Actions that take less than a sample leave the decision fresh: both run at 15. And a
    // deferred action still idle at the next step runs there.
    let mut edge = Node::new(two_rules());
    edge.run(0..16, |_| NORMAL);
    let ran = |edge: &Node| -> Vec<(u32, String)> {
        edge.log_from(15)
            .into_iter()
            .filter(|(_, w)| {
                w.starts_with("executed") || w.starts_with("deferred") || w.starts_with("because")
            })
            .map(|(t, w)| (t, w.to_string()))
            .collect()
    };
    assert_eq!(
        ran(&edge),
        [
            (15, "executed: checkpoint Recorded".to_string()),
            (15, "executed: idle Recorded".to_string()),
        ]
    );
    let mut slow = Node::new(two_rules());
    slow.run(0..15, |_| NORMAL);
    slow.run(15..17, |t| World {
        action_secs: if t == 15 { 30.0 } else { 0.0 },
        ..NORMAL
    });
    assert_eq!(
        ran(&slow),
        [
            (15, "executed: checkpoint Recorded".to_string()),
            (
                15,
                "because: the actions before it in this step took 30.0 s".to_string()
            ),
            (15, "deferred: idle".to_string()),
            (16, "executed: idle Recorded".to_string()),
        ]
    );
    // A quick action, but a hold placed while it ran: the next one is deferred too.
    let mut held = Node::new(two_rules());
    held.run(0..15, |_| NORMAL);
    held.run(15..16, |_| World {
        hold_meanwhile: true,
        ..NORMAL
    });
    assert_eq!(
        ran(&held),
        [
            (15, "executed: checkpoint Recorded".to_string()),
            (
                15,
                "because: a local hold was placed while the actions before it ran".to_string()
            ),
            (15, "deferred: idle".to_string()),
        ]
    );
}

#[test]
fn a_warning_that_cannot_be_recorded_is_taken_back_and_given_again() {
    let mut edge = Node::new(settings(Vec::new()));
    // The audit log cannot be written from 10 to 12: the warnings of those steps are not on
    // record, so nothing is pending on disk, and the action waits for a warning that is.
    edge.run(0..13, |t| World {
        warning_recorded: t >= 13,
        ..NORMAL
    });
    assert_eq!(edge.on_disk().engine.rules["idle"].pending, None);
    edge.run(13..25, |_| NORMAL);
    let decided: Vec<_> = edge
        .log_from(10)
        .into_iter()
        .filter(|(_, what)| {
            what.starts_with("before: warning")
                || what.starts_with("after:")
                || what.contains("not recorded")
        })
        .collect();
    assert_eq!(
        decided,
        [
            (10, "before: warning"),
            (10, "warning not recorded"),
            (11, "before: warning"),
            (11, "warning not recorded"),
            (12, "before: warning"),
            (12, "warning not recorded"),
            (13, "before: warning"),
            (18, "after: action"),
        ]
    );
}

#[test]
fn a_restart_between_the_save_and_the_action_never_sends_it_again() {
    let mut edge = Node::new(settings(Vec::new()));
    edge.run(0..15, |_| NORMAL);
    let died = !edge.cycle(
        15,
        World {
            crash_before_actions: true,
            ..NORMAL
        },
    );
    assert!(died);
    let settled = edge.restart(15);
    assert_eq!(
        settled
            .iter()
            .map(|(rule, f)| (rule.as_str(), f.action, f.at))
            .collect::<Vec<_>>(),
        [("idle", Action::Stop, 15.0)]
    );
    assert_eq!(edge.on_disk().engine.rules["idle"].in_flight, None);
    assert!(settle_in_flight(&mut edge.state).is_empty(), "settled once");
    edge.run(16..31, |_| NORMAL);
    assert_eq!(
        edge.log_from(15),
        [
            // The in-flight mark is on disk; the process dies before the stop is sent.
            (15, "saved durably"),
            (15, "settled: idle stop at 15"),
            (15, "saved durably"),
            // Not that action again: the rule re-arms on periods after it, with a warning.
            (30, "before: warning"),
            (30, "saved durably"),
        ]
    );
}

#[test]
fn every_event_has_its_phase() {
    let evidence = Assessment {
        breaching: true,
        breaching_periods: 1,
        threshold: 0.05,
        periods: Vec::new(),
        budget: None,
        problems: Vec::new(),
        gpus: Vec::new(),
    };
    let (rule, action, reason) = ("idle".to_string(), Action::Stop, String::new());
    let cases = [
        (
            Event::Breach {
                rule: rule.clone(),
                evidence: evidence.clone(),
            },
            Phase::BeforeSave,
        ),
        (Event::Recovered { rule: rule.clone() }, Phase::BeforeSave),
        (
            Event::Warning {
                rule: rule.clone(),
                action,
                due_at: 0.0,
                evidence: evidence.clone(),
            },
            Phase::BeforeSave,
        ),
        (
            Event::Postponed {
                rule: rule.clone(),
                action,
                reason: reason.clone(),
            },
            Phase::BeforeSave,
        ),
        (
            Event::Cancelled {
                rule: rule.clone(),
                action,
                reason,
            },
            Phase::AfterSave,
        ),
        (
            Event::Action {
                rule,
                action,
                evidence,
            },
            Phase::AfterSave,
        ),
    ];
    for (event, phase) in cases {
        assert_eq!(Phase::of(&event), phase, "{}", event.kind());
    }
}

#[test]
fn a_report_lists_the_events_in_the_engines_order() {
    // "idle" acts at 15, when "slow" (15 s periods) first breaches and warns.
    let mut settings = settings(Vec::new());
    let mut slow = settings.rules[0].clone();
    slow.name = "slow".into();
    if let Trigger::Idle(c) = &mut slow.trigger {
        c.period = Duration::from_secs(15);
    }
    settings.rules.push(slow);
    let mut state = State::default();
    let names = |events: Vec<&Event>| -> Vec<String> {
        events
            .iter()
            .map(|e| format!("{} {}", e.rule(), e.kind()))
            .collect()
    };
    for t in 0..15 {
        let now = f64::from(t);
        let inputs = Inputs {
            now,
            ..Inputs::default()
        };
        let order = step(&settings, &mut state, &obs(now, 0.0), &inputs).order;
        let _ = order.on_saved(&mut state, true);
    }
    let before = state.clone();
    let at_15 = |state: &mut State| {
        let inputs = Inputs {
            now: 15.0,
            ..Inputs::default()
        };
        step(&settings, state, &obs(15.0, 0.0), &inputs).order
    };
    let order = at_15(&mut state);
    assert_eq!(
        names(order.before_save().collect()),
        ["slow breach", "slow warning"]
    );
    let saved = order.on_saved(&mut state, true);
    assert_eq!(names(saved.after_save().collect()), ["idle action"]);
    assert_eq!(
        names(saved.events().iter().collect()),
        ["idle action", "slow breach", "slow warning"]
    );
    // A failed save takes the action back, and only the action.
    let mut state = before;
    let saved = at_15(&mut state).on_saved(&mut state, false);
    assert_eq!(
        names(saved.events().iter().collect()),
        ["slow breach", "slow warning"]
    );
    assert_eq!(saved.after_save().count(), 0);
    assert_eq!(
        saved.withdrawn(),
        [Withdrawn {
            rule: "idle".into(),
            action: Action::Stop
        }]
    );
}
