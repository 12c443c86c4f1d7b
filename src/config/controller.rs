//! `[controller]`: the cluster controller's own settings (`gpuwatch controller`). Node daemons
//! ignore the section. Its Prometheus keys are a Prometheus budget's (`url` is
//! `prometheus_url`), checked by the same code.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::budgets::{PrometheusSource, RawBudget};
use super::check::{duration, pick, DAY};
use super::{ConfigError, Mode};

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawController {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scrape_interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclude_namespaces: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict_selector: Option<String>,
}

/// The cluster controller's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// Dry-run (the default) writes nothing to the cluster but Events saying what it would do.
    pub mode: Mode,
    /// The fleet's Prometheus, where the node daemons' verdicts are read.
    pub prometheus: PrometheusSource,
    /// How often verdicts are read and workloads decided.
    pub poll_interval: Duration,
    /// How often Prometheus scrapes the node daemons: a verdict older than two of these is
    /// stale, and counts as busy.
    pub scrape_interval: Duration,
    /// From the warning Event to the action, after a re-check of everything.
    pub warning: Duration,
    /// Namespaces never touched, beside the controller's own.
    pub exclude_namespaces: Vec<String>,
    /// The Lease that elects the one controller that acts.
    pub lease_name: String,
    pub lease_duration: Duration,
    /// A kubeconfig to use instead of the in-cluster service account (or `KUBECONFIG`).
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The label matchers a verdict's series must have: the node daemons' scrape job, so that
    /// no other target (a Pushgateway, say) can speak for a pod.
    pub verdict_selector: String,
}

/// The verdicts' selector unless the config says otherwise: the node daemons' scrape job as
/// the shipped ServiceMonitor names it.
pub const VERDICT_SELECTOR: &str = "{job=\"gpuwatch\"}";

impl ControllerConfig {
    /// Each standing verdict's own sample time: `timestamp()` of the selector itself (an
    /// operator in between would stamp every sample with the query's time).
    pub fn verdict_query(&self) -> String {
        format!(
            "timestamp(gpuwatch_pod_reclaim_verdict{})",
            self.verdict_selector
        )
    }

    /// When each standing verdict was given.
    pub fn since_query(&self) -> String {
        format!(
            "gpuwatch_pod_reclaim_verdict_since_seconds{}",
            self.verdict_selector
        )
    }
}

impl RawController {
    /// Whether the section says anything at all: then it is the controller's, and checked
    /// whole (a key without `prometheus_url` is an error, never ignored).
    pub fn is_set(&self) -> bool {
        *self != RawController::default()
    }

    /// The opposite, for serde: an absent section is left out of the defaults.
    pub fn is_unset(&self) -> bool {
        !self.is_set()
    }

    /// The validated section, or `None` where it is absent or has problems (each pushed).
    pub fn validate(&self, errors: &mut Vec<ConfigError>) -> Option<ControllerConfig> {
        if !self.is_set() {
            return None;
        }
        let mut invalid = |key: &str, message: String| {
            errors.push(ConfigError::Invalid {
                key: format!("controller.{key}"),
                message,
            })
        };
        let mode = pick(
            &mut invalid,
            "mode",
            self.mode.as_deref().unwrap_or("dry-run"),
            &[("dry-run", Mode::DryRun), ("enforce", Mode::Enforce)],
        );
        let budget = RawBudget {
            url: self.prometheus_url.clone(),
            query: Some(format!("gpuwatch_pod_reclaim_verdict{VERDICT_SELECTOR}")),
            timeout: self.timeout.clone(),
            ca_file: self.ca_file.clone(),
            username: self.username.clone(),
            password_file: self.password_file.clone(),
            bearer_token_file: self.bearer_token_file.clone(),
            headers: self.headers.clone(),
            ..RawBudget::prometheus()
        };
        // The budget's key names are the controller's, but for the URL's.
        let prometheus = {
            let mut renamed = |key: &str, message: String| {
                let key = if key == "url" { "prometheus_url" } else { key };
                invalid(
                    key,
                    message.replace("a prometheus budget", "the controller"),
                )
            };
            super::budgets::prometheus_source(&budget, &mut renamed)
        };
        let mut every = |key: &str, value: &Option<String>, default: &str, least: Duration| {
            duration(
                &mut invalid,
                key,
                value.as_deref().unwrap_or(default),
                least..=DAY,
            )
        };
        let second = Duration::from_secs(1);
        let tenth = Duration::from_millis(100);
        let poll_interval = every("poll_interval", &self.poll_interval, "30s", tenth);
        let scrape_interval = every("scrape_interval", &self.scrape_interval, "30s", second);
        let warning = every("warning", &self.warning, "10m", Duration::ZERO);
        let lease_duration = every(
            "lease_duration",
            &self.lease_duration,
            "15s",
            Duration::from_secs(2),
        );
        let (exclude_namespaces, lease_name, verdict_selector) = self.names(&mut invalid);
        Some(ControllerConfig {
            mode: mode?,
            prometheus: prometheus?,
            poll_interval: poll_interval?,
            scrape_interval: scrape_interval?,
            warning: warning?,
            exclude_namespaces,
            lease_name,
            lease_duration: lease_duration?,
            kubeconfig: self.kubeconfig.as_ref().map(Into::into),
            verdict_selector,
        })
    }

    /// The excluded namespaces, the Lease's name and the verdicts' selector, checked.
    fn names(&self, invalid: &mut impl FnMut(&str, String)) -> (Vec<String>, String, String) {
        let exclude_namespaces = self
            .exclude_namespaces
            .clone()
            .unwrap_or_else(|| vec!["kube-system".into()]);
        for (i, ns) in exclude_namespaces.iter().enumerate() {
            if !is_dns_label(ns) {
                invalid(
                    &format!("exclude_namespaces[{i}]"),
                    format!("\"{}\" is not a namespace name (a DNS label: lower-case letters, digits and '-', at most 63)", crate::redact::brief(ns, 80)),
                );
            }
        }
        let lease_name = self
            .lease_name
            .clone()
            .unwrap_or_else(|| "gpuwatch-controller".into());
        if !is_dns_label(&lease_name) {
            invalid(
                "lease_name",
                format!(
                    "\"{}\" is not a Lease name (a DNS label)",
                    crate::redact::brief(&lease_name, 80)
                ),
            );
        }
        let verdict_selector = self
            .verdict_selector
            .clone()
            .unwrap_or_else(|| VERDICT_SELECTOR.into());
        let selector_ok = verdict_selector.len() <= 1024
            && verdict_selector.starts_with('{')
            && verdict_selector.ends_with('}')
            && verdict_selector.len() > 2
            && !verdict_selector.chars().any(char::is_control);
        if !selector_ok {
            invalid(
                "verdict_selector",
                format!(
                    "\"{}\" is not a PromQL label selector with at least one matcher, such as {VERDICT_SELECTOR}",
                    crate::redact::brief(&verdict_selector, 80)
                ),
            );
        }
        (exclude_namespaces, lease_name, verdict_selector)
    }
}

/// A DNS label (RFC 1123), as Kubernetes names namespaces and Leases.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
