//! GPU health: each GPU's problems, how bad each is, and the state they add up to (`healthy`,
//! `degraded` or `unhealthy`), with the action that fixes each.
//!
//! Pure, as the rest of the core: the readings and the time come in, the health goes out. What
//! has to be remembered between samples is `Memory`: the XIDs held against a GPU until it is
//! reset (the daemon keeps these in `state.json`), and the last readings that a problem needs a
//! change of (XID counts, throttle counters), or that a failed read must not forget.

pub mod catalog;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use catalog::Action;

/// A GPU's health, worst last: the order makes `max` the worst of several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Healthy,
    Degraded,
    Unhealthy,
}

impl State {
    pub const ALL: [State; 3] = [State::Healthy, State::Degraded, State::Unhealthy];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Degraded => "degraded",
            State::Unhealthy => "unhealthy",
        }
    }
}

/// Something wrong with a GPU, as NVML shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    /// The GPU answers `GPU_IS_LOST`, or cannot be reached: fallen off the bus.
    Lost,
    /// An XID the catalog says needs a reset or a reboot, or points to the hardware; held
    /// until the GPU is reset.
    Xid(u64),
    /// A memory row could not be remapped: the GPU has run out of spare rows.
    RowRemapFailed,
    /// A row remapping waits for a GPU reset.
    RowRemapPending,
    /// Memory pages wait for a GPU reset to be retired (GPUs before Ampere).
    RetiredPagesPending,
    /// Uncorrectable (double-bit) ECC errors since the last reset.
    UncorrectableEcc,
    /// The PCIe link runs below its maximum width, or (while the GPU is busy) generation.
    PcieLinkDegraded,
    /// Thermal limits held the clocks down for more than the allowed share of the last interval.
    ThermalThrottling,
    /// Power limits held the clocks down for more than the allowed share of the last interval.
    PowerThrottling,
}

impl Problem {
    /// The label value: `lost`, `xid_79`, `row_remap_failed`, ...
    pub fn label(self) -> String {
        match self {
            Problem::Lost => "lost".into(),
            Problem::Xid(code) => format!("xid_{code}"),
            Problem::RowRemapFailed => "row_remap_failed".into(),
            Problem::RowRemapPending => "row_remap_pending".into(),
            Problem::RetiredPagesPending => "retired_pages_pending".into(),
            Problem::UncorrectableEcc => "uncorrectable_ecc".into(),
            Problem::PcieLinkDegraded => "pcie_link_degraded".into(),
            Problem::ThermalThrottling => "thermal_throttling".into(),
            Problem::PowerThrottling => "power_throttling".into(),
        }
    }

    /// How bad the problem is: the state it puts its GPU in at least.
    pub fn severity(self) -> State {
        match self {
            Problem::Lost
            | Problem::Xid(_)
            | Problem::RowRemapFailed
            | Problem::UncorrectableEcc => State::Unhealthy,
            Problem::RowRemapPending
            | Problem::RetiredPagesPending
            | Problem::PcieLinkDegraded
            | Problem::ThermalThrottling
            | Problem::PowerThrottling => State::Degraded,
        }
    }

    /// What fixes it: the catalog's action for an XID, gpuwatch's own for the rest.
    pub fn action(self) -> Action {
        match self {
            // On EC2, a stop and a start moves the instance to new hardware.
            Problem::Lost => Action::RebootNode,
            Problem::Xid(code) => catalog::xid(code).map_or(Action::ReportHardware, |x| x.action),
            Problem::RowRemapFailed | Problem::PcieLinkDegraded | Problem::ThermalThrottling => {
                Action::ReportHardware
            }
            Problem::RowRemapPending | Problem::RetiredPagesPending | Problem::UncorrectableEcc => {
                Action::ResetGpu
            }
            Problem::PowerThrottling => Action::None,
        }
    }

    /// The problem in words, for people.
    pub fn words(self) -> String {
        match self {
            Problem::Lost => "the GPU fell off the bus or does not answer".into(),
            Problem::Xid(code) => match catalog::xid(code) {
                Some(x) => format!("XID {code}: {}", x.meaning),
                None => format!("XID {code}"),
            },
            Problem::RowRemapFailed => {
                "a memory row could not be remapped: the GPU has no spare rows left".into()
            }
            Problem::RowRemapPending => "a memory row remapping waits for a GPU reset".into(),
            Problem::RetiredPagesPending => "memory pages wait for a GPU reset to retire".into(),
            Problem::UncorrectableEcc => {
                "uncorrectable ECC errors since the GPU was last reset".into()
            }
            Problem::PcieLinkDegraded => "the PCIe link runs below its maximum".into(),
            Problem::ThermalThrottling => "thermal limits hold the clocks down".into(),
            Problem::PowerThrottling => "power limits hold the clocks down".into(),
        }
    }
}

/// What health is judged with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// How long an XID holds its GPU unhealthy when no reset is seen, in seconds.
    pub xid_hold: f64,
    /// The share of an interval the clocks may be held down (thermal, or power) before the GPU
    /// counts as throttling.
    pub throttle_share: f64,
    /// The utilization from which a PCIe generation below the maximum counts (an idle GPU's
    /// link slows down to save power, and that is no fault).
    pub busy: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            xid_hold: 24.0 * 3600.0,
            throttle_share: 0.5,
            busy: 0.1,
        }
    }
}

/// One GPU's readings that health is judged from; `None` is unknown (failed, or not supported).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Readings {
    pub index: u32,
    /// Empty for a GPU lost before its UUID was ever read.
    pub uuid: String,
    /// The GPU answered; `false` is lost.
    pub up: bool,
    /// XIDs seen since the daemon started, by code.
    pub xids: BTreeMap<u64, u64>,
    /// Volatile ECC error counts (since the last reset).
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub remap_failed: Option<bool>,
    pub remap_pending: Option<bool>,
    pub retired_pending: Option<bool>,
    pub pcie_generation: Option<u32>,
    pub pcie_max_generation: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_max_width: Option<u32>,
    pub utilization: Option<f64>,
    /// Seconds held down since the driver loaded, by thermal and by power limits.
    pub thermal_seconds: Option<f64>,
    pub power_seconds: Option<f64>,
    /// Energy since the driver loaded: it only grows, so a value below an earlier one shows a
    /// driver reload or a reset.
    pub energy_joules: Option<f64>,
}

/// An XID held against a GPU until it is reset, or until `Settings::xid_hold` has passed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidHold {
    pub xid: u64,
    /// When it was seen (Unix seconds).
    pub since: f64,
    /// The volatile ECC total (corrected and uncorrected) then: a reset sets it to 0, so a
    /// total below a non-zero one shows the GPU was reset.
    #[serde(default)]
    pub ecc: Option<u64>,
    /// The energy since the driver loaded, then: a value below it shows a reload or a reset.
    #[serde(default)]
    pub energy: Option<f64>,
}

/// The most XIDs held per GPU, and GPUs with holds; beyond, the oldest go.
const MAX_HOLDS: usize = 32;
const MAX_GPUS: usize = 64;

/// What health remembers between samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// The XIDs held against each GPU, by UUID. Persisted.
    #[serde(default)]
    pub holds: BTreeMap<String, Vec<XidHold>>,
    /// Per GPU (by UUID), the last readings a problem needs a change of.
    #[serde(skip)]
    seen: BTreeMap<String, Seen>,
    /// Whether a sample has been judged since the daemon started: the XID counts of the first
    /// are all new (they count from the start), those of a GPU first seen later are not (they
    /// may be another GPU's, at the same index).
    #[serde(skip)]
    started: bool,
}

impl Memory {
    /// Forgets the XIDs held since before `t`: the machine booted then, and a boot resets
    /// every GPU.
    pub fn forget_before(&mut self, t: f64) {
        for holds in self.holds.values_mut() {
            holds.retain(|h| h.since >= t);
        }
        self.holds.retain(|_, holds| !holds.is_empty());
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    xids: BTreeMap<u64, u64>,
    /// (when, thermal seconds, power seconds) at the last sample that had them.
    throttle: Option<(f64, Option<f64>, Option<f64>)>,
    /// The problems found last time, for the conditions whose reading failed since.
    problems: Vec<Problem>,
}

/// One GPU's health.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuHealth {
    pub index: u32,
    pub uuid: String,
    pub state: State,
    /// Worst first, then in `Problem` order.
    pub problems: Vec<Finding>,
}

/// One problem of a GPU, with what it means and what to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    #[serde(skip)]
    pub problem: Problem,
    pub label: String,
    pub severity: State,
    pub action: Action,
    pub words: String,
    /// When an XID was seen; `None` for a condition that holds now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<f64>,
}

impl Finding {
    fn new(problem: Problem, since: Option<f64>) -> Finding {
        Finding {
            problem,
            label: problem.label(),
            severity: problem.severity(),
            action: problem.action(),
            words: problem.words(),
            since,
        }
    }
}

/// The node's health: the worst of its GPUs'; `None` without a GPU whose health is known.
pub fn node<'a>(gpus: impl IntoIterator<Item = &'a GpuHealth>) -> Option<State> {
    gpus.into_iter().map(|g| g.state).max()
}

/// Judges every GPU's health at `now`. With NVML down, no GPU's health is known: the answer is
/// empty, and never healthy; what is held stays held.
pub fn assess(
    settings: &Settings,
    memory: &mut Memory,
    nvml_up: bool,
    gpus: &[Readings],
    now: f64,
) -> Vec<GpuHealth> {
    if !nvml_up {
        return Vec::new();
    }
    let out = gpus
        .iter()
        .map(|r| assess_gpu(settings, memory, r, now))
        .collect();
    memory.started = true;
    // A GPU absent from a sample keeps what was seen of it (it may answer again); the memory
    // stays bounded all the same.
    while memory.seen.len() > MAX_GPUS {
        let Some(k) = memory.seen.keys().next().cloned() else {
            break;
        };
        memory.seen.remove(&k);
    }
    while memory.holds.len() > MAX_GPUS {
        let oldest = memory
            .holds
            .iter()
            .min_by(|a, b| latest(a.1).total_cmp(&latest(b.1)))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => memory.holds.remove(&k),
            None => break,
        };
    }
    out
}

fn latest(holds: &[XidHold]) -> f64 {
    holds
        .iter()
        .map(|h| h.since)
        .fold(f64::NEG_INFINITY, f64::max)
}

fn assess_gpu(settings: &Settings, memory: &mut Memory, r: &Readings, now: f64) -> GpuHealth {
    // A GPU first seen after the first sample takes its index's XID counts as they are: they
    // may be another GPU's, that was at this index before.
    let seen = match memory.seen.remove(&r.uuid) {
        Some(seen) => seen,
        None if memory.started => Seen {
            xids: r.xids.clone(),
            ..Seen::default()
        },
        None => Seen::default(),
    };
    let ecc_total = r.ecc_corrected.zip(r.ecc_uncorrected).map(|(c, u)| c + u);
    let mut holds = memory.holds.remove(&r.uuid).unwrap_or_default();
    // A reset (or a driver reload): a counter kept since then went back below what it was
    // when the XID came.
    holds.retain(|h| {
        let ecc_back = matches!((h.ecc, ecc_total), (Some(then), Some(now)) if then > 0 && now < then);
        let energy_back =
            matches!((h.energy, r.energy_joules), (Some(then), Some(now)) if then > 0.0 && now < then);
        !ecc_back && !energy_back && now - h.since < settings.xid_hold
    });
    // A GPU whose UUID was never read cannot be told apart: nothing is held against it.
    let xids = if r.uuid.is_empty() {
        BTreeMap::new()
    } else {
        r.xids.clone()
    };
    for (&code, &count) in &xids {
        if count <= seen.xids.get(&code).copied().unwrap_or(0) {
            continue;
        }
        if !catalog::xid(code).is_some_and(catalog::Xid::makes_unhealthy) {
            continue;
        }
        holds.retain(|h| h.xid != code);
        holds.push(XidHold {
            xid: code,
            since: now,
            ecc: ecc_total,
            energy: r.energy_joules,
        });
    }
    if holds.len() > MAX_HOLDS {
        holds.drain(..holds.len() - MAX_HOLDS);
    }

    let mut found: Vec<Finding> = holds
        .iter()
        .map(|h| Finding::new(Problem::Xid(h.xid), Some(h.since)))
        .collect();
    let mut problems: Vec<Problem> = Vec::new();
    // A condition with a reading is judged by it; one whose reading failed this time keeps
    // what it was (a failed read clears nothing); one never read is no problem.
    let mut judge = |p: Problem, holds: Option<bool>| match holds {
        Some(true) => problems.push(p),
        Some(false) => {}
        None => {
            if seen.problems.contains(&p) {
                problems.push(p);
            }
        }
    };
    let mut throttle = seen.throttle;
    if !r.up {
        judge(Problem::Lost, Some(true));
    } else {
        judge(Problem::RowRemapFailed, r.remap_failed);
        judge(Problem::RowRemapPending, r.remap_pending);
        judge(Problem::RetiredPagesPending, r.retired_pending);
        judge(Problem::UncorrectableEcc, r.ecc_uncorrected.map(|n| n > 0));
        judge(Problem::PcieLinkDegraded, pcie_degraded(settings, r));
        let (thermal, power) = throttling(settings, seen.throttle, r, now);
        judge(Problem::ThermalThrottling, thermal);
        judge(Problem::PowerThrottling, power);
        if r.thermal_seconds.is_some() || r.power_seconds.is_some() {
            throttle = Some((now, r.thermal_seconds, r.power_seconds));
        }
    }
    found.extend(problems.iter().map(|&p| Finding::new(p, None)));
    found.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.problem.cmp(&b.problem)));
    let state = found
        .iter()
        .map(|f| f.severity)
        .max()
        .unwrap_or(State::Healthy);

    if !holds.is_empty() {
        memory.holds.insert(r.uuid.clone(), holds);
    }
    memory.seen.insert(
        r.uuid.clone(),
        Seen {
            xids: r.xids.clone(),
            throttle,
            problems,
        },
    );
    GpuHealth {
        index: r.index,
        uuid: r.uuid.clone(),
        state,
        problems: found,
    }
}

/// Whether the link runs below its maximum: its width at any time, its generation while the
/// GPU is busy. `None` when a reading needed is unknown.
fn pcie_degraded(settings: &Settings, r: &Readings) -> Option<bool> {
    let narrow = r.pcie_width.zip(r.pcie_max_width).map(|(w, m)| w < m);
    if narrow == Some(true) {
        return Some(true);
    }
    let slow = r.pcie_generation? < r.pcie_max_generation?;
    if !slow {
        return narrow.map(|_| false);
    }
    Some(r.utilization? >= settings.busy)
}

/// Whether thermal and power limits held the clocks down for more than the allowed share of
/// the time since the last sample; `None` without two samples to compare.
fn throttling(
    settings: &Settings,
    last: Option<(f64, Option<f64>, Option<f64>)>,
    r: &Readings,
    now: f64,
) -> (Option<bool>, Option<bool>) {
    let Some((then, thermal, power)) = last else {
        return (None, None);
    };
    let dt = now - then;
    let share = |before: Option<f64>, after: Option<f64>| {
        let held = after? - before?;
        // A counter that went back (a driver reload) says nothing of this interval.
        (dt > 0.0 && held >= 0.0).then(|| held / dt > settings.throttle_share)
    };
    (
        share(thermal, r.thermal_seconds),
        share(power, r.power_seconds),
    )
}
