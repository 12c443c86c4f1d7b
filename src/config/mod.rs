//! Configuration in two stages: a raw serde form that rejects unknown keys, then a validated
//! form with typed addresses and durations. Every error names the key and quotes the value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cost::calendar::Period;
mod actions;
mod budgets;
mod check;
mod cloud;
pub mod controller;
mod error;
mod health;
pub mod json;
mod node;
mod raw;
mod rules;
mod sections;
mod server;
pub mod slurm;
pub mod web;

pub use actions::{ActionsConfig, Mode, Rotation, SpotConfig, SpotStop, VetoesConfig};
pub use budgets::{
    read_ca, read_secret, BudgetConfig, BudgetSource, PrometheusSource, QueryAuth, RawBudget,
};
use check::*;
pub use check::{
    duration, file_path, pick, read_config_file, DAY, MAX_FILE_BYTES, MAX_SECRET_BYTES,
};
pub use cloud::{CloudConfig, CostConfig};
pub use error::{ConfigError, ConfigErrors};
pub use health::RawHealth;
pub use node::{
    tag_label_name, KubernetesConfig, NodeConfig, TagLabel, MAX_LABEL_VALUE, NODE_INFO_LABELS,
};
pub use raw::{
    RawActions, RawAmd, RawCloud, RawConfig, RawCost, RawExposition, RawKubernetes, RawNode,
    RawNvml, RawSampling, RawServer, RawSpot, RawVetoes,
};
pub use rules::{RawGate, RawRule, MAX_EVALUATION_PERIODS};
pub use sections::{
    parse_table, BudgetSourceKeys, CloudKeys, Clouds, Invalid, Keys, Listed, Section, TopicKey,
};
pub use server::{
    AmdConfig, ExpositionConfig, HostnameLabel, Names, NvmlConfig, SamplingConfig, ServerConfig,
};

use budgets::exhausted_rule;
use node::validate_labels;
use rules::{check_holders, check_unique, load_rules_file};

use crate::rules::{
    Action, Aggregation, BudgetGate, Comparison, Condition, Lifecycle, Metric, Rule, Scope,
    Statistic, Trigger,
};

/// Where `gpuwatch run` looks for its config when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/gpuwatch/gpuwatch.toml";

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub nvml: NvmlConfig,
    pub amd: AmdConfig,
    pub sampling: SamplingConfig,
    pub cloud: CloudConfig,
    pub actions: ActionsConfig,
    /// Shared: the decision loop hands it to the I/O thread on every sample.
    pub vetoes: std::sync::Arc<VetoesConfig>,
    pub spot: SpotConfig,
    pub cost: CostConfig,
    pub exposition: ExpositionConfig,
    pub kubernetes: KubernetesConfig,
    pub slurm: slurm::SlurmConfig,
    /// The labels of `gpuwatch_node_info`.
    pub node: NodeConfig,
    /// How GPU health is judged.
    pub health: crate::health::Settings,
    pub budgets: Vec<BudgetConfig>,
    /// The `[[rules]]`, and one rule per budget with `on_exhausted`.
    pub rules: Vec<Rule>,
    /// `[controller]`, where the file has one: the cluster controller's settings.
    pub controller: Option<controller::ControllerConfig>,
    /// The file it was read from (empty for the built-in defaults): what `gpuwatch hold`
    /// must be given to find the same state directory.
    pub path: std::path::PathBuf,
    /// What the file still says in a way that works for now (a cloud's key in `[cloud]` where
    /// its table now holds it): logged at start, printed by `check-config`.
    pub warnings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        RawConfig::default()
            .validate(&[])
            .expect("the built-in defaults are valid")
    }
}

impl Config {
    /// Reads and checks the config file at `path`, each cloud's section by the cloud as
    /// `clouds` lists them (the cloud boundary's list: `cloud::load_config` passes it).
    pub fn load(path: &Path, clouds: Clouds) -> Result<Config, ConfigErrors> {
        let text = read_config_file(path)?;
        Config::parse(&text, path, clouds)
    }

    /// Parses config text; `path` is used in messages, and a relative `rules_file` is
    /// resolved against its directory.
    ///
    /// Every problem is reported at once: those of the main file, of the rules file, of the web
    /// config and of the webhook URL file, in that order (the budgets' files are read only once
    /// the rest is valid, as their keys must be first).
    pub fn parse(text: &str, path: &Path, clouds: Clouds) -> Result<Config, ConfigErrors> {
        let mut raw = RawConfig::parse(text, path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut errors = Vec::new();
        // Keeps the value, or the problems for the report.
        fn kept<T>(errors: &mut Vec<ConfigError>, r: Result<T, ConfigErrors>) -> Option<T> {
            r.map_err(|e| errors.extend(e.0)).ok()
        }
        let rules = (!raw.rules_file.is_empty()).then(|| {
            kept(
                &mut errors,
                load_rules_file(&check::file_path(base, &raw.rules_file)),
            )
        });
        let web_file = raw.server.web_config_file.clone();
        let web = (!web_file.is_empty()).then(|| {
            let file = check::file_path(base, &web_file);
            kept(
                &mut errors,
                web::WebConfig::load(&file, "server.web_config_file"),
            )
        });
        let webhook_file = std::mem::take(&mut raw.actions.webhook_url_file);
        let webhook = (!webhook_file.is_empty()).then(|| {
            const KEY: &str = "actions.webhook_url_file";
            let read = if raw.actions.webhook_url.is_empty() {
                read_webhook_url(&check::file_path(base, &webhook_file))
            } else {
                Err(ConfigError::Invalid {
                    key: KEY.into(),
                    message: "give webhook_url or webhook_url_file, not both".into(),
                })
            };
            kept(&mut errors, read.map_err(ConfigErrors::from))
        });
        if let Some(Some(rules)) = rules {
            raw.rules.extend(rules);
        }
        let validated = raw.validate(clouds);
        // The main file's problems first, then the other files'.
        let mut config = match validated {
            Ok(config) if errors.is_empty() => config,
            Ok(_) => return Err(ConfigErrors(errors)),
            Err(mut e) => {
                e.0.extend(errors);
                return Err(e);
            }
        };
        config.server.web = web.flatten();
        config.actions.webhook_url = webhook.flatten().or(config.actions.webhook_url);
        for (i, b) in config.budgets.iter_mut().enumerate() {
            if let BudgetSource::Prometheus(q) = &mut b.source {
                budgets::resolve_files(q, base, &format!("budgets[{i}]"))?;
            }
        }
        if let Some(c) = &mut config.controller {
            budgets::resolve_files(&mut c.prometheus, base, "controller")?;
        }
        config.path = path.to_path_buf();
        Ok(config)
    }

    /// Reads the config for a command that needs only the state directory (`hold`, `release`,
    /// `audit`): the rules file, the web config (and its certificates) and the webhook URL file
    /// are not read, so that a broken certificate or secret never keeps an operator from
    /// holding the node's actions.
    pub fn load_for_state(path: &Path, clouds: Clouds) -> Result<Config, ConfigErrors> {
        let text = read_config_file(path)?;
        let mut raw = RawConfig::parse(&text, path)?;
        raw.rules_file.clear();
        raw.server.web_config_file.clear();
        raw.actions.webhook_url_file.clear();
        let mut config = raw.validate(clouds)?;
        config.path = path.to_path_buf();
        Ok(config)
    }

    /// Adds the rules of a JSON (or TOML `[[rules]]`) file, as `--rules PATH` does.
    pub fn add_rules_file(&mut self, file: &Path) -> Result<(), ConfigErrors> {
        let raw = load_rules_file(file)?;
        let mut errors = Vec::new();
        let actions = raw.iter().enumerate();
        let actions = actions.map(|(i, r)| (format!("rules[{i}].action"), r.action.clone()));
        sections::refused(self.cloud.keys, actions, &mut errors);
        add_rules(&mut self.rules, raw, &self.budgets, &mut errors);
        check_unique(&self.rules, &mut errors);
        let owners = self.sampling.process_owners;
        check_holders(&self.rules, self.slurm.enabled, owners, &mut errors);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

/// Reads the webhook URL from its file (whitespace around it, a final newline say, is not
/// part of it). The URL is a secret: a message says what is wrong with it, never what it is.
fn read_webhook_url(file: &Path) -> Result<String, ConfigError> {
    let text = crate::files::read_text(file, check::MAX_SECRET_BYTES, crate::files::Links::Follow)
        .map_err(|source| ConfigError::Read {
            path: file.to_path_buf(),
            source,
        })?;
    let url = text.trim();
    let mut bad = false;
    check::url(&mut |_: &str, _: String| bad = true, "", url, true);
    if bad {
        return Err(ConfigError::Invalid {
            key: "actions.webhook_url_file".into(),
            message: format!(
                "{}: holds no http:// or https:// URL (one line, the URL alone)",
                file.display()
            ),
        });
    }
    Ok(url.to_string())
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

    pub fn validate(self, clouds: Clouds) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let mut invalid = |key: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: key.to_string(),
                message,
            })
        };
        let server = self.server.validate(&mut invalid);
        let nvml = self.nvml.validate(&mut invalid);
        let amd = self.amd.validate(&mut invalid);
        let nvml = nvml.zip(amd);
        let sampling = self.sampling.validate(&mut invalid);
        let tables: Vec<(&str, &toml::Value)> = (self.cloudwatch.iter())
            .map(|t| ("cloudwatch", t))
            .collect();
        let cloud = self
            .cloud
            .validate(clouds, &tables, &mut invalid, &mut warnings);
        let actions = self.actions.validate(&mut invalid);
        let vetoes = self.vetoes.validate(&mut invalid);
        let spot = self.spot.validate(&mut invalid);
        let cost = self.cost.validate(&mut invalid);
        let exposition = self.exposition.validate(&mut invalid);
        let kubernetes = self.kubernetes.validate(&mut invalid);
        let slurm = self.slurm.validate(&mut invalid);
        let node = validate_labels(&self.node, &self.cloud.tag_labels, &mut invalid);
        let health = self.health.validate(&mut invalid);
        // A stall is judged over at least two whole sampling cycles: a slow interval never makes
        // a working daemon look stalled.
        let server = server.map(|mut server| {
            if let Some(sampling) = &sampling {
                let cycles = 2 * (sampling.interval + sampling.timeout);
                server.stall_timeout = server.stall_timeout.max(cycles);
            }
            server
        });

        let budgets = validate_budgets(&self.budgets, clouds, &mut errors);
        let controller = self.controller.validate(&mut errors);
        refuse_what_the_cloud_cannot(&self, clouds, &mut errors);
        let mut rules = Vec::new();
        add_rules(&mut rules, self.rules, &budgets, &mut errors);
        for b in &budgets {
            if let Some(action) = b.on_exhausted {
                rules.push(exhausted_rule(b, action));
            }
        }
        check_unique(&rules, &mut errors);
        if let Some(slurm) = &slurm {
            let owners = self.sampling.process_owners;
            check_holders(&rules, slurm.enabled, owners, &mut errors);
        }

        match (
            server, nvml, sampling, cloud, actions, vetoes, spot, cost, exposition, kubernetes,
            node, health, slurm,
        ) {
            (
                Some(server),
                Some(nvml),
                Some(sampling),
                Some(cloud),
                Some(actions),
                Some(vetoes),
                Some(spot),
                Some(cost),
                Some(exposition),
                Some(kubernetes),
                Some(node),
                Some(health),
                Some(slurm),
            ) if errors.is_empty() => Ok(Config {
                server,
                nvml: nvml.0,
                amd: nvml.1,
                sampling,
                cloud,
                actions,
                vetoes: std::sync::Arc::new(vetoes),
                spot,
                cost,
                exposition,
                kubernetes,
                node,
                health,
                slurm,
                budgets,
                rules,
                controller,
                path: std::path::PathBuf::new(),
                warnings,
            }),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

/// An action the configured cloud's plan refuses on every instance is refused at load, in the
/// plan's words, naming the key.
fn refuse_what_the_cloud_cannot(raw: &RawConfig, clouds: Clouds, errors: &mut Vec<ConfigError>) {
    let named = clouds.iter().find(|c| c.name == raw.cloud.provider);
    let rules = raw.rules.iter().enumerate();
    let rules = rules.map(|(i, r)| (format!("rules[{i}].action"), r.action.clone()));
    let budgets = raw.budgets.iter().enumerate();
    let exhausted =
        budgets.map(|(i, b)| (format!("budgets[{i}].on_exhausted"), b.on_exhausted.clone()));
    sections::refused(named.and_then(|c| c.keys), rules.chain(exhausted), errors);
}

/// Validates the budgets, each named once.
fn validate_budgets(
    raw: &[RawBudget],
    clouds: Clouds,
    errors: &mut Vec<ConfigError>,
) -> Vec<BudgetConfig> {
    let mut budgets = Vec::new();
    for (i, raw) in raw.iter().enumerate() {
        match raw.validate(&format!("budgets[{i}]"), clouds) {
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
    budgets
}

/// Validates raw rules after those already in `rules`, numbering them on from there, and checks
/// that each budget gate names a budget: `[[rules]]`, a `rules_file` and `--rules` alike.
fn add_rules(
    rules: &mut Vec<Rule>,
    raw: Vec<RawRule>,
    budgets: &[BudgetConfig],
    errors: &mut Vec<ConfigError>,
) {
    let offset = rules.len();
    for (i, r) in raw.into_iter().enumerate() {
        let key = format!("rules[{}]", offset + i);
        match r.validate(&key) {
            Ok(rule) => {
                if let Some(g) = &rule.budget {
                    if !budgets.iter().any(|b| b.name == g.name) {
                        errors.push(ConfigError::Invalid {
                            key: format!("{key}.budget.name"),
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
                    BudgetSource::Prometheus(_) | BudgetSource::Cloud { .. } => {
                        step::BudgetSource::External
                    }
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
        let mut c = Config::parse("", Path::new("x.toml"), &[]).unwrap();
        assert_eq!(c.path, Path::new("x.toml"));
        c.path = PathBuf::new();
        assert_eq!(c, Config::default());
    }

    /// A rule on health needs no comparison or threshold: it reads "any GPU is unhealthy",
    /// in the TOML form and the JSON one alike.
    #[test]
    fn a_rule_on_health_defaults_to_any_gpu_unhealthy() {
        let toml = "[[rules]]\nname = \"broken\"\nmetric = \"gpu_unhealthy\"\nperiod = \"5m\"\nevaluation_periods = 3\naction = \"stop\"\n";
        let from_toml = Config::parse(toml, Path::new("x.toml"), &[]).unwrap().rules;
        let json = r#"{"Rules": [{"Description": "broken", "Actions": [{"Type": "Stop"}],
            "Trigger": {"Metric": "GPUHealth", "Period": 300, "EvaluationPeriods": 3}}]}"#;
        let raw = RawConfig {
            rules: json::parse(json, "rules.json").unwrap(),
            ..RawConfig::default()
        };
        let from_json = raw.validate(&[]).unwrap().rules;
        for rules in [from_toml, from_json] {
            let c = rules[0].condition().unwrap();
            assert_eq!(
                (c.metric, c.comparison, c.threshold, c.gpus, c.statistic),
                (
                    Metric::GpuUnhealthy,
                    Comparison::GreaterThanOrEqual,
                    1.0,
                    Aggregation::Any,
                    Statistic::Average
                )
            );
            assert_eq!(
                rules[0].describe(),
                "stop when any GPU is unhealthy throughout 3 of 3 periods of 5m"
            );
        }
    }
}
