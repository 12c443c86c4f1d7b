//! Amazon EC2 (`provider = "aws"`): IMDSv2 for identity, spot notices and tags; the EC2 API for
//! actions; the spot price or the Pricing API, AWS Budgets, SNS and CloudWatch besides.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::{
    Call, CloudError, ControlPlane, Fut, InstanceMetadata, Link, MetadataError, Node, Notice,
    NoticeKind,
};
use crate::cloud::plan::{Down, Plan, SpotStop};
use crate::cloud::{Provider, Rehearsal};
use crate::config::{CloudConfig, CloudKeys};
use crate::rules::{Action, Lifecycle};

mod budgets;
pub mod cloudwatch;
pub mod ec2;
pub mod imds;
pub mod plan;
mod pollers;
pub mod prices;
pub mod services;
pub mod settings;

use settings::Settings;

use ec2::Ec2;
use imds::Ec2Metadata;
use services::{Services, Shared};

/// EC2, on the cloud boundary's list of clouds.
pub const PROVIDER: Provider = Provider {
    name: "aws",
    open: |config| Arc::new(Aws::new(config)),
    rehearse,
    follows_operations: false,
    keys: CloudKeys {
        budgets: Some(budgets::SOURCE),
        topic: Some(budgets::TOPIC),
        ..CloudKeys::of::<Settings>(&["cloudwatch"], |_| None)
    },
    // The SDK's environment credentials.
    credentials: &[
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    ],
};

/// EC2's plan for `action`, with no spot request behind the instance (which only the API tells).
fn rehearse(
    _cloud: &CloudConfig,
    action: Action,
    lifecycle: Option<Lifecycle>,
    spot_stop: SpotStop,
) -> Rehearsal {
    crate::cloud::leaves(
        plan::plan(action, lifecycle, None, spot_stop),
        plan::Step::leaves,
    )
}

pub struct Aws {
    imds: Ec2Metadata,
    /// CloudWatch publishing's counters, for its series.
    cloudwatch: Arc<cloudwatch::Counters>,
    publishes: bool,
}

impl Aws {
    pub fn new(config: &crate::config::Config) -> Aws {
        Aws {
            imds: Ec2Metadata::new(&config.cloud.imds_endpoint),
            cloudwatch: Arc::default(),
            publishes: config
                .cloud
                .section
                .settings::<Settings>()
                .cloudwatch
                .enabled,
        }
    }
}

impl InstanceMetadata for Aws {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn identity(&self) -> Fut<'_, Result<Node, MetadataError>> {
        Box::pin(self.imds.identity())
    }

    fn interruption(&self) -> Fut<'_, Result<Option<Notice>, MetadataError>> {
        Box::pin(async {
            Ok(match self.imds.interruption().await? {
                Some(imds::Notice::Interruption { action, time }) => Some(Notice {
                    key: time.to_string(),
                    kind: NoticeKind::Interruption,
                    time,
                    text: format!(
                        "spot instance-action {action:?} at {}",
                        crate::time::rfc3339(time)
                    ),
                }),
                _ => None,
            })
        })
    }

    fn advice(&self) -> Fut<'_, Result<Vec<Notice>, MetadataError>> {
        Box::pin(async {
            Ok(match self.imds.rebalance().await? {
                Some(imds::Notice::Rebalance { time }) => vec![Notice {
                    key: format!("rebalance {time}"),
                    kind: NoticeKind::AtRisk,
                    time,
                    text: "spot rebalance recommendation".into(),
                }],
                _ => Vec::new(),
            })
        })
    }

    fn tags(&self) -> Fut<'_, Result<super::Tags, MetadataError>> {
        Box::pin(async { Ok(self.imds.tags().await?.into_iter().collect()) })
    }

    fn tag_sources(&self) -> &'static str {
        "instance metadata tags, or ec2:DescribeInstances"
    }

    fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        if !self.publishes {
            return;
        }
        registry.register_collector(Box::new(cloudwatch::metrics::CloudWatchCollector(
            Arc::clone(&self.cloudwatch),
        )));
    }

    fn connect(
        &self,
        node: &Node,
        link: Link<'_>,
        tasks: &mut JoinSet<()>,
    ) -> Arc<dyn ControlPlane> {
        let config = link.config;
        tracing::info!(
            instance = %node.instance_id,
            instance_type = %node.instance_type,
            zone = %node.availability_zone,
            lifecycle = node.lifecycle_label(),
            "running on EC2"
        );
        let shared = Shared::new(&node.region, config.cloud.endpoint_url.as_deref());
        let ec2 = Ec2::new(&shared, &node.instance_id);
        let services = Services::new(&shared, config.cost.pricing_endpoint_url.as_deref());
        // The built-in table's price of this type, before any poller answers: the price of an
        // on-demand instance until the Pricing API gives one, and what its first answer must
        // not lie twentyfold from.
        if let Some(p) = prices::table().price(&node.region, &node.instance_type) {
            link.readings.baseline(super::PriceKind::List, p);
            link.readings.price(super::PriceKind::Table, p);
        }
        if config.cost.hourly_price_usd.is_none() {
            match node.lifecycle {
                Some(Lifecycle::Spot) => {
                    tasks.spawn(pollers::poll_spot_price(
                        ec2.clone(),
                        node.clone(),
                        Arc::clone(&link.readings),
                        config.cost.spot_price_refresh,
                    ));
                }
                Some(Lifecycle::OnDemand) if config.cost.pricing_api => {
                    tasks.spawn(pollers::poll_pricing_api(
                        services.clone(),
                        node.clone(),
                        Arc::clone(&link.readings),
                    ));
                }
                _ => {}
            }
        }
        for b in &config.budgets {
            if let Some(keys) = b.source.cloud_keys(budgets::SOURCE.source) {
                let Ok(budget) = budgets::Budget::read(&b.name, keys) else {
                    continue;
                };
                tasks.spawn(pollers::poll_budget(
                    services.clone(),
                    b.clone(),
                    budget,
                    Arc::clone(&link.readings),
                ));
            }
        }
        let publishing = config.cloud.section.settings::<Settings>().cloudwatch;
        if publishing.enabled {
            tasks.spawn(cloudwatch::run(
                publishing.checked(),
                services.clone(),
                node.clone(),
                link.snapshots.clone(),
                Arc::clone(&self.cloudwatch),
            ));
        }
        Arc::new(AwsApi {
            ec2,
            services,
            lifecycle: node.lifecycle,
        })
    }
}

/// EC2 and SNS, for this instance.
struct AwsApi {
    ec2: Ec2,
    services: Services,
    lifecycle: Option<Lifecycle>,
}

impl ControlPlane for AwsApi {
    fn tags(&self) -> Option<Fut<'_, Result<super::Tags, CloudError>>> {
        Some(Box::pin(self.ec2.tags()))
    }

    fn state(&self) -> Fut<'_, Result<Option<String>, CloudError>> {
        Box::pin(self.ec2.state())
    }

    fn plan(
        &self,
        action: Action,
        spot_stop: SpotStop,
    ) -> Fut<'_, Result<Plan<Box<dyn super::Operation>>, CloudError>> {
        Box::pin(async move {
            // The spot request decides whether a stop is possible, and what else to cancel.
            let spot = match self.lifecycle {
                Some(Lifecycle::Spot) if action.is_instance_action() => {
                    self.ec2.spot_request().await.map_err(|e| CloudError {
                        message: format!("cannot tell the spot request: {}", e.message),
                        ..e
                    })?
                }
                _ => None,
            };
            Ok(
                plan::plan(action, self.lifecycle, spot.as_ref(), spot_stop).map(|step| {
                    Box::new(AwsStep {
                        ec2: self.ec2.clone(),
                        step,
                    }) as Box<dyn super::Operation>
                }),
            )
        })
    }

    fn tag_action<'a>(
        &'a self,
        action: &'a str,
        rule: &'a str,
    ) -> Fut<'a, Result<Call, CloudError>> {
        Box::pin(async move {
            Ok(Call {
                operation: "CreateTags".into(),
                request_id: self.ec2.tag_action(action, rule).await?,
            })
        })
    }

    fn publish<'a>(
        &'a self,
        topic: &'a str,
        subject: &'a str,
        text: &'a str,
    ) -> Option<Fut<'a, Result<Option<String>, CloudError>>> {
        Some(Box::pin(async move {
            self.services
                .publish(topic, subject, text)
                .await
                .map_err(|message| CloudError {
                    operation: "Publish",
                    kind: super::ErrorKind::Other,
                    message,
                    request_id: None,
                    retry_after: None,
                })
        }))
    }

    fn grant_hint(&self) -> &'static str {
        "EC2 denied access: grant the calls in config/iam-policy.json to the instance role"
    }
}

struct AwsStep {
    ec2: Ec2,
    step: plan::Step,
}

impl super::Operation for AwsStep {
    fn describe(&self) -> String {
        match &self.step {
            plan::Step::CancelSpotRequest(id) => format!("CancelSpotInstanceRequests {id}"),
            plan::Step::Stop { hibernate: false } => "StopInstances".into(),
            plan::Step::Stop { hibernate: true } => "StopInstances (hibernate)".into(),
            plan::Step::Terminate => "TerminateInstances".into(),
        }
    }

    fn leaves(&self) -> Option<Down> {
        self.step.leaves()
    }

    fn run(&self) -> Fut<'_, Result<Call, CloudError>> {
        Box::pin(async move {
            let request_id = match &self.step {
                plan::Step::CancelSpotRequest(id) => self.ec2.cancel_spot_request(id).await,
                plan::Step::Stop { hibernate } => self.ec2.stop(*hibernate).await,
                plan::Step::Terminate => self.ec2.terminate().await,
            }?;
            Ok(Call {
                operation: self.describe(),
                request_id,
            })
        })
    }
}
