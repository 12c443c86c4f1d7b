//! Configuration in two stages: a raw serde form that rejects unknown keys, then a validated
//! form with typed addresses and durations. Every error names the key and quotes the value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cost::calendar::Period;
mod budgets;
mod check;
mod error;
pub mod json;
mod raw;
mod rules;

pub use budgets::*;
use check::*;
pub use check::{read_capped, MAX_FILE_BYTES};
pub use error::{ConfigError, ConfigErrors};
pub use raw::*;
pub use rules::*;

use crate::rules::{
    Action, Aggregation, BudgetGate, Comparison, Condition, Lifecycle, Metric, Rule, Statistic,
    Trigger,
};

/// Where `gpuwatch run` looks for its config when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/gpuwatch/gpuwatch.toml";

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

pub use gpuwatch_core::plan::SpotStop;

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
    /// Absolute paths match the executable; bare names match `comm`.
    pub processes: Vec<String>,
    /// Only processes of this user count.
    pub process_uid: Option<u32>,
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
    /// TLS and basic auth, from `web_config_file` (the exporter toolkit's format).
    pub web: Option<crate::web::WebConfig>,
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
        let web_file = raw.server.web_config_file.clone();
        let mut config = raw.validate()?;
        if !web_file.is_empty() {
            let file = path.parent().unwrap_or(Path::new(".")).join(&web_file);
            config.server.web = Some(crate::web::WebConfig::load(
                &file,
                "server.web_config_file",
            )?);
        }
        Ok(config)
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
                        web: None,
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
                        process_uid: self.vetoes.process_uid,
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

impl Config {
    /// The settings of the decision step, for samples taken every `interval` (the daemon's
    /// sampling interval, or a trace's step). The daemon and `simulate` both build them here.
    pub fn step_settings(
        &self,
        interval: Duration,
        grace_until: f64,
        running_since: f64,
    ) -> gpuwatch_core::step::Settings {
        use gpuwatch_core::step;
        let budgets = self
            .budgets
            .iter()
            .map(|b| step::Budget {
                name: b.name.clone(),
                source: match b.source {
                    BudgetSource::Local => step::BudgetSource::Local,
                    BudgetSource::AwsBudgets { .. } => step::BudgetSource::External,
                },
                limit_usd: b.limit_usd,
                thresholds: b.thresholds.clone(),
            })
            .collect();
        step::Settings::new(
            self.rules.clone(),
            budgets,
            self.cost.period,
            self.actions.warning,
            interval,
            self.sampling.timeout,
            grace_until,
            running_since,
        )
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
