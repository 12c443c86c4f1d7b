//! The instance metadata service's HTTP client, for every cloud: plain HTTP/1.1 to a
//! link-local address, one connection of hyper's per request, with no TLS, proxy, redirect or
//! connection pool. It is polled every few seconds for a node's life, and a general client's
//! machinery would cost the async worker tens of KiB of stack on every poll; a proxy must
//! never see a metadata request (Azure refuses one that carries `X-Forwarded-For`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::Method;

/// How long one metadata request may take, unless the caller says otherwise. Off the cloud
/// nothing answers; this keeps startup quick.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The largest metadata answer read; real ones are a few KiB at most.
pub const MAX_BODY: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("instance metadata at {endpoint} did not answer: {source}")]
    Unreachable {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("instance metadata {path}: HTTP {status}")]
    Status { path: String, status: u16 },
    #[error("instance metadata {path}: {message}")]
    Invalid { path: String, message: String },
}

/// An answer: its status, its headers and its body (at most `MAX_BODY` bytes, or the cap the
/// request gave).
pub struct MetadataAnswer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl MetadataAnswer {
    /// The body as text, for the answer to `path`.
    pub fn text(self, path: &str) -> Result<String, MetadataError> {
        String::from_utf8(self.body.into()).map_err(|_| MetadataError::Invalid {
            path: path.into(),
            message: "the answer is not UTF-8".into(),
        })
    }
}

/// One metadata endpoint: where to connect, and what to send as `Host`.
pub struct Endpoint {
    /// The endpoint as configured, for messages.
    pub base: String,
    /// `host:port` to connect to.
    pub authority: String,
    /// The `Host` header: the endpoint's host, with its port if it names one.
    pub host: String,
    /// The path the endpoint's URL ends with, if any, before the service's own paths.
    pub prefix: String,
}

impl Endpoint {
    /// `endpoint` is an `http://` URL (the config checks it); anything else fails every request
    /// as unreachable.
    pub fn new(endpoint: &str) -> Endpoint {
        let base = endpoint.trim_end_matches('/').to_string();
        let rest = base.strip_prefix("http://").unwrap_or_default();
        let (host, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        // A port given, or 80; an IPv6 literal keeps its brackets.
        let authority = match host.rsplit_once(':') {
            Some((_, port)) if !port.contains(']') => host.to_string(),
            _ => format!("{host}:80"),
        };
        Endpoint {
            authority,
            host: host.to_string(),
            prefix: prefix.to_string(),
            base,
        }
    }

    /// Makes one request on a connection of its own, within `timeout`, reading at most
    /// `MAX_BODY` bytes of the answer's body.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&'static str, &str)],
        timeout: Duration,
    ) -> Result<MetadataAnswer, MetadataError> {
        self.request_up_to(method, path, headers, timeout, MAX_BODY)
            .await
    }

    /// As `request`, reading at most `max_body` bytes of the answer's body: for a document
    /// whose documented maximum is larger than `MAX_BODY`.
    pub async fn request_up_to(
        &self,
        method: Method,
        path: &str,
        headers: &[(&'static str, &str)],
        timeout: Duration,
        max_body: usize,
    ) -> Result<MetadataAnswer, MetadataError> {
        let unreachable = |source| MetadataError::Unreachable {
            endpoint: self.base.clone(),
            source,
        };
        if self.authority.starts_with(':') || !self.base.starts_with("http://") {
            return Err(unreachable(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the endpoint is not an http:// URL",
            )));
        }
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header(hyper::header::HOST, &self.host);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| unreachable(std::io::Error::other(e)))?;
        let exchange = async {
            let io = |e| unreachable(std::io::Error::other(e));
            let stream = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(unreachable)?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(io)?;
            // The connection ends once the answer is read and `sender` dropped.
            tokio::spawn(connection);
            let answer = sender.send_request(request).await.map_err(io)?;
            let status = answer.status().as_u16();
            let headers = answer.headers().clone();
            match Limited::new(answer.into_body(), max_body).collect().await {
                Ok(body) => Ok(MetadataAnswer {
                    status,
                    headers,
                    body: body.to_bytes(),
                }),
                // An error's body is only ever a message: the status says enough.
                Err(_) if !(200..300).contains(&status) => Ok(MetadataAnswer {
                    status,
                    headers,
                    body: Bytes::new(),
                }),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    Err(MetadataError::Invalid {
                        path: path.into(),
                        message: format!("the answer is larger than {max_body} bytes"),
                    })
                }
                Err(e) => Err(unreachable(std::io::Error::other(e))),
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(unreachable(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {timeout:?}"),
                )))
            })
    }
}

/// How long a session token lives: the most both EC2 and Alibaba Cloud allow.
const TOKEN_TTL_SECS: u64 = 21_600;

/// A metadata service in session (hardened) mode, as EC2's IMDSv2 and Alibaba Cloud's work: a
/// token from `PUT /latest/api/token` (its lifetime in the `ttl_header`), sent in the
/// `token_header` of every `GET /latest/meta-data/...`, and fetched again before it expires or
/// once a read answers 401.
pub struct TokenSession {
    endpoint: Endpoint,
    ttl_header: &'static str,
    token_header: &'static str,
    token: tokio::sync::Mutex<Option<SessionToken>>,
}

/// A session token and when it was fetched, by the monotonic clock and by the wall clock: the
/// monotonic clock does not advance across a suspend (a hibernate and resume), the wall clock
/// does, so a token expires by whichever says it is older.
struct SessionToken {
    value: String,
    at: std::time::Instant,
    wall: f64,
}

impl SessionToken {
    fn fresh(&self) -> bool {
        let max = (TOKEN_TTL_SECS - 60) as f64;
        let wall_age = crate::time::now() - self.wall;
        self.at.elapsed().as_secs_f64() < max && (0.0..max).contains(&wall_age)
    }
}

impl TokenSession {
    pub fn new(
        endpoint: &str,
        ttl_header: &'static str,
        token_header: &'static str,
    ) -> TokenSession {
        TokenSession {
            endpoint: Endpoint::new(endpoint),
            ttl_header,
            token_header,
            token: tokio::sync::Mutex::new(None),
        }
    }

    /// The session token, fetched now if none is fresh.
    pub async fn token(&self) -> Result<String, MetadataError> {
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref().filter(|t| t.fresh()) {
            return Ok(t.value.clone());
        }
        let path = "/latest/api/token";
        let ttl = TOKEN_TTL_SECS.to_string();
        let answer = self
            .endpoint
            .request(Method::PUT, path, &[(self.ttl_header, &ttl)], TIMEOUT)
            .await?;
        if !(200..300).contains(&answer.status) {
            return Err(MetadataError::Status {
                path: path.into(),
                status: answer.status,
            });
        }
        // A header value cannot end in a newline: a token that did would fail every request.
        let token = answer.text(path)?.trim().to_string();
        if token.is_empty() {
            return Err(MetadataError::Invalid {
                path: path.into(),
                message: "the token is empty".into(),
            });
        }
        *cached = Some(SessionToken {
            value: token.clone(),
            at: std::time::Instant::now(),
            wall: crate::time::now(),
        });
        Ok(token)
    }

    /// GETs `/latest/meta-data/{path}`; `Ok(None)` for 404. A 401 means the token was revoked
    /// or has expired: a new one is fetched and the request made once more.
    pub async fn get(&self, path: &str) -> Result<Option<String>, MetadataError> {
        let mut answer = self.send_get(path).await?;
        if answer.status == 401 {
            *self.token.lock().await = None;
            answer = self.send_get(path).await?;
        }
        match answer.status {
            200 => Ok(Some(answer.text(path)?.trim().to_string())),
            404 => Ok(None),
            status => Err(MetadataError::Status {
                path: path.into(),
                status,
            }),
        }
    }

    async fn send_get(&self, path: &str) -> Result<MetadataAnswer, MetadataError> {
        let token = self.token().await?;
        self.endpoint
            .request(
                Method::GET,
                &format!("/latest/meta-data/{path}"),
                &[(self.token_header, &token)],
                TIMEOUT,
            )
            .await
    }

    /// A path that must be there.
    pub async fn required(&self, path: &str) -> Result<String, MetadataError> {
        self.get(path).await?.ok_or_else(|| MetadataError::Status {
            path: path.into(),
            status: 404,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_gives_the_address_host_and_path() {
        let cases = [
            ("http://169.254.169.254", "169.254.169.254:80", ""),
            ("http://127.0.0.1:8080/", "127.0.0.1:8080", ""),
            ("http://[fd00:ec2::254]", "[fd00:ec2::254]:80", ""),
            ("http://[::1]:1338/imds", "[::1]:1338", "/imds"),
            ("http://metadata.local/x/y/", "metadata.local:80", "/x/y"),
        ];
        for (endpoint, authority, prefix) in cases {
            let e = Endpoint::new(endpoint);
            assert_eq!(e.authority, authority, "{endpoint}");
            assert_eq!(e.prefix, prefix, "{endpoint}");
        }
        // A port the endpoint does not name is not sent.
        assert_eq!(
            Endpoint::new("http://169.254.169.254/").host,
            "169.254.169.254"
        );
    }
}
