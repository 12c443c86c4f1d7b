//! `[health]`: how GPU health is judged. The problems themselves are fixed; these say how long an
//! XID is held against a GPU without a reset, and how much throttling counts.

use super::*;

/// `[health]` as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHealth {
    /// How long an XID that needs a reset holds its GPU unhealthy when no reset is seen.
    pub xid_hold: String,
    /// The share of a sampling interval that thermal (or power) limits may hold the clocks
    /// down before the GPU counts as degraded.
    pub throttle_share: f64,
}

impl Default for RawHealth {
    fn default() -> Self {
        RawHealth {
            xid_hold: "24h".to_string(),
            throttle_share: 0.5,
        }
    }
}

/// The least share of an interval `throttle_share` may be.
const MIN_THROTTLE_SHARE: f64 = 0.01;

impl RawHealth {
    pub(super) fn validate(
        &self,
        invalid: &mut impl FnMut(&str, String),
    ) -> Option<crate::health::Settings> {
        let hold = duration(
            invalid,
            "health.xid_hold",
            &self.xid_hold,
            Duration::from_secs(60)..=WEEK,
        );
        // Below 1% of an interval (10 ms of a second) no clock reason is ever that short.
        let share = if self.throttle_share.is_finite()
            && self.throttle_share >= MIN_THROTTLE_SHARE
            && self.throttle_share <= 1.0
        {
            Some(self.throttle_share)
        } else {
            invalid(
                "health.throttle_share",
                format!(
                    "\"{:?}\" is not a share of the interval from 0.01 to 1",
                    self.throttle_share
                ),
            );
            None
        };
        Some(crate::health::Settings {
            xid_hold: hold?.as_secs_f64(),
            throttle_share: share?,
            ..crate::health::Settings::default()
        })
    }
}
