//! A real Prometheus server (Debian's `prometheus`) for the tests: started on a free loopback
//! port, queried through its HTTP API, and killed (by its PID) when dropped.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Prometheus server on a free loopback port that scrapes one target every second; killed
/// (by its PID) when dropped.
pub struct Prometheus {
    pub addr: std::net::SocketAddr,
    _child: super::Killed,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn scraping(target: std::net::SocketAddr) -> Prometheus {
        Prometheus::scraping_with(target, "")
    }

    /// Like `scraping`, with more lines for the scrape job (such as `scheme: https`).
    pub fn scraping_with(target: std::net::SocketAddr, job: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        Prometheus::start(
            dir,
            &format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpuwatch\n{job}    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
    }

    /// Starts Prometheus with this configuration, written to `prometheus.yml` in `dir` (where
    /// the caller may have put rule or target files).
    pub fn start(dir: tempfile::TempDir, config_text: &str) -> Prometheus {
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_text).unwrap();
        let port = super::free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus not found: scripts/test installs Debian's prometheus");
        Prometheus {
            addr: listen.parse().unwrap(),
            _child: super::Killed(child),
            _dir: dir,
        }
    }

    /// Polls the label-values API until some series of `metric` has `label`, and returns the
    /// values.
    pub fn await_label_values(&self, metric: &str, label: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(90);
        let path = format!("/api/v1/label/{label}/values?match[]={}", encode(metric));
        loop {
            if let Ok(r) = super::try_get(self.addr, &path) {
                if r.status == 200 {
                    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                    let values: Vec<String> = v["data"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect();
                    if !values.is_empty() {
                        return values;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never had a value of {label} on {metric}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Polls the query API (Prometheus answers only once it has started and scraped) until the
    /// result satisfies `done`.
    pub fn await_query(
        &self,
        query: &str,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(90);
        let path = format!("/api/v1/query?query={}", encode(query));
        loop {
            if let Ok(r) = super::try_get(self.addr, &path) {
                if r.status == 200 {
                    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                    let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
                    if done(&result) {
                        return result;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never answered {query} as wanted"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last scrape of gpuwatch succeeded: a bad line would have failed all of it.
    pub fn assert_up(&self) {
        let up = self.await_query("up{job=\"gpuwatch\"}", |r| !r.is_empty());
        assert_eq!(up[0]["value"][1], "1", "{up:?}");
    }
}

/// Percent-encodes a query for a URL.
pub fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
