use super::*;
use crate::rules::{Action, Aggregation, Condition, GpuReading, Scope, Statistic, Trigger};

/// One rule, "idle": stop once GPU 0's utilization is below 5% for one 10 s period, after a
/// 5 s warning; samples every second.
pub(super) fn settings(budgets: Vec<Budget>) -> Settings {
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

/// GPU 0 at utilization `u`, at `t`.
pub(super) fn obs(t: f64, u: f64) -> Observation {
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
        holders_unknown: false,
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
        kinds.extend(
            out.order
                .on_saved(&mut state, true)
                .events()
                .iter()
                .map(|e| (t, e.kind())),
        );
        if t == 12 {
            assert_eq!(
                out.view.gpu_idle,
                vec![GpuIdle {
                    index: 0,
                    mig: None,
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
    // GPU 1 goes idle again: half the node for 1 s, $0.005.
    assert!((run(1123.0, 0.9, 0.0, price) - 0.605).abs() < 1e-9);
    // The wall clock steps 100 s back: that sample accrues nothing, the next ones accrue as
    // before, though they are timed before the time already accrued.
    assert!((run(1023.0, 0.9, 0.0, price) - 0.605).abs() < 1e-9);
    for t in 1..=10 {
        total = run(1023.0 + f64::from(t), 0.9, 0.0, price);
    }
    assert!((total - 0.655).abs() < 1e-9, "{total}");
    // GPU 1's idle run began after the time the clock stepped back to: it starts over there,
    // and is never negative.
    let inputs = Inputs {
        now: 1034.0,
        price,
        ..Inputs::default()
    };
    let out = step(&settings, &mut state, &two(1034.0, 0.9, 0.0), &inputs);
    let seconds: Vec<f64> = out.view.gpu_idle.iter().map(|g| g.seconds).collect();
    assert_eq!(seconds, [0.0, 11.0]);
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
            holders_unknown: false,
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
            out.order
                .on_saved(&mut state, true)
                .events()
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

/// GPU 0 in MIG mode as a 3g.40gb instance (3/7 of the GPU) and two 2g.20gb ones, with their SM
/// activity; GPU 1 whole, with its utilization only (no GPM).
fn mig_node(t: f64, sm: [Option<f64>; 3], gpu1: f64) -> Observation {
    let shares = [3.0 / 7.0, 2.0 / 7.0, 2.0 / 7.0];
    let mut gpus: Vec<GpuReading> = (0..3)
        .map(|i| {
            let mut g = GpuReading {
                index: 0,
                mig: Some(MigDevice {
                    gpu_instance: [1, 5, 6][i],
                    compute_instance: 0,
                    share: shares[i],
                }),
                ..GpuReading::default()
            };
            g.set(Metric::SmActive, sm[i]);
            g
        })
        .collect();
    let mut whole = GpuReading {
        index: 1,
        ..GpuReading::default()
    };
    whole.set(Metric::GpuUtilization, Some(gpu1));
    gpus.push(whole);
    Observation {
        t,
        complete: true,
        gpus,
        veto: None,
        holders_unknown: false,
    }
}

#[test]
fn a_mig_node_is_idle_only_when_every_mig_device_is() {
    let mut settings = settings(Vec::new());
    let run = |settings: &Settings, node: &dyn Fn(f64) -> Observation| {
        let mut state = State::default();
        let mut kinds = Vec::new();
        for t in 0..20 {
            let now = f64::from(t);
            let inputs = Inputs {
                now,
                ..Inputs::default()
            };
            let out = step(settings, &mut state, &node(now), &inputs);
            kinds.extend(
                out.order
                    .on_saved(&mut state, true)
                    .events()
                    .iter()
                    .map(|e| (t, e.kind())),
            );
        }
        kinds
    };
    // A MIG device has no utilization: a utilization rule counts it busy, never idle.
    assert!(run(&settings, &|t| mig_node(t, [Some(0.0); 3], 0.0)).is_empty());
    if let Trigger::Idle(c) = &mut settings.rules[0].trigger {
        c.metric = Metric::SmActive;
    }
    settings.idle_by = IdleBy::from_rules(&settings.rules);
    // Every MIG device idle, but GPU 1 has no GPM: unknown to an sm_active rule, so busy.
    assert!(run(&settings, &|t| mig_node(t, [Some(0.0); 3], 0.0)).is_empty());
    // Without GPU 1, every MIG device idle acts.
    let only_mig = |sm: fn(f64) -> [Option<f64>; 3]| {
        move |t: f64| {
            let mut o = mig_node(t, sm(t), 0.0);
            o.gpus.pop();
            o
        }
    };
    assert_eq!(
        run(&settings, &only_mig(|_| [Some(0.0); 3])),
        [(10, "breach"), (10, "warning"), (15, "action")]
    );
    // One MIG device at work keeps the node.
    assert!(run(&settings, &only_mig(|_| [Some(0.0), Some(0.4), Some(0.0)])).is_empty());
    // One MIG device unknown half the time (no GPM sample) keeps the node too.
    let gaps = only_mig(|t| [Some(0.0), Some(0.0), (t % 2.0 == 0.0).then_some(0.0)]);
    assert!(run(&settings, &gaps).is_empty());
}

#[test]
fn each_mig_device_has_its_idle_time_and_its_share_of_idle_dollars() {
    let settings = settings(Vec::new());
    let mut state = State::default();
    let price = Some(Price {
        usd_per_hour: 36.0,
        source: Source::Config,
    });
    let mut out = None;
    // The 3g.40gb instance idle, the 2g.20gb ones at work; GPU 1 idle: for 100 s.
    for t in 0..=100 {
        let inputs = Inputs {
            now: f64::from(t),
            price,
            ..Inputs::default()
        };
        out = Some(step(
            &settings,
            &mut state,
            &mig_node(f64::from(t), [Some(0.01), Some(0.5), Some(0.3)], 0.0),
            &inputs,
        ));
    }
    let view = out.unwrap().view;
    let idle: Vec<(u32, Option<u32>, bool, f64)> = view
        .gpu_idle
        .iter()
        .map(|g| (g.index, g.mig.map(|m| m.gpu_instance), g.idle, g.seconds))
        .collect();
    // A utilization rule, so whole GPUs are judged by utilization, MIG devices (which have
    // none) by SM activity below 5%.
    assert_eq!(
        idle,
        [
            (0, Some(1), true, 100.0),
            (0, Some(5), false, 0.0),
            (0, Some(6), false, 0.0),
            (1, None, true, 100.0),
        ]
    );
    // $36/h for two GPUs: GPU 1 idle is $18/h, 3/7 of GPU 0 is $18/h × 3/7; over 99 s (the
    // first sample at 0 s starts the clock, and accrual starts after it).
    let expected = (18.0 + 18.0 * 3.0 / 7.0) * 99.0 / 3600.0;
    assert!(
        (view.idle_dollars - expected).abs() < 1e-9,
        "{}",
        view.idle_dollars
    );
    // A MIG device destroyed and made anew starts its idle time over.
    let mut o = mig_node(101.0, [Some(0.01), Some(0.5), Some(0.3)], 0.0);
    o.gpus.remove(0);
    step(
        &settings,
        &mut state,
        &o,
        &Inputs {
            now: 101.0,
            ..Inputs::default()
        },
    );
    let view = step(
        &settings,
        &mut state,
        &mig_node(102.0, [Some(0.01), Some(0.5), Some(0.3)], 0.0),
        &Inputs {
            now: 102.0,
            ..Inputs::default()
        },
    )
    .view;
    assert_eq!(view.gpu_idle[0].seconds, 0.0);
    assert_eq!(view.gpu_idle[3].seconds, 102.0);
}

#[test]
fn idle_is_judged_by_the_rules_own_readings_first() {
    let mut settings = settings(Vec::new());
    let Trigger::Idle(c) = &mut settings.rules[0].trigger else {
        unreachable!()
    };
    c.metric = Metric::Processes;
    c.threshold = 1.0;
    let by = IdleBy::from_rules(&settings.rules);
    assert_eq!(
        by.0,
        [
            (Metric::Processes, Comparison::LessThan, 1.0),
            (Metric::GpuUtilization, Comparison::LessThan, 0.05),
            (Metric::SmActive, Comparison::LessThan, 0.05)
        ]
    );
    let mut g = GpuReading::default();
    assert_eq!(by.judge(&g), None, "nothing known, nothing judged");
    g.set(Metric::GpuUtilization, Some(0.0));
    assert_eq!(by.judge(&g), Some(true));
    g.set(Metric::Processes, Some(2.0));
    assert_eq!(by.judge(&g), Some(false), "the rule's own reading decides");
}

#[test]
fn a_mig_layout_that_changes_within_a_period_is_unknown_never_mixed() {
    let mut settings = settings(Vec::new());
    if let Trigger::Idle(c) = &mut settings.rules[0].trigger {
        c.metric = Metric::SmActive;
    }
    // Two MIG devices, by (GPU instance, SM activity).
    let node = |t: f64, devices: [(u32, f64); 2]| Observation {
        t,
        complete: true,
        gpus: devices
            .iter()
            .map(|&(gi, sm)| {
                let mut g = GpuReading {
                    index: 0,
                    mig: Some(MigDevice {
                        gpu_instance: gi,
                        compute_instance: 0,
                        share: 0.5,
                    }),
                    ..GpuReading::default()
                };
                g.set(Metric::SmActive, Some(sm));
                g
            })
            .collect(),
        veto: None,
        holders_unknown: false,
    };
    let mut state = State::default();
    let mut events = Vec::new();
    for t in 0..40 {
        let now = f64::from(t);
        // Instance 1 at 8% throughout. Instance 2 is destroyed halfway through each period and
        // instance 3 made, listed first: by position, each slot would average 4%, idle.
        let devices = if t % 10 < 5 {
            [(1, 0.08), (2, 0.0)]
        } else {
            [(3, 0.0), (1, 0.08)]
        };
        let inputs = Inputs {
            now,
            ..Inputs::default()
        };
        let out = step(&settings, &mut state, &node(now, devices), &inputs);
        events.extend(
            out.order
                .on_saved(&mut state, true)
                .events()
                .iter()
                .map(|e| (t, e.kind())),
        );
    }
    assert!(events.is_empty(), "{events:?}");
}

#[test]
fn idle_by_keeps_the_rules_comparison() {
    let mut settings = settings(Vec::new());
    if let Trigger::Idle(c) = &mut settings.rules[0].trigger {
        c.metric = Metric::Processes;
        c.comparison = Comparison::LessThanOrEqual;
        c.threshold = 0.0;
    }
    let by = IdleBy::from_rules(&settings.rules);
    let mut g = GpuReading::default();
    g.set(Metric::Processes, Some(0.0));
    assert_eq!(by.judge(&g), Some(true), "processes <= 0 with none running");
    g.set(Metric::Processes, Some(1.0));
    assert_eq!(by.judge(&g), Some(false));
}
