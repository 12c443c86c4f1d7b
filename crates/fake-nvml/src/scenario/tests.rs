//! Tests of the scenario format: series values and integrals, parsing of full scenarios, GPM and
//! MIG tables and traces, and the errors bad files get.

use super::*;

#[test]
fn raw_bytes_escapes() {
    assert_eq!(&*raw_bytes("H100"), b"H100");
    assert_eq!(&*raw_bytes("a\\xffb\\xFE"), b"a\xffb\xfe");
    assert_eq!(&*raw_bytes("\\xg0"), b"\\xg0");
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn gpm_metrics_are_means_over_the_interval() {
    let s = Scenario::parse(
        "[[gpu]]\n[gpu.gpm]\nsm_active = { kind = \"ramp\", from = 0, to = 100, over = \"100s\" }\n\
         pcie_tx_mib_per_second = 10\n[[gpu]]\n",
        Path::new("."),
    )
    .unwrap();
    let gpm = s.gpus[0].gpm.as_ref().unwrap();
    // A ramp's mean over [10, 30] is its value at 20.
    assert!((gpm.mean(GpmMetric::SmActive, 10.0, 30.0).unwrap() - 20.0).abs() < 1e-9);
    assert_eq!(gpm.mean(GpmMetric::PcieTx, 0.0, 5.0), Some(10.0));
    // Unnamed metrics are not supported; a GPU without the table has no GPM.
    assert_eq!(gpm.mean(GpmMetric::TensorActive, 0.0, 5.0), None);
    assert!(s.gpus[1].gpm.is_none());
}

#[test]
fn mig_devices_by_uuid_and_in_full() {
    let s = Scenario::parse(
        "[[gpu]]\nmig_devices = [\"MIG-a\"]\n[[gpu.mig]]\nprofile = \"3g.40gb\"\nfrom = \"10s\"\n",
        Path::new("."),
    )
    .unwrap();
    let mig = &s.gpus[0].mig;
    assert_eq!(mig.len(), 2);
    assert_eq!(
        (mig[0].uuid.as_str(), mig[0].profile.as_str()),
        ("MIG-a", "1g.10gb")
    );
    assert_eq!(mig[0].memory_total_bytes, 10 << 30);
    assert_eq!(
        (mig[1].gpu_instance, mig[1].memory_total_bytes),
        (2, 40 << 30)
    );
    assert!(!mig[1].exists(5.0) && mig[1].exists(10.0));
    let err =
        Scenario::parse("[[gpu]]\n[[gpu.mig]]\nprofile = \"big\"\n", Path::new(".")).unwrap_err();
    assert!(
        err.contains("gpu[0].mig[0].profile: \"big\" is not a MIG profile"),
        "{err}"
    );
}

#[test]
fn series_values_over_time() {
    let cases: &[(Series, f64, f64)] = &[
        (Series::Constant(7.0), 123.0, 7.0),
        (
            Series::Ramp {
                from: 80.0,
                to: 0.0,
                start: 10.0,
                over: 40.0,
            },
            30.0,
            40.0,
        ),
        (
            Series::Ramp {
                from: 80.0,
                to: 0.0,
                start: 10.0,
                over: 40.0,
            },
            5.0,
            80.0,
        ),
        (
            Series::Ramp {
                from: 80.0,
                to: 0.0,
                start: 10.0,
                over: 40.0,
            },
            500.0,
            0.0,
        ),
        (
            Series::Bursts {
                busy: 95.0,
                idle: 2.0,
                period: 60.0,
                duty: 0.5,
            },
            29.0,
            95.0,
        ),
        (
            Series::Bursts {
                busy: 95.0,
                idle: 2.0,
                period: 60.0,
                duty: 0.5,
            },
            61.0 + 30.0,
            2.0,
        ),
        (Series::Trace(vec![(0.0, 10.0), (10.0, 20.0)]), 5.0, 15.0),
        (Series::Trace(vec![(0.0, 10.0), (10.0, 20.0)]), 50.0, 20.0),
    ];
    for (s, t, want) in cases {
        assert!(
            close(s.at(*t), *want),
            "{s:?} at {t}: {} != {want}",
            s.at(*t)
        );
    }
}

#[test]
fn integrals_match_numeric_integration() {
    let series = [
        Series::Constant(300.0),
        Series::Ramp {
            from: 100.0,
            to: 500.0,
            start: 7.0,
            over: 33.0,
        },
        Series::Bursts {
            busy: 650.0,
            idle: 90.0,
            period: 17.0,
            duty: 0.3,
        },
        Series::Trace(vec![(2.0, 10.0), (5.0, 40.0), (9.0, 0.0)]),
    ];
    for s in &series {
        for t in [0.5, 3.0, 8.0, 41.0, 100.0] {
            let steps = 200_000;
            let dt = t / steps as f64;
            let numeric: f64 = (0..steps).map(|i| s.at((i as f64 + 0.5) * dt) * dt).sum();
            let exact = s.integral(t);
            assert!(
                (numeric - exact).abs() < 1e-2 * (1.0 + exact.abs()) * 0.01,
                "{s:?} to {t}: numeric {numeric} exact {exact}"
            );
        }
    }
}

#[test]
fn parses_full_scenario_and_faults() {
    let text = r#"
        driver_version = "550.90.07"
        time = { speed = 60, start = "1h" }
        [[gpu]]
        utilization = { kind = "bursts", busy = 95, idle = 3, period = "10m", duty = 0.75 }
        power_watts = 350
        throttle_active = ["sw_power_cap"]
        [[gpu]]
        name = "NVIDIA A10G"
        temperature = { kind = "ramp", from = 40, to = 70, over = "30m" }
        [[fault]]
        at = "1h30m"
        gpu = 1
        kind = "lost"
        until = "2h"
        [[fault]]
        at = "10s"
        kind = "not_supported"
        fields = ["power", "ecc"]
    "#;
    let s = Scenario::parse(text, Path::new(".")).unwrap();
    assert_eq!(s.gpus.len(), 2);
    assert_eq!(s.nvml_version, "12.550.90.07");
    assert_eq!(s.sim_time(60.0), 3600.0 + 3600.0);
    assert_eq!(s.gpus[0].throttle_active, 0x4);
    assert!(s.is_lost(1, 5400.0));
    assert!(!s.is_lost(1, 7200.0));
    assert!(!s.is_lost(0, 5400.0));
    assert_eq!(
        s.read(0, Field::Power, 11.0, |g| g.power_milliwatts(11.0)),
        Answer::NotSupported
    );
    assert_eq!(s.read(0, Field::Temperature, 11.0, |_| 1), Answer::Value(1));
    assert_eq!(
        s.read(0, Field::Power, 9.0, |g| g.power_milliwatts(9.0)),
        Answer::Value(350_000)
    );
    assert_eq!(s.read(5, Field::Power, 9.0, |_| 0), Answer::InvalidArgument);
}

#[test]
fn rejects_bad_scenarios_naming_the_key() {
    let cases = [
        ("[[gpu]]\nutilization = { kind = \"bursts\", busy = 1, idle = 0, period = \"1m\", duty = 2 }", "gpu[0].utilization.duty: \"2\" is not between 0 and 1"),
        ("[[fault]]\nat = \"1s\"\nkind = \"explode\"", "fault[0].kind: \"explode\" is not one of lost, not_supported, fails, delay, xid, init_failure"),
        ("[[gpu]]\n[[fault]]\nat = \"soon\"\nkind = \"lost\"", "fault[0].at: \"soon\" is not a duration"),
        ("[[gpu]]\nthrottle_active = [\"hot\"]", "gpu[0].throttle_active: \"hot\" is not a throttle reason"),
    ];
    for (text, want) in cases {
        let err = Scenario::parse(text, Path::new(".")).unwrap_err();
        assert!(
            err.starts_with(want),
            "{err:?} does not start with {want:?}"
        );
    }
}

#[test]
fn trace_csv_with_header() {
    let points = parse_trace("seconds,utilization\n0,10\n60,90\n").unwrap();
    assert_eq!(points, vec![(0.0, 10.0), (60.0, 90.0)]);
    assert!(parse_trace("0,1\n0,2\n")
        .unwrap_err()
        .contains("does not increase"));
}
