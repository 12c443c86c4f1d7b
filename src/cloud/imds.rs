//! Instance metadata (IMDSv2): identity, lifecycle, tags and spot interruption notices.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::rules::Lifecycle;

/// How long one metadata request may take. Off EC2 nothing answers; this keeps startup quick.
const TIMEOUT: Duration = Duration::from_secs(2);
const TOKEN_TTL_SECS: u64 = 21_600;

#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    #[error("instance metadata at {endpoint} did not answer: {source}")]
    Unreachable {
        endpoint: String,
        source: reqwest::Error,
    },
    #[error("instance metadata {path}: HTTP {status}")]
    Status { path: String, status: u16 },
    #[error("instance metadata {path}: {message}")]
    Invalid { path: String, message: String },
}

/// What the instance is, from its metadata.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Identity {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub region: String,
    /// `None` when the metadata does not say.
    pub lifecycle: Option<Lifecycle>,
    /// Empty unless instance metadata tags are enabled.
    pub tags: BTreeMap<String, String>,
}

/// A spot interruption notice or a rebalance recommendation.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// `spot/instance-action`: the instance will be stopped, hibernated or terminated at `time`.
    Interruption { action: String, time: f64 },
    /// `events/recommendations/rebalance`.
    Rebalance { time: f64 },
}

#[derive(Deserialize)]
struct InstanceAction {
    action: String,
    time: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RebalanceNotice {
    notice_time: String,
}

pub struct Imds {
    base: String,
    http: reqwest::Client,
    token: Mutex<Option<(String, Instant)>>,
}

impl Imds {
    pub fn new(endpoint: &str) -> Imds {
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .no_proxy()
            .build()
            .unwrap_or_default();
        Imds {
            base: endpoint.trim_end_matches('/').to_string(),
            http,
            token: Mutex::new(None),
        }
    }

    async fn token(&self) -> Result<String, ImdsError> {
        let mut cached = self.token.lock().await;
        if let Some((t, at)) = cached.as_ref() {
            if at.elapsed() < Duration::from_secs(TOKEN_TTL_SECS - 60) {
                return Ok(t.clone());
            }
        }
        let path = "/latest/api/token";
        let resp = self
            .http
            .put(format!("{}{path}", self.base))
            .header(
                "X-aws-ec2-metadata-token-ttl-seconds",
                TOKEN_TTL_SECS.to_string(),
            )
            .send()
            .await
            .map_err(|source| self.unreachable(source))?;
        if !resp.status().is_success() {
            return Err(ImdsError::Status {
                path: path.into(),
                status: resp.status().as_u16(),
            });
        }
        let token = resp
            .text()
            .await
            .map_err(|source| self.unreachable(source))?;
        *cached = Some((token.clone(), Instant::now()));
        Ok(token)
    }

    fn unreachable(&self, source: reqwest::Error) -> ImdsError {
        ImdsError::Unreachable {
            endpoint: self.base.clone(),
            source,
        }
    }

    /// GETs a metadata path; `Ok(None)` for 404.
    async fn get(&self, path: &str) -> Result<Option<String>, ImdsError> {
        let token = self.token().await?;
        let resp = self
            .http
            .get(format!("{}/latest/meta-data/{path}", self.base))
            .header("X-aws-ec2-metadata-token", token)
            .send()
            .await
            .map_err(|source| self.unreachable(source))?;
        match resp.status().as_u16() {
            200 => Ok(Some(
                resp.text()
                    .await
                    .map_err(|source| self.unreachable(source))?
                    .trim()
                    .to_string(),
            )),
            404 => Ok(None),
            status => Err(ImdsError::Status {
                path: path.into(),
                status,
            }),
        }
    }

    async fn required(&self, path: &str) -> Result<String, ImdsError> {
        self.get(path).await?.ok_or_else(|| ImdsError::Status {
            path: path.into(),
            status: 404,
        })
    }

    pub async fn identity(&self) -> Result<Identity, ImdsError> {
        let instance_id = self.required("instance-id").await?;
        let instance_type = self.required("instance-type").await?;
        let availability_zone = self.required("placement/availability-zone").await?;
        let region = match self.get("placement/region").await? {
            Some(r) => r,
            None => availability_zone
                .trim_end_matches(|c: char| c.is_ascii_alphabetic())
                .to_string(),
        };
        let lifecycle = match self.get("instance-life-cycle").await?.as_deref() {
            Some("spot") => Some(Lifecycle::Spot),
            Some("on-demand") => Some(Lifecycle::OnDemand),
            _ => None,
        };
        Ok(Identity {
            instance_id,
            instance_type,
            availability_zone,
            region,
            lifecycle,
            tags: self.tags().await?,
        })
    }

    /// Instance tags, when instance metadata tags are enabled (404 otherwise: no tags).
    pub async fn tags(&self) -> Result<BTreeMap<String, String>, ImdsError> {
        let mut tags = BTreeMap::new();
        let Some(keys) = self.get("tags/instance").await? else {
            return Ok(tags);
        };
        for key in keys.lines().map(str::trim).filter(|k| !k.is_empty()) {
            if let Some(v) = self.get(&format!("tags/instance/{key}")).await? {
                tags.insert(key.to_string(), v);
            }
        }
        Ok(tags)
    }

    /// The current interruption notice, if any. An interruption wins over a rebalance.
    pub async fn notice(&self) -> Result<Option<Notice>, ImdsError> {
        let path = "spot/instance-action";
        if let Some(a) = self.get_json::<InstanceAction>(path).await? {
            let time = crate::time::parse_rfc3339(&a.time).ok_or_else(|| ImdsError::Invalid {
                path: path.into(),
                message: format!("time \"{}\" is not RFC 3339", a.time),
            })?;
            return Ok(Some(Notice::Interruption {
                action: a.action,
                time,
            }));
        }
        let path = "events/recommendations/rebalance";
        if let Some(r) = self.get_json::<RebalanceNotice>(path).await? {
            let time = crate::time::parse_rfc3339(&r.notice_time).unwrap_or_else(crate::time::now);
            return Ok(Some(Notice::Rebalance { time }));
        }
        Ok(None)
    }

    /// GETs a metadata path holding JSON; `Ok(None)` for 404.
    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Option<T>, ImdsError> {
        let Some(body) = self.get(path).await? else {
            return Ok(None);
        };
        serde_json::from_str(&body)
            .map(Some)
            .map_err(|e| ImdsError::Invalid {
                path: path.into(),
                message: e.to_string(),
            })
    }
}
