//! `[server]`, `[nvml]`, `[sampling]` and `[exposition]`: where gpuwatch listens, which library
//! it loads, how often it samples, and which names its GPU series carry.

use super::*;

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Open connections at most; see `serve/` for what happens to one more.
    pub max_connections: usize,
    /// `/api/v1/snapshot?after=` long-polls in progress at most; the excess gets 503.
    pub max_long_polls: usize,
    /// A request head must arrive within this, and an idle connection is closed after it.
    pub header_read_timeout: Duration,
    /// `/-/healthy` answers 503 once the sampler or the decision loop has made no progress for
    /// this long: `server.stall_timeout`, or two sampling cycles (interval plus timeout) where
    /// that is longer.
    pub stall_timeout: Duration,
    /// TLS and basic auth, from `web_config_file` (the exporter toolkit's format).
    pub web: Option<super::web::WebConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NvmlConfig {
    /// A file name (searched like any shared library) or a path.
    pub library: PathBuf,
}

/// Where AMD GPUs are read from.
#[derive(Debug, Clone, PartialEq)]
pub struct AmdConfig {
    pub enabled: bool,
    pub sysfs_root: PathBuf,
    pub proc_root: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    pub interval: Duration,
    /// A cycle still running after this long is abandoned and counted.
    pub timeout: Duration,
    /// How often the readings that move slowly (the PCIe link now, a MIG mode that is off) are
    /// read: every cycle when it is shorter than the interval.
    pub slow_interval: Duration,
    /// Export `gpu_process_memory_used_bytes{pid,process}`.
    pub per_process_memory: bool,
    /// Name each GPU process's user: `user` on the per-process series, and per-user series.
    pub process_owners: bool,
}

impl RawServer {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<ServerConfig> {
        let listen = match self.listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                invalid(
                    "server.listen",
                    format!(
                        "\"{}\" is not an IP address and port, such as \"0.0.0.0:9400\"",
                        self.listen
                    ),
                );
                None
            }
        };
        count(
            invalid,
            "server.max_connections",
            self.max_connections,
            1..=65_536,
            "a count between 1 and 65536",
        );
        // Fewer long-polls than connections, so that a scrape always finds one free.
        if !(1..self.max_connections.max(2)).contains(&self.max_long_polls) {
            invalid(
                "server.max_long_polls",
                format!(
                    "\"{}\" is not a count from 1 to below server.max_connections ({}), which leaves room for scrapes",
                    self.max_long_polls, self.max_connections
                ),
            );
        }
        let header_read_timeout = duration(
            invalid,
            "server.header_read_timeout",
            &self.header_read_timeout,
            Duration::from_millis(100)..=Duration::from_secs(300),
        );
        let stall_timeout = duration(
            invalid,
            "server.stall_timeout",
            &self.stall_timeout,
            Duration::from_secs(1)..=Duration::from_secs(24 * 3600),
        );
        Some(ServerConfig {
            listen: listen?,
            max_connections: self.max_connections,
            max_long_polls: self.max_long_polls,
            header_read_timeout: header_read_timeout?,
            stall_timeout: stall_timeout?,
            web: None,
        })
    }
}

impl RawNvml {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<NvmlConfig> {
        if self.library.trim().is_empty() {
            invalid(
                "nvml.library",
                "\"\" is empty; name the NVML library, such as \"libnvidia-ml.so.1\"".to_string(),
            );
            return None;
        }
        Some(NvmlConfig {
            library: PathBuf::from(&self.library),
        })
    }
}

impl RawAmd {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<AmdConfig> {
        let mut root = |key: &str, text: &str| {
            if text.is_empty() || !text.starts_with('/') || text.contains('\0') {
                invalid(
                    key,
                    format!("\"{}\" is not an absolute path", text.escape_debug()),
                );
                return None;
            }
            Some(PathBuf::from(text))
        };
        let sysfs_root = root("amd.sysfs_root", &self.sysfs_root);
        let proc_root = root("amd.proc_root", &self.proc_root);
        Some(AmdConfig {
            enabled: self.enabled,
            sysfs_root: sysfs_root?,
            proc_root: proc_root?,
        })
    }
}

impl RawSampling {
    pub(super) fn validate(
        &self,
        invalid: &mut impl FnMut(&str, String),
    ) -> Option<SamplingConfig> {
        let interval = duration(
            invalid,
            "sampling.interval",
            &self.interval,
            Duration::from_millis(10)..=Duration::from_secs(3600),
        );
        let timeout = duration(
            invalid,
            "sampling.timeout",
            &self.timeout,
            Duration::from_millis(10)..=Duration::from_secs(600),
        );
        let slow_interval = duration(
            invalid,
            "sampling.slow_interval",
            &self.slow_interval,
            Duration::ZERO..=Duration::from_secs(3600),
        );
        Some(SamplingConfig {
            interval: interval?,
            timeout: timeout?,
            slow_interval: slow_interval?,
            per_process_memory: self.per_process_memory,
            process_owners: self.process_owners,
        })
    }
}

/// Which names the GPU series carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// `gpu_*`, in base units.
    Gpuwatch,
    /// dcgm-exporter's `DCGM_FI_*`, in its units and with its labels.
    Dcgm,
    Both,
}

impl Names {
    pub fn gpuwatch(self) -> bool {
        self != Names::Dcgm
    }

    pub fn dcgm(self) -> bool {
        self != Names::Gpuwatch
    }
}

/// The name of the DCGM names' host label: current dcgm-exporter spells it `hostname`, older
/// releases `Hostname`, and dashboards written for those keep working with the second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostnameLabel {
    #[default]
    Lower,
    Capitalised,
}

impl HostnameLabel {
    pub fn name(self) -> &'static str {
        match self {
            HostnameLabel::Lower => "hostname",
            HostnameLabel::Capitalised => "Hostname",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExpositionConfig {
    pub names: Names,
    /// The host label of the DCGM names; `None`: `NODE_NAME`, or the machine's hostname.
    pub hostname: Option<String>,
    pub hostname_label: HostnameLabel,
}

impl RawExposition {
    pub(super) fn validate(
        &self,
        invalid: &mut impl FnMut(&str, String),
    ) -> Option<ExpositionConfig> {
        let names = pick(
            invalid,
            "exposition.names",
            &self.names,
            &[
                ("gpuwatch", Names::Gpuwatch),
                ("dcgm", Names::Dcgm),
                ("both", Names::Both),
            ],
        );
        let hostname_label = pick(
            invalid,
            "exposition.hostname_label",
            &self.hostname_label,
            &[
                ("hostname", HostnameLabel::Lower),
                ("Hostname", HostnameLabel::Capitalised),
            ],
        );
        if self.hostname.chars().count() > 253 || self.hostname.chars().any(char::is_control) {
            invalid(
                "exposition.hostname",
                format!("{:?} is not a host name", self.hostname),
            );
            return None;
        }
        Some(ExpositionConfig {
            names: names?,
            hostname: (!self.hostname.is_empty()).then(|| self.hostname.clone()),
            hostname_label: hostname_label?,
        })
    }
}
