//! What the node costs: its hourly price, the spend ledger, and budgets. Pure, like `rules/`:
//! time is passed in, and nothing here does I/O.

pub mod budget;
pub mod calendar;
pub mod ledger;
pub mod price;

/// Parses an amount in USD from outside (an AWS answer, the price table): finite, not negative,
/// and below a trillion. Anything else (`NaN`, `inf`, `-1`, `1e300`) is unknown, never a number
/// that reaches a rule.
pub fn parse_usd(text: &str) -> Option<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && (0.0..1e12).contains(v))
}

/// The highest hourly price believed: the dearest instances cost well under a tenth of it.
pub const MAX_HOURLY_USD: f64 = 10_000.0;

/// Parses an hourly price: a positive amount no higher than `MAX_HOURLY_USD`.
pub fn parse_hourly_usd(text: &str) -> Option<f64> {
    parse_usd(text).filter(|p| *p > 0.0 && *p <= MAX_HOURLY_USD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_from_outside_are_finite_and_bounded() {
        assert_eq!(parse_usd(" 12.5 "), Some(12.5));
        assert_eq!(parse_usd("0"), Some(0.0));
        for bad in ["NaN", "nan", "inf", "-inf", "-1", "1e300", "", "1,5"] {
            assert_eq!(parse_usd(bad), None, "{bad}");
        }
        assert_eq!(parse_hourly_usd("3.06"), Some(3.06));
        assert_eq!(parse_hourly_usd("0"), None);
        assert_eq!(parse_hourly_usd("20000"), None);
    }
}
