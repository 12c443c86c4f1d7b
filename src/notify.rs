//! Notifications (the webhook, and `wall` to logged-in terminals) leave the decision loop at
//! once: they go into a bounded queue that one task drains. A webhook that hangs delays other
//! notifications, never a decision; when the queue is full the newest message is dropped and
//! counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

/// Messages waiting at most; beyond it, new ones are dropped.
const QUEUE: usize = 64;

struct Message {
    text: String,
    to_terminals: bool,
}

pub struct Notifier {
    tx: Option<mpsc::Sender<Message>>,
    /// Messages dropped from a full queue.
    pub dropped: AtomicU64,
}

impl Notifier {
    /// Starts the delivery task on the current runtime, when there is anything to deliver to.
    pub fn start(
        webhook_url: Option<String>,
        wall: bool,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Notifier {
        let tx = (webhook_url.is_some() || wall).then(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tasks.spawn(deliver(rx, webhook_url, wall));
            tx
        });
        Notifier {
            tx,
            dropped: AtomicU64::new(0),
        }
    }

    /// Queues a message for the webhook and, with `to_terminals`, for `wall`. Never waits.
    pub fn send(&self, text: &str, to_terminals: bool) {
        let Some(tx) = &self.tx else {
            return;
        };
        let message = Message {
            text: text.to_string(),
            to_terminals,
        };
        if tx.try_send(message).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("the notification queue is full; a message was dropped (it is in the log and the audit log)");
        }
    }
}

async fn deliver(mut rx: mpsc::Receiver<Message>, webhook_url: Option<String>, wall: bool) {
    let http = crate::client::http_client()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    while let Some(m) = rx.recv().await {
        if let Some(url) = &webhook_url {
            post(&http, url, &m.text).await;
        }
        if m.to_terminals && wall {
            write_wall(&m.text).await;
        }
    }
}

async fn post(http: &reqwest::Client, url: &str, text: &str) {
    let body = json!({ "text": text, "source": "gpuwatch" });
    match http.post(url).json(&body).send().await {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => tracing::warn!(
            status = r.status().as_u16(),
            "the webhook refused a message"
        ),
        // The URL is a secret: neither it nor any URL in the error chain is logged.
        Err(e) => tracing::warn!(
            endpoint = %crate::redact::urls(url),
            error = %crate::redact::urls(&error_chain(&e.without_url())),
            "cannot reach the webhook"
        ),
    }
}

/// An error and its sources, as one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

async fn write_wall(text: &str) {
    use tokio::io::AsyncWriteExt;
    let mut wall = tokio::process::Command::new("wall");
    let child = wall
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let Ok(mut child) = child else {
        tracing::debug!("no wall command; terminals are not told");
        return;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(text.as_bytes()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
}
