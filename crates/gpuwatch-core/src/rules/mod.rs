//! Idle rules: what they say, and the pure engine that evaluates them.
//!
//! Nothing in this module does I/O or reads a clock: time is passed in as Unix seconds, so every
//! rule can be table-tested and replayed from a trace (`gpuwatch simulate`).

pub mod engine;
pub mod window;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A validated rule: what triggers it, and what it does then.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub trigger: Trigger,
    /// Whether the rule judges the node's GPUs, or each pod's, job's or user's.
    pub scope: Scope,
    /// For a rule of a pod, job or user scope expanded for one of them: which (`namespace/pod`,
    /// a job id, a user name). The step makes these; a configured rule has none.
    pub subject: Option<String>,
    pub lifecycle: Option<Lifecycle>,
    pub action: Action,
    /// The command for `exec`.
    pub command: Vec<String>,
    /// Only act while a budget's spend is at least this share of its limit.
    pub budget: Option<BudgetGate>,
}

/// What a rule judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// The node's GPUs (`gpus = "every"` or `"any"` of them).
    #[default]
    Node,
    /// Each pod's GPUs, on Kubernetes: a pod that holds GPUs it does not use. Alerts, `exec`
    /// and `reclaim` only; the cluster autoscaler owns the node.
    Pod,
    /// Each Slurm job's GPUs: a job that holds GPUs it does not use. Alerts and `exec` only.
    Job,
    /// Each user's GPUs (those their processes, or their jobs, run on). Alerts and `exec` only.
    User,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Node => "node",
            Scope::Pod => "pod",
            Scope::Job => "job",
            Scope::User => "user",
        }
    }

    /// Who holds a device, as this scope counts holders: its pods, jobs or users.
    pub fn holders(self, g: &GpuReading) -> &[String] {
        match self {
            Scope::Node => &[],
            Scope::Pod => &g.holders,
            Scope::Job => &g.jobs,
            Scope::User => &g.users,
        }
    }
}

/// What makes a rule breach.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// The GPUs' readings meet a condition, with CloudWatch-alarm semantics.
    Idle(Condition),
    /// A budget's hard limit (`on_exhausted`): its spend reaches its limit, whatever the GPUs
    /// do. GPU activity does not cancel it.
    BudgetExhausted { budget: String },
}

/// A share as a percentage for people: exact to a millionth of a percent, so that 0.8 reads
/// "80" and not "80.00000000000001".
pub(crate) fn percent(share: f64) -> f64 {
    (share * 1e8).round() / 1e6
}

impl Rule {
    /// Whether the engine state kept under `name` is this configured rule's: its own, or, for a
    /// pod-scoped rule, that of one of its pods (`rule namespace/pod`).
    pub fn owns_state(&self, name: &str) -> bool {
        match self.scope {
            Scope::Node => name == self.name,
            Scope::Pod => name
                .strip_prefix(self.name.as_str())
                .and_then(|rest| rest.strip_prefix(' '))
                .is_some_and(|pod| pod.contains('/')),
            Scope::Job | Scope::User => name
                .strip_prefix(self.name.as_str())
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|rest| rest.strip_prefix(self.scope.as_str()))
                .and_then(|rest| rest.strip_prefix(' '))
                .is_some_and(|who| !who.is_empty()),
        }
    }

    /// The name of this rule expanded for one subject: `rule namespace/pod`, `rule job 42`,
    /// `rule user alice`.
    pub fn name_for(&self, subject: &str) -> String {
        match self.scope {
            Scope::Node | Scope::Pod => format!("{} {subject}", self.name),
            Scope::Job | Scope::User => format!("{} {} {subject}", self.name, self.scope.as_str()),
        }
    }

    /// For a rule expanded for a job or a user: what a hold of that subject is keyed by
    /// (`job 42`, `user alice`).
    pub fn hold_key(&self) -> Option<String> {
        match self.scope {
            Scope::Job | Scope::User => Some(format!(
                "{} {}",
                self.scope.as_str(),
                self.subject.as_deref()?
            )),
            Scope::Node | Scope::Pod => None,
        }
    }

    /// What a warning or an alert of this rule is for, in words, true to its cause: "GPUs
    /// idle", "the GPUs of job 42 are idle", "GPUs unhealthy", "budget \"team\" is spent".
    pub fn cause(&self) -> String {
        match &self.trigger {
            Trigger::BudgetExhausted { budget } => format!("budget \"{budget}\" is spent"),
            Trigger::Idle(c) if c.metric == Metric::GpuUnhealthy => "GPUs unhealthy".into(),
            Trigger::Idle(_) => match (self.scope, &self.subject) {
                (Scope::Job | Scope::User, Some(who)) => {
                    format!("the GPUs of {} {who} are idle", self.scope.as_str())
                }
                _ => "GPUs idle".into(),
            },
        }
    }

    /// What calls a warning of this rule off, as the words after "unless": what the engine
    /// re-judges at every sample of the warning.
    pub fn calls_off(&self) -> String {
        let mut words = match &self.trigger {
            Trigger::BudgetExhausted { .. } => {
                "its spend falls under the limit or cannot be known".to_string()
            }
            Trigger::Idle(c) if c.metric == Metric::GpuUnhealthy => {
                "the GPUs are healthy again".to_string()
            }
            Trigger::Idle(_) => match (self.scope, &self.subject) {
                (Scope::Job | Scope::User, Some(_)) => "they are used again".to_string(),
                _ => "the GPUs are used again".to_string(),
            },
        };
        if let Some(g) = &self.budget {
            words.push_str(&format!(
                ", or budget \"{}\" falls under {}% spent or cannot be known",
                g.name,
                percent(g.spent_at_least)
            ));
        }
        words
    }

    /// The rule in words, for people: "stop when every GPU's average gpu_utilization is below
    /// 5% in 2 of 2 periods of 5m".
    pub fn describe(&self) -> String {
        let when = match &self.trigger {
            Trigger::BudgetExhausted { budget } => format!("budget \"{budget}\" is spent"),
            Trigger::Idle(c) if c.metric == Metric::GpuUnhealthy => {
                let gpus = match c.gpus {
                    Aggregation::Every => "every GPU is",
                    Aggregation::Any => "any GPU is",
                };
                let how = match c.statistic {
                    Statistic::Average => "throughout",
                    Statistic::Maximum => "at any time in",
                };
                format!(
                    "{gpus} unhealthy {how} {} of {} periods of {}",
                    c.datapoints_to_alarm,
                    c.evaluation_periods,
                    humantime::format_duration(c.period)
                )
            }
            Trigger::Idle(c) => {
                let gpus = match (self.scope, c.gpus) {
                    (Scope::Pod, _) => "a pod's GPUs'",
                    (Scope::Job, _) => "a job's GPUs'",
                    (Scope::User, _) => "a user's GPUs'",
                    (_, Aggregation::Every) => "every GPU's",
                    (_, Aggregation::Any) => "any GPU's",
                };
                let statistic = match c.statistic {
                    Statistic::Average => "average",
                    Statistic::Maximum => "maximum",
                };
                let comparison = match c.comparison {
                    Comparison::LessThan => "below",
                    Comparison::LessThanOrEqual => "at most",
                    Comparison::GreaterThan => "above",
                    Comparison::GreaterThanOrEqual => "at least",
                };
                // Rounded to a millionth, so that 0.07 reads "7%", not "7.000000000000001%".
                let round = |v: f64| (v * 1e6).round() / 1e6;
                let threshold = if c.metric.is_ratio() {
                    format!("{}%", round(c.threshold * 100.0))
                } else {
                    format!("{}", round(c.threshold))
                };
                format!(
                    "{gpus} {statistic} {} is {comparison} {threshold} in {} of {} periods of {}",
                    c.metric.as_str(),
                    c.datapoints_to_alarm,
                    c.evaluation_periods,
                    humantime::format_duration(c.period)
                )
            }
        };
        let gate = self.budget.as_ref().map_or(String::new(), |g| {
            format!(
                ", once budget \"{}\" is {}% spent",
                g.name,
                percent(g.spent_at_least)
            )
        });
        format!("{} when {when}{gate}", self.action)
    }

    /// The GPU condition, for a rule triggered by one.
    pub fn condition(&self) -> Option<&Condition> {
        match &self.trigger {
            Trigger::Idle(c) => Some(c),
            Trigger::BudgetExhausted { .. } => None,
        }
    }
}

/// A condition on the GPUs' readings, judged as a CloudWatch alarm judges a metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub metric: Metric,
    pub statistic: Statistic,
    pub comparison: Comparison,
    /// In the metric's unit: a ratio from 0 to 1, or a process count.
    pub threshold: f64,
    pub period: Duration,
    pub evaluation_periods: u32,
    pub datapoints_to_alarm: u32,
    pub gpus: Aggregation,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetGate {
    pub name: String,
    pub spent_at_least: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    GpuUtilization,
    MemoryUtilization,
    MemoryUsedRatio,
    PowerRatio,
    Processes,
    /// GPM: the fraction of time the SMs had a warp resident (Hopper and later).
    SmActive,
    /// GPM: the fraction of time any tensor pipe was busy.
    TensorActive,
    /// GPM: the fraction of time the memory interface was busy.
    DramActive,
    /// 1 while the GPU is unhealthy, 0 while its health is known otherwise: rules on health
    /// stop (or alert about) a node whose GPUs broke, never an idle rule.
    GpuUnhealthy,
}

impl Metric {
    pub const ALL: [Metric; 9] = [
        Metric::GpuUtilization,
        Metric::MemoryUtilization,
        Metric::MemoryUsedRatio,
        Metric::PowerRatio,
        Metric::Processes,
        Metric::SmActive,
        Metric::TensorActive,
        Metric::DramActive,
        Metric::GpuUnhealthy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Metric::GpuUtilization => "gpu_utilization",
            Metric::MemoryUtilization => "memory_utilization",
            Metric::MemoryUsedRatio => "memory_used_ratio",
            Metric::PowerRatio => "power_ratio",
            Metric::Processes => "processes",
            Metric::SmActive => "sm_active",
            Metric::TensorActive => "tensor_active",
            Metric::DramActive => "dram_active",
            Metric::GpuUnhealthy => "gpu_unhealthy",
        }
    }

    /// Whether the threshold is a ratio (0 to 1) rather than a count.
    pub fn is_ratio(self) -> bool {
        self != Metric::Processes
    }

    /// Whether the metric comes from GPM, which only Hopper and later GPUs have.
    pub fn needs_gpm(self) -> bool {
        matches!(
            self,
            Metric::SmActive | Metric::TensorActive | Metric::DramActive
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    Average,
    Maximum,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    LessThan,
    LessThanOrEqual,
    GreaterThan,
    GreaterThanOrEqual,
}

impl Comparison {
    /// Compares with a tolerance of 1e-9, so that an average that is the threshold in exact
    /// arithmetic (60 samples of 0.05) compares as equal despite rounding.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        const EPS: f64 = 1e-9;
        let d = value - threshold;
        match self {
            Comparison::LessThan => d < -EPS,
            Comparison::LessThanOrEqual => d <= EPS,
            Comparison::GreaterThan => d > EPS,
            Comparison::GreaterThanOrEqual => d >= -EPS,
        }
    }
}

/// How the GPUs of a node combine into one datapoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// The node breaches only when every GPU does (the default: one busy GPU keeps it alive).
    Every,
    /// The node breaches when any GPU does (for alerts about a single idle GPU).
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lifecycle {
    Spot,
    OnDemand,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Spot => "spot",
            Lifecycle::OnDemand => "on-demand",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alert,
    Exec,
    /// A pod's GPUs are idle: the node daemon says so to the cluster controller (a verdict on
    /// its `/metrics`), which gives the pod's workload back. Pod-scoped rules only; the node
    /// daemon itself writes nothing to the cluster.
    Reclaim,
    Stop,
    Hibernate,
    Terminate,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alert => "alert",
            Action::Exec => "exec",
            Action::Reclaim => "reclaim",
            Action::Stop => "stop",
            Action::Hibernate => "hibernate",
            Action::Terminate => "terminate",
        }
    }
}

impl Action {
    /// The actions that take the instance down.
    pub const INSTANCE: [Action; 3] = [Action::Stop, Action::Hibernate, Action::Terminate];

    /// Whether the action takes the instance down (stop, hibernate, terminate).
    pub fn is_instance_action(self) -> bool {
        matches!(self, Action::Stop | Action::Hibernate | Action::Terminate)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One device's readings at one moment, in rule units: a whole GPU, or one MIG device of a GPU
/// in MIG mode (which is then judged as a device of its own). `None` is unknown.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    /// The GPU's index (a MIG device's parent).
    pub index: u32,
    /// The MIG device this reading is of; `None` for a whole GPU.
    pub mig: Option<MigDevice>,
    pub values: [Option<f64>; Metric::ALL.len()],
    /// The pods holding the device (`namespace/pod`), on Kubernetes.
    pub holders: Vec<String>,
    /// The Slurm jobs holding the device (job ids).
    pub jobs: Vec<String>,
    /// The users whose processes (or jobs) run on the device.
    pub users: Vec<String>,
    /// While the GPU is unhealthy: its problems in words, for a health rule's evidence.
    pub problems: Vec<String>,
}

/// A MIG device: a compute instance of a GPU instance of a GPU in MIG mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MigDevice {
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// Its share of the GPU, from 0 to 1 (its slice of the GPU's memory, split evenly among the
    /// compute instances of its GPU instance): the share of the GPU's price it stands for.
    pub share: f64,
}

/// A device as a job's command and the status page name it: `0`, or `0:1` for GPU instance 1
/// of GPU 0.
pub fn device_label(index: u32, gpu_instance: Option<u32>) -> String {
    match gpu_instance {
        None => index.to_string(),
        Some(gi) => format!("{index}:{gi}"),
    }
}

/// Which device a reading is of: the GPU's index, and the MIG device's GPU and compute
/// instance ids.
pub type DeviceKey = (u32, Option<(u32, u32)>);

impl GpuReading {
    pub fn key(&self) -> DeviceKey {
        (
            self.index,
            self.mig.map(|m| (m.gpu_instance, m.compute_instance)),
        )
    }

    /// The device in words: "GPU 0", or "GPU 0 (GPU instance 1, compute instance 0)".
    pub fn name(&self) -> String {
        match self.mig {
            None => format!("GPU {}", self.index),
            Some(m) => format!(
                "GPU {} (GPU instance {}, compute instance {})",
                self.index, m.gpu_instance, m.compute_instance
            ),
        }
    }

    pub fn get(&self, m: Metric) -> Option<f64> {
        self.values[m as usize]
    }

    pub fn set(&mut self, m: Metric, v: Option<f64>) {
        self.values[m as usize] = v;
    }
}

/// What the engine sees of one sample of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    /// Unix seconds.
    pub t: f64,
    /// False when the sample as a whole is unusable (NVML down, a GPU lost, a stale sample).
    pub complete: bool,
    pub gpus: Vec<GpuReading>,
    /// An activity veto that keeps the node busy (an SSH session, a named process).
    pub veto: Option<String>,
    /// Who holds the devices (their jobs and users) is not known for this sample: a process
    /// list failed, or the holders were not read in time. Rules of a job or user scope then
    /// see incomplete data, and what they remember is kept, not dropped.
    pub holders_unknown: bool,
}
