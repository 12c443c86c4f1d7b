//! The cluster controller (`gpuwatch controller`): it reads the node daemons' reclaim verdicts
//! from the fleet's Prometheus, follows each idle pod to the workload that owns it, and gives
//! the workload back (scale to 0, suspend, stop) once every GPU pod of it is idle, after a
//! warning and a re-check, unless it is held, opted out or excluded. One leader acts (a Lease).
//! Nothing unknown acts: a failed read of Prometheus or of the cluster skips the round.

pub mod cluster;
pub mod decide;
pub mod events;
mod lease;
pub mod metrics;
mod round;
pub mod verdicts;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::{reflector, watcher, WatchStreamExt as _};
use kube::{Api, Client};

use self::cluster::{Cluster, Key};
use self::decide::Warned;
use crate::config::controller::ControllerConfig;
use crate::config::Config;

/// The controller's name, as its Events report it.
pub const NAME: &str = "gpuwatch-controller";

/// The longest one API call (not a watch) may take: a hung call never stalls a round.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Connects to the cluster: the kubeconfig the config names, else `KUBECONFIG` or
/// `~/.kube/config`, else the pod's service account. Returns a client for calls (each bounded
/// by `CALL_TIMEOUT`), one for watches (which the server ends), and the controller's namespace
/// (`POD_NAMESPACE`, else the kubeconfig context's).
pub async fn connect(c: &ControllerConfig) -> anyhow::Result<(Client, Client, String)> {
    let config = match &c.kubeconfig {
        Some(path) => {
            let k = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(k, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and no service account to reach the cluster with")?,
    };
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| config.default_namespace.clone());
    let watches =
        Client::try_from(config.clone()).context("cannot set up the Kubernetes client")?;
    let mut bounded = config;
    bounded.read_timeout = Some(CALL_TIMEOUT);
    let calls = Client::try_from(bounded).context("cannot set up the Kubernetes client")?;
    Ok((calls, watches, namespace))
}

/// Who this controller is, for the Lease: `POD_NAME` (the downward API), else the hostname
/// and the process id (two controllers on one host are two).
pub fn identity() -> String {
    if let Some(pod) = std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()) {
        return pod;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() { "gpuwatch" } else { &host };
    format!("{host}-{}", std::process::id())
}

/// The controller's state between rounds.
pub struct Controller {
    pub config: ControllerConfig,
    pub identity: String,
    pub cluster: Cluster,
    pub pods: reflector::Store<Pod>,
    pub elector: Arc<lease::Elector>,
    pub recorder: events::Recorders,
    pub http: reqwest::Client,
    pub stats: Arc<metrics::Shared>,
    /// Workloads warned, and what they were when warned.
    pub warned: BTreeMap<Key, Warned>,
    /// Dry-run: what was said it would do, for each workload as it was then (generation,
    /// replicas), so that it is said once.
    pub rehearsed: BTreeMap<Key, (i64, i64)>,
    /// The CronJob that made each Job, as the last round found them.
    pub cronjobs: BTreeMap<Key, String>,
    /// Idle pods of owners the controller never touches, already reported.
    pub reported: BTreeSet<String>,
    /// The last failure said, so that a failure is logged once until it changes.
    pub last_failure: Option<String>,
    /// When this round's verdicts were read.
    pub verdicts_read: std::time::Instant,
    /// The pods' watch has not failed since it last listed them all.
    pub pods_healthy: Arc<AtomicBool>,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let c = config
        .controller
        .clone()
        .context("the config has no [controller] section")?;
    let (client, watches, namespace) = connect(&c).await?;
    let identity = identity();
    let stats = Arc::new(metrics::Shared::default());
    let mut tasks = tokio::task::JoinSet::new();
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    let addr = listener.local_addr()?;
    let (pods, ready, pods_healthy) = watch_pods(&watches, &stats, &mut tasks);
    serve(listener, &config, &stats, ready, &mut tasks);
    let elector = Arc::new(lease::Elector::new(
        Api::namespaced(client.clone(), &namespace),
        &c.lease_name,
        &identity,
        c.lease_duration,
    ));
    tasks.spawn(elect(Arc::clone(&elector), Arc::clone(&stats)));
    let http = crate::spend::query::client(&c.prometheus)
        .map_err(|e| anyhow::anyhow!("controller.prometheus_url: {e}"))?;
    let mut exclude = c.exclude_namespaces.clone();
    exclude.push(namespace.clone());
    let recorder = events::Recorders::new(
        client.clone(),
        Reporter {
            controller: NAME.into(),
            instance: Some(identity.clone()),
        },
    );
    tracing::info!(
        mode = c.mode.as_str(),
        namespace = %namespace,
        identity = %identity,
        prometheus = %c.prometheus.url,
        "controller started"
    );
    println!("listening on http://{}/", crate::http::display_addr(addr));
    let mut controller = Controller {
        config: ControllerConfig {
            exclude_namespaces: exclude,
            ..c
        },
        identity,
        cluster: Cluster { client },
        pods,
        elector,
        recorder,
        http,
        stats,
        warned: BTreeMap::new(),
        rehearsed: BTreeMap::new(),
        cronjobs: BTreeMap::new(),
        reported: BTreeSet::new(),
        last_failure: None,
        verdicts_read: std::time::Instant::now(),
        pods_healthy,
    };
    let mut ticker = tokio::time::interval(controller.config.poll_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = ticker.tick() => controller.round().await,
        }
    }
    tracing::info!("controller stopped");
    tasks.abort_all();
    Ok(())
}

/// Watches every pod of the cluster into a cache (`kube`'s reflector: a list, then a watch
/// resumed from its `resourceVersion`, and listed again after `410 Gone`). The flag turns true
/// once the first list is in.
fn watch_pods(
    client: &Client,
    stats: &Arc<metrics::Shared>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> (reflector::Store<Pod>, Arc<AtomicBool>, Arc<AtomicBool>) {
    let (store, writer) = reflector::store();
    let ready = Arc::new(AtomicBool::new(false));
    let healthy = Arc::new(AtomicBool::new(false));
    let api: Api<Pod> = Api::all(client.clone());
    // Pods that are over hold nothing; what the controller never reads is not kept.
    let config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let stream = watcher(api, config)
        .modify(|p| {
            p.metadata.managed_fields = None;
            p.metadata.annotations = None;
        })
        .default_backoff();
    let stream = reflector(writer, stream);
    let (stats, flag, fine) = (Arc::clone(stats), Arc::clone(&ready), Arc::clone(&healthy));
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    flag.store(true, Ordering::Release);
                    fine.store(true, Ordering::Release);
                }
                Ok(_) => {}
                Err(e) => {
                    stats.error("kubernetes");
                    // Until the next whole list, the cache may miss a change.
                    if fine.swap(false, Ordering::AcqRel) {
                        tracing::warn!(error = %e, "cannot watch the cluster's pods; retrying (nothing is given back until they are listed again)");
                    }
                }
            }
        }
    });
    (store, ready, healthy)
}

/// Takes or renews the Lease every third of its duration.
async fn elect(elector: Arc<lease::Elector>, stats: Arc<metrics::Shared>) {
    let mut said: Option<String> = None;
    // A fixed pace from each try's start: a slow answer does not stretch the renewals.
    let mut ticker = tokio::time::interval(elector.every());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match elector.try_lead().await {
            Ok(_) => said = None,
            Err(e) => {
                stats.error("lease");
                let text = cluster::says(&e);
                if said.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "cannot take or renew the controller's Lease; this controller acts only while it holds it");
                    said = Some(text);
                }
            }
        }
        stats.with(|s| s.leader = elector.leads());
    }
}

/// Serves `/metrics`, `/-/healthy` and `/-/ready` (ready once the pods are cached).
fn serve(
    listener: tokio::net::TcpListener,
    config: &Config,
    stats: &Arc<metrics::Shared>,
    ready: Arc<AtomicBool>,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::get;
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(metrics::ControllerCollector(Arc::clone(stats))));
    let registry = Arc::new(registry);
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(move || async move {
                let body = crate::metrics::encode(&registry);
                ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
            }),
        )
        .route("/-/healthy", get(|| async { "OK\n" }))
        .route(
            "/-/ready",
            get(move || async move {
                if ready.load(Ordering::Acquire) {
                    (StatusCode::OK, "ready\n").into_response()
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "listing the pods\n").into_response()
                }
            }),
        );
    let limits = crate::http::listener::Limits {
        max_connections: config.server.max_connections,
        header_read_timeout: config.server.header_read_timeout,
        ..Default::default()
    };
    let stats = Arc::new(crate::http::listener::Stats::default());
    tasks.spawn(crate::http::listener::serve(
        listener,
        router,
        limits,
        stats,
        None,
        std::future::pending(),
    ));
}

impl Controller {
    /// Publishes an Event on `regarding` (at most 1 KiB of note); a failure is counted and
    /// logged. Returns whether it was published.
    pub async fn event(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: String,
    ) -> bool {
        let note = crate::redact::brief(&note, 1000);
        let kind = regarding.kind.as_deref().unwrap_or("");
        let name = regarding.name.as_deref().unwrap_or("");
        let ns = regarding.namespace.as_deref().unwrap_or("");
        if warning {
            tracing::warn!(reason, object = %format!("{ns}/{kind}/{name}"), "{note}");
        } else {
            tracing::info!(reason, object = %format!("{ns}/{kind}/{name}"), "{note}");
        }
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: reason.trim_start_matches("GpuIdle").into(),
            secondary: None,
        };
        match self.recorder.publish(&event, regarding).await {
            Ok(()) => true,
            Err(e) => {
                self.stats.error("events");
                tracing::warn!(error = %cluster::says(&e), reason, "cannot publish an Event");
                false
            }
        }
    }
}
