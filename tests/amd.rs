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

/// A process `pid` named `comm` holding a client of the GPU at `pdev` with `vram_mib` of its
/// memory, through descriptor 7 on render node `renderD128`, as the kernel's fdinfo says: a
/// current kernel's keys (`drm-resident-vram` in MiB) beside the legacy one, and a socket
/// beside it whose fdinfo is no GPU's.
fn client(proc: &Path, pid: u32, comm: &str, pdev: &str, vram_mib: u64) {
    let p = proc.join(pid.to_string());
    std::fs::create_dir_all(p.join("fd")).unwrap();
    std::fs::create_dir_all(p.join("fdinfo")).unwrap();
    std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
    symlink("/dev/dri/renderD128", p.join("fd/7")).unwrap();
    symlink("socket:[31337]", p.join("fd/3")).unwrap();
    std::fs::write(
        p.join("fdinfo/3"),
        "pos:\t0\nflags:\t02\nmnt_id:\t9\nino:\t31337\n",
    )
    .unwrap();
    let kib = vram_mib * 1024;
    std::fs::write(
        p.join("fdinfo/7"),
        format!(
            "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1090\ndrm-driver:\tamdgpu\n\
             drm-client-id:\t12\ndrm-pdev:\t{pdev}\npasid:\t32770\ndrm-total-vram:\t{vram_mib} MiB\n\
             drm-shared-vram:\t0\ndrm-active-vram:\t0\ndrm-resident-vram:\t{vram_mib} MiB\n\
             drm-purgeable-vram:\t0\ndrm-memory-vram:\t{kib} KiB\ndrm-memory-gtt: \t2048 KiB\n\
             drm-memory-cpu: \t0 KiB\namd-evicted-vram:\t0 KiB\ndrm-engine-gfx:\t123456789 ns\n\
             drm-engine-compute:\t5000 ns\n"
        ),
    )
    .unwrap();
}

fn start(nvidia: &str, library: Option<&str>) -> Daemon {
    start_with(nvidia, library, "", |_, _| {})
}

/// The daemon over the sysfs tree (changed by `tweak`, given the sysfs and proc roots) and
/// the NVIDIA scenario, with `extra` config appended.
fn start_with(
    nvidia: &str,
    library: Option<&str>,
    extra: &str,
    tweak: impl FnOnce(&Path, &Path),
) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    let proc = dir.path().join("proc");
    tree(&sys);
    std::fs::create_dir_all(&proc).unwrap();
    tweak(&sys, &proc);
    std::fs::write(dir.path().join("scenario.toml"), nvidia).unwrap();
    let library = library.map_or_else(
        || common::fake_library().display().to_string(),
        str::to_string,
    );
    let config = format!(
        "[nvml]\nlibrary = \"{library}\"\n[amd]\nsysfs_root = \"{}\"\nproc_root = \"{}\"\n{extra}",
        sys.display(),
        proc.display(),
    );
    let config = if config.contains("[sampling]") {
        config
    } else {
        config + "[sampling]\ninterval = \"200ms\"\n"
    };
    Daemon::start_with(dir, &config)
}

/// The AMD GPU's device directory under the sysfs root.
fn device(sys: &Path) -> std::path::PathBuf {
    sys.join("devices/pci0000:00/0000:03:00.0")
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

/// A process's GPU memory, read from its DRM client's fdinfo, is the process's on the AMD GPU
/// it names, and goes to the Slurm job the process belongs to (its environment names the job,
/// and the prolog gave that job this GPU); the process's name comes from its `comm`.
#[test]
fn an_amd_gpu_s_process_memory_is_attributed_to_its_slurm_job() {
    let mut job = std::process::Command::new("sleep")
        .arg("600")
        .env("SLURM_JOB_ID", "4343")
        .spawn()
        .unwrap();
    let pid = job.id();
    let mapping = tempfile::tempdir().unwrap();
    std::fs::write(mapping.path().join("1"), "4343\n").unwrap();
    let extra = format!(
        "[sampling]\ninterval = \"200ms\"\nper_process_memory = true\n\
         [slurm]\nenabled = true\njob_mapping_dir = \"{}\"\njob_label = true\n",
        mapping.path().display()
    );
    let d = start_with("[[gpu]]\nutilization = 30\n", None, &extra, |_, proc| {
        client(proc, pid, "python3", "0000:03:00.0", 512);
    });
    let s = d.await_scrape(Duration::from_secs(30), |s| {
        metric("gpuwatch_job_gpu_allocated")
            .label("job", "4343")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_job_gpu_allocated")
        .label("job", "4343")
        .gpu(1)
        .value(1.0)
        .assert_in(&s);
    metric("gpu_process_memory_used_bytes")
        .gpu(1)
        .label("pid", pid)
        .label("process", "python3")
        .value(512.0 * 1024.0 * 1024.0)
        .assert_in(&s);
    metric("gpu_processes")
        .gpu(1)
        .label("hpc_job", "4343")
        .value(1.0)
        .assert_in(&s);
    // The NVIDIA GPU runs no process and no job.
    metric("gpu_processes").gpu(0).value(0.0).assert_in(&s);
    job.kill().unwrap();
    job.wait().unwrap();
}

/// An AMD-only node on EC2, stopped in dry-run by `rule` (its metric below `threshold`) once
/// `ready` has changed the trees: the decision names the rule and what it would call.
/// `before` changes the sysfs and proc trees first (the GPU 0% busy and running nothing
/// otherwise), and until `ready` has changed them again, nothing acts.
fn dry_run_stop(
    metric: &str,
    threshold: f64,
    before: impl FnOnce(&Path, &Path),
    ready: impl FnOnce(&Path, &Path),
) {
    use common::aws::{self, actions, Kind};
    let inst = aws::launch(Kind::OnDemand);
    let imds = aws::imds(&inst.id, "on-demand");
    let dir = tempfile::tempdir().unwrap();
    let rule = format!(
        "[[rules]]\nname = \"idle\"\nmetric = \"{metric}\"\ncomparison = \"less_than\"\n\
         threshold = {threshold}\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"stop\"\n"
    );
    let config = aws::daemon_config(
        dir.path(),
        &imds,
        aws::moto().addr,
        "mode = \"dry-run\"\nwarning = \"1s\"",
        &rule,
    );
    let sys = dir.path().join("sys");
    let proc = dir.path().join("proc");
    tree(&sys);
    std::fs::write(device(&sys).join("gpu_busy_percent"), "0\n").unwrap();
    // A healthy GPU: an unhealthy one is never judged idle.
    std::fs::write(device(&sys).join("ras/gfx_err_count"), "ue: 0\nce: 0\n").unwrap();
    std::fs::create_dir_all(&proc).unwrap();
    before(&sys, &proc);
    // No NVIDIA driver on the node.
    let config = config.replace(
        &format!("library = \"{}\"", common::fake_library().display()),
        "library = \"/nonexistent/libnvidia-ml.so.1\"",
    ) + &format!(
        "[amd]\nsysfs_root = \"{}\"\nproc_root = \"{}\"\n",
        sys.display(),
        proc.display()
    );
    let d = Daemon::start_scenario(dir, "", &config);
    // Four seconds of samples: twice what the rule needs.
    d.await_sample(Duration::from_secs(30), |s| {
        s["gpus"][0]["up"] == true && s["seq"].as_u64() > Some(40)
    });
    assert_eq!(actions(&d.scrape(), "stop", "dry_run"), 0.0);
    assert!(common::events(&d.audit(), "warning").is_empty());
    ready(&d.dir.path().join("sys"), &d.dir.path().join("proc"));
    d.await_scrape(Duration::from_secs(60), |s| {
        actions(s, "stop", "dry_run") == 1.0
    });
    assert_eq!(aws::instance_state(&inst.id), "running");
    let audit = d.audit();
    let result = common::events(&audit, "action_result")[0];
    assert_eq!(result["rule"], "idle");
    assert_eq!(result["mode"], "dry-run");
    assert!(
        result["detail"]
            .as_str()
            .unwrap()
            .starts_with("would StopInstances"),
        "{result}"
    );
}

/// A busy AMD GPU is left alone, and once idle (0% busy) a rule on `gpu_utilization` stops
/// the node, as on NVIDIA.
#[test]
fn an_idle_amd_gpu_is_stopped_by_an_idle_rule_in_dry_run() {
    let busy = |sys: &Path, percent: &str| {
        std::fs::write(device(sys).join("gpu_busy_percent"), percent).unwrap();
    };
    dry_run_stop(
        "gpu_utilization",
        0.05,
        |sys, _| busy(sys, "50\n"),
        |sys, _| busy(sys, "0\n"),
    );
}

/// A rule on `processes` waits while a process's descriptors cannot be read (it may hold the
/// GPU: unknown is never none), and acts once that process is gone and the GPU runs nothing.
#[test]
fn an_amd_gpu_whose_processes_are_unknown_is_not_judged_empty() {
    dry_run_stop(
        "processes",
        1.0,
        |_, proc| {
            // A process whose descriptors cannot be listed (its fdinfo is no directory).
            std::fs::create_dir_all(proc.join("4000")).unwrap();
            std::fs::write(proc.join("4000/fdinfo"), "").unwrap();
            // And one of another driver's GPU.
            client(proc, 4001, "glxgears", "0000:03:00.0", 64);
            let other = proc.join("4001/fdinfo/7");
            let text = std::fs::read_to_string(&other).unwrap();
            std::fs::write(&other, text.replace("amdgpu", "i915")).unwrap();
        },
        |_, proc| std::fs::remove_dir_all(proc.join("4000")).unwrap(),
    );
}

/// Under dcgm-exporter's names, the NVIDIA GPU has them and the AMD GPU keeps gpuwatch's (it
/// is no GPU dcgm-exporter exports): no DCGM series names it, and no gpuwatch series the
/// NVIDIA GPU.
#[test]
fn under_dcgm_names_an_amd_gpu_keeps_gpuwatch_s() {
    let d = start_with(
        "[[gpu]]\nutilization = 30\n",
        None,
        "[exposition]\nnames = \"dcgm\"\n",
        |_, _| {},
    );
    let s = d.await_scrape(Duration::from_secs(30), |s| {
        metric("gpu_utilization_ratio").gpu(1).get(s).is_some()
            && metric("DCGM_FI_DEV_GPU_UTIL").gpu(0).get(s).is_some()
    });
    metric("DCGM_FI_DEV_GPU_UTIL")
        .gpu(0)
        .value(30.0)
        .assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(1)
        .label("uuid", "0123456789abcdef")
        .value(0.42)
        .assert_in(&s);
    metric("gpu_info")
        .gpu(1)
        .label("vendor", "amd")
        .value(1.0)
        .assert_in(&s);
    metric("DCGM_FI_DEV_GPU_UTIL").gpu(1).absent().assert_in(&s);
    metric("gpu_utilization_ratio")
        .gpu(0)
        .absent()
        .assert_in(&s);
    metric("gpu_info").gpu(0).absent().assert_in(&s);
}

/// A node's files and config for the commands that look at it once.
fn node_config(dir: &Path, rules: &str) -> std::path::PathBuf {
    let sys = dir.join("sys");
    tree(&sys);
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    client(&dir.join("proc"), 4242, "python3", "0000:03:00.0", 128);
    let path = dir.join("gpuwatch.toml");
    std::fs::write(
        &path,
        format!(
            "[nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n[amd]\nsysfs_root = \"{}\"\nproc_root = \"{}\"\n{rules}",
            sys.display(),
            dir.join("proc").display()
        ),
    )
    .unwrap();
    path
}

/// `gpuwatch snapshot` reads an AMD-only node whole: NVML's absence is no failure.
#[test]
fn a_snapshot_of_an_amd_only_node_shows_its_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let config = node_config(dir.path(), "");
    let json = common::gpuwatch(&[&"snapshot", &"--json", &"--config", &config]);
    let snap: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(snap["gpus"][0]["vendor"], "amd", "{snap}");
    assert_eq!(snap["gpus"][0]["name"], "AMD Instinct MI210", "{snap}");
    assert_eq!(snap["gpus"][0]["utilization_ratio"], 0.42, "{snap}");
    assert_eq!(snap["gpus"][0]["processes"], 1, "{snap}");
    let table = common::gpuwatch(&[&"snapshot", &"--config", &config]);
    assert!(table.contains("AMD Instinct MI210"), "{table}");
}

/// A rule on a GPM metric is refused on a node whose GPUs can never give it (AMD's, and no
/// NVIDIA driver), by `run` and `check-config` alike: exit status 64, naming the rule's key.
#[test]
fn a_rule_on_a_metric_no_gpu_of_the_node_gives_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rule =
        "[[rules]]\nname = \"sm-idle\"\nmetric = \"sm_active\"\ncomparison = \"less_than\"\n\
                threshold = 0.05\nperiod = \"1m\"\naction = \"alert\"\n";
    let config = node_config(dir.path(), rule);
    for args in [
        vec!["run", "--listen", "127.0.0.1:0", "--config"],
        vec!["check-config"],
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(&args)
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.contains("rules.sm-idle.metric: \"sm_active\": no GPU of this node gives it: its GPUs are AMD's"),
            "{args:?}: {err}"
        );
    }
    // An NVIDIA GPU on the bus, its driver not loaded: it may have GPM once it is.
    let nvidia = dir.path().join("sys/bus/pci/devices/0000:18:00.0");
    std::fs::create_dir_all(&nvidia).unwrap();
    std::fs::write(nvidia.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(nvidia.join("class"), "0x030200\n").unwrap();
    let out = common::gpuwatch(&[&"check-config", &config]);
    assert!(out.contains(": ok"), "{out}");
    // The same rule on utilization is a config the node can use.
    let plain = node_config(
        &dir.path().join("plain"),
        &rule.replace("sm_active", "gpu_utilization"),
    );
    let out = common::gpuwatch(&[&"check-config", &plain]);
    assert!(out.contains(": ok"), "{out}");
}
