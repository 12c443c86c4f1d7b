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
    args: Vec<String>,
}

/// Runs `prometheus` over `dir` (its `prometheus.yml`, and its data in `data/`).
fn spawn(
    dir: &std::path::Path,
    listen: std::net::SocketAddr,
    args: &[String],
) -> std::process::Child {
    Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus not found: scripts/test installs Debian's prometheus")
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
        Prometheus::start_with_args(dir, config_text, &[])
    }

    /// Like `start`, with more command-line arguments (such as `--web.config.file=...`).
    pub fn start_with_args(
        dir: tempfile::TempDir,
        config_text: &str,
        args: &[String],
    ) -> Prometheus {
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_text).unwrap();
        let (child, listen) = super::start_server(
            "Prometheus",
            Duration::from_secs(60),
            |addr| spawn(dir.path(), addr, args),
            |addr| {
                // Ready; or, over TLS, a Go server saying so to a plain HTTP request.
                super::try_get(addr, "/-/ready").is_ok_and(|r| {
                    r.body.contains("Prometheus")
                        || r.body.contains("HTTP request to an HTTPS server")
                })
            },
        );
        Prometheus {
            addr: listen,
            _child: super::Killed(child),
            _dir: dir,
            args: args.to_vec(),
        }
    }

    /// Stops the server (SIGKILL, by its PID), keeping its data.
    pub fn stop(&mut self) {
        let _ = self._child.0.kill();
        let _ = self._child.0.wait();
    }

    /// Starts the server again on the same address, over the same data, and waits until it
    /// answers queries.
    pub fn restart(&mut self) {
        self.stop();
        self._child = super::Killed(spawn(self._dir.path(), self.addr, &self.args));
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.try_query("vector(1)", None).is_err() {
            assert!(Instant::now() < deadline, "Prometheus did not come back");
            std::thread::sleep(Duration::from_millis(200));
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

    /// One query, instant (now) or over `range` (start and end, Unix seconds) by 1 s steps, as
    /// Grafana runs a panel's: the result, or why Prometheus refused it (a query that does not
    /// parse, say). Err also while Prometheus is not answering yet.
    pub fn try_query(
        &self,
        query: &str,
        range: Option<(f64, f64)>,
    ) -> Result<Vec<serde_json::Value>, QueryError> {
        let path = match range {
            None => format!("/api/v1/query?query={}", encode(query)),
            Some((start, end)) => format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
                encode(query)
            ),
        };
        self.api(&path)
            .map(|v| v["result"].as_array().cloned().unwrap_or_default())
    }

    /// The values of `label` on the series that `selector` matches, as Grafana's
    /// `label_values(SELECTOR, LABEL)` asks for them.
    pub fn try_label_values(&self, selector: &str, label: &str) -> Result<Vec<String>, QueryError> {
        let path = format!("/api/v1/label/{label}/values?match[]={}", encode(selector));
        self.api(&path).map(|v| {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
    }

    /// A GET of the HTTP API: its `data`, or its error.
    fn api(&self, path: &str) -> Result<serde_json::Value, QueryError> {
        let r = super::try_get(self.addr, path).map_err(|e| QueryError::NotYet(e.to_string()))?;
        // Answers past a few KiB come chunked.
        let body = if r.headers.contains("transfer-encoding: chunked") {
            dechunk(&r.body)
        } else {
            r.body.clone()
        };
        let v: serde_json::Value = match serde_json::from_str(&body) {
            Ok(v) => v,
            Err(_) => return Err(QueryError::NotYet(format!("{} {body}", r.status))),
        };
        match (r.status, v["status"].as_str()) {
            (200, Some("success")) => Ok(v["data"].clone()),
            (400 | 422, _) => Err(QueryError::Refused(format!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or(""),
                v["error"].as_str().unwrap_or(&r.body)
            ))),
            _ => Err(QueryError::NotYet(format!("{} {}", r.status, r.body))),
        }
    }

    /// The last scrape of gpuwatch succeeded: a bad line would have failed all of it.
    pub fn assert_up(&self) {
        let up = self.await_query("up{job=\"gpuwatch\"}", |r| !r.is_empty());
        assert_eq!(up[0]["value"][1], "1", "{up:?}");
    }
}

/// Why a query returned nothing.
#[derive(Debug, Clone)]
pub enum QueryError {
    /// Prometheus refused the query (it does not parse, or cannot be run): waiting won't help.
    Refused(String),
    /// Prometheus did not answer, or not yet with a result.
    NotYet(String),
}

/// The body of a chunked HTTP/1.1 answer: hexadecimal sizes, each chunk ended by CRLF.
fn dechunk(raw: &str) -> String {
    let raw = raw.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(eol) = raw[at..].windows(2).position(|w| w == b"\r\n") {
        let line = String::from_utf8_lossy(&raw[at..at + eol]);
        let n = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        let start = at + eol + 2;
        if n == 0 || raw.len() < start + n {
            break;
        }
        out.extend_from_slice(&raw[start..start + n]);
        at = start + n + 2;
        if at > raw.len() {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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

/// Whether a test of team budgets would cross a month boundary: a Prometheus budget's
/// answers are "settling" (unknown) for 300 s after its period (a month, by default) begins, and
/// the fleet's kept spend is let go then. Such a test says so and passes, rather than wait.
pub fn near_a_month_boundary() -> bool {
    use gpuwatch::cost::calendar::Period;
    let now = gpuwatch::time::now();
    let since = now - Period::Month.start(now);
    let until = Period::Month.end(now) - now;
    if since < 360.0 || until < 600.0 {
        eprintln!(
            "skipped: the month began {since:.0}s ago or ends in {until:.0}s, when team budget answers are settling"
        );
        return true;
    }
    false
}
