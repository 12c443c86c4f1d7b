//! The full exposition for a fixed snapshot, compared with a golden file a reviewer can read in
//! the diff, and checked by `promtool check metrics`. Regenerate with `UPDATE_GOLDEN=1`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use gpuwatch::config::{HostnameLabel, Names};
use gpuwatch::exposition::{BuildInfo, SnapshotCollector};
use gpuwatch::gpu::counters::{SampleError, SamplerCounters};
use gpuwatch::gpu::gpm::GpmReadings;
use gpuwatch::gpu::{
    ClockEvents, GpuSample, MemoryRepair, MigSample, NvLinkCounters, NvmlStatus, PcieLink,
    ProcessSample, Snapshot, ThrottleReason,
};
use gpuwatch::metrics::encode;
use prometheus_client::registry::Registry;

fn snapshot() -> Snapshot {
    let busy = GpuSample {
        index: 0,
        vendor: gpuwatch::gpu::Vendor::Nvidia,
        uuid: "GPU-11111111-2222-4333-8444-555555555555".into(),
        up: true,
        lost: false,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        pci_bus_id: Some("00000000:18:00.0".into()),
        utilization_ratio: Some(0.97),
        memory_utilization_ratio: Some(0.61),
        memory_used_bytes: Some(74_658_611_200),
        memory_free_bytes: Some(10_862_198_784),
        memory_total_bytes: Some(85_520_809_984),
        temperature_celsius: Some(71.0),
        power_watts: Some(655.123),
        power_limit_watts: Some(700.0),
        energy_joules: Some(123_456_789.012),
        sm_clock_hertz: Some(1.98e9),
        memory_clock_hertz: Some(2.619e9),
        throttle_reasons: vec![
            ThrottleReason {
                reason: "gpu_idle",
                active: false,
            },
            ThrottleReason {
                reason: "sw_power_cap",
                active: true,
            },
        ],
        ecc_corrected: Some(2),
        ecc_uncorrected: Some(0),
        encoder_utilization_ratio: Some(0.12),
        decoder_utilization_ratio: Some(0.0),
        pcie_replays: Some(3),
        // Trained down a generation.
        pcie_link: PcieLink {
            generation: Some(4),
            max_generation: Some(5),
            width: Some(16),
            max_width: Some(16),
        },
        memory_temperature_celsius: Some(63.0),
        memory_reserved_bytes: Some(598_736_896),
        // Two rows remapped for correctable errors; no page retirement on Hopper.
        memory_repair: MemoryRepair {
            remapped_correctable: Some(2),
            remapped_uncorrectable: Some(0),
            remap_pending: Some(false),
            remap_failed: Some(false),
            ..MemoryRepair::default()
        },
        clock_events: ClockEvents {
            power: Some(1234.5678),
            thermal: Some(0.0),
            sync_boost: Some(0.0),
            board_limit: Some(0.0),
            low_utilization: Some(98.25),
            reliability: Some(0.0),
        },
        nvlink: NvLinkCounters {
            crc_flit_errors: Some(0),
            crc_data_errors: Some(1),
            replay_errors: Some(4),
            recovery_errors: Some(0),
            tx_bytes: Some(1_099_511_627_776),
            rx_bytes: Some(549_755_813_888),
        },
        unsupported: vec!["retired_pages"],
        processes: Some(1),
        pids: Vec::new(),
        process_memory: Some(vec![ProcessSample {
            pid: 4242,
            name: Some("python3".into()),
            used_memory_bytes: Some(74_000_000_000),
        }]),
        xid_errors: BTreeMap::from([(48, 1)]),
        last_xid: Some(48),
        mig_uuids: Vec::new(),
        mig_unread: 0,
        gpm_supported: Some(true),
        gpm: Some(GpmReadings {
            sm_active: Some(0.88),
            sm_occupancy: Some(0.46),
            graphics_active: Some(0.96),
            tensor_active: Some(0.63),
            dram_active: Some(0.52),
            fp64_active: Some(0.0),
            fp32_active: Some(0.12),
            fp16_active: Some(0.31),
            integer_active: Some(0.05),
            pcie_tx_bytes_per_second: Some(188_743_680.0),
            pcie_rx_bytes_per_second: Some(2_516_582_400.0),
            nvlink_tx_bytes_per_second: Some(42_991_616_000.0),
            // One metric that failed: absent, the rest stay.
            nvlink_rx_bytes_per_second: None,
        }),
        mig: Vec::new(),
        health: None,
    };
    // In MIG mode: the GPU's physical readings, no utilization, and one MIG device of its own.
    let split = GpuSample {
        index: 3,
        uuid: "GPU-33333333-4444-4555-8666-777777777777".into(),
        up: true,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        pci_bus_id: Some("00000000:3A:00.0".into()),
        temperature_celsius: Some(48.0),
        power_watts: Some(210.5),
        memory_total_bytes: Some(85_520_809_984),
        gpm_supported: Some(true),
        mig_uuids: vec!["MIG-33333333-4444-4555-8666-000000000001".into()],
        mig: vec![MigSample {
            uuid: "MIG-33333333-4444-4555-8666-000000000001".into(),
            gpu_instance: Some(1),
            compute_instance: Some(0),
            profile: Some("3g.40gb".into()),
            memory_used_bytes: Some(8_589_934_592),
            memory_total_bytes: Some(42_949_672_960),
            processes: Some(1),
            pids: Vec::new(),
            gpm: Some(GpmReadings {
                sm_active: Some(0.31),
                ..GpmReadings::default()
            }),
        }],
        ..GpuSample::default()
    };
    // Everything unknown: not supported, failed or out of range; and no GPM.
    let sparse = GpuSample {
        index: 1,
        uuid: "GPU-66666666-7777-4888-8999-000000000000".into(),
        up: true,
        name: Some("NVIDIA A10G".into()),
        pci_bus_id: Some("00000000:1E:00.0".into()),
        gpm_supported: Some(false),
        ..GpuSample::default()
    };
    let lost = GpuSample {
        index: 2,
        uuid: "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee".into(),
        up: false,
        lost: true,
        xid_errors: BTreeMap::from([(79, 1)]),
        ..GpuSample::default()
    };
    let mut gpus = vec![busy, sparse, lost, split];
    // Health as the sampler judges it: the busy GPU's link a generation down, the lost one
    // lost (and its XID 79 held), the sparse one's unknown readings no problem. The MIG GPU's
    // is left unknown: it has no health series.
    let readings: Vec<_> = gpus[..3]
        .iter()
        .map(gpuwatch::gpu::health::readings)
        .collect();
    let judged = gpuwatch::health::assess(
        &gpuwatch::health::Settings::default(),
        &mut gpuwatch::health::Memory::default(),
        true,
        &readings,
        1_796_000_000.25,
    );
    for (g, h) in gpus.iter_mut().zip(judged) {
        g.health = Some(h);
    }
    Snapshot {
        seq: 42,
        timestamp: 1_796_000_000.25,
        monotonic: None,
        duration_seconds: 0.0015,
        nvml: NvmlStatus {
            up: true,
            library: "libnvidia-ml.so.1".into(),
            driver_version: Some("550.54.15".into()),
            nvml_version: Some("12.550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            error: None,
            absent: false,
        },
        gpus,
        health_holds: None,
    }
}

fn exposition() -> String {
    exposition_with(Names::Gpuwatch)
}

fn exposition_with(names: Names) -> String {
    exposition_labelled(names, HostnameLabel::default())
}

fn exposition_labelled(names: Names, label: HostnameLabel) -> String {
    let metrics = Arc::new(SamplerCounters::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    metrics.error(SampleError::GpuLost);
    metrics.error(SampleError::OutOfRange);
    metrics.error(SampleError::OutOfRange);
    let build = BuildInfo {
        version: "0.1.0".into(),
        revision: "0123456789ab".into(),
    };
    // A channel of our own, holding the one snapshot, stands in for the sampler.
    let (_publish, snapshots) = tokio::sync::watch::channel(Arc::new(snapshot()));
    registry.register_collector(Box::new(
        SnapshotCollector::with_names(snapshots.into(), build, names, "gpu-node-1".into())
            .with_hostname_label(label),
    ));
    encode(&registry)
}

#[test]
fn exposition_matches_the_golden_file() {
    golden(Names::Gpuwatch, "metrics.txt");
}

/// Under dcgm-exporter's names: its units (percent, MiB, MHz, mJ), its labels, and the last XID;
/// the `gpuwatch_*` series stay, and no `gpu_*` series is left.
#[test]
fn dcgm_names_match_their_golden_file() {
    let got = golden(Names::Dcgm, "metrics-dcgm.txt");
    assert!(!got.lines().any(|l| l.starts_with("gpu_")), "{got}");
    common::assert_promtool_accepts_but(&got, common::DCGM_LINT);
    // Both: every family of each.
    let both = exposition_with(Names::Both);
    let gpuwatch = exposition_with(Names::Gpuwatch);
    for line in got.lines().chain(gpuwatch.lines()) {
        assert!(both.contains(line), "{line} missing under \"both\"");
    }
}

/// The host label is `hostname`, as current dcgm-exporter spells it; `Hostname`, for
/// dashboards written for older releases, is a setting, and changes nothing else.
#[test]
fn the_dcgm_host_label_is_lower_case_unless_asked_otherwise() {
    let lower = exposition_with(Names::Dcgm);
    let older = exposition_labelled(Names::Dcgm, HostnameLabel::Capitalised);
    assert!(lower.contains(",hostname=\"gpu-node-1\""), "{lower}");
    assert!(!lower.contains("Hostname="), "{lower}");
    assert!(!older.contains("hostname="), "{older}");
    assert_eq!(older.replace(",Hostname=", ",hostname="), lower);
}

fn golden(names: Names, file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/golden")
        .join(file);
    let got = exposition_with(names);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        got, want,
        "exposition changed; review it and rerun with UPDATE_GOLDEN=1"
    );
    got
}

/// `promtool check metrics` finds nothing but its note that counters carry HELP under the name
/// without `_total` (OpenMetrics naming).
#[test]
fn promtool_finds_nothing_wrong() {
    common::assert_promtool_accepts(&exposition());
}

/// The shipped dashboard queries only metrics the daemon exports.
#[test]
fn dashboard_queries_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let golden = std::fs::read_to_string(root.join("tests/data/golden/metrics.txt")).unwrap();
    let exported: std::collections::BTreeSet<&str> = golden
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let text = std::fs::read_to_string(root.join("dashboards/gpuwatch-gpus.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("gpu_") || word.starts_with("gpuwatch_") {
                    assert!(
                        exported.contains(word),
                        "{:?} queries {word}, which is not exported",
                        panel["title"]
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 18);
}

/// The shipped Prometheus alert rules and the fleet's recording rules pass their own unit tests
/// (`tests/fleet.rs` also runs the recording rules on a real Prometheus).
#[test]
fn promtool_tests_the_shipped_alert_rules() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/prometheus");
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["check", "rules", "fleet.yml"],
        &["test", "rules", "alerts_test.yml"],
        &["test", "rules", "fleet_test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool not found: scripts/test installs Debian's prometheus");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
