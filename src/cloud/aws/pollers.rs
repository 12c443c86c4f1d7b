//! AWS's pollers: the spot price, the Pricing API's on-demand price and AWS Budgets, each
//! handing what it learns to the cost side through `Readings`.

use std::sync::Arc;
use std::time::Duration;

use super::ec2::Ec2;
use super::services::Services;
use crate::cloud::{Node, PriceKind, Readings};
use crate::config::BudgetConfig;

/// Refreshes the spot price of this instance type and zone, hourly by default.
pub async fn poll_spot_price(ec2: Ec2, node: Node, readings: Arc<dyn Readings>, every: Duration) {
    let (t, z) = (node.instance_type, node.availability_zone);
    loop {
        match ec2.spot_price(&t, &z).await {
            Ok(Some(p)) => {
                tracing::info!(usd_per_hour = p, "spot price");
                readings.price(PriceKind::Spot, p);
            }
            Ok(None) => {
                tracing::warn!(instance_type = %t, zone = %z, "no spot price history for this instance type")
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the spot price; keeping the last known one")
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Asks the Pricing API for the on-demand price, retrying hourly until it answers.
pub async fn poll_pricing_api(services: Services, node: Node, readings: Arc<dyn Readings>) {
    let (r, t) = (node.region, node.instance_type);
    let mut logged = false;
    loop {
        match services.on_demand_price(&r, &t).await {
            Ok(Some(p)) => {
                tracing::info!(usd_per_hour = p, instance_type = %t, region = %r, "on-demand price from the Pricing API");
                readings.price(PriceKind::List, p);
                return;
            }
            Ok(None) => {
                tracing::info!(instance_type = %t, region = %r, "the Pricing API has no price; using the bundled table");
                return;
            }
            Err(e) => {
                if !logged {
                    logged = true;
                    tracing::info!(error = %e, "the Pricing API is unavailable (the role may lack pricing:GetProducts); using the bundled table");
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// Polls one AWS Budget, with backoff on errors.
pub async fn poll_budget(
    services: Services,
    budget: BudgetConfig,
    aws: super::budgets::Budget,
    readings: Arc<dyn Readings>,
) {
    let super::budgets::Budget {
        budget_name,
        account_id,
    } = &aws;
    let mut delay = budget.poll_interval;
    let mut failing = false;
    loop {
        match services.describe_budget(account_id, budget_name).await {
            Ok((reading, period_end)) => {
                if failing {
                    tracing::info!(budget = %budget.name, "AWS Budgets answers again");
                }
                failing = false;
                delay = budget.poll_interval;
                readings.budget(&budget.name, reading, period_end);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(budget = %budget.name, error = %e, "cannot read the AWS Budget; retrying with backoff");
                }
                failing = true;
                delay = (delay * 2).min(Duration::from_secs(3600));
            }
        }
        tokio::time::sleep(delay).await;
    }
}
