//! Each problem: the state it puts a GPU in, its label and words, and how it clears (or, for an
//! XID, holds until a reset).

use super::*;

const H: f64 = 3600.0;

fn ok(index: u32) -> Readings {
    Readings {
        index,
        uuid: format!("GPU-{index}"),
        up: true,
        ecc_corrected: Some(0),
        ecc_uncorrected: Some(0),
        remap_failed: Some(false),
        remap_pending: Some(false),
        retired_pending: None,
        pcie_generation: Some(5),
        pcie_max_generation: Some(5),
        pcie_width: Some(16),
        pcie_max_width: Some(16),
        utilization: Some(0.0),
        thermal_seconds: Some(0.0),
        power_seconds: Some(0.0),
        ..Readings::default()
    }
}

fn one(memory: &mut Memory, r: &Readings, now: f64) -> GpuHealth {
    assess(
        &Settings::default(),
        memory,
        true,
        std::slice::from_ref(r),
        now,
    )
    .remove(0)
}

fn labels(g: &GpuHealth) -> Vec<String> {
    g.problems.iter().map(|f| f.label.clone()).collect()
}

#[test]
fn a_gpu_with_nothing_wrong_is_healthy() {
    let g = one(&mut Memory::default(), &ok(0), 0.0);
    assert_eq!(g.state, State::Healthy);
    assert!(g.problems.is_empty());
}

/// Each condition: its state and label while it holds, and healthy once it clears.
#[test]
fn each_condition_sets_its_state_and_clears_when_it_does() {
    type Set = fn(&mut Readings);
    let cases: [(&str, Set, State, &str); 6] = [
        (
            "row_remap_failed",
            |r| r.remap_failed = Some(true),
            State::Unhealthy,
            "no spare rows",
        ),
        (
            "row_remap_pending",
            |r| r.remap_pending = Some(true),
            State::Degraded,
            "waits for a GPU reset",
        ),
        (
            "retired_pages_pending",
            |r| r.retired_pending = Some(true),
            State::Degraded,
            "to retire",
        ),
        (
            "uncorrectable_ecc",
            |r| r.ecc_uncorrected = Some(2),
            State::Unhealthy,
            "uncorrectable ECC",
        ),
        (
            "pcie_link_degraded",
            |r| r.pcie_width = Some(4),
            State::Degraded,
            "PCIe link",
        ),
        (
            "lost",
            |r| r.up = false,
            State::Unhealthy,
            "fell off the bus",
        ),
    ];
    for (label, set, state, words) in cases {
        let mut memory = Memory::default();
        let mut r = ok(0);
        set(&mut r);
        let g = one(&mut memory, &r, 0.0);
        assert_eq!(g.state, state, "{label}");
        assert_eq!(labels(&g), [label]);
        assert!(
            g.problems[0].words.contains(words),
            "{label}: {}",
            g.problems[0].words
        );
        // Read again and clear (a reading that fails would keep it).
        let clear = Readings {
            retired_pending: Some(false),
            ..ok(0)
        };
        let cleared = one(&mut memory, &clear, 10.0);
        assert_eq!(cleared.state, State::Healthy, "{label} clears");
    }
}

#[test]
fn a_slower_pcie_generation_counts_only_while_the_gpu_is_busy() {
    let mut r = ok(0);
    r.pcie_generation = Some(1);
    let idle = one(&mut Memory::default(), &r, 0.0);
    assert_eq!(
        idle.state,
        State::Healthy,
        "an idle link slows down to save power"
    );
    r.utilization = Some(0.9);
    let busy = one(&mut Memory::default(), &r, 0.0);
    assert_eq!(labels(&busy), ["pcie_link_degraded"]);
    r.utilization = None;
    assert_eq!(one(&mut Memory::default(), &r, 0.0).state, State::Healthy);
    // A narrow link is degraded whatever else is unknown.
    r.pcie_width = Some(8);
    r.pcie_generation = None;
    assert_eq!(
        labels(&one(&mut Memory::default(), &r, 0.0)),
        ["pcie_link_degraded"]
    );
}

#[test]
fn throttling_beyond_its_share_of_the_interval_degrades_and_clears() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    assert_eq!(one(&mut memory, &r, 0.0).state, State::Healthy);
    // 6 of the next 10 seconds held down by heat, 2 by power: above and below half.
    r.thermal_seconds = Some(6.0);
    r.power_seconds = Some(2.0);
    let g = one(&mut memory, &r, 10.0);
    assert_eq!(labels(&g), ["thermal_throttling"]);
    assert_eq!(g.state, State::Degraded);
    r.power_seconds = Some(9.0);
    assert_eq!(labels(&one(&mut memory, &r, 20.0)), ["power_throttling"]);
    assert_eq!(one(&mut memory, &r, 30.0).state, State::Healthy);
    // A counter that went back (the driver reloaded) says nothing.
    r.thermal_seconds = Some(0.0);
    assert_eq!(one(&mut memory, &r, 40.0).state, State::Healthy);
}

/// An XID the catalog says needs a reset holds the GPU unhealthy after the error itself is
/// long gone, until the volatile ECC counters show a reset.
#[test]
fn an_xid_holds_until_the_gpu_is_reset() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    r.ecc_corrected = Some(7);
    r.xids.insert(48, 1);
    let g = one(&mut memory, &r, 100.0);
    assert_eq!(g.state, State::Unhealthy);
    assert_eq!(labels(&g), ["xid_48"]);
    assert_eq!(g.problems[0].action, Action::ResetGpu);
    assert_eq!(g.problems[0].since, Some(100.0));
    assert!(
        g.problems[0].words.starts_with("XID 48: "),
        "{}",
        g.problems[0].words
    );
    // No new XID, and still held.
    assert_eq!(one(&mut memory, &r, 2.0 * H).state, State::Unhealthy);
    // The reset: the volatile counters back at zero.
    r.ecc_corrected = Some(0);
    assert_eq!(one(&mut memory, &r, 3.0 * H).state, State::Healthy);
    assert!(memory.holds.is_empty());
}

#[test]
fn an_xid_with_no_reset_seen_holds_for_the_configured_time() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    r.xids.insert(79, 1);
    assert_eq!(one(&mut memory, &r, 0.0).state, State::Unhealthy);
    assert_eq!(one(&mut memory, &r, 24.0 * H - 1.0).state, State::Unhealthy);
    assert_eq!(one(&mut memory, &r, 24.0 * H).state, State::Healthy);
    // The same XID again starts a new hold.
    r.xids.insert(79, 2);
    assert_eq!(one(&mut memory, &r, 25.0 * H).state, State::Unhealthy);
}

#[test]
fn the_hold_survives_a_restart() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    r.xids.insert(95, 1);
    one(&mut memory, &r, 0.0);
    let saved = serde_json::to_string(&memory).unwrap();
    let mut restored: Memory = serde_json::from_str(&saved).unwrap();
    // After the restart the daemon's XID counts start again from nothing.
    let g = one(&mut restored, &ok(0), 60.0);
    assert_eq!(labels(&g), ["xid_95"]);
    assert_eq!(g.problems[0].since, Some(0.0));
}

/// NVML down says nothing of a reset: what is held stays held, and health is unknown (never
/// healthy) meanwhile. A driver reload shows as the energy counter (kept since the driver
/// loaded) going back.
#[test]
fn nvml_down_keeps_the_holds_and_a_driver_reload_clears_them() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    r.energy_joules = Some(5_000.0);
    r.xids.insert(79, 1);
    one(&mut memory, &r, 0.0);
    let s = Settings::default();
    assert!(
        assess(&s, &mut memory, false, &[], 10.0).is_empty(),
        "unknown, never healthy"
    );
    r.energy_joules = Some(6_000.0);
    assert_eq!(one(&mut memory, &r, 20.0).state, State::Unhealthy);
    r.energy_joules = Some(40.0);
    assert_eq!(one(&mut memory, &r, 30.0).state, State::Healthy);
}

/// A boot resets every GPU: the decision loop forgets what was held since before it.
#[test]
fn a_reboot_forgets_the_holds_from_before_it() {
    let mut memory = Memory::default();
    let s = Settings::default();
    let mut r = ok(0);
    r.xids.insert(79, 1);
    let mut other = ok(1);
    assess(&s, &mut memory, true, &[r.clone(), other.clone()], 100.0);
    other.xids.insert(48, 1);
    assess(&s, &mut memory, true, &[r, other], 300.0);
    assert_eq!(memory.holds.len(), 2);
    memory.forget_before(200.0);
    assert_eq!(memory.holds.len(), 1);
    assert!(memory.holds.contains_key("GPU-1"));
}

/// Another GPU at an index (the devices enumerated anew) does not inherit the XIDs counted at
/// that index, and a GPU whose UUID was never read has nothing held against it.
#[test]
fn a_new_gpu_at_an_index_starts_clean_and_an_unnamed_one_holds_nothing() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    r.xids.insert(79, 1);
    assert_eq!(one(&mut memory, &r, 0.0).state, State::Unhealthy);
    let mut swapped = ok(0);
    swapped.uuid = "GPU-new".into();
    swapped.xids.insert(79, 1);
    assert_eq!(one(&mut memory, &swapped, 10.0).state, State::Healthy);
    // Its own XID, later, is held.
    swapped.xids.insert(79, 2);
    assert_eq!(one(&mut memory, &swapped, 20.0).state, State::Unhealthy);
    let mut unnamed = ok(2);
    unnamed.uuid = String::new();
    unnamed.xids.insert(48, 1);
    let g = one(&mut Memory::default(), &unnamed, 0.0);
    assert_eq!(g.state, State::Healthy);
}

#[test]
fn what_the_application_did_and_xids_the_catalog_lacks_are_no_problem() {
    let mut r = ok(0);
    for code in [13, 31, 43, 45, 63, 94, 99_999] {
        r.xids.insert(code, 3);
    }
    let g = one(&mut Memory::default(), &r, 0.0);
    assert_eq!(g.state, State::Healthy, "{:?}", labels(&g));
}

/// A reading that fails keeps the problem it showed (a failed read clears nothing), and one
/// that was never read, or is not supported, is never a problem on its own.
#[test]
fn a_failed_reading_neither_clears_nor_makes_a_problem() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    r.remap_failed = Some(true);
    one(&mut memory, &r, 0.0);
    r.remap_failed = None;
    assert_eq!(labels(&one(&mut memory, &r, 10.0)), ["row_remap_failed"]);
    r.remap_failed = Some(false);
    assert_eq!(one(&mut memory, &r, 20.0).state, State::Healthy);
    let unknown = Readings {
        up: true,
        uuid: "GPU-x".into(),
        ..Readings::default()
    };
    assert_eq!(
        one(&mut Memory::default(), &unknown, 0.0).state,
        State::Healthy
    );
}

#[test]
fn problems_are_worst_first_and_the_node_is_its_worst_gpu() {
    let mut a = ok(0);
    a.pcie_width = Some(8);
    a.remap_failed = Some(true);
    a.xids.insert(48, 1);
    let b = ok(1);
    let gpus = assess(
        &Settings::default(),
        &mut Memory::default(),
        true,
        &[a, b],
        0.0,
    );
    assert_eq!(
        labels(&gpus[0]),
        ["xid_48", "row_remap_failed", "pcie_link_degraded"]
    );
    assert_eq!(node(&gpus), Some(State::Unhealthy));
    assert_eq!(node(&gpus[1..]), Some(State::Healthy));
    assert_eq!(node(&gpus[..0]), None);
}

#[test]
fn holds_are_bounded() {
    let mut memory = Memory::default();
    let mut r = ok(0);
    for code in catalog::catalog()
        .iter()
        .filter(|x| x.makes_unhealthy())
        .map(|x| x.code)
    {
        r.xids.insert(code, 1);
    }
    let g = one(&mut memory, &r, 0.0);
    assert_eq!(g.problems.len(), MAX_HOLDS);
    let gpus: Vec<Readings> = (0..100)
        .map(|i| {
            let mut r = ok(i);
            r.xids.insert(79, 1);
            r
        })
        .collect();
    let mut memory = Memory::default();
    assess(&Settings::default(), &mut memory, true, &gpus, 1.0);
    assert_eq!(memory.holds.len(), MAX_GPUS);
}
