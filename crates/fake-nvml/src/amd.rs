//! The fake's AMD side: a sysfs and procfs tree laid out as the PCI core, the amdgpu driver
//! and procfs lay theirs, for a scenario's `[[amd]]` GPUs, rewritten as simulated time passes.
//!
//! Under the tree's root, `sys/` holds each GPU's PCI device directory (`vendor`, `unique_id`,
//! `product_name`, the busy percents, VRAM, the PCIe link, `ras/umc_err_count`,
//! `gpu_metrics` 1.3 with its energy accumulator, an amdgpu hwmon directory with the junction
//! and memory temperatures as an MI300 has them, power, its cap and the clocks), its `driver`
//! link to amdgpu, and `class/drm/cardN` and `renderD(128+N)` pointing at it. `proc/` holds one
//! process per DRM client: its `comm`, descriptor 7 a link to the render node, and that
//! descriptor's fdinfo as the kernel prints it. Every file is replaced whole (written aside,
//! then renamed), as a sysfs read never sees half a value.

use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::scenario::{AmdGpu, Scenario};

/// A scenario's AMD GPUs as files.
#[derive(Debug)]
pub struct Tree {
    root: PathBuf,
    gpus: Vec<AmdGpu>,
    /// Simulated time at wall-clock 0, and simulated seconds per second.
    start: f64,
    speed: f64,
}

/// The first pid of GPU `i`'s processes.
fn first_pid(i: usize) -> u32 {
    200_000 + 1000 * i as u32
}

/// The most processes shown on one GPU.
const MAX_PROCESSES: u32 = 64;

impl Tree {
    /// Lays out the scenario's AMD GPUs under `root` (which must exist), with their values at
    /// simulated time `t`.
    pub fn create(root: &Path, scenario: &Scenario, t: f64) -> io::Result<Tree> {
        let tree = Tree {
            root: root.to_path_buf(),
            gpus: scenario.amd.clone(),
            start: scenario.start,
            speed: scenario.speed,
        };
        for d in ["sys/class/drm", "sys/bus/pci/drivers/amdgpu", "proc", "tmp"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        for (i, g) in tree.gpus.iter().enumerate() {
            tree.lay_out(i, g)?;
        }
        tree.update(t)?;
        Ok(tree)
    }

    /// Rewrites every value that changes, `elapsed` wall-clock seconds after the start (the
    /// scenario's `time.start` and `time.speed` make it simulated time).
    pub fn update_at(&self, elapsed: f64) -> io::Result<()> {
        self.update(self.start + elapsed * self.speed)
    }

    /// The sysfs root, for `[amd] sysfs_root`.
    pub fn sysfs_root(&self) -> PathBuf {
        self.root.join("sys")
    }

    /// The procfs root, for `[amd] proc_root`.
    pub fn proc_root(&self) -> PathBuf {
        self.root.join("proc")
    }

    fn device(&self, g: &AmdGpu) -> PathBuf {
        self.root.join("sys/devices/pci0000:00").join(&g.pci_bus_id)
    }

    /// The files that do not change: identity, the link, the cap, the labels.
    fn lay_out(&self, i: usize, g: &AmdGpu) -> io::Result<()> {
        let dev = self.device(g);
        let hwmon = dev.join(format!("hwmon/hwmon{}", i + 2));
        std::fs::create_dir_all(&hwmon)?;
        std::fs::create_dir_all(dev.join("ras"))?;
        let files: [(&Path, &str, String); 14] = [
            (&dev, "vendor", "0x1002\n".into()),
            (&dev, "device", "0x74a1\n".into()),
            (&dev, "unique_id", format!("{}\n", g.unique_id)),
            (&dev, "product_name", format!("{}\n", g.name)),
            (
                &dev,
                "mem_info_vram_total",
                format!("{}\n", g.vram_total_mib << 20),
            ),
            (&dev, "current_link_speed", "32.0 GT/s PCIe\n".into()),
            (&dev, "max_link_speed", "32.0 GT/s PCIe\n".into()),
            (&dev, "current_link_width", "16\n".into()),
            (&dev, "max_link_width", "16\n".into()),
            (&hwmon, "name", "amdgpu\n".into()),
            (&hwmon, "temp2_label", "junction\n".into()),
            (&hwmon, "temp3_label", "mem\n".into()),
            (
                &hwmon,
                "power1_cap",
                format!("{}\n", u64::from(g.power_cap_watts) * 1_000_000),
            ),
            (&hwmon, "freq1_label", "sclk\n".into()),
        ];
        for (dir, name, text) in files {
            self.put(&dir.join(name), text.as_bytes())?;
        }
        let target = format!("../../../devices/pci0000:00/{}", g.pci_bus_id);
        relink("../../../bus/pci/drivers/amdgpu", &dev.join("driver"))?;
        for node in [format!("card{i}"), format!("renderD{}", 128 + i)] {
            let dir = self.root.join("sys/class/drm").join(node);
            std::fs::create_dir_all(&dir)?;
            relink(&target, &dir.join("device"))?;
        }
        Ok(())
    }

    /// Rewrites every value that changes, as it is at simulated time `t`.
    pub fn update(&self, t: f64) -> io::Result<()> {
        for (i, g) in self.gpus.iter().enumerate() {
            let dev = self.device(g);
            let hwmon = dev.join(format!("hwmon/hwmon{}", i + 2));
            let percent = |s: &crate::scenario::Series| s.at(t).clamp(0.0, 100.0).round() as u64;
            let used_mib = (g.vram_used_mib.at(t).max(0.0) as u64).min(g.vram_total_mib);
            let files: [(&Path, &str, String); 9] = [
                (
                    &dev,
                    "gpu_busy_percent",
                    format!("{}\n", percent(&g.utilization)),
                ),
                (
                    &dev,
                    "mem_busy_percent",
                    format!("{}\n", percent(&g.memory_utilization)),
                ),
                (&dev, "mem_info_vram_used", format!("{}\n", used_mib << 20)),
                (&hwmon, "temp2_input", millis(g.temperature.at(t))),
                (&hwmon, "temp3_input", millis(g.memory_temperature.at(t))),
                (&hwmon, "power1_average", micros(g.power_watts.at(t))),
                (&hwmon, "freq1_input", hertz(g.sclk_mhz.at(t))),
                (&hwmon, "freq2_input", hertz(g.mclk_mhz.at(t))),
                (
                    &dev.join("ras"),
                    "umc_err_count",
                    format!(
                        "ue: {}\nce: {}\n",
                        g.ecc_uncorrected.at(t).max(0.0) as u64,
                        g.ecc_corrected.at(t).max(0.0) as u64
                    ),
                ),
            ];
            for (dir, name, text) in files {
                self.put(&dir.join(name), text.as_bytes())?;
            }
            self.put(&dev.join("gpu_metrics"), &gpu_metrics(g, t))?;
            self.processes(i, g, t, used_mib)?;
        }
        Ok(())
    }

    /// GPU `i`'s processes at `t`: one DRM client each, sharing the VRAM used.
    fn processes(&self, i: usize, g: &AmdGpu, t: f64, used_mib: u64) -> io::Result<()> {
        let n = (g.processes.at(t).max(0.0).round() as u32).min(MAX_PROCESSES);
        for k in 0..MAX_PROCESSES {
            let dir = self.proc_root().join((first_pid(i) + k).to_string());
            if k >= n {
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)?;
                }
                continue;
            }
            std::fs::create_dir_all(dir.join("fd"))?;
            std::fs::create_dir_all(dir.join("fdinfo"))?;
            self.put(
                &dir.join("comm"),
                format!("{}\n", g.process_name).as_bytes(),
            )?;
            relink(&format!("/dev/dri/renderD{}", 128 + i), &dir.join("fd/7"))?;
            let mib = used_mib / u64::from(n);
            let text = format!(
                "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t{ino}\ndrm-driver:\tamdgpu\n\
                 drm-client-id:\t{client}\ndrm-pdev:\t{pdev}\npasid:\t{pasid}\n\
                 drm-total-vram:\t{mib} MiB\ndrm-shared-vram:\t0\ndrm-active-vram:\t0\n\
                 drm-resident-vram:\t{mib} MiB\ndrm-purgeable-vram:\t0\n\
                 drm-memory-vram:\t{kib} KiB\ndrm-memory-gtt: \t2048 KiB\ndrm-memory-cpu: \t0 KiB\n\
                 amd-evicted-vram:\t0 KiB\namd-requested-vram:\t{kib} KiB\n\
                 drm-engine-compute:\t{ns} ns\n",
                ino = 1090 + k,
                client = 40 + k,
                pdev = g.pci_bus_id,
                pasid = 32770 + k,
                kib = mib << 10,
                ns = (g.utilization.integral(t) * 1e7).max(0.0) as u64,
            );
            self.put(&dir.join("fdinfo/7"), text.as_bytes())?;
        }
        Ok(())
    }

    /// Replaces `path` whole: written aside, then renamed into place.
    fn put(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let aside = self.root.join("tmp").join("next");
        std::fs::write(&aside, bytes)?;
        std::fs::rename(&aside, path)
    }
}

/// A symlink at `at` to `target`, replacing one there.
fn relink(target: &str, at: &Path) -> io::Result<()> {
    match std::fs::remove_file(at) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    symlink(target, at)
}

fn millis(celsius: f64) -> String {
    format!("{}\n", (celsius * 1000.0).round() as i64)
}

fn micros(watts: f64) -> String {
    format!("{}\n", (watts.max(0.0) * 1e6).round() as u64)
}

fn hertz(mhz: f64) -> String {
    format!("{}\n", (mhz.max(0.0) * 1e6).round() as u64)
}

/// `gpu_metrics` 1.3 (`struct gpu_metrics_v1_3`, 120 bytes): the hotspot and memory
/// temperatures (°C), the average activities (%), the socket power (W) and the energy
/// accumulator (2⁻¹⁶ J a count); every other field 0xFF, as the driver leaves what it lacks.
fn gpu_metrics(g: &AmdGpu, t: f64) -> Vec<u8> {
    let mut b = vec![0xffu8; 120];
    b[..4].copy_from_slice(&[120, 0, 1, 3]);
    let u16_at = |b: &mut Vec<u8>, at: usize, v: f64| {
        b[at..at + 2].copy_from_slice(&(v.clamp(0.0, 65534.0) as u16).to_le_bytes());
    };
    u16_at(&mut b, 6, g.temperature.at(t));
    u16_at(&mut b, 8, g.memory_temperature.at(t));
    u16_at(&mut b, 16, g.utilization.at(t).clamp(0.0, 100.0));
    u16_at(&mut b, 18, g.memory_utilization.at(t).clamp(0.0, 100.0));
    u16_at(&mut b, 22, g.power_watts.at(t));
    let energy = (g.power_watts.integral(t).max(0.0) * 65536.0) as u64;
    b[24..32].copy_from_slice(&energy.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_shows_the_scenario_at_each_time() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Scenario::parse(
            "[[amd]]\nutilization = { kind = \"ramp\", from = 0, to = 80, over = \"10s\" }\n\
             vram_used_mib = 4096\nprocesses = 2\npower_watts = 500\n",
            tmp.path(),
        )
        .unwrap();
        let tree = Tree::create(tmp.path(), &s, 5.0).unwrap();
        let dev = tree.sysfs_root().join("devices/pci0000:00/0000:0c:00.0");
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&dev.join("gpu_busy_percent")), "40\n");
        assert_eq!(read(&dev.join("vendor")), "0x1002\n");
        let fdinfo = read(&tree.proc_root().join("200001/fdinfo/7"));
        assert!(
            fdinfo.contains("drm-resident-vram:\t2048 MiB\n"),
            "{fdinfo}"
        );
        assert!(fdinfo.contains("drm-pdev:\t0000:0c:00.0\n"), "{fdinfo}");
        let metrics = std::fs::read(dev.join("gpu_metrics")).unwrap();
        assert_eq!(
            u64::from_le_bytes(metrics[24..32].try_into().unwrap()),
            2500 * 65536
        );
        tree.update(10.0).unwrap();
        assert_eq!(read(&dev.join("gpu_busy_percent")), "80\n");
        let card = std::fs::canonicalize(tree.sysfs_root().join("class/drm/renderD128/device"));
        assert_eq!(card.unwrap(), std::fs::canonicalize(&dev).unwrap());
    }
}
