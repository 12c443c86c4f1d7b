//! Instance metadata (IMDSv2): identity, lifecycle, tags and spot interruption notices.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Deserialize;
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

pub use gpuwatch_core::node::Node;

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
    token: Mutex<Option<Token>>,
}

/// A session token and when it was fetched, by the monotonic clock and by the wall clock: the
/// monotonic clock does not advance across a suspend (a hibernate and resume), the wall clock
/// does, so a token expires by whichever says it is older.
struct Token {
    value: String,
    at: Instant,
    wall: f64,
}

impl Token {
    fn fresh(&self) -> bool {
        let max = (TOKEN_TTL_SECS - 60) as f64;
        let wall_age = crate::time::now() - self.wall;
        self.at.elapsed().as_secs_f64() < max && (0.0..max).contains(&wall_age)
    }
}

/// The largest metadata answer read; real ones are a few hundred bytes.
const MAX_BODY: usize = 64 * 1024;

impl Imds {
    pub fn new(endpoint: &str) -> Imds {
        let http = crate::web::tls::http_client()
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
        if let Some(t) = cached.as_ref().filter(|t| t.fresh()) {
            return Ok(t.value.clone());
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
        let token = self.body(path, resp).await?;
        *cached = Some(Token {
            value: token.clone(),
            at: Instant::now(),
            wall: crate::time::now(),
        });
        Ok(token)
    }

    /// Forgets the token, so the next request fetches a new one.
    async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    /// Reads an answer's body, at most `MAX_BODY` bytes.
    async fn body(&self, path: &str, mut resp: reqwest::Response) -> Result<String, ImdsError> {
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|source| self.unreachable(source))?
        {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(ImdsError::Invalid {
                    path: path.into(),
                    message: format!("the answer is larger than {MAX_BODY} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body).map_err(|_| ImdsError::Invalid {
            path: path.into(),
            message: "the answer is not UTF-8".into(),
        })
    }

    fn unreachable(&self, source: reqwest::Error) -> ImdsError {
        ImdsError::Unreachable {
            endpoint: self.base.clone(),
            source,
        }
    }

    /// GETs a metadata path; `Ok(None)` for 404. A 401 means the token was revoked or has
    /// expired: a new one is fetched and the request made once more.
    async fn get(&self, path: &str) -> Result<Option<String>, ImdsError> {
        let mut resp = self.send_get(path).await?;
        if resp.status().as_u16() == 401 {
            self.forget_token().await;
            resp = self.send_get(path).await?;
        }
        match resp.status().as_u16() {
            200 => Ok(Some(self.body(path, resp).await?.trim().to_string())),
            404 => Ok(None),
            status => Err(ImdsError::Status {
                path: path.into(),
                status,
            }),
        }
    }

    async fn send_get(&self, path: &str) -> Result<reqwest::Response, ImdsError> {
        let token = self.token().await?;
        self.http
            .get(format!("{}/latest/meta-data/{path}", self.base))
            .header("X-aws-ec2-metadata-token", token)
            .send()
            .await
            .map_err(|source| self.unreachable(source))
    }

    async fn required(&self, path: &str) -> Result<String, ImdsError> {
        self.get(path).await?.ok_or_else(|| ImdsError::Status {
            path: path.into(),
            status: 404,
        })
    }

    pub async fn identity(&self) -> Result<Node, ImdsError> {
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
        Ok(Node {
            instance_id,
            instance_type,
            availability_zone,
            region,
            lifecycle,
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

    /// The current spot interruption notice, if any.
    pub async fn interruption(&self) -> Result<Option<Notice>, ImdsError> {
        self.notice("spot/instance-action", parse_instance_action)
            .await
    }

    /// The current rebalance recommendation, if any. It is advice that the instance is at
    /// elevated risk of interruption, not an interruption.
    pub async fn rebalance(&self) -> Result<Option<Notice>, ImdsError> {
        self.notice("events/recommendations/rebalance", parse_rebalance)
            .await
    }

    async fn notice(
        &self,
        path: &str,
        parse: fn(&str) -> Result<Notice, String>,
    ) -> Result<Option<Notice>, ImdsError> {
        match self.get(path).await? {
            None => Ok(None),
            Some(body) => parse(&body)
                .map(Some)
                .map_err(|message| ImdsError::Invalid {
                    path: path.into(),
                    message,
                }),
        }
    }
}

/// Parses a `spot/instance-action` answer: `{"action": "terminate", "time": "<RFC 3339>"}`.
pub fn parse_instance_action(body: &str) -> Result<Notice, String> {
    let a: InstanceAction = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let time = crate::time::parse_rfc3339(&a.time)
        .ok_or_else(|| format!("time {:?} is not RFC 3339", a.time))?;
    Ok(Notice::Interruption {
        action: a.action,
        time,
    })
}

/// Parses an `events/recommendations/rebalance` answer: `{"noticeTime": "<RFC 3339>"}`.
pub fn parse_rebalance(body: &str) -> Result<Notice, String> {
    let r: RebalanceNotice = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let time = crate::time::parse_rfc3339(&r.notice_time)
        .ok_or_else(|| format!("noticeTime {:?} is not RFC 3339", r.notice_time))?;
    Ok(Notice::Rebalance { time })
}
