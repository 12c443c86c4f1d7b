//! Wiring: starts each subsystem from a validated config, in order (sampling, the kubelet's
//! pod view, the device families, the listener, the cost watch, the status sources, the HTTP
//! server), and runs them until shutdown. Every subsystem's `spawn` registers its own
//! collectors and adds its tasks to the one `JoinSet` here. `anyhow` is used here only.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use crate::config::Config;
use crate::http::{display_addr, Server, ServerState};
use crate::watch::progress::{Liveness, Watched};
use crate::watch::WatchTask;

/// The daemon, built and listening: every task it started is owned here, and `run` stops and
/// drains all of them.
pub struct App {
    server: Server,
    /// Tells the cost watch to stop deciding.
    stop: tokio::sync::watch::Sender<bool>,
    /// The cost watch, stopped first at shutdown.
    watch: Option<WatchTask>,
    /// Every other task: the sampler's driver, pollers, notification delivery, CloudWatch.
    tasks: JoinSet<()>,
    /// What systemd's readiness, status and watchdog report on.
    watched: Watched,
    liveness: Arc<Liveness>,
    stall_timeout: std::time::Duration,
    interval: std::time::Duration,
    timeout: std::time::Duration,
}

impl App {
    /// Starts the sampler and the cost watch, builds the registry and binds the listener.
    /// `tls` is the web config's TLS, loaded by the caller (`http::tls::load`).
    pub async fn build(
        config: Config,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> anyhow::Result<App> {
        let mut tasks = JoinSet::new();
        let mut registry = Registry::default();
        let (snapshots, health_seed) =
            crate::gpu::sampler::start(&config, &mut registry, &mut tasks)
                .context("cannot start the sampler thread")?;
        let pods = crate::kubernetes::spawn(&config, &mut tasks);
        let holders = crate::slurm::holders::spawn(&config, &snapshots, &mut tasks);
        crate::exposition::register(
            &config,
            &snapshots,
            (pods.as_ref(), holders.as_ref()),
            &mut registry,
        );
        crate::kubernetes::register(pods.as_ref(), &snapshots, &mut registry);
        crate::slurm::register(holders.as_ref(), &config, &mut registry);
        // Bound first: a daemon that cannot serve never starts deciding.
        let listener = tokio::net::TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.server.listen))?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let watch = crate::watch::spawn(
            &config,
            snapshots.clone(),
            crate::watch::HeldBy { pods, holders },
            health_seed,
            &mut registry,
            stop_rx,
            &mut tasks,
        )
        .await
        .context("refusing to run on an unsafe state directory")?;
        let status = crate::status::Sources::new(&config, snapshots.clone(), &watch);
        let liveness = Arc::new(Liveness::default());
        let views = Arc::clone(&watch.view);
        let watched = Watched {
            snapshots: snapshots.clone(),
            progress: watch.task.as_ref().map(|_| Arc::clone(&watch.progress)),
            pending: Box::new(move || {
                let view = views.view();
                view.rules.iter().filter(|r| r.pending.is_some()).count()
            }),
        };
        let server = Server::new(listener, &config, tls, registry, |registry| ServerState {
            registry,
            snapshots,
            long_polls: Arc::new(tokio::sync::Semaphore::new(config.server.max_long_polls)),
            status,
            liveness: Arc::clone(&liveness),
        });
        tracing::info!(
            interval = ?config.sampling.interval,
            library = %config.nvml.library.display(),
            basic_auth = config.server.web.as_ref().is_some_and(|w| !w.users.is_empty()),
            "listening on {}://{}/",
            server.scheme(),
            display_addr(server.local_addr()?)
        );
        Ok(App {
            server,
            stop,
            watch: watch.task,
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
            server,
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
        if let Ok(addr) = server.local_addr() {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "listening on {}://{}/",
                server.scheme(),
                display_addr(addr)
            );
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
        let grace = server.shutdown_grace();
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
        server.serve(shutdown).await;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        tracing::info!("stopped");
        Ok(())
    }
}

/// How long shutdown waits for the state directory to finish the saves in flight: well within
/// the unit's `TimeoutStopSec`, after the watch's grace.
const IO_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);
