//! `[[budgets]] source = "aws_budgets"`: an AWS Budget, read with DescribeBudget; and
//! `sns_topic_arn`, the SNS topic any budget's crossings may be published to.

use std::time::Duration;

use serde::Deserialize;

use crate::config::{BudgetSourceKeys, Invalid, TopicKey};

/// The budget source, as the config reads it.
pub const SOURCE: BudgetSourceKeys = BudgetSourceKeys {
    source: "aws_budgets",
    keys: &["account_id", "aws_budget_name"],
    check,
    // At least a minute, so that a short interval does not flicker on a busy node.
    fresh_at_least: Duration::from_secs(60),
};

/// The SNS topic key of any budget.
pub const TOPIC: TopicKey = TopicKey {
    key: "sns_topic_arn",
    check: |arn| (!arn.starts_with("arn:")).then(|| format!("\"{arn}\" is not an SNS topic ARN")),
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Keys {
    account_id: Option<String>,
    aws_budget_name: Option<String>,
}

/// An AWS Budget: its name in the account, and the account that owns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub budget_name: String,
    pub account_id: String,
}

impl Budget {
    /// The budget gpuwatch calls `name`, from its keys; or the problem, as a key and message.
    pub fn read(name: &str, keys: &toml::Table) -> Result<Budget, (String, String)> {
        let keys: Keys = crate::config::parse_table(keys)?;
        match keys.account_id {
            Some(a) if a.len() == 12 && a.bytes().all(|b| b.is_ascii_digit()) => Ok(Budget {
                budget_name: keys.aws_budget_name.unwrap_or_else(|| name.to_string()),
                account_id: a,
            }),
            Some(a) => Err((
                "account_id".into(),
                format!("\"{a}\" is not a 12-digit AWS account id"),
            )),
            None => Err((
                "account_id".into(),
                "an aws_budgets budget needs the 12-digit account_id that owns it".into(),
            )),
        }
    }
}

fn check(name: &str, keys: &toml::Table, invalid: Invalid) {
    if let Err((key, why)) = Budget::read(name, keys) {
        invalid(&key, why);
    }
}
