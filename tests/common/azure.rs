//! Azure test harness: the fake Instance Metadata Service, Resource Manager and Retail Prices
//! API of `tests/azure/fake_azure.py` (written from Microsoft's documents and REST API
//! specifications), one process per test, and the daemon's config to point at it.

use std::net::SocketAddr;
use std::path::Path;

use serde_json::Value;

use super::fake::Process;

/// The fake, stopped (by PID) when dropped.
pub struct Fake {
    pub imds: SocketAddr,
    pub arm: SocketAddr,
    pub prices: SocketAddr,
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
        let process = Process::start("azure/fake_azure.py", 1);
        Fake {
            imds: process.ports[0],
            arm: process.ports[1],
            prices: process.ports[2],
            process,
        }
    }

    /// The Resource Manager calls that change something (any but GET).
    pub fn mutations(&self) -> Vec<String> {
        self.process.mutations("arm")
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

impl super::fake::Cloud for Fake {
    fn config(&self, dir: &Path, actions: &str, extra: &str) -> String {
        Fake::config(self, dir, actions, extra)
    }
}
