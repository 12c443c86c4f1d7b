//! Test harness: starts the real `gpuwatch` binary over the fake NVML library, talks HTTP to it,
//! and reads its exposition.
#![allow(dead_code)]

pub mod alertmanager;
pub mod alibaba;
pub mod aws;
pub mod azure;
pub mod browser;
pub mod certs;
pub mod dashboards;
pub mod fake;
pub mod gcp;
pub mod kubeapi;
pub mod kubelet;
pub mod prometheus;
pub mod receiver;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_gpuwatch");

/// The cluster controller's executable, which `gpuwatch controller` runs.
pub const CONTROLLER_BIN: &str = env!("CARGO_BIN_EXE_gpuwatch-controller");

/// The binary the end-to-end tests run as the daemon: `GPUWATCH_BIN` where it names one (the
/// release binary, `GPUWATCH_BIN=target/release/gpuwatch cargo test --test alibaba`), else the
/// one cargo built for these tests.
pub fn daemon_binary() -> PathBuf {
    std::env::var_os("GPUWATCH_BIN").map_or_else(|| PathBuf::from(BIN), PathBuf::from)
}

/// The fake library cargo builds beside the binary.
pub fn fake_library() -> PathBuf {
    let dir = Path::new(BIN).parent().unwrap();
    // In deps/, where cargo rebuilds it with gpuwatch (the copy beside the binary is refreshed
    // only by a workspace build).
    let lib = dir.join("deps/libgpuwatch_fake_nvml.so");
    assert!(
        lib.is_file(),
        "{} is missing; run `cargo build` first",
        lib.display()
    );
    lib
}

/// Waits (a minute at most) until the daemon knows the instance's price, and asserts it is
/// `usd` an hour from `source`. Returns that scrape.
pub fn assert_price(d: &Daemon, source: &str, usd: f64) -> Scrape {
    let s = d.await_scrape(std::time::Duration::from_secs(60), |s| {
        metric("gpuwatch_instance_hourly_cost_dollars")
            .get(s)
            .is_some()
    });
    metric("gpuwatch_instance_hourly_cost_dollars")
        .label("source", source)
        .value(usd)
        .assert_in(&s);
    s
}

/// A running `gpuwatch run`, stopped (by its PID) when dropped.
pub struct Daemon {
    child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    log: Arc<Log>,
}

/// The daemon's stderr as read so far, and a signal for each line that arrives.
#[derive(Default)]
struct Log {
    text: Mutex<String>,
    grew: Condvar,
}

impl Daemon {
    /// Starts the daemon over `scenario` (fake NVML TOML), with `extra` appended to its config.
    pub fn start(scenario: &str, extra: &str) -> Daemon {
        Daemon::start_in(tempfile::tempdir().unwrap(), scenario, extra)
    }

    /// Like `start`, in a directory the caller has put files (such as traces) in.
    pub fn start_in(dir: tempfile::TempDir, scenario: &str, extra: &str) -> Daemon {
        std::fs::write(dir.path().join("scenario.toml"), scenario).unwrap();
        let library = fake_library();
        Daemon::start_with(
            dir,
            &format!("[nvml]\nlibrary = \"{}\"\n{extra}", library.display()),
        )
    }

    /// Writes the fake NVML scenario into `dir`, then starts the daemon with this whole config
    /// text (which names its own `[nvml] library`).
    pub fn start_scenario(dir: tempfile::TempDir, scenario: &str, config: &str) -> Daemon {
        std::fs::write(dir.path().join("scenario.toml"), scenario).unwrap();
        Daemon::start_with(dir, config)
    }

    /// Starts the daemon with this config text. Unless the config names an address, it listens
    /// on a port of the kernel's choosing (`--listen 127.0.0.1:0`), which the readiness line on
    /// stdout reports.
    pub fn start_with(dir: tempfile::TempDir, config: &str) -> Daemon {
        Daemon::start_with_env(dir, config, &[])
    }

    /// Like `start_with`, with these variables in the daemon's environment too.
    pub fn start_with_env(dir: tempfile::TempDir, config: &str, env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn(dir, "run", config, env)
    }

    /// Starts `gpuwatch controller` with this config text, as `start_with_env` starts the
    /// daemon: its readiness line, its log, killed when dropped.
    pub fn controller(dir: tempfile::TempDir, config: &str, env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn(dir, "controller", config, env)
    }

    fn spawn(dir: tempfile::TempDir, command: &str, config: &str, env: &[(&str, &str)]) -> Daemon {
        let path = dir.path().join("gpuwatch.toml");
        std::fs::write(&path, config).unwrap();
        let mut command_line = Command::new(daemon_binary());
        let command = command_line.args([command, "--config"]).arg(&path);
        if !config.contains("listen =") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let mut child = command
            .env(
                "GPUWATCH_FAKE_NVML_SCENARIO",
                dir.path().join("scenario.toml"),
            )
            .env("GPUWATCH_LOG", "info")
            .envs(aws::SAFE_ENV.iter().copied())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuwatch");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Log::default());
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.text.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
                sink.grew.notify_all();
            }
        });
        // The readiness signal: "listening on http://ADDR/" (or https) on stdout.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = ready_address(&line) {
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "gpuwatch did not start listening:\n{}",
                    log.text.lock().unwrap()
                );
            }
        };
        Daemon {
            child,
            addr,
            dir,
            log,
        }
    }

    pub fn log(&self) -> String {
        self.log.text.lock().unwrap().clone()
    }

    /// Awaits the log's lines until one contains `needle` (stderr is read on its own thread,
    /// so a line written before an answer may reach the log after it), and returns the log;
    /// fails after `limit`.
    pub fn await_log(&self, limit: Duration, needle: &str) -> String {
        let deadline = Instant::now() + limit;
        let mut text = self.log.text.lock().unwrap();
        while !text.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "the log did not say \"{needle}\" within {limit:?}:\n{text}"
            );
            text = self.log.grew.wait_timeout(text, left).unwrap().0;
        }
        text.clone()
    }

    pub fn get(&self, path: &str) -> Response {
        get(self.addr, path)
    }

    pub fn scrape(&self) -> Scrape {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "{}", r.body);
        Scrape::parse(&r.body)
    }

    /// Waits (long-polls the daemon) for the first snapshot newer than `seq`.
    pub fn snapshot_after(&self, seq: u64) -> Value {
        let r = self.get(&format!("/api/v1/snapshot?after={seq}&timeout=10s"));
        assert_eq!(r.status, 200, "{}", r.body);
        serde_json::from_str(&r.body).unwrap()
    }

    /// Awaits samples until `cond` holds for one, and returns it; fails after `limit`.
    pub fn await_sample(&self, limit: Duration, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        let mut seq = 0;
        loop {
            let snap = self.snapshot_after(seq);
            if cond(&snap) {
                return snap;
            }
            seq = snap["seq"].as_u64().unwrap();
            assert!(
                Instant::now() < deadline,
                "no sample met the condition within {limit:?}; last: {snap}\nlog:\n{}",
                self.log()
            );
        }
    }

    /// Awaits samples until a scrape satisfies `cond`; fails after `limit`.
    pub fn await_scrape(&self, limit: Duration, cond: impl Fn(&Scrape) -> bool) -> Scrape {
        let deadline = Instant::now() + limit;
        let mut seq = 0;
        loop {
            let scrape = self.scrape();
            if cond(&scrape) {
                return scrape;
            }
            assert!(
                Instant::now() < deadline,
                "no scrape met the condition within {limit:?}:\n{}\nlog:\n{}",
                scrape.text,
                self.log()
            );
            seq = self.snapshot_after(seq)["seq"].as_u64().unwrap();
        }
    }

    /// Awaits samples until one is at least `until` (Unix seconds).
    pub fn await_time(&self, until: f64) {
        self.await_sample(Duration::from_secs(120), |s| {
            s["timestamp"].as_f64().unwrap_or(0.0) >= until
        });
    }

    /// Awaits samples until the audit log records the result of rule `rule`'s action (its
    /// command has then run), and returns that record; fails after `limit`.
    pub fn await_action(&self, limit: Duration, rule: &str) -> Value {
        let found = || {
            events(&self.audit(), "action_result")
                .into_iter()
                .find(|r| r["rule"] == rule)
                .cloned()
        };
        self.await_scrape(limit, |_| found().is_some());
        found().unwrap()
    }

    /// The audit log's records, in order.
    pub fn audit(&self) -> Vec<serde_json::Value> {
        audit_records(&self.dir.path().join("state/audit.jsonl"))
    }

    /// Stops the daemon now (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as systemd stops a service.
    pub fn terminate(&self) {
        // SAFETY: kill has no memory effects; the PID is our own child's.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) }, 0);
    }

    /// Waits up to `limit` for the daemon to exit; its status, or `None` while it still runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The files in `dir` (below the package root) whose names end in `.ext`, sorted.
pub fn files_in(dir: &str, ext: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

/// Unix seconds from an RFC 3339 value in the audit log or an API answer.
pub fn secs(v: &Value) -> f64 {
    gpuwatch::time::parse_rfc3339(v.as_str().unwrap()).unwrap()
}

/// The address in the readiness line, `listening on http://ADDR/` or `https://ADDR/`.
pub fn ready_address(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("listening on ")?;
    let rest = rest
        .strip_prefix("http://")
        .or_else(|| rest.strip_prefix("https://"))?;
    rest.trim_end().strip_suffix('/')?.parse().ok()
}

/// Runs `gpuwatch ARGS`, asserts that it succeeded, and returns what it printed.
pub fn gpuwatch(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let out = Command::new(BIN)
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpuwatch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A TempDir handle for a directory that already exists (a link to it, removed with the
/// handle), so that a restarted daemon runs over the same config and state.
pub fn reuse_dir(path: &Path) -> tempfile::TempDir {
    let td = tempfile::Builder::new()
        .prefix("gpuwatch-restart-")
        .tempdir()
        .unwrap();
    std::fs::remove_dir(td.path()).unwrap();
    std::os::unix::fs::symlink(path, td.path()).unwrap();
    td
}

/// The complete records of an audit log: a last line without its newline is a record still
/// being written, which a test polling the log may catch.
pub fn audit_records(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The audit records with this `event`.
pub fn events<'a>(audit: &'a [serde_json::Value], event: &str) -> Vec<&'a serde_json::Value> {
    audit.iter().filter(|r| r["event"] == event).collect()
}

/// A child process killed (by its PID) when dropped, also when a test fails.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Response {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Response {
    /// The body as JSON; fails the test when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
}

/// A plain HTTP/1.1 GET, with a 15 s read timeout.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    try_get(addr, path).unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

pub fn try_get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {head:?}")))?;
    Ok(Response {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_string(),
    })
}

/// One parsed sample line of the exposition.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

pub struct Scrape {
    pub text: String,
    pub series: Vec<Series>,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (left, value) = l.rsplit_once(' ').unwrap();
                let (name, labels) = match left.split_once('{') {
                    Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
                    None => (left, BTreeMap::new()),
                };
                Series {
                    name: name.to_string(),
                    labels,
                    value: value.parse().unwrap(),
                }
            })
            .collect();
        Scrape {
            text: text.to_string(),
            series,
        }
    }

    pub fn named(&self, name: &str) -> Vec<&Series> {
        self.series.iter().filter(|s| s.name == name).collect()
    }
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((k, after)) = rest.split_once("=\"") {
        let end = after.find('"').unwrap();
        out.insert(
            k.trim_start_matches(',').to_string(),
            after[..end].to_string(),
        );
        rest = &after[end + 1..];
    }
    out
}

/// `metric("x").label("gpu", "0").value(1.0).assert_in(&scrape)`.
pub fn metric(name: &str) -> MetricMatch {
    MetricMatch {
        name: name.to_string(),
        labels: Vec::new(),
    }
}

pub struct MetricMatch {
    name: String,
    labels: Vec<(String, String)>,
}

impl MetricMatch {
    pub fn label(mut self, k: &str, v: impl ToString) -> Self {
        self.labels.push((k.to_string(), v.to_string()));
        self
    }

    pub fn gpu(self, i: u32) -> Self {
        self.label("gpu", i)
    }

    fn find<'a>(&self, scrape: &'a Scrape) -> Vec<&'a Series> {
        scrape
            .named(&self.name)
            .into_iter()
            .filter(|s| self.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect()
    }

    /// Asserts exactly one series matches and has this value (to 1e-9 relative).
    pub fn value(self, want: f64) -> Assertion {
        Assertion {
            m: self,
            want: Some(want),
        }
    }

    /// Asserts no series matches.
    pub fn absent(self) -> Assertion {
        Assertion {
            m: self,
            want: None,
        }
    }

    pub fn get(&self, scrape: &Scrape) -> Option<f64> {
        let found = self.find(scrape);
        assert!(
            found.len() <= 1,
            "{} {:?} matched {} series",
            self.name,
            self.labels,
            found.len()
        );
        found.first().map(|s| s.value)
    }
}

pub struct Assertion {
    m: MetricMatch,
    want: Option<f64>,
}

impl Assertion {
    #[track_caller]
    pub fn assert_in(&self, scrape: &Scrape) {
        let found = self.m.find(scrape);
        match self.want {
            None => assert!(
                found.is_empty(),
                "{} {:?} should be absent, found {found:?}",
                self.m.name,
                self.m.labels
            ),
            Some(want) => {
                assert_eq!(
                    found.len(),
                    1,
                    "{} {:?}: expected one series, found {found:?}",
                    self.m.name,
                    self.m.labels
                );
                let got = found[0].value;
                assert!(
                    got == want || (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                    "{} {:?} = {got}, expected {want}",
                    self.m.name,
                    self.m.labels
                );
            }
        }
    }
}

/// Starts an outside server that cannot report the port it took: on a loopback port that was
/// free a moment ago, and again on another when the server exits before it is ready (something
/// took the port between the pick and the server's bind). `ready` must tell this server from
/// another listening there. Returns the server and its address; fails after `limit`.
pub fn start_server(
    what: &str,
    limit: Duration,
    spawn: impl Fn(SocketAddr) -> Child,
    ready: impl Fn(SocketAddr) -> bool,
) -> (Child, SocketAddr) {
    let deadline = Instant::now() + limit;
    let mut exits = Vec::new();
    while exits.len() < 5 {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut child = spawn(addr);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                exits.push(format!("{addr}: {status}"));
                break;
            }
            if ready(addr) && matches!(child.try_wait(), Ok(None)) {
                return (child, addr);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} was not ready within {limit:?} (earlier tries: {exits:?})");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("{what} exited before it was ready, each time: {exits:?}");
}

/// A loopback port that refuses connections for as long as the socket returned is open: bound
/// but never listening, so that no other server can take the port meanwhile.
pub fn closed_port() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) returns a new descriptor or -1; the new one is owned here alone.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let mut addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` is a sockaddr_in of `len` bytes, for bind(2) to read and getsockname(2) to
    // fill.
    unsafe {
        let at = std::ptr::addr_of_mut!(addr).cast::<libc::sockaddr>();
        assert_eq!(
            libc::bind(raw, at, len),
            0,
            "bind: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(libc::getsockname(raw, at, &mut len), 0);
    }
    (fd, u16::from_be(addr.sin_port))
}

/// A loopback port that was free a moment ago, for servers that cannot report their own.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `promtool check metrics` over an exposition and fails the test on anything it finds,
/// except its note that counters carry HELP under the name without `_total` (OpenMetrics).
pub fn assert_promtool_accepts(exposition: &str) {
    assert_promtool_accepts_but(exposition, &[]);
}

/// What `promtool check metrics` notes of dcgm-exporter's names, which are its interface, not a
/// slip: camelCase labels (`modelName`, `UUID`), and one name that ends in `_COUNTER`.
pub const DCGM_LINT: &[&str] = &[
    "should be written in 'snake_case'",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
];

/// Like `assert_promtool_accepts`, allowing the lint lines that contain one of `allowed` (the
/// camelCase labels of dcgm-exporter's names, which are its interface).
pub fn assert_promtool_accepts_but(exposition: &str, allowed: &[&str]) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool not found: scripts/test installs Debian's prometheus, which brings it");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !(l.contains("_total") && l.contains("no help text")))
        .filter(|l| !allowed.iter().any(|a| l.contains(a)))
        .collect();
    assert!(problems.is_empty(), "promtool:\n{text}\n{exposition}");
}

/// One thread of a child process, stopped with ptrace while the rest runs on: what a thread
/// stuck in the kernel on a hung disk (or a wedged driver call) looks like from outside. It
/// runs again when this is dropped (or when the test process ends).
pub struct Frozen {
    release: Option<std::sync::mpsc::Sender<()>>,
    tracer: Option<std::thread::JoinHandle<()>>,
}

impl Frozen {
    /// Stops the thread of process `pid` whose name is `name` (`/proc/PID/task/TID/comm`).
    pub fn thread(pid: u32, name: &str) -> Frozen {
        let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|e| e.ok())
            .find(|e| {
                std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .unwrap_or_else(|| panic!("no thread {name:?} in process {pid}"))
            .file_name()
            .to_string_lossy()
            .parse::<i32>()
            .unwrap();
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        // ptrace requests come from the thread that attached; this one does it all.
        let tracer = std::thread::spawn(move || {
            // SAFETY: ptrace and waitpid on a thread of our own child; no memory is shared.
            unsafe {
                let seized = libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) == 0
                    && libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) == 0;
                let mut status = 0;
                let stopped = seized && libc::waitpid(tid, &mut status, libc::__WALL) == tid;
                let error = std::io::Error::last_os_error();
                stopped_tx.send(stopped.then_some(()).ok_or(error)).unwrap();
                if !stopped {
                    return;
                }
                let _ = release_rx.recv();
                libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
            }
        });
        if let Err(e) = stopped_rx.recv().unwrap() {
            panic!("cannot stop thread {tid} with ptrace: {e}");
        }
        Frozen {
            release: Some(release),
            tracer: Some(tracer),
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(t) = self.tracer.take() {
            let _ = t.join();
        }
    }
}
