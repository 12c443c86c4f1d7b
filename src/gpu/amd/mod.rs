//! AMD GPUs, read from the amdgpu kernel driver's own files: no ROCm, no SMI library.
//!
//! A GPU is each `class/drm/card<N>/device` under the sysfs root whose `vendor` is `0x1002`
//! and whose driver is amdgpu, found once, in card order. Every cycle reads, per GPU:
//! `gpu_busy_percent` and `mem_busy_percent`, `mem_info_vram_total` and `_used`, the hwmon
//! temperatures by label (`edge`, `junction`, `mem`), `power1_average` (or `power1_input`) and
//! `power1_cap`, `freq1_input` and `freq2_input` (or the active level of `pp_dpm_sclk` and
//! `pp_dpm_mclk`), the `ras/*_err_count` blocks, the PCIe link, and the `gpu_metrics` table
//! (energy, and whatever the files above do not give). A file the driver does not create is a
//! reading the GPU lacks: left out, recorded once, not asked again. One that cannot be read,
//! or holds what the kernel never prints, is counted and logged once, and left out: never 0. A
//! GPU whose files are gone is lost, with its identity kept.

mod clients;
mod metrics;
mod procfs;
#[cfg(test)]
mod tests;
mod text;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use text::pci_address;

use super::counters::{SampleError, SamplerCounters};
use super::{GpuSample, PcieLink, ProcessRef, ProcessSample, Vendor};

/// The most bytes of a text file read.
const MAX_TEXT: u64 = 4096;
/// The most AMD GPUs read.
const MAX_CARDS: usize = 64;

/// The most processes listed of one GPU, as for NVIDIA's.
const MAX_PROCESSES: usize = 1024;

/// AMD's PCI vendor id.
const VENDOR_AMD: u16 = 0x1002;

pub struct AmdSource {
    sysfs: PathBuf,
    proc: PathBuf,
    metrics: Arc<SamplerCounters>,
    /// Each process's name and memory are wanted (`[sampling] per_process_memory`).
    per_process: bool,
    /// Each process's pid and memory are wanted (who holds which GPU).
    pids: bool,
    cards: Vec<Card>,
    /// Each AMD GPU's DRM nodes (`card1`, `renderD128`): its PCI address, by node name.
    nodes: HashMap<String, String>,
    /// The processes could not all be read, and that was said.
    clients_said: bool,
    /// The cards are looked for once, at the first cycle.
    looked: bool,
    /// (GPU, reading) pairs the driver gives no file for: not asked again.
    unsupported: HashSet<(usize, &'static str)>,
    /// (GPU, reading) pairs already logged as failing or bad, so that each logs once.
    logged: HashSet<(usize, &'static str)>,
}

/// One AMD GPU: its device directory, what identifies it and its hwmon directory, each kept
/// once read.
struct Card {
    dir: PathBuf,
    uuid: Option<String>,
    name: Option<String>,
    pci_bus_id: Option<String>,
    hwmon: Option<Hwmon>,
}

/// A GPU's amdgpu hwmon directory, and its temperature inputs by label (the labels do not
/// change while the directory is there, so they are read once).
#[derive(Clone)]
struct Hwmon {
    dir: PathBuf,
    temps: Vec<(Sensor, PathBuf)>,
}

/// The temperature sensors read, by their hwmon label.
#[derive(Clone, Copy)]
enum Sensor {
    Edge,
    Junction,
    Mem,
}

impl Card {
    /// Reads what identifies the GPU until each part is known.
    fn identify(&mut self) {
        if self.uuid.is_none() {
            self.uuid = read_text(&self.dir.join("unique_id"))
                .ok()
                .and_then(|t| text::unique_id(&t))
                .flatten();
        }
        if self.name.is_none() {
            self.name = read_text(&self.dir.join("product_name"))
                .ok()
                .and_then(|t| text::name(&t))
                .flatten();
        }
    }

    /// The amdgpu hwmon directory, looked for until found, and its temperature labels, read
    /// until one is found.
    fn hwmon(&mut self) -> Option<Hwmon> {
        match &mut self.hwmon {
            Some(h) if h.temps.is_empty() => h.temps = labelled(&h.dir),
            Some(_) => {}
            None => {
                self.hwmon = hwmon(&self.dir).map(|dir| Hwmon {
                    temps: labelled(&dir),
                    dir,
                })
            }
        }
        self.hwmon.clone()
    }
}

impl AmdSource {
    /// Reads the AMD GPUs under `sysfs` (normally `/sys`).
    pub fn new(sysfs: impl Into<PathBuf>, metrics: Arc<SamplerCounters>) -> Self {
        AmdSource {
            sysfs: sysfs.into(),
            proc: PathBuf::from("/proc"),
            metrics,
            per_process: false,
            pids: false,
            cards: Vec::new(),
            nodes: HashMap::new(),
            clients_said: false,
            looked: false,
            unsupported: HashSet::new(),
            logged: HashSet::new(),
        }
    }

    /// Reads the processes under `proc` (normally `/proc`): with `per_process`, each one's
    /// name and memory; with `pids`, each one's pid and memory, for who holds which GPU.
    pub fn with_processes(
        mut self,
        proc: impl Into<PathBuf>,
        per_process: bool,
        pids: bool,
    ) -> Self {
        self.proc = proc.into();
        self.per_process = per_process;
        self.pids = pids;
        self
    }

    /// One cycle of every AMD GPU, numbered from `first` on.
    pub fn sample(&mut self, first: u32) -> Vec<GpuSample> {
        if !self.looked {
            self.looked = true;
            self.cards = find(&self.sysfs);
            self.nodes = drm_nodes(&self.sysfs, &self.cards);
            if !self.cards.is_empty() {
                tracing::info!(gpus = self.cards.len(), sysfs = %self.sysfs.display(), "AMD GPUs found (amdgpu)");
            }
        }
        let mut gpus: Vec<GpuSample> = (0..self.cards.len())
            .map(|i| self.read_card(i, first + i as u32))
            .collect();
        if gpus.iter().any(|g| g.up) {
            self.processes(&mut gpus);
        }
        gpus
    }

    /// Each GPU's processes, from their DRM clients; every GPU's stay unknown in a cycle when
    /// a process's clients could not be read.
    fn processes(&mut self, gpus: &mut [GpuSample]) {
        let only = match &self.cards[..] {
            [one] => one.pci_bus_id.as_deref(),
            _ => None,
        };
        let found = clients::scan(&self.proc, &self.nodes, only);
        if found.unreadable > 0 {
            self.metrics.error(SampleError::ReadFailed);
            if !std::mem::replace(&mut self.clients_said, true) {
                let (_, why) = found.why.unwrap_or_default();
                tracing::warn!(
                    processes = found.unreadable,
                    proc = %self.proc.display(),
                    "the AMD GPUs' processes are unknown: {why}; no rule on processes or holders judges these GPUs meanwhile"
                );
            }
            return;
        }
        if std::mem::replace(&mut self.clients_said, false) {
            tracing::info!("the AMD GPUs' processes are read again");
        }
        let none = BTreeMap::new();
        for g in gpus.iter_mut().filter(|g| g.up) {
            let Some(pci) = g.pci_bus_id.as_deref() else {
                continue;
            };
            let used = found.by_gpu.get(pci).unwrap_or(&none);
            g.processes = Some(used.len() as u32);
            if self.pids {
                g.pids = used
                    .iter()
                    .take(MAX_PROCESSES)
                    .map(|(&pid, u)| ProcessRef {
                        pid,
                        used_memory_bytes: u.vram_bytes(),
                    })
                    .collect();
            }
            if self.per_process {
                g.process_memory = Some(
                    used.iter()
                        .take(MAX_PROCESSES)
                        .map(|(&pid, u)| ProcessSample {
                            pid,
                            name: comm(&self.proc, pid),
                            used_memory_bytes: u.vram_bytes(),
                        })
                        .collect(),
                );
            }
        }
    }

    fn read_card(&mut self, i: usize, index: u32) -> GpuSample {
        let dir = self.cards[i].dir.clone();
        // A GPU whose files are gone (unbound, fallen off the bus) is lost.
        if read_text(&dir.join("vendor")).is_err() {
            self.metrics.error(SampleError::GpuLost);
            if self.logged.insert((i, "device")) {
                tracing::error!(gpu = index, dir = %dir.display(), "AMD GPU gone from sysfs; gpu_up is 0 until it is back");
            }
            let c = &mut self.cards[i];
            // A GPU bound again may have another hwmon directory.
            c.hwmon = None;
            return GpuSample {
                index,
                vendor: Vendor::Amd,
                uuid: c.uuid.clone().unwrap_or_default(),
                name: c.name.clone(),
                pci_bus_id: c.pci_bus_id.clone(),
                up: false,
                lost: true,
                ..GpuSample::default()
            };
        }
        self.logged.remove(&(i, "device"));
        self.cards[i].identify();
        let mut r = Reader {
            src: self,
            i,
            index,
            dir: &dir,
        };
        r.read()
    }
}

/// How many AMD GPUs driven by amdgpu are under `sysfs` (nothing else is read).
pub fn count(sysfs: &Path) -> usize {
    find(sysfs).len()
}

/// The AMD GPUs under `sysfs`, in card order.
fn find(sysfs: &Path) -> Vec<Card> {
    let Ok(entries) = std::fs::read_dir(sysfs.join("class/drm")) else {
        return Vec::new();
    };
    let mut cards: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let n: u32 = name.to_str()?.strip_prefix("card")?.parse().ok()?;
            Some((n, e.path().join("device")))
        })
        .filter(|(_, dir)| is_amdgpu(dir))
        .collect();
    cards.sort_by_key(|(n, _)| *n);
    cards.truncate(MAX_CARDS);
    cards
        .into_iter()
        .map(|(_, dir)| Card {
            pci_bus_id: pci_bus_id(&dir),
            dir,
            uuid: None,
            name: None,
            hwmon: None,
        })
        .collect()
}

/// The DRM nodes (`cardN`, `renderDN`) of `cards`, each with its GPU's PCI address.
fn drm_nodes(sysfs: &Path, cards: &[Card]) -> HashMap<String, String> {
    let Ok(entries) = std::fs::read_dir(sysfs.join("class/drm")) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let pci = pci_bus_id(&e.path().join("device"))?;
            cards
                .iter()
                .any(|c| c.pci_bus_id.as_deref() == Some(pci.as_str()))
                .then_some((name, pci))
        })
        .collect()
}

/// A process's name (`comm`), where it can be read.
fn comm(proc: &Path, pid: u32) -> Option<String> {
    let bytes = read_bytes(&proc.join(pid.to_string()).join("comm"), 64).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let name = text.trim_end_matches('\n');
    (!name.is_empty()).then(|| name.chars().take(64).collect())
}

/// Whether a DRM card's device is an AMD GPU driven by amdgpu.
fn is_amdgpu(dir: &Path) -> bool {
    let vendor = read_text(&dir.join("vendor"))
        .ok()
        .and_then(|t| text::vendor(&t));
    vendor == Some(VENDOR_AMD) && driver(dir).as_deref() == Some("amdgpu")
}

/// The device's driver: the name its `driver` link points at, or the `DRIVER=` of its uevent.
fn driver(dir: &Path) -> Option<String> {
    if let Ok(target) = std::fs::read_link(dir.join("driver")) {
        return Some(target.file_name()?.to_string_lossy().into_owned());
    }
    uevent(dir, "DRIVER")
}

/// The device's PCI address: the name of the directory its `device` link resolves to, or the
/// `PCI_SLOT_NAME=` of its uevent.
fn pci_bus_id(dir: &Path) -> Option<String> {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|p| text::pci_address(p.file_name()?.to_str()?))
        .or_else(|| text::pci_address(&uevent(dir, "PCI_SLOT_NAME")?))
}

fn uevent(dir: &Path, key: &str) -> Option<String> {
    let text = read_text(&dir.join("uevent")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
}

/// A sysfs text file, at most `MAX_TEXT` bytes.
fn read_text(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_TEXT)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// A binary file, at most `most` bytes.
fn read_bytes(path: &Path, most: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(most as u64)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reads one cycle of one GPU.
struct Reader<'a> {
    src: &'a mut AmdSource,
    i: usize,
    index: u32,
    dir: &'a Path,
}

impl Reader<'_> {
    /// Reading `reading` from the file at `path`, parsed by `parse` (`Some(None)`: the driver
    /// says it has no value now).
    fn file<T>(
        &mut self,
        reading: &'static str,
        path: &Path,
        parse: impl FnOnce(&str) -> Option<Option<T>>,
    ) -> Option<T> {
        if self.src.unsupported.contains(&(self.i, reading)) {
            return None;
        }
        match read_text(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.src.unsupported.insert((self.i, reading));
                None
            }
            Err(e) => {
                self.failed(reading, &e);
                None
            }
            Ok(t) => match parse(&t) {
                Some(v) => v,
                None => {
                    self.bad(reading, t.trim());
                    None
                }
            },
        }
    }

    fn failed(&mut self, reading: &'static str, e: &dyn std::fmt::Display) {
        self.src.metrics.error(SampleError::ReadFailed);
        if self.src.logged.insert((self.i, reading)) {
            tracing::warn!(gpu = self.index, reading, error = %e, "an amdgpu file could not be read; the reading is left out");
        }
    }

    fn bad(&mut self, reading: &'static str, value: &str) {
        self.src.metrics.error(SampleError::OutOfRange);
        if self.src.logged.insert((self.i, reading)) {
            let value: String = value.chars().take(64).collect();
            tracing::warn!(gpu = self.index, reading, value = %value.escape_debug(), "an amdgpu file holds what the driver never prints; the reading is left out");
        }
    }

    fn read(&mut self) -> GpuSample {
        let dir = self.dir.to_path_buf();
        let m = self.gpu_metrics();
        let some = |v: u64| Some(Some(v));
        let gpu_busy = self.file("utilization", &dir.join("gpu_busy_percent"), |t| {
            text::percent(t).map(Some)
        });
        let mem_busy = self.file("memory_utilization", &dir.join("mem_busy_percent"), |t| {
            text::percent(t).map(Some)
        });
        let total = self.file("memory", &dir.join("mem_info_vram_total"), |t| {
            text::whole(t).and_then(some)
        });
        let used = self.file("memory", &dir.join("mem_info_vram_used"), |t| {
            text::whole(t).and_then(some)
        });
        let (used, total) = match (used, total) {
            (Some(u), Some(t)) if t > 0 && u <= t => (Some(u), Some(t)),
            (Some(u), Some(t)) => {
                self.bad("memory", &format!("used {u} total {t}"));
                (None, None)
            }
            _ => (None, None),
        };
        let hwmon = self.src.cards[self.i].hwmon();
        let temps = hwmon
            .as_ref()
            .map(|h| self.temperatures(&h.temps))
            .unwrap_or_default();
        let hwmon = hwmon.map(|h| h.dir);
        let power = hwmon.as_deref().and_then(|h| self.power(h));
        let limit = hwmon.as_deref().and_then(|h| {
            self.file("power_limit", &h.join("power1_cap"), |t| {
                if t.trim().is_empty() {
                    return Some(None);
                }
                text::whole(t).map(|uw| (uw > 0).then(|| uw as f64 / 1e6))
            })
        });
        let sclk = self.clock(hwmon.as_deref(), "sm_clock", "freq1_input", "pp_dpm_sclk");
        let mclk = self.clock(
            hwmon.as_deref(),
            "memory_clock",
            "freq2_input",
            "pp_dpm_mclk",
        );
        let (ecc_uncorrected, ecc_corrected) = self.ecc().unzip();
        let c = &self.src.cards[self.i];
        let (uuid, name, pci_bus_id) = (c.uuid.clone(), c.name.clone(), c.pci_bus_id.clone());
        GpuSample {
            index: self.index,
            vendor: Vendor::Amd,
            uuid: uuid.unwrap_or_default(),
            name,
            pci_bus_id,
            up: true,
            utilization_ratio: gpu_busy.or(m.gfx_activity),
            memory_utilization_ratio: mem_busy.or(m.umc_activity),
            memory_used_bytes: used,
            memory_free_bytes: used.zip(total).map(|(u, t)| t - u),
            memory_total_bytes: total,
            temperature_celsius: temps
                .edge
                .or(temps.junction)
                .or(m.temperature_edge)
                .or(m.temperature_hotspot),
            memory_temperature_celsius: temps.mem.or(m.temperature_mem),
            power_watts: power.or(m.socket_power_watts),
            power_limit_watts: limit,
            energy_joules: m.energy_joules,
            sm_clock_hertz: sclk.or(m.gfxclk_hz),
            memory_clock_hertz: mclk.or(m.uclk_hz),
            ecc_corrected,
            ecc_uncorrected,
            pcie_link: self.pcie_link(),
            unsupported: self.unsupported(),
            ..GpuSample::default()
        }
    }

    /// The `gpu_metrics` table, or nothing: a version gpuwatch does not read is said once.
    fn gpu_metrics(&mut self) -> metrics::Metrics {
        let reading = "gpu_metrics";
        if self.src.unsupported.contains(&(self.i, reading)) {
            return metrics::Metrics::default();
        }
        match read_bytes(&self.dir.join(reading), metrics::MAX_BYTES) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.src.unsupported.insert((self.i, reading));
                metrics::Metrics::default()
            }
            Err(e) => {
                self.failed(reading, &e);
                metrics::Metrics::default()
            }
            Ok(bytes) => match metrics::parse(&bytes) {
                Ok(m) => m,
                Err(metrics::Unread::Version(format, content, size)) => {
                    if self.src.logged.insert((self.i, reading)) {
                        tracing::info!(gpu = self.index, version = %format!("{format}.{content}"), size, "this gpu_metrics version is not one gpuwatch reads; its readings come from the other files");
                    }
                    metrics::Metrics::default()
                }
                Err(metrics::Unread::Truncated) => {
                    self.bad(reading, &format!("{} bytes", bytes.len()));
                    metrics::Metrics::default()
                }
            },
        }
    }

    /// The hwmon temperatures by label, in degrees Celsius.
    fn temperatures(&mut self, inputs: &[(Sensor, PathBuf)]) -> Temperatures {
        let mut t = Temperatures::default();
        for (sensor, path) in inputs {
            let slot = match sensor {
                Sensor::Edge => &mut t.edge,
                Sensor::Junction => &mut t.junction,
                Sensor::Mem => &mut t.mem,
            };
            let millis = self.file("temperature", path, |t| {
                let v: i64 = t.trim().parse().ok()?;
                Some((0..=200_000).contains(&v).then_some(v as f64 / 1000.0))
            });
            *slot = millis;
        }
        t
    }

    /// The power: averaged where the driver gives that, else now; microwatts, as watts.
    fn power(&mut self, hwmon: &Path) -> Option<f64> {
        let watts = |t: &str| text::whole(t).map(|uw| Some(uw as f64 / 1e6));
        let average = hwmon.join("power1_average");
        if average.exists() {
            return self.file("power", &average, watts);
        }
        self.file("power", &hwmon.join("power1_input"), watts)
    }

    /// A clock from hwmon (Hz), or the active level of a DPM table.
    fn clock(
        &mut self,
        hwmon: Option<&Path>,
        reading: &'static str,
        input: &str,
        dpm: &str,
    ) -> Option<f64> {
        if let Some(path) = hwmon.map(|h| h.join(input)).filter(|p| p.exists()) {
            return self.file(reading, &path, |t| text::whole(t).map(|hz| Some(hz as f64)));
        }
        self.file(reading, &self.dir.join(dpm), |t| {
            text::active_clock_hz(t).map(Some)
        })
    }

    /// Uncorrectable and correctable errors summed over every RAS block; unknown this cycle if
    /// any block cannot be read (a partial sum would look like a counter going back).
    fn ecc(&mut self) -> Option<(u64, u64)> {
        let reading = "ecc";
        if self.src.unsupported.contains(&(self.i, reading)) {
            return None;
        }
        let entries = match std::fs::read_dir(self.dir.join("ras")) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.src.unsupported.insert((self.i, reading));
                return None;
            }
            Err(e) => {
                self.failed(reading, &e);
                return None;
            }
            Ok(entries) => entries,
        };
        let mut blocks: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with("_err_count"))
            })
            .collect();
        blocks.sort();
        blocks.truncate(64);
        if blocks.is_empty() {
            self.src.unsupported.insert((self.i, reading));
            return None;
        }
        let (mut ue, mut ce) = (0u64, 0u64);
        for path in blocks {
            let text = match read_text(&path) {
                Ok(t) => t,
                Err(e) => {
                    self.failed(reading, &e);
                    return None;
                }
            };
            match text::ras_counts(&text) {
                Some(Some((u, c))) => {
                    ue = ue.saturating_add(u);
                    ce = ce.saturating_add(c);
                }
                Some(None) => return None,
                None => {
                    self.bad(reading, text.trim());
                    return None;
                }
            }
        }
        Some((ue, ce))
    }

    fn pcie_link(&mut self) -> PcieLink {
        let dir = self.dir.to_path_buf();
        PcieLink {
            generation: self.file(
                "pcie_link",
                &dir.join("current_link_speed"),
                text::link_generation,
            ),
            max_generation: self.file(
                "pcie_link",
                &dir.join("max_link_speed"),
                text::link_generation,
            ),
            width: self.file(
                "pcie_link",
                &dir.join("current_link_width"),
                text::link_width,
            ),
            max_width: self.file("pcie_link", &dir.join("max_link_width"), text::link_width),
        }
    }

    fn unsupported(&self) -> Vec<&'static str> {
        super::unsupported_of(&self.src.unsupported, self.i)
    }
}

/// The hwmon temperatures by label.
#[derive(Default)]
struct Temperatures {
    edge: Option<f64>,
    junction: Option<f64>,
    mem: Option<f64>,
}

/// The temperature inputs of an hwmon directory whose label gpuwatch reads (`temp<N>_label`:
/// `edge`, `junction`, `mem`).
fn labelled(hwmon: &Path) -> Vec<(Sensor, PathBuf)> {
    (1..=8)
        .filter_map(|n| {
            let label = read_text(&hwmon.join(format!("temp{n}_label"))).ok()?;
            let sensor = match label.trim() {
                "edge" => Sensor::Edge,
                "junction" => Sensor::Junction,
                "mem" => Sensor::Mem,
                _ => return None,
            };
            Some((sensor, hwmon.join(format!("temp{n}_input"))))
        })
        .collect()
}

/// The device's amdgpu hwmon directory.
fn hwmon(dir: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir.join("hwmon"))
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .find(|h| read_text(&h.join("name")).is_ok_and(|n| n.trim() == "amdgpu"))
}
