//! The HTTP endpoints. Every handler reads the latest snapshot; none calls NVML.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use serde::Deserialize;

use crate::gpu::sampler::Snapshots;

/// The longest `/api/v1/snapshot?after=` waits for a new sample.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct ServerState {
    pub registry: Arc<Registry>,
    pub snapshots: Snapshots,
    /// Permits for long-polls in progress; when none is left, a long-poll gets 503.
    pub long_polls: Arc<tokio::sync::Semaphore>,
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/", get(landing))
        .route("/metrics", get(metrics))
        .route("/-/healthy", get(healthy))
        .route("/-/ready", get(ready))
        .route("/api/v1/snapshot", get(snapshot))
        .with_state(state)
}

async fn metrics(State(state): State<ServerState>) -> Response {
    let body = crate::metrics::encode(&state.registry);
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
}

async fn healthy() -> &'static str {
    "OK\n"
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
struct SnapshotQuery {
    /// Wait for a snapshot newer than this sequence number.
    after: Option<u64>,
    /// How long to wait, as a duration such as "5s" (default 10s, at most 60s).
    timeout: Option<String>,
}

/// The latest snapshot as JSON. With `?after=SEQ` it waits (long-poll) for a newer one, which is
/// how a client awaits the next sample without sleeping.
async fn snapshot(State(state): State<ServerState>, Query(q): Query<SnapshotQuery>) -> Response {
    let next = state.snapshots.latest().seq.saturating_add(1);
    let snap = match q.after {
        None => state.snapshots.latest(),
        Some(after) if after > next => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "after: {after} is beyond the next sample ({next}); use the seq of a snapshot you have\n"
                ),
            )
                .into_response()
        }
        Some(after) => {
            let Ok(_permit) = state.long_polls.try_acquire() else {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "1")],
                    "too many long-polls in progress; retry shortly\n",
                )
                    .into_response();
            };
            let wait = match q.timeout.as_deref().map(humantime::parse_duration) {
                None => Duration::from_secs(10),
                Some(Ok(d)) => d.min(MAX_WAIT),
                Some(Err(_)) => {
                    return (
                        StatusCode::BAD_REQUEST,
                        "timeout: not a duration, such as \"5s\"\n",
                    )
                        .into_response()
                }
            };
            match tokio::time::timeout(wait, state.snapshots.next_after(after)).await {
                Ok(s) => s,
                Err(_) => state.snapshots.latest(),
            }
        }
    };
    match serde_json::to_string(&*snap) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn landing(State(state): State<ServerState>) -> Html<String> {
    let snap = state.snapshots.latest();
    let nvml = if snap.nvml.up {
        format!(
            "NVML up, driver {}",
            snap.nvml.driver_version.as_deref().unwrap_or("unknown")
        )
    } else if snap.is_ready() {
        format!(
            "NVML down: {}",
            html_escape(snap.nvml.error.as_deref().unwrap_or("unknown"))
        )
    } else {
        "waiting for the first sample".to_string()
    };
    let up = snap.gpus.iter().filter(|g| g.up).count();
    Html(format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>gpuwatch</title></head>\n\
         <body><h1>gpuwatch {}</h1>\n<p>{nvml}; {up} of {} GPUs up.</p>\n<ul>\n\
         <li><a href=\"/metrics\">/metrics</a>: Prometheus metrics</li>\n\
         <li><a href=\"/api/v1/snapshot\">/api/v1/snapshot</a>: the latest sample as JSON</li>\n\
         <li><a href=\"/-/healthy\">/-/healthy</a>, <a href=\"/-/ready\">/-/ready</a></li>\n\
         </ul></body></html>\n",
        env!("CARGO_PKG_VERSION"),
        snap.gpus.len()
    ))
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
