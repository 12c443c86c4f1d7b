//! `[cloud.alibaba]`: the RAM role gpuwatch acts as, and whether a stop may keep billing.

use serde::{Deserialize, Serialize};

/// Alibaba Cloud's own keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The instance RAM role's name; empty: the one instance metadata names.
    pub ram_role: String,
    /// An instance that cannot stop in economical mode (a subscription, a family with local
    /// disks) is not stopped, since it would still be billed; true stops it anyway.
    pub keep_charging: bool,
}

impl crate::config::Keys for Settings {}
