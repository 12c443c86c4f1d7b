//! Azure test harness: the fake Instance Metadata Service, Resource Manager and Retail Prices
//! API of `tests/azure/fake_azure.py` (written from Microsoft's documents and REST API
//! specifications), one process per test, and the daemon's config to point at it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The fake, stopped (by PID) when dropped.
pub struct Fake {
    pub imds: SocketAddr,
    pub arm: SocketAddr,
    pub prices: SocketAddr,
    _child: super::Killed,
}

impl Fake {
    pub fn start() -> Fake {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/azure/fake_azure.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ports: Vec<u16> = line
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("the Azure fake did not start: {line:?}"))
            .split(' ')
            .map(|p| p.parse().unwrap())
            .collect();
        let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        Fake {
            imds: at(ports[0]),
            arm: at(ports[1]),
            prices: at(ports[2]),
            _child: super::Killed(child),
        }
    }

    /// The fake's state, with every call made to it.
    pub fn state(&self) -> Value {
        super::get(self.arm, "/_fake/state").json()
    }

    /// Merges `changes` into the fake's state.
    pub fn set(&self, changes: Value) {
        let body = changes.to_string();
        let mut s = TcpStream::connect(self.arm).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        write!(
            s,
            "POST /_fake/state HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.arm,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    }

    /// The calls made to `service` (`imds`, `arm`, `prices`).
    pub fn calls(&self, service: &str) -> Vec<Value> {
        self.state()["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["service"] == service)
            .cloned()
            .collect()
    }

    /// The Resource Manager calls that change something (any but GET).
    pub fn mutations(&self) -> Vec<String> {
        self.calls("arm")
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

    /// Waits until `cond` holds of the state, for at most `limit`.
    pub fn await_state(&self, limit: Duration, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.state();
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the Azure fake never got there: {s:#}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The fake's VM as instance metadata describes it at start (`compute`), for a test to
    /// change and `set` back.
    pub fn start_state_compute() -> Value {
        serde_json::json!({
            "azEnvironment": "AzurePublicCloud",
            "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d",
            "resourceGroupName": "gpu-rg",
            "name": "gpu-vm-1",
            "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
            "vmSize": "Standard_NC24ads_A100_v4",
            "location": "eastus",
            "zone": "1",
            "priority": "Regular",
            "evictionPolicy": "",
            "osType": "Linux",
            "vmScaleSetName": "",
            "tagsList": [{"name": "team", "value": "ml"}],
            "additionalCapabilities": {"hibernationEnabled": "false"},
        })
    }

    /// The daemon's config on this fake: `[cloud]` and `[cost]` point at it, with `actions` in
    /// `[actions]` and `extra` after.
    pub fn config(&self, dir: &Path, actions: &str, extra: &str) -> String {
        format!(
            r#"[nvml]
library = "{lib}"
[sampling]
interval = "100ms"
timeout = "1s"
[cloud]
provider = "azure"
imds_endpoint = "http://{imds}"
endpoint_url = "http://{arm}"
poll_interval = "200ms"
[cost]
pricing_endpoint_url = "http://{prices}"
[actions]
boot_grace = "0s"
wall = false
retry_for = "60s"
state_dir = "{state}"
{actions}
{extra}
"#,
            lib = super::fake_library().display(),
            imds = self.imds,
            arm = self.arm,
            prices = self.prices,
            state = dir.join("state").display(),
        )
    }
}

/// The path of this fake's VM.
pub const VM: &str = "/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/gpu-rg/providers/Microsoft.Compute/virtualMachines/gpu-vm-1";
