//! Compute Engine's metadata server: every request says `Metadata-Flavor: Google`, and an
//! answer is believed only if it says the same (anything else on that address is not the
//! metadata server).

use hyper::Method;
use serde::Deserialize;

use crate::cloud::metadata::{Endpoint, MetadataError, TIMEOUT};
use crate::cloud::rest::BearerToken;

const FLAVOR: (&str, &str) = ("Metadata-Flavor", "Google");

pub struct GceMetadata {
    endpoint: Endpoint,
}

/// The service account's token answer.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<f64>,
    #[serde(default)]
    token_type: String,
}

impl GceMetadata {
    pub fn new(endpoint: &str) -> GceMetadata {
        GceMetadata {
            endpoint: Endpoint::new(endpoint),
        }
    }

    /// GETs `computeMetadata/v1/{path}`: `Ok(None)` for 404 (an attribute not set).
    pub async fn get(&self, path: &str) -> Result<Option<String>, MetadataError> {
        let full = format!("/computeMetadata/v1/{path}");
        let answer = self
            .endpoint
            .request(Method::GET, &full, &[FLAVOR], TIMEOUT)
            .await?;
        let flavor = answer
            .headers
            .get("metadata-flavor")
            .and_then(|v| v.to_str().ok());
        if flavor != Some("Google") {
            return Err(MetadataError::Invalid {
                path: full,
                message: format!(
                    "the answer (HTTP {}) does not say Metadata-Flavor: Google, so it is not the metadata server's",
                    answer.status
                ),
            });
        }
        match answer.status {
            200 => Ok(Some(answer.text(&full)?.trim().to_string())),
            404 => Ok(None),
            status => Err(MetadataError::Status { path: full, status }),
        }
    }

    /// A value that must be there.
    pub async fn required(&self, path: &str) -> Result<String, MetadataError> {
        match self.get(path).await? {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(MetadataError::Status {
                path: format!("/computeMetadata/v1/{path}"),
                status: 404,
            }),
        }
    }

    /// A token of the VM's default service account.
    pub async fn token(&self) -> Result<BearerToken, MetadataError> {
        let path = "instance/service-accounts/default/token";
        let body = self.required(path).await?;
        let invalid = |message: &str| MetadataError::Invalid {
            path: format!("/computeMetadata/v1/{path}"),
            message: message.into(),
        };
        let answer: TokenAnswer =
            serde_json::from_str(&body).map_err(|_| invalid("the token answer does not parse"))?;
        if answer.access_token.is_empty()
            || !answer.token_type.eq_ignore_ascii_case("bearer")
            || !answer.access_token.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(invalid("the answer holds no bearer token"));
        }
        let expires_in = answer
            .expires_in
            .filter(|s| s.is_finite() && *s >= 0.0)
            .ok_or_else(|| invalid("the token's expiry is missing"))?;
        Ok(BearerToken {
            value: answer.access_token,
            expires_on: crate::time::now() + expires_in,
        })
    }
}

/// The last part of a metadata path value: `projects/123/zones/us-central1-a` is
/// `us-central1-a`.
pub fn last(value: &str) -> &str {
    value.rsplit('/').next().unwrap_or(value)
}

/// A zone's region: the zone less its last part (`us-central1-a` is in `us-central1`).
pub fn region(zone: &str) -> &str {
    zone.rsplit_once('-').map_or(zone, |(r, _)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_give_names_and_zones_their_region() {
        assert_eq!(
            last("projects/123456789/zones/us-central1-a"),
            "us-central1-a"
        );
        assert_eq!(
            last("projects/123456789/machineTypes/a2-highgpu-1g"),
            "a2-highgpu-1g"
        );
        assert_eq!(region("us-central1-a"), "us-central1");
        assert_eq!(region("europe-west4-b"), "europe-west4");
    }
}
