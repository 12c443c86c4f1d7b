//! The HTTP layer: the listener (`listener`: limits, timeouts, TLS handshakes), the routes
//! here (every handler reads the latest snapshot; none calls NVML), TLS (`tls`) and basic auth
//! (`auth`) as the web config sets them, and the server's own counters (`metrics`).

pub mod auth;
pub mod listener;
pub mod metrics;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use serde::Deserialize;

use crate::gpu::sampler::Snapshots;

/// The daemon's HTTP server, built once everything it serves has started.
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
    limits: listener::Limits,
    stats: Arc<listener::Stats>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Server {
    /// Serves `state` on `listener` (bound first, so that a daemon that cannot serve never
    /// starts deciding), with the web config's basic auth and `tls`, under `[server]`'s limits.
    /// Registers the server's own counters before the registry is shared.
    pub fn new(
        listener: tokio::net::TcpListener,
        config: &crate::config::Config,
        tls: Option<Arc<rustls::ServerConfig>>,
        mut registry: Registry,
        state: impl FnOnce(Arc<Registry>) -> ServerState,
    ) -> Server {
        let stats = Arc::new(listener::Stats::default());
        registry.register_collector(Box::new(metrics::HttpCollector(Arc::clone(&stats))));
        let mut router = router(state(Arc::new(registry)));
        if let Some(w) = &config.server.web {
            router = router.layer(axum::middleware::from_fn_with_state(
                auth::Guard::new(w),
                auth::layer,
            ));
        }
        Server {
            listener,
            router,
            limits: listener::Limits {
                max_connections: config.server.max_connections,
                header_read_timeout: config.server.header_read_timeout,
                ..listener::Limits::default()
            },
            stats,
            tls: tls.map(tokio_rustls::TlsAcceptor::from),
        }
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// How long connections get to finish at shutdown.
    pub fn shutdown_grace(&self) -> Duration {
        self.limits.shutdown_grace
    }

    /// Serves until `shutdown` completes, then drains the connections.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let Server {
            listener,
            router,
            limits,
            stats,
            tls,
        } = self;
        listener::serve(listener, router, limits, stats, tls, shutdown).await;
    }
}

/// An address a browser can open: the wildcard address is shown as localhost.
pub fn display_addr(addr: std::net::SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("localhost:{}", addr.port())
    } else {
        addr.to_string()
    }
}

/// The longest `/api/v1/snapshot?after=` waits for a new sample.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct ServerState {
    pub registry: Arc<Registry>,
    pub snapshots: Snapshots,
    /// Permits for long-polls in progress; when none is left, a long-poll gets 503.
    pub long_polls: Arc<tokio::sync::Semaphore>,
    /// What the status page and `/api/v1/status` show.
    pub status: crate::status::Sources,
    /// Whether the sampler and the decision loop make progress, for `/-/healthy`.
    pub liveness: Arc<crate::watch::progress::Liveness>,
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/", get(landing))
        .route("/metrics", get(metrics))
        .route("/-/healthy", get(healthy))
        .route("/-/ready", get(ready))
        .route("/api/v1/snapshot", get(snapshot))
        .route("/api/v1/status", get(status))
        .route("/api/v1/health", get(health))
        .route("/api/v1/status/live", get(live))
        .route("/static/status.js", get(script))
        .route("/static/status.css", get(style))
        .with_state(state)
}

async fn metrics(State(state): State<ServerState>) -> Response {
    let body = crate::metrics::encode(&state.registry);
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
}

/// Liveness: 200 while the sampler and the decision loop make progress, 503 once either has
/// stalled for `server.stall_timeout`. A sick GPU, or NVML down, never fails it: restarting
/// would not help.
async fn healthy(State(state): State<ServerState>) -> Response {
    match state.liveness.stalled() {
        None => (StatusCode::OK, "OK\n").into_response(),
        Some(what) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stalled: {what} within server.stall_timeout\n"),
        )
            .into_response(),
    }
}

async fn ready(State(state): State<ServerState>) -> Response {
    if state.snapshots.latest().is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first sample\n",
        )
            .into_response()
    }
}

#[derive(Debug, Deserialize)]
struct WaitQuery {
    /// Wait for a sample newer than this sequence number.
    after: Option<u64>,
    /// How long to wait, as a duration such as "5s" (default 10s, at most 30s).
    timeout: Option<String>,
}

/// The latest snapshot, or with `?after=SEQ` the first newer one (long-poll): how a client
/// awaits the next sample without sleeping. An error is the response to send.
async fn await_sample(
    state: &ServerState,
    q: &WaitQuery,
) -> Result<Arc<crate::gpu::Snapshot>, Response> {
    let next = state.snapshots.latest().seq.saturating_add(1);
    match q.after {
        None => Ok(state.snapshots.latest()),
        Some(after) if after > next => Err((
            StatusCode::BAD_REQUEST,
            format!(
                "after: {after} is beyond the next sample ({next}); use the seq of a snapshot you have\n"
            ),
        )
            .into_response()),
        Some(after) => {
            let Ok(_permit) = state.long_polls.try_acquire() else {
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "1")],
                    "too many long-polls in progress; retry shortly\n",
                )
                    .into_response());
            };
            let wait = match q.timeout.as_deref().map(crate::time::parse_duration) {
                None => Duration::from_secs(10),
                Some(Some(d)) => d.min(MAX_WAIT),
                Some(None) => {
                    return Err((
                        StatusCode::BAD_REQUEST,
                        "timeout: not a duration, such as \"5s\"\n",
                    )
                        .into_response())
                }
            };
            Ok(
                match tokio::time::timeout(wait, state.snapshots.next_after(after)).await {
                    Ok(s) => s,
                    Err(_) => state.snapshots.latest(),
                },
            )
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Each GPU's health and problems, with what fixes them; `?after=SEQ` long-polls, as for the
/// snapshot. A sick GPU is an answer here, never a failure of the daemon's own health.
async fn health(State(state): State<ServerState>, Query(q): Query<WaitQuery>) -> Response {
    match await_sample(&state, &q).await {
        Ok(snap) => json(&crate::status::HealthReport::new(&snap)),
        Err(r) => r,
    }
}

/// The latest snapshot as JSON; `?after=SEQ` long-polls for a newer one.
async fn snapshot(State(state): State<ServerState>, Query(q): Query<WaitQuery>) -> Response {
    match await_sample(&state, &q).await {
        Ok(snap) => json(&*snap),
        Err(r) => r,
    }
}

/// The node's status (what the page at `/` shows) as JSON; `?after=SEQ` long-polls for the
/// status of a newer sample.
async fn status(State(state): State<ServerState>, Query(q): Query<WaitQuery>) -> Response {
    match await_status(&state, &q).await {
        Ok(s) => json(&s),
        Err(r) => r,
    }
}

/// What the status page's script swaps in: the live part of the page, rendered as the first
/// paint is, with the sample it shows and the page's title. Long-polls as `/api/v1/status`.
async fn live(State(state): State<ServerState>, Query(q): Query<WaitQuery>) -> Response {
    #[derive(serde::Serialize)]
    struct Live {
        seq: u64,
        now: f64,
        title: String,
        html: String,
    }
    match await_status(&state, &q).await {
        Ok(s) => json(&Live {
            seq: s.seq,
            now: s.now,
            title: crate::status::page::title(&s),
            html: crate::status::page::fragment(&s, s.now),
        }),
        Err(r) => r,
    }
}

/// The status of the latest sample, or with `?after=SEQ` of the first newer one, once the
/// decision loop has stepped on it. An error is the response to send.
async fn await_status(
    state: &ServerState,
    q: &WaitQuery,
) -> Result<crate::status::Status, Response> {
    let snap = await_sample(state, q).await?;
    // The rules, holds and spend of this sample come a moment after it, from the decision loop.
    // That wait is a long-poll's, under a permit: while an action runs the loop does not step,
    // and waits outside the cap could hold every connection. Without a permit free, the status
    // is answered as it stands.
    if let (Some(p), Ok(_permit)) = (&state.status.progress, state.long_polls.try_acquire()) {
        p.await_stepped(snap.seq, Duration::from_secs(2)).await;
    }
    gather(state).await.ok_or_else(not_gathered)
}

/// Turns to gather the status, each on a blocking thread. A hung state disk keeps its thread (a
/// read cannot be called off), so the threads are capped: a request waits for a turn, within
/// `GATHER_LIMIT` in all, and is refused after it.
static GATHERS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_GATHERS);
const MAX_GATHERS: usize = 4;
/// How long a request waits for its turn and its gather.
const GATHER_LIMIT: Duration = Duration::from_secs(10);

/// The status, gathered off the async workers (it reads the audit log's tail); `None` when it
/// cannot be within `GATHER_LIMIT`.
async fn gather(state: &ServerState) -> Option<crate::status::Status> {
    let sources = state.status.clone();
    on_a_turn(GATHER_LIMIT, move || sources.gather()).await
}

/// Runs `work` on a blocking thread once one of `GATHERS`' turns is free, within `limit` in
/// all (the wait for a turn included); `None` after it. The turn goes with the thread, and
/// comes back only when `work` ends, however long after `limit` that is.
async fn on_a_turn<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    tokio::time::timeout(limit, async move {
        let turn = GATHERS.acquire().await.ok()?;
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            work()
        })
        .await
        .ok()
    })
    .await
    .ok()?
}

/// The answer when the status cannot be gathered now.
fn not_gathered() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        "the status cannot be gathered now (is the state directory's disk slow?); retry shortly\n",
    )
        .into_response()
}

/// The status page: rendered here, kept current by its script.
async fn landing(State(state): State<ServerState>) -> Response {
    let Some(s) = gather(&state).await else {
        return not_gathered();
    };
    let page = crate::status::page::render(&s, crate::time::now());
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, crate::status::page::CSP),
            (header::CACHE_CONTROL, "no-store"),
        ],
        page,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        crate::status::page::SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        crate::status::page::STYLE,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gathers hung on a disk keep their turns past the limit; the next gather is refused at
    /// its limit, not queued for ever; once the hung ones end, their turns come back.
    #[tokio::test]
    async fn hung_gathers_keep_their_turns_and_the_next_is_refused_in_time() {
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = std::sync::Arc::new(std::sync::Mutex::new(hung));
        let mut running = tokio::task::JoinSet::new();
        for _ in 0..MAX_GATHERS {
            let hung = std::sync::Arc::clone(&hung);
            running.spawn(on_a_turn(Duration::from_secs(60), move || {
                let _ = hung.lock().unwrap().recv();
                "hung"
            }));
        }
        // Every turn is taken by a hung gather.
        while GATHERS.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let started = std::time::Instant::now();
        let limit = Duration::from_millis(300);
        assert_eq!(on_a_turn(limit, || "late").await, None);
        assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
        for _ in 0..MAX_GATHERS {
            release.send(()).unwrap();
        }
        while let Some(done) = running.join_next().await {
            assert_eq!(done.unwrap(), Some("hung"));
        }
        assert_eq!(on_a_turn(limit, || "next").await, Some("next"));
        assert_eq!(GATHERS.available_permits(), MAX_GATHERS);
    }
}
