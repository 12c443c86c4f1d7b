//! `gpuwatch status`, as scripts and monitoring checks use it: its exit status is 0 when all is
//! well, 1 while an action is pending, 2 when NVML or a GPU is down, and 3 when nothing answers.
//! It reads the running daemon (through TLS and basic auth, as the web config asks) or, with
//! `--state-dir`, the state files of a daemon that is down.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::certs::{protect, PASSWORD, USER};
use common::Daemon;

const RULE: &str = "[actions]\nboot_grace = \"0s\"\nwarning = \"1h\"\nwall = false\n\
    [[rules]]\nname = \"idle\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
    threshold = 0.05\nperiod = \"1s\"\nevaluation_periods = 1\naction = \"stop\"\n";

fn status(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(common::BIN)
        .arg("status")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// The rule's config, with its state in `state`.
fn with_state(state: &std::path::Path) -> String {
    RULE.replacen(
        "[actions]\n",
        &format!("[actions]\nstate_dir = \"{}\"\n", state.display()),
        1,
    )
}

fn url(d: &Daemon) -> String {
    format!("http://{}/", d.addr)
}

/// Waits for the watch to have judged the rule (its view is in the status).
fn await_rule(d: &Daemon, pending: bool) {
    d.await_sample(Duration::from_secs(20), |_| {
        let s = d.get("/api/v1/status").json();
        s["rules"][0]["pending"].is_object() == pending && s["rules"][0].is_object()
    });
}

#[test]
fn all_well_exits_0_and_names_an_underfed_gpu() {
    // GPU 0 busy, GPU 1 underfed: 40% with a process.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut d = Daemon::start_in(
        dir,
        "[[gpu]]\nutilization = 90\nprocesses = 1\n[[gpu]]\nutilization = 40\nprocesses = 2\n",
        &with_state(&state),
    );
    await_rule(&d, false);
    let (code, out, err) = status(&["--url", &url(&d)], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(": OK"), "{out}");
    assert!(
        out.contains("Rule idle: ok, 0 of the last 1 periods breach"),
        "{out}"
    );
    assert!(
        out.contains("hint: GPU 1 is underutilized: 40% busy with a process running"),
        "{out}"
    );
    assert!(!out.contains("GPU 0 is underutilized"), "{out}");

    let (code, json, _) = status(&["--url", &url(&d), "--json"], &[]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["health"], "ok");
    assert_eq!(v["gpus"][1]["underutilized"], true);
    assert_eq!(v["gpus"].as_array().unwrap().len(), 2);

    // The daemon goes down: its state files say nothing is pending, but not that all is well.
    d.kill();
    let (code, out, err) = status(&["--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(out.contains("UNKNOWN (daemon down)"), "{out}");
    assert!(out.contains("Rule idle: ok"), "{out}");
}

#[test]
fn a_pending_action_exits_1_with_the_command_that_holds_it_and_the_state_files_say_so_too() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("gpuwatch.toml");
    let mut d = Daemon::start_in(dir, "[[gpu]]\nutilization = 0\n", &with_state(&state));
    await_rule(&d, true);
    let (code, out, err) = status(&["--url", &url(&d)], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("ACTION PENDING"), "{out}");
    assert!(
        out.contains("STOP in ") && out.contains(") unless the GPUs are used again"),
        "{out}"
    );
    let hold = format!(
        "gpuwatch hold 1h --reason \"still in use\" --config {}",
        config.display()
    );
    assert!(out.contains(&hold), "{out}");
    assert!(out.contains("warns: stop at"), "{out}");

    // The command it shows works: the hold shows up in the status.
    let held = Command::new(common::BIN)
        .args(["hold", "1h", "--reason", "still in use", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(held.status.success(), "{held:?}");
    d.await_sample(Duration::from_secs(20), |_| {
        !d.get("/api/v1/status").json()["holds"]
            .as_array()
            .unwrap()
            .is_empty()
    });
    let (_, out, _) = status(&["--url", &url(&d)], &[]);
    assert!(out.contains("Hold (local): until "), "{out}");
    assert!(out.contains(": still in use"), "{out}");

    // The daemon goes down: the state files still tell of the pending action.
    d.kill();
    let (code, out, err) = status(&["--url", &url(&d)], &[]);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(err.contains("cannot reach the daemon"), "{err}");
    let (code, out, err) = status(&["--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(!state.join("state.json.corrupt").exists());
    assert!(out.contains("Rule idle: BREACHING"), "{out}");
    assert!(out.contains("STOP in"), "{out}");
    assert!(out.contains("Hold (local)"), "{out}");
}

#[test]
fn a_lost_gpu_exits_2() {
    let d = Daemon::start(
        "[[gpu]]\nutilization = 90\n[[gpu]]\nutilization = 90\n\
         [[fault]]\nat = \"0s\"\ngpu = 1\nkind = \"lost\"\n",
        "",
    );
    d.await_sample(Duration::from_secs(20), |s| s["nvml"]["up"] == true);
    let (code, out, err) = status(&["--url", &url(&d)], &[]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(out.contains(": DOWN"), "{out}");
    assert!(out.contains("LOST"), "{out}");
}

#[test]
fn it_speaks_tls_and_basic_auth_as_the_web_config_asks() {
    let dir = tempfile::tempdir().unwrap();
    let p = protect(dir.path());
    let config = dir.path().join("gpuwatch.toml");
    let d = Daemon::start_in(
        dir,
        "[[gpu]]\nutilization = 90\n",
        "[server]\nlisten = \"127.0.0.1:0\"\nweb_config_file = \"web-config.yml\"\n",
    );
    let url = format!("https://{}/", d.addr);
    let config = config.to_str().unwrap();
    let ca = p.ca.to_str().unwrap();
    // Without a user: refused before any request, saying what to give.
    let (code, _, err) = status(&["--config", config, "--url", &url, "--cacert", ca], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("--user NAME"), "{err}");
    // A wrong password: the daemon's 401, reported.
    let (code, _, err) = status(
        &[
            "--config", config, "--url", &url, "--cacert", ca, "--user", USER,
        ],
        &[("GPUWATCH_PASSWORD", "wrong")],
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("401"), "{err}");
    // The right one.
    let (code, out, err) = status(
        &[
            "--config", config, "--url", &url, "--cacert", ca, "--user", USER,
        ],
        &[("GPUWATCH_PASSWORD", PASSWORD)],
    );
    assert!(code == Some(0), "{out}{err}");
    assert!(out.contains("NVML: up"), "{out}");
}

/// Under systemd's `DynamicUser=yes` the state directory belongs to the service's user: root's
/// `gpuwatch hold` writes there and hands the file to that user, who must be able to read it
/// (the daemon reads only a hold file of its own user or root).
#[test]
fn root_holds_for_a_daemon_that_runs_as_another_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root can hand a file to another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    // 61234: a user as systemd allocates them for a DynamicUser.
    std::os::unix::fs::chown(&state, Some(61234), Some(61234)).unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(&config, with_state(&state)).unwrap();
    let out = Command::new(common::BIN)
        .args(["hold", "2h", "--reason", "training run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let hold = std::fs::metadata(state.join("hold.json")).unwrap();
    assert_eq!((hold.uid(), hold.gid()), (61234, 61234));
    assert_eq!(
        hold.mode() & 0o077,
        0,
        "readable by others: {:o}",
        hold.mode()
    );

    // A directory others can write is still refused, even to root.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(common::BIN)
        .args(["hold", "2h", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
}

/// A hostile "daemon" on loopback: it answers every connection with a 200 and then `body`
/// forever (never a whole answer). Stops when the test process ends.
fn hostile(body: &'static [u8], chunk_pause: Duration) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = [0u8; 4096];
                let _ = s.read(&mut head);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n");
                // At most 1 GiB, so that even a client without a cap ends.
                for _ in 0..(1usize << 30) / body.len() {
                    if s.write_all(body).is_err() {
                        return;
                    }
                    if !chunk_pause.is_zero() {
                        std::thread::sleep(chunk_pause);
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_hostile_server_gets_a_bounded_read_and_a_bounded_wait() {
    static FLOOD: [u8; 64 * 1024] = [b' '; 64 * 1024];
    let started = std::time::Instant::now();
    let addr = hostile(&FLOOD, Duration::ZERO);
    let (code, _, err) = status(&["--url", &format!("http://{addr}/")], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("more than 4 MiB"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));

    // A drip that never ends: the whole exchange is bounded in time.
    let started = std::time::Instant::now();
    let addr = hostile(b" ", Duration::from_millis(100));
    let (code, _, err) = status(&["--url", &format!("http://{addr}/")], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "{err}");
}

#[test]
fn a_password_never_goes_over_plain_http_beyond_loopback() {
    // Refused before any connection is made (nothing listens there, nothing is sent), however
    // the scheme is spelled.
    for url in ["http://192.0.2.1:9400/", "HTTP://192.0.2.1:9400/"] {
        let (code, _, err) = status(
            &["--url", url, "--user", "prom"],
            &[("GPUWATCH_PASSWORD", "s3cret")],
        );
        assert_eq!(code, Some(3), "{url}: {err}");
        assert!(err.contains("plain HTTP beyond this machine"), "{err}");
        assert!(err.contains("--insecure"), "{err}");
    }
}
