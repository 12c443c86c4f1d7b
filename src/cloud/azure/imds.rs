//! Azure's Instance Metadata Service: the instance document, the managed identity's tokens and
//! Scheduled Events. Every request carries `Metadata: true` and goes straight to the endpoint,
//! never through a proxy (`cloud::metadata`).

use std::time::Duration;

use hyper::Method;
use serde::Deserialize;

use crate::cloud::metadata::{Endpoint, MetadataError, TIMEOUT};
use crate::cloud::rest::Token;

/// The instance document's version: the first with every field read here
/// (`additionalCapabilities.hibernationEnabled` came last).
pub const INSTANCE_API_VERSION: &str = "2021-12-13";
pub const TOKEN_API_VERSION: &str = "2018-02-01";
pub const EVENTS_API_VERSION: &str = "2020-07-01";
/// The audience of the tokens asked for: Azure Resource Manager.
pub const RESOURCE: &str = "https://management.azure.com/";

/// How long a Scheduled Events request may take: Azure enables the service on the first one,
/// which "can take up to two minutes".
pub const EVENTS_TIMEOUT: Duration = Duration::from_secs(150);

/// `compute` of the instance document. Every value is a string; one that does not apply is
/// an empty string.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Compute {
    pub subscription_id: String,
    pub resource_group_name: String,
    pub name: String,
    pub vm_id: String,
    pub vm_size: String,
    pub location: String,
    pub zone: String,
    pub priority: String,
    pub eviction_policy: String,
    pub tags_list: Vec<Tag>,
    pub vm_scale_set_name: String,
    /// A Flexible scale set's id (absent for Uniform ones, whose `resourceId` says it).
    pub virtual_machine_scale_set: Option<SubResource>,
    pub resource_id: String,
    pub additional_capabilities: Capabilities,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct SubResource {
    pub id: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Capabilities {
    pub hibernation_enabled: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Tag {
    pub name: String,
    pub value: String,
}

#[derive(Deserialize)]
struct Instance {
    compute: Compute,
}

/// The token answer. Its times are strings on IMDS (numbers on other Azure hosts).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
    #[serde(default)]
    expires_on: Option<serde_json::Value>,
    #[serde(default)]
    token_type: String,
}

/// An identity error: `{"error": "...", "error_description": "..."}`.
#[derive(Deserialize)]
struct IdentityError {
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

/// One scheduled event, as Scheduled Events lists it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct Event {
    pub event_id: String,
    pub event_type: String,
    pub resource_type: String,
    pub resources: Vec<String>,
    pub event_status: String,
    /// RFC 1123 (`Mon, 19 Sep 2016 18:29:47 GMT`), or empty once the event has started.
    pub not_before: String,
    pub description: String,
    pub event_source: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Events {
    pub document_incarnation: u64,
    pub events: Vec<Event>,
}

pub struct Imds {
    endpoint: Endpoint,
    /// `client_id` of a user-assigned identity; empty: the VM's system-assigned one.
    client_id: String,
}

impl Imds {
    pub fn new(endpoint: &str, client_id: &str) -> Imds {
        Imds {
            endpoint: Endpoint::new(endpoint),
            client_id: client_id.to_string(),
        }
    }

    async fn get(&self, path: &str, timeout: Duration) -> Result<(u16, String), MetadataError> {
        let answer = self
            .endpoint
            .request(Method::GET, path, &[("Metadata", "true")], timeout)
            .await?;
        let status = answer.status;
        Ok((status, answer.text(path)?))
    }

    /// `compute` of the instance document.
    pub async fn compute(&self) -> Result<Compute, MetadataError> {
        let path = format!("/metadata/instance?api-version={INSTANCE_API_VERSION}");
        let (status, body) = self.get(&path, TIMEOUT).await?;
        if status != 200 {
            return Err(MetadataError::Status { path, status });
        }
        let instance: Instance =
            serde_json::from_str(&body).map_err(|e| MetadataError::Invalid {
                path: path.clone(),
                message: format!("the instance document does not parse: {e}"),
            })?;
        let c = instance.compute;
        for (key, value) in [
            ("subscriptionId", &c.subscription_id),
            ("resourceGroupName", &c.resource_group_name),
            ("name", &c.name),
            ("vmId", &c.vm_id),
        ] {
            // Each is a segment of the VM's resource id: nothing that could leave it.
            let odd = |c: char| c.is_control() || c.is_whitespace() || "/?#%&\\".contains(c);
            if value.is_empty() || value.len() > 256 || value.chars().any(odd) {
                return Err(MetadataError::Invalid {
                    path,
                    message: format!("compute.{key} {:?} is not a name", brief(value)),
                });
            }
        }
        Ok(c)
    }

    /// A token for Resource Manager, of the VM's managed identity.
    pub async fn token(&self) -> Result<Token, MetadataError> {
        let mut path = format!(
            "/metadata/identity/oauth2/token?api-version={TOKEN_API_VERSION}&resource={}",
            crate::cloud::rest::encode(RESOURCE)
        );
        if !self.client_id.is_empty() {
            path.push_str("&client_id=");
            path.push_str(&crate::cloud::rest::encode(&self.client_id));
        }
        // The path names no secret; the answer is one, and is never put in an error.
        let shown = "/metadata/identity/oauth2/token";
        let (status, body) = self.get(&path, TIMEOUT).await?;
        if status != 200 {
            let why = serde_json::from_str::<IdentityError>(&body)
                .map(|e| format!("{}: {}", brief(&e.error), brief(&e.error_description)))
                .unwrap_or_default();
            return Err(MetadataError::Invalid {
                path: shown.into(),
                message: format!("HTTP {status} {why}").trim_end().to_string(),
            });
        }
        let invalid = |message: String| MetadataError::Invalid {
            path: shown.into(),
            message,
        };
        let answer: TokenAnswer = serde_json::from_str(&body)
            .map_err(|_| invalid("the token answer does not parse".into()))?;
        if answer.access_token.is_empty()
            || !answer.token_type.eq_ignore_ascii_case("bearer")
            || !answer.access_token.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(invalid("the answer holds no bearer token".into()));
        }
        let number = |v: &Option<serde_json::Value>| {
            match v {
                Some(serde_json::Value::String(s)) => s.trim().parse::<f64>().ok(),
                Some(serde_json::Value::Number(n)) => n.as_f64(),
                _ => None,
            }
            .filter(|n| n.is_finite() && *n >= 0.0)
        };
        let now = crate::time::now();
        let expires_on = number(&answer.expires_on)
            .or_else(|| number(&answer.expires_in).map(|s| now + s))
            .ok_or_else(|| invalid("the token's expiry is missing".into()))?;
        Ok(Token {
            value: answer.access_token,
            expires_on,
        })
    }

    /// The scheduled events of this VM's host.
    pub async fn events(&self) -> Result<Events, MetadataError> {
        let path = format!("/metadata/scheduledevents?api-version={EVENTS_API_VERSION}");
        let (status, body) = self.get(&path, EVENTS_TIMEOUT).await?;
        if status != 200 {
            return Err(MetadataError::Status { path, status });
        }
        serde_json::from_str(&body).map_err(|e| MetadataError::Invalid {
            path,
            message: format!("the scheduled events do not parse: {e}"),
        })
    }
}

/// A value as a log shows it: at most 128 characters, control characters replaced.
fn brief(text: &str) -> String {
    crate::redact::brief(text, 128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            crate::cloud::rest::encode(RESOURCE),
            "https%3A%2F%2Fmanagement.azure.com%2F"
        );
        assert_eq!(crate::cloud::rest::encode("a b&c=d"), "a%20b%26c%3Dd");
    }

    #[test]
    fn the_documented_instance_example_parses() {
        let doc = r#"{"compute": {"azEnvironment": "AZUREPUBLICCLOUD", "evictionPolicy": "deallocate",
            "location": "westus", "name": "examplevmname", "osType": "linux", "priority": "Spot",
            "resourceGroupName": "macikgo-test-may-23",
            "resourceId": "/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/macikgo-test-may-23/providers/Microsoft.Compute/virtualMachines/examplevmname",
            "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d", "tags": "baz:bash;foo:bar",
            "tagsList": [{"name": "baz", "value": "bash"}, {"name": "foo", "value": "bar"}],
            "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6", "vmScaleSetName": "crpteste9vflji9",
            "vmSize": "Standard_A3", "zone": "", "additionalCapabilities": {"hibernationEnabled": "true"}},
            "network": {"interface": []}}"#;
        let c = serde_json::from_str::<Instance>(doc).unwrap().compute;
        assert_eq!(c.priority, "Spot");
        assert_eq!(c.vm_scale_set_name, "crpteste9vflji9");
        assert_eq!(c.additional_capabilities.hibernation_enabled, "true");
        assert_eq!(
            c.tags_list[1],
            Tag {
                name: "foo".into(),
                value: "bar".into()
            }
        );
    }
}
