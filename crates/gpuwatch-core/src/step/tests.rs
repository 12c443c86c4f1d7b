use super::*;
use crate::rules::{Action, Aggregation, Condition, GpuReading, Scope, Statistic, Trigger};

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
