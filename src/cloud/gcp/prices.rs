//! Compute Engine prices from a dated table (`prices.csv`): the Cloud Billing Catalog API
//! needs an API key, which a node should not hold. A type or region the table lacks has no
//! price, with the reason; a price is never guessed.

const TABLE: &str = include_str!("prices.csv");

/// One row's price: on-demand, and Spot where known.
fn row(name: &str, region: &str) -> Option<(f64, Option<f64>)> {
    TABLE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .find_map(|l| {
            let mut f = l.split(',');
            let (n, r) = (f.next()?, f.next()?);
            if n != name || r != region {
                return None;
            }
            let on_demand = crate::cost::parse_hourly_usd(f.next()?)?;
            let spot = f.next().and_then(crate::cost::parse_hourly_usd);
            Some((on_demand, spot))
        })
}

/// The hourly price of `machine_type` in `region` (Spot or not), with `gpus` attached (N1: the
/// accelerator type and count from `instances.get`); `Err` says why there is none.
pub fn price(
    machine_type: &str,
    region: &str,
    spot: bool,
    gpus: &[(String, u32)],
) -> Result<f64, String> {
    let pick = |name: &str| -> Result<f64, String> {
        let (on_demand, spot_price) = row(name, region)
            .ok_or_else(|| format!("the built-in price table has no {name} in {region}"))?;
        if spot {
            spot_price.ok_or_else(|| {
                format!("the built-in price table has no Spot price for {name} in {region}")
            })
        } else {
            Ok(on_demand)
        }
    };
    let mut total = pick(machine_type)?;
    for (accelerator, count) in gpus {
        total += pick(&format!("gpu:{accelerator}"))? * f64::from(*count);
    }
    Ok(total)
}

/// The date a column of the table is as of (`on-demand` or `spot`), from its
/// `# <column> as of: <date>` line: Spot prices change up to monthly, so each column says its
/// own. `unknown` where the table does not say.
pub fn as_of(column: &str) -> &'static str {
    let key = format!("# {column} as of:");
    TABLE
        .lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .map_or("unknown", str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each column says its own date: Spot prices change up to monthly.
    #[test]
    fn each_column_says_its_date() {
        for column in ["on-demand", "spot"] {
            let date = as_of(column);
            assert_eq!(date.len(), 7, "{column}: {date:?}");
            assert!(
                date.starts_with("20") && date.as_bytes()[4] == b'-',
                "{column}: {date:?}"
            );
        }
        assert_eq!(as_of("reserved"), "unknown");
    }

    #[test]
    fn prices_are_the_table_s_and_a_missing_one_says_why() {
        assert_eq!(
            price("a2-highgpu-1g", "us-central1", false, &[]),
            Ok(3.67339)
        );
        assert_eq!(
            price("a2-highgpu-1g", "us-central1", true, &[]),
            Ok(1.80385)
        );
        // N1: the machine and its attached GPUs.
        let two_t4 = [("nvidia-tesla-t4".to_string(), 2)];
        let p = price("n1-standard-8", "us-central1", false, &two_t4).unwrap();
        assert!((p - (0.38 + 2.0 * 0.35)).abs() < 1e-9, "{p}");
        let why = price("n1-standard-8", "us-central1", true, &two_t4).unwrap_err();
        assert!(why.contains("no Spot price for n1-standard-8"), "{why}");
        let why = price("a2-highgpu-1g", "mars-north1", false, &[]).unwrap_err();
        assert_eq!(
            why,
            "the built-in price table has no a2-highgpu-1g in mars-north1"
        );
        let why = price(
            "n1-standard-8",
            "us-central1",
            false,
            &[("nvidia-h100".into(), 1)],
        )
        .unwrap_err();
        assert!(why.contains("gpu:nvidia-h100"), "{why}");
    }
}
