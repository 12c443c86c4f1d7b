//! EC2 instance metadata (IMDSv2): identity, lifecycle, tags and spot interruption notices,
//! through the metadata client every cloud shares (`cloud::metadata`).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::rules::Lifecycle;

use crate::cloud::metadata::{MetadataError as ImdsError, TokenSession};

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

pub struct Ec2Metadata {
    session: TokenSession,
}

impl Ec2Metadata {
    /// `endpoint` is an `http://` URL (the config checks it); anything else fails every request
    /// as unreachable.
    pub fn new(endpoint: &str) -> Ec2Metadata {
        Ec2Metadata {
            session: TokenSession::new(
                endpoint,
                "X-aws-ec2-metadata-token-ttl-seconds",
                "X-aws-ec2-metadata-token",
            ),
        }
    }

    #[cfg(test)]
    async fn token(&self) -> Result<String, ImdsError> {
        self.session.token().await
    }

    async fn get(&self, path: &str) -> Result<Option<String>, ImdsError> {
        self.session.get(path).await
    }

    async fn required(&self, path: &str) -> Result<String, ImdsError> {
        self.session.required(path).await
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
            Some(other) => {
                // A Capacity Block or a scheduled instance is billed otherwise than on demand.
                tracing::warn!(
                    lifecycle = ?other.chars().take(64).collect::<String>(),
                    "the instance is neither on-demand nor spot: no on-demand price applies, so spend is unknown unless [cost] hourly_price_usd is set"
                );
                None
            }
            None => {
                tracing::warn!("instance metadata does not say whether the instance is on-demand or spot: no on-demand price applies, so spend is unknown unless [cost] hourly_price_usd is set");
                None
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::metadata::TIMEOUT;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one connection: reads the request head, writes `answer` (if any), and returns the
    /// head once the client has closed the connection.
    async fn serve_once(answer: Option<Vec<u8>>) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            if let Some(answer) = answer {
                let _ = stream.write_all(&answer).await;
            }
            while stream.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            String::from_utf8(head).unwrap()
        });
        (format!("http://{addr}"), task)
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused_and_a_token_is_trimmed() {
        let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: 70000\r\n\r\n".to_vec();
        answer.resize(answer.len() + 70_000, b'a');
        let (endpoint, server) = serve_once(Some(answer)).await;
        let imds = Ec2Metadata::new(&endpoint);
        let err = imds.token().await.unwrap_err();
        assert!(
            err.to_string()
                .ends_with("/latest/api/token: the answer is larger than 65536 bytes"),
            "{err}"
        );
        // The client let go of the connection.
        server.await.unwrap();
        let (endpoint, server) = serve_once(Some(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nAQ==\n".to_vec(),
        ))
        .await;
        let imds = Ec2Metadata::new(&endpoint);
        assert_eq!(imds.token().await.unwrap(), "AQ==");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_endpoint_is_unreachable_after_the_timeout_and_saw_the_token_request() {
        let (endpoint, server) = serve_once(None).await;
        let started = Instant::now();
        let err = Ec2Metadata::new(&endpoint).token().await.unwrap_err();
        assert!(started.elapsed() >= TIMEOUT);
        assert!(
            matches!(&err, ImdsError::Unreachable { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
            "{err}"
        );
        let head = tokio::time::timeout(TIMEOUT * 3, server)
            .await
            .unwrap()
            .unwrap()
            .to_ascii_lowercase();
        assert!(
            head.starts_with("put /latest/api/token http/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("host: {}\r\n", &endpoint[7..])),
            "{head}"
        );
        assert!(
            head.contains("x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n"),
            "{head}"
        );
    }
}
