//! Starting the cost watch: the state directory and its audit log, instance metadata and the
//! EC2 API (with `provider = "aws"`), the price and budget pollers, CloudWatch publishing, and
//! the decision loop itself, each task in the app's `JoinSet`.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use super::identify::{Identified, Link};
use super::metrics::{NodeLabel, SharedWatchView, WatchCollector};
use super::progress::Progress;
use super::{NodeSignals, Watch};
use crate::actions::Executor;
use crate::cloud::imds::Imds;
use crate::cloudwatch::metrics::CloudWatchCollector;
use crate::config::{Config, Provider};
use crate::gpu::sampler::Snapshots;
use crate::kubernetes::view::SharedKubernetesView;
use crate::spend::metrics::{CostCollector, SharedCostView};
use crate::state::metrics::StateCollector;
use crate::state::{AuditLog, DirError, StateDir};

/// The cost watch as started: the views it publishes, and its task while it runs.
pub struct Started {
    pub view: Arc<SharedWatchView>,
    pub cost: Arc<SharedCostView>,
    /// How far the decision loop has come, for `/-/healthy`, the watchdog and the status page.
    pub progress: Arc<Progress>,
    /// The audit log, when the watch runs.
    pub audit: Option<std::path::PathBuf>,
    /// The running watch; `None` while it is off (no rules, budgets, cloud or price).
    pub task: Option<WatchTask>,
    /// Who holds the GPUs, jobs and users (for the status page).
    pub holders: Option<Arc<crate::slurm::holders::SharedHolders>>,
}

/// Starts the cost watch: rules, actions, and (with `provider = "aws"`) instance metadata and the
/// EC2 API. Off AWS, or when instance metadata does not answer, rules run with local actions only.
///
/// The views it publishes (the watch's and the cost series) exist, and their collectors are
/// registered, whether it runs or not. `Err` is a state directory that others can write:
/// whoever can write it controls holds and pending actions.
/// Who holds the GPUs: the kubelet's pods, and the Slurm jobs and users.
#[derive(Default)]
pub struct HeldBy {
    pub pods: Option<Arc<SharedKubernetesView>>,
    pub holders: Option<Arc<crate::slurm::holders::SharedHolders>>,
}

pub async fn spawn(
    config: &Config,
    snapshots: Snapshots,
    held: HeldBy,
    health_seed: crate::gpu::health::Seed,
    registry: &mut Registry,
    stop: tokio::sync::watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> Result<Started, DirError> {
    let metrics = Arc::new(SharedWatchView::default());
    let cost = Arc::new(SharedCostView::default());
    let cloudwatch = Arc::new(crate::cloudwatch::Counters::default());
    let progress = Arc::new(Progress::default());
    metrics.update(|v| {
        v.labels = config
            .node
            .labels
            .iter()
            .map(|(name, value)| NodeLabel {
                name: name.clone(),
                value: value.clone(),
            })
            .collect();
    });
    registry.register_collector(Box::new(WatchCollector(Arc::clone(&metrics))));
    registry.register_collector(Box::new(CostCollector {
        view: Arc::clone(&cost),
        sources: config
            .budgets
            .iter()
            .map(|b| (b.name.clone(), b.source.as_str()))
            .collect(),
    }));
    if config.cloudwatch.enabled {
        registry.register_collector(Box::new(CloudWatchCollector(Arc::clone(&cloudwatch))));
    }
    let mut started = Started {
        view: Arc::clone(&metrics),
        cost: Arc::clone(&cost),
        progress: Arc::clone(&progress),
        audit: None,
        task: None,
        holders: held.holders.clone(),
    };
    if config.rules.is_empty()
        && config.budgets.is_empty()
        && config.cloud.provider == Provider::None
    {
        // A price alone keeps the watch on, to account spend and idle dollars.
        if config.cost.hourly_price_usd.is_none() {
            tracing::info!("no rules, no budgets, no price and no cloud: the cost watch is off");
            return Ok(started);
        }
        tracing::info!("no rules, no budgets and no cloud: the cost watch accounts spend and idle dollars at [cost] hourly_price_usd, and acts on nothing");
    }
    let state_dir = StateDir::new(&config.actions.state_dir);
    match state_dir.create() {
        Ok(()) => {}
        // Whoever else can write the state directory controls holds and pending actions.
        Err(e @ (DirError::Writable { .. } | DirError::Owner { .. })) => return Err(e),
        Err(e) => {
            tracing::error!(error = %e, "cannot create the state directory; no action runs until its records can be written")
        }
    }
    started.audit = Some(state_dir.audit_path());
    let audit = Arc::new(AuditLog::with_rotation(
        state_dir.audit_path(),
        config.actions.audit_rotation,
    ));
    registry.register_collector(Box::new(StateCollector(Arc::clone(&audit))));
    let mut signals = NodeSignals::default();
    if config.cloud.provider == Provider::Aws {
        // Until the instance's tags are read, a `gpuwatch:hold` tag may be there: unknown holds.
        signals.tag_hold = std::sync::Mutex::new(crate::state::HoldStatus::Unknown(
            super::cloud::TAGS_UNREAD.into(),
        ));
    }
    let signals = Arc::new(signals);
    let readings = Arc::new(crate::spend::PollerReadings::default());
    // Team budgets read from Prometheus need no cloud: each has its poller.
    let queried: Vec<_> = config
        .budgets
        .iter()
        .filter(|b| matches!(b.source, crate::config::BudgetSource::Prometheus(_)))
        .collect();
    if !queried.is_empty() {
        registry.register_collector(Box::new(crate::spend::query::QueryCollector(Arc::clone(
            &readings.prometheus,
        ))));
    }
    for b in queried {
        tasks.spawn(crate::spend::query::poll(
            b.clone(),
            Arc::clone(&readings.prometheus),
        ));
    }
    let executor = Arc::new(Executor::new(&config.actions, audit, tasks));
    let mut identified = None;
    let mut later = None;
    if config.cloud.provider == Provider::Aws {
        let link = Link {
            config: config.clone(),
            imds: Arc::new(Imds::new(&config.cloud.imds_endpoint)),
            snapshots: snapshots.clone(),
            readings: Arc::clone(&readings),
            cloudwatch: Arc::clone(&cloudwatch),
            metrics: Arc::clone(&metrics),
            signals: Arc::clone(&signals),
            executor: Arc::clone(&executor),
        };
        match link.imds.identity().await {
            Ok(node) => {
                let id = link.connect(node, tasks);
                // The loop below is built with the instance before it runs a step.
                link.watch_tags(id.ec2.clone(), tasks);
                identified = Some(id);
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "instance metadata is unavailable: asked again in the background; until it answers and the instance's tags are read, every action is held, and no AWS price, budget or CloudWatch call is made"
                );
                let (found, wait) = tokio::sync::oneshot::channel();
                tasks.spawn(link.retry(found));
                later = Some(wait);
            }
        }
    }
    let (node, services) = match identified {
        Some(Identified { node, services, .. }) => (Some(node), Some(services)),
        None => (None, None),
    };
    if config.cloudwatch.enabled && config.cloud.provider != Provider::Aws {
        tracing::warn!("[cloudwatch] enabled is set, but gpuwatch is not on EC2 with provider = \"aws\": nothing is published");
    }
    for b in &config.budgets {
        if config.cloud.provider != Provider::Aws
            && matches!(b.source, crate::config::BudgetSource::AwsBudgets { .. })
        {
            tracing::warn!(budget = %b.name, "an aws_budgets budget needs provider = \"aws\" on EC2; it stays unknown");
        }
    }
    let watch = Watch {
        tracker: crate::spend::Tracker::new(config.clone(), node, readings),
        services,
        identified: later,
        publishes: JoinSet::new(),
        pods: held.pods,
        holders: held.holders,
        progress,
        unpublished: Default::default(),
        config: config.clone(),
        state_dir,
        executor,
        metrics,
        cost,
        signals,
        health_seed: Some(health_seed),
    };
    let task = tokio::spawn(watch.run(snapshots, stop));
    let abort = task.abort_handle();
    let handle = tokio::spawn(async move {
        // The watch returns only on shutdown; if it panics, no action is taken from then on
        // (the safe side), and this says so loudly.
        if let Err(e) = task.await {
            if e.is_panic() {
                tracing::error!(error = %e, "the cost watch stopped: no rule is evaluated and no action taken until gpuwatch restarts");
            }
        }
    });
    started.task = Some(WatchTask { handle, abort });
    Ok(started)
}

/// The running cost watch: awaited at shutdown, and cancelled if it does not stop in time.
pub struct WatchTask {
    pub handle: tokio::task::JoinHandle<()>,
    pub abort: tokio::task::AbortHandle,
}
