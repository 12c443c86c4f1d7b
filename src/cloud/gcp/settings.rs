//! `[cloud.gcp]`: what a stop does with local SSD data.

use serde::{Deserialize, Serialize};

use super::plan::LocalSsd;

/// Compute Engine's own keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// What a stop does with the data of local SSDs, where the VM has them: "keep" (kept, and
    /// billed, while the VM is stopped) or "discard" (lost).
    pub local_ssd: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            local_ssd: "keep".into(),
        }
    }
}

const LOCAL_SSD: &[(&str, LocalSsd)] = &[("keep", LocalSsd::Keep), ("discard", LocalSsd::Discard)];

impl crate::config::Keys for Settings {
    fn check(&self, key: &dyn Fn(&str) -> String, invalid: &mut dyn FnMut(&str, String)) {
        let mut invalid = |k: &str, m: String| invalid(k, m);
        crate::config::pick(&mut invalid, &key("local_ssd"), &self.local_ssd, LOCAL_SSD);
    }
}

impl Settings {
    /// What a stop does with local SSD data (kept, where the value was never checked).
    pub fn local_ssd(&self) -> LocalSsd {
        let found = LOCAL_SSD.iter().find(|(name, _)| *name == self.local_ssd);
        found.map_or(LocalSsd::Keep, |(_, v)| *v)
    }
}
