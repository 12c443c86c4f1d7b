//! The Alibaba Cloud boundary's own tests.

use super::*;

/// A termination time that is present is a notice, parsed where it can be (UTC where it
/// names no zone), and in effect since first seen where it cannot.
#[test]
fn a_present_termination_time_is_a_notice_whether_or_not_it_parses() {
    let seen = 1_800_000_000.0;
    let at = crate::time::parse_rfc3339("2026-12-06T10:05:00Z").unwrap();
    for text in [
        "2026-12-06T10:05:00Z",
        "2026-12-06 10:05:00Z",
        "2026-12-06T10:05:00",
        "2026-12-06 10:05:00",
        " 2026-12-06T10:05:00Z\n",
    ] {
        let n = reclaim(text, seen);
        assert_eq!(n.kind, NoticeKind::Interruption, "{text:?}");
        assert_eq!(n.time, at, "{text:?}");
    }
    assert_eq!(
        reclaim("2026-12-06T12:05:00+02:00", seen).time,
        at,
        "a zone given is kept"
    );
    for text in ["soon", "", "2026-13-45T99:00:00Z"] {
        let n = reclaim(text, seen);
        assert_eq!(n.kind, NoticeKind::Interruption, "{text:?}");
        assert_eq!(n.time, seen, "{text:?}");
        assert!(n.text.contains("does not parse"), "{}", n.text);
    }
}

/// `DescribePrice` adds a system disk to the instance's price: the instance type's own row
/// is the price, where the answer breaks it down.
#[test]
fn the_instance_type_is_priced_without_its_system_disk() {
    let answer = serde_json::json!({"TradePrice": 4.31, "DetailInfos": {"DetailInfo": [
        {"Resource": "systemDisk", "TradePrice": 0.11},
        {"Resource": "instanceType", "TradePrice": 4.2}]}});
    assert_eq!(instance_alone(&answer), &serde_json::json!(4.2));
    let whole = serde_json::json!({"TradePrice": 4.31});
    assert_eq!(instance_alone(&whole), &serde_json::json!(4.31));
}
