use super::*;
use crate::rules::{Comparison, GpuReading, Metric, Scope, Statistic};

fn condition(period: u64, n: u32, m: u32) -> Condition {
    Condition {
        metric: Metric::GpuUtilization,
        statistic: Statistic::Average,
        comparison: Comparison::LessThan,
        threshold: 0.05,
        period: Duration::from_secs(period),
        evaluation_periods: n,
        datapoints_to_alarm: m,
        gpus: Aggregation::Every,
    }
}

fn rule(period: u64, n: u32, m: u32) -> Rule {
    Rule {
        name: "idle".into(),
        scope: Scope::Node,
        subject: None,
        trigger: Trigger::Idle(condition(period, n, m)),
        lifecycle: None,
        action: Action::Stop,
        command: Vec::new(),
        budget: None,
    }
}

fn settings() -> Settings {
    Settings {
        warning: Duration::from_secs(30),
        slack: 2.5,
    }
}

fn obs(t: f64, utils: &[Option<f64>]) -> Observation {
    Observation {
        t,
        complete: utils.iter().all(Option::is_some),
        gpus: utils
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let mut g = GpuReading {
                    index: i as u32,
                    ..GpuReading::default()
                };
                g.set(Metric::GpuUtilization, *u);
                g
            })
            .collect(),
        veto: None,
        holders_unknown: false,
    }
}

/// Takes in one observation and evaluates the rule at its time; returns the events.
fn step_on(r: &Rule, state: &mut State, ctx: &Context, o: &Observation) -> Vec<Event> {
    let rules = std::slice::from_ref(r);
    ingest(rules, state, o, settings().slack);
    let c = Context {
        now: o.t,
        ..ctx.clone()
    };
    evaluate(rules, &settings(), state, &c)
}

/// Takes in `observe(t)` at each of `times` (seconds), evaluating after each, and returns
/// (time, kind) of every event.
fn run_observing(
    r: &Rule,
    state: &mut State,
    ctx: &Context,
    times: impl Iterator<Item = u64>,
    observe: impl Fn(u64) -> Observation,
) -> Vec<(u64, &'static str)> {
    let mut out = Vec::new();
    for t in times {
        for e in step_on(r, state, ctx, &observe(t)) {
            out.push((t, e.kind()));
        }
    }
    out
}

/// Runs one observation per second from `from` to `to` (exclusive), with the GPUs'
/// utilization `util(t)`, evaluating after each, and returns (time, kind) of every event.
fn run(
    r: &Rule,
    state: &mut State,
    ctx: &Context,
    from: u64,
    to: u64,
    util: impl Fn(u64) -> Vec<Option<f64>>,
) -> Vec<(u64, &'static str)> {
    run_observing(r, state, ctx, from..to, |t| obs(t as f64, &util(t)))
}

#[test]
fn datapoints_table() {
    // (values per 60 s period, N, M, breaching?)
    let cases: &[(&[f64], u32, u32, bool)] = &[
        (&[0.01, 0.02], 2, 2, true),
        (&[0.01, 0.20], 2, 2, false),
        (&[0.20, 0.01, 0.01], 3, 2, true),
        (&[0.20, 0.01, 0.30], 3, 2, false),
        (&[0.049], 1, 1, true),
        (&[0.05], 1, 1, false),
    ];
    for (values, n, m, want) in cases {
        let r = condition(60, *n, *m);
        let mut w = Window::default();
        for (p, v) in values.iter().enumerate() {
            for s in 0..60 {
                w.ingest(&r, &obs((p * 60 + s) as f64, &[Some(*v), Some(*v)]));
            }
        }
        let now = (values.len() * 60) as f64;
        let a = w.assess(&r, now, 2.5, 0.0);
        assert_eq!(a.breaching, *want, "{values:?} {n}/{m}: {a:?}");
    }
}

#[test]
fn every_gpu_must_be_idle_by_default() {
    let r = rule(10, 1, 1);
    let mut state = State::default();
    let events = run(&r, &mut state, &Context::default(), 0, 60, |_| {
        vec![Some(0.0), Some(0.0), Some(0.9), Some(0.0)]
    });
    assert!(events.is_empty(), "{events:?}");

    let mut any = r.clone();
    any.trigger = Trigger::Idle(Condition {
        gpus: Aggregation::Any,
        ..condition(10, 1, 1)
    });
    let mut state = State::default();
    let events = run(&any, &mut state, &Context::default(), 0, 12, |_| {
        vec![Some(0.0), Some(0.9)]
    });
    assert_eq!(events, vec![(10, "breach"), (10, "warning")]);
}

#[test]
fn unknown_is_busy() {
    let r = rule(10, 1, 1);
    // One GPU reading missing for one second in every period: never a breach.
    let mut state = State::default();
    let events = run(&r, &mut state, &Context::default(), 0, 100, |t| {
        vec![Some(0.0), if t % 10 == 5 { None } else { Some(0.0) }]
    });
    assert!(events.is_empty(), "{events:?}");
    // A gap in the samples longer than the slack: that period is unknown.
    let c = condition(10, 1, 1);
    let mut w = Window::default();
    for t in (0..10).chain(15..20) {
        w.ingest(&c, &obs(t as f64, &[Some(0.0)]));
    }
    let a = w.assess(&c, 20.0, 2.5, 0.0);
    assert!(!a.breaching, "{a:?}");
}

#[test]
fn warns_then_acts_once() {
    let r = rule(10, 2, 2);
    let mut state = State::default();
    let events = run(&r, &mut state, &Context::default(), 0, 51, |_| {
        vec![Some(0.01)]
    });
    // Two complete idle periods by t=20; the warning lasts 30 s.
    assert_eq!(
        events,
        vec![(20, "breach"), (20, "warning"), (50, "action")]
    );
    assert!(state.rules["idle"].in_flight.is_some());
    // An action withdrawn (its record was not durable) falls due again at the next sample.
    let mut withdrawn = state.clone();
    withdraw(&mut withdrawn, "idle");
    assert!(withdrawn.rules["idle"].in_flight.is_none());
    let again = run(&r, &mut withdrawn, &Context::default(), 51, 52, |_| {
        vec![Some(0.01)]
    });
    assert_eq!(again, vec![(51, "action")]);
    let events = run(&r, &mut state, &Context::default(), 51, 120, |_| {
        vec![Some(0.01)]
    });
    assert!(events.is_empty(), "{events:?}");
    complete(&mut state, "idle");
    // After the action, a completely fresh window is needed: next warning at 50+20.
    let events = run(&r, &mut state, &Context::default(), 120, 130, |_| {
        vec![Some(0.01)]
    });
    assert!(events.iter().all(|e| e.1 != "action"), "{events:?}");
}

#[test]
fn activity_during_the_warning_cancels() {
    let r = rule(10, 1, 1);
    let mut state = State::default();
    let events = run(&r, &mut state, &Context::default(), 0, 60, |t| {
        vec![Some(if t == 25 { 0.8 } else { 0.0 })]
    });
    // The busy second makes its period not breaching; the action is cancelled at once, and
    // the rule re-arms only with periods that start after the cancellation.
    assert_eq!(
        events,
        vec![
            (10, "breach"),
            (10, "warning"),
            (25, "cancelled"),
            (30, "recovered"),
            (40, "breach"),
            (40, "warning")
        ],
    );
}

#[test]
fn boot_grace_holds_and_interruptions_block() {
    let r = rule(10, 1, 1);
    let grace = Context {
        grace_until: 45.0,
        ..Context::default()
    };
    let mut state = State::default();
    let events = run(&r, &mut state, &grace, 0, 50, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(10, "breach"), (45, "warning")]);

    let held = Context {
        hold_until: Some(100.0),
        ..Context::default()
    };
    let mut state = State::default();
    let events = run(&r, &mut state, &held, 0, 130, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(10, "breach"), (100, "warning")]);
    let events = run(&r, &mut state, &held, 130, 131, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(130, "action")]);

    // A pending action that falls due during a hold waits for it, then runs.
    let mut state = State::default();
    run(&r, &mut state, &Context::default(), 0, 15, |_| {
        vec![Some(0.0)]
    });
    let hold = Context {
        hold_until: Some(60.0),
        ..Context::default()
    };
    let events = run(&r, &mut state, &hold, 15, 61, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(40, "postponed"), (60, "action")]);

    let interrupted = Context {
        interruption: true,
        ..Context::default()
    };
    let mut state = State::default();
    let events = run(&r, &mut state, &interrupted, 0, 100, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(10, "breach")]);
}

#[test]
fn a_grace_after_a_restart_holds_back_an_action_carried_over() {
    // Warned before the restart; the daemon comes back at 30 with a grace until 100.
    let r = rule(10, 1, 1);
    let mut state = State::default();
    let events = run(&r, &mut state, &Context::default(), 0, 30, |_| {
        vec![Some(0.0)]
    });
    assert_eq!(events, vec![(10, "breach"), (10, "warning")]);
    let grace = Context {
        grace_until: 100.0,
        ..Context::default()
    };
    let events = run(&r, &mut state, &grace, 30, 100, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(40, "postponed")]);
    let events = run(&r, &mut state, &grace, 100, 101, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(100, "action")]);
}

#[test]
fn missing_data_during_a_warning_calls_the_action_off() {
    // A period longer than the warning: at the due time the window still judges the periods
    // that raised the warning, so only the data seen since then can call it off.
    let r = rule(100, 1, 1);
    let ctx = Context::default();
    let warned = |state: &mut State| {
        let events = run(&r, state, &Context::default(), 0, 101, |_| vec![Some(0.0)]);
        assert_eq!(events, vec![(100, "breach"), (100, "warning")]);
    };
    let at = |state: &mut State, t: f64| {
        let ctx = Context {
            now: t,
            ..Context::default()
        };
        evaluate(std::slice::from_ref(&r), &settings(), state, &ctx)
    };

    // No sample from 101 to 129 (a hung NVML, a stopped daemon); the first one after is idle.
    let mut state = State::default();
    warned(&mut state);
    let events = step_on(&r, &mut state, &ctx, &obs(130.0, &[Some(0.0)]));
    let [Event::Cancelled { reason, .. }] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert!(reason.contains("no GPU data for 30 s"), "{reason}");

    // No sample at all since the warning: at the due time the data is missing, not idle.
    let mut state = State::default();
    warned(&mut state);
    let events = at(&mut state, 130.0);
    assert!(
        matches!(events.as_slice(), [Event::Cancelled { .. }]),
        "{events:?}"
    );

    // Gaps within the slack are not missing data: the action runs when due.
    let mut state = State::default();
    warned(&mut state);
    let kinds = run_observing(&r, &mut state, &ctx, (102..=130).step_by(2), |t| {
        obs(t as f64, &[Some(0.0)])
    });
    assert_eq!(kinds, [(130, "action")]);
}

#[test]
fn lifecycle_filter() {
    let mut r = rule(10, 1, 1);
    r.lifecycle = Some(Lifecycle::Spot);
    for (lifecycle, want) in [
        (None, 0),
        (Some(Lifecycle::OnDemand), 0),
        (Some(Lifecycle::Spot), 2),
    ] {
        let ctx = Context {
            lifecycle,
            ..Context::default()
        };
        let mut state = State::default();
        let events = run(&r, &mut state, &ctx, 0, 12, |_| vec![Some(0.0)]);
        assert_eq!(events.len(), want, "{lifecycle:?}: {events:?}");
    }
}

#[test]
fn bursty_training_never_breaches_a_two_hour_rule() {
    // Busy 50 min, idle 40 min (a checkpoint), repeating, for 12 hours.
    let r = rule(3600, 2, 2);
    let mut state = State::default();
    let mut events = Vec::new();
    for t in 0..12 * 3600u64 {
        let u = if t % 5400 < 3000 { 0.95 } else { 0.0 };
        ingest(
            std::slice::from_ref(&r),
            &mut state,
            &obs(t as f64, &[Some(u), Some(u)]),
            settings().slack,
        );
        if t % 60 == 0 {
            let ctx = Context {
                now: t as f64,
                ..Context::default()
            };
            events.extend(evaluate(
                std::slice::from_ref(&r),
                &settings(),
                &mut state,
                &ctx,
            ));
        }
    }
    assert!(events.is_empty(), "{events:?}");
}

#[test]
fn a_budget_gate_opens_at_its_share_and_not_below() {
    let mut r = rule(10, 1, 1);
    r.budget = Some(crate::rules::BudgetGate {
        name: "team".into(),
        spent_at_least: 0.8,
    });
    for (ratio, want) in [(None, 0), (Some(0.79), 0), (Some(0.80), 2), (Some(0.95), 2)] {
        let ctx = Context {
            budgets: ratio.map(|r| ("team".to_string(), r)).into_iter().collect(),
            ..Context::default()
        };
        let mut state = State::default();
        let events = run(&r, &mut state, &ctx, 0, 12, |_| vec![Some(0.0)]);
        assert_eq!(events.len(), want, "{ratio:?}: {events:?}");
    }
}

#[test]
fn an_exhausted_budget_acts_even_when_busy_but_waits_for_holds() {
    let mut r = rule(10, 1, 1);
    r.trigger = Trigger::BudgetExhausted {
        budget: "team".into(),
    };
    let spent = |ratio: f64| Context {
        budgets: [("team".to_string(), ratio)].into_iter().collect(),
        ..Context::default()
    };
    let mut state = State::default();
    assert!(run(&r, &mut state, &spent(0.99), 0, 5, |_| vec![Some(0.9)]).is_empty());
    let events = run(&r, &mut state, &spent(1.0), 5, 40, |_| vec![Some(0.9)]);
    assert_eq!(events, vec![(5, "breach"), (5, "warning"), (35, "action")]);
    complete(&mut state, "idle");
    // Not again at once (if the stop failed, say), but an hour later.
    assert!(run(&r, &mut state, &spent(1.0), 40, 3634, |_| vec![Some(0.9)]).is_empty());
    let events = run(&r, &mut state, &spent(1.0), 3635, 3636, |_| vec![Some(0.9)]);
    assert_eq!(events, vec![(3635, "warning")]);

    let mut held = spent(1.0);
    held.hold_until = Some(100.0);
    let mut state = State::default();
    let events = run(&r, &mut state, &held, 0, 100, |_| vec![Some(0.9)]);
    assert_eq!(events, vec![(0, "breach")]);
}

#[test]
fn state_survives_a_round_trip_mid_warning() {
    let r = rule(10, 1, 1);
    let mut state = State::default();
    run(&r, &mut state, &Context::default(), 0, 20, |_| {
        vec![Some(0.0)]
    });
    assert!(state.rules["idle"].pending.is_some());
    let json = serde_json::to_string(&state).unwrap();
    let mut restored: State = serde_json::from_str(&json).unwrap();
    assert_eq!(restored, state);
    let events = run(&r, &mut restored, &Context::default(), 20, 41, |_| {
        vec![Some(0.0)]
    });
    assert_eq!(events, vec![(40, "action")]);
}

#[test]
fn a_rule_reads_as_a_sentence() {
    let mut r = rule(300, 3, 2);
    if let Trigger::Idle(c) = &mut r.trigger {
        c.threshold = 0.07;
    }
    assert_eq!(
        r.describe(),
        "stop when every GPU's average gpu_utilization is below 7% in 2 of 3 periods of 5m"
    );
    r.budget = Some(crate::rules::BudgetGate {
        name: "team".into(),
        spent_at_least: 0.29,
    });
    r.trigger = Trigger::BudgetExhausted {
        budget: "team".into(),
    };
    assert_eq!(
        r.describe(),
        "stop when budget \"team\" is spent, once budget \"team\" is 29% spent"
    );
}

#[test]
fn a_clock_that_steps_back_during_a_warning_calls_the_action_off() {
    // The wall clock steps back 50 s ten seconds after the warning. The window ignores the
    // samples older than its newest, so a job that ran in those 50 s would go unseen, and the
    // due time would come 80 s after the warning, not 30 s.
    let r = rule(100, 1, 1);
    let slack = settings().slack;
    let mut state = State::default();
    let events = run(&r, &mut state, &Context::default(), 0, 111, |_| {
        vec![Some(0.0)]
    });
    assert_eq!(events, vec![(100, "breach"), (100, "warning")]);
    let events = step_on(
        &r,
        &mut state,
        &Context::default(),
        &obs(60.0, &[Some(0.0)]),
    );
    // (The periods before the new time were never seen: the rule recovers, as it would on
    // any unknown data.)
    let [Event::Recovered { .. }, Event::Cancelled { reason, .. }] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(
        reason,
        "the clock went back 50.0 s during the warning (a sample at 1970-01-01T00:01:00Z)"
    );
    // The periods seen before the step never count again: re-arming does not go back with the
    // clock.
    assert_eq!(state.rules["idle"].not_before, 110.0);

    // A step back within the slack (2.5 s) is tolerated as a gap is, and its sample is still
    // checked for activity.
    for (util, want) in [
        (0.0, None),
        (0.9, Some("GPU 0 came back: gpu_utilization 0.900")),
    ] {
        let mut state = State::default();
        run(&r, &mut state, &Context::default(), 0, 111, |_| {
            vec![Some(0.0)]
        });
        ingest(
            std::slice::from_ref(&r),
            &mut state,
            &obs(108.0, &[Some(util)]),
            slack,
        );
        let pending = state.rules["idle"].pending.as_ref().unwrap();
        assert_eq!(pending.activity.as_deref(), want);
    }

    // A clock that only goes forward within the slack is no step: the action runs when due.
    let mut state = State::default();
    let events = run(&r, &mut state, &Context::default(), 0, 140, |_| {
        vec![Some(0.0)]
    });
    assert_eq!(
        events,
        vec![(100, "breach"), (100, "warning"), (130, "action")]
    );
}

/// GPU 0 split into two MIG devices (GPU instances 1 and 2), each with `value` for `metric`.
fn relaid(t: f64, metric: Metric, value: f64) -> Observation {
    let mut o = obs(t, &[]);
    for gi in [1, 2] {
        let mut g = GpuReading {
            index: 0,
            mig: Some(crate::rules::MigDevice {
                gpu_instance: gi,
                compute_instance: 0,
                share: 0.5,
            }),
            ..GpuReading::default()
        };
        g.set(metric, Some(value));
        o.gpus.push(g);
    }
    o
}

#[test]
fn a_mig_layout_that_changes_during_a_warning_calls_the_action_off() {
    // A period longer than the warning: at the due time the window still judges the periods
    // that raised the warning, so only what is seen since then can call it off. Someone splits
    // GPU 0 into two MIG devices to start work; the new devices read idle at first.
    let r = rule(100, 1, 1);
    let ctx = Context::default();
    let mut state = State::default();
    let events = run(&r, &mut state, &ctx, 0, 101, |_| vec![Some(0.0)]);
    assert_eq!(events, vec![(100, "breach"), (100, "warning")]);
    let relaid_idle = |t: u64| relaid(t as f64, Metric::GpuUtilization, 0.0);
    let events = step_on(&r, &mut state, &ctx, &relaid_idle(101));
    let [Event::Cancelled { reason, .. }] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(
        reason,
        "the GPUs or their MIG layout changed during the warning"
    );
    let kinds = run_observing(&r, &mut state, &ctx, 102..=130, relaid_idle);
    assert_eq!(kinds, []);
}

#[test]
fn a_layout_changed_before_the_warning_does_not_call_it_off() {
    // The layout changed at 250 s, in the period the warning comes in (it comes at 270 s, when
    // the start-up grace ends, on the earlier periods): from then on the devices are the same
    // from one sample to the next, and a change made before the warning is no activity during
    // it.
    let r = rule(100, 3, 2);
    let ctx = Context {
        grace_until: 270.0,
        ..Context::default()
    };
    let kinds = run_observing(&r, &mut State::default(), &ctx, 0..340, |t| {
        if t < 250 {
            obs(t as f64, &[Some(0.0)])
        } else {
            relaid(t as f64, Metric::GpuUtilization, 0.0)
        }
    });
    assert_eq!(kinds, [(200, "breach"), (270, "warning"), (300, "action")]);
}

#[test]
fn a_broken_gpu_that_loses_its_mig_devices_is_no_relayout() {
    // A health rule warned of GPU 0, whose MIG devices are unhealthy; then the GPU falls off
    // the bus and reads as one whole, unhealthy GPU. Nobody made that change: the action runs.
    let mut r = rule(10, 1, 1);
    let Trigger::Idle(c) = &mut r.trigger else {
        unreachable!()
    };
    c.metric = Metric::GpuUnhealthy;
    c.comparison = Comparison::GreaterThan;
    c.threshold = 0.5;
    c.statistic = Statistic::Maximum;
    let kinds = run_observing(&r, &mut State::default(), &Context::default(), 0..60, |t| {
        if t < 15 {
            relaid(t as f64, Metric::GpuUnhealthy, 1.0)
        } else {
            let mut o = obs(t as f64, &[Some(0.0)]);
            o.gpus[0].set(Metric::GpuUnhealthy, Some(1.0));
            o
        }
    });
    // (The period the layout changed in is unknown, so the rule recovers and breaches again
    // meanwhile; the warning stands.)
    assert!(kinds.contains(&(40, "action")), "{kinds:?}");
    assert!(!kinds.iter().any(|(_, k)| *k == "cancelled"), "{kinds:?}");
}

mod readings;
mod rests_on;
