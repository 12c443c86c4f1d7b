//! The instance's price per hour, from the best source that knows it.

use std::sync::OnceLock;

use serde::Serialize;

use crate::rules::Lifecycle;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Config,
    Spot,
    PricingApi,
    Table,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Spot => "spot",
            Source::PricingApi => "pricing_api",
            Source::Table => "table",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Price {
    pub usd_per_hour: f64,
    pub source: Source,
}

/// Picks the price: the config wins; then the spot price for spot instances; then, for
/// on-demand ones, the Pricing API and the bundled table. Neither a spot instance nor one whose
/// lifecycle is unknown (a Capacity Block, a scheduled instance, or none read) falls back to an
/// on-demand price: overstating spend could trip a budget rule, so unknown stays unknown.
/// How far apart two prices of one instance may be before the new one is implausible: a price
/// list's error (a row of $9,999/h for a $3.67 VM) must not exhaust a budget that stops a busy
/// node. No real price moves twentyfold between two reads, nor lies twentyfold from every
/// other price its list gives the same size.
pub const IMPLAUSIBLE_RATIO: f64 = 20.0;

/// Whether `price` is more than `IMPLAUSIBLE_RATIO` times `beside`, or less than its twentieth.
pub fn implausible(price: f64, beside: f64) -> bool {
    beside > 0.0 && price > 0.0 && (price / beside).max(beside / price) > IMPLAUSIBLE_RATIO
}

pub fn choose(
    config: Option<f64>,
    lifecycle: Option<Lifecycle>,
    spot: Option<f64>,
    pricing_api: Option<f64>,
    table: Option<f64>,
) -> Option<Price> {
    let p = |usd_per_hour, source| {
        Some(Price {
            usd_per_hour,
            source,
        })
    };
    if let Some(c) = config {
        return p(c, Source::Config);
    }
    match lifecycle {
        Some(Lifecycle::Spot) => spot.and_then(|s| p(s, Source::Spot)),
        Some(Lifecycle::OnDemand) => match (pricing_api, table) {
            (Some(a), _) => p(a, Source::PricingApi),
            (None, Some(t)) => p(t, Source::Table),
            _ => None,
        },
        None => None,
    }
}

/// The bundled table of on-demand Linux prices.
pub struct Table {
    pub as_of: String,
    rows: Vec<(Vec<String>, String, f64)>,
}

const TABLE: &str = include_str!("prices.csv");

pub fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let mut as_of = String::from("unknown");
        let mut rows = Vec::new();
        for line in TABLE.lines() {
            if let Some(d) = line.strip_prefix("# prices as of ") {
                as_of = d.trim().to_string();
            }
            if line.starts_with('#') || line.starts_with("regions,") || line.trim().is_empty() {
                continue;
            }
            let cols: Vec<&str> = line.split(',').collect();
            if let [regions, itype, usd] = cols[..] {
                if let Some(usd) = super::parse_hourly_usd(usd) {
                    rows.push((
                        regions.split_whitespace().map(str::to_string).collect(),
                        itype.trim().to_string(),
                        usd,
                    ));
                }
            }
        }
        Table { as_of, rows }
    })
}

impl Table {
    pub fn price(&self, region: &str, instance_type: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|(regions, t, _)| t == instance_type && regions.iter().any(|r| r == region))
            .map(|r| r.2)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_in_order() {
        let od = Some(Lifecycle::OnDemand);
        let spot = Some(Lifecycle::Spot);
        let src = |p: Option<Price>| p.map(|p| (p.usd_per_hour, p.source));
        assert_eq!(
            src(choose(Some(9.0), spot, Some(1.0), Some(2.0), Some(3.0))),
            Some((9.0, Source::Config))
        );
        assert_eq!(
            src(choose(None, spot, Some(1.0), Some(2.0), Some(3.0))),
            Some((1.0, Source::Spot))
        );
        assert_eq!(src(choose(None, spot, None, Some(2.0), Some(3.0))), None);
        assert_eq!(
            src(choose(None, od, Some(1.0), Some(2.0), Some(3.0))),
            Some((2.0, Source::PricingApi))
        );
        assert_eq!(
            src(choose(None, od, None, None, Some(3.0))),
            Some((3.0, Source::Table))
        );
        // An unknown lifecycle (a Capacity Block, say) has no on-demand price, only its own.
        assert_eq!(
            src(choose(None, None, Some(1.0), Some(2.0), Some(3.0))),
            None
        );
        assert_eq!(
            src(choose(Some(9.0), None, None, Some(2.0), Some(3.0))),
            Some((9.0, Source::Config))
        );
        assert_eq!(src(choose(None, od, None, None, None)), None);
    }

    #[test]
    fn bundled_table() {
        let t = table();
        assert_eq!(t.as_of, "2026-11-01");
        assert!(t.len() >= 40);
        assert_eq!(t.price("us-east-1", "p4d.24xlarge"), Some(32.7726));
        assert_eq!(t.price("us-west-2", "g5.xlarge"), Some(1.006));
        assert_eq!(t.price("us-east-1", "m5.large"), None);
        for family in [
            "p3.", "p4d.", "p4de.", "p5.", "p5e.", "g4dn.", "g5.", "g6.", "g6e.",
        ] {
            assert!(t.rows.iter().any(|r| r.1.starts_with(family)), "{family}");
        }
    }
}
