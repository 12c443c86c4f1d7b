//! Readings the window must not count as idle, and what happens to a breach or a warning that
//! the world changed under: work done while it was held back, a rule whose action changed.

use super::*;

#[test]
fn a_period_that_starts_without_a_reading_saves_and_reads_back() {
    // The first sample of a period has no reading for GPU 1 (a GPU lost, GPM's first cycle):
    // the period is unknown, and the state that holds it must still read back after a restart.
    let r = rule(10, 2, 2);
    let mut state = State::default();
    ingest(
        std::slice::from_ref(&r),
        &mut state,
        &obs(0.0, &[Some(0.0), None]),
        settings().slack,
    );
    let text = serde_json::to_string(&state).unwrap();
    let back: State = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(back, state);
    // A state file written before the fix, with `null` for such a maximum, reads too.
    assert!(text.contains("\"max\":null"), "{text}");
}

#[test]
fn a_reading_that_is_not_finite_or_is_negative_is_no_reading() {
    // NaN is never below a threshold and never above one; minus infinity and negative values
    // are below every threshold. None of them may count as idle.
    for bad in [f64::NAN, f64::NEG_INFINITY, f64::INFINITY, -0.5] {
        let r = rule(10, 1, 1);
        let mut state = State::default();
        let ctx = Context::default();
        let events = run(&r, &mut state, &ctx, 0, 80, |_| vec![Some(bad), Some(0.0)]);
        assert_eq!(events, [], "{bad}");
        let mut w = Window::default();
        let c = condition(10, 1, 1);
        for t in 0..20 {
            w.ingest(&c, &obs(f64::from(t), &[Some(bad)]));
        }
        let a = w.assess(&c, 20.0, 2.5, 0.0);
        assert!(
            matches!(
                &a.periods[0].state,
                crate::rules::window::DatapointState::Unknown(why) if why.contains("no reading")
            ),
            "{bad}: {:?}",
            a.periods[0].state
        );
    }
}

#[test]
fn work_done_while_a_breach_is_held_back_re_arms_the_rule() {
    // Idle until 100, so the period [0, 100) breaches at 100, but a hold runs to 160. A job
    // runs from 100 to 149. When the hold ends the rule must not warn on the period before
    // the job: it waits for a whole idle period after it.
    let r = rule(100, 1, 1);
    let held = Context {
        hold_until: Some(160.0),
        ..Context::default()
    };
    let mut state = State::default();
    let util = |t: u64| vec![Some(if (100..150).contains(&t) { 0.9 } else { 0.0 })];
    let events = run(&r, &mut state, &held, 0, 300, util);
    assert_eq!(events, [(100, "breach"), (200, "recovered")]);
    let events = run(&r, &mut state, &held, 300, 301, util);
    assert_eq!(events, [(300, "breach"), (300, "warning")]);

    // Without the job, the warning comes as the hold ends.
    let mut state = State::default();
    let events = run(&r, &mut state, &held, 0, 161, |_| vec![Some(0.0)]);
    assert_eq!(events, [(100, "breach"), (160, "warning")]);
}

#[test]
fn a_warning_for_another_action_is_called_off() {
    // Warned of a terminate; the rule now says alert (the config changed across a restart
    // within the slack). The terminate must not run.
    let mut r = rule(10, 1, 1);
    r.action = Action::Terminate;
    let mut state = State::default();
    let ctx = Context::default();
    let events = run(&r, &mut state, &ctx, 0, 15, |_| vec![Some(0.0)]);
    assert_eq!(events, [(10, "breach"), (10, "warning")]);
    r.action = Action::Alert;
    let events = step_on(&r, &mut state, &ctx, &obs(15.0, &[Some(0.0)]));
    assert!(
        matches!(
            &events[..],
            [Event::Cancelled { action: Action::Terminate, reason, .. }]
                if reason == "the rule's action changed from terminate to alert"
        ),
        "{events:?}"
    );
    // It re-arms on fresh periods, and warns of what it now says.
    let events = run(&r, &mut state, &ctx, 16, 60, |_| vec![Some(0.0)]);
    assert_eq!(events, [(30, "warning")]);
}
