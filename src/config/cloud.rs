//! `[cloud]` and `[cost]`: the provider and its endpoints, the price and budget period.

use super::sections::{self, CloudKeys, Clouds, Listed, Section};
use super::*;

#[derive(Debug, Clone, PartialEq)]
pub struct CloudConfig {
    /// `[cloud] provider`: a name on the cloud boundary's list, or `None` for no cloud.
    pub provider: Option<&'static str>,
    pub imds_endpoint: String,
    /// The cloud's API endpoint; `None` is the cloud's own.
    pub endpoint_url: Option<String>,
    /// The region; `None` means the one instance metadata reports.
    pub region: Option<String>,
    /// How often instance metadata (spot notices, and tags when metadata tags are on) is read.
    pub poll_interval: Duration,
    /// How often DescribeInstances reads the `gpuwatch:hold` tag when metadata tags are off.
    pub tag_poll_interval: Duration,
    /// The configured cloud's own keys, `[cloud.<name>]`, checked by the cloud at load and
    /// read by it when it opens.
    pub section: Section,
    /// The configured cloud's keys, as the list gave them (`None`: no cloud).
    pub keys: Option<&'static CloudKeys>,
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

impl RawCloud {
    pub(super) fn validate(
        &self,
        clouds: Clouds,
        tables: &[(&str, &toml::Value)],
        invalid: &mut impl FnMut(&str, String),
        warnings: &mut Vec<String>,
    ) -> Option<CloudConfig> {
        let mut ok = true;
        let mut invalid = |key: &str, message: String| {
            ok = false;
            invalid(key, message)
        };
        let listed = clouds.iter().find(|c| c.name == self.provider);
        let provider = match listed {
            _ if self.provider == "none" => Some(None),
            Some(Listed {
                keys: Some(keys), ..
            }) => Some(Some((listed?.name, *keys))),
            Some(Listed { keys: None, name }) => {
                invalid(
                    "cloud.provider",
                    format!(
                        "\"{name}\" is not built into this gpuwatch: build it with `--features {name}` (the default builds every cloud)"
                    ),
                );
                None
            }
            None => {
                let names: Vec<String> = std::iter::once("none")
                    .chain(clouds.iter().map(|c| c.name))
                    .map(|n| format!("\"{n}\""))
                    .collect();
                invalid(
                    "cloud.provider",
                    format!(
                        "\"{}\" is not one of {}",
                        crate::redact::brief(&self.provider, 32),
                        names.join(", ")
                    ),
                );
                None
            }
        };
        let mut imds_endpoint = url(
            &mut invalid,
            "cloud.imds_endpoint",
            &self.imds_endpoint,
            true,
        );
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
        let endpoint_url = url(
            &mut invalid,
            "cloud.endpoint_url",
            &self.endpoint_url,
            false,
        );
        let poll_interval = duration(
            &mut invalid,
            "cloud.poll_interval",
            &self.poll_interval,
            Duration::from_millis(10)..=Duration::from_secs(3600),
        );
        let tag_poll_interval = duration(
            &mut invalid,
            "cloud.tag_poll_interval",
            &self.tag_poll_interval,
            Duration::from_millis(10)..=DAY,
        );
        let section = sections::split(
            &self.provider,
            &self.clouds,
            tables,
            clouds,
            RawCloud::OWN,
            &mut invalid,
            warnings,
        );
        let provider = provider?;
        ok.then_some(())?;
        Some(CloudConfig {
            provider: provider.map(|(name, _)| name),
            imds_endpoint: imds_endpoint??.trim_end_matches('/').to_string(),
            endpoint_url: endpoint_url?,
            region: (!self.region.trim().is_empty()).then(|| self.region.clone()),
            poll_interval: poll_interval?,
            tag_poll_interval: tag_poll_interval?,
            section,
            keys: provider.map(|(_, keys)| keys),
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
