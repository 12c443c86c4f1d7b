//! Budgets: a limit, what has been spent against it, and the thresholds that alert once each.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// Spend against one budget at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reading {
    pub spent: f64,
    pub forecast: Option<f64>,
    pub limit: f64,
    /// The budget period this reading belongs to (Unix seconds).
    pub period_start: f64,
}

impl Reading {
    pub fn spent_ratio(&self) -> Option<f64> {
        (self.limit > 0.0).then(|| self.spent / self.limit)
    }

    pub fn forecast_ratio(&self) -> Option<f64> {
        (self.limit > 0.0).then_some(self.forecast? / self.limit)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    Actual,
    Forecast,
}

impl Basis {
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Actual => "actual",
            Basis::Forecast => "forecast",
        }
    }
}

/// A threshold crossed for the first time in this budget period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Crossing {
    pub budget: String,
    pub threshold: f64,
    pub basis: Basis,
    pub ratio: f64,
    /// The budget's limit, in USD.
    pub limit: f64,
    /// The start of the budget period it crossed in.
    pub period_start: f64,
}

/// The crossings already alerted, so each fires once per period, across restarts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Alerted(BTreeSet<String>);

fn key(budget: &str, period_start: f64, basis: Basis, threshold: f64) -> String {
    format!("{budget}|{period_start}|{}|{threshold}", basis.as_str())
}

impl Alerted {
    /// Forgets that `c` alerted: its alert was not sent, so it is sent once it crosses again.
    pub fn forget(&mut self, c: &Crossing) {
        self.0
            .remove(&key(&c.budget, c.period_start, c.basis, c.threshold));
    }

    /// The thresholds `reading` crosses that have not alerted yet this period; records them.
    pub fn crossings(
        &mut self,
        budget: &str,
        thresholds: &[f64],
        reading: &Reading,
    ) -> Vec<Crossing> {
        let mut out = Vec::new();
        for (basis, ratio) in [
            (Basis::Actual, reading.spent_ratio()),
            (Basis::Forecast, reading.forecast_ratio()),
        ] {
            let Some(ratio) = ratio else { continue };
            for &t in thresholds {
                if ratio + 1e-12 >= t && self.0.insert(key(budget, reading.period_start, basis, t))
                {
                    out.push(Crossing {
                        budget: budget.to_string(),
                        threshold: t,
                        basis,
                        ratio,
                        limit: reading.limit,
                        period_start: reading.period_start,
                    });
                }
            }
        }
        out
    }

    /// Forgets alerts of periods before `period_start`, so the set stays small.
    pub fn prune(&mut self, budget: &str, period_start: f64) {
        self.0.retain(|k| {
            let mut parts = k.split('|');
            let (b, p) = (
                parts.next(),
                parts.next().and_then(|p| p.parse::<f64>().ok()),
            );
            b != Some(budget) || p.is_none_or(|p| p >= period_start)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(spent: f64, forecast: Option<f64>, period_start: f64) -> Reading {
        Reading {
            spent,
            forecast,
            limit: 100.0,
            period_start,
        }
    }

    #[test]
    fn each_threshold_fires_once_per_period() {
        let th = [0.5, 0.8, 1.0];
        let mut a = Alerted::default();
        let fired = |c: Vec<Crossing>| c.iter().map(|c| (c.threshold, c.basis)).collect::<Vec<_>>();
        assert_eq!(
            fired(a.crossings("team", &th, &reading(45.0, None, 0.0))),
            vec![]
        );
        assert_eq!(
            fired(a.crossings("team", &th, &reading(85.0, None, 0.0))),
            vec![(0.5, Basis::Actual), (0.8, Basis::Actual)]
        );
        assert_eq!(
            fired(a.crossings("team", &th, &reading(86.0, None, 0.0))),
            vec![]
        );
        assert_eq!(
            fired(a.crossings("team", &th, &reading(86.0, Some(120.0), 0.0))),
            vec![
                (0.5, Basis::Forecast),
                (0.8, Basis::Forecast),
                (1.0, Basis::Forecast)
            ]
        );
        // A new period alerts again; pruning drops the old one.
        assert_eq!(
            fired(a.crossings("team", &th, &reading(55.0, None, 1.0))),
            vec![(0.5, Basis::Actual)]
        );
        a.prune("team", 1.0);
        assert_eq!(a.0.len(), 1);
        // The set survives a restart.
        let restored: Alerted = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(restored, a);
    }
}
