//! A real Alertmanager (Debian's `prometheus-alertmanager`) for the tests: on a free loopback
//! port, with clustering off (it would listen on every address otherwise), killed (by its PID)
//! when dropped.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Alertmanager {
    pub addr: std::net::SocketAddr,
    _child: super::Killed,
    _dir: tempfile::TempDir,
}

impl Alertmanager {
    /// Starts Alertmanager with this configuration and waits until it is ready.
    pub fn start(config_text: &str) -> Alertmanager {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("alertmanager.yml");
        std::fs::write(&config, config_text).unwrap();
        let addr: std::net::SocketAddr =
            format!("127.0.0.1:{}", super::free_port()).parse().unwrap();
        let child = Command::new("prometheus-alertmanager")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-alertmanager not found: scripts/test installs Debian's prometheus-alertmanager");
        let am = Alertmanager {
            addr,
            _child: super::Killed(child),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !super::try_get(addr, "/-/ready").is_ok_and(|r| r.status == 200) {
            assert!(
                Instant::now() < deadline,
                "Alertmanager did not become ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        am
    }
}
