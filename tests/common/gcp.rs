//! Google Cloud test harness: the fake metadata server and Compute Engine API of
//! `tests/gcp/fake_gcp.py` (written from Google's documents and the API's discovery document),
//! one process per test, and the daemon's config to point at it.

use std::net::SocketAddr;
use std::path::Path;

use super::fake::Process;

/// The fake, stopped (by PID) when dropped.
pub struct Fake {
    pub metadata: SocketAddr,
    pub compute: SocketAddr,
    process: Process,
}

impl std::ops::Deref for Fake {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.process
    }
}

impl Fake {
    pub fn start() -> Fake {
        let process = Process::start("gcp/fake_gcp.py", 1);
        Fake {
            metadata: process.ports[0],
            compute: process.ports[1],
            process,
        }
    }

    /// The Compute Engine calls that change something (any but GET).
    pub fn mutations(&self) -> Vec<String> {
        self.process.mutations("compute")
    }

    /// The daemon's config on this fake: `[cloud]` points at it, with `actions` in `[actions]`
    /// and `extra` after.
    pub fn config(&self, dir: &Path, actions: &str, extra: &str) -> String {
        format!(
            r#"[nvml]
library = "{lib}"
[sampling]
interval = "100ms"
timeout = "1s"
[cloud]
provider = "gcp"
imds_endpoint = "http://{metadata}"
endpoint_url = "http://{compute}"
poll_interval = "200ms"
[actions]
boot_grace = "0s"
wall = false
retry_for = "60s"
state_dir = "{state}"
{actions}
{extra}
"#,
            lib = super::fake_library().display(),
            metadata = self.metadata,
            compute = self.compute,
            state = dir.join("state").display(),
        )
    }
}

/// The path of this fake's VM.
pub const VM: &str = "/compute/v1/projects/gpu-project/zones/us-central1-a/instances/gpu-vm-1";

impl super::fake::Cloud for Fake {
    fn config(&self, dir: &Path, actions: &str, extra: &str) -> String {
        Fake::config(self, dir, actions, extra)
    }

    fn rule_name(&self) -> &'static str {
        "Idle 2h"
    }
}
