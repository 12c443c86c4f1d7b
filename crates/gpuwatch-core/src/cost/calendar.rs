//! UTC calendar periods for budgets: a day, a week (from Monday) or a month.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Week,
    Month,
}

const DAY: f64 = 86_400.0;

impl Period {
    /// The start of the period containing `t` (Unix seconds).
    pub fn start(self, t: f64) -> f64 {
        let days = (t / DAY).floor() as i64;
        let start_day = match self {
            Period::Day => days,
            // 1970-01-01 was a Thursday; Monday is 3 days earlier in the cycle.
            Period::Week => days - (days + 3).rem_euclid(7),
            Period::Month => {
                let (y, m, _) = civil_from_days(days);
                days_from_civil(y, m, 1)
            }
        };
        start_day as f64 * DAY
    }

    /// The end of the period containing `t` (the start of the next one).
    pub fn end(self, t: f64) -> f64 {
        let start = self.start(t);
        match self {
            Period::Day => start + DAY,
            Period::Week => start + 7.0 * DAY,
            Period::Month => {
                let (y, m, _) = civil_from_days((start / DAY) as i64);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(ny, nm, 1) as f64 * DAY
            }
        }
    }
}

/// The UTC period of `months` months (1, 3 or 12: AWS Budgets' monthly, quarterly and annual
/// periods, aligned on January) that contains `t`: its start and end.
pub fn months(t: f64, months: u32) -> (f64, f64) {
    let months = months.clamp(1, 12);
    let (y, m, _) = civil_from_days((t / DAY).floor() as i64);
    let first = (m - 1) / months * months + 1;
    let next = first + months;
    let (ny, nm) = if next > 12 {
        (y + 1, next - 12)
    } else {
        (y, next)
    };
    (
        days_from_civil(y, first, 1) as f64 * DAY,
        days_from_civil(ny, nm, 1) as f64 * DAY,
    )
}

/// Days since 1970-01-01 for a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day number since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{parse_rfc3339, rfc3339};

    #[test]
    fn months_aligned_on_january() {
        let t = parse_rfc3339("2026-11-30T09:13:22Z").unwrap();
        let span = |n| {
            let (a, b) = months(t, n);
            (rfc3339(a), rfc3339(b))
        };
        assert_eq!(
            span(1),
            ("2026-11-01T00:00:00Z".into(), "2026-12-01T00:00:00Z".into())
        );
        assert_eq!(
            span(3),
            ("2026-10-01T00:00:00Z".into(), "2027-01-01T00:00:00Z".into())
        );
        assert_eq!(
            span(12),
            ("2026-01-01T00:00:00Z".into(), "2027-01-01T00:00:00Z".into())
        );
        let jan = parse_rfc3339("2027-01-01T00:00:00Z").unwrap();
        assert_eq!(months(jan, 3).0, jan);
    }

    #[test]
    fn periods() {
        let t = parse_rfc3339("2026-11-30T09:13:22Z").unwrap(); // a Monday
        let cases = [
            (Period::Day, "2026-11-30T00:00:00Z", "2026-12-01T00:00:00Z"),
            (Period::Week, "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"),
            (
                Period::Month,
                "2026-11-01T00:00:00Z",
                "2026-12-01T00:00:00Z",
            ),
        ];
        for (p, start, end) in cases {
            assert_eq!(rfc3339(p.start(t)), start, "{p:?}");
            assert_eq!(rfc3339(p.end(t)), end, "{p:?}");
        }
        let dec = parse_rfc3339("2026-12-31T23:59:59Z").unwrap();
        assert_eq!(rfc3339(Period::Month.end(dec)), "2027-01-01T00:00:00Z");
        let sunday = parse_rfc3339("2026-12-06T12:00:00Z").unwrap();
        assert_eq!(rfc3339(Period::Week.start(sunday)), "2026-11-30T00:00:00Z");
        let leap = parse_rfc3339("2028-02-29T12:00:00Z").unwrap();
        assert_eq!(rfc3339(Period::Month.end(leap)), "2028-03-01T00:00:00Z");
    }
}
