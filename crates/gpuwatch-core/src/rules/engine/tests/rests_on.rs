//! What a warning rests on besides the GPUs (its budget, the instance's lifecycle), judged at
//! every sample of it, and what it says it waits on.

use super::*;

/// A warning rests on its budget on every sample, not only at its due time: a fleet figure
/// that goes unknown (or under the gate) during the warning calls the action off, though it
/// is back over the gate by the due time.
#[test]
fn a_warning_is_called_off_when_its_budget_closes_or_turns_unknown() {
    let gated = {
        let mut r = rule(10, 1, 1);
        r.budget = Some(crate::rules::BudgetGate {
            name: "team".into(),
            spent_at_least: 0.8,
        });
        r
    };
    let exhausted = {
        let mut r = rule(10, 1, 1);
        r.trigger = Trigger::BudgetExhausted {
            budget: "team".into(),
        };
        r
    };
    let ctx = |ratio: Option<f64>| Context {
        budgets: ratio.map(|r| ("team".to_string(), r)).into_iter().collect(),
        ..Context::default()
    };
    for (r, over) in [(&gated, 0.9), (&exhausted, 1.1)] {
        for (dip, why) in [
            (
                None,
                "the spend of budget \"team\" is unknown (unknown holds)",
            ),
            (Some(0.5), "budget \"team\" is 50% spent, under the"),
        ] {
            let mut state = State::default();
            let events = run(r, &mut state, &ctx(Some(over)), 0, 20, |_| vec![Some(0.0)]);
            let warned = events.iter().find(|(_, k)| *k == "warning").unwrap().0;
            // One sample of unknown (or under) spend in the middle of the warning.
            let events = step_on(r, &mut state, &ctx(dip), &obs(20.0, &[Some(0.0)]));
            let cancelled = events
                .iter()
                .find_map(|e| match e {
                    Event::Cancelled { reason, .. } => Some(reason.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{:?} {dip:?}: not cancelled: {events:?}", r.trigger));
            assert!(cancelled.starts_with(why), "{cancelled}");
            assert!(state.rules["idle"].pending.is_none());
            // Back over by the due time: no action on the warning that was called off.
            let events = run(r, &mut state, &ctx(Some(over)), 21, warned + 45, |_| {
                vec![Some(0.0)]
            });
            assert!(!events.iter().any(|(_, k)| *k == "action"), "{events:?}");
        }
    }
}

/// A rule for spot instances warned while the lifecycle was spot; the lifecycle turns unknown
/// (or another) during the warning: the warning is called off, not kept to fall due later.
#[test]
fn a_warning_is_called_off_when_the_lifecycle_it_was_given_for_goes() {
    let mut r = rule(10, 1, 1);
    r.lifecycle = Some(Lifecycle::Spot);
    let spot = Context {
        lifecycle: Some(Lifecycle::Spot),
        ..Context::default()
    };
    let mut state = State::default();
    let events = run(&r, &mut state, &spot, 0, 20, |_| vec![Some(0.0)]);
    assert!(events.iter().any(|(_, k)| *k == "warning"), "{events:?}");
    let events = step_on(
        &r,
        &mut state,
        &Context::default(),
        &obs(20.0, &[Some(0.0)]),
    );
    assert!(
        matches!(&events[..], [Event::Cancelled { reason, .. }] if reason.contains("lifecycle")),
        "{events:?}"
    );
    let events = run(&r, &mut state, &spot, 21, 45, |_| vec![Some(0.0)]);
    assert!(!events.iter().any(|(_, k)| *k == "action"), "{events:?}");
}

/// Each rule's warning says its own cause, and what calls it off, as the engine judges it.
#[test]
fn a_warning_says_its_own_cause() {
    let idle = rule(10, 1, 1);
    assert_eq!(idle.cause(), "GPUs idle");
    assert_eq!(idle.calls_off(), "the GPUs are used again");
    let mut gated = idle.clone();
    gated.budget = Some(crate::rules::BudgetGate {
        name: "team".into(),
        spent_at_least: 0.8,
    });
    assert_eq!(
        gated.calls_off(),
        "the GPUs are used again, or budget \"team\" falls under 80% spent or cannot be known"
    );
    let mut spent = idle.clone();
    spent.trigger = Trigger::BudgetExhausted {
        budget: "team".into(),
    };
    assert_eq!(spent.cause(), "budget \"team\" is spent");
    assert_eq!(
        spent.calls_off(),
        "its spend falls under the limit or cannot be known"
    );
    let mut sick = idle.clone();
    if let Trigger::Idle(c) = &mut sick.trigger {
        c.metric = Metric::GpuUnhealthy;
    }
    assert_eq!(sick.cause(), "GPUs unhealthy");
    assert_eq!(sick.calls_off(), "the GPUs are healthy again");
    let mut job = idle.clone();
    job.scope = Scope::Job;
    job.subject = Some("42".into());
    assert_eq!(job.cause(), "the GPUs of job 42 are idle");
    assert_eq!(job.calls_off(), "they are used again");
}
