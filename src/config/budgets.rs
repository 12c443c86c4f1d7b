//! `[[budgets]]`: the raw budget, its validation, and the rule its `on_exhausted` stands for.

use std::collections::BTreeMap;

use super::*;

mod query;
pub use query::{read_ca, read_secret, resolve_files, PrometheusSource, QueryAuth};

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
    /// `source = "azure_budgets"`: the subscription or resource group the budget is set on
    /// (`/subscriptions/<id>` or `/subscriptions/<id>/resourceGroups/<name>`), and its name
    /// there if not `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_budget_name: Option<String>,
    #[serde(default = "default_thresholds")]
    pub thresholds: Vec<f64>,
    #[serde(default = "none")]
    pub on_exhausted: String,
    #[serde(default)]
    pub sns_topic_arn: Option<String>,
    /// How often an external budget is read: 5m for AWS Budgets, 60s for Prometheus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<String>,
    /// Whether a crossed threshold is sent (webhook, SNS) as well as logged and audited: on,
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
}

impl RawBudget {
    /// A Prometheus budget with nothing else set.
    pub(super) fn prometheus() -> RawBudget {
        RawBudget {
            name: String::new(),
            limit_usd: None,
            source: "prometheus".into(),
            aws_budget_name: None,
            account_id: None,
            scope: None,
            azure_budget_name: None,
            thresholds: Vec::new(),
            on_exhausted: none(),
            sns_topic_arn: None,
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
    /// An AWS Budget, read with DescribeBudget.
    AwsBudgets {
        budget_name: String,
        account_id: String,
    },
    /// The fleet's Prometheus (or an API like it), asked with an instant query.
    Prometheus(PrometheusSource),
    /// An Azure Consumption budget, at a subscription or resource group scope.
    AzureBudgets { scope: String, budget_name: String },
}

impl BudgetSource {
    /// The source as `source =` names it (and the `source` label of `gpuwatch_budget_info`).
    pub fn as_str(&self) -> &'static str {
        match self {
            BudgetSource::Local => "local",
            BudgetSource::AwsBudgets { .. } => "aws_budgets",
            BudgetSource::Prometheus(_) => "prometheus",
            BudgetSource::AzureBudgets { .. } => "azure_budgets",
        }
    }
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
    /// Whether crossed thresholds are sent (webhook, SNS), not only logged and audited.
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
    pub fn validate(&self, key: &str) -> Result<BudgetConfig, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let mut invalid = |k: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: format!("{key}.{k}"),
                message,
            })
        };
        check_name(&mut invalid, "budget", &self.name);
        let source = self.spend_source(&mut invalid);
        self.refuse_other_sources_keys(&mut invalid);
        self.check_limit(&mut invalid);
        let on_exhausted = self.exhausted_action(&mut invalid);
        self.check_sns(&mut invalid);
        let poll_interval = self.poll_every(&mut invalid, source.as_ref());
        match (source, on_exhausted, poll_interval) {
            (Some(source), Some(on_exhausted), Some(poll_interval)) if errors.is_empty() => {
                Ok(BudgetConfig {
                    name: self.name.clone(),
                    limit_usd: self.limit_usd,
                    thresholds: self.thresholds.clone(),
                    on_exhausted,
                    sns_topic_arn: self.sns_topic_arn.clone(),
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

    /// Where the spend is read: kept here, in AWS Budgets, or from a Prometheus query.
    fn spend_source(&self, invalid: &mut impl FnMut(&str, String)) -> Option<BudgetSource> {
        match self.source.as_str() {
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
            "prometheus" => query::validate(self, invalid).map(BudgetSource::Prometheus),
            "azure_budgets" => self.azure_source(invalid),
            other => {
                invalid(
                    "source",
                    format!("\"{other}\" is not one of \"local\", \"aws_budgets\", \"prometheus\", \"azure_budgets\""),
                );
                None
            }
        }
    }

    /// An Azure Consumption budget: its scope, a subscription or a resource group in one, and
    /// its name there.
    fn azure_source(&self, invalid: &mut impl FnMut(&str, String)) -> Option<BudgetSource> {
        let Some(scope) = self.scope.as_deref() else {
            invalid(
                "scope",
                "an azure_budgets budget needs the scope it is set on: \"/subscriptions/<id>\" or \"/subscriptions/<id>/resourceGroups/<name>\"".into(),
            );
            return None;
        };
        // A subscription id is a GUID; a resource group's name is letters, digits, `._-()`.
        let guid = |s: &str| s.len() == 36 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        let group = |s: &str| {
            !s.is_empty()
                && s.len() <= 90
                && !s.ends_with('.')
                && s.chars()
                    .all(|c| c.is_alphanumeric() || "._-()".contains(c))
        };
        let parts: Vec<&str> = scope.split('/').collect();
        let ok = match parts.as_slice() {
            ["", "subscriptions", sub] => guid(sub),
            ["", "subscriptions", sub, rg, name] => {
                guid(sub) && rg.eq_ignore_ascii_case("resourceGroups") && group(name)
            }
            _ => false,
        };
        let name = self
            .azure_budget_name
            .clone()
            .unwrap_or_else(|| self.name.clone());
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
        if !ok {
            invalid(
                "scope",
                format!(
                    "\"{}\" is not \"/subscriptions/<id>\" or \"/subscriptions/<id>/resourceGroups/<name>\"",
                    crate::redact::brief(scope, 200)
                ),
            );
        }
        if !name_ok {
            invalid(
                if self.azure_budget_name.is_some() { "azure_budget_name" } else { "name" },
                format!(
                    "\"{}\" is not the name of an Azure budget (letters, digits, _ and -, at most 63)",
                    crate::redact::brief(&name, 80)
                ),
            );
        }
        (ok && name_ok).then(|| BudgetSource::AzureBudgets {
            scope: scope.to_string(),
            budget_name: name,
        })
    }

    /// A Prometheus or AWS Budgets key on a budget of another source would be silently unused.
    fn refuse_other_sources_keys(&self, invalid: &mut impl FnMut(&str, String)) {
        if self.source != "prometheus" {
            query::refuse_elsewhere(self, invalid);
        }
        if self.source != "aws_budgets" {
            for (k, set) in [
                ("account_id", self.account_id.is_some()),
                ("aws_budget_name", self.aws_budget_name.is_some()),
            ] {
                if set {
                    invalid(
                        k,
                        format!(
                            "belongs to source = \"aws_budgets\", and this budget's source is \"{}\"",
                            self.source
                        ),
                    );
                }
            }
        }
        if self.source != "azure_budgets" {
            for (k, set) in [
                ("scope", self.scope.is_some()),
                ("azure_budget_name", self.azure_budget_name.is_some()),
            ] {
                if set {
                    invalid(
                        k,
                        format!(
                            "belongs to source = \"azure_budgets\", and this budget's source is \"{}\"",
                            self.source
                        ),
                    );
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

    /// An SNS topic is an ARN, and a Prometheus budget publishes to it only when told to.
    fn check_sns(&self, invalid: &mut impl FnMut(&str, String)) {
        if self.sns_topic_arn.is_some() && self.source == "prometheus" && self.notify != Some(true)
        {
            invalid(
                "sns_topic_arn",
                "a prometheus budget sends no threshold alerts of its own (the fleet's Alertmanager does); set notify = true to publish them here too".into(),
            );
        }
        if let Some(arn) = &self.sns_topic_arn {
            if !arn.starts_with("arn:") {
                invalid(
                    "sns_topic_arn",
                    format!("\"{arn}\" is not an SNS topic ARN"),
                );
            }
        }
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
