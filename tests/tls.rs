//! TLS and basic auth from a web configuration file in the exporter toolkit's format: who gets
//! in, who is refused, and a certificate replaced on disk without a restart.

mod common;

use std::path::Path;
use std::process::Command;

use common::certs::{protect, tls_get, Ca, Issued, PASSWORD, USER};
use common::Daemon;

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
    assert!(s.daemon.log().contains("listening on https://"));
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
    for (u, p) in [("prom", "wrong"), ("mallory", "s3cret"), ("prom", "")] {
        assert_eq!(
            tls_get(addr, "/metrics", &s.ca, None, Some((u, p))).status,
            Some(401),
            "{u}:{p}"
        );
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
    let second = tls_get(addr, "/-/healthy", &s.ca, None, right);
    assert_eq!(second.status, Some(200), "{:?}", second.error);
    assert_eq!(second.server_cert.as_deref(), Some(renewed.der.as_slice()));
    assert!(s.daemon.log().contains("reloaded the TLS certificate"));
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
