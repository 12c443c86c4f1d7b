//! A daemon that can stop machines under bad conditions: hostile HTTP clients, a full disk,
//! SIGTERM with clients connected. Each test is bounded in time and count and uses loopback only.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{metric, Daemon};

const LIMIT: Duration = Duration::from_secs(60);

/// Two GPUs, idle from the start.
const IDLE2: &str = "[[gpu]]\nutilization = 0\n[[gpu]]\nutilization = 0\n";

/// Two GPUs, busy: no rule fires.
const BUSY2: &str = "[[gpu]]\nutilization = 90\n[[gpu]]\nutilization = 90\n";

fn counter(s: &common::Scrape, name: &str, label: (&str, &str)) -> f64 {
    metric(name).label(label.0, label.1).get(s).unwrap_or(0.0)
}

/// Opens `n` connections that send `prefix` (perhaps nothing) and then hold still.
fn hold_open(addr: std::net::SocketAddr, n: usize, prefix: &[u8]) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| {
            let mut s = TcpStream::connect(addr).ok()?;
            s.write_all(prefix).ok()?;
            Some(s)
        })
        .collect()
}

#[test]
fn idle_connections_never_lock_out_a_scrape() {
    let d = Daemon::start(
        BUSY2,
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_connections = 32\nmax_long_polls = 8\nheader_read_timeout = \"30s\"\n",
    );
    d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    // Ten times the cap, half of them with half a request line.
    let _silent = hold_open(d.addr, 160, b"");
    let _half = hold_open(d.addr, 160, b"GET /metr");
    for _ in 0..50 {
        let started = Instant::now();
        let s = d.scrape();
        assert!(started.elapsed() < Duration::from_secs(5));
        metric("gpu_up").gpu(0).value(1.0).assert_in(&s);
    }
    let s = d.scrape();
    assert!(
        counter(
            &s,
            "gpuwatch_http_connections_closed_early_total",
            ("reason", "evicted")
        ) >= 280.0,
        "{}",
        s.text
    );
    assert!(metric("gpuwatch_http_connections_open").get(&s).unwrap() <= 32.0);
}

#[test]
fn a_connection_that_sends_no_whole_request_is_closed() {
    let d = Daemon::start(
        BUSY2,
        "[server]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"500ms\"\n",
    );
    for prefix in [&b""[..], b"GET /metrics HTTP/1.1\r\nHost: x\r\n"] {
        let mut s = TcpStream::connect(d.addr).unwrap();
        s.write_all(prefix).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let started = Instant::now();
        let mut buf = Vec::new();
        // The server closes it: EOF (perhaps after a 408), not our read timeout.
        let r = s.read_to_end(&mut buf);
        assert!(
            r.is_ok()
                || r.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{r:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    // A keep-alive connection that goes idle is closed too.
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.write_all(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf).contains("200 OK"));
}

#[test]
fn long_polls_are_bounded() {
    // One sample an hour: a long-poll waits for its whole timeout.
    let d = Daemon::start(
        BUSY2,
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_long_polls = 2\nstall_timeout = \"2h\"\n[sampling]\ninterval = \"1h\"\n",
    );
    let first = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true);
    let seq = first["seq"].as_u64().unwrap();
    let far = d.get(&format!("/api/v1/snapshot?after={}", seq + 1000));
    assert_eq!(far.status, 400, "{}", far.body);
    assert!(far.body.contains("beyond the next sample"), "{}", far.body);

    let addr = d.addr;
    let polls: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                // A probe may hold a permit for an instant: retry a 503 until this one holds.
                let deadline = Instant::now() + LIMIT;
                loop {
                    let r = common::get(addr, &format!("/api/v1/snapshot?after={seq}&timeout=3s"));
                    if r.status != 503 || Instant::now() > deadline {
                        return r;
                    }
                }
            })
        })
        .collect();
    // A probe that does not wait (timeout 0s) gets 200 while a permit is free, and 503 once
    // both long-polls hold theirs.
    let deadline = Instant::now() + LIMIT;
    let refused = loop {
        let r = d.get(&format!("/api/v1/snapshot?after={seq}&timeout=0s"));
        if r.status != 200 {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the long-polls never held both permits"
        );
    };
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(
        refused.body.contains("too many long-polls"),
        "{}",
        refused.body
    );
    for p in polls {
        assert_eq!(p.join().unwrap().status, 200);
    }
    // The timeout is capped: an hour is served as at most 30 s, and a permit is free again.
    let started = Instant::now();
    let capped = d.get(&format!("/api/v1/snapshot?after={seq}&timeout=1s"));
    assert_eq!(capped.status, 200);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn the_status_waits_for_the_decision_loop_only_under_a_long_poll_permit() {
    // The decision loop is busy in a long action, so it does not step on new samples.
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_long_polls = 1\n\
         [actions]\nmode = \"enforce\"\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 2\naction = \"exec\"\ncommand = [\"sleep\", \"30\"]\n",
        state = dir.path().join("state").display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    d.await_sample(LIMIT, |_| {
        !common::events(&d.audit(), "action_attempt").is_empty()
    });
    // Status requests wait up to 2 s each for a step that does not come: each holds the one
    // permit while it waits, so a long-poll meanwhile is refused rather than the waits
    // piling up outside the cap.
    let addr = d.addr;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let statuses = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                assert_eq!(common::get(addr, "/api/v1/status").status, 200);
            }
        })
    };
    let seq = d.get("/api/v1/snapshot").body;
    let seq: serde_json::Value = serde_json::from_str(&seq).unwrap();
    let seq = seq["seq"].as_u64().unwrap();
    let deadline = Instant::now() + LIMIT;
    loop {
        let r = d.get(&format!("/api/v1/snapshot?after={seq}&timeout=0s"));
        if r.status == 503 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no status wait ever held the long-poll permit"
        );
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    statuses.join().unwrap();
}

#[test]
fn sigterm_exits_promptly_with_clients_connected_and_stops_deciding_first() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"60s\"\nstall_timeout = \"2h\"\n[sampling]\ninterval = \"1h\"\n[cost]\nhourly_price_usd = 1.0\n[actions]\nboot_grace = \"0s\"\nstate_dir = \"{}\"\n",
        dir.path().join("state").display()
    );
    let mut d = Daemon::start_in(dir, BUSY2, &config);
    let seq = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true)["seq"]
        .as_u64()
        .unwrap();
    let _idle = hold_open(d.addr, 50, b"GET /metr");
    let addr = d.addr;
    let _poll = std::thread::spawn(move || {
        let _ = common::try_get(addr, &format!("/api/v1/snapshot?after={seq}&timeout=30s"));
    });
    let started = Instant::now();
    // SAFETY: kill sends a signal to the child we started.
    assert_eq!(unsafe { libc::kill(d.pid() as i32, libc::SIGTERM) }, 0);
    while d.is_running() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "still running {:?} after SIGTERM",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its last lines may still be on their way from the pipe.
    let log = d.await_log(Duration::from_secs(10), "cost watch stopped");
    let decide = log.find("shutting down: no new decisions").expect(&log);
    let watch = log.find("cost watch stopped").expect(&log);
    let stopped = log.rfind("stopped").unwrap();
    assert!(decide < watch && watch <= stopped, "{log}");
}

/// Sets the daemon's file size limit (`RLIMIT_FSIZE`) from outside: 0 makes every write that
/// grows a file fail with EFBIG, as a full disk does.
fn set_file_size_limit(pid: u32, bytes: Option<u64>) {
    let v = bytes.unwrap_or(libc::RLIM_INFINITY);
    let lim = libc::rlimit {
        rlim_cur: v,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit reads the struct we pass for a process we started.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn with_a_full_disk_no_action_runs_until_its_record_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("acted");
    let config = format!(
        "[actions]\nmode = \"enforce\"\nboot_grace = \"0s\"\nwarning = \"10s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 2\naction = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"echo ran >> {marker}\"]\n",
        state = dir.path().join("state").display(),
        marker = marker.display(),
    );
    let mut d = Daemon::start_in(dir, IDLE2, &config);
    set_file_size_limit(d.pid(), Some(0));
    // No warning can be recorded: none is given, and so no action falls due.
    let s = d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_state_errors_total", ("op", "audit")) >= 3.0
    });
    assert_eq!(
        counter(&s, "gpuwatch_actions_total", ("result", "not_recorded")),
        0.0
    );
    assert!(common::events(&d.audit(), "warning").is_empty());
    // Space returns long enough for the warning to be recorded; then the disk fills again.
    set_file_size_limit(d.pid(), None);
    d.await_sample(LIMIT, |_| !common::events(&d.audit(), "warning").is_empty());
    set_file_size_limit(d.pid(), Some(0));
    // The action falls due again and again, and never runs while nothing can be recorded.
    let s = d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_actions_total", ("result", "not_recorded")) >= 3.0
    });
    assert!(counter(&s, "gpuwatch_state_errors_total", ("op", "save")) >= 3.0);
    assert!(!marker.exists(), "the action ran without its record");
    assert_eq!(
        counter(&s, "gpuwatch_actions_total", ("result", "done")),
        0.0
    );
    assert!(d.is_running());

    // Space returns: the action runs, once.
    set_file_size_limit(d.pid(), None);
    let s = d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_actions_total", ("result", "done")) >= 1.0
    });
    assert_eq!(
        counter(&s, "gpuwatch_actions_total", ("result", "done")),
        1.0
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n");
    let audit = d.audit();
    let attempts = common::events(&audit, "action_attempt");
    assert_eq!(attempts.len(), 1, "{audit:?}");
}

/// Dry-run is a rehearsal: with the audit log unwritable (here a directory stands in its
/// place, while state.json saves fine) it withholds the action as enforcement would, and says
/// so, rather than report "would run".
#[test]
fn dry_run_withholds_an_unrecorded_action_as_enforcement_would() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = format!(
        "[actions]\nboot_grace = \"0s\"\nwarning = \"10s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 2\naction = \"exec\"\ncommand = [\"/bin/true\"]\n",
        state = state.display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    // The warning is on record; then the audit log goes (a directory in its place).
    d.await_sample(LIMIT, |_| !common::events(&d.audit(), "warning").is_empty());
    std::fs::remove_file(state.join("audit.jsonl")).unwrap();
    std::fs::create_dir(state.join("audit.jsonl")).unwrap();
    let s = d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_actions_total", ("result", "not_recorded")) >= 2.0
    });
    assert_eq!(
        counter(&s, "gpuwatch_actions_total", ("result", "dry_run")),
        0.0,
        "{}",
        s.text
    );
    assert!(counter(&s, "gpuwatch_state_errors_total", ("op", "audit")) >= 2.0);
    assert!(
        d.log().contains("in dry-run, as enforcement would"),
        "{}",
        d.log()
    );
}

/// Budget "b" has sent no alert.
fn assert_no_alert_sent(s: &common::Scrape) {
    assert_eq!(
        counter(s, "gpuwatch_budget_alerts_total", ("budget", "b")),
        0.0,
        "an alert was sent without its record:\n{}",
        s.text
    );
}

/// Budget "b" alerts once on actual spend and once on the forecast, each on record.
fn await_one_alert_per_basis(d: &Daemon) {
    let s = d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_budget_alerts_total", ("budget", "b")) >= 2.0
    });
    let audit = d.audit();
    let alerts = common::events(&audit, "budget_alert");
    let mut bases: Vec<&str> = alerts.iter().filter_map(|a| a["basis"].as_str()).collect();
    bases.sort_unstable();
    assert_eq!(bases, ["actual", "forecast"], "{audit:?}");
    assert_eq!(
        counter(&s, "gpuwatch_budget_alerts_total", ("budget", "b")),
        2.0
    );
}

/// A budget alert is recorded before it is sent: while `state.json` cannot be made durable the
/// alert is withheld, and once the disk recovers it is sent, once.
#[test]
fn with_a_full_disk_no_budget_alert_is_sent_until_its_record_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    // $1 a second against a $4 budget: half of it is spent two seconds in.
    let config = format!(
        "[actions]\nboot_grace = \"0s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [cost]\nhourly_price_usd = 3600.0\n\
         [[budgets]]\nname = \"b\"\nlimit_usd = 4.0\nthresholds = [0.5]\n",
        state = dir.path().join("state").display(),
    );
    let mut d = Daemon::start_in(dir, IDLE2, &config);
    set_file_size_limit(d.pid(), Some(0));
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_spend_dollars").get(s).unwrap_or(0.0) >= 3.0
    });
    assert!(counter(&s, "gpuwatch_state_errors_total", ("op", "save")) >= 1.0);
    assert_no_alert_sent(&s);

    // Space returns: the threshold alerts once on actual spend and once on the forecast.
    set_file_size_limit(d.pid(), None);
    await_one_alert_per_basis(&d);
    assert!(d.is_running());
}

/// A budget alert whose audit record cannot be written (a directory stands where the audit
/// log goes, while state.json saves fine) is withheld, not sent; once the audit log can be
/// written, it is sent, once for each basis.
#[test]
fn a_budget_alert_without_its_audit_record_is_withheld() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::create_dir(state.join("audit.jsonl")).unwrap();
    let config = format!(
        "[actions]\nboot_grace = \"0s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [cost]\nhourly_price_usd = 3600.0\n\
         [[budgets]]\nname = \"b\"\nlimit_usd = 4.0\nthresholds = [0.5]\n",
        state = state.display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    let s = d.await_scrape(LIMIT, |s| {
        metric("gpuwatch_spend_dollars").get(s).unwrap_or(0.0) >= 3.0
    });
    assert!(counter(&s, "gpuwatch_state_errors_total", ("op", "audit")) >= 1.0);
    assert_no_alert_sent(&s);
    d.await_log(LIMIT, "cannot write the audit log");
    assert!(!d.log().contains("spend is at"), "{}", d.log());

    std::fs::remove_dir(state.join("audit.jsonl")).unwrap();
    await_one_alert_per_basis(&d);
}

/// An `alert` action is withheld without its record, as every action is: the warning is on
/// record, then the audit log goes (a directory in its place); the alert is not sent (not
/// logged, not posted) until it can be recorded, and then it is.
#[test]
fn an_alert_action_without_its_record_is_withheld() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = format!(
        "[sampling]\ninterval = \"200ms\"\n\
         [actions]\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 1\naction = \"alert\"\n",
        state = state.display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    d.await_sample(LIMIT, |_| !common::events(&d.audit(), "warning").is_empty());
    std::fs::remove_file(state.join("audit.jsonl")).unwrap();
    std::fs::create_dir(state.join("audit.jsonl")).unwrap();
    d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_actions_total", ("result", "not_recorded")) >= 1.0
    });
    assert!(!d.log().contains("breached: GPUs idle"), "{}", d.log());
    std::fs::remove_dir(state.join("audit.jsonl")).unwrap();
    d.await_log(LIMIT, "breached: GPUs idle");
}

/// An audit log that cannot be written fails on every sample while a rule keeps trying to
/// warn: it is said once (then once a minute, with a count), and every failure is counted.
#[test]
fn an_unwritable_audit_log_is_said_once_not_on_every_sample() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::create_dir(state.join("audit.jsonl")).unwrap();
    let config = format!(
        "[sampling]\ninterval = \"200ms\"\n\
         [actions]\nboot_grace = \"0s\"\nwarning = \"10s\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 1\naction = \"alert\"\n",
        state = state.display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_state_errors_total", ("op", "audit")) >= 10.0
    });
    let log = d.log();
    assert_eq!(
        log.matches("cannot write the audit log").count(),
        1,
        "{log}"
    );
    // Once it can be written, that is said too.
    std::fs::remove_dir(state.join("audit.jsonl")).unwrap();
    d.await_log(LIMIT, "the audit log is written again");
}

#[test]
fn a_webhook_url_never_reaches_the_log() {
    // A closed port (bound, never listening, so that nothing else takes it): every post is
    // refused, and reqwest's error would carry the URL.
    let (_closed, port) = common::closed_port();
    let secret = "T0SECRET/B0SECRET/xoxb-SECRET";
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[actions]\nstate_dir = \"{state}\"\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\n\
         webhook_url = \"http://user:pass-SECRET@127.0.0.1:{port}/services/{secret}?token=SECRET\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 2\naction = \"alert\"\n",
        state = dir.path().join("state").display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_actions_total", ("result", "done")) >= 1.0
    });
    // The notifier logs the failed delivery on its own, after the action is counted.
    let log = d.await_log(LIMIT, "cannot reach the webhook");
    assert!(log.contains(&format!("127.0.0.1:{port}")), "{log}");
    assert!(!log.contains("SECRET"), "{log}");
    let audit = std::fs::read_to_string(d.dir.path().join("state/audit.jsonl")).unwrap_or_default();
    assert!(!audit.contains("SECRET"), "{audit}");
}

/// The audit records that parse; a line torn by a kill is skipped (and never merges with the
/// next record, which starts on a line of its own).
fn audit_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn two_hundred_kills_lose_no_state_and_repeat_no_action() {
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let marker = root.path().join("acted");
    std::fs::write(root.path().join("scenario.toml"), IDLE2).unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[nvml]\nlibrary = \"{lib}\"\n\
         [sampling]\ninterval = \"20ms\"\ntimeout = \"2s\"\n[cost]\nhourly_price_usd = 3600\n\
         [actions]\nmode = \"enforce\"\nboot_grace = \"0s\"\nwarning = \"300ms\"\nwall = false\nstate_dir = \"{state}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 1\naction = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"echo x >> {marker}\"]\n",
        lib = common::fake_library().display(),
        state = state.display(),
        marker = marker.display(),
    );
    // A small deterministic generator for the kill points: reproducible, and no extra crate.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    let mut last_spent = 0.0f64;
    let started = Instant::now();
    for kill in 0..200 {
        let mut d = Daemon::start_with(common::reuse_dir(root.path()), &config);
        std::thread::sleep(Duration::from_millis(next() % 150));
        d.kill();
        drop(d);
        // The state reads, whole, after every kill.
        let path = state.join("state.json");
        if path.exists() {
            let text = std::fs::read_to_string(&path).unwrap();
            let p: gpuwatch::state::Persisted = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("kill {kill}: state.json is corrupt ({e}): {text}"));
            // Spend never goes backwards: nothing saved is lost.
            assert!(
                p.ledger.spent + 1e-9 >= last_spent,
                "kill {kill}: spend went from {last_spent} to {}",
                p.ledger.spent
            );
            last_spent = p.ledger.spent;
        }
        assert!(!state.join("state.json.corrupt").exists(), "kill {kill}");
        assert!(started.elapsed() < Duration::from_secs(600));
    }
    assert!(last_spent > 0.0, "no spend was ever saved");
    let audit = audit_lines(&state.join("audit.jsonl"));
    let warnings = common::events(&audit, "warning").len();
    let attempts = common::events(&audit, "action_attempt").len();
    let ran = std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .lines()
        .count();
    // An action runs only after its record, and each warning leads to at most one attempt: an
    // action marked in flight is never sent again after a kill.
    assert!(ran <= attempts, "{ran} runs for {attempts} attempts");
    assert!(
        attempts <= warnings,
        "{attempts} attempts for {warnings} warnings"
    );
    assert!(attempts > 0, "no action was ever attempted in 200 lives");
    // Temporary files orphaned by a kill are cleared at the next start: one at most remains.
    let orphans = state
        .read_dir()
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with(".state.json.") && name.ends_with(".tmp")
        })
        .count();
    assert!(orphans <= 1, "{orphans} orphaned temporary files");
}

/// Raises this test process's own open-file limit, to hold thousands of connections.
fn raise_own_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the struct we pass.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// One keep-alive HTTP/1.1 connection that GETs a path again and again.
struct KeepAlive {
    stream: std::io::BufReader<TcpStream>,
}

impl KeepAlive {
    fn connect(addr: std::net::SocketAddr) -> KeepAlive {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        KeepAlive {
            stream: std::io::BufReader::new(s),
        }
    }

    /// GETs `path`; returns the status and the body's length.
    fn get(&mut self, path: &str) -> (u16, usize) {
        use std::io::BufRead;
        // One write: a request in pieces meets Nagle and delayed ACKs, 40 ms a request.
        let request = format!("GET {path} HTTP/1.1\r\nHost: gpuwatch\r\n\r\n");
        self.stream.get_mut().write_all(request.as_bytes()).unwrap();
        let mut line = String::new();
        self.stream.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut length = 0;
        loop {
            line.clear();
            self.stream.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).unwrap();
        (status, length)
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The standing load proof: 2,000 idle connections and 500 long-polls held open while 1,000
/// scrapes succeed and an idle rule still warns and acts on time; then 100,000 scrapes with
/// resident memory flat.
#[test]
fn under_load_scrapes_answer_and_the_idle_watch_acts_on_time() {
    raise_own_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"60s\"\n\
         [actions]\nstate_dir = \"{state}\"\nboot_grace = \"0s\"\nwarning = \"2s\"\nwall = false\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 2\naction = \"alert\"\n",
        state = dir.path().join("state").display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    let seq = d.await_sample(LIMIT, |s| s["nvml"]["up"] == true)["seq"]
        .as_u64()
        .unwrap();
    let started = gpuwatch::time::now();
    let _idle = hold_open(d.addr, 2000, b"GET /metr");
    let polls: Vec<TcpStream> = (0..500)
        .filter_map(|_| {
            let mut s = TcpStream::connect(d.addr).ok()?;
            write!(
                s,
                "GET /api/v1/snapshot?after={seq}&timeout=30s HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            .ok()?;
            Some(s)
        })
        .collect();
    assert!(
        polls.len() >= 450,
        "only {} long-polls connected",
        polls.len()
    );

    let mut client = KeepAlive::connect(d.addr);
    let mut took = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let t = Instant::now();
        let (status, len) = client.get("/metrics");
        took.push(t.elapsed());
        assert_eq!(status, 200);
        assert!(len > 1000);
    }
    took.sort();
    let p99 = took[989];
    eprintln!(
        "1,000 scrapes under load: median {:?}, p99 {p99:?}, max {:?}",
        took[500], took[999]
    );
    assert!(p99 < Duration::from_millis(50), "p99 {p99:?}");

    // The idle rule warned and acted on time: 2 periods, then the 2 s warning, plus slack.
    let s = d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_actions_total", ("result", "done")) >= 1.0
    });
    let audit = d.audit();
    let action = common::events(&audit, "action_attempt")[0];
    let at = gpuwatch::time::parse_rfc3339(action["time"].as_str().unwrap()).unwrap();
    assert!(
        at - started < 10.0,
        "acted {:.1} s after the load began",
        at - started
    );
    // The connection table holds at most 256; the gauge counts an evicted connection until its
    // task has closed it, so a few evictions may be in flight when it is read.
    let open = metric("gpuwatch_http_connections_open").get(&s).unwrap();
    assert!(open <= 256.0 + 16.0, "{open} connections open");
    drop(polls);

    // 100,000 scrapes on one connection: resident memory stays flat.
    for _ in 0..2_000 {
        client.get("/metrics");
    }
    let before = rss_kib(d.pid());
    for i in 0..100_000 {
        // A connection lives at most five minutes: a fresh one every 10,000 scrapes.
        if i % 10_000 == 0 {
            client = KeepAlive::connect(d.addr);
        }
        let (status, _) = client.get("/metrics");
        assert_eq!(status, 200);
    }
    let after = rss_kib(d.pid());
    eprintln!("RSS before 100,000 scrapes {before} KiB, after {after} KiB");
    assert!(
        after <= before + 1024,
        "RSS grew from {before} to {after} KiB"
    );
}

#[test]
fn a_webhook_that_never_answers_does_not_delay_decisions() {
    // Accepts connections and never answers: each post waits for its whole timeout.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hole.incoming().take(100) {
            held.push(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[actions]\nstate_dir = \"{state}\"\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\n\
         webhook_url = \"http://127.0.0.1:{port}/hook\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\nthreshold = 0.05\n\
         period = \"1s\"\nevaluation_periods = 2\naction = \"alert\"\n",
        state = dir.path().join("state").display(),
    );
    let d = Daemon::start_in(dir, IDLE2, &config);
    d.await_scrape(LIMIT, |s| {
        counter(s, "gpuwatch_actions_total", ("result", "done")) >= 1.0
    });
    let audit = d.audit();
    let warning = common::events(&audit, "warning")[0];
    let attempt = common::events(&audit, "action_attempt")[0];
    let due = gpuwatch::time::parse_rfc3339(warning["due_at"].as_str().unwrap()).unwrap();
    let at = gpuwatch::time::parse_rfc3339(attempt["time"].as_str().unwrap()).unwrap();
    // A post that hangs for its 10 s timeout inside the loop would push the action that far.
    assert!(
        at - due < 5.0,
        "the action came {:.1} s after it was due",
        at - due
    );
}

/// What can be planted where gpuwatch expects a regular file.
#[derive(Debug, Clone, Copy)]
enum Planted {
    Fifo,
    Socket,
    Directory,
    /// `/dev/zero`: a character device node (a link to it where nodes cannot be made).
    Zero,
}

const PLANTED: [Planted; 4] = [
    Planted::Fifo,
    Planted::Socket,
    Planted::Directory,
    Planted::Zero,
];

/// Replaces whatever is at `path` with `what`.
fn plant(path: &std::path::Path, what: Planted) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir_all(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    match what {
        // SAFETY: a valid NUL-terminated path; the call reads nothing else of ours.
        Planted::Fifo => assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0),
        Planted::Socket => drop(std::os::unix::net::UnixListener::bind(path).unwrap()),
        Planted::Directory => std::fs::create_dir(path).unwrap(),
        Planted::Zero => {
            let dev = libc::makedev(1, 5);
            // SAFETY: as above.
            if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, dev) } != 0 {
                std::os::unix::fs::symlink("/dev/zero", path).unwrap();
            }
        }
    }
}

/// Puts back a regular file with `contents` where something was planted.
fn unplant(path: &std::path::Path, contents: &[u8]) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir_all(path);
    std::fs::write(path, contents).unwrap();
}

#[test]
fn more_connections_than_open_files_allow_are_refused_at_start() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_connections = 1000\n",
    )
    .unwrap();
    let limited = |files: u64| {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.args(["run", "--config"]).arg(&config);
        // SAFETY: setrlimit is async-signal-safe and reads only the struct on this stack.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: files,
                    rlim_max: files,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    };
    // 1000 connections and the daemon's other files do not fit in 1024.
    let (code, _, stderr) = bounded_run(&mut limited(1024));
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("server.max_connections: 1000"), "{stderr}");
    // They fit in 4096: the daemon starts serving (and is stopped here).
    let mut child = limited(4096)
        .envs(common::aws::SAFE_ENV.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // It prints one line to stdout once it serves.
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    for line in std::io::BufRead::lines(stdout) {
        let line = line.unwrap();
        if line.contains("listening on") {
            break;
        }
        seen.push(line);
        assert!(seen.len() < 200, "{seen:?}");
    }
    assert_eq!(child.try_wait().unwrap(), None, "{seen:?}");
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs gpuwatch with `args` and waits at most 20 s: its exit code, stdout and stderr. A hang
/// fails the test.
fn bounded(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    bounded_run(std::process::Command::new(common::BIN).args(args))
}

/// Runs `cmd` (gpuwatch) as `bounded` does.
fn bounded_run(cmd: &mut std::process::Command) -> (Option<i32>, String, String) {
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut child = cmd
        .envs(common::aws::SAFE_ENV.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("gpuwatch {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every file an admin names (config, rules, web config, certificate, key, trace): a FIFO, a
/// socket, a directory or `/dev/zero` there is an error that names the path, at once, for the
/// daemon, `check-config`, `hold`, `audit` and `status` alike (exit 64), never a hang.
#[test]
fn nothing_but_a_regular_file_is_read_as_config_certificate_or_trace() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    common::certs::protect(dir.path());
    let config = format!(
        "rules_file = \"rules.toml\"\n[nvml]\nlibrary = \"{}\"\n\
         [server]\nlisten = \"127.0.0.1:0\"\nweb_config_file = \"web-config.yml\"\n\
         [actions]\nstate_dir = \"{}\"\n",
        common::fake_library().display(),
        p("state").display()
    );
    std::fs::write(p("gpuwatch.toml"), &config).unwrap();
    std::fs::write(p("rules.toml"), "rules = []\n").unwrap();
    std::fs::write(p("trace.csv"), "0,0,0.5\n").unwrap();
    let config = p("gpuwatch.toml");
    // The setup is sound: check-config passes before anything is planted.
    let (code, _, err) = bounded(&["check-config".as_ref(), config.as_os_str()]);
    assert_eq!(code, Some(0), "{err}");
    for name in [
        "gpuwatch.toml",
        "rules.toml",
        "web-config.yml",
        "server.crt",
        "server.key",
    ] {
        let keep = std::fs::read(p(name)).unwrap();
        for what in PLANTED {
            plant(&p(name), what);
            let c = config.as_os_str();
            for args in [
                vec!["check-config".as_ref(), c],
                vec!["run".as_ref(), "--config".as_ref(), c],
                vec!["hold".as_ref(), "1h".as_ref(), "--config".as_ref(), c],
                vec!["audit".as_ref(), "--config".as_ref(), c],
                vec![
                    "status".as_ref(),
                    "--config".as_ref(),
                    c,
                    "--state-dir".as_ref(),
                    c,
                ],
            ] {
                let (code, _, err) = bounded(&args);
                // `hold` and `audit` read only what names the state directory: a broken rules
                // file, web config or certificate never keeps an operator from holding.
                let command = args[0].to_str().unwrap_or_default();
                if matches!(command, "hold" | "audit") && name != "gpuwatch.toml" {
                    let want = if command == "hold" { 0 } else { 66 };
                    assert_eq!(code, Some(want), "{name} as {what:?}, {args:?}: {err}");
                    continue;
                }
                assert_eq!(code, Some(64), "{name} as {what:?}, {args:?}: {err}");
                assert!(err.contains(name), "{name} as {what:?}, {args:?}: {err}");
            }
        }
        unplant(&p(name), &keep);
    }
    for what in PLANTED {
        plant(&p("trace.csv"), what);
        let (code, _, err) = bounded(&[
            "simulate".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--trace".as_ref(),
            p("trace.csv").as_os_str(),
        ]);
        assert_eq!(code, Some(66), "trace as {what:?}: {err}");
        assert!(err.contains("trace.csv"), "{what:?}: {err}");
    }
}

/// A rule that would act on the idle GPUs at once, with its state in `state`.
fn config_for(state: &std::path::Path) -> String {
    format!(
        "[actions]\nboot_grace = \"0s\"\nwarning = \"1s\"\nwall = false\nstate_dir = \"{}\"\n\
         [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 1\naction = \"exec\"\ncommand = [\"/bin/true\"]\n",
        state.display()
    )
}

/// The state directory's files: a FIFO, a socket, a directory or `/dev/zero` in place of
/// `hold.json`, `audit.jsonl` or `state.json` is reported with its path and survived. The
/// daemon's decision loop goes on (it saves its state sample after sample), and
/// `status --state-dir`, `hold` and `audit` answer at once.
#[test]
fn nothing_in_the_state_directory_wedges_a_decision_or_a_command() {
    for what in PLANTED {
        // hold.json and audit.jsonl, under the running daemon.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        plant(&state.join("hold.json"), what);
        plant(&state.join("audit.jsonl"), what);
        let d = Daemon::start_in(dir, IDLE2, &config_for(&state));
        // The loop reads the hold at every step: an unreadable one holds, and is shown.
        let s = d.await_scrape(LIMIT, |s| {
            metric("gpuwatch_hold_until_timestamp_seconds")
                .label("reason", "unreadable file")
                .get(s)
                .is_some()
                && counter(s, "gpuwatch_state_errors_total", ("op", "audit")) >= 1.0
        });
        metric("gpuwatch_hold_until_timestamp_seconds")
            .label("source", "local")
            .value(f64::INFINITY)
            .assert_in(&s);
        assert_eq!(
            counter(&s, "gpuwatch_actions_total", ("result", "done")),
            0.0
        );
        // It goes on deciding: the state is saved again as samples come.
        let saved = || {
            std::fs::metadata(state.join("state.json"))
                .unwrap()
                .modified()
                .unwrap()
        };
        let first = saved();
        let seq = d.await_sample(LIMIT, |_| true)["seq"].as_u64().unwrap();
        d.await_sample(LIMIT, |s| s["seq"].as_u64().unwrap() >= seq + 3);
        assert!(
            saved() > first,
            "{what:?}: state.json no longer saved\n{}",
            d.log()
        );
        let status = d.get("/api/v1/status").json();
        let reason = status["holds"][0]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(reason.contains("hold.json"), "{what:?}: {status}");
        assert_eq!(d.get("/-/healthy").status, 200, "{what:?}");

        // The commands, beside it.
        let config = d.dir.path().join("gpuwatch.toml");
        let (code, _, err) = bounded(&["audit".as_ref(), "--config".as_ref(), config.as_os_str()]);
        assert!(err.contains("audit.jsonl"), "audit, {what:?}: {err}");
        // Reported, not read, and the exit status says the listing is not whole.
        assert_eq!(code, Some(66), "audit, {what:?}: {err}");
        let (_, out, err) = bounded(&[
            "status".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--state-dir".as_ref(),
            state.as_os_str(),
        ]);
        assert!(out.contains("hold.json"), "status, {what:?}: {out}{err}");
        drop(d);

        // state.json, for a daemon starting and for status --state-dir.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        plant(&state.join("state.json"), what);
        let d = Daemon::start_in(dir, IDLE2, &config_for(&state));
        let s = d.await_scrape(LIMIT, |s| {
            counter(s, "gpuwatch_state_errors_total", ("op", "load")) >= 2.0
        });
        assert_eq!(
            counter(&s, "gpuwatch_actions_total", ("result", "done")),
            0.0
        );
        assert_eq!(d.get("/-/healthy").status, 200, "{what:?}");
        assert!(d.log().contains("state.json"), "{}", d.log());
        let config = d.dir.path().join("gpuwatch.toml");
        let (code, _, err) = bounded(&[
            "status".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--state-dir".as_ref(),
            state.as_os_str(),
        ]);
        assert_eq!(code, Some(3), "status, {what:?}: {err}");
        assert!(err.contains("state.json"), "{what:?}: {err}");
        // `hold` writes its hold.json whatever stands in for state.json.
        let (code, _, err) = bounded(&[
            "hold".as_ref(),
            "1h".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ]);
        assert_eq!(code, Some(0), "hold, {what:?}: {err}");
    }
}
