//! EC2's on-demand Linux prices from a dated table (`prices.csv`), built in: the price of an
//! on-demand instance where the Pricing API is off or has not answered, and the baseline its
//! first answer is checked against.

use std::sync::OnceLock;

/// The bundled table of EC2 on-demand Linux prices.
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
                if let Some(usd) = crate::cost::parse_hourly_usd(usd) {
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
