//! The raw form of the config: serde structs that reject unknown keys, and their defaults.
//! Rules and budgets have files of their own.

use super::*;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    /// A JSON (or TOML) file of more rules, relative to the config file.
    pub rules_file: String,
    pub server: RawServer,
    pub exposition: RawExposition,
    pub kubernetes: RawKubernetes,
    pub slurm: super::slurm::RawSlurm,
    pub node: RawNode,
    pub nvml: RawNvml,
    pub amd: RawAmd,
    pub sampling: RawSampling,
    pub cloud: RawCloud,
    pub actions: RawActions,
    pub vetoes: RawVetoes,
    pub spot: RawSpot,
    pub cost: RawCost,
    /// A cloud's table from before the cloud had `[cloud.<name>]` (read there, with a warning
    /// that names its new place).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloudwatch: Option<toml::Value>,
    pub health: RawHealth,
    #[serde(skip_serializing_if = "super::controller::RawController::is_unset")]
    pub controller: super::controller::RawController,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<RawBudget>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RawRule>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCost {
    /// 0 means: look the price up.
    pub hourly_price_usd: f64,
    pub period: String,
    pub spot_price_refresh: String,
    pub pricing_api: bool,
    pub pricing_endpoint_url: String,
}

/// `[cloud]`: what every cloud shares. Each cloud's own keys are its `[cloud.<name>]` table,
/// which the cloud checks (see `sections.rs`); serde keeps them as written in `clouds`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct RawCloud {
    pub provider: String,
    pub imds_endpoint: String,
    pub endpoint_url: String,
    pub region: String,
    pub poll_interval: String,
    pub tag_poll_interval: String,
    /// Instance tags copied onto `gpuwatch_node_info` as labels.
    pub tag_labels: Vec<String>,
    /// Every other key: the clouds' `[cloud.<name>]` tables, and a cloud's key still written
    /// here from before it had a table.
    #[serde(flatten)]
    pub clouds: toml::Table,
}

impl RawCloud {
    /// `[cloud]`'s own keys, which no cloud's section may take.
    pub const OWN: &'static [&'static str] = &[
        "provider",
        "imds_endpoint",
        "endpoint_url",
        "region",
        "poll_interval",
        "tag_poll_interval",
        "tag_labels",
    ];
}

/// `[exposition]`: which names the GPU series carry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawExposition {
    /// "gpuwatch", "dcgm" or "both".
    pub names: String,
    /// The host label of the DCGM names; empty: `NODE_NAME`, or the machine's hostname.
    pub hostname: String,
    /// That label's name: "hostname" (current dcgm-exporter) or "Hostname" (older releases).
    pub hostname_label: String,
}

impl Default for RawExposition {
    fn default() -> Self {
        RawExposition {
            names: "gpuwatch".to_string(),
            hostname: String::new(),
            hostname_label: "hostname".to_string(),
        }
    }
}

/// `[kubernetes]`: pod attribution through the kubelet.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawKubernetes {
    /// The kubelet's PodResources socket; empty: off.
    pub pod_resources_socket: String,
    pub refresh: String,
}

impl Default for RawKubernetes {
    fn default() -> Self {
        RawKubernetes {
            pod_resources_socket: String::new(),
            refresh: "10s".to_string(),
        }
    }
}

/// `[node]`: what this node is, beyond what the cloud says.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNode {
    /// Static labels on `gpuwatch_node_info`, such as `team = "ml"`.
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawActions {
    pub mode: String,
    pub boot_grace: String,
    pub warning: String,
    pub spot_stop: String,
    pub webhook_url: String,
    /// A file holding the webhook URL, so that the secret can be kept out of this file.
    pub webhook_url_file: String,
    pub wall: bool,
    pub exec_timeout: String,
    pub retry_for: String,
    pub state_dir: String,
    pub audit_max_mib: u64,
    pub audit_keep: u32,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawVetoes {
    pub ssh_sessions: bool,
    pub processes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_uid: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSpot {
    pub interruption_hook: Vec<String>,
    pub hook_timeout: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    pub listen: String,
    pub max_connections: usize,
    pub max_long_polls: usize,
    pub header_read_timeout: String,
    pub stall_timeout: String,
    pub web_config_file: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNvml {
    pub library: String,
}

/// Where AMD GPUs are read from: the amdgpu driver's sysfs files.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAmd {
    /// Look for AMD GPUs at all.
    pub enabled: bool,
    pub sysfs_root: String,
    pub proc_root: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSampling {
    pub interval: String,
    pub timeout: String,
    pub slow_interval: String,
    pub per_process_memory: bool,
    pub process_owners: bool,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            rules_file: String::new(),
            cloud: RawCloud {
                provider: "none".to_string(),
                imds_endpoint: "http://169.254.169.254".to_string(),
                endpoint_url: String::new(),
                region: String::new(),
                poll_interval: "5s".to_string(),
                tag_poll_interval: "1m".to_string(),
                tag_labels: Vec::new(),
                clouds: toml::Table::new(),
            },
            node: RawNode::default(),
            exposition: RawExposition::default(),
            kubernetes: RawKubernetes::default(),
            slurm: super::slurm::RawSlurm::default(),
            health: RawHealth::default(),
            controller: Default::default(),
            actions: RawActions {
                mode: "dry-run".to_string(),
                boot_grace: "15m".to_string(),
                warning: "10m".to_string(),
                spot_stop: "refuse".to_string(),
                webhook_url: String::new(),
                webhook_url_file: String::new(),
                wall: true,
                exec_timeout: "60s".to_string(),
                retry_for: "10m".to_string(),
                state_dir: "/var/lib/gpuwatch".to_string(),
                audit_max_mib: 16,
                audit_keep: 5,
            },
            vetoes: RawVetoes::default(),
            spot: RawSpot {
                interruption_hook: Vec::new(),
                hook_timeout: "60s".to_string(),
            },
            cost: RawCost {
                hourly_price_usd: 0.0,
                period: "month".to_string(),
                spot_price_refresh: "1h".to_string(),
                pricing_api: true,
                pricing_endpoint_url: String::new(),
            },
            cloudwatch: None,
            budgets: Vec::new(),
            rules: Vec::new(),
            server: RawServer {
                listen: "0.0.0.0:9400".to_string(),
                max_connections: 256,
                max_long_polls: 64,
                header_read_timeout: "5s".to_string(),
                stall_timeout: "2m".to_string(),
                web_config_file: String::new(),
            },
            nvml: RawNvml {
                library: "libnvidia-ml.so.1".to_string(),
            },
            amd: RawAmd {
                enabled: true,
                sysfs_root: "/sys".to_string(),
                proc_root: "/proc".to_string(),
            },
            sampling: RawSampling {
                interval: "1s".to_string(),
                timeout: "5s".to_string(),
                slow_interval: "10s".to_string(),
                per_process_memory: false,
                process_owners: false,
            },
        }
    }
}

impl Default for RawServer {
    fn default() -> Self {
        RawConfig::default().server
    }
}

impl Default for RawNvml {
    fn default() -> Self {
        RawConfig::default().nvml
    }
}

impl Default for RawAmd {
    fn default() -> Self {
        RawConfig::default().amd
    }
}

impl Default for RawSampling {
    fn default() -> Self {
        RawConfig::default().sampling
    }
}

impl Default for RawCloud {
    fn default() -> Self {
        RawConfig::default().cloud
    }
}

impl Default for RawActions {
    fn default() -> Self {
        RawConfig::default().actions
    }
}

impl Default for RawCost {
    fn default() -> Self {
        RawConfig::default().cost
    }
}

impl Default for RawSpot {
    fn default() -> Self {
        RawConfig::default().spot
    }
}
