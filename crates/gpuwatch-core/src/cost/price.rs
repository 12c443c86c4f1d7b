//! The instance's price per hour, from the best source that knows it.

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
}
