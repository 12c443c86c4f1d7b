//! An HTTP receiver for webhooks (and SNS-shaped posts): it records every POST body, by path.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use super::aws::rt;

/// An HTTP receiver that records every POST body, by path.
pub struct Receiver {
    pub addr: SocketAddr,
    got: Arc<Mutex<Vec<(String, String)>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        use axum::extract::State;
        type S = Arc<Mutex<Vec<(String, String)>>>;
        async fn record(State(s): State<S>, uri: axum::http::Uri, body: String) -> &'static str {
            s.lock().unwrap().push((uri.path().to_string(), body));
            "ok"
        }
        let got: S = Arc::default();
        let app = axum::Router::new()
            .fallback(axum::routing::post(record))
            .with_state(Arc::clone(&got));
        Receiver {
            addr: serve(app),
            got,
        }
    }

    pub fn bodies(&self, path: &str) -> Vec<String> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

/// Serves `app` on a free loopback port, on the tests' runtime, for as long as the test runs.
pub fn serve(app: axum::Router) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    rt().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let _ = axum::serve(listener, app).await;
    });
    addr
}
