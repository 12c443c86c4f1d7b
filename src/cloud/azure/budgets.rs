//! Azure Consumption budgets: a budget's amount, its current and forecast spend, and the
//! period its time grain says, read with the VM's managed identity.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;

use super::arm::{self, Arm};
use crate::config::{BudgetConfig, BudgetSourceKeys, Invalid};
use crate::cost::budget::Reading;

/// `[[budgets]] source = "azure_budgets"`, as the config reads it.
pub const SOURCE: BudgetSourceKeys = BudgetSourceKeys {
    source: "azure_budgets",
    keys: &["scope", "azure_budget_name"],
    check,
    // Two poll intervals, as Azure's budgets are documented: no minute's floor.
    fresh_at_least: Duration::ZERO,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Keys {
    scope: Option<String>,
    azure_budget_name: Option<String>,
}

/// An Azure Consumption budget: the subscription or resource group it is set on
/// (`/subscriptions/<id>` or `/subscriptions/<id>/resourceGroups/<name>`), and its name there.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub scope: String,
    pub budget_name: String,
}

impl Target {
    /// The budget gpuwatch calls `name`, from its keys; or each problem, as a key and message.
    pub fn read(name: &str, keys: &toml::Table) -> Result<Target, Vec<(String, String)>> {
        let keys: Keys = crate::config::parse_table(keys).map_err(|e| vec![e])?;
        let Some(scope) = keys.scope else {
            return Err(vec![(
                "scope".into(),
                "an azure_budgets budget needs the scope it is set on: \"/subscriptions/<id>\" or \"/subscriptions/<id>/resourceGroups/<name>\"".into(),
            )]);
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
        let scope_ok = match parts.as_slice() {
            ["", "subscriptions", sub] => guid(sub),
            ["", "subscriptions", sub, rg, name] => {
                guid(sub) && rg.eq_ignore_ascii_case("resourceGroups") && group(name)
            }
            _ => false,
        };
        let named = keys.azure_budget_name.is_some();
        let budget_name = keys.azure_budget_name.unwrap_or_else(|| name.to_string());
        let name_ok = !budget_name.is_empty()
            && budget_name.len() <= 63
            && budget_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
        let mut problems = Vec::new();
        if !scope_ok {
            problems.push((
                "scope".into(),
                format!(
                    "\"{}\" is not \"/subscriptions/<id>\" or \"/subscriptions/<id>/resourceGroups/<name>\"",
                    crate::redact::brief(&scope, 200)
                ),
            ));
        }
        if !name_ok {
            problems.push((
                if named { "azure_budget_name" } else { "name" }.into(),
                format!(
                    "\"{}\" is not the name of an Azure budget (letters, digits, _ and -, at most 63)",
                    crate::redact::brief(&budget_name, 80)
                ),
            ));
        }
        if problems.is_empty() {
            Ok(Target { scope, budget_name })
        } else {
            Err(problems)
        }
    }
}

fn check(name: &str, keys: &toml::Table, invalid: Invalid) {
    for (key, why) in Target::read(name, keys).err().unwrap_or_default() {
        invalid(&key, why);
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Budget {
    properties: Properties,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Properties {
    amount: Option<f64>,
    time_grain: String,
    current_spend: Option<Spend>,
    forecast_spend: Option<Spend>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Spend {
    amount: Option<f64>,
    unit: String,
}

/// A budget's answer as a reading of its current calendar period, and when that period ends;
/// `Err` says why it is none (a billing-period grain, a currency other than USD, an amount
/// that is not one).
pub fn reading(body: &[u8], now: f64) -> Result<(Reading, f64), String> {
    use crate::cost::calendar::months;
    let b: Budget =
        serde_json::from_slice(body).map_err(|e| format!("the budget does not parse: {e}"))?;
    let p = b.properties;
    let usd = |what: &str, s: &Option<Spend>| -> Result<Option<f64>, String> {
        match s {
            None => Ok(None),
            Some(Spend { unit, .. }) if unit != "USD" => Err(format!(
                "the budget's {what} is in {}, not USD",
                crate::redact::brief(unit, 8)
            )),
            Some(Spend { amount, .. }) => {
                Ok(amount.and_then(|a| crate::cost::parse_usd(&a.to_string())))
            }
        }
    };
    let limit = p
        .amount
        .and_then(|a| crate::cost::parse_usd(&a.to_string()))
        .filter(|a| *a > 0.0)
        .ok_or("the budget's amount is not an amount above 0")?;
    let spent = usd("current spend", &p.current_spend)?.ok_or("the budget has no current spend")?;
    let forecast = usd("forecast spend", &p.forecast_spend)?;
    // The period its spend is of is the calendar one its time grain says, now; a billing
    // period's bounds are the agreement's, which the budget does not give.
    let (period_start, period_end) = match p.time_grain.as_str() {
        "Monthly" => months(now, 1),
        "Quarterly" => months(now, 3),
        "Annually" => months(now, 12),
        other => {
            return Err(format!(
                "the budget's time grain {:?} is none of Monthly, Quarterly, Annually",
                crate::redact::brief(other, 32)
            ))
        }
    };
    Ok((
        Reading {
            spent,
            forecast,
            limit,
            period_start,
        },
        period_end,
    ))
}

/// Polls one Azure budget, with backoff on errors.
pub async fn poll(
    arm: Arc<Arm>,
    budget: BudgetConfig,
    target: Target,
    readings: Arc<dyn crate::cloud::Readings>,
) {
    let Target { scope, budget_name } = &target;
    let url = format!(
        "{scope}/providers/Microsoft.Consumption/budgets/{budget_name}?api-version={}",
        arm::BUDGETS_API_VERSION
    );
    let said = crate::cloud::poll::Said {
        failing: "cannot read the Azure budget; it stays unknown, retried with backoff",
        recovered: Some("the Azure budget answers again"),
    };
    let pace = crate::cloud::poll::budget_pace(&budget);
    crate::cloud::poll::poll(pace, said, &budget.name, || async {
        let answer = match arm.send("Budgets_Get", Method::GET, &url, None).await {
            Ok(a) if a.status.is_success() => reading(&a.body, crate::time::now()),
            Ok(a) => Err(arm::classify("Budgets_Get", &a).to_string()),
            Err(e) => Err(e.to_string()),
        };
        match answer {
            Ok((reading, period_end)) => {
                readings.budget(&budget.name, reading, period_end);
                crate::cloud::poll::Read::Again
            }
            Err(e) => crate::cloud::poll::Read::Failed(e),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_reads_and_odd_ones_do_not() {
        // The specification's example (2024-08-01 Budget.json), with a forecast.
        let body = br#"{"id": "subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/MYDEVTESTRG/providers/Microsoft.Consumption/budgets/TestBudget",
            "name": "TestBudget", "type": "Microsoft.Consumption/budgets",
            "properties": {"category": "Cost", "amount": 100.65, "timeGrain": "Monthly",
            "timePeriod": {"startDate": "2017-10-01T00:00:00Z", "endDate": "2018-10-31T00:00:00Z"},
            "currentSpend": {"amount": 80.89, "unit": "USD"},
            "forecastSpend": {"amount": 120.5, "unit": "USD"}}}"#;
        let now = crate::time::parse_rfc3339("2026-12-06T08:00:00Z").unwrap();
        let (r, end) = reading(body, now).unwrap();
        assert_eq!((r.limit, r.spent, r.forecast), (100.65, 80.89, Some(120.5)));
        assert_eq!(
            r.period_start,
            crate::time::parse_rfc3339("2026-12-01T00:00:00Z").unwrap()
        );
        assert_eq!(
            end,
            crate::time::parse_rfc3339("2027-01-01T00:00:00Z").unwrap()
        );
        let text = String::from_utf8(body.to_vec()).unwrap();
        for (from, to, why) in [
            ("\"Monthly\"", "\"BillingMonth\"", "time grain"),
            ("\"unit\": \"USD\"", "\"unit\": \"EUR\"", "in EUR"),
            ("100.65", "-1", "amount"),
            ("100.65", "1e309", "parse"),
        ] {
            let odd = text.replacen(from, to, 1);
            let e = reading(odd.as_bytes(), now).unwrap_err();
            assert!(e.contains(why), "{to}: {e}");
        }
    }
}
