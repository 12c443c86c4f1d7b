//! The AWS services besides EC2: Budgets, SNS, CloudWatch and the Pricing API.

use std::sync::{Arc, OnceLock};

use aws_sdk_cloudwatch::types::MetricDatum;

use crate::cost::budget::Reading;

/// Every AWS API operation gpuwatch calls, with the IAM action that allows it.
/// `config/iam-policy.json` grants exactly these; a test keeps them in step with the code.
pub const IAM_ACTIONS: &[(&str, &str)] = &[
    ("DescribeInstances", "ec2:DescribeInstances"),
    (
        "DescribeSpotInstanceRequests",
        "ec2:DescribeSpotInstanceRequests",
    ),
    ("DescribeSpotPriceHistory", "ec2:DescribeSpotPriceHistory"),
    ("CreateTags", "ec2:CreateTags"),
    ("StopInstances", "ec2:StopInstances"),
    ("TerminateInstances", "ec2:TerminateInstances"),
    (
        "CancelSpotInstanceRequests",
        "ec2:CancelSpotInstanceRequests",
    ),
    ("DescribeBudget", "budgets:ViewBudget"),
    ("Publish", "sns:Publish"),
    ("PutMetricData", "cloudwatch:PutMetricData"),
    ("GetProducts", "pricing:GetProducts"),
];

/// The AWS SDK's shared configuration, loaded on the first call that needs it: a node that
/// never calls AWS (a price in the config, local budgets, instance tags from metadata, and no
/// rule that fires) never loads the credential chain, its STS client or the system's CA
/// certificates, and keeps their memory. Clones share one configuration.
#[derive(Clone)]
pub struct Shared(Arc<SharedInner>);

struct SharedInner {
    region: String,
    endpoint_url: Option<String>,
    loaded: tokio::sync::OnceCell<aws_config::SdkConfig>,
}

impl Shared {
    /// `endpoint_url` (for tests and private endpoints) is one endpoint for every service.
    pub fn new(region: &str, endpoint_url: Option<&str>) -> Shared {
        Shared(Arc::new(SharedInner {
            region: region.to_string(),
            endpoint_url: endpoint_url.map(str::to_string),
            loaded: tokio::sync::OnceCell::new(),
        }))
    }

    /// The configuration, loaded now if no call has loaded it yet.
    pub async fn get(&self) -> &aws_config::SdkConfig {
        let inner = &*self.0;
        inner
            .loaded
            // Boxed: loading is a large future, and it runs once; unboxed, it would size every
            // call's future.
            .get_or_init(|| Box::pin(shared_config(&inner.region, inner.endpoint_url.as_deref())))
            .await
    }
}

/// A configuration already loaded.
impl From<aws_config::SdkConfig> for Shared {
    fn from(config: aws_config::SdkConfig) -> Shared {
        let region = config.region().map(ToString::to_string).unwrap_or_default();
        Shared(Arc::new(SharedInner {
            region,
            endpoint_url: config.endpoint_url().map(str::to_string),
            loaded: tokio::sync::OnceCell::new_with(Some(config)),
        }))
    }
}

/// The default credential chain, the region, and (for tests and private endpoints) one endpoint
/// for every service.
async fn shared_config(region: &str, endpoint_url: Option<&str>) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()));
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    // Every call is bounded: an AWS endpoint that hangs costs at most these.
    loader
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(std::time::Duration::from_secs(5))
                .operation_attempt_timeout(std::time::Duration::from_secs(10))
                .operation_timeout(std::time::Duration::from_secs(30))
                .build(),
        )
        .load()
        .await
}

fn err(e: impl std::error::Error) -> String {
    aws_sdk_budgets::error::DisplayErrorContext(e).to_string()
}

/// The AWS services beside EC2. Each client is made on its first call, so a node whose config
/// uses none of them (a price in the config, no AWS Budgets, SNS or CloudWatch) never builds
/// them, nor loads the shared configuration for them: their code and memory stay out of the
/// daemon's resident set.
#[derive(Clone)]
pub struct Services(Arc<Clients>);

struct Clients {
    shared: Shared,
    pricing_endpoint: Option<String>,
    budgets: OnceLock<aws_sdk_budgets::Client>,
    sns: OnceLock<aws_sdk_sns::Client>,
    cloudwatch: OnceLock<aws_sdk_cloudwatch::Client>,
    pricing: OnceLock<aws_sdk_pricing::Client>,
}

impl Services {
    /// `pricing_endpoint` overrides the Pricing API's endpoint alone (it lives in us-east-1).
    pub fn new(shared: &Shared, pricing_endpoint: Option<&str>) -> Services {
        Services(Arc::new(Clients {
            shared: shared.clone(),
            pricing_endpoint: pricing_endpoint.map(str::to_string),
            budgets: OnceLock::new(),
            sns: OnceLock::new(),
            cloudwatch: OnceLock::new(),
            pricing: OnceLock::new(),
        }))
    }

    async fn budgets(&self) -> &aws_sdk_budgets::Client {
        let shared = self.0.shared.get().await;
        self.0
            .budgets
            .get_or_init(|| aws_sdk_budgets::Client::new(shared))
    }

    async fn sns(&self) -> &aws_sdk_sns::Client {
        let shared = self.0.shared.get().await;
        self.0.sns.get_or_init(|| aws_sdk_sns::Client::new(shared))
    }

    async fn cloudwatch(&self) -> &aws_sdk_cloudwatch::Client {
        let shared = self.0.shared.get().await;
        self.0
            .cloudwatch
            .get_or_init(|| aws_sdk_cloudwatch::Client::new(shared))
    }

    async fn pricing(&self) -> &aws_sdk_pricing::Client {
        let shared = self.0.shared.get().await;
        self.0.pricing.get_or_init(|| {
            let mut pricing = aws_sdk_pricing::config::Builder::from(shared)
                .region(aws_sdk_pricing::config::Region::new("us-east-1"));
            if let Some(url) = &self.0.pricing_endpoint {
                pricing = pricing.endpoint_url(url);
            }
            aws_sdk_pricing::Client::from_conf(pricing.build())
        })
    }

    /// An AWS Budget's actual and forecast spend against its limit, in its current period, and
    /// when that period ends.
    pub async fn describe_budget(
        &self,
        account_id: &str,
        name: &str,
    ) -> Result<(Reading, f64), String> {
        let out = self
            .budgets()
            .await
            .describe_budget()
            .account_id(account_id)
            .budget_name(name)
            .send()
            .await
            .map_err(err)?;
        let b = out.budget().ok_or("DescribeBudget returned no budget")?;
        let amount = |s: Option<&aws_sdk_budgets::types::Spend>| {
            s.and_then(|s| crate::cost::parse_usd(s.amount()))
        };
        let limit = amount(b.budget_limit()).ok_or("the budget has no limit")?;
        let spend = b.calculated_spend();
        // The budget's `TimePeriod` start is the day it began, years ago perhaps: the period its
        // spend is of is the calendar one its time unit says, now.
        let (period_start, period_end) = current_period(b.time_unit(), crate::time::now())
            .ok_or_else(|| {
                format!(
                    "the budget's time unit {:?} is none of DAILY, MONTHLY, QUARTERLY, ANNUALLY",
                    b.time_unit().as_str()
                )
            })?;
        let reading = Reading {
            spent: amount(spend.and_then(|c| c.actual_spend())).unwrap_or(0.0),
            forecast: amount(spend.and_then(|c| c.forecasted_spend())),
            limit,
            period_start,
        };
        Ok((reading, period_end))
    }

    pub async fn publish(
        &self,
        topic_arn: &str,
        subject: &str,
        message: &str,
    ) -> Result<Option<String>, String> {
        let out = self
            .sns()
            .await
            .publish()
            .topic_arn(topic_arn)
            .subject(subject)
            .message(message)
            .send()
            .await
            .map_err(err)?;
        Ok(out.message_id().map(str::to_string))
    }

    pub async fn put_metric_data(
        &self,
        namespace: &str,
        datums: Vec<MetricDatum>,
    ) -> Result<(), String> {
        self.cloudwatch()
            .await
            .put_metric_data()
            .namespace(namespace)
            .set_metric_data(Some(datums))
            .send()
            .await
            .map_err(err)?;
        Ok(())
    }

    /// The on-demand Linux price of an instance type in a region, from `GetProducts`.
    pub async fn on_demand_price(
        &self,
        region: &str,
        instance_type: &str,
    ) -> Result<Option<f64>, String> {
        use aws_sdk_pricing::types::{Filter, FilterType};
        let term = |field: &str, value: &str| {
            Filter::builder()
                .r#type(FilterType::TermMatch)
                .field(field)
                .value(value)
                .build()
                .map_err(err)
        };
        let out = self
            .pricing()
            .await
            .get_products()
            .service_code("AmazonEC2")
            .filters(term("instanceType", instance_type)?)
            .filters(term("regionCode", region)?)
            .filters(term("operatingSystem", "Linux")?)
            .filters(term("tenancy", "Shared")?)
            .filters(term("preInstalledSw", "NA")?)
            .filters(term("capacitystatus", "Used")?)
            .format_version("aws_v1")
            .max_results(10)
            .send()
            .await
            .map_err(err)?;
        Ok(out
            .price_list()
            .iter()
            .find_map(|entry| parse_price_list_entry(entry)))
    }
}

/// Reads the on-demand hourly USD price out of one `GetProducts` PriceList entry (a JSON
/// string): `terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`, for unit "Hrs".
fn parse_price_list_entry(entry: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(entry).ok()?;
    let on_demand = v.get("terms")?.get("OnDemand")?.as_object()?;
    on_demand.values().find_map(|term| {
        term.get("priceDimensions")?
            .as_object()?
            .values()
            .filter(|d| d.get("unit").and_then(|u| u.as_str()) == Some("Hrs"))
            .find_map(|d| {
                d.get("pricePerUnit")?
                    .get("USD")?
                    .as_str()
                    .and_then(crate::cost::parse_hourly_usd)
            })
    })
}

/// The start and end of the budget period containing `now` (UTC, as AWS Budgets counts them).
fn current_period(unit: &aws_sdk_budgets::types::TimeUnit, now: f64) -> Option<(f64, f64)> {
    use crate::cost::calendar::{months, Period};
    use aws_sdk_budgets::types::TimeUnit;
    Some(match unit {
        TimeUnit::Daily => (Period::Day.start(now), Period::Day.end(now)),
        TimeUnit::Monthly => months(now, 1),
        TimeUnit::Quarterly => months(now, 3),
        TimeUnit::Annually => months(now, 12),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn price_list_entry() {
        let entry = r#"{"product":{"attributes":{"instanceType":"p4d.24xlarge"}},
            "terms":{"OnDemand":{"X.JRTCKXETXF":{"priceDimensions":{"X.JRTCKXETXF.6YS6EN2CT7":
            {"unit":"Hrs","pricePerUnit":{"USD":"32.7726000000"}}}}}}}"#;
        assert_eq!(parse_price_list_entry(entry), Some(32.7726));
        assert_eq!(parse_price_list_entry("{}"), None);
        assert_eq!(parse_price_list_entry("not json"), None);
    }
}
