//! Wiring: builds the sampler, the registry and the HTTP server from a validated config.

use std::net::SocketAddr;
use std::sync::Arc;

use std::io::Write as _;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use crate::actions::{Cloud, Executor};
use crate::cloud::ec2::Ec2;
use crate::cloud::imds::Imds;
use crate::cloudwatch::metrics::CloudWatchCollector;
use crate::config::{Config, Provider};
use crate::exposition::{BuildInfo, SnapshotCollector};
use crate::gpu::nvml::NvmlSource;
use crate::gpu::sampler::SamplerMetrics;
use crate::gpu::sampler::{self, Snapshots};
use crate::http::metrics::HttpCollector;
use crate::http::{router, ServerState};
use crate::kubernetes::metrics::{KubernetesCollector, KubernetesMetrics};
use crate::spend::metrics::{CostCollector, CostMetrics};
use crate::state::metrics::StateCollector;
use crate::state::{AuditLog, DirError, StateDir};
use crate::watch::metrics::{NodeLabel, WatchCollector, WatchMetrics};
use crate::watch::{NodeSignals, Watch};

/// The daemon, built and listening: every task it started is owned here, and `run` stops and
/// drains all of them.
pub struct App {
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: crate::http::listener::Limits,
    http: Arc<crate::http::listener::Stats>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Tells the cost watch to stop deciding.
    stop: tokio::sync::watch::Sender<bool>,
    /// The cost watch, stopped first at shutdown.
    watch: Option<WatchTask>,
    /// Every other task: the sampler's driver, pollers, notification delivery, CloudWatch.
    tasks: JoinSet<()>,
    /// What systemd's readiness, status and watchdog report on.
    watched: crate::watch::progress::Watched,
    liveness: Arc<crate::watch::progress::Liveness>,
    stall_timeout: std::time::Duration,
    interval: std::time::Duration,
    timeout: std::time::Duration,
}

impl App {
    /// Starts the sampler and the cost watch, builds the registry and binds the listener.
    /// `tls` is the web config's TLS, loaded by the caller (`web::tls::load`).
    pub async fn build(
        config: Config,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> anyhow::Result<App> {
        raise_fd_limit();
        let mut tasks = JoinSet::new();
        let metrics = Arc::new(SamplerMetrics::default());
        let source = NvmlSource::new(
            config.nvml.library.clone(),
            config.sampling.per_process_memory,
            Arc::clone(&metrics),
        );
        let snapshots = sampler::spawn(
            source,
            config.sampling.interval,
            config.sampling.timeout,
            Arc::clone(&metrics),
            &mut tasks,
        )
        .context("cannot start the sampler thread")?;

        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut gpu_series = SnapshotCollector::with_names(
            snapshots.clone(),
            BuildInfo::current(),
            config.exposition.names,
            hostname(&config),
        );
        // On Kubernetes: who holds which GPU, read off the scrape path.
        let pods = config
            .kubernetes
            .pod_resources_socket
            .clone()
            .map(|socket| {
                let view = Arc::new(KubernetesMetrics::default());
                tasks.spawn(crate::kubernetes::poll(
                    socket,
                    config.kubernetes.refresh,
                    Arc::clone(&view),
                ));
                view
            });
        if let Some(view) = &pods {
            gpu_series = gpu_series.with_pods(Arc::clone(view));
        }
        registry.register_collector(Box::new(gpu_series));
        if let Some(view) = &pods {
            registry.register_collector(Box::new(KubernetesCollector {
                view: Arc::clone(view),
                snapshots: snapshots.clone(),
            }));
        }
        let series = WatchSeries {
            pods,
            ..WatchSeries::default()
        };
        let views = Arc::clone(&series.watch);
        let progress = Arc::clone(&series.progress);
        let mut status = crate::status::Sources {
            snapshots: snapshots.clone(),
            watch: Arc::clone(&series.watch),
            cost: Arc::clone(&series.cost),
            audit: None,
            watching: false,
            hostname: hostname(&config),
            thresholds: config
                .budgets
                .iter()
                .map(|b| (b.name.clone(), b.thresholds.clone()))
                .collect(),
            // Absolute, so that the `gpuwatch hold --config` it shows works from anywhere.
            config_path: std::fs::canonicalize(&config.path).unwrap_or(config.path.clone()),
            progress: None,
            events: Arc::default(),
        };
        series.watch.update(|v| {
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
        registry.register_collector(Box::new(WatchCollector(Arc::clone(&series.watch))));
        registry.register_collector(Box::new(CostCollector(Arc::clone(&series.cost))));
        if config.cloudwatch.enabled {
            registry.register_collector(Box::new(CloudWatchCollector(Arc::clone(
                &series.cloudwatch,
            ))));
        }
        let http = Arc::new(crate::http::listener::Stats::default());
        registry.register_collector(Box::new(HttpCollector(Arc::clone(&http))));
        // Bound first: a daemon that cannot serve never starts deciding.
        let listener = tokio::net::TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.server.listen))?;
        let addr = listener.local_addr()?;
        let web = config.server.web.as_ref();
        let tls = tls.map(tokio_rustls::TlsAcceptor::from);
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let watch = start_watch(
            &config,
            snapshots.clone(),
            series,
            &mut registry,
            stop_rx,
            &mut tasks,
        )
        .await?;

        tracing::info!(
            interval = ?config.sampling.interval,
            library = %config.nvml.library.display(),
            basic_auth = web.is_some_and(|w| !w.users.is_empty()),
            "listening on {}://{}/",
            if tls.is_some() { "https" } else { "http" },
            display_addr(addr)
        );
        if watch.is_some() {
            status.watching = true;
            status.progress = Some(Arc::clone(&progress));
            status.audit = Some(StateDir::new(&config.actions.state_dir).audit_path());
        }
        let liveness = Arc::new(crate::watch::progress::Liveness::default());
        let watched = crate::watch::progress::Watched {
            snapshots: snapshots.clone(),
            progress: watch.as_ref().map(|_| progress),
            pending: Box::new(move || {
                views
                    .view()
                    .rules
                    .iter()
                    .filter(|r| r.pending.is_some())
                    .count()
            }),
        };
        let mut router = router(ServerState {
            registry: Arc::new(registry),
            snapshots,
            long_polls: Arc::new(tokio::sync::Semaphore::new(config.server.max_long_polls)),
            status,
            liveness: Arc::clone(&liveness),
        });
        if let Some(w) = web {
            router = router.layer(axum::middleware::from_fn_with_state(
                crate::http::auth::Guard::new(w),
                crate::http::auth::layer,
            ));
        }
        let limits = crate::http::listener::Limits {
            max_connections: config.server.max_connections,
            header_read_timeout: config.server.header_read_timeout,
            ..crate::http::listener::Limits::default()
        };
        Ok(App {
            listener,
            router,
            limits,
            http,
            tls,
            stop,
            watch,
            tasks,
            watched,
            liveness,
            stall_timeout: config.server.stall_timeout,
            interval: config.sampling.interval,
            timeout: config.sampling.timeout,
        })
    }

    /// Serves until `shutdown` completes. Then it stops taking decisions first (an action
    /// already handed out has its durable in-flight mark), closes connections within a short
    /// grace period, and cancels and drains every other task before it returns.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        let App {
            listener,
            router,
            limits,
            http,
            tls,
            stop,
            watch,
            mut tasks,
            watched,
            liveness,
            stall_timeout,
            interval,
            timeout,
        } = self;
        // The readiness signal, an interface: one line on stdout once the listener is bound and
        // everything has started. With `--listen 127.0.0.1:0` it carries the port the kernel
        // chose. A closed stdout is no reason to stop.
        if let Ok(addr) = listener.local_addr() {
            let scheme = if tls.is_some() { "https" } else { "http" };
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "listening on {scheme}://{}/", display_addr(addr));
            let _ = out.flush();
        }
        // Memory: once the first sample is in, and again when the pollers' first rounds are
        // done, drop what startup alone touched.
        let settled = watched.snapshots.clone();
        tasks.spawn(async move {
            let _ = tokio::time::timeout(interval + timeout, settled.next_after(0)).await;
            for wait in [
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(30),
            ] {
                tokio::time::sleep(wait).await;
                let _ = tokio::task::spawn_blocking(crate::process_memory::trim).await;
            }
        });
        // systemd: ready once the first sample is in (at most one cycle, well within the
        // stall timeout); then the stall test, for `/-/healthy` and (under systemd) the
        // watchdog pings and status lines.
        let first = watched.snapshots.clone();
        tasks.spawn(async move {
            crate::systemd::ready(&first, interval + timeout).await;
            crate::watch::progress::monitor(watched, liveness, stall_timeout, interval, timeout)
                .await;
        });
        let grace = limits.shutdown_grace;
        let shutdown = async move {
            shutdown.await;
            crate::systemd::stopping();
            tracing::info!("shutting down: no new decisions");
            // Decisions stop first; then the listener drains.
            let _ = stop.send(true);
            if let Some(mut task) = watch {
                if tokio::time::timeout(grace, &mut task.handle).await.is_err() {
                    tracing::warn!("the cost watch did not stop within {grace:?}; an action in flight keeps its durable mark and is not repeated after a restart");
                    task.abort.abort();
                    let _ = task.handle.await;
                }
                // A save the watch was waiting for when it stopped (or was aborted) still runs
                // on the I/O thread; once it is done the daemon may exit.
                if !crate::state::drain(IO_DRAIN).await {
                    tracing::warn!("the state directory did not answer within {IO_DRAIN:?}; exiting without the last save");
                }
            }
        };
        crate::http::listener::serve(listener, router, limits, http, tls, shutdown).await;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        tracing::info!("stopped");
        Ok(())
    }
}

/// How long shutdown waits for the state directory to finish the saves in flight: well within
/// the unit's `TimeoutStopSec`, after the watch's grace.
const IO_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The `Hostname` label of the DCGM names: the configured one, else `NODE_NAME` (which a
/// DaemonSet sets to the node's name, as dcgm-exporter's does), else the machine's hostname.
fn hostname(config: &Config) -> String {
    config
        .exposition
        .hostname
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

/// Raises the soft limit on open files to the hard limit, as servers do: systemd's default
/// soft limit of 1,024 is low for a daemon that serves connections and writes state. Also
/// ignores SIGXFSZ, so that a file size limit fails a write (which is counted, and stops
/// actions) instead of killing the daemon.
fn raise_fd_limit() {
    // SAFETY: setting a signal to be ignored has no preconditions.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass, and nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= lim.rlim_max {
            return;
        }
        let soft = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
            tracing::debug!(from = soft, to = lim.rlim_max, "raised the open-file limit");
        }
    }
}

/// The views the watch and CloudWatch publishing update, each read by its own collector.
#[derive(Default)]
struct WatchSeries {
    watch: Arc<WatchMetrics>,
    cost: Arc<CostMetrics>,
    cloudwatch: Arc<crate::cloudwatch::Counters>,
    /// Who holds which GPU, on Kubernetes: read by pod-scoped rules.
    pods: Option<Arc<KubernetesMetrics>>,
    /// How far the decision loop has come, for the systemd watchdog.
    progress: Arc<crate::watch::progress::Progress>,
}

/// Starts the cost watch: rules, actions, and (with `provider = "aws"`) instance metadata and the
/// EC2 API. Off AWS, or when instance metadata does not answer, rules run with local actions only.
async fn start_watch(
    config: &Config,
    snapshots: Snapshots,
    series: WatchSeries,
    registry: &mut Registry,
    stop: tokio::sync::watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<Option<WatchTask>> {
    let WatchSeries {
        watch: metrics,
        cost,
        cloudwatch,
        pods,
        progress,
    } = series;
    if config.rules.is_empty()
        && config.budgets.is_empty()
        && config.cloud.provider == Provider::None
    {
        tracing::info!("no rules, no budgets and no cloud: the cost watch is off");
        if config.cost.hourly_price_usd.is_none() {
            return Ok(None);
        }
    }
    let state_dir = StateDir::new(&config.actions.state_dir);
    match state_dir.create() {
        Ok(()) => {}
        // Whoever else can write the state directory controls holds and pending actions.
        Err(e @ (DirError::Writable { .. } | DirError::Owner { .. })) => {
            return Err(e).context("refusing to run on an unsafe state directory")
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot create the state directory; no action runs until its records can be written")
        }
    }
    let audit = Arc::new(AuditLog::with_rotation(
        state_dir.audit_path(),
        config.actions.audit_rotation,
    ));
    registry.register_collector(Box::new(StateCollector(Arc::clone(&audit))));
    let mut signals = NodeSignals::default();
    let mut cloud = None;
    let mut imds = None;
    let mut services = None;
    let readings = Arc::new(crate::spend::PollerReadings::default());
    if config.cloud.provider == Provider::Aws {
        let client = Arc::new(Imds::new(&config.cloud.imds_endpoint));
        match client.identity().await {
            Ok(mut node) => {
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
                let shared = crate::cloud::services::Shared::new(
                    &node.region,
                    config.cloud.endpoint_url.as_deref(),
                );
                let ec2 = Ec2::new(&shared, &node.instance_id);
                let svc = crate::cloud::services::Services::new(
                    &shared,
                    config.cost.pricing_endpoint_url.as_deref(),
                );
                if config.cost.hourly_price_usd.is_none() {
                    match node.lifecycle {
                        Some(crate::rules::Lifecycle::Spot) => {
                            tasks.spawn(crate::spend::poll_spot_price(
                                ec2.clone(),
                                node.clone(),
                                Arc::clone(&readings),
                                config.cost.spot_price_refresh,
                            ));
                        }
                        _ if config.cost.pricing_api => {
                            tasks.spawn(crate::spend::poll_pricing_api(
                                svc.clone(),
                                node.clone(),
                                Arc::clone(&readings),
                            ));
                        }
                        _ => {}
                    }
                }
                for b in &config.budgets {
                    if matches!(b.source, crate::config::BudgetSource::AwsBudgets { .. }) {
                        tasks.spawn(crate::spend::poll_budget(
                            svc.clone(),
                            b.clone(),
                            Arc::clone(&readings),
                        ));
                    }
                }
                if config.cloudwatch.enabled {
                    tasks.spawn(crate::cloudwatch::run(
                        config.cloudwatch.clone(),
                        svc.clone(),
                        node.clone(),
                        snapshots.clone(),
                        Arc::clone(&cloudwatch),
                    ));
                }
                services = Some(svc);
                signals.lifecycle = node.lifecycle;
                metrics.update(|v| v.node = Some(node.clone()));
                cloud = Some(Cloud { node, ec2 });
                imds = Some(client);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "instance metadata is unavailable; rules run with local actions only (alert, exec)"
            ),
        }
    }
    let node = cloud.as_ref().map(|c| c.node.clone());
    let executor = Arc::new(Executor::new(&config.actions, audit, cloud.clone(), tasks));
    let signals = Arc::new(signals);
    if let Some(imds) = imds {
        tasks.spawn(crate::watch::poll_cloud(crate::watch::CloudPoller {
            imds,
            ec2: cloud.map(|c| c.ec2),
            signals: Arc::clone(&signals),
            executor: Arc::clone(&executor),
            metrics: Arc::clone(&metrics),
            hook: config.spot.interruption_hook.clone(),
            tag_labels: config.node.tag_labels.clone(),
            hook_timeout: config.spot.hook_timeout,
            every: config.cloud.poll_interval,
            tag_every: config.cloud.tag_poll_interval,
        }));
    }
    if config.cloudwatch.enabled && services.is_none() {
        tracing::warn!("[cloudwatch] enabled is set, but gpuwatch is not on EC2 with provider = \"aws\": nothing is published");
    }
    for b in &config.budgets {
        if services.is_none() && matches!(b.source, crate::config::BudgetSource::AwsBudgets { .. })
        {
            tracing::warn!(budget = %b.name, "an aws_budgets budget needs provider = \"aws\" on EC2; it stays unknown");
        }
    }
    let watch = Watch {
        tracker: crate::spend::Tracker::new(config.clone(), node, readings),
        services,
        publishes: JoinSet::new(),
        pods,
        progress,
        unpublished: Default::default(),
        config: config.clone(),
        state_dir,
        executor,
        metrics,
        cost,
        signals,
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
    Ok(Some(WatchTask { handle, abort }))
}

/// The running cost watch: awaited at shutdown, and cancelled if it does not stop in time.
struct WatchTask {
    handle: tokio::task::JoinHandle<()>,
    abort: tokio::task::AbortHandle,
}

/// An address a browser can open: the wildcard address is shown as localhost.
pub fn display_addr(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("localhost:{}", addr.port())
    } else {
        addr.to_string()
    }
}

/// Completes at SIGINT or SIGTERM: what `gpuwatch run` stops on.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
