//! AWS's pollers: the spot price, the Pricing API's on-demand price and AWS Budgets, each
//! handing what it learns to the cost side through `Readings`.

use std::sync::Arc;
use std::time::Duration;

use super::ec2::Ec2;
use super::services::Services;
use crate::cloud::poll::{budget_pace, poll, Pace, Read, Said};
use crate::cloud::{Node, PriceKind, Readings};
use crate::config::BudgetConfig;

/// Refreshes the spot price of this instance type and zone, hourly by default.
pub async fn poll_spot_price(ec2: Ec2, node: Node, readings: Arc<dyn Readings>, every: Duration) {
    let (t, z) = (node.instance_type, node.availability_zone);
    let said = Said {
        failing: "cannot read the spot price; keeping the last known one",
        recovered: Some("the spot price answers again"),
    };
    poll(Pace::steady(every), said, &t, || async {
        match ec2.spot_price(&t, &z).await {
            Ok(Some(p)) => {
                tracing::info!(usd_per_hour = p, "spot price");
                readings.price(PriceKind::Spot, p);
                Read::Again
            }
            Ok(None) => Read::Failed(format!(
                "no spot price history for this instance type in zone {z}"
            )),
            Err(e) => Read::Failed(e.to_string()),
        }
    })
    .await
}

/// Asks the Pricing API for the on-demand price, retrying hourly until it answers.
pub async fn poll_pricing_api(services: Services, node: Node, readings: Arc<dyn Readings>) {
    let (r, t) = (node.region, node.instance_type);
    let said = Said {
        failing: "the Pricing API is unavailable (the role may lack pricing:GetProducts); using the bundled table",
        recovered: None,
    };
    poll(Pace::steady(Duration::from_secs(3600)), said, &t, || async {
        match services.on_demand_price(&r, &t).await {
            Ok(Some(p)) => {
                tracing::info!(usd_per_hour = p, instance_type = %t, region = %r, "on-demand price from the Pricing API");
                readings.price(PriceKind::List, p);
                Read::Done
            }
            Ok(None) => {
                tracing::info!(instance_type = %t, region = %r, "the Pricing API has no price; using the bundled table");
                Read::Done
            }
            Err(e) => Read::Failed(e.to_string()),
        }
    })
    .await
}

/// Polls one AWS Budget, backing off while it fails.
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
    let said = Said {
        failing: "cannot read the AWS Budget; retrying with backoff",
        recovered: Some("AWS Budgets answers again"),
    };
    poll(budget_pace(&budget), said, &budget.name, || async {
        match services.describe_budget(account_id, budget_name).await {
            Ok((reading, period_end)) => {
                readings.budget(&budget.name, reading, period_end);
                Read::Again
            }
            Err(e) => Read::Failed(e.to_string()),
        }
    })
    .await
}
