//! Cost and budgets: the price, spend and forecast, each budget's limit and ratios, and the
//! alerts sent. The watch updates the view after every decision step.

use std::collections::BTreeMap;

use gpuwatch_core::cost::price::Price;
use gpuwatch_core::step::BudgetView;
use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::encode::*;
use crate::metrics::Shared;
use crate::metrics::Text;

/// What the cost series show, swapped whole after each step.
#[derive(Debug, Clone, Default)]
pub struct CostView {
    pub price: Option<Price>,
    /// Spent this period; `None` while the price is unknown.
    pub spent: Option<f64>,
    pub forecast: Option<f64>,
    pub budgets: Vec<BudgetView>,
    /// Budget alerts sent, by budget and threshold.
    pub alerts: BTreeMap<AlertKey, u64>,
    /// USD spent on idle GPUs (a counter).
    pub idle_dollars: f64,
    /// Prices taken as unknown for being implausible.
    pub implausible_prices: u64,
    /// USD spent on unhealthy GPUs (a counter).
    pub unhealthy_dollars: f64,
    /// Each job holding a GPU: its user (where known), and what its idle GPUs cost.
    pub jobs: Vec<(String, Option<String>, gpuwatch_core::step::Tally)>,
    /// Each user holding a GPU, and what their idle GPUs cost.
    pub users: Vec<(String, gpuwatch_core::step::Tally)>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlertKey {
    pub budget: String,
    pub threshold: String,
}

/// Shared between the watch, which writes it, and the collector.
pub type SharedCostView = Shared<CostView>;

/// The cost and budget series.
#[derive(Debug)]
pub struct CostCollector {
    pub view: std::sync::Arc<SharedCostView>,
    /// Each configured budget and its source (`local`, `prometheus`, or a cloud's).
    pub sources: Vec<(String, &'static str)>,
}

impl Collector for CostCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let v = self.view.view();
        let e = &mut enc;
        encode_spend(e, &v)?;
        encode_budgets(e, &self.sources, &v)?;
        if v.price.is_some() || v.idle_dollars > 0.0 {
            encode_waste(e, &v)?;
        }
        encode_holders(e, &v)
    }
}

/// The price, with where it came from, and this period's spend and forecast, where known.
fn encode_spend(e: &mut DescriptorEncoder, v: &CostView) -> Result<(), fmt::Error> {
    if let Some(price) = v.price {
        gauges(
            e,
            desc(
                "gpuwatch_instance_hourly_cost_dollars",
                "The instance's price per hour, and where it came from",
                None,
            ),
            [([("source", price.source.as_str())], price.usd_per_hour)],
        )?;
    }
    if let Some(s) = v.spent {
        gauge(
            e,
            desc(
                "gpuwatch_spend_dollars",
                "Spend in the current budget period",
                None,
            ),
            s,
        )?;
    }
    if let Some(f) = v.forecast {
        gauge(
            e,
            desc(
                "gpuwatch_spend_forecast_dollars",
                "Spend at the end of the period at the current price",
                None,
            ),
            f,
        )?;
    }
    if v.implausible_prices > 0 {
        counters(
            e,
            desc(
                "gpuwatch_price_implausible",
                "Prices the cloud gave that were taken as unknown for being implausible (more than 20x from the last one, or from every other row of the same size)",
                None,
            ),
            [(NO_LABELS, v.implausible_prices)],
        )?;
    }
    Ok(())
}

/// Each budget: its source, limit, spent and forecast ratios, and the alerts it sent.
fn encode_budgets(
    e: &mut DescriptorEncoder,
    sources: &[(String, &'static str)],
    v: &CostView,
) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpuwatch_budget_info",
            "Each configured budget, and where its spend comes from: local (this node), prometheus (a team's spend, read from the fleet's Prometheus; its alerts are the fleet's), or a cloud's budget",
            None,
        ),
        sources
            .iter()
            .map(|(b, s)| ([("budget", Text(b)), ("source", Text(s))], 1)),
    )?;
    gauges(
        e,
        desc("gpuwatch_budget_limit_dollars", "The budget's limit", None),
        v.budgets
            .iter()
            .map(|b| ([("budget", Text(&b.name))], b.limit)),
    )?;
    gauges(
        e,
        desc(
            "gpuwatch_budget_spent_ratio",
            "Spend as a share of the budget's limit",
            None,
        ),
        v.budgets
            .iter()
            .filter_map(|b| Some(([("budget", Text(&b.name))], b.spent_ratio?))),
    )?;
    gauges(
        e,
        desc(
            "gpuwatch_budget_forecast_ratio",
            "Forecast spend as a share of the budget's limit",
            None,
        ),
        v.budgets
            .iter()
            .filter_map(|b| Some(([("budget", Text(&b.name))], b.forecast_ratio?))),
    )?;
    counters(
        e,
        desc(
            "gpuwatch_budget_alerts",
            "Budget thresholds crossed, each logged and audited, and sent unless the budget has notify = false",
            None,
        ),
        v.alerts.iter().map(|(k, n)| {
            (
                [
                    ("budget", Text(&k.budget)),
                    ("threshold", Text(&k.threshold)),
                ],
                *n,
            )
        }),
    )?;
    Ok(())
}

/// The money spent on idle GPUs and on unhealthy ones.
fn encode_waste(e: &mut DescriptorEncoder, v: &CostView) -> Result<(), fmt::Error> {
    counters(
        e,
        desc(
            "gpuwatch_gpu_idle_dollars",
            "Money spent on GPUs while they were idle by the rules' threshold: the price times the idle GPUs' share, accrued per sample",
            None,
        ),
        [(NO_LABELS, v.idle_dollars)],
    )?;
    counters(
        e,
        desc(
            "gpuwatch_gpu_unhealthy_dollars",
            "Money spent on GPUs while they were unhealthy (unusable): the price times the unhealthy GPUs' share, accrued per sample",
            None,
        ),
        [(NO_LABELS, v.unhealthy_dollars)],
    )?;
    Ok(())
}

/// What each job's and each user's idle GPUs took: GPU time, and money where the price is known.
fn encode_holders(e: &mut DescriptorEncoder, v: &CostView) -> Result<(), fmt::Error> {
    fn job(
        (job, user, _): &(String, Option<String>, gpuwatch_core::step::Tally),
    ) -> Vec<(&'static str, Text<'_>)> {
        let mut l = vec![("job", Text(job))];
        if let Some(u) = user {
            l.push(("user", Text(u)));
        }
        l
    }
    gauges(
        e,
        desc(
            "gpuwatch_job_gpu_idle",
            "GPU-seconds the job's GPUs sat idle while it held them (a MIG device counts its share)",
            Some("seconds"),
        ),
        v.jobs.iter().map(|j| (job(j), j.2.idle_seconds)),
    )?;
    if v.price.is_some() {
        counters(
            e,
            desc(
                "gpuwatch_job_idle_dollars",
                "Money the job's idle GPUs cost: the price times each idle GPU's share of the node, split among the jobs holding it",
                None,
            ),
            v.jobs.iter().map(|j| (job(j), j.2.idle_dollars)),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_user_idle_dollars",
                "Money the user's idle GPUs cost (those their processes or jobs hold), split among the users holding each",
                None,
            ),
            v.users
                .iter()
                .map(|(u, t)| ([("user", Text(u))], t.idle_dollars)),
        )?;
    }
    Ok(())
}
