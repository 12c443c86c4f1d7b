//! `[[rules]]`: the raw rule (TOML, or the JSON form through `json.rs`), rules files, and
//! the validation that turns a raw rule into a `Rule`.

use super::*;

/// `budget = { name = "team-gpu", spent_at_least = 0.8 }` in a rule.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGate {
    pub name: String,
    pub spent_at_least: f64,
}

/// One `[[rules]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: String,
    pub metric: String,
    #[serde(default)]
    pub statistic: Option<String>,
    /// Required, except for `gpu_unhealthy` ("greater_than_or_equal").
    #[serde(default)]
    pub comparison: Option<String>,
    /// Required, except for `gpu_unhealthy` (1: unhealthy).
    #[serde(default)]
    pub threshold: Option<f64>,
    pub period: String,
    #[serde(default = "one")]
    pub evaluation_periods: u32,
    #[serde(default)]
    pub datapoints_to_alarm: Option<u32>,
    #[serde(default)]
    pub gpus: Option<String>,
    /// "node" (the default) or "pod".
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub lifecycle: Option<String>,
    pub action: String,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub budget: Option<RawGate>,
}

pub(super) fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRulesFile {
    rules: Vec<RawRule>,
}

/// Loads rules from a file: the JSON form when it ends in `.json`, else `[[rules]]` tables.
pub(super) fn load_rules_file(path: &Path) -> Result<Vec<RawRule>, ConfigErrors> {
    let text = read_config_file(path)?;
    let source = path.display().to_string();
    if path.extension().is_some_and(|e| e == "json") {
        Ok(json::parse(&text, &source)?)
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

pub(super) fn check_unique(rules: &[Rule], errors: &mut Vec<ConfigError>) {
    for (i, r) in rules.iter().enumerate() {
        // A name a pod, job or user rule takes for one holder would share its state.
        if let Some(o) = rules
            .iter()
            .find(|o| o.scope != Scope::Node && o.name != r.name && o.owns_state(&r.name))
        {
            errors.push(ConfigError::Invalid {
                key: format!("rules[{i}].name"),
                message: format!(
                    "\"{}\" is the name rule \"{}\" takes for one {}; choose another",
                    r.name,
                    o.name,
                    o.scope.as_str()
                ),
            });
        }
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

/// A job's rule needs `[slurm]`, and a user's needs Slurm or process owners: without them it
/// would judge nobody, and never breach.
pub(super) fn check_holders(
    rules: &[Rule],
    slurm: bool,
    owners: bool,
    errors: &mut Vec<ConfigError>,
) {
    for (i, r) in rules.iter().enumerate() {
        let needs = match r.scope {
            Scope::Job if !slurm => "[slurm] enabled = true",
            Scope::User if !slurm && !owners => {
                "[slurm] enabled = true or [sampling] process_owners = true"
            }
            _ => continue,
        };
        errors.push(ConfigError::Invalid {
            key: format!("rules[{i}].scope"),
            message: format!(
                "\"{}\" judges who holds each GPU, which gpuwatch reads only with {needs}",
                r.scope.as_str()
            ),
        });
    }
}

/// A rule's words, each read into what it names; `None` where one is missing or wrong.
struct Words {
    metric: Option<Metric>,
    statistic: Option<Statistic>,
    comparison: Option<Comparison>,
    threshold: Option<f64>,
    gpus: Option<Aggregation>,
    scope: Option<Scope>,
    lifecycle: Option<Option<Lifecycle>>,
    action: Option<Action>,
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
        check_name(&mut invalid, "rule", &self.name);
        // A rule on health reads "any GPU is unhealthy" unless it says otherwise.
        let health = self.metric == Metric::GpuUnhealthy.as_str();
        let w = self.words(health, &mut invalid);
        if let (Some(m), Some(threshold)) = (w.metric, w.threshold) {
            check_threshold(&mut invalid, m, threshold);
        }
        if health {
            check_health_rule(&mut invalid, &w);
        }
        if w.action == Some(Action::Reclaim) {
            check_reclaim_rule(&mut invalid, &w, self.budget.is_some());
        }
        let period = self.window(&mut invalid);
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
        self.check_action(&mut invalid, w.scope, w.action);
        match (
            w.metric,
            w.statistic,
            w.comparison,
            w.gpus,
            w.scope,
            w.lifecycle,
            w.action,
            period,
            w.threshold,
        ) {
            (
                Some(metric),
                Some(statistic),
                Some(comparison),
                Some(gpus),
                Some(scope),
                Some(lifecycle),
                Some(action),
                Some(period),
                Some(threshold),
            ) if errors.is_empty() => Ok(Rule {
                name: self.name.clone(),
                scope,
                subject: None,
                trigger: Trigger::Idle(Condition {
                    metric,
                    statistic,
                    comparison,
                    threshold,
                    period,
                    evaluation_periods: self.evaluation_periods,
                    datapoints_to_alarm: m,
                    gpus,
                }),
                lifecycle,
                action,
                command: self.command.clone(),
                budget: self.budget.as_ref().map(|g| BudgetGate {
                    name: g.name.clone(),
                    spent_at_least: g.spent_at_least,
                }),
            }),
            _ => Err(errors),
        }
    }

    /// Reads each word of the rule, with the defaults a rule on health (`health`) takes.
    fn words(&self, health: bool, invalid: &mut impl FnMut(&str, String)) -> Words {
        let comparison_text = match (&self.comparison, health) {
            (Some(c), _) => Some(c.as_str()),
            (None, true) => Some("greater_than_or_equal"),
            (None, false) => {
                invalid(
                    "comparison",
                    "a rule needs a comparison, such as \"less_than\"".into(),
                );
                None
            }
        };
        let threshold = match (self.threshold, health) {
            (Some(t), _) => Some(t),
            (None, true) => Some(1.0),
            (None, false) => {
                invalid("threshold", "a rule needs a threshold, such as 0.05".into());
                None
            }
        };
        let metric = pick(
            invalid,
            "metric",
            &self.metric,
            &Metric::ALL.map(|m| (m.as_str(), m)),
        );
        let statistic = pick(
            invalid,
            "statistic",
            self.statistic.as_deref().unwrap_or("average"),
            &[
                ("average", Statistic::Average),
                ("maximum", Statistic::Maximum),
            ],
        );
        let comparison = comparison_text.and_then(|c| {
            pick(
                invalid,
                "comparison",
                c,
                &[
                    ("less_than", Comparison::LessThan),
                    ("less_than_or_equal", Comparison::LessThanOrEqual),
                    ("greater_than", Comparison::GreaterThan),
                    ("greater_than_or_equal", Comparison::GreaterThanOrEqual),
                ],
            )
        });
        let gpus = pick(
            invalid,
            "gpus",
            self.gpus
                .as_deref()
                .unwrap_or(if health { "any" } else { "every" }),
            &[("every", Aggregation::Every), ("any", Aggregation::Any)],
        );
        let (scope, lifecycle, action) = self.target(invalid);
        Words {
            metric,
            statistic,
            comparison,
            threshold,
            gpus,
            scope,
            lifecycle,
            action,
        }
    }

    /// Whom the rule judges, on which lifecycle, and what it does.
    fn target(
        &self,
        invalid: &mut impl FnMut(&str, String),
    ) -> (Option<Scope>, Option<Option<Lifecycle>>, Option<Action>) {
        let scope = pick(
            invalid,
            "scope",
            self.scope.as_deref().unwrap_or("node"),
            &[
                ("node", Scope::Node),
                ("pod", Scope::Pod),
                ("job", Scope::Job),
                ("user", Scope::User),
            ],
        );
        let lifecycle = match self.lifecycle.as_deref() {
            None => Some(None),
            Some(l) => pick(
                invalid,
                "lifecycle",
                l,
                &[
                    ("spot", Some(Lifecycle::Spot)),
                    ("on-demand", Some(Lifecycle::OnDemand)),
                ],
            ),
        };
        let action = pick(
            invalid,
            "action",
            &self.action,
            &[
                ("alert", Action::Alert),
                ("exec", Action::Exec),
                ("reclaim", Action::Reclaim),
                ("stop", Action::Stop),
                ("hibernate", Action::Hibernate),
                ("terminate", Action::Terminate),
            ],
        );
        (scope, lifecycle, action)
    }

    /// The period, and how many of them the rule looks back over.
    fn window(&self, invalid: &mut impl FnMut(&str, String)) -> Option<Duration> {
        let period = duration(
            invalid,
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
        period
    }

    /// An exec rule needs a command; a pod's, job's or user's rule may not act on the instance.
    fn check_action(
        &self,
        invalid: &mut impl FnMut(&str, String),
        scope: Option<Scope>,
        action: Option<Action>,
    ) {
        if action == Some(Action::Exec) && self.command.is_empty() {
            invalid(
                "command",
                "an exec rule needs a command, such as [\"/usr/local/bin/notify\", \"idle\"]"
                    .into(),
            );
        }
        if let (Some(Scope::Pod), Some(a)) = (scope, action) {
            if a.is_instance_action() {
                invalid(
                    "action",
                    format!("\"{a}\" acts on the instance, and a pod-scoped rule judges one pod: on Kubernetes the cluster autoscaler owns the node; use \"reclaim\" (the cluster controller gives the pod's workload back), \"alert\" or \"exec\""),
                );
            }
        }
        if action == Some(Action::Reclaim) && scope.is_some_and(|s| s != Scope::Pod) {
            invalid(
                "action",
                format!(
                    "\"reclaim\" gives a pod's GPUs back through the cluster controller, and this rule's scope is \"{}\": set scope = \"pod\"",
                    scope.map_or("node", Scope::as_str)
                ),
            );
        }
        if let (Some(s @ (Scope::Job | Scope::User)), Some(a)) = (scope, action) {
            if a.is_instance_action() {
                invalid(
                    "action",
                    format!("\"{a}\" acts on the instance, and a {0}-scoped rule judges one {0}: the node is not theirs to stop; use \"alert\" or \"exec\" (which may, say, scancel the job)", s.as_str()),
                );
            }
        }
    }
}

/// A ratio's threshold lies between 0 and 1; a count's is 0 or more.
fn check_threshold(invalid: &mut impl FnMut(&str, String), m: Metric, threshold: f64) {
    let ok = if m.is_ratio() {
        (0.0..=1.0).contains(&threshold)
    } else {
        threshold >= 0.0 && threshold.is_finite()
    };
    if !ok {
        let what = if m.is_ratio() {
            "a ratio between 0 and 1"
        } else {
            "a count of 0 or more"
        };
        invalid("threshold", format!("\"{threshold}\" is not {what}"));
    }
}

/// A reclaim verdict says a pod's GPUs are idle, and stands while every one of them stays under
/// the threshold: only a rule that breaches on readings below it can give one, and idleness
/// alone (no budget gate) keeps it.
fn check_reclaim_rule(invalid: &mut impl FnMut(&str, String), w: &Words, gated: bool) {
    let above = match w.comparison {
        Some(Comparison::GreaterThan) => "greater_than",
        Some(Comparison::GreaterThanOrEqual) => "greater_than_or_equal",
        _ => "",
    };
    if !above.is_empty() {
        invalid(
            "comparison",
            format!("\"{above}\": a reclaim rule judges idleness, readings below its threshold: use \"less_than\" or \"less_than_or_equal\""),
        );
    }
    if gated {
        invalid(
            "budget",
            "a reclaim verdict stands on idleness alone: leave the budget gate out".into(),
        );
    }
}

/// A rule on `gpu_unhealthy` breaches while a GPU is unhealthy, on the node, and acts gently.
fn check_health_rule(invalid: &mut impl FnMut(&str, String), w: &Words) {
    // Any other comparison or threshold would breach on healthy GPUs.
    if w.comparison
        .is_some_and(|c| c != Comparison::GreaterThanOrEqual)
        || w.threshold.is_some_and(|t| t != 1.0)
    {
        invalid(
            "comparison",
            "a rule on gpu_unhealthy breaches while a GPU is unhealthy: leave out comparison and threshold (they are \"greater_than_or_equal\" and 1)".into(),
        );
    }
    if let Some(s) = w.scope.filter(|s| *s != Scope::Node) {
        invalid(
            "scope",
            format!(
                "\"{}\": a rule on gpu_unhealthy judges the node's GPUs",
                s.as_str()
            ),
        );
    }
    if let Some(a) = w
        .action
        .filter(|a| !matches!(a, Action::Alert | Action::Exec | Action::Stop))
    {
        invalid(
            "action",
            format!("\"{a}\": a rule on gpu_unhealthy may alert, exec or stop (on a cloud, a stop and a start moves the instance to new hardware)"),
        );
    }
}

/// The most evaluation periods a rule may look back over (a week of one-minute periods), and
/// the longest span they may cover. Beyond them a rule is a mistake, and would cost memory.
pub const MAX_EVALUATION_PERIODS: u32 = 10_080;
pub(super) const MAX_RULE_SPAN: Duration = Duration::from_secs(31 * 86_400);
