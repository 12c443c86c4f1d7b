//! The HTTP listener: accepts connections and serves the router over HTTP/1.1, with limits that
//! keep any client from starving the daemon.
//!
//! - A connection must send a whole request head within `header_read_timeout`. The same timer
//!   runs while a keep-alive connection waits for its next request, so an idle connection is
//!   closed after it too.
//! - At most `max_connections` are open. When one more arrives, the connection that has been
//!   idle (no request in progress) the longest is closed to make room; when none is idle, the
//!   newcomer is closed at once. An attacker's idle connections thus never lock out a scrape.
//! - A connection lives at most `max_connection_age`; then it is asked to close after its
//!   current request, and closed outright a grace period later. This bounds slow readers.
//! - With TLS, the handshake must finish within `header_read_timeout` too.
//! - On shutdown the listener stops accepting, every connection is asked to finish, and those
//!   still open after `shutdown_grace` are closed.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

/// The listener's limits; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub max_connection_age: Duration,
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(3),
        }
    }
}

/// Counts for `gpuwatch_http_*`.
#[derive(Debug, Default)]
pub struct Stats {
    pub open: AtomicUsize,
    pub accepted: AtomicU64,
    /// Closed to make room for a newer connection.
    pub evicted: AtomicU64,
    /// Closed at once: every slot was busy.
    pub refused: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub tls_failures: AtomicU64,
}

/// One open connection, as the slot table sees it.
struct Slot {
    id: u64,
    /// Requests in progress on it.
    busy: Arc<AtomicUsize>,
    /// When it last became idle.
    idle_since: Arc<Mutex<Instant>>,
    close: Arc<Notify>,
}

#[derive(Default)]
struct Slots {
    next_id: u64,
    open: Vec<Slot>,
}

impl Slots {
    /// Makes room for one more connection: `true` when there is room (perhaps after asking
    /// the longest-idle connection to close), `false` when every connection is busy.
    fn make_room(&mut self, max: usize, stats: &Stats) -> bool {
        if self.open.len() < max {
            return true;
        }
        let idle = self
            .open
            .iter()
            .filter(|s| s.busy.load(Ordering::Acquire) == 0)
            .min_by_key(|s| *s.idle_since.lock().unwrap_or_else(|e| e.into_inner()));
        match idle {
            Some(s) => {
                let id = s.id;
                s.close.notify_one();
                self.open.retain(|s| s.id != id);
                stats.evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// A request's handle on its connection's activity, in the request's extensions: a handler
/// that parks a request (the auth layer's delay before refusing a stranger) marks the
/// connection idle meanwhile, so that the listener may evict it to make room.
#[derive(Clone)]
pub struct Activity {
    busy: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<Instant>>,
}

impl Activity {
    /// Counts the connection as idle until the guard is dropped.
    pub fn idle(&self) -> IdleGuard {
        if let Ok(mut t) = self.idle_since.lock() {
            *t = Instant::now();
        }
        self.busy.fetch_sub(1, Ordering::AcqRel);
        IdleGuard {
            busy: Arc::clone(&self.busy),
        }
    }
}

/// See [`Activity::idle`].
pub struct IdleGuard {
    busy: Arc<AtomicUsize>,
}

impl Drop for IdleGuard {
    fn drop(&mut self) {
        self.busy.fetch_add(1, Ordering::AcqRel);
    }
}

/// Marks a request in progress on its connection for as long as it lives.
struct Busy {
    busy: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<Instant>>,
}

impl Busy {
    fn new(busy: &Arc<AtomicUsize>, idle_since: &Arc<Mutex<Instant>>) -> Busy {
        busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            busy: Arc::clone(busy),
            idle_since: Arc::clone(idle_since),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Ok(mut t) = self.idle_since.lock() {
            *t = Instant::now();
        }
        self.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then drains as the module docs say.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stats: Arc<Stats>,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Mutex::new(Slots::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            // Reap finished connections as they end, so the set does not grow.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let slot = {
            let mut s = slots.lock().unwrap_or_else(|e| e.into_inner());
            if !s.make_room(limits.max_connections, &stats) {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                drop(stream);
                continue;
            }
            s.next_id += 1;
            let slot = Slot {
                id: s.next_id,
                busy: Arc::new(AtomicUsize::new(0)),
                idle_since: Arc::new(Mutex::new(Instant::now())),
                close: Arc::new(Notify::new()),
            };
            let handles = (
                slot.id,
                Arc::clone(&slot.busy),
                Arc::clone(&slot.idle_since),
                Arc::clone(&slot.close),
            );
            s.open.push(slot);
            handles
        };
        let _ = stream.set_nodelay(true);
        stats.open.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(connection(
            stream,
            peer,
            app.clone(),
            limits,
            tls.clone(),
            slot,
            stop_rx.clone(),
            Arc::clone(&slots),
            Arc::clone(&stats),
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            open = tasks.len(),
            "closing the connections still open after the shutdown grace"
        );
        tasks.abort_all();
    }
}

type SlotHandles = (u64, Arc<AtomicUsize>, Arc<Mutex<Instant>>, Arc<Notify>);

/// Frees a connection's slot when its task ends, however it ends.
struct SlotGuard {
    id: u64,
    slots: Arc<Mutex<Slots>>,
    stats: Arc<Stats>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open
            .retain(|s| s.id != self.id);
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    app: Router,
    limits: Limits,
    tls: Option<TlsAcceptor>,
    (id, busy, idle_since, close): SlotHandles,
    stop: watch::Receiver<bool>,
    slots: Arc<Mutex<Slots>>,
    stats: Arc<Stats>,
) {
    let _slot = SlotGuard {
        id,
        slots,
        stats: Arc::clone(&stats),
    };
    let Some(acceptor) = tls else {
        return drive(
            TokioIo::new(stream),
            peer,
            app,
            limits,
            busy,
            idle_since,
            close,
            stop,
        )
        .await;
    };
    // The handshake counts as reading the request head: the same timeout bounds it, and an
    // evicted connection stops handshaking at once.
    let handshake = tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream));
    let result = tokio::select! {
        r = handshake => r,
        _ = close.notified() => return,
    };
    match result {
        Ok(Ok(tls)) => {
            drive(
                TokioIo::new(tls),
                peer,
                app,
                limits,
                busy,
                idle_since,
                close,
                stop,
            )
            .await
        }
        Ok(Err(e)) => {
            stats.tls_failures.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, "TLS handshake failed");
        }
        Err(_) => {
            stats.tls_failures.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("TLS handshake timed out");
        }
    }
}

/// Serves HTTP/1.1 on one connection until it ends, is evicted, ages out or the server stops.
#[allow(clippy::too_many_arguments)]
async fn drive<I>(
    io: TokioIo<I>,
    peer: std::net::SocketAddr,
    app: Router,
    limits: Limits,
    busy: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<Instant>>,
    close: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let guard = Busy::new(&busy, &idle_since);
        let mut req = req.map(axum::body::Body::new);
        // The client's address, for the rate limit of its own, and the connection's activity.
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        req.extensions_mut().insert(Activity {
            busy: Arc::clone(&busy),
            idle_since: Arc::clone(&idle_since),
        });
        let call = app.clone().oneshot(req);
        async move {
            let response = call.await;
            drop(guard);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(64 * 1024)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    let mut conn = pin!(conn);
    let age = tokio::time::sleep(limits.max_connection_age);
    let mut age = pin!(age);
    let mut finishing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection closed with an error");
                }
                break;
            }
            // Evicted to make room: close at once.
            _ = close.notified() => break,
            _ = &mut age => {
                if finishing {
                    break;
                }
                conn.as_mut().graceful_shutdown();
                finishing = true;
                age.as_mut().reset(tokio::time::Instant::now() + limits.shutdown_grace);
            }
            _ = stop.changed(), if !finishing => {
                conn.as_mut().graceful_shutdown();
                finishing = true;
                age.as_mut().reset(tokio::time::Instant::now() + limits.shutdown_grace);
            }
        }
    }
}
