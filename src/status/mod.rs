//! What an operator asks of a node at a glance, before a machine goes down, and afterwards: the
//! GPUs, NVML, the node, each rule and its pending action (with the command that holds it),
//! holds, spend against budgets, and the last audit events in words. One model serves the
//! status page (`page`), `/api/v1/status` and `gpuwatch status` (`text`).

pub mod page;
pub mod text;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::gpu::sampler::Snapshots;
use crate::gpu::Snapshot;
use crate::spend::metrics::SharedCostView;
use crate::watch::metrics::SharedWatchView;

/// Below this utilization, with a compute process running, a GPU is underfed rather than idle
/// (the `GpuwatchGpuUnderutilized` alert uses the same line over 30 minutes).
pub const UNDERUTILIZED_BELOW: f64 = 0.6;

/// A GPU at or above this utilization whose SMs are active below `SPINNING_SM_BELOW` of the
/// time reads busy while doing almost nothing: a process spins on a tiny kernel.
pub const SPINNING_UTILIZATION: f64 = 0.9;
pub const SPINNING_SM_BELOW: f64 = 0.1;

/// The audit events the status shows.
pub const EVENTS: usize = 20;

/// The state of a node, as `/api/v1/status` serves it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    /// The sample this status is built on (0: none yet); a long-poll waits for a newer one.
    pub seq: u64,
    /// When that sample was taken, Unix seconds.
    pub at: f64,
    /// When this status was put together, Unix seconds: the clock countdowns run on.
    pub now: f64,
    pub health: Health,
    pub nvml: Nvml,
    pub node: NodeInfo,
    pub gpus: Vec<GpuStatus>,
    /// Whether the cost watch runs (rules, budgets or a cloud are configured).
    pub watching: bool,
    pub rules: Vec<RuleStatus>,
    pub holds: Vec<crate::state::Hold>,
    /// When a spot interruption notice says the instance goes, Unix seconds.
    pub interruption: Option<f64>,
    pub cost: Cost,
    /// The last audit events, oldest first.
    pub events: Vec<RecentEvent>,
    /// With `[slurm]`: each job holding a GPU, its user, its GPUs, and what their idle time
    /// cost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobStatus>,
}

/// A Slurm job on the node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub job: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Its devices: `0`, or `0:1` for GPU instance 1 of GPU 0.
    pub gpus: Vec<String>,
    /// GPU-seconds its GPUs sat idle while it held them.
    pub idle_seconds: f64,
    /// What that cost; `None` while the price is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_dollars: Option<f64>,
}

/// The one-word summary that `gpuwatch status` exits with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Everything is fine.
    #[default]
    Ok,
    /// An action is in its warning period.
    Pending,
    /// NVML or a GPU is down (or no sample has been taken yet).
    Down,
    /// Not known: the daemon is down, and only its state files were read.
    Unknown,
}

impl Health {
    /// `gpuwatch status`'s exit status: 0, 1 or 2.
    pub fn exit_code(self) -> u8 {
        match self {
            Health::Ok => 0,
            Health::Pending => 1,
            Health::Down => 2,
            Health::Unknown => 3,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Nvml {
    pub up: bool,
    pub driver: Option<String>,
    pub error: Option<String>,
    /// The node has no NVIDIA driver, and its other GPUs are read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub absent: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub hostname: String,
    pub instance_id: Option<String>,
    pub instance_type: Option<String>,
    pub availability_zone: Option<String>,
    pub lifecycle: Option<String>,
    /// `[node] labels` and the instance tags copied as labels.
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    pub index: u32,
    pub uuid: String,
    pub name: Option<String>,
    pub up: bool,
    /// 0 to 1.
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    /// Compute processes on it.
    pub process_count: Option<u32>,
    pub processes: Vec<Process>,
    /// How long it has been idle without a break; `None` while busy or unknown.
    pub idle_seconds: Option<f64>,
    /// Busy, but underfed: see [`UNDERUTILIZED_BELOW`].
    pub underutilized: bool,
    /// The share of time its SMs had work (GPM, Hopper and later), 0 to 1.
    pub sm_active: Option<f64>,
    /// Busy by utilization while its SMs are nearly idle: see [`SPINNING_UTILIZATION`].
    /// Absent from an older daemon's status.
    #[serde(default)]
    pub spinning: bool,
    /// Its MIG devices, while MIG mode is on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigStatus>,
    /// Its health and problems; `None` while unknown (or from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<GpuHealthStatus>,
}

/// A GPU's health, as `/api/v1/status`, `/api/v1/health` and `gpuwatch status` show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuHealthStatus {
    /// `healthy`, `degraded` or `unhealthy`.
    pub state: String,
    /// Worst first.
    pub problems: Vec<ProblemStatus>,
}

/// One problem of a GPU, in words, with what fixes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProblemStatus {
    /// The `problem` label of `gpu_health_problem`: `xid_79`, `row_remap_failed`, ...
    pub problem: String,
    /// `degraded` or `unhealthy`.
    pub severity: String,
    /// The recommended action: `none`, `restart_app`, `reset_gpu`, `reboot_node` or
    /// `report_hardware` (for an XID, NVIDIA's catalog's).
    pub action: String,
    pub words: String,
    /// When an XID was seen, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<f64>,
}

impl GpuHealthStatus {
    pub fn new(h: &crate::health::GpuHealth) -> GpuHealthStatus {
        GpuHealthStatus {
            state: h.state.as_str().to_string(),
            problems: h
                .problems
                .iter()
                .map(|f| ProblemStatus {
                    problem: f.label.clone(),
                    severity: f.severity.as_str().to_string(),
                    action: f.action.as_str().to_string(),
                    words: f.words.clone(),
                    since: f.since,
                })
                .collect(),
        }
    }

    /// The action in words: "reset the GPU".
    pub fn action_words(p: &ProblemStatus) -> &'static str {
        crate::health::Action::parse(&p.action).map_or("", crate::health::Action::words)
    }
}

/// `/api/v1/health`: the node's health and each GPU's, with its problems and what fixes them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthReport {
    /// The sample it is built on.
    pub seq: u64,
    pub at: f64,
    /// The worst GPU state; `None` while no GPU's health is known.
    pub node: Option<String>,
    pub gpus: Vec<GpuHealthEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuHealthEntry {
    pub index: u32,
    pub uuid: String,
    /// `None` while unknown: never healthy by default.
    pub state: Option<String>,
    pub problems: Vec<ProblemStatus>,
}

impl HealthReport {
    pub fn new(snap: &Snapshot) -> HealthReport {
        let node = crate::health::node(snap.gpus.iter().filter_map(|g| g.health.as_ref()));
        HealthReport {
            seq: snap.seq,
            at: snap.timestamp,
            node: node.map(|s| s.as_str().to_string()),
            gpus: snap
                .gpus
                .iter()
                .map(|g| {
                    let h = g.health.as_ref().map(GpuHealthStatus::new);
                    GpuHealthEntry {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        state: h.as_ref().map(|h| h.state.clone()),
                        problems: h.map(|h| h.problems).unwrap_or_default(),
                    }
                })
                .collect(),
        }
    }
}

/// A MIG device, shown under its GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigStatus {
    pub uuid: String,
    /// Such as `3g.40gb`.
    pub profile: Option<String>,
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub process_count: Option<u32>,
    /// Its GPU instance's SM activity (GPM), 0 to 1.
    pub sm_active: Option<f64>,
    pub idle_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleStatus {
    pub name: String,
    /// The rule in words.
    pub summary: String,
    pub breaching: bool,
    /// Its last complete periods: how many breach, of how many, and how many it takes.
    pub counted: Option<gpuwatch_core::step::Counted>,
    pub pending: Option<PendingAction>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PendingAction {
    pub action: String,
    pub warned_at: f64,
    pub due_at: f64,
    /// The exact command that postpones it.
    pub hold_command: String,
    /// What calls it off, the words after "unless" (`Rule::calls_off`).
    #[serde(default = "idle_calls_off")]
    pub unless: String,
}

/// What calls an idle rule's action off: what a status from before `unless` was kept means.
fn idle_calls_off() -> String {
    "the GPUs are used again".to_string()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub usd_per_hour: Option<f64>,
    pub price_source: Option<String>,
    /// Spent in this budget period, USD.
    pub spent: Option<f64>,
    pub forecast: Option<f64>,
    /// USD spent on idle GPUs since gpuwatch started tracking.
    pub idle_dollars: f64,
    /// USD spent on unhealthy GPUs since gpuwatch started tracking.
    #[serde(default)]
    pub unhealthy_dollars: f64,
    pub budgets: Vec<BudgetStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetStatus {
    pub name: String,
    pub limit_usd: f64,
    pub spent_ratio: Option<f64>,
    pub forecast_ratio: Option<f64>,
    pub thresholds: Vec<f64>,
    /// Why the spend is unknown (a Prometheus budget that gave no usable answer): such a
    /// budget tightens no rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecentEvent {
    /// Unix seconds, when the record says.
    pub at: Option<f64>,
    pub text: String,
}

/// Where the daemon's status comes from; cheap to clone.
#[derive(Clone)]
pub struct Sources {
    pub snapshots: Snapshots,
    pub watch: Arc<SharedWatchView>,
    pub cost: Arc<SharedCostView>,
    /// The audit log, when the cost watch runs.
    pub audit: Option<PathBuf>,
    pub watching: bool,
    pub hostname: String,
    /// Each budget's alert thresholds.
    pub thresholds: BTreeMap<String, Vec<f64>>,
    /// What `gpuwatch hold` needs to find this daemon's state directory.
    pub config_path: PathBuf,
    /// How far the decision loop has come: a status waits (briefly) for its view of a sample.
    pub progress: Option<Arc<crate::watch::progress::Progress>>,
    /// The last events read, and the audit file's identity and size when they were read.
    pub events: Arc<std::sync::Mutex<EventsCache>>,
    /// Which jobs hold which GPU, with `[slurm]`.
    pub holders: Option<Arc<crate::slurm::holders::SharedHolders>>,
}

/// Recent audit events, read again only when the file changes.
#[derive(Debug, Default)]
pub struct EventsCache {
    key: Option<(u64, u64, i64, i64)>,
    events: Vec<RecentEvent>,
}

impl Sources {
    /// What the status page and `/api/v1/status` read, from the daemon's parts.
    pub fn new(
        config: &crate::config::Config,
        snapshots: Snapshots,
        watch: &crate::watch::Started,
    ) -> Sources {
        let running = watch.task.is_some();
        Sources {
            snapshots,
            watch: Arc::clone(&watch.view),
            cost: Arc::clone(&watch.cost),
            audit: watch.audit.clone().filter(|_| running),
            watching: running,
            hostname: crate::exposition::hostname(config),
            thresholds: config
                .budgets
                .iter()
                .map(|b| (b.name.clone(), b.thresholds.clone()))
                .collect(),
            // Absolute, so that the `gpuwatch hold --config` it shows works from anywhere.
            config_path: std::fs::canonicalize(&config.path).unwrap_or(config.path.clone()),
            progress: running.then(|| Arc::clone(&watch.progress)),
            events: Arc::default(),
            holders: watch.holders.clone().filter(|_| config.slurm.enabled),
        }
    }

    /// The status now. Reads the tail of the audit log (bounded), so call it off the async
    /// workers.
    pub fn gather(&self) -> Status {
        let snap = self.snapshots.latest();
        let watch = self.watch.view();
        let cost = self.cost.view();
        let mut status = from_snapshot(&snap);
        status.node.hostname.clone_from(&self.hostname);
        if let Some(n) = &watch.node {
            status.node.instance_id = Some(n.instance_id.clone());
            status.node.instance_type = Some(n.instance_type.clone());
            status.node.availability_zone = Some(n.availability_zone.clone());
            status.node.lifecycle = Some(n.lifecycle_label().to_string());
        }
        for l in watch.labels.iter().chain(&watch.tag_labels) {
            status.node.labels.insert(l.name.clone(), l.value.clone());
        }
        let idle = |gpu: u32, uuid: &str| {
            watch
                .gpu_idle
                .iter()
                .find(|i| i.gpu == gpu && i.uuid == uuid && i.seconds > 0.0)
                .map(|i| i.seconds)
        };
        for g in &mut status.gpus {
            g.idle_seconds = idle(g.index, &g.uuid);
            for m in &mut g.mig {
                m.idle_seconds = idle(g.index, &m.uuid);
            }
        }
        status.watching = self.watching;
        let hold = hold_command(&self.config_path);
        status.rules = watch
            .rules
            .iter()
            .map(|r| RuleStatus {
                name: r.name.clone(),
                summary: r.summary.clone(),
                breaching: r.breaching,
                counted: r.counted,
                pending: r.pending.as_ref().map(|p| PendingAction {
                    action: p.action.to_string(),
                    warned_at: p.warned_at,
                    due_at: p.due_at,
                    hold_command: hold.clone(),
                    unless: r.calls_off.clone(),
                }),
            })
            .collect();
        status.holds.clone_from(&watch.holds);
        status.interruption = watch.interruption;
        status.cost = Cost {
            usd_per_hour: cost.price.map(|p| p.usd_per_hour),
            price_source: cost.price.map(|p| p.source.as_str().to_string()),
            spent: cost.spent,
            forecast: cost.forecast,
            idle_dollars: cost.idle_dollars,
            unhealthy_dollars: cost.unhealthy_dollars,
            budgets: cost
                .budgets
                .iter()
                .map(|b| BudgetStatus {
                    name: b.name.clone(),
                    limit_usd: b.limit,
                    spent_ratio: b.spent_ratio,
                    forecast_ratio: b.forecast_ratio,
                    thresholds: self.thresholds.get(&b.name).cloned().unwrap_or_default(),
                    unknown: b.unknown.clone(),
                })
                .collect(),
        };
        if let Some(audit) = &self.audit {
            status.events = self.recent_events(audit);
        }
        if let Some(h) = &self.holders {
            status.jobs = jobs(&h.view(), &cost);
        }
        status.now = crate::time::now();
        status.health = health(&status);
        status
    }
}

impl Sources {
    /// The last events of the audit log, from the cache while the file is unchanged.
    fn recent_events(&self, audit: &Path) -> Vec<RecentEvent> {
        use std::os::unix::fs::MetadataExt;
        let key = std::fs::metadata(audit)
            .ok()
            .map(|m| (m.ino(), m.len(), m.mtime(), m.mtime_nsec()));
        let Ok(mut cache) = self.events.lock() else {
            return recent_events(audit, EVENTS);
        };
        if key.is_none() || cache.key != key {
            cache.events = recent_events(audit, EVENTS);
            cache.key = key;
        }
        cache.events.clone()
    }
}

/// The jobs on the node: their GPUs from the holders, their idle time and money from the
/// decision step (none before it has judged them).
fn jobs(
    h: &crate::slurm::holders::Holders,
    cost: &crate::spend::metrics::CostView,
) -> Vec<JobStatus> {
    h.jobs
        .iter()
        .map(|(job, j)| {
            let tally = cost.jobs.iter().find(|(id, _, _)| id == job).map(|x| x.2);
            JobStatus {
                job: job.clone(),
                user: j.user.clone(),
                gpus: j
                    .devices
                    .iter()
                    .map(|((gpu, gi), _)| crate::rules::device_label(*gpu, *gi))
                    .collect(),
                idle_seconds: tally.map_or(0.0, |t| t.idle_seconds),
                idle_dollars: cost.price.map(|_| tally.map_or(0.0, |t| t.idle_dollars)),
            }
        })
        .collect()
}

/// The GPU and NVML part of a status, from one sample.
pub fn from_snapshot(snap: &Snapshot) -> Status {
    let gpus = snap
        .gpus
        .iter()
        .map(|g| GpuStatus {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            up: g.up,
            utilization: g.utilization_ratio,
            memory_used_bytes: g.memory_used_bytes,
            memory_total_bytes: g.memory_total_bytes,
            temperature_celsius: g.temperature_celsius,
            power_watts: g.power_watts,
            power_limit_watts: g.power_limit_watts,
            process_count: g.processes,
            processes: g
                .process_memory
                .iter()
                .flatten()
                .map(|p| Process {
                    pid: p.pid,
                    name: p.name.clone(),
                    used_memory_bytes: p.used_memory_bytes,
                })
                .collect(),
            idle_seconds: None,
            underutilized: g.up
                && g.processes.is_some_and(|n| n > 0)
                && g.utilization_ratio.is_some_and(|u| u < UNDERUTILIZED_BELOW),
            sm_active: g.gpm.as_ref().and_then(|m| m.sm_active),
            spinning: g.up
                && g.utilization_ratio
                    .is_some_and(|u| u >= SPINNING_UTILIZATION)
                && g.gpm
                    .as_ref()
                    .and_then(|m| m.sm_active)
                    .is_some_and(|sm| sm < SPINNING_SM_BELOW),
            mig: g
                .mig
                .iter()
                .map(|m| MigStatus {
                    uuid: m.uuid.clone(),
                    profile: m.profile.clone(),
                    gpu_instance: m.gpu_instance,
                    compute_instance: m.compute_instance,
                    memory_used_bytes: m.memory_used_bytes,
                    memory_total_bytes: m.memory_total_bytes,
                    process_count: m.processes,
                    sm_active: m.gpm.as_ref().and_then(|x| x.sm_active),
                    idle_seconds: None,
                })
                .collect(),
            health: g.health.as_ref().map(GpuHealthStatus::new),
        })
        .collect();
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        seq: snap.seq,
        at: snap.timestamp,
        nvml: Nvml {
            up: snap.nvml.up,
            driver: snap.nvml.driver_version.clone(),
            error: snap.nvml.error.clone(),
            absent: snap.nvml.absent,
        },
        gpus,
        ..Status::default()
    }
}

/// Down when NVML or a GPU is (or nothing is sampled yet); else pending while an action waits.
pub fn health(s: &Status) -> Health {
    if s.seq == 0 || !(s.nvml.up || s.nvml.absent) || s.gpus.iter().any(|g| !g.up) {
        Health::Down
    } else if s.rules.iter().any(|r| r.pending.is_some()) {
        Health::Pending
    } else {
        Health::Ok
    }
}

/// The command that holds every action of the daemon that reads `config`: for an hour, which
/// the operator edits to taste.
///
/// A config read through a systemd credential (the unit's `LoadCredential=` copy of
/// `/etc/gpuwatch/gpuwatch.toml`) is named by the default path, which the operator reads.
pub fn hold_command(config: &Path) -> String {
    let mut command = "gpuwatch hold 1h --reason \"still in use\"".to_string();
    let credential = std::env::var_os("CREDENTIALS_DIRECTORY")
        .is_some_and(|d| !d.is_empty() && config.starts_with(d));
    if !config.as_os_str().is_empty()
        && config != Path::new(crate::config::DEFAULT_PATH)
        && !credential
    {
        command.push_str(" --config ");
        command.push_str(&shell_quote(&config.to_string_lossy()));
    }
    command
}

/// Quotes a word for a POSIX shell when it needs it.
fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:=@,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// The last `n` events of the audit log, in words.
pub fn recent_events(path: &Path, n: usize) -> Vec<RecentEvent> {
    crate::state::audit::recent(path, n)
        .iter()
        .map(|e| RecentEvent {
            at: e.time(),
            text: e.sentence(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_command_names_a_config_that_is_not_the_default() {
        assert_eq!(
            hold_command(Path::new(crate::config::DEFAULT_PATH)),
            "gpuwatch hold 1h --reason \"still in use\""
        );
        assert_eq!(
            hold_command(Path::new("/tmp/demo 1/it's.toml")),
            "gpuwatch hold 1h --reason \"still in use\" --config '/tmp/demo 1/it'\\''s.toml'"
        );
    }

    #[test]
    fn recent_events_are_the_last_records_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut text = String::from("not json\n");
        for i in 0..30 {
            text.push_str(&format!(
                "{{\"time\":\"2026-11-30T14:{i:02}:00Z\",\"event\":\"cancelled\",\"rule\":\"r{i}\",\"action\":\"stop\",\"reason\":\"busy\"}}\n"
            ));
        }
        std::fs::write(&path, text).unwrap();
        let events = recent_events(&path, EVENTS);
        assert_eq!(events.len(), EVENTS);
        assert!(events[0].text.contains("r10"), "{:?}", events[0]);
        assert!(events[19].text.contains("r29"), "{:?}", events[19]);
        assert!(events[19].at.is_some());
    }
}
