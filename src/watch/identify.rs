//! This instance on its cloud (`[cloud] provider`): once instance metadata names it, the
//! cloud's API and its pollers (prices, budgets, metrics, and the notice and tag poller)
//! start for it, at start or later.
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
use crate::actions::{Connected, Executor};
use crate::cloud::{ControlPlane, Node};
use crate::config::Config;
use crate::gpu::sampler::Snapshots;
use crate::spend::PollerReadings;

/// The first wait before instance metadata is asked again.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// This instance, as the decision loop takes it in: its node (price, lifecycle) and its
/// cloud's API (budget alerts to a topic, the instance's state).
pub struct Identified {
    pub node: Node,
    pub api: Arc<dyn ControlPlane>,
}

/// What the cloud side of the watch needs once the instance is known.
pub struct Link {
    pub config: Config,
    pub cloud: Arc<dyn crate::cloud::InstanceMetadata>,
    pub snapshots: Snapshots,
    pub readings: Arc<PollerReadings>,
    pub metrics: Arc<SharedWatchView>,
    pub signals: Arc<NodeSignals>,
    pub executor: Arc<Executor>,
    pub state_dir: crate::state::StateDir,
}

impl Link {
    /// Connects to the cloud as `node`: the executor acts on it from now on, and its price,
    /// budget and metric pollers start in `tasks`. The notice and tag poller is not among
    /// them: `watch_tags` starts it once the decision loop has the instance too.
    pub fn connect(&self, mut node: Node, tasks: &mut JoinSet<()>) -> Identified {
        if let Some(region) = &self.config.cloud.region {
            node.region.clone_from(region);
        }
        let link = crate::cloud::Link {
            config: &self.config,
            snapshots: &self.snapshots,
            readings: Arc::clone(&self.readings) as Arc<dyn crate::cloud::Readings>,
        };
        let api = self.cloud.connect(&node, link, tasks);
        self.executor.set_cloud(Connected {
            node: node.clone(),
            api: Arc::clone(&api),
        });
        let provider = self.cloud.name();
        self.metrics.update(|v| {
            v.node = Some(node.clone());
            v.provider = Some(provider);
        });
        Identified { node, api }
    }

    /// Starts the notice and tag poller, last: no tag is read (and no action can run) before
    /// the executor and the decision loop know the instance.
    pub fn watch_tags(&self, api: Arc<dyn ControlPlane>, tasks: &mut JoinSet<()>) {
        let config = &self.config;
        tasks.spawn(super::poll_cloud(super::CloudPoller {
            cloud: Arc::clone(&self.cloud),
            api: Some(api),
            signals: Arc::clone(&self.signals),
            executor: Arc::clone(&self.executor),
            metrics: Arc::clone(&self.metrics),
            hook: config.spot.interruption_hook.clone(),
            tag_labels: config.node.tag_labels.clone(),
            state_dir: self.state_dir.clone(),
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
            match self.cloud.identity().await {
                Ok(node) => {
                    tracing::info!("instance metadata answers; the instance's tags are read next, and actions wait for them");
                    let identified = self.connect(node, &mut tasks);
                    let api = Arc::clone(&identified.api);
                    // The loop is gone only when the watch stopped.
                    let _ = found.send(identified);
                    self.watch_tags(api, &mut tasks);
                    break;
                }
                Err(e) => {
                    wait = (wait * 2).min(most);
                    // Once the waits are as long as they get, a warning each time: this may
                    // not be the configured cloud at all.
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
