//! This instance on EC2 (`provider = "aws"`): once instance metadata names it, the EC2 API and
//! the AWS pollers (the spot price or the Pricing API, AWS Budgets, CloudWatch, and the spot
//! and tag poller) start for it, at start or later.
//!
//! Instance metadata that does not answer at start (the network not up yet at boot, a throttled
//! endpoint) is asked again in the background, after 1 s, then twice as long each time, at most
//! `poll_interval` apart, until it answers. Meanwhile the instance's tags are unread, so every
//! action is held (an unknown hold holds); the exporter, local warnings and budgets run on.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::metrics::SharedWatchView;
use super::NodeSignals;
use crate::actions::{Cloud, Executor};
use crate::cloud::ec2::Ec2;
use crate::cloud::imds::{Imds, Node};
use crate::cloud::services::{Services, Shared};
use crate::config::Config;
use crate::gpu::sampler::Snapshots;
use crate::rules::Lifecycle;
use crate::spend::PollerReadings;

/// The first wait before instance metadata is asked again.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// This instance, as the decision loop takes it in: its node (price, lifecycle) and the AWS
/// services its budgets and alerts use.
pub struct Identified {
    pub node: Node,
    pub services: Services,
    /// The EC2 API for it, for the spot and tag poller.
    pub ec2: Ec2,
}

/// What the AWS side of the watch needs once the instance is known.
pub struct Link {
    pub config: Config,
    pub imds: Arc<Imds>,
    pub snapshots: Snapshots,
    pub readings: Arc<PollerReadings>,
    pub cloudwatch: Arc<crate::cloudwatch::Counters>,
    pub metrics: Arc<SharedWatchView>,
    pub signals: Arc<NodeSignals>,
    pub executor: Arc<Executor>,
}

impl Link {
    /// Connects to EC2 as `node`: the executor acts on it from now on, and its price, budget
    /// and CloudWatch pollers start in `tasks`. The spot and tag poller is not among them:
    /// `watch_tags` starts it once the decision loop has the instance too.
    pub fn connect(&self, mut node: Node, tasks: &mut JoinSet<()>) -> Identified {
        let config = &self.config;
        tracing::info!(
            instance = %node.instance_id,
            instance_type = %node.instance_type,
            zone = %node.availability_zone,
            lifecycle = node.lifecycle_label(),
            "running on EC2"
        );
        if let Some(region) = &config.cloud.region {
            node.region.clone_from(region);
        }
        let shared = Shared::new(&node.region, config.cloud.endpoint_url.as_deref());
        let ec2 = Ec2::new(&shared, &node.instance_id);
        let services = Services::new(&shared, config.cost.pricing_endpoint_url.as_deref());
        if config.cost.hourly_price_usd.is_none() {
            match node.lifecycle {
                Some(Lifecycle::Spot) => {
                    tasks.spawn(crate::spend::poll_spot_price(
                        ec2.clone(),
                        node.clone(),
                        Arc::clone(&self.readings),
                        config.cost.spot_price_refresh,
                    ));
                }
                Some(Lifecycle::OnDemand) if config.cost.pricing_api => {
                    tasks.spawn(crate::spend::poll_pricing_api(
                        services.clone(),
                        node.clone(),
                        Arc::clone(&self.readings),
                    ));
                }
                _ => {}
            }
        }
        for b in &config.budgets {
            if matches!(b.source, crate::config::BudgetSource::AwsBudgets { .. }) {
                tasks.spawn(crate::spend::poll_budget(
                    services.clone(),
                    b.clone(),
                    Arc::clone(&self.readings),
                ));
            }
        }
        if config.cloudwatch.enabled {
            tasks.spawn(crate::cloudwatch::run(
                config.cloudwatch.clone(),
                services.clone(),
                node.clone(),
                self.snapshots.clone(),
                Arc::clone(&self.cloudwatch),
            ));
        }
        self.executor.set_cloud(Cloud {
            node: node.clone(),
            ec2: ec2.clone(),
        });
        self.metrics.update(|v| v.node = Some(node.clone()));
        Identified {
            node,
            services,
            ec2,
        }
    }

    /// Starts the spot and tag poller, last: no tag is read (and no action can run) before the
    /// executor and the decision loop know the instance.
    pub fn watch_tags(&self, ec2: Ec2, tasks: &mut JoinSet<()>) {
        let config = &self.config;
        tasks.spawn(super::poll_cloud(super::CloudPoller {
            imds: Arc::clone(&self.imds),
            ec2: Some(ec2),
            signals: Arc::clone(&self.signals),
            executor: Arc::clone(&self.executor),
            metrics: Arc::clone(&self.metrics),
            hook: config.spot.interruption_hook.clone(),
            tag_labels: config.node.tag_labels.clone(),
            hook_timeout: config.spot.hook_timeout,
            every: config.cloud.poll_interval,
            tag_every: config.cloud.tag_poll_interval,
        }));
    }

    /// Asks instance metadata again until it answers, then connects and hands the instance to
    /// the decision loop through `found`. Runs the pollers it started until it is aborted.
    pub async fn retry(self, found: oneshot::Sender<Identified>) {
        let mut wait = FIRST_RETRY;
        let most = self.config.cloud.poll_interval.max(FIRST_RETRY);
        let mut tasks = JoinSet::new();
        loop {
            tokio::time::sleep(wait).await;
            match self.imds.identity().await {
                Ok(node) => {
                    tracing::info!("instance metadata answers; the instance's tags are read next, and actions wait for them");
                    let identified = self.connect(node, &mut tasks);
                    let ec2 = identified.ec2.clone();
                    // The loop is gone only when the watch stopped.
                    let _ = found.send(identified);
                    self.watch_tags(ec2, &mut tasks);
                    break;
                }
                Err(e) => {
                    wait = (wait * 2).min(most);
                    // Once the waits are as long as they get, a warning each time: this may
                    // not be EC2 at all, while provider = "aws" says it is.
                    if wait == most {
                        tracing::warn!(error = %e, retry_in = ?wait, "instance metadata is still unavailable: every action stays held");
                    } else {
                        tracing::debug!(error = %e, retry_in = ?wait, "instance metadata is still unavailable");
                    }
                }
            }
        }
        while tasks.join_next().await.is_some() {}
    }
}
