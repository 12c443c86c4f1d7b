//! systemd's notify protocol, as a service manager sees it: the test listens on a `NOTIFY_SOCKET`
//! datagram socket of its own and gives the daemon a watchdog of one second.
//! - `READY=1` comes only once the first sample is in (the first sample here takes 1.5 s).
//! - `STATUS=` lines carry the GPU count, NVML and the pending actions.
//! - `WATCHDOG=1` pings come while the daemon makes progress, stop while its decision loop hangs
//!   (its I/O thread, stopped with ptrace, stands in for one stuck on a hung disk), and come
//!   back once it moves again. `/-/healthy` answers by the same test: 503 while it hangs.
//! - `STOPPING=1` comes on SIGTERM, and the daemon exits cleanly.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Daemon;

/// One GPU, idle; its first device call takes 1.5 s.
const SLOW_START: &str = "[[gpu]]\nutilization = 0\n\
    [[fault]]\nat = \"0s\"\nuntil = \"1s\"\nkind = \"delay\"\ndelay = \"1500ms\"\n";

/// The service manager's end of the protocol.
struct Manager {
    socket: UnixDatagram,
}

impl Manager {
    fn bind(path: &Path) -> Manager {
        let socket = UnixDatagram::bind(path).unwrap();
        Manager { socket }
    }

    /// The next message, or `None` after `limit`.
    fn recv(&self, limit: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Reads messages until one satisfies `want`, which it returns, with those before it.
    fn until(&self, limit: Duration, want: impl Fn(&str) -> bool) -> (String, Vec<String>) {
        let deadline = Instant::now() + limit;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(m) = self.recv(left.max(Duration::from_millis(1))) else {
                panic!("no such message within {limit:?}; got {before:?}");
            };
            if want(&m) {
                return (m, before);
            }
            before.push(m);
            assert!(
                Instant::now() < deadline,
                "none within {limit:?}: {before:?}"
            );
        }
    }
}

fn start(dir: tempfile::TempDir, manager_socket: &Path) -> Daemon {
    start_with(dir, manager_socket, "warning = \"1h\"\n", "/bin/true")
}

/// The daemon over `SLOW_START` with an idle rule that runs `command`; `actions` adds to
/// `[actions]`.
fn start_with(
    dir: tempfile::TempDir,
    manager_socket: &Path,
    actions: &str,
    command: &str,
) -> Daemon {
    std::fs::write(dir.path().join("scenario.toml"), SLOW_START).unwrap();
    let config = format!(
        "[nvml]\nlibrary = \"{lib}\"\n[server]\nstall_timeout = \"6s\"\n\
         [sampling]\ninterval = \"100ms\"\ntimeout = \"5s\"\n\
         [actions]\nboot_grace = \"0s\"\n{actions}wall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 1\naction = \"exec\"\n\
         command = [\"/bin/sh\", \"-c\", \"{command}\"]\n",
        lib = common::fake_library().display(),
        state = dir.path().join("state").display(),
    );
    let socket = manager_socket.to_str().unwrap();
    Daemon::start_with_env(
        dir,
        &config,
        &[("NOTIFY_SOCKET", socket), ("WATCHDOG_USEC", "1000000")],
    )
}

#[test]
fn ready_after_the_first_sample_status_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let manager = Manager::bind(&dir.path().join("notify.sock"));
    let socket = dir.path().join("notify.sock");
    let mut d = start(dir, &socket);

    let (ready, before) = manager.until(Duration::from_secs(20), |m| m.contains("READY=1"));
    // Ready means a sample is in: what the daemon serves now comes from one.
    let seq = d.get("/api/v1/snapshot").json()["seq"].as_u64().unwrap();
    assert!(seq >= 1, "READY=1 before the first sample: {ready:?}");
    assert!(before.is_empty(), "messages before READY: {before:?}");
    assert!(
        ready.contains("STATUS=1 of 1 GPUs up; NVML up"),
        "{ready:?}"
    );

    // The idle rule warns: the status line says an action is pending.
    let (status, _) = manager.until(Duration::from_secs(20), |m| {
        m.contains("STATUS=") && m.contains("1 action pending")
    });
    println!("status: {status:?}");

    // Pings, about every quarter second.
    let started = Instant::now();
    for _ in 0..3 {
        manager.until(Duration::from_secs(3), |m| m.contains("WATCHDOG=1"));
    }
    assert!(started.elapsed() < Duration::from_secs(6));

    d.terminate();
    let (stopping, _) = manager.until(Duration::from_secs(10), |m| m.contains("STOPPING=1"));
    println!("stopping: {stopping:?}");
    let status = d
        .wait_exit(Duration::from_secs(15))
        .expect("still running after SIGTERM");
    assert!(status.success(), "{status}\n{}", d.log());
}

#[test]
fn watchdog_pings_stop_while_the_decision_loop_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let manager = Manager::bind(&dir.path().join("notify.sock"));
    let socket = dir.path().join("notify.sock");
    let d = start(dir, &socket);
    manager.until(Duration::from_secs(20), |m| m.contains("READY=1"));
    manager.until(Duration::from_secs(3), |m| m.contains("WATCHDOG=1"));

    // The decision loop saves its state on the I/O thread at every step: with that thread
    // stopped, as on a hung disk, it waits.
    let frozen = common::Frozen::thread(d.pid(), "gpuwatch-io");

    // Within a few watchdog periods the pings stop, and stay stopped for three periods, while
    // the sampler goes on.
    let hung_at = Instant::now();
    let mut quiet_since = Instant::now();
    let seq_before = d.get("/api/v1/snapshot").json()["seq"].as_u64().unwrap();
    loop {
        match manager.recv(Duration::from_millis(200)) {
            Some(m) if m.contains("WATCHDOG=1") => quiet_since = Instant::now(),
            _ => {}
        }
        if quiet_since.elapsed() >= Duration::from_secs(3) {
            break;
        }
        assert!(
            hung_at.elapsed() < Duration::from_secs(10),
            "the pings went on while the decision loop hung\n{}",
            d.log()
        );
    }
    // The sampler goes on meanwhile (this fails if it stopped too).
    d.await_sample(Duration::from_secs(10), |s| {
        s["seq"].as_u64().unwrap() > seq_before + 5
    });
    assert!(d.log().contains("no watchdog ping"), "{}", d.log());

    // The liveness answer says so too, once the stall lasts stall_timeout (6 s here).
    let deadline = Instant::now() + Duration::from_secs(20);
    let health = loop {
        let health = d.get("/-/healthy");
        if health.status != 200 || Instant::now() > deadline {
            break health;
        }
        manager.recv(Duration::from_millis(200));
    };
    assert_eq!(health.status, 503, "{}", health.body);
    assert!(health.body.contains("decision loop"), "{}", health.body);

    // It moves again: the pings come back, and so does 200.
    drop(frozen);
    manager.until(Duration::from_secs(5), |m| m.contains("WATCHDOG=1"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.get("/-/healthy").status != 200 {
        assert!(Instant::now() < deadline, "still unhealthy\n{}", d.log());
        manager.recv(Duration::from_millis(100));
    }
}

/// An action that takes a while (here an `exec` of 4 s, within its 30 s timeout) is no wedge:
/// the pings go on while it runs.
#[test]
fn watchdog_pings_go_on_during_a_long_action() {
    let dir = tempfile::tempdir().unwrap();
    let manager = Manager::bind(&dir.path().join("notify.sock"));
    let socket = dir.path().join("notify.sock");
    let d = start_with(
        dir,
        &socket,
        "mode = \"enforce\"\nwarning = \"1s\"\nexec_timeout = \"30s\"\n",
        "sleep 4",
    );
    manager.until(Duration::from_secs(20), |m| m.contains("READY=1"));
    // The action begins: its attempt is on record before it runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !d.audit().iter().any(|r| r["event"] == "action_attempt") {
        assert!(Instant::now() < deadline, "no action:\n{}", d.log());
        manager.recv(Duration::from_millis(100));
    }
    // For the next 3 s the action runs, and the pings keep coming.
    let until = Instant::now() + Duration::from_secs(3);
    let mut pings = 0;
    while Instant::now() < until {
        if manager
            .recv(Duration::from_millis(100))
            .is_some_and(|m| m.contains("WATCHDOG=1"))
        {
            pings += 1;
        }
    }
    assert!(
        !d.audit().iter().any(|r| r["event"] == "action_result"),
        "the action ended early"
    );
    assert!(
        pings >= 6,
        "{pings} pings in 3 s during the action\n{}",
        d.log()
    );
}
