//! A real Alertmanager (Debian's `prometheus-alertmanager`) for the tests: on a free loopback
//! port, with clustering off (it would listen on every address otherwise), killed (by its PID)
//! when dropped.

use std::process::{Command, Stdio};
use std::time::Duration;

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
        let (child, addr) = super::start_server(
            "Alertmanager",
            Duration::from_secs(60),
            |addr| {
                Command::new("prometheus-alertmanager")
                    .arg(format!("--config.file={}", config.display()))
                    .arg(format!("--storage.path={}", dir.path().join("data").display()))
                    .arg(format!("--web.listen-address={addr}"))
                    .arg("--cluster.listen-address=")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("prometheus-alertmanager not found: scripts/test installs Debian's prometheus-alertmanager")
            },
            // Ready, and its API (which a gpuwatch daemon on that port would not have) answers.
            |addr| {
                ["/-/ready", "/api/v2/status"]
                    .iter()
                    .all(|path| super::try_get(addr, path).is_ok_and(|r| r.status == 200))
            },
        );
        Alertmanager {
            addr,
            _child: super::Killed(child),
            _dir: dir,
        }
    }
}
