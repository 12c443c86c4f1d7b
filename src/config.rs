//! Configuration in two stages: a raw serde form that rejects unknown keys, then a validated
//! form with typed addresses and durations. Every error names the key and quotes the value.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cost::calendar::Period;
use crate::rules::{
    Action, Aggregation, BudgetGate, Comparison, Lifecycle, Metric, Rule, Statistic,
};

/// Where `gpuwatch run` looks for its config when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/gpuwatch/gpuwatch.toml";

/// The exit status for bad configuration (EX_USAGE).
pub const EXIT_CONFIG: i32 = 64;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub nvml: NvmlConfig,
    pub sampling: SamplingConfig,
    pub cloud: CloudConfig,
    pub actions: ActionsConfig,
    pub vetoes: VetoesConfig,
    pub spot: SpotConfig,
    pub cost: CostConfig,
    pub cloudwatch: CloudWatchConfig,
    pub budgets: Vec<BudgetConfig>,
    /// The `[[rules]]`, and one rule per budget with `on_exhausted`.
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CostConfig {
    /// An explicit price, which wins over every other source.
    pub hourly_price_usd: Option<f64>,
    pub period: Period,
    pub spot_price_refresh: Duration,
    pub pricing_api: bool,
    /// The Pricing API endpoint; `None` is the SDK's own (in us-east-1).
    pub pricing_endpoint_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CloudWatchConfig {
    pub enabled: bool,
    pub namespace: String,
    /// Samples are aggregated into statistic sets and published this often.
    pub interval: Duration,
    /// During an outage the queue keeps at most this much data, dropping the oldest.
    pub max_queue: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BudgetSource {
    /// This node's own spend ledger.
    Local,
    /// An AWS Budget, read with DescribeBudget.
    AwsBudgets {
        budget_name: String,
        account_id: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetConfig {
    pub name: String,
    /// Required for local budgets; AWS Budgets report their own limit.
    pub limit_usd: Option<f64>,
    pub source: BudgetSource,
    pub thresholds: Vec<f64>,
    pub on_exhausted: Option<Action>,
    pub sns_topic_arn: Option<String>,
    pub poll_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    None,
    Aws,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CloudConfig {
    pub provider: Provider,
    pub imds_endpoint: String,
    /// The EC2 API endpoint; `None` is the SDK's own.
    pub endpoint_url: Option<String>,
    /// The region; `None` means the one instance metadata reports.
    pub region: Option<String>,
    /// How often instance metadata (spot notices, and tags when metadata tags are on) is read.
    pub poll_interval: Duration,
    /// How often DescribeInstances reads the `gpuwatch:hold` tag when metadata tags are off.
    pub tag_poll_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    DryRun,
    Enforce,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::DryRun => "dry-run",
            Mode::Enforce => "enforce",
        }
    }
}

/// What `stop` does on a one-time spot instance, which cannot be stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpotStop {
    Refuse,
    Terminate,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ActionsConfig {
    pub mode: Mode,
    pub boot_grace: Duration,
    pub warning: Duration,
    pub spot_stop: SpotStop,
    pub webhook_url: Option<String>,
    pub wall: bool,
    pub exec_timeout: Duration,
    /// How long EC2 calls are retried through throttling, 5xx and outages.
    pub retry_for: Duration,
    pub state_dir: PathBuf,
    /// When `audit.jsonl` is rotated, and how many rotated files are kept.
    pub audit_rotation: crate::state::Rotation,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct VetoesConfig {
    pub ssh_sessions: bool,
    pub processes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpotConfig {
    pub interruption_hook: Vec<String>,
    pub hook_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Open connections at most; see `serve.rs` for what happens to one more.
    pub max_connections: usize,
    /// `/api/v1/snapshot?after=` long-polls in progress at most; the excess gets 503.
    pub max_long_polls: usize,
    /// A request head must arrive within this, and an idle connection is closed after it.
    pub header_read_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NvmlConfig {
    /// A file name (searched like any shared library) or a path.
    pub library: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    pub interval: Duration,
    /// A cycle still running after this long is abandoned and counted.
    pub timeout: Duration,
    /// Export `gpu_process_memory_used_bytes{pid,process}`.
    pub per_process_memory: bool,
}

impl Default for Config {
    fn default() -> Self {
        RawConfig::default()
            .validate()
            .expect("the built-in defaults are valid")
    }
}

/// One problem with a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config: {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config: {path}: line {line}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("config: {key}: {message}")]
    Invalid { key: String, message: String },
}

/// Every problem found in one config file, in file order.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = read_capped(path)?;
        Config::parse(&text, path)
    }

    /// Parses config text; `path` is used in messages, and a relative `rules_file` is
    /// resolved against its directory.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigErrors> {
        let mut raw = RawConfig::parse(text, path)?;
        if !raw.rules_file.is_empty() {
            let file = path
                .parent()
                .unwrap_or(Path::new("."))
                .join(&raw.rules_file);
            raw.rules.extend(load_rules_file(&file)?);
        }
        raw.validate()
    }

    /// Adds the rules of a JSON (or TOML `[[rules]]`) file, as `--rules PATH` does.
    pub fn add_rules_file(&mut self, file: &Path) -> Result<(), ConfigErrors> {
        let raw = load_rules_file(file)?;
        let mut all: Vec<RawRule> = Vec::new();
        all.extend(raw);
        let mut errors = Vec::new();
        let offset = self.rules.len();
        for (i, r) in all.into_iter().enumerate() {
            match r.validate(&format!("rules[{}]", offset + i)) {
                Ok(rule) => self.rules.push(rule),
                Err(e) => errors.extend(e),
            }
        }
        check_unique(&self.rules, &mut errors);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

// ---- raw form -------------------------------------------------------------------------------

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    /// A JSON (or TOML) file of more rules, relative to the config file.
    pub rules_file: String,
    pub server: RawServer,
    pub nvml: RawNvml,
    pub sampling: RawSampling,
    pub cloud: RawCloud,
    pub actions: RawActions,
    pub vetoes: RawVetoes,
    pub spot: RawSpot,
    pub cost: RawCost,
    pub cloudwatch: RawCloudWatch,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<RawBudget>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RawRule>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCost {
    /// 0 means: look the price up.
    pub hourly_price_usd: f64,
    pub period: String,
    pub spot_price_refresh: String,
    pub pricing_api: bool,
    pub pricing_endpoint_url: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCloudWatch {
    pub enabled: bool,
    pub namespace: String,
    pub interval: String,
    pub max_queue: String,
}

/// One `[[budgets]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    pub name: String,
    #[serde(default)]
    pub limit_usd: Option<f64>,
    #[serde(default = "local")]
    pub source: String,
    #[serde(default)]
    pub aws_budget_name: Option<String>,
    #[serde(default)]
    pub account_id: Option<String>,
    #[serde(default = "default_thresholds")]
    pub thresholds: Vec<f64>,
    #[serde(default = "none")]
    pub on_exhausted: String,
    #[serde(default)]
    pub sns_topic_arn: Option<String>,
    #[serde(default = "five_minutes")]
    pub poll_interval: String,
}

fn local() -> String {
    "local".into()
}

fn none() -> String {
    "none".into()
}

fn five_minutes() -> String {
    "5m".into()
}

fn default_thresholds() -> Vec<f64> {
    vec![0.5, 0.8, 1.0]
}

/// `budget = { name = "team-gpu", spent_at_least = 0.8 }` in a rule.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGate {
    pub name: String,
    pub spent_at_least: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCloud {
    pub provider: String,
    pub imds_endpoint: String,
    pub endpoint_url: String,
    pub region: String,
    pub poll_interval: String,
    pub tag_poll_interval: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawActions {
    pub mode: String,
    pub boot_grace: String,
    pub warning: String,
    pub spot_stop: String,
    pub webhook_url: String,
    pub wall: bool,
    pub exec_timeout: String,
    pub retry_for: String,
    pub state_dir: String,
    pub audit_max_mib: u64,
    pub audit_keep: u32,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawVetoes {
    pub ssh_sessions: bool,
    pub processes: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSpot {
    pub interruption_hook: Vec<String>,
    pub hook_timeout: String,
}

/// One `[[rules]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: String,
    pub metric: String,
    #[serde(default)]
    pub statistic: Option<String>,
    pub comparison: String,
    pub threshold: f64,
    pub period: String,
    #[serde(default = "one")]
    pub evaluation_periods: u32,
    #[serde(default)]
    pub datapoints_to_alarm: Option<u32>,
    #[serde(default)]
    pub gpus: Option<String>,
    #[serde(default)]
    pub lifecycle: Option<String>,
    pub action: String,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub budget: Option<RawGate>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRulesFile {
    rules: Vec<RawRule>,
}

/// Loads rules from a file: the JSON form when it ends in `.json`, else `[[rules]]` tables.
fn load_rules_file(path: &Path) -> Result<Vec<RawRule>, ConfigErrors> {
    let text = read_capped(path)?;
    let source = path.display().to_string();
    if path.extension().is_some_and(|e| e == "json") {
        Ok(crate::rules::json::parse(&text, &source)?)
    } else {
        let de = toml::Deserializer::new(&text);
        let file: RawRulesFile =
            serde_path_to_error::deserialize(de).map_err(|e| ConfigError::Invalid {
                key: format!("{source}: {}", e.path()),
                message: e.into_inner().message().trim().replace('`', "\""),
            })?;
        Ok(file.rules)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    pub listen: String,
    pub max_connections: usize,
    pub max_long_polls: usize,
    pub header_read_timeout: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNvml {
    pub library: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSampling {
    pub interval: String,
    pub timeout: String,
    pub per_process_memory: bool,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            rules_file: String::new(),
            cloud: RawCloud {
                provider: "none".to_string(),
                imds_endpoint: "http://169.254.169.254".to_string(),
                endpoint_url: String::new(),
                region: String::new(),
                poll_interval: "5s".to_string(),
                tag_poll_interval: "1m".to_string(),
            },
            actions: RawActions {
                mode: "dry-run".to_string(),
                boot_grace: "15m".to_string(),
                warning: "10m".to_string(),
                spot_stop: "refuse".to_string(),
                webhook_url: String::new(),
                wall: true,
                exec_timeout: "60s".to_string(),
                retry_for: "10m".to_string(),
                state_dir: "/var/lib/gpuwatch".to_string(),
                audit_max_mib: 16,
                audit_keep: 5,
            },
            vetoes: RawVetoes::default(),
            spot: RawSpot {
                interruption_hook: Vec::new(),
                hook_timeout: "60s".to_string(),
            },
            cost: RawCost {
                hourly_price_usd: 0.0,
                period: "month".to_string(),
                spot_price_refresh: "1h".to_string(),
                pricing_api: true,
                pricing_endpoint_url: String::new(),
            },
            cloudwatch: RawCloudWatch {
                enabled: false,
                namespace: "gpuwatch".to_string(),
                interval: "60s".to_string(),
                max_queue: "30m".to_string(),
            },
            budgets: Vec::new(),
            rules: Vec::new(),
            server: RawServer {
                listen: "0.0.0.0:9400".to_string(),
                max_connections: 256,
                max_long_polls: 64,
                header_read_timeout: "5s".to_string(),
            },
            nvml: RawNvml {
                library: "libnvidia-ml.so.1".to_string(),
            },
            sampling: RawSampling {
                interval: "1s".to_string(),
                timeout: "5s".to_string(),
                per_process_memory: false,
            },
        }
    }
}

impl Default for RawServer {
    fn default() -> Self {
        RawConfig::default().server
    }
}

impl Default for RawNvml {
    fn default() -> Self {
        RawConfig::default().nvml
    }
}

impl Default for RawSampling {
    fn default() -> Self {
        RawConfig::default().sampling
    }
}

impl Default for RawCloud {
    fn default() -> Self {
        RawConfig::default().cloud
    }
}

impl Default for RawActions {
    fn default() -> Self {
        RawConfig::default().actions
    }
}

impl Default for RawCost {
    fn default() -> Self {
        RawConfig::default().cost
    }
}

impl Default for RawCloudWatch {
    fn default() -> Self {
        RawConfig::default().cloudwatch
    }
}

impl Default for RawSpot {
    fn default() -> Self {
        RawConfig::default().spot
    }
}

impl RawConfig {
    pub fn parse(text: &str, path: &Path) -> Result<RawConfig, ConfigError> {
        let de = toml::Deserializer::new(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            // One line per error, and values in double quotes as everywhere else.
            let message = inner
                .message()
                .trim()
                .replace('\n', "; ")
                .replace('`', "\"");
            match (key.as_str(), inner.span()) {
                // Errors outside any key are TOML syntax errors.
                (".", Some(span)) | ("", Some(span)) => ConfigError::Syntax {
                    path: path.to_path_buf(),
                    line: text[..span.start.min(text.len())].lines().count().max(1),
                    message,
                },
                _ => ConfigError::Invalid {
                    key: key.trim_start_matches('.').to_string(),
                    message: unknown_key_message(&message),
                },
            }
        })
    }

    pub fn validate(self) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let mut invalid = |key: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: key.to_string(),
                message,
            })
        };

        let listen = match self.server.listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                invalid(
                    "server.listen",
                    format!(
                        "\"{}\" is not an IP address and port, such as \"0.0.0.0:9400\"",
                        self.server.listen
                    ),
                );
                None
            }
        };
        if !(1..=65_536).contains(&self.server.max_connections) {
            invalid(
                "server.max_connections",
                format!(
                    "\"{}\" is not a count between 1 and 65536",
                    self.server.max_connections
                ),
            );
        }
        // Fewer long-polls than connections, so that a scrape always finds one free.
        if !(1..self.server.max_connections.max(2)).contains(&self.server.max_long_polls) {
            invalid(
                "server.max_long_polls",
                format!(
                    "\"{}\" is not a count from 1 to below server.max_connections ({}), which leaves room for scrapes",
                    self.server.max_long_polls, self.server.max_connections
                ),
            );
        }
        let header_read_timeout = duration(
            &mut invalid,
            "server.header_read_timeout",
            &self.server.header_read_timeout,
            Duration::from_millis(100)..=Duration::from_secs(300),
        );
        if self.nvml.library.trim().is_empty() {
            invalid(
                "nvml.library",
                "\"\" is empty; name the NVML library, such as \"libnvidia-ml.so.1\"".to_string(),
            );
        }
        let interval = duration(
            &mut invalid,
            "sampling.interval",
            &self.sampling.interval,
            Duration::from_millis(10)..=Duration::from_secs(3600),
        );
        let timeout = duration(
            &mut invalid,
            "sampling.timeout",
            &self.sampling.timeout,
            Duration::from_millis(10)..=Duration::from_secs(600),
        );

        let provider = match self.cloud.provider.as_str() {
            "none" => Some(Provider::None),
            "aws" => Some(Provider::Aws),
            other => {
                invalid(
                    "cloud.provider",
                    format!("\"{other}\" is not one of \"none\", \"aws\""),
                );
                None
            }
        };
        for (key, url) in [
            ("cloud.imds_endpoint", &self.cloud.imds_endpoint),
            ("cloud.endpoint_url", &self.cloud.endpoint_url),
            ("actions.webhook_url", &self.actions.webhook_url),
        ] {
            let ok = url.is_empty() && key != "cloud.imds_endpoint"
                || url.starts_with("http://") && url.len() > 7
                || url.starts_with("https://") && url.len() > 8;
            if !ok {
                invalid(key, format!("\"{url}\" is not an http:// or https:// URL"));
            }
        }
        let mode = match self.actions.mode.as_str() {
            "dry-run" => Some(Mode::DryRun),
            "enforce" => Some(Mode::Enforce),
            other => {
                invalid(
                    "actions.mode",
                    format!("\"{other}\" is not one of \"dry-run\", \"enforce\""),
                );
                None
            }
        };
        let spot_stop = match self.actions.spot_stop.as_str() {
            "refuse" => Some(SpotStop::Refuse),
            "terminate" => Some(SpotStop::Terminate),
            other => {
                invalid(
                    "actions.spot_stop",
                    format!("\"{other}\" is not one of \"refuse\", \"terminate\""),
                );
                None
            }
        };
        let boot_grace = duration(
            &mut invalid,
            "actions.boot_grace",
            &self.actions.boot_grace,
            Duration::ZERO..=WEEK,
        );
        let warning = duration(
            &mut invalid,
            "actions.warning",
            &self.actions.warning,
            Duration::ZERO..=WEEK,
        );
        let exec_timeout = duration(
            &mut invalid,
            "actions.exec_timeout",
            &self.actions.exec_timeout,
            Duration::from_millis(10)..=Duration::from_secs(3600),
        );
        if self.actions.state_dir.trim().is_empty() {
            invalid(
                "actions.state_dir",
                "\"\" is empty; name a directory, such as \"/var/lib/gpuwatch\"".into(),
            );
        }
        let hook_timeout = duration(
            &mut invalid,
            "spot.hook_timeout",
            &self.spot.hook_timeout,
            Duration::from_millis(10)..=Duration::from_secs(600),
        );
        let poll_interval = duration(
            &mut invalid,
            "cloud.poll_interval",
            &self.cloud.poll_interval,
            Duration::from_millis(10)..=Duration::from_secs(3600),
        );
        let tag_poll_interval = duration(
            &mut invalid,
            "cloud.tag_poll_interval",
            &self.cloud.tag_poll_interval,
            Duration::from_millis(10)..=DAY,
        );
        let retry_for = duration(
            &mut invalid,
            "actions.retry_for",
            &self.actions.retry_for,
            Duration::ZERO..=DAY,
        );
        if !(1..=1024).contains(&self.actions.audit_max_mib) {
            invalid(
                "actions.audit_max_mib",
                format!(
                    "\"{}\" is not a size in MiB between 1 and 1024",
                    self.actions.audit_max_mib
                ),
            );
        }
        if !(1..=100).contains(&self.actions.audit_keep) {
            invalid(
                "actions.audit_keep",
                format!(
                    "\"{}\" is not a count of rotated files between 1 and 100",
                    self.actions.audit_keep
                ),
            );
        }
        if self.vetoes.processes.iter().any(|p| p.trim().is_empty()) {
            invalid("vetoes.processes", "\"\" is not a process name".into());
        }

        let hourly_price_usd = match self.cost.hourly_price_usd {
            0.0 => None,
            p if p > 0.0 && p <= 10_000.0 => Some(p),
            p => {
                invalid(
                    "cost.hourly_price_usd",
                    format!("\"{p}\" is not a price in USD (0 means: look it up)"),
                );
                None
            }
        };
        let period = match self.cost.period.as_str() {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            other => {
                invalid(
                    "cost.period",
                    format!("\"{other}\" is not one of \"day\", \"week\", \"month\""),
                );
                None
            }
        };
        let spot_price_refresh = duration(
            &mut invalid,
            "cost.spot_price_refresh",
            &self.cost.spot_price_refresh,
            Duration::from_secs(1)..=DAY,
        );
        if !self.cost.pricing_endpoint_url.is_empty()
            && !self.cost.pricing_endpoint_url.starts_with("http")
        {
            invalid(
                "cost.pricing_endpoint_url",
                format!(
                    "\"{}\" is not an http:// or https:// URL",
                    self.cost.pricing_endpoint_url
                ),
            );
        }
        let cw_interval = duration(
            &mut invalid,
            "cloudwatch.interval",
            &self.cloudwatch.interval,
            Duration::from_secs(1)..=Duration::from_secs(3600),
        );
        let cw_queue = duration(
            &mut invalid,
            "cloudwatch.max_queue",
            &self.cloudwatch.max_queue,
            Duration::from_secs(1)..=DAY,
        );
        if self.cloudwatch.namespace.is_empty() || self.cloudwatch.namespace.starts_with("AWS/") {
            invalid(
                "cloudwatch.namespace",
                format!(
                    "\"{}\" is not a namespace of your own, such as \"gpuwatch\"",
                    self.cloudwatch.namespace
                ),
            );
        }

        let mut budgets = Vec::new();
        for (i, b) in self.budgets.iter().enumerate() {
            match b.validate(&format!("budgets[{i}]")) {
                Ok(b) => budgets.push(b),
                Err(e) => errors.extend(e),
            }
        }
        for (i, b) in budgets.iter().enumerate() {
            if budgets[..i].iter().any(|o: &BudgetConfig| o.name == b.name) {
                errors.push(ConfigError::Invalid {
                    key: format!("budgets[{i}].name"),
                    message: format!(
                        "\"{}\" names another budget too; names must be unique",
                        b.name
                    ),
                });
            }
        }

        let mut rules = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            match r.validate(&format!("rules[{i}]")) {
                Ok(rule) => {
                    if let Some(g) = &rule.budget {
                        if !budgets.iter().any(|b| b.name == g.name) {
                            errors.push(ConfigError::Invalid {
                                key: format!("rules[{i}].budget.name"),
                                message: format!(
                                    "\"{}\" is not the name of a [[budgets]] entry",
                                    g.name
                                ),
                            });
                        }
                    }
                    rules.push(rule)
                }
                Err(e) => errors.extend(e),
            }
        }
        for b in &budgets {
            if let Some(action) = b.on_exhausted {
                rules.push(exhausted_rule(b, action));
            }
        }
        check_unique(&rules, &mut errors);

        match (listen, interval, timeout, provider, mode, spot_stop, period) {
            (
                Some(listen),
                Some(interval),
                Some(timeout),
                Some(provider),
                Some(mode),
                Some(spot_stop),
                Some(period),
            ) if errors.is_empty() => {
                let opt = |s: String| (!s.trim().is_empty()).then_some(s);
                Ok(Config {
                    server: ServerConfig {
                        listen,
                        max_connections: self.server.max_connections,
                        max_long_polls: self.server.max_long_polls,
                        header_read_timeout: header_read_timeout.unwrap_or_default(),
                    },
                    nvml: NvmlConfig {
                        library: PathBuf::from(self.nvml.library),
                    },
                    sampling: SamplingConfig {
                        interval,
                        timeout,
                        per_process_memory: self.sampling.per_process_memory,
                    },
                    cloud: CloudConfig {
                        provider,
                        imds_endpoint: self.cloud.imds_endpoint.trim_end_matches('/').to_string(),
                        endpoint_url: opt(self.cloud.endpoint_url),
                        region: opt(self.cloud.region),
                        poll_interval: poll_interval.unwrap_or_default(),
                        tag_poll_interval: tag_poll_interval.unwrap_or_default(),
                    },
                    actions: ActionsConfig {
                        mode,
                        boot_grace: boot_grace.unwrap_or_default(),
                        warning: warning.unwrap_or_default(),
                        spot_stop,
                        webhook_url: opt(self.actions.webhook_url),
                        wall: self.actions.wall,
                        exec_timeout: exec_timeout.unwrap_or_default(),
                        retry_for: retry_for.unwrap_or_default(),
                        state_dir: PathBuf::from(self.actions.state_dir),
                        audit_rotation: crate::state::Rotation {
                            max_bytes: self.actions.audit_max_mib << 20,
                            keep: self.actions.audit_keep,
                        },
                    },
                    vetoes: VetoesConfig {
                        ssh_sessions: self.vetoes.ssh_sessions,
                        processes: self.vetoes.processes,
                    },
                    spot: SpotConfig {
                        interruption_hook: self.spot.interruption_hook,
                        hook_timeout: hook_timeout.unwrap_or_default(),
                    },
                    cost: CostConfig {
                        hourly_price_usd,
                        period,
                        spot_price_refresh: spot_price_refresh.unwrap_or_default(),
                        pricing_api: self.cost.pricing_api,
                        pricing_endpoint_url: opt(self.cost.pricing_endpoint_url),
                    },
                    cloudwatch: CloudWatchConfig {
                        enabled: self.cloudwatch.enabled,
                        namespace: self.cloudwatch.namespace,
                        interval: cw_interval.unwrap_or_default(),
                        max_queue: cw_queue.unwrap_or_default(),
                    },
                    budgets,
                    rules,
                })
            }
            _ => Err(ConfigErrors(errors)),
        }
    }
}

/// The rule a budget's `on_exhausted` stands for. It goes through the same warning, hold, audit
/// and spot-correct path as any other rule.
fn exhausted_rule(b: &BudgetConfig, action: Action) -> Rule {
    Rule {
        name: format!("budget {} exhausted", b.name),
        metric: Metric::GpuUtilization,
        statistic: Statistic::Average,
        comparison: Comparison::GreaterThanOrEqual,
        threshold: 1.0,
        period: Duration::from_secs(60),
        evaluation_periods: 1,
        datapoints_to_alarm: 1,
        gpus: Aggregation::Every,
        lifecycle: None,
        action,
        command: Vec::new(),
        budget: None,
        exhausted: Some(b.name.clone()),
    }
}

impl RawBudget {
    pub fn validate(&self, key: &str) -> Result<BudgetConfig, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let mut invalid = |k: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: format!("{key}.{k}"),
                message,
            })
        };
        check_name(&mut invalid, "budget", &self.name);
        let source = match self.source.as_str() {
            "local" => Some(BudgetSource::Local),
            "aws_budgets" => match self.account_id.as_deref() {
                Some(a) if a.len() == 12 && a.bytes().all(|b| b.is_ascii_digit()) => {
                    Some(BudgetSource::AwsBudgets {
                        budget_name: self
                            .aws_budget_name
                            .clone()
                            .unwrap_or_else(|| self.name.clone()),
                        account_id: a.to_string(),
                    })
                }
                Some(a) => {
                    invalid(
                        "account_id",
                        format!("\"{a}\" is not a 12-digit AWS account id"),
                    );
                    None
                }
                None => {
                    invalid(
                        "account_id",
                        "an aws_budgets budget needs the 12-digit account_id that owns it".into(),
                    );
                    None
                }
            },
            other => {
                invalid(
                    "source",
                    format!("\"{other}\" is not one of \"local\", \"aws_budgets\""),
                );
                None
            }
        };
        match self.limit_usd {
            Some(l) if !(l > 0.0 && l.is_finite()) => invalid(
                "limit_usd",
                format!("\"{l}\" is not a positive amount in USD"),
            ),
            None if self.source == "local" => {
                invalid("limit_usd", "a local budget needs a limit_usd".into())
            }
            _ => {}
        }
        for t in &self.thresholds {
            if !(*t > 0.0 && *t <= 10.0) {
                invalid(
                    "thresholds",
                    format!("\"{t}\" is not a share of the limit, such as 0.8"),
                );
            }
        }
        let on_exhausted = match self.on_exhausted.as_str() {
            "none" => Some(None),
            "stop" => Some(Some(Action::Stop)),
            "hibernate" => Some(Some(Action::Hibernate)),
            "terminate" => Some(Some(Action::Terminate)),
            other => {
                invalid("on_exhausted", format!("\"{other}\" is not one of \"none\", \"stop\", \"hibernate\", \"terminate\""));
                None
            }
        };
        if let Some(arn) = &self.sns_topic_arn {
            if !arn.starts_with("arn:") {
                invalid(
                    "sns_topic_arn",
                    format!("\"{arn}\" is not an SNS topic ARN"),
                );
            }
        }
        let poll_interval = duration(
            &mut invalid,
            "poll_interval",
            &self.poll_interval,
            Duration::from_secs(1)..=DAY,
        );
        match (source, on_exhausted, poll_interval) {
            (Some(source), Some(on_exhausted), Some(poll_interval)) if errors.is_empty() => {
                Ok(BudgetConfig {
                    name: self.name.clone(),
                    limit_usd: self.limit_usd,
                    source,
                    thresholds: self.thresholds.clone(),
                    on_exhausted,
                    sns_topic_arn: self.sns_topic_arn.clone(),
                    poll_interval,
                })
            }
            _ => Err(errors),
        }
    }
}

fn check_unique(rules: &[Rule], errors: &mut Vec<ConfigError>) {
    for (i, r) in rules.iter().enumerate() {
        if rules[..i].iter().any(|o| o.name == r.name) {
            errors.push(ConfigError::Invalid {
                key: format!("rules[{i}].name"),
                message: format!(
                    "\"{}\" names another rule too; names must be unique",
                    r.name
                ),
            });
        }
    }
}

impl RawRule {
    /// Validates one rule; `key` is its place, such as `rules[1]`.
    pub fn validate(&self, key: &str) -> Result<Rule, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let mut invalid = |k: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: format!("{key}.{k}"),
                message,
            })
        };
        fn pick<T: Copy>(
            invalid: &mut impl FnMut(&str, String),
            k: &str,
            value: &str,
            options: &[(&str, T)],
        ) -> Option<T> {
            let found = options.iter().find(|(n, _)| *n == value).map(|(_, v)| *v);
            if found.is_none() {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                invalid(k, format!("\"{value}\" is not one of {}", names.join(", ")));
            }
            found
        }
        check_name(&mut invalid, "rule", &self.name);
        let metric = pick(
            &mut invalid,
            "metric",
            &self.metric,
            &Metric::ALL.map(|m| (m.as_str(), m)),
        );
        let statistic = pick(
            &mut invalid,
            "statistic",
            self.statistic.as_deref().unwrap_or("average"),
            &[
                ("average", Statistic::Average),
                ("maximum", Statistic::Maximum),
            ],
        );
        let comparison = pick(
            &mut invalid,
            "comparison",
            &self.comparison,
            &[
                ("less_than", Comparison::LessThan),
                ("less_than_or_equal", Comparison::LessThanOrEqual),
                ("greater_than", Comparison::GreaterThan),
                ("greater_than_or_equal", Comparison::GreaterThanOrEqual),
            ],
        );
        let gpus = pick(
            &mut invalid,
            "gpus",
            self.gpus.as_deref().unwrap_or("every"),
            &[("every", Aggregation::Every), ("any", Aggregation::Any)],
        );
        let lifecycle = match self.lifecycle.as_deref() {
            None => Some(None),
            Some(l) => pick(
                &mut invalid,
                "lifecycle",
                l,
                &[
                    ("spot", Some(Lifecycle::Spot)),
                    ("on-demand", Some(Lifecycle::OnDemand)),
                ],
            ),
        };
        let action = pick(
            &mut invalid,
            "action",
            &self.action,
            &[
                ("alert", Action::Alert),
                ("exec", Action::Exec),
                ("stop", Action::Stop),
                ("hibernate", Action::Hibernate),
                ("terminate", Action::Terminate),
            ],
        );
        if let Some(m) = metric {
            let ok = if m.is_ratio() {
                (0.0..=1.0).contains(&self.threshold)
            } else {
                self.threshold >= 0.0 && self.threshold.is_finite()
            };
            if !ok {
                let what = if m.is_ratio() {
                    "a ratio between 0 and 1"
                } else {
                    "a count of 0 or more"
                };
                invalid("threshold", format!("\"{}\" is not {what}", self.threshold));
            }
        }
        let period = duration(
            &mut invalid,
            "period",
            &self.period,
            Duration::from_secs(1)..=DAY,
        );
        if self.evaluation_periods == 0 || self.evaluation_periods > MAX_EVALUATION_PERIODS {
            invalid(
                "evaluation_periods",
                format!(
                    "\"{}\" must be between 1 and {MAX_EVALUATION_PERIODS}",
                    self.evaluation_periods
                ),
            );
        } else if let Some(p) = period {
            if p * self.evaluation_periods > MAX_RULE_SPAN {
                invalid(
                    "evaluation_periods",
                    format!(
                        "\"{}\" periods of \"{}\" span more than {} days",
                        self.evaluation_periods,
                        self.period,
                        MAX_RULE_SPAN.as_secs() / 86_400
                    ),
                );
            }
        }
        if let Some(g) = &self.budget {
            if !(g.spent_at_least.is_finite() && (0.0..=10.0).contains(&g.spent_at_least)) {
                invalid(
                    "budget.spent_at_least",
                    format!(
                        "\"{}\" is not a share of the budget between 0 and 10, such as 0.8",
                        g.spent_at_least
                    ),
                );
            }
        }
        let m = self.datapoints_to_alarm.unwrap_or(self.evaluation_periods);
        if m == 0 || m > self.evaluation_periods {
            invalid(
                "datapoints_to_alarm",
                format!(
                    "\"{m}\" must be between 1 and evaluation_periods ({})",
                    self.evaluation_periods
                ),
            );
        }
        if action == Some(Action::Exec) && self.command.is_empty() {
            invalid(
                "command",
                "an exec rule needs a command, such as [\"/usr/local/bin/notify\", \"idle\"]"
                    .into(),
            );
        }
        match (
            metric, statistic, comparison, gpus, lifecycle, action, period,
        ) {
            (
                Some(metric),
                Some(statistic),
                Some(comparison),
                Some(gpus),
                Some(lifecycle),
                Some(action),
                Some(period),
            ) if errors.is_empty() => Ok(Rule {
                name: self.name.clone(),
                metric,
                statistic,
                comparison,
                threshold: self.threshold,
                period,
                evaluation_periods: self.evaluation_periods,
                datapoints_to_alarm: m,
                gpus,
                lifecycle,
                action,
                command: self.command.clone(),
                budget: self.budget.as_ref().map(|g| BudgetGate {
                    name: g.name.clone(),
                    spent_at_least: g.spent_at_least,
                }),
                exhausted: None,
            }),
            _ => Err(errors),
        }
    }
}

/// Bounds that keep every duration sane: no config value may make a timer overflow or a loop
/// wait for centuries.
const DAY: Duration = Duration::from_secs(86_400);
const WEEK: Duration = Duration::from_secs(7 * 86_400);

fn duration(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    text: &str,
    range: std::ops::RangeInclusive<Duration>,
) -> Option<Duration> {
    let show = |d: &Duration| humantime::format_duration(*d).to_string();
    match humantime::parse_duration(text) {
        Ok(d) if range.contains(&d) => Some(d),
        Ok(d) if d < *range.start() => {
            invalid(
                key,
                format!(
                    "\"{text}\" is too short; the least is \"{}\"",
                    show(range.start())
                ),
            );
            None
        }
        Ok(_) => {
            invalid(
                key,
                format!(
                    "\"{text}\" is too long; the most is \"{}\"",
                    show(range.end())
                ),
            );
            None
        }
        Err(_) => {
            invalid(
                key,
                format!("\"{text}\" is not a duration, such as \"1s\" or \"500ms\""),
            );
            None
        }
    }
}

/// The most evaluation periods a rule may look back over (a week of one-minute periods), and
/// the longest span they may cover. Beyond them a rule is a mistake, and would cost memory.
pub const MAX_EVALUATION_PERIODS: u32 = 10_080;
const MAX_RULE_SPAN: Duration = Duration::from_secs(31 * 86_400);

/// The longest rule or budget name: names are label values and log fields.
const MAX_NAME: usize = 128;

/// Checks a rule or budget name: not empty, not too long, no control characters.
fn check_name(invalid: &mut impl FnMut(&str, String), what: &str, name: &str) {
    if name.trim().is_empty() {
        invalid("name", format!("\"\" is empty; every {what} needs a name"));
    } else if name.chars().count() > MAX_NAME {
        invalid(
            "name",
            format!(
                "\"{}...\" is longer than {MAX_NAME} characters",
                name.chars().take(32).collect::<String>()
            ),
        );
    } else if name.chars().any(char::is_control) {
        invalid(
            "name",
            format!("{name:?} contains a control character (a newline or tab, say)"),
        );
    }
}

/// The largest config or rules file read: enough for thousands of rules, and a bound against
/// `/dev/zero` or a runaway file.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Reads a config or rules file, refusing anything larger than `MAX_FILE_BYTES`.
pub fn read_capped(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let err = |source: std::io::Error| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(err)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(err(std::io::Error::other(format!(
            "larger than {} MiB; is this the right file?",
            MAX_FILE_BYTES >> 20
        ))));
    }
    String::from_utf8(bytes).map_err(|_| err(std::io::Error::other("not UTF-8 text")))
}

/// serde says "unknown field "x", expected one of ..."; config files have keys.
fn unknown_key_message(message: &str) -> String {
    match message.strip_prefix("unknown field \"") {
        Some(rest) => {
            let (name, rest) = rest.split_once('"').unwrap_or((rest, ""));
            let expected = rest.trim_start_matches(", ");
            format!("\"{name}\" is not a known key; {expected}")
        }
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::default();
        assert_eq!(c.server.listen, "0.0.0.0:9400".parse().unwrap());
        assert_eq!(c.nvml.library, PathBuf::from("libnvidia-ml.so.1"));
        assert_eq!(c.sampling.interval, Duration::from_secs(1));
        assert_eq!(c.sampling.timeout, Duration::from_secs(5));
        assert!(!c.sampling.per_process_memory);
    }

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(
            Config::parse("", Path::new("x.toml")).unwrap(),
            Config::default()
        );
    }
}
