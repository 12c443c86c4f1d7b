//! `[cloud.aws]`: CloudWatch publishing (`[cloud.aws.cloudwatch]`, written `[cloudwatch]` before
//! the cloud had its table).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{duration, Invalid, DAY};

/// EC2's own keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub cloudwatch: CloudWatchKeys,
}

/// `[cloud.aws.cloudwatch]` as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudWatchKeys {
    /// Push per-GPU and per-instance metrics to CloudWatch.
    pub enabled: bool,
    pub namespace: String,
    /// Samples are aggregated into statistic sets and published this often.
    pub interval: String,
    /// During an outage, keep at most this much unpublished data, dropping the oldest.
    pub max_queue: String,
}

impl Default for CloudWatchKeys {
    fn default() -> Self {
        CloudWatchKeys {
            enabled: false,
            namespace: "gpuwatch".into(),
            interval: "60s".into(),
            max_queue: "30m".into(),
        }
    }
}

/// CloudWatch publishing, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudWatchConfig {
    pub enabled: bool,
    pub namespace: String,
    /// Samples are aggregated into statistic sets and published this often.
    pub interval: Duration,
    /// During an outage the queue keeps at most this much data, dropping the oldest.
    pub max_queue: Duration,
}

impl CloudWatchKeys {
    /// The keys checked; each problem given to `invalid` with the key `key` names.
    pub fn read(&self, key: &dyn Fn(&str) -> String, invalid: Invalid) -> Option<CloudWatchConfig> {
        let mut invalid = |k: &str, m: String| invalid(k, m);
        let interval = duration(
            &mut invalid,
            &key("interval"),
            &self.interval,
            Duration::from_secs(1)..=Duration::from_secs(3600),
        );
        let max_queue = duration(
            &mut invalid,
            &key("max_queue"),
            &self.max_queue,
            Duration::from_secs(1)..=DAY,
        );
        // `AWS/` is the prefix of CloudWatch's own namespaces.
        if self.namespace.is_empty() || self.namespace.starts_with("AWS/") {
            invalid(
                &key("namespace"),
                format!(
                    "\"{}\" is not a namespace of your own, such as \"gpuwatch\"",
                    self.namespace
                ),
            );
            return None;
        }
        Some(CloudWatchConfig {
            enabled: self.enabled,
            namespace: self.namespace.clone(),
            interval: interval?,
            max_queue: max_queue?,
        })
    }

    /// The checked settings of a section the config checked (the defaults where it was not).
    pub fn checked(&self) -> CloudWatchConfig {
        let ignore = &mut |_: &str, _: String| {};
        let defaults = || CloudWatchKeys::default().read(&str::to_string, &mut |_, _| {});
        self.read(&str::to_string, ignore)
            .or_else(defaults)
            .expect("the defaults are valid")
    }
}

impl crate::config::Keys for Settings {
    fn check(&self, key: &dyn Fn(&str) -> String, invalid: Invalid) {
        self.cloudwatch
            .read(&|k| key(&format!("cloudwatch.{k}")), invalid);
    }

    fn unused(&self) -> Option<String> {
        self.cloudwatch.enabled.then(|| {
            "CloudWatch publishing is enabled, but provider is not \"aws\": nothing is published"
                .to_string()
        })
    }
}
