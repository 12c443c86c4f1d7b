//! Time as the rest of the crate uses it: Unix seconds as `f64`, and RFC 3339 text.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The current time in Unix seconds. Only the edges (the daemon's loops) call this; the rule
/// engine is handed `now`.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Formats Unix seconds as RFC 3339 UTC, to the second. A time that is not finite (a hold
/// without end) is "never".
pub fn rfc3339(t: f64) -> String {
    if !t.is_finite() || t > 253_402_300_799.0 {
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

/// Splits a trailing `Z` or `±HH:MM` off, returning the offset in seconds.
fn split_offset(text: &str) -> Option<(&str, f64)> {
    if let Some(base) = text.strip_suffix('Z').or_else(|| text.strip_suffix('z')) {
        return Some((base, 0.0));
    }
    let tail = text.get(text.len().checked_sub(6)?..)?;
    let sign = match tail.as_bytes()[0] {
        b'+' => 1.0,
        b'-' => -1.0,
        _ => return None,
    };
    let (h, m) = tail[1..].split_once(':')?;
    let offset = sign * (h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0);
    Some((&text[..text.len() - 6], offset))
}

/// Serializes Unix seconds as RFC 3339, for evidence a person reads.
pub fn serialize_rfc3339<S: serde::Serializer>(t: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
