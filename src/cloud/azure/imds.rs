//! Azure's Instance Metadata Service: the instance document, the managed identity's tokens and
//! Scheduled Events. Every request carries `Metadata: true` and goes straight to the endpoint,
//! never through a proxy (`cloud::metadata`).

use std::time::Duration;

use hyper::Method;
use serde::Deserialize;

use crate::cloud::metadata::{Endpoint, MetadataError, MAX_BODY, TIMEOUT};
use crate::cloud::rest::BearerToken;

/// The instance document's version: the first with every field read here
/// (`additionalCapabilities.hibernationEnabled` came last).
pub const INSTANCE_API_VERSION: &str = "2021-12-13";
pub const TOKEN_API_VERSION: &str = "2018-02-01";
pub const EVENTS_API_VERSION: &str = "2020-07-01";
/// The audience of the tokens asked for, by default: the public cloud's Resource Manager.
pub const RESOURCE: &str = "https://management.azure.com/";

/// How long the first Scheduled Events request may take: Azure enables the service on it, and
/// it "can take up to two minutes".
pub const EVENTS_TIMEOUT: Duration = Duration::from_secs(150);

/// How long a Scheduled Events read may take once the service has answered: a poll interval,
/// within 1 s and 10 s. The service is on the host; a read that takes longer is no answer.
pub fn events_read_timeout(every: Duration) -> Duration {
    every.clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// The most bytes of `compute` read. From api-version 2021-01-01 it carries the VM's user
/// data (at most 64 KiB, base64: 87,384 bytes) and its tags twice (`tags` and `tagsList`: 50
/// tags of a 512-character name and a 256-character value, 460,800 bytes at JSON's worst of
/// six bytes a character), besides its disks, keys and names (tens of KiB): some 650 KB in
/// all, held to 1 MiB.
pub const COMPUTE_MAX_BODY: usize = 1024 * 1024;

/// The audience of the managed identity's tokens: the Resource Manager endpoint's origin with
/// a `/` (`https://management.usgovcloudapi.net/` in Azure Government,
/// `https://management.chinacloudapi.cn/` in Azure China), or the public cloud's.
pub fn resource_for(endpoint_url: Option<&str>) -> String {
    endpoint_url
        .and_then(|u| reqwest::Url::parse(u).ok())
        .map(|u| u.origin())
        .filter(|o| o.is_tuple())
        .map_or_else(
            || RESOURCE.to_string(),
            |o| format!("{}/", o.ascii_serialization()),
        )
}

/// `compute` of the instance document. Every value is a string; one that does not apply is
/// an empty string.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct VmDocument {
    pub subscription_id: String,
    pub resource_group_name: String,
    pub name: String,
    pub vm_id: String,
    pub vm_size: String,
    pub location: String,
    pub zone: String,
    pub priority: String,
    pub eviction_policy: String,
    /// The tags as one string, `name:value` pairs joined by `;`.
    pub tags: String,
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

impl VmDocument {
    /// The VM's tags: `tagsList`, or, where the document has none, the `tags` string.
    pub fn tag_pairs(&self) -> Vec<(String, String)> {
        if !self.tags_list.is_empty() {
            return self
                .tags_list
                .iter()
                .map(|t| (t.name.clone(), t.value.clone()))
                .collect();
        }
        split_tags(&self.tags)
    }
}

/// The `tags` string's pairs. A pair is split at its first `:`, but gpuwatch's own names hold
/// one (`gpuwatch:hold`): a pair that starts `gpuwatch:` is split at its second.
pub fn split_tags(tags: &str) -> Vec<(String, String)> {
    tags.split(';')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let skip = if pair
                .get(..9)
                .is_some_and(|p| p.eq_ignore_ascii_case("gpuwatch:"))
            {
                9
            } else {
                0
            };
            match pair[skip..].find(':') {
                Some(at) => (
                    pair[..skip + at].to_string(),
                    pair[skip + at + 1..].to_string(),
                ),
                None => (pair.to_string(), String::new()),
            }
        })
        .collect()
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

pub struct AzureMetadata {
    endpoint: Endpoint,
    /// `client_id` of a user-assigned identity; empty: the VM's system-assigned one.
    client_id: String,
    /// The audience of the tokens: Resource Manager's (`resource_for`).
    resource: String,
}

impl AzureMetadata {
    pub fn new(endpoint: &str, client_id: &str, resource: &str) -> AzureMetadata {
        AzureMetadata {
            endpoint: Endpoint::new(endpoint),
            client_id: client_id.to_string(),
            resource: resource.to_string(),
        }
    }

    async fn get(
        &self,
        path: &str,
        timeout: Duration,
        max_body: usize,
    ) -> Result<(u16, String), MetadataError> {
        let answer = self
            .endpoint
            .request_up_to(
                Method::GET,
                path,
                &[("Metadata", "true")],
                timeout,
                max_body,
            )
            .await?;
        let status = answer.status;
        Ok((status, answer.text(path)?))
    }

    /// `compute` of the instance document, read alone: the rest (the network) is not needed.
    pub async fn compute(&self) -> Result<VmDocument, MetadataError> {
        let path = format!("/metadata/instance/compute?api-version={INSTANCE_API_VERSION}");
        let (status, body) = self.get(&path, TIMEOUT, COMPUTE_MAX_BODY).await?;
        if status != 200 {
            return Err(MetadataError::Status { path, status });
        }
        let c: VmDocument = serde_json::from_str(&body).map_err(|e| MetadataError::Invalid {
            path: path.clone(),
            message: format!("the instance document does not parse: {e}"),
        })?;
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
    pub async fn token(&self) -> Result<BearerToken, MetadataError> {
        let mut path = format!(
            "/metadata/identity/oauth2/token?api-version={TOKEN_API_VERSION}&resource={}",
            crate::cloud::rest::encode(&self.resource)
        );
        if !self.client_id.is_empty() {
            path.push_str("&client_id=");
            path.push_str(&crate::cloud::rest::encode(&self.client_id));
        }
        // The path names no secret; the answer is one, and is never put in an error.
        let shown = "/metadata/identity/oauth2/token";
        let (status, body) = self.get(&path, TIMEOUT, MAX_BODY).await?;
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
        Ok(BearerToken {
            value: answer.access_token,
            expires_on,
        })
    }

    /// The scheduled events of this VM's host, read within `timeout`.
    pub async fn events(&self, timeout: Duration) -> Result<Events, MetadataError> {
        let path = format!("/metadata/scheduledevents?api-version={EVENTS_API_VERSION}");
        let (status, body) = self.get(&path, timeout, MAX_BODY).await?;
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
        let doc: serde_json::Value = serde_json::from_str(doc).unwrap();
        let c: VmDocument = serde_json::from_value(doc["compute"].clone()).unwrap();
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

    /// A hold set in `tags` is read where the document has no `tagsList`; `tagsList` comes
    /// first where it has one.
    #[test]
    fn tags_are_read_from_tags_list_or_else_the_tags_string() {
        let mut c = VmDocument {
            tags: "team:ml;gpuwatch:hold:2026-12-24T00:00:00Z;GPUWatch:Rule:idle;bare;note:a:b"
                .into(),
            ..VmDocument::default()
        };
        let pairs = |c: &VmDocument| -> Vec<(String, String)> { c.tag_pairs() };
        let own = |n: &str, v: &str| (n.to_string(), v.to_string());
        assert_eq!(
            pairs(&c),
            [
                own("team", "ml"),
                own("gpuwatch:hold", "2026-12-24T00:00:00Z"),
                own("GPUWatch:Rule", "idle"),
                own("bare", ""),
                own("note", "a:b"),
            ]
        );
        c.tags_list = vec![Tag {
            name: "team".into(),
            value: "ml".into(),
        }];
        assert_eq!(pairs(&c), [own("team", "ml")]);
        assert!(split_tags("").is_empty());
    }

    #[test]
    fn the_token_s_audience_is_the_resource_manager_endpoint_s_origin() {
        for (endpoint, resource) in [
            (None, "https://management.azure.com/"),
            (
                Some("https://management.usgovcloudapi.net"),
                "https://management.usgovcloudapi.net/",
            ),
            (
                Some("https://management.chinacloudapi.cn/"),
                "https://management.chinacloudapi.cn/",
            ),
            (
                Some("https://management.azure.com:443/x/y"),
                "https://management.azure.com/",
            ),
            (Some("http://127.0.0.1:8080/arm"), "http://127.0.0.1:8080/"),
            (Some("not a url"), "https://management.azure.com/"),
        ] {
            assert_eq!(resource_for(endpoint), resource, "{endpoint:?}");
        }
    }

    #[test]
    fn later_scheduled_events_reads_have_a_short_timeout() {
        let s = Duration::from_secs;
        assert_eq!(events_read_timeout(Duration::from_millis(200)), s(1));
        assert_eq!(events_read_timeout(s(5)), s(5));
        assert_eq!(events_read_timeout(s(60)), s(10));
        assert!(events_read_timeout(s(3600)) < EVENTS_TIMEOUT);
    }
}
