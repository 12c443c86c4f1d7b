//! The edge around `cost/`: where the clouds' price and budget pollers hand what they learn,
//! and the per-sample accrual and budget check the watch loop runs.

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
    /// A cloud's own dated table's price.
    pub table: Mutex<Option<f64>>,
    /// Cloud budgets' readings, by gpuwatch budget name.
    pub cloud_budgets: Mutex<BTreeMap<String, CloudBudgetReading>>,
    /// Prometheus budgets' answers, by gpuwatch budget name.
    pub prometheus: Arc<query::QueryReadings>,
    /// The instance's lifecycle, where the cloud's API told it after identity.
    pub lifecycle: Mutex<Option<crate::rules::Lifecycle>>,
    /// The last plausible price of each kind, what a new one is judged against.
    plausible: Mutex<BTreeMap<&'static str, f64>>,
    /// Prices taken as unknown for being implausible (`gpuwatch_price_implausible_total`), and
    /// whether that has been said since the last plausible one.
    pub implausible: std::sync::atomic::AtomicU64,
    implausible_said: std::sync::atomic::AtomicBool,
}

pub use crate::cost::price::{implausible, IMPLAUSIBLE_RATIO};

fn kind_name(kind: crate::cloud::PriceKind) -> &'static str {
    match kind {
        crate::cloud::PriceKind::Spot => "spot",
        crate::cloud::PriceKind::List => "pricing_api",
        crate::cloud::PriceKind::Table => "table",
    }
}

/// One cloud budget's last answer: its reading, when it came, and when its period ends.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudBudgetReading {
    pub reading: Reading,
    pub at: f64,
    pub period_end: f64,
}

impl CloudBudgetReading {
    /// The reading, while it is of the current period and no older than two poll intervals;
    /// else why it is no reading. An old answer must not keep a budget exhausted, nor a new
    /// period's thresholds from crossing.
    pub fn fresh(&self, now: f64, poll_interval: Duration) -> Result<Reading, String> {
        // At least a minute, so that a short interval does not flicker on a busy node.
        self.within(now, (2.0 * poll_interval.as_secs_f64()).max(60.0))
    }

    /// The reading, while it is of the current period and no older than `most` seconds.
    fn within(&self, now: f64, most: f64) -> Result<Reading, String> {
        if now >= self.period_end {
            return Err("the cloud budget's last answer is of the previous budget period".into());
        }
        let age = now - self.at;
        if age > most {
            return Err(format!(
                "the cloud budget's last answer is {age:.0}s old, more than two poll intervals"
            ));
        }
        Ok(self.reading.clone())
    }
}

pub struct Tracker {
    pub config: Config,
    /// This instance, once instance metadata has named it.
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

    /// Gives the price sanity check (`implausible`) what it knows before the cloud answers:
    /// the spot price kept across restarts, so that even a first price far from it is unknown,
    /// never believed. (A cloud with a built-in table gives its own, as a baseline.)
    pub fn seed_baselines(&self, spot: Option<f64>) {
        if let Some(p) = spot {
            self.readings.seed(crate::cloud::PriceKind::Spot, p);
        }
    }

    pub fn price(&self, persisted: &Persisted) -> Option<Price> {
        let table = self.readings.table.lock().ok().and_then(|t| *t);
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
            // A budget of the fleet's (Prometheus, a cloud's) is read, not accrued here: its
            // rules do not need this node's price.
            let local = self
                .config
                .budgets
                .iter()
                .filter(|b| matches!(b.source, crate::config::BudgetSource::Local))
                .count();
            let text = "no price is known for this instance, so its own spend is unknown";
            let fix = "set [cost] hourly_price_usd, or [cloud] provider where the cloud prices the instance";
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
        let clouds = self
            .readings
            .cloud_budgets
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        for (name, answer) in clouds {
            let Some(b) = self.config.budgets.iter().find(|b| b.name == name) else {
                continue;
            };
            let fresh = match b.source {
                BudgetSource::Cloud { fresh_at_least, .. } => answer.within(
                    inputs.now,
                    (2.0 * b.poll_interval.as_secs_f64()).max(fresh_at_least.as_secs_f64()),
                ),
                _ => answer.fresh(inputs.now, b.poll_interval),
            };
            match fresh {
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
    /// A price far from the last plausible one of its kind is implausible: unknown until one
    /// near it comes.
    fn price(&self, kind: crate::cloud::PriceKind, usd_per_hour: f64) {
        let before = self
            .plausible
            .lock()
            .ok()
            .and_then(|p| p.get(kind_name(kind)).copied());
        if let Some(before) = before.filter(|b| implausible(usd_per_hour, *b)) {
            self.implausible(kind, usd_per_hour, before);
            return;
        }
        if let Ok(mut p) = self.plausible.lock() {
            p.insert(kind_name(kind), usd_per_hour);
        }
        self.implausible_said
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut s) = self.slot(kind).lock() {
            *s = Some(usd_per_hour);
        }
    }

    fn implausible(&self, kind: crate::cloud::PriceKind, usd_per_hour: f64, beside: f64) {
        use std::sync::atomic::Ordering;
        self.implausible.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.slot(kind).lock() {
            *s = None;
        }
        if !self.implausible_said.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                source = kind_name(kind),
                usd_per_hour,
                beside_usd_per_hour = beside,
                "an implausible price (more than {IMPLAUSIBLE_RATIO}x from {beside} USD/h) is taken as unknown: spend is unknown until a plausible one comes, or [cost] hourly_price_usd gives it"
            );
        }
    }

    fn lifecycle(&self, lifecycle: crate::rules::Lifecycle) {
        if let Ok(mut l) = self.lifecycle.lock() {
            *l = Some(lifecycle);
        }
    }

    fn baseline(&self, kind: crate::cloud::PriceKind, usd_per_hour: f64) {
        self.seed(kind, usd_per_hour);
    }

    fn budget(&self, name: &str, reading: Reading, period_end: f64) {
        let answer = CloudBudgetReading {
            reading,
            at: crate::time::now(),
            period_end,
        };
        if let Ok(mut m) = self.cloud_budgets.lock() {
            m.insert(name.to_string(), answer);
        }
    }
}

impl PollerReadings {
    /// A plausible price of `kind` known before any poller answers: where none is yet, the
    /// first price that comes is judged against it.
    pub fn seed(&self, kind: crate::cloud::PriceKind, usd_per_hour: f64) {
        if let Ok(mut p) = self.plausible.lock() {
            p.entry(kind_name(kind)).or_insert(usd_per_hour);
        }
    }

    fn slot(&self, kind: crate::cloud::PriceKind) -> &Mutex<Option<f64>> {
        match kind {
            crate::cloud::PriceKind::Spot => &self.spot,
            crate::cloud::PriceKind::List => &self.pricing_api,
            crate::cloud::PriceKind::Table => &self.table,
        }
    }
}

/// Sends one budget alert everywhere it goes: log, audit, webhook, SNS.
/// The alert is recorded and queued here; the topic's publish runs as a task in `publishes`, so
/// a cloud call never holds up the decision loop (and none outlives the watch).
pub fn send_alert(
    c: &Crossing,
    budget: Option<&BudgetConfig>,
    executor: &std::sync::Arc<crate::actions::Executor>,
    api: Option<&std::sync::Arc<dyn crate::cloud::ControlPlane>>,
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
    if let (Some(topic), Some(api)) = (budget.and_then(|b| b.topic.clone()), api) {
        let (api, executor, name) = (
            std::sync::Arc::clone(api),
            std::sync::Arc::clone(executor),
            c.budget.clone(),
        );
        publishes.spawn(async move {
            let Some(publish) = api.publish(&topic, "gpuwatch budget alert", &text) else {
                tracing::warn!(topic, "this cloud has no topics: the budget alert is not published to its topic");
                return;
            };
            match publish.await {
                Ok(id) => {
                    // Published already: a record that fails is logged by the executor.
                    let _ = executor.audit(crate::state::AuditRecord::TopicPublish {
                        budget: name,
                        topic,
                        message_id: id,
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, topic, "cannot publish the budget alert to its topic")
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
    fn a_cloud_budget_s_answer_counts_in_its_period_while_fresh() {
        let answer = CloudBudgetReading {
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

    /// A price twenty times from the last plausible one of its kind is unknown, counted, and
    /// stays unknown while prices keep coming that far; a plausible one is taken again.
    #[test]
    fn a_price_far_from_the_last_one_is_unknown_and_counted() {
        use crate::cloud::{PriceKind, Readings};
        let r = PollerReadings::default();
        r.price(PriceKind::List, 3.67);
        assert_eq!(*r.pricing_api.lock().unwrap(), Some(3.67));
        r.price(PriceKind::List, 9_999.0);
        assert_eq!(*r.pricing_api.lock().unwrap(), None);
        r.price(PriceKind::List, 9_999.0);
        assert_eq!(*r.pricing_api.lock().unwrap(), None);
        assert_eq!(r.implausible.load(std::sync::atomic::Ordering::Relaxed), 2);
        // A baseline known before the first answer (the table, the kept spot price) judges it.
        let seeded = PollerReadings::default();
        seeded.seed(PriceKind::List, 3.67);
        seeded.price(PriceKind::List, 9_999.0);
        assert_eq!(*seeded.pricing_api.lock().unwrap(), None);
        seeded.seed(PriceKind::List, 9_999.0);
        seeded.price(PriceKind::List, 3.9);
        assert_eq!(
            *seeded.pricing_api.lock().unwrap(),
            Some(3.9),
            "a seed never replaces a baseline"
        );
        // Another kind is judged against its own.
        r.price(PriceKind::Spot, 0.1);
        assert_eq!(*r.spot.lock().unwrap(), Some(0.1));
        r.price(PriceKind::List, 3.9);
        assert_eq!(*r.pricing_api.lock().unwrap(), Some(3.9));
        assert!(implausible(0.1, 3.0));
        assert!(!implausible(0.2, 3.0));
        assert!(!implausible(59.0, 3.0));
    }

    /// A cloud budget's answer is unknown once it is two poll intervals old, or older than
    /// its source's floor where that is longer (a source without one: two poll intervals).
    #[test]
    fn a_cloud_budget_s_answer_is_unknown_after_two_poll_intervals_or_its_floor() {
        let mut config = Config::default();
        for (name, floor) in [("floorless", 0), ("minute", 60)] {
            config.budgets.push(BudgetConfig {
                name: name.into(),
                limit_usd: None,
                source: BudgetSource::Cloud {
                    source: "team_budgets",
                    keys: toml::Table::new(),
                    fresh_at_least: std::time::Duration::from_secs(floor),
                },
                thresholds: vec![1.0],
                on_exhausted: None,
                topic: None,
                poll_interval: std::time::Duration::from_secs(5),
                notify: true,
            });
        }
        let readings = Arc::new(PollerReadings::default());
        let reading = Reading {
            spent: 120.0,
            forecast: None,
            limit: 100.0,
            period_start: 1_000.0,
        };
        for name in ["floorless", "minute"] {
            readings.cloud_budgets.lock().unwrap().insert(
                name.into(),
                CloudBudgetReading {
                    reading: reading.clone(),
                    at: 5_000.0,
                    period_end: 100_000.0,
                },
            );
        }
        let mut tracker = Tracker::new(config, None, readings);
        let fill = |tracker: &mut Tracker, now: f64| {
            let mut inputs = Inputs {
                now,
                ..Inputs::default()
            };
            tracker.fill(&Persisted::default(), &mut inputs);
            inputs
        };
        let at = fill(&mut tracker, 5_009.0);
        assert_eq!(at.external["floorless"].spent, 120.0);
        let later = fill(&mut tracker, 5_011.0);
        assert!(
            later.unknown["floorless"].contains("more than two poll intervals"),
            "{:?}",
            later.unknown
        );
        assert_eq!(later.external["minute"].spent, 120.0);
        assert!(fill(&mut tracker, 5_061.0).unknown.contains_key("minute"));
    }
}
