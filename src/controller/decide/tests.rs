//! Each safety rule of the controller's decision, one by one.

use super::*;

const WARNING: Duration = Duration::from_secs(600);
const NOW: f64 = 1_000_000.0;

fn idle() -> Workload {
    Workload {
        kind: Kind::Deployment,
        namespace: "ml".into(),
        name: "train".into(),
        generation: 3,
        replicas: 2,
        given_back: false,
        opted_out: false,
        hold: Hold::None,
        namespace_hold: Hold::None,
        excluded: false,
        pods: vec![
            Pod::idle("train-a", "idle", 10.0),
            Pod::idle("train-b", "idle", 20.0),
        ],
        seen: 2,
        status_pods: 2,
    }
}

fn warned(at: f64) -> Warned {
    Warned::of(&idle(), at, at + WARNING.as_secs_f64())
}

fn kept(d: Decision, says: &str) {
    match d {
        Decision::Keep(why) => assert!(why.contains(says), "{why:?} does not say {says:?}"),
        other => panic!("{other:?}: expected it kept ({says})"),
    }
}

#[test]
fn an_idle_workload_is_warned_then_acted_on_once_due() {
    assert_eq!(
        decide(&idle(), None, NOW, WARNING),
        Decision::Warn { due: NOW + 600.0 }
    );
    assert_eq!(
        decide(&idle(), Some(&warned(NOW)), NOW + 599.0, WARNING),
        Decision::Wait
    );
    assert_eq!(
        decide(&idle(), Some(&warned(NOW)), NOW + 600.0, WARNING),
        Decision::Act
    );
}

#[test]
fn one_busy_replica_or_one_without_a_verdict_keeps_the_whole_workload() {
    let mut w = idle();
    w.pods[1].idle = None;
    kept(
        decide(&w, Some(&warned(NOW)), NOW + 700.0, WARNING),
        "train-b",
    );
    let mut w = idle();
    w.pods[0].terminating = true;
    kept(
        decide(&w, Some(&warned(NOW)), NOW + 700.0, WARNING),
        "being deleted",
    );
    let mut w = idle();
    w.pods.clear();
    kept(decide(&w, None, NOW, WARNING), "no pod");
}

/// A replica the cache has not seen yet, or one more than the workload's status says, keeps
/// it: every pod must be known to be idle.
#[test]
fn pods_seen_status_and_spec_must_agree() {
    type Change = fn(&mut Workload);
    let cases: Vec<Change> = vec![|w| w.seen = 1, |w| w.seen = 3, |w| w.status_pods = 3];
    for change in cases {
        let mut w = idle();
        change(&mut w);
        kept(
            decide(&w, Some(&warned(NOW)), NOW + 700.0, WARNING),
            "it should have 2 pods",
        );
    }
}

/// A verdict given after the warning is another idle spell: the pod was busy in between,
/// unseen (Prometheus or the API down), and it is warned of again.
#[test]
fn a_new_idle_spell_is_warned_again() {
    let mut w = idle();
    w.pods[0].idle = Some(("idle".into(), 500.0));
    assert_eq!(
        decide(&w, Some(&warned(NOW)), NOW + 700.0, WARNING),
        Decision::Warn { due: NOW + 1300.0 }
    );
}

#[test]
fn a_workload_changed_since_its_warning_is_warned_again() {
    for change in [
        |w: &mut Workload| w.generation += 1,
        // Scaled to 3, and its third pod seen idle too.
        |w: &mut Workload| {
            w.replicas = 3;
            w.status_pods = 3;
            w.seen = 3;
            w.pods.push(Pod::idle("train-c", "idle", 30.0));
        },
    ] {
        let mut w = idle();
        change(&mut w);
        assert_eq!(
            decide(&w, Some(&warned(NOW)), NOW + 700.0, WARNING),
            Decision::Warn { due: NOW + 1300.0 }
        );
    }
}

#[test]
fn holds_opt_outs_and_exclusions_keep_it() {
    type Change = fn(&mut Workload);
    let cases: Vec<(Change, &str)> = vec![
        (|w| w.excluded = true, "excluded"),
        (|w| w.opted_out = true, "opted out"),
        (|w| w.hold = Hold::Forever, "for ever"),
        (|w| w.hold = Hold::Until(NOW + 3600.0), "held until"),
        (
            |w| w.hold = Hold::parse(Some("next tuesday")),
            "unreadable hold holds",
        ),
        (
            |w| w.namespace_hold = Hold::Forever,
            "its namespace is held",
        ),
        (|w| w.given_back = true, "already given back"),
    ];
    for (change, says) in cases {
        let mut w = idle();
        change(&mut w);
        kept(decide(&w, Some(&warned(NOW)), NOW + 700.0, WARNING), says);
    }
    // A hold that has run out holds no more.
    let mut w = idle();
    w.hold = Hold::Until(NOW - 1.0);
    assert_eq!(
        decide(&w, Some(&warned(NOW - 700.0)), NOW, WARNING),
        Decision::Act
    );
}

#[test]
fn holds_are_read_as_rfc3339_or_forever() {
    assert_eq!(Hold::parse(None), Hold::None);
    assert_eq!(Hold::parse(Some("forever")), Hold::Forever);
    assert_eq!(
        Hold::parse(Some("2026-12-24T00:00:00Z")),
        Hold::Until(gpuwatch_core::time::parse_rfc3339("2026-12-24T00:00:00Z").unwrap())
    );
    assert!(matches!(Hold::parse(Some("")), Hold::Unreadable(_)));
}
