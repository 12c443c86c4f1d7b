//! The edge around `cost/`: price pollers (spot price, Pricing API), AWS Budgets pollers, and
//! the per-sample accrual and budget check the watch loop runs.

pub mod metrics;
pub mod query;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{BudgetConfig, BudgetSource, Config};
use gpuwatch_core::step::Inputs;

use crate::cloud::Node;
use crate::cost::budget::{Crossing, Reading};
use crate::cost::price::{self, Price};
use crate::state::Persisted;

/// Prices and budget readings learnt by the pollers.
#[derive(Debug, Default)]
pub struct PollerReadings {
    pub spot: Mutex<Option<f64>>,
    pub pricing_api: Mutex<Option<f64>>,
    /// A cloud's own dated table's on-demand price (Compute Engine's).
    pub table: Mutex<Option<f64>>,
    /// AWS Budgets readings, by gpuwatch budget name.
    pub aws_budgets: Mutex<BTreeMap<String, AwsReading>>,
    /// Prometheus budgets' answers, by gpuwatch budget name.
    pub prometheus: Arc<query::QueryReadings>,
}

/// One AWS Budget's last answer: its reading, when it came, and when its period ends.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsReading {
    pub reading: Reading,
    pub at: f64,
    pub period_end: f64,
}

impl AwsReading {
    /// The reading, while it is of the current period and no older than two poll intervals;
    /// else why it is no reading. An old answer must not keep a budget exhausted, nor a new
    /// period's thresholds from crossing.
    pub fn fresh(&self, now: f64, poll_interval: Duration) -> Result<Reading, String> {
        if now >= self.period_end {
            return Err("the cloud budget's last answer is of the previous budget period".into());
        }
        let age = now - self.at;
        // At least a minute, so that a short interval does not flicker on a busy node.
        if age > (2.0 * poll_interval.as_secs_f64()).max(60.0) {
            return Err(format!(
                "the cloud budget's last answer is {age:.0}s old, more than two poll intervals"
            ));
        }
        Ok(self.reading.clone())
    }
}

pub struct Tracker {
    pub config: Config,
    /// This instance, when gpuwatch runs on EC2 with `provider = "aws"`.
    pub node: Option<Node>,
    pub readings: Arc<PollerReadings>,
    no_price_logged: bool,
}

impl Tracker {
    pub fn new(config: Config, node: Option<Node>, readings: Arc<PollerReadings>) -> Tracker {
        Tracker {
            config,
            node,
            readings,
            no_price_logged: false,
        }
    }

    pub fn price(&self, persisted: &Persisted) -> Option<Price> {
        let table = self
            .node
            .as_ref()
            .and_then(|n| price::table().price(&n.region, &n.instance_type))
            .or_else(|| self.readings.table.lock().ok().and_then(|t| *t));
        let spot = self
            .readings
            .spot
            .lock()
            .ok()
            .and_then(|s| *s)
            .or(persisted.spot_price);
        let api = self.readings.pricing_api.lock().ok().and_then(|p| *p);
        price::choose(
            self.config.cost.hourly_price_usd,
            self.node.as_ref().and_then(|n| n.lifecycle),
            spot,
            api,
            table,
        )
    }

    /// Fills in the step's price and its external budget readings. Logs once when no price
    /// is known.
    pub fn fill(&mut self, persisted: &Persisted, inputs: &mut Inputs) {
        let price = self.price(persisted);
        if price.is_none() && !self.no_price_logged {
            self.no_price_logged = true;
            // A budget of the fleet's (Prometheus, AWS Budgets) is read, not accrued here: its
            // rules do not need this node's price.
            let local = self
                .config
                .budgets
                .iter()
                .filter(|b| matches!(b.source, crate::config::BudgetSource::Local))
                .count();
            let text = "no price is known for this instance, so its own spend is unknown";
            let fix = "set [cost] hourly_price_usd, or run on EC2 with provider = \"aws\"";
            match (local, self.config.budgets.len()) {
                (0, 0) => tracing::info!("{text} ({fix})"),
                (0, _) => tracing::info!(
                    "{text}; budgets read from the fleet still count ({fix} to see this node's)"
                ),
                _ => tracing::warn!(
                    local_budgets = local,
                    "{text}, and budgets of this node's spend stay inactive ({fix})"
                ),
            }
        } else if price.is_some() && self.no_price_logged {
            self.no_price_logged = false;
        }
        inputs.price = price;
        let aws = self
            .readings
            .aws_budgets
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        for (name, answer) in aws {
            let Some(b) = self.config.budgets.iter().find(|b| b.name == name) else {
                continue;
            };
            match answer.fresh(inputs.now, b.poll_interval) {
                Ok(r) => {
                    inputs.external.insert(name, r);
                }
                Err(why) => {
                    inputs.unknown.insert(name, why);
                }
            }
        }
        for b in &self.config.budgets {
            if matches!(b.source, BudgetSource::Prometheus(_)) {
                match self.readings.prometheus.reading(b, inputs.now) {
                    Ok(r) => {
                        inputs.external.insert(b.name.clone(), r);
                    }
                    Err(why) => {
                        inputs.unknown.insert(b.name.clone(), why);
                    }
                }
            }
        }
    }
}

/// What the cloud's pollers learn lands here.
impl crate::cloud::Readings for PollerReadings {
    fn price(&self, kind: crate::cloud::PriceKind, usd_per_hour: f64) {
        let slot = match kind {
            crate::cloud::PriceKind::Spot => &self.spot,
            crate::cloud::PriceKind::List => &self.pricing_api,
            crate::cloud::PriceKind::Table => &self.table,
        };
        if let Ok(mut s) = slot.lock() {
            *s = Some(usd_per_hour);
        }
    }

    fn budget(&self, name: &str, reading: Reading, period_end: f64) {
        let answer = AwsReading {
            reading,
            at: crate::time::now(),
            period_end,
        };
        if let Ok(mut m) = self.aws_budgets.lock() {
            m.insert(name.to_string(), answer);
        }
    }
}

/// Sends one budget alert everywhere it goes: log, audit, webhook, SNS.
/// The alert is recorded and queued here; the SNS publish runs as a task in `publishes`, so an
/// AWS call never holds up the decision loop (and none outlives the watch).
pub fn send_alert(
    c: &Crossing,
    budget: Option<&BudgetConfig>,
    executor: &std::sync::Arc<crate::actions::Executor>,
    api: Option<&std::sync::Arc<dyn crate::cloud::Api>>,
    publishes: &mut tokio::task::JoinSet<()>,
) -> bool {
    let text = format!("gpuwatch: {}", gpuwatch_core::step::alert_text(c));
    let recorded = executor.audit(crate::state::AuditRecord::BudgetAlert {
        budget: c.budget.clone(),
        threshold: c.threshold,
        basis: c.basis,
        ratio: c.ratio,
        limit: c.limit,
    });
    // No record, no alert: a restart could not know it had been sent. (The executor says the
    // audit log fails, once a minute; this is retried at every step meanwhile.)
    if !recorded {
        tracing::debug!(
            budget = %c.budget,
            threshold = c.threshold,
            "budget alert withheld: its audit record could not be made durable; it is sent once it can"
        );
        return false;
    }
    tracing::warn!("{text}");
    // A team budget's threshold is the fleet's alert (through Alertmanager, once), unless
    // `notify = true`: every node of the team crossing it would send one otherwise.
    if budget.is_some_and(|b| !b.notify) {
        return true;
    }
    executor.notify(&text, false);
    if let (Some(topic), Some(api)) = (budget.and_then(|b| b.sns_topic_arn.clone()), api) {
        let (api, executor, name) = (
            std::sync::Arc::clone(api),
            std::sync::Arc::clone(executor),
            c.budget.clone(),
        );
        publishes.spawn(async move {
            let Some(publish) = api.publish(&topic, "gpuwatch budget alert", &text) else {
                tracing::warn!(topic, "this cloud has no topics: the budget alert is not published to sns_topic_arn");
                return;
            };
            match publish.await {
                Ok(id) => {
                    // Published already: a record that fails is logged by the executor.
                    let _ = executor.audit(crate::state::AuditRecord::SnsPublish {
                        budget: name,
                        message_id: id,
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, topic, "cannot publish the budget alert to SNS")
                }
            }
        });
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aws_budgets_answer_counts_in_its_period_while_fresh() {
        let answer = AwsReading {
            reading: Reading {
                spent: 120.0,
                forecast: None,
                limit: 100.0,
                period_start: 1_000.0,
            },
            at: 5_000.0,
            period_end: 100_000.0,
        };
        let hour = Duration::from_secs(3600);
        assert_eq!(answer.fresh(5_100.0, hour).unwrap().spent, 120.0);
        // Exhausted at the end of a period: no reading in the next one.
        let why = answer.fresh(100_000.0, hour).unwrap_err();
        assert!(why.contains("previous budget period"), "{why}");
        // The poller has failed for more than two intervals: no reading.
        let why = answer.fresh(5_000.0 + 7_201.0, hour).unwrap_err();
        assert!(why.contains("more than two poll intervals"), "{why}");
    }
}
