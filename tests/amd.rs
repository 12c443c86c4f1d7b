//! AMD GPUs end to end: the release binary reads a sysfs tree laid out as the amdgpu driver and
//! the PCI core lay theirs (`class/drm/cardN/device` a link to the PCI device directory, its
//! `driver` a link to the driver, hwmon below it), beside the fake NVML library.

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use common::{metric, Daemon};

/// One AMD GPU at 0000:03:00.0 as card1 (card0 a display connector's and an NVIDIA card's
/// siblings are not AMD GPUs), its files holding what the kernel prints.
fn tree(root: &Path) {
    let pci = root.join("devices/pci0000:00");
    let dev = pci.join("0000:03:00.0");
    let hwmon = dev.join("hwmon/hwmon4");
    for d in [
        &hwmon,
        &dev.join("ras"),
        &root.join("class/drm"),
        &root.join("bus/pci/drivers/amdgpu"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    let files: &[(&Path, &str, &str)] = &[
        (&dev, "vendor", "0x1002\n"),
        (&dev, "unique_id", "0123456789abcdef\n"),
        (&dev, "product_name", "AMD Instinct MI210\n"),
        (&dev, "gpu_busy_percent", "42\n"),
        (&dev, "mem_busy_percent", "7\n"),
        (&dev, "mem_info_vram_total", "68702699520\n"),
        (&dev, "mem_info_vram_used", "1073741824\n"),
        (&dev, "current_link_speed", "16.0 GT/s PCIe\n"),
        (&dev, "max_link_speed", "16.0 GT/s PCIe\n"),
        (&dev, "current_link_width", "8\n"),
        (&dev, "max_link_width", "16\n"),
        (&dev, "pp_dpm_sclk", "0: 500Mhz \n1: 1700Mhz *\n"),
        (&dev, "pp_dpm_mclk", "0: 400Mhz \n1: 1600Mhz *\n"),
        (&dev.join("ras"), "umc_err_count", "ue: 0\nce: 3\n"),
        (&dev.join("ras"), "gfx_err_count", "ue: 1\nce: 0\nde: 0\n"),
        (&hwmon, "name", "amdgpu\n"),
        (&hwmon, "temp1_label", "edge\n"),
        (&hwmon, "temp1_input", "45000\n"),
        (&hwmon, "temp2_label", "junction\n"),
        (&hwmon, "temp2_input", "52000\n"),
        (&hwmon, "temp3_label", "mem\n"),
        (&hwmon, "temp3_input", "61000\n"),
        (&hwmon, "power1_average", "250000000\n"),
        (&hwmon, "power1_cap", "300000000\n"),
    ];
    for (dir, name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    symlink("../../../bus/pci/drivers/amdgpu", dev.join("driver")).unwrap();
    // gpu_metrics 1.3, as MI200 writes it: only the energy is read from it here (1000 J).
    let mut metrics = vec![0xffu8; 120];
    metrics[..4].copy_from_slice(&[120, 0, 1, 3]);
    metrics[24..32].copy_from_slice(&(65536u64 * 1000).to_le_bytes());
    std::fs::write(dev.join("gpu_metrics"), metrics).unwrap();

    // An NVIDIA card (read through NVML, not here), and a connector.
    let other = pci.join("0000:18:00.0");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("vendor"), "0x10de\n").unwrap();
    let drm = root.join("class/drm");
    for (card, target) in [("card0", "0000:18:00.0"), ("card1", "0000:03:00.0")] {
        std::fs::create_dir_all(drm.join(card)).unwrap();
        symlink(
            format!("../../../devices/pci0000:00/{target}"),
            drm.join(card).join("device"),
        )
        .unwrap();
    }
    std::fs::create_dir_all(drm.join("card1-DP-1")).unwrap();
}

fn start(nvidia: &str, library: Option<&str>) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    tree(&sys);
    std::fs::write(dir.path().join("scenario.toml"), nvidia).unwrap();
    let library = library.map_or_else(
        || common::fake_library().display().to_string(),
        str::to_string,
    );
    let config = format!(
        "[nvml]\nlibrary = \"{library}\"\n[amd]\nsysfs_root = \"{}\"\n[sampling]\ninterval = \"200ms\"\n",
        sys.display()
    );
    Daemon::start_with(dir, &config)
}

/// A node with one NVIDIA GPU and one AMD GPU: the AMD GPU is GPU 1, with every reading the
/// files give, in base units, under gpuwatch's names.
#[test]
fn a_mixed_node_serves_the_amd_gpu_s_readings_exactly() {
    let d = start("[[gpu]]\nutilization = 30\n", None);
    let s = d.await_scrape(Duration::from_secs(30), |s| {
        metric("gpu_info").gpu(1).get(s).is_some()
    });
    let amd = |name: &str| metric(name).gpu(1).label("uuid", "0123456789abcdef");
    amd("gpu_info")
        .label("name", "AMD Instinct MI210")
        .label("pci_bus_id", "0000:03:00.0")
        .label("vendor", "amd")
        .value(1.0)
        .assert_in(&s);
    metric("gpu_info")
        .gpu(0)
        .label("vendor", "nvidia")
        .value(1.0)
        .assert_in(&s);
    for (name, want) in [
        ("gpu_up", 1.0),
        ("gpu_utilization_ratio", 0.42),
        ("gpu_memory_utilization_ratio", 0.07),
        ("gpu_memory_total_bytes", 68_702_699_520.0),
        ("gpu_memory_used_bytes", 1_073_741_824.0),
        ("gpu_memory_free_bytes", 67_628_957_696.0),
        ("gpu_temperature_celsius", 45.0),
        ("gpu_memory_temperature_celsius", 61.0),
        ("gpu_power_watts", 250.0),
        ("gpu_power_limit_watts", 300.0),
        ("gpu_energy_joules_total", 1000.0),
    ] {
        amd(name).value(want).assert_in(&s);
    }
    amd("gpu_clock_hertz")
        .label("clock", "sm")
        .value(1.7e9)
        .assert_in(&s);
    amd("gpu_clock_hertz")
        .label("clock", "memory")
        .value(1.6e9)
        .assert_in(&s);
    amd("gpu_ecc_errors_total")
        .label("kind", "corrected")
        .value(3.0)
        .assert_in(&s);
    amd("gpu_ecc_errors_total")
        .label("kind", "uncorrected")
        .value(1.0)
        .assert_in(&s);
    for (which, generation, width) in [("current", 4.0, 8.0), ("max", 4.0, 16.0)] {
        amd("gpu_pcie_link_generation")
            .label("which", which)
            .value(generation)
            .assert_in(&s);
        amd("gpu_pcie_link_width")
            .label("which", which)
            .value(width)
            .assert_in(&s);
    }
    // Only two GPUs: the NVIDIA card's sysfs entry and the connector are not AMD GPUs.
    assert_eq!(s.named("gpu_info").len(), 2, "{}", s.text);
    // What NVIDIA has and AMD has not is absent, never 0.
    amd("gpu_encoder_utilization_ratio").absent().assert_in(&s);
    // An uncorrectable error makes it unhealthy, as on NVIDIA.
    let snap = d.await_sample(Duration::from_secs(10), |s| {
        s["gpus"][1]["health"].is_object()
    });
    assert_eq!(snap["gpus"][1]["vendor"], "amd", "{snap}");
    assert_eq!(snap["gpus"][1]["health"]["state"], "unhealthy", "{snap}");
}

/// A node with AMD GPUs only: NVML is down for want of its library, which is not a failure of
/// the node; a GPU whose sysfs directory goes is lost, with its identity kept.
#[test]
fn an_amd_only_node_is_complete_and_a_gpu_that_goes_is_lost() {
    let d = start("", Some("/nonexistent/libnvidia-ml.so.1"));
    let snap = d.await_sample(Duration::from_secs(30), |s| s["gpus"][0]["up"] == true);
    assert_eq!(snap["nvml"]["up"], false, "{snap}");
    assert_eq!(snap["nvml"]["absent"], true, "{snap}");
    let s = d.scrape();
    metric("gpuwatch_nvml_up").value(0.0).assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(0)
        .value(0.42)
        .assert_in(&s);
    let status = d.get("/api/v1/status").json();
    assert_eq!(status["nvml"]["absent"], true, "{status}");

    // The GPU falls off the bus: its device directory is gone.
    let dev = d.dir.path().join("sys/devices/pci0000:00/0000:03:00.0");
    std::fs::remove_dir_all(&dev).unwrap();
    let s = d.await_scrape(Duration::from_secs(30), |s| {
        metric("gpu_up").gpu(0).get(s) == Some(0.0)
    });
    metric("gpu_info")
        .gpu(0)
        .label("uuid", "0123456789abcdef")
        .label("name", "AMD Instinct MI210")
        .label("vendor", "amd")
        .value(1.0)
        .assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(0)
        .absent()
        .assert_in(&s);
}
