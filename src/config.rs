//! Configuration in two stages: a raw serde form that rejects unknown keys, then a validated
//! form with typed addresses and durations. Every error names the key and quotes the value.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where `gpuwatch run` looks for its config when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/gpuwatch/gpuwatch.toml";

/// The exit status for bad configuration (EX_USAGE).
pub const EXIT_CONFIG: i32 = 64;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub nvml: NvmlConfig,
    pub sampling: SamplingConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NvmlConfig {
    /// A file name (searched like any shared library) or a path.
    pub library: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    pub interval: Duration,
    /// A cycle still running after this long is abandoned and counted.
    pub timeout: Duration,
    /// Export `gpu_process_memory_used_bytes{pid,process}`.
    pub per_process_memory: bool,
}

impl Default for Config {
    fn default() -> Self {
        RawConfig::default()
            .validate()
            .expect("the built-in defaults are valid")
    }
}

/// One problem with a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config: {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config: {path}: line {line}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("config: {key}: {message}")]
    Invalid { key: String, message: String },
}

/// Every problem found in one config file, in file order.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses config text; `path` is used in messages only.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigErrors> {
        RawConfig::parse(text, path)?.validate()
    }
}

// ---- raw form -------------------------------------------------------------------------------

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub server: RawServer,
    pub nvml: RawNvml,
    pub sampling: RawSampling,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    pub listen: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNvml {
    pub library: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSampling {
    pub interval: String,
    pub timeout: String,
    pub per_process_memory: bool,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            server: RawServer {
                listen: "0.0.0.0:9400".to_string(),
            },
            nvml: RawNvml {
                library: "libnvidia-ml.so.1".to_string(),
            },
            sampling: RawSampling {
                interval: "1s".to_string(),
                timeout: "5s".to_string(),
                per_process_memory: false,
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

impl Default for RawSampling {
    fn default() -> Self {
        RawConfig::default().sampling
    }
}

impl RawConfig {
    pub fn parse(text: &str, path: &Path) -> Result<RawConfig, ConfigError> {
        let de = toml::Deserializer::new(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            // One line per error, and values in double quotes as everywhere else.
            let message = inner
                .message()
                .trim()
                .replace('\n', "; ")
                .replace('`', "\"");
            match (key.as_str(), inner.span()) {
                // Errors outside any key are TOML syntax errors.
                (".", Some(span)) | ("", Some(span)) => ConfigError::Syntax {
                    path: path.to_path_buf(),
                    line: text[..span.start.min(text.len())].lines().count().max(1),
                    message,
                },
                _ => ConfigError::Invalid {
                    key: key.trim_start_matches('.').to_string(),
                    message: unknown_key_message(&message),
                },
            }
        })
    }

    pub fn validate(self) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let mut invalid = |key: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: key.to_string(),
                message,
            })
        };

        let listen = match self.server.listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                invalid(
                    "server.listen",
                    format!(
                        "\"{}\" is not an IP address and port, such as \"0.0.0.0:9400\"",
                        self.server.listen
                    ),
                );
                None
            }
        };
        if self.nvml.library.trim().is_empty() {
            invalid(
                "nvml.library",
                "\"\" is empty; name the NVML library, such as \"libnvidia-ml.so.1\"".to_string(),
            );
        }
        let interval = duration(
            &mut invalid,
            "sampling.interval",
            &self.sampling.interval,
            Duration::from_millis(10),
        );
        let timeout = duration(
            &mut invalid,
            "sampling.timeout",
            &self.sampling.timeout,
            Duration::from_millis(10),
        );

        match (listen, interval, timeout) {
            (Some(listen), Some(interval), Some(timeout)) if errors.is_empty() => Ok(Config {
                server: ServerConfig { listen },
                nvml: NvmlConfig {
                    library: PathBuf::from(self.nvml.library),
                },
                sampling: SamplingConfig {
                    interval,
                    timeout,
                    per_process_memory: self.sampling.per_process_memory,
                },
            }),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

fn duration(
    invalid: &mut impl FnMut(&str, String),
    key: &str,
    text: &str,
    min: Duration,
) -> Option<Duration> {
    match humantime::parse_duration(text) {
        Ok(d) if d >= min => Some(d),
        Ok(_) => {
            invalid(
                key,
                format!(
                    "\"{text}\" is too short; the least is \"{}\"",
                    humantime::format_duration(min)
                ),
            );
            None
        }
        Err(_) => {
            invalid(
                key,
                format!("\"{text}\" is not a duration, such as \"1s\" or \"500ms\""),
            );
            None
        }
    }
}

/// serde says "unknown field "x", expected one of ..."; config files have keys.
fn unknown_key_message(message: &str) -> String {
    match message.strip_prefix("unknown field \"") {
        Some(rest) => {
            let (name, rest) = rest.split_once('"').unwrap_or((rest, ""));
            let expected = rest.trim_start_matches(", ");
            format!("\"{name}\" is not a known key; {expected}")
        }
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::default();
        assert_eq!(c.server.listen, "0.0.0.0:9400".parse().unwrap());
        assert_eq!(c.nvml.library, PathBuf::from("libnvidia-ml.so.1"));
        assert_eq!(c.sampling.interval, Duration::from_secs(1));
        assert_eq!(c.sampling.timeout, Duration::from_secs(5));
        assert!(!c.sampling.per_process_memory);
    }

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(
            Config::parse("", Path::new("x.toml")).unwrap(),
            Config::default()
        );
    }
}
