//! Budgets in the step: crossings on actual spend, a period that closes, a stepped wall
//! clock, and an external spend that goes unknown.

use super::tests::{obs, settings};
use super::*;
use crate::rules::{Action, Scope, Trigger};

/// One step of a busy GPU at `inputs.now`, saved: the budget crossings on actual spend.
fn actual_crossings(
    settings: &Settings,
    state: &mut State,
    inputs: &Inputs,
) -> Vec<crate::cost::budget::Crossing> {
    let out = step(settings, state, &obs(inputs.now, 0.9), inputs);
    out.order
        .on_saved(state, true)
        .crossings()
        .iter()
        .filter(|c| c.basis == crate::cost::budget::Basis::Actual)
        .cloned()
        .collect()
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
        let inputs = Inputs {
            now,
            price,
            external: external.clone(),
            ..Inputs::default()
        };
        texts.extend(
            actual_crossings(&settings, &mut state, &inputs)
                .iter()
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

/// $1 an hour against a day's budget of $23.50: the day's last hour crosses it, in the step
/// that also closes the day. The crossing is alerted then, not lost with the day.
#[test]
fn spend_that_closes_a_period_still_crosses_its_thresholds() {
    let local = Budget {
        name: "day".into(),
        source: BudgetSource::Local,
        limit_usd: Some(23.5),
        thresholds: vec![1.0],
    };
    let mut settings = settings(vec![local]);
    settings.period = Period::Day;
    let mut state = State::default();
    let price = Some(Price {
        usd_per_hour: 1.0,
        source: Source::Config,
    });
    let day = Period::Day.start(1_796_000_000.0);
    let end = Period::Day.end(day);
    let mut alerts = Vec::new();
    for now in [day + 10.0, end - 3600.0, end + 10.0, end + 20.0] {
        let inputs = Inputs {
            now,
            price,
            ..Inputs::default()
        };
        alerts.extend(
            actual_crossings(&settings, &mut state, &inputs)
                .iter()
                .map(|c| (now, c.threshold)),
        );
    }
    assert_eq!(alerts, [(end + 10.0, 1.0)]);
}

/// A node's own $100 budget, stopped once exhausted, at $10 an hour: a wall clock stepped 12
/// hours ahead between two samples one second apart does not exhaust it (the monotonic clock
/// counted one second), while the same timestamps replayed without a monotonic clock, as a
/// trace is, bill the 12 hours and stop the node.
#[test]
fn a_wall_clock_stepped_forward_exhausts_no_budget() {
    let node = Budget {
        name: "node".into(),
        source: BudgetSource::Local,
        limit_usd: Some(100.0),
        thresholds: vec![1.0],
    };
    let mut settings = settings(vec![node]);
    settings.rules = vec![Rule {
        name: "budget node exhausted".into(),
        scope: Scope::Node,
        subject: None,
        trigger: Trigger::BudgetExhausted {
            budget: "node".into(),
        },
        lifecycle: None,
        action: Action::Stop,
        command: Vec::new(),
        budget: None,
    }];
    let run = |monotonic: bool| {
        let mut state = State::default();
        let mut events = Vec::new();
        for i in 0..20 {
            let wall = 1_796_000_000.0 + f64::from(i) + if i >= 10 { 43_200.0 } else { 0.0 };
            let inputs = Inputs {
                now: wall,
                price: Some(Price {
                    usd_per_hour: 10.0,
                    source: Source::Config,
                }),
                monotonic: monotonic.then_some(700.0 + f64::from(i)),
                ..Inputs::default()
            };
            let out = step(&settings, &mut state, &obs(wall, 1.0), &inputs);
            let saved = out.order.on_saved(&mut state, true);
            events.extend(saved.events().iter().map(|e| (i, e.kind())));
        }
        (state.ledger.spent, events)
    };
    let (spent, events) = run(true);
    assert!((spent - 10.0 * 19.0 / 3600.0).abs() < 1e-9, "{spent}");
    assert_eq!(events, []);
    let (spent, events) = run(false);
    assert!(
        (spent - 10.0 * (19.0 + 43_200.0) / 3600.0).abs() < 1e-9,
        "{spent}"
    );
    assert_eq!(events, [(10, "breach"), (10, "warning"), (15, "action")]);
}

/// A team budget whose spend goes unknown after it was exhausted: its view says why, the
/// gated idle rule recovers at once, and its hard limit is not breached, so nothing acts on
/// the last figure seen.
#[test]
fn an_unknown_external_spend_opens_no_gate_and_exhausts_nothing() {
    let team = Budget {
        name: "team-ml".into(),
        source: BudgetSource::External,
        limit_usd: Some(100.0),
        thresholds: vec![1.0],
    };
    let mut settings = settings(vec![team]);
    settings.rules[0].budget = Some(crate::rules::BudgetGate {
        name: "team-ml".into(),
        spent_at_least: 1.0,
    });
    settings.rules.push(Rule {
        name: "budget team-ml exhausted".into(),
        scope: Scope::Node,
        subject: None,
        trigger: Trigger::BudgetExhausted {
            budget: "team-ml".into(),
        },
        lifecycle: None,
        action: Action::Stop,
        command: Vec::new(),
        budget: None,
    });
    let spent: BTreeMap<String, Reading> = [(
        "team-ml".to_string(),
        Reading {
            spent: 150.0,
            forecast: None,
            limit: 100.0,
            period_start: 0.0,
        },
    )]
    .into();
    let unknown: BTreeMap<String, String> = [(
        "team-ml".to_string(),
        "Prometheus is unreachable".to_string(),
    )]
    .into();
    let mut state = State::default();
    let mut kinds = Vec::new();
    let mut last = None;
    for t in 0..40 {
        let now = 1_796_000_000.0 + f64::from(t);
        // Known and exhausted for the first 3 s (less than the warning), then unknown.
        let inputs = if t < 3 {
            Inputs {
                now,
                external: spent.clone(),
                ..Inputs::default()
            }
        } else {
            Inputs {
                now,
                unknown: unknown.clone(),
                ..Inputs::default()
            }
        };
        let out = step(&settings, &mut state, &obs(now, 0.0), &inputs);
        let saved = out.order.on_saved(&mut state, true);
        for e in saved.events() {
            kinds.push((t, e.rule().to_string(), e.kind()));
        }
        last = Some(out.view);
    }
    let view = last.unwrap();
    assert_eq!(
        view.budgets,
        vec![BudgetView {
            name: "team-ml".into(),
            limit: 100.0,
            spent_ratio: None,
            forecast_ratio: None,
            unknown: Some("Prometheus is unreachable".into()),
        }]
    );
    // While known, the limit breaches and warns; once unknown it recovers, and neither it nor
    // the gated idle rule (idle all along, its periods complete from 10 s) breaches again.
    let exhausted = "budget team-ml exhausted".to_string();
    assert_eq!(
        kinds,
        vec![
            (0, exhausted.clone(), "breach"),
            (0, exhausted.clone(), "warning"),
            (3, exhausted.clone(), "recovered"),
            // Called off at once, not at its due time (5 s): a warning rests on its budget
            // at every sample.
            (3, exhausted, "cancelled"),
        ]
    );
}
