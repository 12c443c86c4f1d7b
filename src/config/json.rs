//! Rules in the JSON form users already write, with CloudWatch-style names and percents:
//!
//! ```json
//! {"Rules": [{"Description": "Terminate if GPU idle > 2h",
//!             "Actions": [{"Type": "Terminate"}],
//!             "Trigger": {"Metric": "GPUUtilization", "Comparison": "LessThan",
//!                         "Threshold": 5, "Period": 3600, "EvaluationPeriods": 2}}]}
//! ```
//!
//! Each rule becomes exactly the TOML rule it means (a threshold of 5 percent is the ratio 0.05),
//! and goes through the same validation. `"Metric": "GPUHealth"` (or `"gpu_health"`) is the
//! rule on health (`gpu_unhealthy`), which needs no comparison or threshold.

use serde::Deserialize;

use super::{ConfigError, RawRule};

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct JsonRules {
    rules: Vec<JsonRule>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct JsonRule {
    description: String,
    actions: Vec<JsonAction>,
    trigger: JsonTrigger,
    #[serde(default)]
    lifecycle: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct JsonAction {
    #[serde(rename = "Type")]
    kind: String,
    #[serde(default)]
    command: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct JsonTrigger {
    metric: String,
    /// Required, except for `GPUHealth`.
    #[serde(default)]
    comparison: Option<String>,
    #[serde(default)]
    threshold: Option<f64>,
    period: u64,
    #[serde(default = "one")]
    evaluation_periods: u32,
    #[serde(default)]
    datapoints_to_alarm: Option<u32>,
    #[serde(default)]
    statistic: Option<String>,
    /// "Every" (default) or "Any".
    #[serde(default)]
    gpus: Option<String>,
}

fn one() -> u32 {
    1
}

/// Parses a JSON rules file into raw rules; `source` names the file in messages.
pub fn parse(text: &str, source: &str) -> Result<Vec<RawRule>, ConfigError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed: JsonRules = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ConfigError::Invalid {
            key: format!("{source}: {path}"),
            message: e.into_inner().to_string().replace('`', "\""),
        }
    })?;
    let mut out = Vec::new();
    for (i, r) in parsed.rules.into_iter().enumerate() {
        let key = |k: &str| format!("{source}: Rules[{i}].{k}");
        let (metric, scale) = match r.trigger.metric.as_str() {
            "GPUUtilization" => ("gpu_utilization", 100.0),
            "GPUMemoryUtilization" => ("memory_utilization", 100.0),
            "GPUMemoryUsedPercent" => ("memory_used_ratio", 100.0),
            "GPUPowerPercent" => ("power_ratio", 100.0),
            "GPUProcessCount" => ("processes", 1.0),
            "SMActivity" => ("sm_active", 100.0),
            "TensorActivity" => ("tensor_active", 100.0),
            "DRAMActivity" => ("dram_active", 100.0),
            // 1 while a GPU is unhealthy.
            "GPUHealth" | "gpu_health" => ("gpu_unhealthy", 1.0),
            other => {
                return Err(ConfigError::Invalid {
                    key: key("Trigger.Metric"),
                    message: format!(
                        "\"{other}\" is not one of GPUUtilization, GPUMemoryUtilization, GPUMemoryUsedPercent, GPUPowerPercent, GPUProcessCount, SMActivity, TensorActivity, DRAMActivity, GPUHealth"
                    ),
                })
            }
        };
        let comparison = match r.trigger.comparison.as_deref() {
            None => None,
            Some(c) => Some(match c.trim_end_matches("Threshold") {
                "LessThan" => "less_than",
                "LessThanOrEqual" | "LessThanOrEqualTo" => "less_than_or_equal",
                "GreaterThan" => "greater_than",
                "GreaterThanOrEqual" | "GreaterThanOrEqualTo" => "greater_than_or_equal",
                _ => {
                    return Err(ConfigError::Invalid {
                        key: key("Trigger.Comparison"),
                        message: format!(
                            "\"{c}\" is not one of LessThan, LessThanOrEqual, GreaterThan, GreaterThanOrEqual"
                        ),
                    })
                }
            }),
        };
        if r.actions.is_empty() {
            return Err(ConfigError::Invalid {
                key: key("Actions"),
                message: "a rule needs one action".into(),
            });
        }
        let n_actions = r.actions.len();
        for (j, a) in r.actions.into_iter().enumerate() {
            let name = if n_actions == 1 {
                r.description.clone()
            } else {
                format!("{} #{}", r.description, j + 1)
            };
            out.push(RawRule {
                name,
                metric: metric.to_string(),
                statistic: r.trigger.statistic.as_deref().map(str::to_ascii_lowercase),
                comparison: comparison.map(str::to_string),
                threshold: r.trigger.threshold.map(|t| t / scale),
                period: format!("{}s", r.trigger.period),
                evaluation_periods: r.trigger.evaluation_periods,
                datapoints_to_alarm: r.trigger.datapoints_to_alarm,
                scope: None,
                gpus: r.trigger.gpus.as_deref().map(str::to_ascii_lowercase),
                lifecycle: r.lifecycle.clone(),
                action: a.kind.to_ascii_lowercase(),
                command: a.command,
                budget: None,
            });
        }
    }
    Ok(out)
}
