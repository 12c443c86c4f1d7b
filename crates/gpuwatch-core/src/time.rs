//! Time as the core uses it: Unix seconds as `f64`, and RFC 3339 text. Nothing here reads
//! the clock; the edge passes `now` in.

use std::time::{Duration, UNIX_EPOCH};

/// The last second of the year 9999: no input time beyond it is believed.
pub const MAX_UNIX_SECONDS: f64 = 253_402_300_799.0;

/// Formats Unix seconds as RFC 3339 UTC, to the second. A time that is not finite (a hold
/// without end) is "never".
pub fn rfc3339(t: f64) -> String {
    if !t.is_finite() || t > MAX_UNIX_SECONDS {
        return "never".to_string();
    }
    let t = UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Parses RFC 3339 (`2026-11-30T10:00:00Z`, `2026-11-30T12:00:00+02:00`, fractions allowed) into
/// Unix seconds.
pub fn parse_rfc3339(text: &str) -> Option<f64> {
    let text = text.trim();
    let (base, offset) = split_offset(text)?;
    let t = humantime::parse_rfc3339_weak(base).ok()?;
    let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
    Some(secs - offset)
}

/// Splits a trailing `Z` or `±HH:MM` off, returning the offset in seconds. The offset is exactly
/// two digits, a colon and two digits, within ±23:59: nothing else (no `+inf:0`, no `+NaN:0`).
fn split_offset(text: &str) -> Option<(&str, f64)> {
    if let Some(base) = text.strip_suffix('Z').or_else(|| text.strip_suffix('z')) {
        return Some((base, 0.0));
    }
    let split = text.len().checked_sub(6)?;
    let tail = text.get(split..)?.as_bytes();
    let sign = match tail[0] {
        b'+' => 1.0,
        b'-' => -1.0,
        _ => return None,
    };
    let digit = |i: usize| tail[i].is_ascii_digit().then(|| f64::from(tail[i] - b'0'));
    if tail[3] != b':' {
        return None;
    }
    let hours = digit(1)? * 10.0 + digit(2)?;
    let minutes = digit(4)? * 10.0 + digit(5)?;
    if hours > 23.0 || minutes > 59.0 {
        return None;
    }
    Some((&text[..split], sign * (hours * 3600.0 + minutes * 60.0)))
}

/// Serializes Unix seconds as RFC 3339, for evidence a person reads.
pub fn serialize_rfc3339<S: serde::Serializer>(t: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

/// A duration as an operator writes one ("90s", "1h 30m", "500ms"), or `None`. At most 64
/// bytes, and no number of more than 12 digits: humantime's arithmetic panics near `u64::MAX`
/// seconds (it carries the nanoseconds of `18446744073709551615s1000000000ns` into a full
/// `u64`), and no setting, query or command needs a duration of 30,000 years.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let longest_number = text
        .split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    if text.len() > 64 || longest_number > 12 {
        return None;
    }
    humantime::parse_duration(text).ok()
}

/// Parses an HTTP date, RFC 1123's form (`Mon, 19 Sep 2016 18:29:47 GMT`: `Retry-After`,
/// Azure's `NotBefore`), into Unix seconds.
pub fn parse_http_date(text: &str) -> Option<f64> {
    let rest = text.trim().split_once(", ")?.1;
    let mut parts = rest.split(' ');
    let day: u32 = parts.next()?.parse().ok()?;
    let month = parts.next()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == month)?
        + 1;
    let year: u32 = parts.next()?.parse().ok()?;
    let time = parts.next()?;
    if parts.next()? != "GMT" || parts.next().is_some() || time.len() != 8 {
        return None;
    }
    parse_rfc3339(&format!("{year:04}-{month:02}-{day:02}T{time}Z"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded() {
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h 30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(
            parse_duration("999999999999s"),
            Some(Duration::from_secs(999_999_999_999))
        );
        // Each of these panicked inside humantime, or is longer than any duration needs.
        for bad in [
            "18446744073709551615s1000000000ns",
            "18446744073709551615s 999999999ns 1ns",
            "1000000000000s",
            &"1s ".repeat(22),
            "soon",
            "",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_round_trip_and_offsets() {
        assert_eq!(rfc3339(1_796_000_000.0), "2026-11-30T00:53:20Z");
        assert_eq!(parse_rfc3339("2026-11-30T00:53:20Z"), Some(1_796_000_000.0));
        assert_eq!(
            parse_rfc3339("2026-11-30T02:53:20+02:00"),
            Some(1_796_000_000.0)
        );
        assert_eq!(
            parse_rfc3339("2026-11-29T23:53:20-01:00"),
            Some(1_796_000_000.0)
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T00:53:20.5Z"),
            Some(1_796_000_000.5)
        );
        assert_eq!(parse_rfc3339("tomorrow"), None);
        assert_eq!(rfc3339(f64::INFINITY), "never");
        assert_eq!(rfc3339(f64::NAN), "never");
        assert_eq!(parse_rfc3339("2026-11-30T00:53:20"), None);
    }

    #[test]
    fn offsets_are_strict() {
        // Each of these once parsed, as a float offset, and a NaN expiry dropped a hold.
        for bad in [
            "2099-01-01T00:00:00+NaN:0",
            "2099-01-01T00:00:00+inf:0",
            "2099-01-01T00:00:00-1e9:0",
            "2099-01-01T00:00:00+1:000",
            "2099-01-01T00:00:00+24:00",
            "2099-01-01T00:00:00+05:60",
            "2099-01-01T00:00:00+0a:00",
            "2099-01-01T00:00:00+05-00",
            "2099-01-01T00:00:00+-5:00",
            "+05:00",
            "",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(
            parse_rfc3339("2026-11-30T00:53:20+23:59"),
            Some(1_796_000_000.0 - 86_340.0)
        );
    }

    #[test]
    fn http_dates_parse_and_others_do_not() {
        assert_eq!(
            parse_http_date("Mon, 19 Sep 2016 18:29:47 GMT"),
            parse_rfc3339("2016-09-19T18:29:47Z")
        );
        for bad in [
            "",
            "Mon, 19 Sep 2016 18:29:47",
            "19 Sep 2016 18:29:47 GMT",
            "Mon, 19 Foo 2016 18:29:47 GMT",
            "Mon, 32 Sep 2016 18:29:47 GMT",
            "Mon, 19 Sep 2016 18:29:47 GMT x",
        ] {
            assert_eq!(parse_http_date(bad), None, "{bad:?}");
        }
    }
}
