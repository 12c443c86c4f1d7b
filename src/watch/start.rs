//! Starting the cost watch: the state directory and its audit log, instance metadata and the
//! cloud's API (with `[cloud] provider`), the price and budget pollers, metric publishing, and
//! the decision loop itself, each task in the app's `JoinSet`.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use super::identify::{Identified, Link};
use super::metrics::{NodeLabel, SharedWatchView, WatchCollector};
use super::progress::Progress;
use super::{NodeSignals, Watch};
use crate::actions::Executor;
use crate::config::Config;
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

/// Starts the cost watch: rules, actions, and (with `[cloud] provider`) instance metadata and the
/// cloud's API. Off a cloud, or when instance metadata does not answer, rules run with local
/// actions only.
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
    let (metrics, cost) = views(config, registry);
    let progress = Arc::new(Progress::default());
    // Only the configured cloud is made, and it sets nothing up until metadata names the
    // instance.
    let cloud = crate::cloud::open(config);
    if let Some(cloud) = &cloud {
        cloud.register(registry);
    }
    let mut started = Started {
        view: Arc::clone(&metrics),
        cost: Arc::clone(&cost),
        progress: Arc::clone(&progress),
        audit: None,
        task: None,
        holders: held.holders.clone(),
    };
    if config.rules.is_empty() && config.budgets.is_empty() && config.cloud.provider.is_none() {
        // A price alone keeps the watch on, to account spend and idle dollars.
        if config.cost.hourly_price_usd.is_none() {
            tracing::info!("no rules, no budgets, no price and no cloud: the cost watch is off");
            return Ok(started);
        }
        tracing::info!("no rules, no budgets and no cloud: the cost watch accounts spend and idle dollars at [cost] hourly_price_usd, and acts on nothing");
    }
    let (state_dir, audit) = open_state(config, registry)?;
    started.audit = Some(state_dir.audit_path());
    let signals = Arc::new(signals(cloud.as_deref()));
    let readings = Arc::new(crate::spend::PollerReadings::default());
    query_budgets(config, &readings, registry, tasks);
    let executor = Arc::new(Executor::new(&config.actions, audit, tasks));
    if config
        .rules
        .iter()
        .any(|r| r.action == crate::rules::Action::Reclaim)
    {
        executor
            .verdicts
            .set_node(crate::exposition::hostname(config));
        registry.register_collector(Box::new(crate::kubernetes::verdicts::VerdictCollector(
            Arc::clone(&executor.verdicts),
        )));
    }
    let (identified, later) = match cloud {
        Some(cloud) => {
            let link = Link {
                config: config.clone(),
                cloud,
                snapshots: snapshots.clone(),
                readings: Arc::clone(&readings),
                metrics: Arc::clone(&metrics),
                signals: Arc::clone(&signals),
                executor: Arc::clone(&executor),
                state_dir: state_dir.clone(),
            };
            identify(link, tasks).await
        }
        None => (None, None),
    };
    let (node, api) = match identified {
        Some(Identified { node, api }) => (Some(node), Some(api)),
        None => (None, None),
    };
    warn_unused(config);
    let watch = Watch {
        tracker: crate::spend::Tracker::new(config.clone(), node, readings),
        api,
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
    started.task = Some(run(watch, snapshots, stop));
    Ok(started)
}

/// The watch's and the cost series' views, with their collectors registered.
fn views(config: &Config, registry: &mut Registry) -> (Arc<SharedWatchView>, Arc<SharedCostView>) {
    let metrics = Arc::new(SharedWatchView::default());
    let cost = Arc::new(SharedCostView::default());
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
    (metrics, cost)
}

/// The state directory and its audit log. `Err` is a directory that others can write.
fn open_state(
    config: &Config,
    registry: &mut Registry,
) -> Result<(StateDir, Arc<AuditLog>), DirError> {
    let state_dir = StateDir::new(&config.actions.state_dir);
    match state_dir.create() {
        Ok(()) => {}
        // Whoever else can write the state directory controls holds and pending actions.
        Err(e @ (DirError::Writable { .. } | DirError::Owner { .. })) => return Err(e),
        Err(e) => {
            tracing::error!(error = %e, "cannot create the state directory; no action runs until its records can be written")
        }
    }
    let audit = Arc::new(AuditLog::with_rotation(
        state_dir.audit_path(),
        config.actions.audit_rotation,
    ));
    registry.register_collector(Box::new(StateCollector(Arc::clone(&audit))));
    Ok((state_dir, audit))
}

/// The node's signals at start: on a cloud, the tag hold is unknown until the instance's tags
/// are read, since a `gpuwatch:hold` tag may be there.
fn signals(cloud: Option<&dyn crate::cloud::InstanceMetadata>) -> NodeSignals {
    let mut signals = NodeSignals::default();
    if let Some(cloud) = cloud {
        signals.tag_hold = std::sync::Mutex::new(crate::state::HoldStatus::Unknown(format!(
            "the instance's tags have not been read yet ({}), and may hold a gpuwatch:hold tag",
            cloud.tag_sources()
        )));
    }
    signals
}

/// Team budgets read from Prometheus need no cloud: each has its poller.
fn query_budgets(
    config: &Config,
    readings: &crate::spend::PollerReadings,
    registry: &mut Registry,
    tasks: &mut JoinSet<()>,
) {
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
}

/// Asks instance metadata once: the instance as it names it, connected; or, when it does not
/// answer, the instance to come from a background retry.
async fn identify(
    link: Link,
    tasks: &mut JoinSet<()>,
) -> (
    Option<Identified>,
    Option<tokio::sync::oneshot::Receiver<Identified>>,
) {
    match link.cloud.identity().await {
        Ok(node) => {
            let id = link.connect(node, tasks);
            // The loop is built with the instance before it runs a step.
            link.watch_tags(Arc::clone(&id.api), tasks);
            (Some(id), None)
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "instance metadata is unavailable: asked again in the background; until it answers and the instance's tags are read, every action is held, and no cloud price, budget or metric call is made"
            );
            let (found, wait) = tokio::sync::oneshot::channel();
            tasks.spawn(link.retry(found));
            (None, Some(wait))
        }
    }
}

/// Says which settings of another cloud's do nothing here.
fn warn_unused(config: &Config) {
    for b in &config.budgets {
        let crate::config::BudgetSource::Cloud { source, .. } = b.source else {
            continue;
        };
        let reads = |p: &crate::cloud::Provider| {
            let budgets = p.keys.budgets.as_ref();
            budgets.is_some_and(|s| s.source == source)
        };
        let owner = crate::cloud::providers().find(|p| reads(p));
        if let Some(owner) = owner.filter(|p| config.cloud.provider != Some(p.name)) {
            tracing::warn!(budget = %b.name, "a {source} budget needs provider = \"{}\" on that cloud's instance; it stays unknown", owner.name);
        }
    }
}

/// Runs the watch on a task of its own, and says so loudly if it panics.
fn run(watch: Watch, snapshots: Snapshots, stop: tokio::sync::watch::Receiver<bool>) -> WatchTask {
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
    WatchTask { handle, abort }
}

/// The running cost watch: awaited at shutdown, and cancelled if it does not stop in time.
pub struct WatchTask {
    pub handle: tokio::task::JoinHandle<()>,
    pub abort: tokio::task::AbortHandle,
}
