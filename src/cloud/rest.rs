//! A cloud's HTTP API, for every cloud: Azure Resource Manager and Compute Engine with bearer
//! tokens, ECS with Alibaba Cloud's signature, each an [`Authorization`] on the shared client
//! (`client.rs`: one HTTP client, a cap on answers, credentials kept until shortly before they
//! expire), the credentials fetched again once when the cloud refuses them as stale. No token,
//! key or signature is ever logged or put in an error.

use std::time::Duration;

use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::{Method, StatusCode};

use super::client::{Cached, Http, MAX_BODY};
use super::{CloudError, ErrorKind, Fut};

/// A bearer token, and when it expires (Unix seconds).
#[derive(Clone)]
pub struct BearerToken {
    pub value: String,
    pub expires_on: f64,
}

/// Never shown: a token is a secret.
impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(expires_on: {})", self.expires_on)
    }
}

/// Fetches a new token, for the operation that needs it.
pub type TokenSource =
    Box<dyn Fn(&'static str) -> Fut<'static, Result<BearerToken, CloudError>> + Send + Sync>;

/// A request about to be sent, as an [`Authorization`] signs it.
pub struct Outgoing<'a> {
    pub method: &'a Method,
    pub url: &'a reqwest::Url,
    pub body: &'a [u8],
}

/// What proves who sends a request: a bearer token, a signature.
pub trait Authorization: Send + Sync {
    /// The headers that authorize `request` for `operation`, with the credentials fetched
    /// again first where `renew` says (the cloud refused them as stale).
    fn headers<'a>(
        &'a self,
        operation: &'static str,
        request: &'a Outgoing<'a>,
        renew: bool,
    ) -> Fut<'a, Result<Vec<(String, String)>, CloudError>>;

    /// Whether `answer` refuses the credentials as stale: they are fetched again, and the
    /// request sent again, once.
    fn stale(&self, answer: &RestAnswer) -> bool {
        answer.status == StatusCode::UNAUTHORIZED
    }
}

/// A bearer token from `tokens`, kept until shortly before it expires.
pub struct Bearer {
    tokens: TokenSource,
    token: Cached<String>,
}

impl Bearer {
    pub fn new(tokens: TokenSource) -> Bearer {
        Bearer {
            tokens,
            token: Cached::default(),
        }
    }
}

impl Authorization for Bearer {
    fn headers<'a>(
        &'a self,
        operation: &'static str,
        _request: &'a Outgoing<'a>,
        renew: bool,
    ) -> Fut<'a, Result<Vec<(String, String)>, CloudError>> {
        Box::pin(async move {
            let token = self
                .token
                .get(renew, || async {
                    let token = (self.tokens)(operation).await?;
                    crate::redact::hold_secret(&token.value);
                    Ok((token.value, token.expires_on))
                })
                .await?;
            Ok(vec![(AUTHORIZATION.to_string(), format!("Bearer {token}"))])
        })
    }
}

/// An answer: its status, headers and body.
pub struct RestAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl RestAnswer {
    /// A header's value, when it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// How long the cloud asks to be left alone (`Retry-After`), where it says.
    pub fn retry_after(&self) -> Option<Duration> {
        retry_after(&self.headers)
    }
}

/// `Retry-After` in seconds (RFC 9110 also allows an HTTP date: that one counts from now), or
/// `None` where it is absent or neither.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = crate::time::parse_http_date(value)?;
    Some(Duration::from_secs_f64((at - crate::time::now()).max(0.0)))
}

pub struct Rest {
    /// The endpoint, without a trailing slash.
    pub base: String,
    authorization: Box<dyn Authorization>,
    http: Http,
}

impl Rest {
    pub fn new(base: &str, authorization: Box<dyn Authorization>) -> Rest {
        Rest {
            base: base.trim_end_matches('/').to_string(),
            authorization,
            http: Http::default(),
        }
    }

    /// An API of bearer tokens from `tokens`.
    pub fn bearer(base: &str, tokens: TokenSource) -> Rest {
        Rest::new(base, Box::new(Bearer::new(tokens)))
    }

    /// Sends one request to `url` (a path under the endpoint, or a URL on it), authorized; an
    /// answer that refuses the credentials as stale renews them and tries once more. A `GET`
    /// may be sent again; any other call only if it never left.
    pub async fn send(
        &self,
        operation: &'static str,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<RestAnswer, CloudError> {
        let mutating = method != Method::GET;
        self.send_as(operation, method, url, body, mutating).await
    }

    /// [`send`](Rest::send), where the caller says whether the call changes something (an RPC
    /// API's reads are `POST`s too).
    pub async fn send_as(
        &self,
        operation: &'static str,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
        mutating: bool,
    ) -> Result<RestAnswer, CloudError> {
        let url = if url.starts_with('/') {
            format!("{}{url}", self.base)
        } else {
            url.to_string()
        };
        if !same_origin(&self.base, &url) {
            return Err(CloudError {
                operation,
                kind: ErrorKind::Other,
                message: format!(
                    "{} is not on {}: not sent",
                    crate::redact::urls(&url),
                    self.base
                ),
                request_id: None,
                retry_after: None,
            });
        }
        let parsed = reqwest::Url::parse(&url).map_err(|e| CloudError {
            operation,
            kind: ErrorKind::Other,
            message: format!("{} is not a URL: {e}", crate::redact::urls(&url)),
            request_id: None,
            retry_after: None,
        })?;
        let body = body.map(|b| b.to_string());
        let outgoing = Outgoing {
            method: &method,
            url: &parsed,
            body: body.as_deref().unwrap_or_default().as_bytes(),
        };
        let mut renew = false;
        loop {
            let headers = (self.authorization)
                .headers(operation, &outgoing, renew)
                .await?;
            let mut request = self
                .http
                .get(operation)?
                .request(method.clone(), parsed.clone());
            for (name, value) in headers {
                request = request.header(name, value);
            }
            request = match &body {
                Some(b) => request
                    .header(CONTENT_TYPE, "application/json")
                    .body(b.clone()),
                // A call without a body says so: some front ends refuse one that doesn't.
                None if method != Method::GET => request.header(CONTENT_LENGTH, "0"),
                None => request,
            };
            let response = request
                .send()
                .await
                .map_err(|e| exchange_error(operation, mutating, e.is_connect(), &e.to_string()))?;
            let (status, headers) = (response.status(), response.headers().clone());
            let body = crate::client::read_body(response, MAX_BODY)
                .await
                .map_err(|e| exchange_error(operation, mutating, false, &e.to_string()))?
                .ok_or_else(|| {
                    let why = format!("the answer is larger than {MAX_BODY} bytes");
                    exchange_error(operation, mutating, false, &why)
                })?;
            let answer = RestAnswer {
                status,
                headers,
                body,
            };
            if !renew && self.authorization.stale(&answer) {
                renew = true;
                continue;
            }
            return Ok(answer);
        }
    }
}

/// An error of a call's own exchange (no answer, an answer cut short or too large). A read, or a
/// call that never left (no connection was made), is worth sending again. A call that changes
/// something and was sent may have been carried out: its outcome is unknown, and it is never
/// sent again (a second stop, deallocate or delete would be refused, or repeated, and the
/// audit log would call an action that ran a failure).
pub fn exchange_error(
    operation: &'static str,
    mutating: bool,
    never_sent: bool,
    what: &str,
) -> CloudError {
    let what = crate::redact::urls(what);
    let (kind, message) = if !mutating || never_sent {
        (ErrorKind::Retryable, what)
    } else {
        (
            ErrorKind::Other,
            format!("the call was sent, but its answer was lost ({what}): its outcome is unknown, and it is not sent again"),
        )
    };
    CloudError {
        operation,
        kind,
        message,
        request_id: None,
        retry_after: None,
    }
}

/// Percent-encodes a query value: everything but letters, digits and `-_.~` (RFC 3986's
/// unreserved characters), so a space is `%20`.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether `url` is on the same scheme, host and port as `base`.
pub fn same_origin(base: &str, url: &str) -> bool {
    match (reqwest::Url::parse(base), reqwest::Url::parse(url)) {
        (Ok(a), Ok(b)) => {
            a.scheme() == b.scheme()
                && a.host_str() == b.host_str()
                && a.port_or_known_default() == b.port_or_known_default()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read, or a call that never left, is sent again; a call that changes something and was
    /// sent is not: its outcome is unknown.
    #[test]
    fn a_mutating_call_whose_answer_was_lost_is_never_sent_again() {
        let kind = |mutating, never_sent| exchange_error("Op", mutating, never_sent, "reset").kind;
        assert_eq!(kind(false, false), ErrorKind::Retryable);
        assert_eq!(kind(true, true), ErrorKind::Retryable);
        assert_eq!(kind(true, false), ErrorKind::Other);
        let e = exchange_error("Op", true, false, "reset by https://h.example/x?sig=1");
        assert!(e.message.contains("outcome is unknown"), "{}", e.message);
        assert!(!e.message.contains("sig=1"), "{}", e.message);
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(reqwest::header::RETRY_AFTER, "17".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(17)));
        h.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn a_url_elsewhere_is_not_the_endpoint() {
        let base = "https://management.azure.com";
        assert!(same_origin(base, "https://management.azure.com/subscriptions/s/providers/Microsoft.Compute/locations/westus/operations/1?api-version=2024-11-01"));
        assert!(same_origin(base, "https://management.azure.com:443/x"));
        for other in [
            "http://management.azure.com/x",
            "https://evil.example/x",
            "https://management.azure.com.evil.example/x",
            "https://management.azure.com:8443/x",
            "not a url",
        ] {
            assert!(!same_origin(base, other), "{other}");
        }
    }
}
