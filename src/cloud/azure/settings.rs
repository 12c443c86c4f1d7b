//! `[cloud.azure]`: the managed identity gpuwatch acts as.

use serde::{Deserialize, Serialize};

/// Azure's own keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The `client_id` of the user-assigned managed identity to act as; empty: the VM's
    /// system-assigned identity.
    pub client_id: String,
}

impl crate::config::Keys for Settings {
    fn check(&self, key: &dyn Fn(&str) -> String, invalid: &mut dyn FnMut(&str, String)) {
        let id = self.client_id.trim();
        let guid = id.len() <= 64 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        if !guid {
            invalid(
                &key("client_id"),
                format!(
                    "\"{}\" is not the client ID (a GUID) of a user-assigned managed identity",
                    crate::redact::brief(&self.client_id, 80)
                ),
            );
        }
    }

    fn misplaced(key: &str, value: &toml::Value, provider: &str) -> String {
        match (key, value.as_str()) {
            ("client_id", Some(id)) => format!(
                "\"{}\" names an Azure managed identity, but provider = \"{provider}\"",
                crate::redact::brief(id.trim(), 80)
            ),
            _ => format!("{value} is a key of Azure's, but provider = \"{provider}\""),
        }
    }
}

impl Settings {
    /// The identity's client ID, as written without the spaces around it.
    pub fn client_id(&self) -> &str {
        self.client_id.trim()
    }
}
