//! `[[budgets]]`: the raw budget, its validation, and the rule its `on_exhausted` stands for.

use std::collections::BTreeMap;

use super::*;

mod query;
pub use query::{read_ca, read_secret, resolve_files, PrometheusSource, QueryAuth};

/// One `[[budgets]]` table. The keys of a cloud's budget source, and a cloud's topic key, are
/// the cloud's (see `sections.rs`): serde keeps them as written in `cloud_keys`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct RawBudget {
    pub name: String,
    #[serde(default)]
    pub limit_usd: Option<f64>,
    #[serde(default = "local")]
    pub source: String,
    #[serde(default = "default_thresholds")]
    pub thresholds: Vec<f64>,
    #[serde(default = "none")]
    pub on_exhausted: String,
    /// How often an external budget is read: 5m for a cloud's, 60s for Prometheus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<String>,
    /// Whether a crossed threshold is sent (webhook, topic) as well as logged and audited: on,
    /// except for a Prometheus budget, whose fleet alert goes through Alertmanager once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<bool>,
    /// `source = "prometheus"`: where and what to ask, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast_query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Every other key: a cloud's budget source's and a cloud's topic key.
    #[serde(flatten)]
    pub cloud_keys: toml::Table,
}

/// Every budget's own keys, which no cloud's may take.
const OWN_KEYS: &[&str] = &[
    "name",
    "limit_usd",
    "source",
    "thresholds",
    "on_exhausted",
    "poll_interval",
    "notify",
    "url",
    "query",
    "forecast_query",
    "period",
    "timeout",
    "ca_file",
    "username",
    "password_file",
    "bearer_token_file",
    "headers",
];

impl RawBudget {
    /// A Prometheus budget with nothing else set.
    pub(super) fn prometheus() -> RawBudget {
        RawBudget {
            name: String::new(),
            limit_usd: None,
            source: "prometheus".into(),
            thresholds: Vec::new(),
            on_exhausted: none(),
            poll_interval: None,
            notify: None,
            url: None,
            query: None,
            forecast_query: None,
            period: None,
            timeout: None,
            ca_file: None,
            username: None,
            password_file: None,
            bearer_token_file: None,
            headers: BTreeMap::new(),
            cloud_keys: toml::Table::new(),
        }
    }
}

/// The Prometheus keys of `raw`, checked as a Prometheus budget's.
pub(super) fn prometheus_source(
    raw: &RawBudget,
    invalid: &mut impl FnMut(&str, String),
) -> Option<PrometheusSource> {
    query::validate(raw, invalid)
}

pub(super) fn local() -> String {
    "local".into()
}

pub(super) fn none() -> String {
    "none".into()
}

#[derive(Debug, Clone, PartialEq)]
pub enum BudgetSource {
    /// This node's own spend ledger.
    Local,
    /// The fleet's Prometheus (or an API like it), asked with an instant query.
    Prometheus(PrometheusSource),
    /// A budget of the cloud's, read by the cloud's poller: its source's name, and its keys as
    /// written (checked by the cloud at load).
    Cloud {
        source: &'static str,
        keys: toml::Table,
        /// An answer counts for two poll intervals, and at least this long.
        fresh_at_least: Duration,
    },
}

impl BudgetSource {
    /// The source as `source =` names it (and the `source` label of `gpuwatch_budget_info`).
    pub fn as_str(&self) -> &'static str {
        match self {
            BudgetSource::Local => "local",
            BudgetSource::Prometheus(_) => "prometheus",
            BudgetSource::Cloud { source, .. } => source,
        }
    }

    /// The cloud's keys of a budget of the cloud source `source`.
    pub fn cloud_keys(&self, source: &str) -> Option<&toml::Table> {
        match self {
            BudgetSource::Cloud {
                source: s, keys, ..
            } if *s == source => Some(keys),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BudgetConfig {
    pub name: String,
    /// Required for local budgets; a cloud's budgets report their own limit.
    pub limit_usd: Option<f64>,
    pub source: BudgetSource,
    pub thresholds: Vec<f64>,
    pub on_exhausted: Option<Action>,
    /// A topic of the cloud's that crossings are published to (its key is the cloud's).
    pub topic: Option<String>,
    pub poll_interval: Duration,
    /// Whether crossed thresholds are sent (webhook, topic), not only logged and audited.
    pub notify: bool,
}

/// The largest limit a budget may have: a thousand billion dollars. Amounts past it are typos,
/// and their ratios stop meaning anything.
const MAX_LIMIT_USD: f64 = 1e12;

pub(super) fn default_thresholds() -> Vec<f64> {
    vec![0.5, 0.8, 1.0]
}

/// The rule a budget's `on_exhausted` stands for: triggered by the budget's limit, it goes
/// through the same warning, hold, audit and spot-correct path as any other rule.
pub(super) fn exhausted_rule(b: &BudgetConfig, action: Action) -> Rule {
    Rule {
        name: format!("budget {} exhausted", b.name),
        scope: Scope::Node,
        subject: None,
        trigger: Trigger::BudgetExhausted {
            budget: b.name.clone(),
        },
        lifecycle: None,
        action,
        command: Vec::new(),
        budget: None,
    }
}

impl RawBudget {
    pub fn validate(&self, key: &str, clouds: Clouds) -> Result<BudgetConfig, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let mut invalid = |k: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: format!("{key}.{k}"),
                message,
            })
        };
        check_name(&mut invalid, "budget", &self.name);
        let source = self.spend_source(clouds, &mut invalid);
        self.refuse_other_sources_keys(clouds, &mut invalid);
        self.check_limit(&mut invalid);
        let on_exhausted = self.exhausted_action(&mut invalid);
        let topic = self.topic(clouds, &mut invalid);
        let poll_interval = self.poll_every(&mut invalid, source.as_ref());
        match (source, on_exhausted, poll_interval) {
            (Some(source), Some(on_exhausted), Some(poll_interval)) if errors.is_empty() => {
                Ok(BudgetConfig {
                    name: self.name.clone(),
                    limit_usd: self.limit_usd,
                    thresholds: self.thresholds.clone(),
                    on_exhausted,
                    topic,
                    poll_interval,
                    notify: self
                        .notify
                        .unwrap_or(!matches!(source, BudgetSource::Prometheus(_))),
                    source,
                })
            }
            _ => Err(errors),
        }
    }

    /// Where the spend is read: kept here, from a Prometheus query, or in a cloud's budget
    /// (whose keys the cloud checks).
    fn spend_source(
        &self,
        clouds: Clouds,
        invalid: &mut impl FnMut(&str, String),
    ) -> Option<BudgetSource> {
        let of_clouds = || clouds.iter().filter_map(|c| c.keys?.budgets.as_ref());
        match self.source.as_str() {
            "local" => Some(BudgetSource::Local),
            "prometheus" => query::validate(self, invalid).map(BudgetSource::Prometheus),
            other => match of_clouds().find(|b| b.source == other) {
                Some(source) => {
                    let keys: toml::Table = (self.cloud_keys.iter())
                        .filter(|(k, _)| source.keys.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let mut ok = true;
                    (source.check)(&self.name, &keys, &mut |k: &str, m: String| {
                        ok = false;
                        invalid(k, m)
                    });
                    ok.then_some(BudgetSource::Cloud {
                        source: source.source,
                        keys,
                        fresh_at_least: source.fresh_at_least,
                    })
                }
                None => {
                    let names: Vec<String> = ["local", "prometheus"]
                        .into_iter()
                        .chain(of_clouds().map(|b| b.source))
                        .map(|n| format!("\"{n}\""))
                        .collect();
                    invalid(
                        "source",
                        format!("\"{other}\" is not one of {}", names.join(", ")),
                    );
                    None
                }
            },
        }
    }

    /// A key of another source's would be silently unused, and a key no source has is a typo.
    fn refuse_other_sources_keys(&self, clouds: Clouds, invalid: &mut impl FnMut(&str, String)) {
        if self.source != "prometheus" {
            query::refuse_elsewhere(self, invalid);
        }
        let keys = || clouds.iter().filter_map(|c| c.keys);
        for key in self.cloud_keys.keys() {
            if keys().any(|k| k.topic.as_ref().is_some_and(|t| t.key == key)) {
                continue;
            }
            let owner = keys()
                .filter_map(|k| k.budgets.as_ref())
                .find(|b| b.keys.contains(&key.as_str()));
            match owner {
                Some(b) if b.source == self.source => {}
                Some(b) => invalid(
                    key,
                    format!(
                        "belongs to source = \"{}\", and this budget's source is \"{}\"",
                        b.source, self.source
                    ),
                ),
                None => {
                    let known: Vec<String> = (OWN_KEYS.iter().copied())
                        .chain(keys().filter_map(|k| Some(k.topic.as_ref()?.key)))
                        .chain(
                            keys()
                                .filter_map(|k| k.budgets.as_ref())
                                .flat_map(|b| b.keys.iter().copied()),
                        )
                        .map(|k| format!("\"{k}\""))
                        .collect();
                    invalid(
                        key,
                        format!(
                            "\"{key}\" is not a known key; expected one of {}",
                            known.join(", ")
                        ),
                    )
                }
            }
        }
    }

    /// The limit, which a local or Prometheus budget needs, and the thresholds, shares of it.
    fn check_limit(&self, invalid: &mut impl FnMut(&str, String)) {
        match self.limit_usd {
            Some(l) if !(l > 0.0 && l <= MAX_LIMIT_USD) => invalid(
                "limit_usd",
                format!("\"{l:?}\" is not an amount in USD above 0 and at most {MAX_LIMIT_USD:e}"),
            ),
            None if self.source == "local" => {
                invalid("limit_usd", "a local budget needs a limit_usd".into())
            }
            None if self.source == "prometheus" => invalid(
                "limit_usd",
                "a prometheus budget needs a limit_usd: the query gives the spend, not the limit"
                    .into(),
            ),
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
    }

    /// What an exhausted budget does to the instance; never a termination on a team's figure.
    fn exhausted_action(&self, invalid: &mut impl FnMut(&str, String)) -> Option<Option<Action>> {
        let on_exhausted = pick(
            invalid,
            "on_exhausted",
            &self.on_exhausted,
            &[
                ("none", None),
                ("stop", Some(Action::Stop)),
                ("hibernate", Some(Action::Hibernate)),
                ("terminate", Some(Action::Terminate)),
            ],
        );
        if self.source == "prometheus" && self.on_exhausted == "terminate" {
            invalid(
                "on_exhausted",
                "\"terminate\" is refused on a prometheus budget: one wrong team figure would terminate every node of the team; use \"stop\" or \"hibernate\"".into(),
            );
        }
        on_exhausted
    }

    /// The topic crossings are published to, as a cloud's key names it (the cloud checks it),
    /// which a Prometheus budget publishes to only when told to.
    fn topic(&self, clouds: Clouds, invalid: &mut impl FnMut(&str, String)) -> Option<String> {
        let topics = clouds.iter().filter_map(|c| c.keys?.topic.as_ref());
        let mut found = None;
        for topic in topics {
            let Some(value) = self.cloud_keys.get(topic.key) else {
                continue;
            };
            let Some(value) = value.as_str() else {
                invalid(
                    topic.key,
                    format!("invalid type: {}, expected a string", value.type_str()),
                );
                continue;
            };
            if self.source == "prometheus" && self.notify != Some(true) {
                invalid(
                    topic.key,
                    "a prometheus budget sends no threshold alerts of its own (the fleet's Alertmanager does); set notify = true to publish them here too".into(),
                );
            }
            match (topic.check)(value) {
                Some(why) => invalid(topic.key, why),
                None => found = Some(value.to_string()),
            }
        }
        found
    }

    /// How often the spend is read; a Prometheus query must answer within it.
    fn poll_every(
        &self,
        invalid: &mut impl FnMut(&str, String),
        source: Option<&BudgetSource>,
    ) -> Option<Duration> {
        let every = match self.source.as_str() {
            "prometheus" => "60s",
            _ => "5m",
        };
        let poll_interval = duration(
            invalid,
            "poll_interval",
            self.poll_interval.as_deref().unwrap_or(every),
            Duration::from_secs(1)..=DAY,
        );
        if let (Some(every), Some(BudgetSource::Prometheus(q))) = (poll_interval, source) {
            if q.timeout > every {
                invalid(
                    "timeout",
                    format!(
                        "\"{}\" is longer than the poll_interval ({})",
                        humantime::format_duration(q.timeout),
                        humantime::format_duration(every)
                    ),
                );
            }
        }
        poll_interval
    }
}
