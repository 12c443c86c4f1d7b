//! TLS and basic auth from a web configuration file in the exporter toolkit's format: who gets
//! in, who is refused, and a certificate replaced on disk without a restart.

mod common;

use std::path::Path;
use std::process::Command;

use common::certs::{protect, tls_get, Ca, Issued, PASSWORD, USER};
use common::Daemon;

/// How long a line the daemon logged may take to reach the test's copy of its log.
const LOG_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

const BUSY: &str = "[[gpu]]\nutilization = 90\n";

struct Setup {
    daemon: Daemon,
    ca: std::path::PathBuf,
    ca_issuer: Ca,
    client: Issued,
    expired: Issued,
}

/// A daemon behind the web config that `certs::protect` writes.
fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let p = protect(dir.path());
    let daemon = Daemon::start_in(
        dir,
        BUSY,
        "[server]\nlisten = \"127.0.0.1:0\"\nweb_config_file = \"web-config.yml\"\n",
    );
    Setup {
        daemon,
        ca: p.ca,
        ca_issuer: p.issuer,
        client: p.client,
        expired: p.expired,
    }
}

#[test]
fn only_tls_with_the_right_password_gets_in() {
    let s = start();
    let addr = s.daemon.addr;
    s.daemon.await_log(LOG_LIMIT, "listening on https://");
    let right = Some((USER, PASSWORD));

    let ok = tls_get(addr, "/metrics", &s.ca, None, right);
    assert_eq!(ok.status, Some(200), "{:?}", ok.error);
    let ok = tls_get(addr, "/metrics", &s.ca, Some(&s.client), right);
    assert_eq!(ok.status, Some(200), "{:?}", ok.error);

    // Every endpoint follows the same rules, /-/healthy too.
    for path in [
        "/metrics",
        "/-/healthy",
        "/api/v1/snapshot",
        "/api/v1/status",
        "/",
    ] {
        assert_eq!(
            tls_get(addr, path, &s.ca, None, None).status,
            Some(401),
            "{path}"
        );
    }
    // Wrong passwords in a row bar this address from checks a while (429, saying how long):
    // a client that obeys Retry-After then gets its answer.
    for (u, p) in [("prom", "wrong"), ("mallory", "s3cret"), ("prom", "")] {
        let refused = loop {
            let r = tls_get(addr, "/metrics", &s.ca, None, Some((u, p)));
            if r.status != Some(429) {
                break r;
            }
            let wait: u64 = r
                .head
                .lines()
                .find_map(|l| l.strip_prefix("retry-after: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("a 429 without its wait: {}", r.head));
            assert!((1..=32).contains(&wait), "{}", r.head);
            // The protocol's own wait, not a pause to show that nothing happens: this is the
            // client obeying Retry-After, as the 429 asks, and no event marks the bar's end
            // but the time it names (an earlier try only gets another 429).
            std::thread::sleep(std::time::Duration::from_secs(wait));
        };
        assert_eq!(refused.status, Some(401), "{u}:{p}");
    }
    // No TLS at all: no HTTP answer.
    if let Ok(r) = common::try_get(addr, "/metrics") {
        assert_ne!(r.status, 200, "plain HTTP was served");
    }
    // An expired client certificate is refused in the handshake, even with the password.
    let old = tls_get(addr, "/metrics", &s.ca, Some(&s.expired), right);
    assert_eq!(
        old.status, None,
        "an expired certificate got {:?}",
        old.status
    );

    // The web config's headers are on every answer, refusals too.
    let scrape = tls_get(addr, "/metrics", &s.ca, None, right);
    assert!(
        scrape.head.contains("x-content-type-options: nosniff"),
        "{}",
        scrape.head
    );
    let refused = tls_get(addr, "/metrics", &s.ca, None, None);
    assert!(
        refused.head.contains("www-authenticate: basic"),
        "{}",
        refused.head
    );
    assert!(
        refused.head.contains("x-content-type-options: nosniff"),
        "{}",
        refused.head
    );
}

#[test]
fn a_certificate_replaced_on_disk_is_served_without_a_restart() {
    let s = start();
    let addr = s.daemon.addr;
    let right = Some((USER, PASSWORD));
    let first = tls_get(addr, "/-/healthy", &s.ca, None, right);
    assert_eq!(first.status, Some(200), "{:?}", first.error);
    let dir = s.daemon.dir.path();
    let renewed = s.ca_issuer.issue(dir, "server", false, false);
    assert_ne!(first.server_cert.as_deref(), Some(renewed.der.as_slice()));
    // A handshake takes the certificate loaded last and asks for a check of the files, which
    // runs beside it: a handshake or two after the renewal, the new one is served.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let next = tls_get(addr, "/-/healthy", &s.ca, None, right);
        assert_eq!(next.status, Some(200), "{:?}", next.error);
        if next.server_cert.as_deref() == Some(renewed.der.as_slice()) {
            break;
        }
        assert_eq!(next.server_cert, first.server_cert, "neither old nor new");
        assert!(
            std::time::Instant::now() < deadline,
            "the renewed certificate was never served"
        );
    }
    assert!(s.daemon.log().contains("reloaded the TLS certificate"));
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_fifo_or_a_huge_file_as_the_certificate_never_stalls_a_handshake() {
    let s = start();
    let addr = s.daemon.addr;
    let right = Some((USER, PASSWORD));
    let first = tls_get(addr, "/-/healthy", &s.ca, None, right);
    assert_eq!(first.status, Some(200), "{:?}", first.error);
    let cert = s.daemon.dir.path().join("server.crt");
    let huge = "-----BEGIN CERTIFICATE-----\n".to_string() + &"A".repeat(2 << 20);
    for plant in ["fifo", "huge"] {
        std::fs::remove_file(&cert).unwrap();
        match plant {
            "fifo" => mkfifo(&cert),
            _ => std::fs::write(&cert, &huge).unwrap(),
        }
        // Each handshake asks for a check of the changed file; none waits on it, and the
        // certificate that worked is still served.
        for _ in 0..5 {
            let started = std::time::Instant::now();
            let next = tls_get(addr, "/metrics", &s.ca, None, right);
            assert_eq!(next.status, Some(200), "{plant}: {:?}", next.error);
            assert_eq!(next.server_cert, first.server_cert, "{plant}");
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "{plant}: {:?}",
                started.elapsed()
            );
        }
    }
    // The checks ran beside the handshakes; their warnings reach the log a moment later.
    s.daemon
        .await_log(LOG_LIMIT, "is a FIFO, not a regular file");
    s.daemon.await_log(LOG_LIMIT, "is larger than 1 MiB");
    // And the daemon still stops when asked.
    s.daemon.terminate();
    let mut d = s.daemon;
    assert!(d.wait_exit(std::time::Duration::from_secs(20)).is_some());
}

#[test]
fn a_bad_web_config_exits_64_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let check = |web: &str| -> (Option<i32>, String) {
        std::fs::write(dir.path().join("web.yml"), web).unwrap();
        let config = dir.path().join("gpuwatch.toml");
        std::fs::write(&config, "[server]\nweb_config_file = \"web.yml\"\n").unwrap();
        let out = Command::new(common::BIN)
            .arg("check-config")
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let web = |rest: &str| format!("tls_server_config:\n{rest}");
    for (text, want) in [
        (
            web("  cert_file: missing.crt\n  key_file: missing.key\n"),
            "server.web_config_file: ",
        ),
        (
            web("  cert_file: missing.crt\n  key_file: missing.key\n"),
            "missing.crt",
        ),
        (
            web("  cert_file: a\n  key_file: b\n  min_version: TLS11\n"),
            "tls_server_config.min_version: \"TLS11\" is not supported",
        ),
        (
            "basic_auth_users:\n  prom: not-a-hash\n".to_string(),
            "basic_auth_users.prom: is not a bcrypt hash",
        ),
        (
            "tls_server_confg:\n  cert_file: a\n".to_string(),
            "unknown field \"tls_server_confg\"",
        ),
    ] {
        let (code, err) = check(&text);
        assert_eq!(code, Some(64), "{text}\n{err}");
        assert!(err.contains(want), "{text}\nwant {want}\ngot {err}");
        assert!(
            err.contains(&Path::new("web.yml").display().to_string()),
            "{err}"
        );
    }
    let missing = dir.path().join("gpuwatch.toml");
    std::fs::write(&missing, "[server]\nweb_config_file = \"nowhere.yml\"\n").unwrap();
    let out = Command::new(common::BIN)
        .arg("check-config")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere.yml: cannot read"));
}

/// A daemon on plain HTTP with basic auth for `USER` (a bcrypt hash of cost 10, as
/// `htpasswd -nBC 10` makes) and `extra` in its web config.
fn with_basic_auth(extra: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let hash = bcrypt::hash(PASSWORD, 10).unwrap();
    std::fs::write(
        dir.path().join("web-config.yml"),
        format!("basic_auth_users:\n  {USER}: {hash}\n{extra}"),
    )
    .unwrap();
    Daemon::start_in(
        dir,
        BUSY,
        "[server]\nlisten = \"127.0.0.1:0\"\nweb_config_file = \"web-config.yml\"\n",
    )
}

/// A GET over a fresh connection from `source` (a loopback address), with basic auth: the
/// status, or `None` when the connection failed.
async fn get_from(
    source: std::net::IpAddr,
    to: std::net::SocketAddr,
    path: &str,
    auth: Option<(&str, &str)>,
) -> Option<u16> {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(std::net::SocketAddr::new(source, 0)).ok()?;
    let mut s = socket.connect(to).await.ok()?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if let Some((u, p)) = auth {
        let enc = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        request.push_str(&format!("Authorization: Basic {enc}\r\n"));
    }
    request.push_str("\r\n");
    s.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.ok()?;
    String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// 300 connections sending wrong passwords in a loop cannot lock out a scraper whose password
/// verified before: a guess that finds bcrypt busy is answered at once, never parked on a
/// connection, and the scraper's remembered password goes ahead of every stranger.
#[test]
fn wrong_passwords_in_a_loop_never_lock_out_a_verified_scraper() {
    let d = with_basic_auth("");
    let addr = d.addr;
    let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(
        block_on(get_from(local, addr, "/metrics", Some((USER, PASSWORD)))),
        Some(200)
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answers = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let attack = {
        let (stop, answers, sent) = (stop.clone(), answers.clone(), sent.clone());
        std::thread::spawn(move || {
            block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for _ in 0..300 {
                    let (stop, answers, sent) = (stop.clone(), answers.clone(), sent.clone());
                    tasks.spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        // user prom, password "wrong", on one keep-alive connection while
                        // it lasts.
                        let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic cHJvbTp3cm9uZw==\r\n\r\n";
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                                continue;
                            };
                            let mut buf = vec![0u8; 4096];
                            loop {
                                if stop.load(std::sync::atomic::Ordering::Relaxed)
                                    || s.write_all(request).await.is_err()
                                {
                                    break;
                                }
                                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                match s.read(&mut buf).await {
                                    Ok(n) if n > 0 => {
                                        answers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    }
                                    _ => break,
                                }
                            }
                        }
                    });
                }
                while tasks.join_next().await.is_some() {}
            })
        })
    };
    // The attack is under way before the scrapes start: every connection has guessed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sent.load(std::sync::atomic::Ordering::Relaxed) < 1000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the attack never got going"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut fast = 0;
    let mut slowest = std::time::Duration::ZERO;
    let mut failures = Vec::new();
    for _ in 0..200 {
        let started = std::time::Instant::now();
        let status = block_on(get_from(local, addr, "/metrics", Some((USER, PASSWORD))));
        let took = started.elapsed();
        slowest = slowest.max(took);
        if status == Some(200) && took < std::time::Duration::from_millis(100) {
            fast += 1;
        } else {
            failures.push((status, took));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    attack.join().unwrap();
    println!(
        "{fast} of 200 scrapes answered 200 within 100 ms, the slowest in {slowest:?}, while the attack sent {} guesses and got {} answers",
        sent.load(std::sync::atomic::Ordering::Relaxed),
        answers.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(fast >= 198, "{failures:?}");
}

/// Wrong passwords in a loop from eight addresses, on 20 connections each, cannot keep out a
/// scraper whose password has not verified yet (as after a restart): each failure bars its
/// address from bcrypt for a while, doubling, so the two turns are free again within seconds.
/// Without the bars the eight addresses hold both turns all the time, and the scraper is
/// answered 503 ("too many logins in progress") every time.
#[test]
fn wrong_passwords_from_many_addresses_never_keep_a_new_scraper_out() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let d = with_basic_auth("");
    let addr = d.addr;
    let stop = Arc::new(AtomicBool::new(false));
    // Answers by status: 401 (checked, wrong), 429 (barred), 503 (no turn free).
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let attack = {
        let (stop, counts) = (stop.clone(), counts.clone());
        std::thread::spawn(move || {
            block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for source in 2..10u8 {
                    for _ in 0..20 {
                        let (stop, counts) = (stop.clone(), counts.clone());
                        let from = std::net::IpAddr::from([127, 0, 0, source]);
                        tasks.spawn(async move {
                            while !stop.load(Ordering::Relaxed) {
                                let status =
                                    get_from(from, addr, "/metrics", Some((USER, "wrong"))).await;
                                let i = match status {
                                    Some(401) => 0,
                                    Some(429) => 1,
                                    Some(503) => 2,
                                    _ => continue,
                                };
                                counts[i].fetch_add(1, Ordering::Relaxed);
                            }
                        });
                    }
                }
                while tasks.join_next().await.is_some() {}
            })
        })
    };
    // The attack is under way: every address has failed a few times in a row.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while counts[0].load(Ordering::Relaxed) < 8 * 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the attack never got going"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let mut tries = Vec::new();
    while tries.last() != Some(&Some(200)) && tries.len() < 5 {
        tries.push(block_on(get_from(
            local,
            addr,
            "/metrics",
            Some((USER, PASSWORD)),
        )));
    }
    stop.store(true, Ordering::Relaxed);
    attack.join().unwrap();
    let [checked, barred, busy] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    println!(
        "the scraper got in after {tries:?}; the attack was answered 401 {checked} times, 429 {barred} and 503 {busy}"
    );
    assert_eq!(tries.last(), Some(&Some(200)), "{tries:?}");
    assert!(barred > checked, "{barred} barred, {checked} checked");
}

/// The rate limit is per client address, and a verified password goes ahead of it: a stranger
/// who spends their bucket gets 429, and neither the scraper (on `/-/healthy` too) nor another
/// stranger does.
#[test]
fn one_clients_flood_never_rate_limits_another() {
    let d = with_basic_auth("rate_limit:\n  interval: 1h\n  burst: 5\n");
    let addr = d.addr;
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    block_on(async {
        assert_eq!(
            get_from(ip("127.0.0.1"), addr, "/metrics", Some((USER, PASSWORD))).await,
            Some(200)
        );
        let mut flood = Vec::new();
        for _ in 0..30 {
            flood.push(get_from(ip("127.0.0.2"), addr, "/metrics", None).await);
        }
        assert_eq!(flood[..5], [Some(401); 5], "{flood:?}");
        assert_eq!(flood[5..], [Some(429); 25], "{flood:?}");
        for path in ["/metrics", "/-/healthy"].iter().cycle().take(20) {
            assert_eq!(
                get_from(ip("127.0.0.1"), addr, path, Some((USER, PASSWORD))).await,
                Some(200),
                "{path}"
            );
        }
        assert_eq!(
            get_from(ip("127.0.0.3"), addr, "/-/healthy", None).await,
            Some(401)
        );
    });
}
