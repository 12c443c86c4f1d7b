//! Job and user scopes: each judged on its own GPUs, held on its own, and priced.

use std::collections::BTreeMap;

use super::super::tests::settings;
use super::super::*;
use crate::cost::price::{Price, Source};
use crate::rules::{Action, GpuReading, Scope};

/// GPU 0 held by job 7 of alice (idle), GPU 1 by job 8 of bob (at work, unless `idle_1`),
/// GPU 2 shared by jobs 7 and 8 (idle), GPU 3 by nobody (idle).
fn node(t: f64, idle_1: bool) -> Observation {
    let gpu = |index: u32, u: f64, jobs: &[&str], users: &[&str]| {
        let mut g = GpuReading {
            index,
            jobs: jobs.iter().map(|s| s.to_string()).collect(),
            users: users.iter().map(|s| s.to_string()).collect(),
            ..GpuReading::default()
        };
        g.set(Metric::GpuUtilization, Some(u));
        g
    };
    Observation {
        t,
        complete: true,
        gpus: vec![
            gpu(0, 0.0, &["7"], &["alice"]),
            gpu(1, if idle_1 { 0.0 } else { 0.9 }, &["8"], &["bob"]),
            gpu(2, 0.0, &["7", "8"], &["alice", "bob"]),
            gpu(3, 0.0, &[], &[]),
        ],
        veto: None,
        holders_unknown: false,
    }
}

fn scoped(scope: Scope) -> Settings {
    let mut s = settings(Vec::new());
    s.rules[0].scope = scope;
    s.rules[0].action = Action::Exec;
    s
}

/// Runs samples `ts`, returning each event as (t, rule, kind, devices of its evidence).
fn run(
    settings: &Settings,
    state: &mut State,
    ts: std::ops::Range<u32>,
    holds: &BTreeMap<String, f64>,
) -> Vec<(u32, String, &'static str, Vec<String>)> {
    let mut out = Vec::new();
    for t in ts {
        let d = step(
            settings,
            state,
            &node(f64::from(t), false),
            &Inputs {
                now: f64::from(t),
                subject_holds: holds.clone(),
                ..Inputs::default()
            },
        );
        for e in d.order.on_saved(state, true).events() {
            let gpus = match e {
                Event::Breach { evidence, .. }
                | Event::Warning { evidence, .. }
                | Event::Action { evidence, .. } => evidence.gpus.clone(),
                _ => Vec::new(),
            };
            out.push((t, e.rule().to_string(), e.kind(), gpus));
        }
    }
    out
}

#[test]
fn a_job_rule_judges_each_job_on_its_own_gpus() {
    let settings = scoped(Scope::Job);
    let mut state = State::default();
    let events = run(&settings, &mut state, 0..20, &BTreeMap::new());
    let gpus = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Job 7's GPUs (0 and 2) are idle; job 8 has GPU 1 at work. GPU 3 is no job's.
    assert_eq!(
        events,
        [
            (10, "idle job 7".to_string(), "breach", gpus(&["0", "2"])),
            (10, "idle job 7".to_string(), "warning", gpus(&["0", "2"])),
            (15, "idle job 7".to_string(), "action", gpus(&["0", "2"])),
        ]
    );
    assert!(state.engine.rules.contains_key("idle job 8"));
    assert!(settings.rules[0].owns_state("idle job 8"));
    assert!(!settings.rules[0].owns_state("idle ml/pod"));
}

#[test]
fn a_user_rule_judges_each_user_on_their_gpus() {
    let settings = scoped(Scope::User);
    let mut state = State::default();
    let events = run(&settings, &mut state, 0..12, &BTreeMap::new());
    let rules: Vec<(&str, &str)> = events.iter().map(|(_, r, k, _)| (r.as_str(), *k)).collect();
    assert_eq!(
        rules,
        [
            ("idle user alice", "breach"),
            ("idle user alice", "warning")
        ]
    );
}

#[test]
fn a_hold_of_one_job_postpones_that_jobs_rules_only() {
    let mut settings = scoped(Scope::Job);
    let mut state = State::default();
    let holds: BTreeMap<String, f64> = [("job 7".to_string(), 1e9)].into();
    // Job 8 idle too, so that both would breach.
    let mut events = Vec::new();
    for t in 0..20u32 {
        let d = step(
            &settings,
            &mut state,
            &node(f64::from(t), true),
            &Inputs {
                now: f64::from(t),
                subject_holds: holds.clone(),
                ..Inputs::default()
            },
        );
        for e in d.order.on_saved(&mut state, true).events() {
            events.push((e.rule().to_string(), e.kind()));
        }
    }
    assert!(
        events.contains(&("idle job 8".to_string(), "action")),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|(r, k)| r == "idle job 7" && *k != "breach"),
        "{events:?}"
    );
    // A hold of a user does not hold a job of the same name.
    settings.rules[0].name = "again".into();
    let holds: BTreeMap<String, f64> = [("user 7".to_string(), 1e9)].into();
    let events = run(&settings, &mut State::default(), 0..20, &holds);
    assert!(events
        .iter()
        .any(|(_, r, k, _)| r == "again job 7" && *k == "action"));
}

#[test]
fn idle_time_and_money_go_to_the_jobs_and_users_holding_the_gpus() {
    let settings = scoped(Scope::Job);
    let mut state = State::default();
    let price = Some(Price {
        usd_per_hour: 3600.0 * 4.0,
        source: Source::Config,
    });
    let mut view = None;
    for t in 100..=110 {
        let d = step(
            &settings,
            &mut state,
            &node(f64::from(t), false),
            &Inputs {
                now: f64::from(t),
                price,
                ..Inputs::default()
            },
        );
        view = Some(d.view);
    }
    let view = view.unwrap();
    // $1 per GPU-second. 10 s: job 7 has GPU 0 idle alone ($10) and half of GPU 2 ($5); job 8
    // half of GPU 2 ($5), GPU 1 busy. Each job's GPU-seconds count the shared GPU in full.
    let j7 = view.jobs["7"];
    let j8 = view.jobs["8"];
    assert!((j7.idle_seconds - 20.0).abs() < 1e-9, "{j7:?}");
    assert!((j7.idle_dollars - 15.0).abs() < 1e-9, "{j7:?}");
    assert!((j8.idle_seconds - 10.0).abs() < 1e-9, "{j8:?}");
    assert!((j8.idle_dollars - 5.0).abs() < 1e-9, "{j8:?}");
    assert!((view.users["alice"].idle_dollars - 15.0).abs() < 1e-9);
    // The node's idle money counts each idle GPU once: 3 of 4 GPUs idle.
    assert!(
        (view.idle_dollars - 30.0).abs() < 1e-9,
        "{}",
        view.idle_dollars
    );
    // Job 8 ends: its tally goes at the next step.
    let mut o = node(111.0, false);
    for g in &mut o.gpus {
        g.jobs.retain(|j| j != "8");
    }
    let d = step(
        &settings,
        &mut state,
        &o,
        &Inputs {
            now: 111.0,
            price,
            ..Inputs::default()
        },
    );
    assert_eq!(d.view.jobs.keys().collect::<Vec<_>>(), ["7"]);
    assert!(!state.engine.rules.contains_key("idle job 8"));
}

#[test]
fn while_holders_are_unknown_a_job_is_not_judged_and_keeps_its_state() {
    let settings = scoped(Scope::Job);
    let mut state = State::default();
    let price = Some(Price {
        usd_per_hour: 3600.0 * 4.0,
        source: Source::Config,
    });
    let run = |state: &mut State, t: u32, unknown: bool| {
        let mut o = node(f64::from(t), false);
        if unknown {
            // As the edge shows it: no holders read, and it says so.
            for g in &mut o.gpus {
                g.jobs.clear();
                g.users.clear();
            }
            o.holders_unknown = true;
        }
        let d = step(
            &settings,
            state,
            &o,
            &Inputs {
                now: f64::from(t),
                price,
                ..Inputs::default()
            },
        );
        let kinds: Vec<&str> = d
            .order
            .on_saved(state, true)
            .events()
            .iter()
            .map(|e| e.kind())
            .collect();
        (d.view, kinds)
    };
    for t in 0..12 {
        run(&mut state, t, false);
    }
    assert!(state.engine.rules["idle job 7"].pending.is_some());
    let before = state.jobs["7"];
    // Unknown for a while: job 7's warning and tally stay, nothing acts, nothing is accrued.
    for t in 12..30 {
        let (view, kinds) = run(&mut state, t, true);
        assert!(kinds.is_empty(), "{kinds:?}");
        assert_eq!(view.jobs["7"], before);
    }
    assert!(state.engine.rules["idle job 7"].pending.is_some());
    // Known again: the job is judged where it left off.
    let (view, _) = run(&mut state, 30, false);
    assert!(view.jobs.contains_key("7"));
}

/// A pod's verdict stands while every device it holds meets the rule now; a busy or unknown
/// device, an incomplete sample, or the pod gone withdraws it.
#[test]
fn a_verdict_stands_only_while_every_device_of_the_pod_is_idle() {
    let mut rule = settings(Vec::new()).rules.remove(0);
    rule.scope = Scope::Pod;
    rule.action = Action::Reclaim;
    let pod = "ml/train-0";
    let obs = |utils: &[Option<f64>], complete: bool| Observation {
        t: 100.0,
        complete,
        gpus: utils
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let mut g = GpuReading {
                    index: i as u32,
                    holders: vec![pod.to_string()],
                    ..GpuReading::default()
                };
                g.set(Metric::GpuUtilization, *u);
                g
            })
            .collect(),
        ..Observation::default()
    };
    let cases: &[(&[Option<f64>], bool, bool)] = &[
        (&[Some(0.0), Some(0.01)], true, true),
        (&[Some(0.0), Some(0.9)], true, false),
        (&[Some(0.0), None], true, false),
        (&[Some(0.0)], false, false),
        (&[], true, false),
    ];
    for (utils, complete, stands) in cases {
        assert_eq!(
            verdict_stands(&rule, &obs(utils, *complete), pod),
            *stands,
            "{utils:?} complete={complete}"
        );
    }
    // Another pod's devices say nothing of this one.
    assert!(!verdict_stands(&rule, &obs(&[Some(0.0)], true), "ml/other"));
}
