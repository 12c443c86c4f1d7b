//! `[cloud]`, `[cost]` and `[cloudwatch]`: the provider and its endpoints, the price and budget
//! period, and CloudWatch publishing.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    None,
    Aws,
    Azure,
    Gcp,
    Alibaba,
}

impl Provider {
    /// Whether this build holds the cloud (each is a cargo feature).
    pub fn built(self) -> bool {
        match self {
            Provider::None => true,
            Provider::Aws => cfg!(feature = "aws"),
            Provider::Azure => cfg!(feature = "azure"),
            Provider::Gcp => cfg!(feature = "gcp"),
            Provider::Alibaba => cfg!(feature = "alibaba"),
        }
    }

    /// Its `[cloud] provider` value, which names it on the cloud boundary's list
    /// (`cloud::PROVIDERS`); `None` for no cloud.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Provider::None => None,
            Provider::Aws => Some("aws"),
            Provider::Azure => Some("azure"),
            Provider::Gcp => Some("gcp"),
            Provider::Alibaba => Some("alibaba"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CloudConfig {
    pub provider: Provider,
    pub imds_endpoint: String,
    /// The EC2 API endpoint; `None` is the SDK's own.
    pub endpoint_url: Option<String>,
    /// The region; `None` means the one instance metadata reports.
    pub region: Option<String>,
    /// How often instance metadata (spot notices, and tags when metadata tags are on) is read.
    pub poll_interval: Duration,
    /// How often DescribeInstances reads the `gpuwatch:hold` tag when metadata tags are off.
    pub tag_poll_interval: Duration,
    /// Azure: the `client_id` of the user-assigned managed identity to act as; empty: the
    /// VM's system-assigned identity.
    pub client_id: String,
    /// Compute Engine: whether a stop discards local SSD data (`local_ssd = "discard"`) rather
    /// than keeping it.
    pub discard_local_ssd: bool,
    /// Alibaba Cloud: the instance RAM role's name; empty: the one metadata names.
    pub ram_role: String,
    /// Alibaba Cloud: stop an instance that cannot stop in economical mode anyway, still billed.
    pub keep_charging: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CostConfig {
    /// An explicit price, which wins over every other source.
    pub hourly_price_usd: Option<f64>,
    pub period: Period,
    pub spot_price_refresh: Duration,
    pub pricing_api: bool,
    /// The Pricing API endpoint; `None` is the SDK's own (in us-east-1).
    pub pricing_endpoint_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CloudWatchConfig {
    pub enabled: bool,
    pub namespace: String,
    /// Samples are aggregated into statistic sets and published this often.
    pub interval: Duration,
    /// During an outage the queue keeps at most this much data, dropping the oldest.
    pub max_queue: Duration,
}

impl RawCloud {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<CloudConfig> {
        let provider = pick(
            invalid,
            "cloud.provider",
            &self.provider,
            &[
                ("none", Provider::None),
                ("aws", Provider::Aws),
                ("azure", Provider::Azure),
                ("gcp", Provider::Gcp),
                ("alibaba", Provider::Alibaba),
            ],
        )
        .filter(|p| {
            let built = p.built();
            if !built {
                invalid(
                    "cloud.provider",
                    format!(
                        "\"{}\" is not built into this gpuwatch: build it with `--features {}` (the default builds every cloud)",
                        self.provider,
                        self.provider
                    ),
                );
            }
            built
        });
        let local_ssd = pick(
            invalid,
            "cloud.local_ssd",
            &self.local_ssd,
            &[("keep", false), ("discard", true)],
        );
        let client_id = self.client_id.trim();
        let client_id_ok = client_id.is_empty()
            || (client_id.len() <= 64
                && client_id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
        if !client_id_ok {
            invalid(
                "cloud.client_id",
                format!(
                    "\"{}\" is not the client ID (a GUID) of a user-assigned managed identity",
                    crate::redact::brief(&self.client_id, 80)
                ),
            );
        } else if !client_id.is_empty() && self.provider != "azure" {
            invalid(
                "cloud.client_id",
                format!(
                    "\"{client_id}\" names an Azure managed identity, but provider = \"{}\"",
                    crate::redact::brief(&self.provider, 32)
                ),
            );
        }
        let mut imds_endpoint = url(invalid, "cloud.imds_endpoint", &self.imds_endpoint, true);
        if self.imds_endpoint.starts_with("https://") {
            invalid(
                "cloud.imds_endpoint",
                format!(
                    "\"{}\" is not an http:// URL (instance metadata speaks plain HTTP)",
                    self.imds_endpoint
                ),
            );
            imds_endpoint = None;
        }
        let endpoint_url = url(invalid, "cloud.endpoint_url", &self.endpoint_url, false);
        let poll_interval = duration(
            invalid,
            "cloud.poll_interval",
            &self.poll_interval,
            Duration::from_millis(10)..=Duration::from_secs(3600),
        );
        let tag_poll_interval = duration(
            invalid,
            "cloud.tag_poll_interval",
            &self.tag_poll_interval,
            Duration::from_millis(10)..=DAY,
        );
        Some(CloudConfig {
            provider: provider?,
            imds_endpoint: imds_endpoint??.trim_end_matches('/').to_string(),
            endpoint_url: endpoint_url?,
            region: (!self.region.trim().is_empty()).then(|| self.region.clone()),
            poll_interval: poll_interval?,
            tag_poll_interval: tag_poll_interval?,
            client_id: client_id_ok.then(|| client_id.to_string())?,
            discard_local_ssd: local_ssd?,
            ram_role: self.ram_role.trim().to_string(),
            keep_charging: self.keep_charging,
        })
    }
}

impl RawCost {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<CostConfig> {
        let hourly_price_usd = match self.hourly_price_usd {
            0.0 => Some(None),
            p if p > 0.0 && p <= crate::cost::MAX_HOURLY_USD => Some(Some(p)),
            p => {
                invalid(
                    "cost.hourly_price_usd",
                    format!("\"{p}\" is not a price in USD (0 means: look it up)"),
                );
                None
            }
        };
        let period = pick(
            invalid,
            "cost.period",
            &self.period,
            &[
                ("day", Period::Day),
                ("week", Period::Week),
                ("month", Period::Month),
            ],
        );
        let spot_price_refresh = duration(
            invalid,
            "cost.spot_price_refresh",
            &self.spot_price_refresh,
            Duration::from_secs(1)..=DAY,
        );
        let pricing_endpoint_url = url(
            invalid,
            "cost.pricing_endpoint_url",
            &self.pricing_endpoint_url,
            false,
        );
        Some(CostConfig {
            hourly_price_usd: hourly_price_usd?,
            period: period?,
            spot_price_refresh: spot_price_refresh?,
            pricing_api: self.pricing_api,
            pricing_endpoint_url: pricing_endpoint_url?,
        })
    }
}

impl RawCloudWatch {
    pub(super) fn validate(
        &self,
        invalid: &mut impl FnMut(&str, String),
    ) -> Option<CloudWatchConfig> {
        let interval = duration(
            invalid,
            "cloudwatch.interval",
            &self.interval,
            Duration::from_secs(1)..=Duration::from_secs(3600),
        );
        let max_queue = duration(
            invalid,
            "cloudwatch.max_queue",
            &self.max_queue,
            Duration::from_secs(1)..=DAY,
        );
        if self.namespace.is_empty() || self.namespace.starts_with("AWS/") {
            invalid(
                "cloudwatch.namespace",
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
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use std::path::Path;

    /// Each cloud is a cargo feature: a provider this build holds loads, and one it left out is
    /// refused at load, naming the key and the feature. (`scripts/test` runs this test in a
    /// build with one cloud alone, too.)
    #[test]
    fn a_cloud_left_out_of_the_build_is_refused_at_load() {
        let built = [
            ("aws", cfg!(feature = "aws")),
            ("azure", cfg!(feature = "azure")),
            ("gcp", cfg!(feature = "gcp")),
            ("alibaba", cfg!(feature = "alibaba")),
        ];
        for (name, built) in built {
            let loaded = Config::parse(
                &format!("[cloud]\nprovider = \"{name}\"\n"),
                Path::new("t.toml"),
            );
            match loaded {
                Ok(c) => assert!(built && c.cloud.provider.name() == Some(name), "{name}"),
                Err(e) => {
                    let said = e.to_string();
                    assert!(!built, "{name}: {said}");
                    assert!(
                        said.contains("cloud.provider")
                            && said.contains(&format!(
                                "\"{name}\" is not built into this gpuwatch: build it with `--features {name}`"
                            )),
                        "{said}"
                    );
                }
            }
        }
    }
}
