//! Health and idleness apart, one rule at a time: an unhealthy GPU never makes an idle rule act,
//! a rule on health acts on a GPU that broke (a lost one included) and names its problems, and
//! unhealthy GPUs are priced.

use std::time::Duration;

use super::super::tests::settings;
use super::super::*;
use crate::cost::price::{Price, Source};
use crate::rules::{Action, Aggregation, Condition, GpuReading, Scope, Statistic, Trigger};

/// "broken": stop once any GPU is unhealthy throughout one 10 s period (5 s warning).
fn health_rule() -> Rule {
    Rule {
        name: "broken".into(),
        scope: Scope::Node,
        subject: None,
        trigger: Trigger::Idle(Condition {
            metric: Metric::GpuUnhealthy,
            statistic: Statistic::Average,
            comparison: Comparison::GreaterThanOrEqual,
            threshold: 1.0,
            period: Duration::from_secs(10),
            evaluation_periods: 1,
            datapoints_to_alarm: 1,
            gpus: Aggregation::Any,
        }),
        lifecycle: None,
        action: Action::Stop,
        command: Vec::new(),
        budget: None,
    }
}

/// Two idle GPUs; GPU 1 unhealthy (`lost`: fallen off the bus, with no readings at all).
fn two(t: f64, gpu1: Option<bool>, lost: bool) -> Observation {
    let mut gpus = Vec::new();
    for i in 0..2u32 {
        let mut g = GpuReading {
            index: i,
            ..GpuReading::default()
        };
        let sick = i == 1 && gpu1 == Some(true);
        if !(i == 1 && lost) {
            g.set(Metric::GpuUtilization, Some(0.0));
        }
        let health = if i == 1 { gpu1 } else { Some(false) };
        g.set(Metric::GpuUnhealthy, health.map(|h| f64::from(u8::from(h))));
        if sick {
            g.problems = vec!["GPU 1: XID 79: GPU fell off the bus".into()];
        }
        gpus.push(g);
    }
    Observation {
        t,
        complete: !lost,
        gpus,
        veto: None,
        holders_unknown: false,
    }
}

fn run(settings: &Settings, sample: impl Fn(f64) -> Observation) -> (Vec<Event>, State) {
    let mut state = State::default();
    let mut events = Vec::new();
    // From 100 s: the first sample starts the accrual, and the 29 after it are priced.
    for t in 100..130 {
        let t = f64::from(t);
        let out = step(
            settings,
            &mut state,
            &sample(t),
            &Inputs {
                now: t,
                price: Some(Price {
                    usd_per_hour: 3600.0,
                    source: Source::Config,
                }),
                ..Inputs::default()
            },
        );
        events.extend(
            out.order
                .on_saved(&mut state, true)
                .events()
                .iter()
                .cloned(),
        );
    }
    (events, state)
}

fn kinds(events: &[Event], rule: &str) -> Vec<&'static str> {
    events
        .iter()
        .filter(|e| e.rule() == rule)
        .map(Event::kind)
        .collect()
}

#[test]
fn an_unhealthy_gpu_never_makes_an_idle_rule_act() {
    let (events, state) = run(&settings(Vec::new()), |t| two(t, Some(true), false));
    assert!(kinds(&events, "idle").is_empty(), "{events:?}");
    // It is priced as unhealthy, not as idle: GPU 0 idle is half the price, GPU 1 the other.
    assert!(
        (state.idle_dollars - 29.0 / 2.0).abs() < 1e-6,
        "{}",
        state.idle_dollars
    );
    assert!(
        (state.unhealthy_dollars - 29.0 / 2.0).abs() < 1e-6,
        "{}",
        state.unhealthy_dollars
    );
    // Healthy, the same readings are idle, and the rule acts.
    let (events, state) = run(&settings(Vec::new()), |t| two(t, Some(false), false));
    assert_eq!(kinds(&events, "idle"), ["breach", "warning", "action"]);
    assert_eq!(state.unhealthy_dollars, 0.0);
}

#[test]
fn a_rule_on_health_warns_and_acts_naming_each_problem() {
    let mut s = settings(Vec::new());
    s.rules = vec![health_rule()];
    let (events, _) = run(&s, |t| two(t, Some(true), false));
    assert_eq!(kinds(&events, "broken"), ["breach", "warning", "action"]);
    let Some(Event::Action { evidence, .. }) = events.iter().find(|e| e.kind() == "action") else {
        panic!("{events:?}")
    };
    assert_eq!(evidence.problems, ["GPU 1: XID 79: GPU fell off the bus"]);
}

/// A lost GPU leaves the idle rules' data incomplete (unknown is busy), and is unhealthy to a
/// rule on health.
#[test]
fn a_lost_gpu_is_unknown_to_idle_rules_and_unhealthy_to_health_rules() {
    let mut s = settings(Vec::new());
    s.rules.push(health_rule());
    let (events, state) = run(&s, |t| two(t, Some(true), true));
    assert!(kinds(&events, "idle").is_empty(), "{events:?}");
    assert_eq!(kinds(&events, "broken"), ["breach", "warning", "action"]);
    assert!(state.unhealthy_dollars > 0.0);
}

/// Health that cannot be read never makes a rule on health act.
#[test]
fn unknown_health_never_acts() {
    let mut s = settings(Vec::new());
    s.rules = vec![health_rule()];
    let (events, state) = run(&s, |t| two(t, None, false));
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(state.unhealthy_dollars, 0.0);
    // And a GPU that recovers during the warning calls the action off.
    let (events, _) = run(&s, |t| two(t, Some(t < 112.0), false));
    assert_eq!(
        kinds(&events, "broken"),
        ["breach", "warning", "cancelled", "recovered"]
    );
}
