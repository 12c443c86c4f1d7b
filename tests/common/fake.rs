//! A fake cloud of `tests/<cloud>/fake_<cloud>.py`, one process per test: it prints
//! `ready <port>...` once it listens, and keeps its state (with every call made to it) at
//! `/_fake/state` on its control port.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The fake, stopped (by PID) when dropped.
pub struct Process {
    /// The ports it listens on, in the order it printed them.
    pub ports: Vec<SocketAddr>,
    /// Where its state is kept.
    pub control: SocketAddr,
    _child: super::Killed,
}

impl Process {
    /// Starts `script` (under `tests/`), whose control port is the `control`th it prints.
    pub fn start(script: &str, control: usize) -> Process {
        Process::start_with_args(script, control, &[])
    }

    /// Like `start`, with these arguments after the script.
    pub fn start_with_args(script: &str, control: usize, args: &[&str]) -> Process {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join(script);
        let mut child = Command::new("python3")
            .arg(&script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ports: Vec<SocketAddr> = line
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("{} did not start: {line:?}", script.display()))
            .split(' ')
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p.parse().unwrap())))
            .collect();
        Process {
            control: ports[control],
            ports,
            _child: super::Killed(child),
        }
    }

    /// The fake's state, with every call made to it.
    pub fn state(&self) -> Value {
        super::get(self.control, "/_fake/state").json()
    }

    /// Merges `changes` into the fake's state.
    pub fn set(&self, changes: Value) {
        let body = changes.to_string();
        let mut s = TcpStream::connect(self.control).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        write!(
            s,
            "POST /_fake/state HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.control,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    }

    /// The calls made to `service`.
    pub fn calls(&self, service: &str) -> Vec<Value> {
        self.state()["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["service"] == service)
            .cloned()
            .collect()
    }

    /// The calls to `service` that change something (any but GET), as `METHOD path`.
    pub fn mutations(&self, service: &str) -> Vec<String> {
        mutations(&self.calls(service))
    }

    /// Waits until `cond` holds of the state, for at most `limit`.
    pub fn await_state(&self, limit: Duration, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.state();
            if cond(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "the fake never got there: {s:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The calls of a fake's record that change something (any but GET), as `METHOD path`.
pub fn mutations(calls: &[Value]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c["method"] != "GET")
        .map(|c| {
            format!(
                "{} {}",
                c["method"].as_str().unwrap(),
                c["path"].as_str().unwrap()
            )
        })
        .collect()
}

/// A fake cloud the daemon can be pointed at: its config, and the name of the idle rule its
/// end-to-end tests give the daemon.
pub trait Cloud {
    /// The daemon's config on this fake, with `actions` in `[actions]` and `extra` after.
    fn config(&self, dir: &Path, actions: &str, extra: &str) -> String;
    fn rule_name(&self) -> &'static str {
        "idle"
    }
}

/// Two idle GPUs, and two busy ones.
pub const IDLE: &str = "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n";
pub const BUSY: &str = "[[gpu]]\nutilization = 90\n[[gpu]]\nutilization = 90\n";

/// A rule named `name` on idle GPUs (two periods of 1 s) that does `action`.
pub fn rule(name: &str, action: &str) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 2\naction = \"{action}\"\n"
    )
}

/// The daemon on `fake`, in `mode`, with its idle rule doing `action` after a 1 s warning.
pub fn start(
    fake: &impl Cloud,
    mode: &str,
    action: &str,
    extra: &str,
    scenario: &str,
) -> super::Daemon {
    start_in(
        tempfile::tempdir().unwrap(),
        fake,
        mode,
        action,
        extra,
        scenario,
    )
}

/// As `start`, in `dir`.
pub fn start_in(
    dir: tempfile::TempDir,
    fake: &impl Cloud,
    mode: &str,
    action: &str,
    extra: &str,
    scenario: &str,
) -> super::Daemon {
    let config = fake.config(
        dir.path(),
        &format!("mode = \"{mode}\"\nwarning = \"1s\""),
        &format!("{extra}\n{}", rule(fake.rule_name(), action)),
    );
    super::Daemon::start_scenario(dir, scenario, &config)
}

/// The cloud calls the daemon's audit log records, by operation.
pub fn api_calls(d: &super::Daemon) -> Vec<String> {
    super::events(&d.audit(), "api_call")
        .iter()
        .map(|r| r["operation"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the daemon's `action` is done, then says that the cloud refused its stamp
/// (`operation`) for its own limits, once, in words that hold `said`: the refusal is counted
/// and audited, and the action went on without it. Returns the audit log.
pub fn assert_done_without_the_stamp(
    d: &super::Daemon,
    action: &str,
    operation: &str,
    said: &str,
) -> Vec<Value> {
    let s = d.await_scrape(std::time::Duration::from_secs(60), |s| {
        super::aws::actions(s, action, "done") == 1.0
    });
    super::metric("gpuwatch_cloud_stamps_refused_total")
        .value(1.0)
        .assert_in(&s);
    let audit = d.audit();
    let refused = super::events(&audit, "stamp_refused");
    assert_eq!(refused.len(), 1, "{audit:?}");
    assert_eq!(refused[0]["operation"], operation, "{audit:?}");
    let error = refused[0]["error"].as_str().unwrap();
    assert!(error.contains(said), "{error}");
    assert!(super::events(&audit, "api_error").is_empty(), "{audit:?}");
    audit
}
