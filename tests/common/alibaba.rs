//! Alibaba Cloud test harness: the fake instance metadata service (in security hardening mode)
//! and ECS API (signature V3) of `tests/alibaba/fake_alibaba.py` (written from Alibaba's
//! documents), one process per test, and the daemon's config to point at it.

use std::net::SocketAddr;
use std::path::Path;

use serde_json::Value;

use super::fake::Process;

/// The fake, stopped (by PID) when dropped.
pub struct Fake {
    pub metadata: SocketAddr,
    pub ecs: SocketAddr,
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
        let process = Process::start("alibaba/fake_alibaba.py", 1);
        Fake {
            metadata: process.ports[0],
            ecs: process.ports[1],
            process,
        }
    }

    /// The ECS calls that change something (any action but a `Describe*`), by action, in order.
    pub fn mutations(&self) -> Vec<String> {
        self.actions()
            .into_iter()
            .filter(|a| !a.starts_with("Describe"))
            .collect()
    }

    /// Every ECS call's action, in order.
    pub fn actions(&self) -> Vec<String> {
        self.process
            .calls("ecs")
            .iter()
            .map(|c| c["action"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The ECS calls of `action`, in order.
    pub fn calls_of(&self, action: &str) -> Vec<Value> {
        self.process
            .calls("ecs")
            .into_iter()
            .filter(|c| c["action"] == action)
            .collect()
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
provider = "alibaba"
imds_endpoint = "http://{metadata}"
endpoint_url = "http://{ecs}"
poll_interval = "200ms"
tag_poll_interval = "200ms"
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
            ecs = self.ecs,
            state = dir.join("state").display(),
        )
    }
}

/// The fake's instance.
pub const INSTANCE: &str = "i-bp67acfmxazb4ph0001";

/// The tags of a `TagResources` call, from its `Tag.N.Key` and `Tag.N.Value` parameters.
pub fn tags_of(call: &Value) -> Vec<(String, String)> {
    let q = &call["query"];
    (1..)
        .map_while(|n| {
            let key = q[format!("Tag.{n}.Key")].as_str()?;
            let value = q[format!("Tag.{n}.Value")].as_str().unwrap_or_default();
            Some((key.to_string(), value.to_string()))
        })
        .collect()
}

impl super::fake::Cloud for Fake {
    fn config(&self, dir: &Path, actions: &str, extra: &str) -> String {
        Fake::config(self, dir, actions, extra)
    }
}
