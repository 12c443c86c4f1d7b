//! Each budget in one step: read from this node's ledger or from outside, and checked for the
//! thresholds it crossed.

use std::collections::BTreeMap;

use super::{BudgetSource, BudgetView, Inputs, Settings, State};
use crate::cost::budget::{Crossing, Reading};
use crate::cost::ledger::Closed;

/// The budgets as one step judges them.
pub(super) struct Judged {
    /// Thresholds crossed for the first time this period.
    pub crossings: Vec<Crossing>,
    /// Each budget's spent ratio, where it has one, for the rules' budget gates.
    pub ratios: BTreeMap<String, f64>,
    pub views: Vec<BudgetView>,
}

/// Reads each budget (this node's ledger, or a reading from outside) and finds the thresholds
/// it crossed, given this period's spend and its forecast.
pub(super) fn judge_budgets(
    settings: &Settings,
    state: &mut State,
    inputs: &Inputs,
    closed: &[Closed],
    (spent, forecast): (Option<f64>, Option<f64>),
) -> Judged {
    let mut judged = Judged {
        crossings: Vec::new(),
        ratios: BTreeMap::new(),
        views: Vec::new(),
    };
    for b in &settings.budgets {
        // Spend that closed a period in this very step still crosses that period's thresholds:
        // the last accrual of a month (or a daemon down across its end) alerts late, not never.
        if b.source == BudgetSource::Local {
            for c in closed {
                let last = Reading {
                    spent: c.total,
                    forecast: None,
                    limit: b.limit_usd.unwrap_or(0.0),
                    period_start: c.period_start,
                };
                judged
                    .crossings
                    .extend(state.alerted.crossings(&b.name, &b.thresholds, &last));
            }
        }
        let reading = match b.source {
            BudgetSource::Local => spent.map(|spent| Reading {
                spent,
                forecast,
                limit: b.limit_usd.unwrap_or(0.0),
                period_start: state.ledger.period_start,
            }),
            BudgetSource::External => inputs.external.get(&b.name).map(|r| Reading {
                limit: b.limit_usd.unwrap_or(r.limit),
                ..r.clone()
            }),
        };
        let Some(reading) = reading else {
            if let (BudgetSource::External, Some(why)) = (b.source, inputs.unknown.get(&b.name)) {
                judged.views.push(BudgetView {
                    name: b.name.clone(),
                    limit: b.limit_usd.unwrap_or(0.0),
                    spent_ratio: None,
                    forecast_ratio: None,
                    unknown: Some(why.clone()),
                });
            }
            continue;
        };
        state.alerted.prune(&b.name, reading.period_start);
        judged
            .crossings
            .extend(state.alerted.crossings(&b.name, &b.thresholds, &reading));
        if let Some(r) = reading.spent_ratio() {
            judged.ratios.insert(b.name.clone(), r);
        }
        judged.views.push(BudgetView {
            name: b.name.clone(),
            limit: reading.limit,
            spent_ratio: reading.spent_ratio(),
            forecast_ratio: reading.forecast_ratio(),
            unknown: None,
        });
    }
    judged
}
