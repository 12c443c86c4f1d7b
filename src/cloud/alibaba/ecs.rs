//! The ECS API (2014-05-26, RPC style), for this one instance: every call a `POST /` with its
//! parameters in the query, signed with signature V3 under the instance RAM role's STS
//! credentials from instance metadata, renewed before they expire. No secret or token is ever
//! logged or put in an error. `RAM_ACTIONS` and `config/alibaba-ram-policy.json` list the same
//! actions; a test keeps them in step.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::sign;
use crate::cloud::client::Cached;
use crate::cloud::metadata::{MetadataError, TokenSession};
use crate::cloud::rest::{Authorization, Outgoing, Rest, RestAnswer};
use crate::cloud::{CloudError, ErrorKind, Fut};

pub const VERSION: &str = "2014-05-26";

/// Every ECS action gpuwatch calls, with the RAM action that allows it.
pub const RAM_ACTIONS: &[(&str, &str)] = &[
    ("DescribeInstances", "ecs:DescribeInstances"),
    ("DescribeInstanceStatus", "ecs:DescribeInstanceStatus"),
    ("StopInstance", "ecs:StopInstance"),
    ("DeleteInstance", "ecs:DeleteInstance"),
    ("TagResources", "ecs:TagResources"),
    ("DescribePrice", "ecs:DescribePrice"),
    ("DescribeSpotPriceHistory", "ecs:DescribeSpotPriceHistory"),
    ("DescribeDisks", "ecs:DescribeDisks"),
];

/// The RAM action an ECS action needs.
pub fn ram_action(action: &str) -> &'static str {
    RAM_ACTIONS
        .iter()
        .find(|(a, _)| *a == action)
        .map_or("", |(_, r)| r)
}

/// The RAM role's STS credentials, as metadata gives them.
#[derive(Deserialize, Clone)]
#[serde(rename_all = "PascalCase")]
struct Credentials {
    access_key_id: String,
    access_key_secret: String,
    security_token: String,
    expiration: String,
    #[serde(default)]
    code: String,
}

/// Never shown: the secret and the token are secrets.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials(expiration: {})", self.expiration)
    }
}

/// An error answer: `{"RequestId", "HostId", "Code", "Message", "Recommend"}`.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "PascalCase")]
struct ErrorBody {
    request_id: String,
    code: String,
    message: String,
}

pub struct Ecs {
    /// The endpoint, without a trailing slash.
    base: String,
    region: String,
    rest: Rest,
}

/// Signature V3 under the instance RAM role's STS credentials, which metadata gives and which
/// are kept until shortly before they expire: the ECS API's [`Authorization`].
struct Signature {
    metadata: Arc<TokenSession>,
    /// The RAM role's name, if the config gives it; else metadata names it.
    role: String,
    credentials: Cached<Credentials>,
}

fn fail(action: &'static str, kind: ErrorKind, message: String) -> CloudError {
    CloudError {
        operation: action,
        kind,
        message,
        request_id: None,
        retry_after: None,
    }
}

impl Signature {
    /// The RAM role's STS credentials from metadata, and when they expire.
    async fn fetch(&self, action: &'static str) -> Result<(Credentials, f64), CloudError> {
        let no = |e: MetadataError| {
            fail(
                action,
                ErrorKind::Retryable,
                format!("no RAM role credentials: {e}"),
            )
        };
        let role = if self.role.is_empty() {
            let listed = self
                .metadata
                .required("ram/security-credentials/")
                .await
                .map_err(no)?;
            listed.lines().next().unwrap_or("").trim().to_string()
        } else {
            self.role.clone()
        };
        if role.is_empty() || role.contains(['/', '?', '#']) {
            return Err(fail(
                action,
                ErrorKind::AccessDenied,
                "the instance has no RAM role: attach one (see config/alibaba-ram-policy.json)"
                    .into(),
            ));
        }
        let body = self
            .metadata
            .required(&format!("ram/security-credentials/{role}"))
            .await
            .map_err(no)?;
        let c: Credentials = serde_json::from_str(&body).map_err(|_| {
            fail(
                action,
                ErrorKind::Retryable,
                "the RAM role credentials do not parse".into(),
            )
        })?;
        let expires = crate::time::parse_rfc3339(&c.expiration);
        let good = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
        let Some(expires) = expires.filter(|_| {
            c.code == "Success"
                && good(&c.access_key_id)
                && good(&c.access_key_secret)
                && good(&c.security_token)
        }) else {
            return Err(fail(
                action,
                ErrorKind::Retryable,
                format!(
                    "the RAM role credentials are not usable (Code {:?})",
                    crate::redact::brief(&c.code, 32)
                ),
            ));
        };
        for secret in [&c.access_key_id, &c.access_key_secret, &c.security_token] {
            crate::redact::hold_secret(secret);
        }
        Ok((c, expires))
    }
}

impl Authorization for Signature {
    /// The `x-acs-*` headers of an RPC call (its action, the API version, the time, a nonce,
    /// the empty body's hash, the STS token) and the signature over them, the host, the
    /// method, the path and the query as sent.
    fn headers<'a>(
        &'a self,
        action: &'static str,
        request: &'a Outgoing<'a>,
        renew: bool,
    ) -> Fut<'a, Result<Vec<(String, String)>, CloudError>> {
        Box::pin(async move {
            let c = self.credentials.get(renew, || self.fetch(action)).await?;
            let host = match (request.url.host_str(), request.url.port()) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                (Some(h), None) => h.to_string(),
                _ => {
                    return Err(fail(
                        action,
                        ErrorKind::Other,
                        "the endpoint names no host".into(),
                    ))
                }
            };
            let body = sign::sha256_hex(request.body);
            let headers: Vec<(String, String)> = [
                ("host", host.as_str()),
                ("x-acs-action", action),
                ("x-acs-version", VERSION),
                ("x-acs-date", &rfc3339_seconds(crate::time::now())),
                ("x-acs-signature-nonce", &nonce()),
                ("x-acs-content-sha256", &body),
                ("x-acs-security-token", &c.security_token),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let query: Vec<(String, String)> = (request.url.query_pairs())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            let signed = sign::sign(
                &sign::Request {
                    method: request.method.as_str(),
                    path: request.url.path(),
                    query: &query,
                    headers: &headers,
                    body: request.body,
                },
                &c.access_key_id,
                &c.access_key_secret,
            );
            // The client sends the host itself.
            let mut out: Vec<(String, String)> =
                headers.into_iter().filter(|(k, _)| k != "host").collect();
            out.push(("authorization".into(), signed.authorization));
            Ok(out)
        })
    }

    /// ECS refuses an expired STS token with `InvalidSecurityToken.*`.
    fn stale(&self, answer: &RestAnswer) -> bool {
        let e: ErrorBody = serde_json::from_slice(&answer.body).unwrap_or_default();
        answer.status != 200 && e.code.starts_with("InvalidSecurityToken")
    }
}

impl Ecs {
    pub fn new(base: &str, region: &str, metadata: Arc<TokenSession>, role: &str) -> Ecs {
        let signature = Signature {
            metadata,
            role: role.to_string(),
            credentials: Cached::default(),
        };
        Ecs {
            base: base.trim_end_matches('/').to_string(),
            region: region.to_string(),
            rest: Rest::new(base, Box::new(signature)),
        }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// Calls `action` with `params`, signed (an STS token the API calls expired is renewed
    /// once). A `Describe*` may be sent again; a call that changes something, only if it never
    /// left. Returns the answer's JSON.
    pub async fn call(
        &self,
        action: &'static str,
        params: &[(&str, &str)],
    ) -> Result<Value, CloudError> {
        let query: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let url = format!("{}/?{}", self.base, sign::canonical_query(&query));
        let mutating = !action.starts_with("Describe");
        let answer = (self.rest)
            .send_as(action, reqwest::Method::POST, &url, None, mutating)
            .await?;
        if answer.status == 200 {
            return serde_json::from_slice(&answer.body).map_err(|e| {
                fail(
                    action,
                    ErrorKind::Other,
                    format!("the answer does not parse: {e}"),
                )
            });
        }
        let e: ErrorBody = serde_json::from_slice(&answer.body).unwrap_or_default();
        Err(classify(action, answer.status.as_u16(), e))
    }

    /// This instance, as `DescribeInstances` gives it. An answer that does not name it (ECS is
    /// eventually consistent; a page or a filter may miss it) says nothing of it: it is an
    /// error worth retrying, never an instance without tags, lifecycle or state.
    pub async fn instance(&self, id: &str) -> Result<Value, CloudError> {
        let ids = serde_json::json!([id]).to_string();
        let answer = self
            .call(
                "DescribeInstances",
                &[("RegionId", &self.region), ("InstanceIds", &ids)],
            )
            .await?;
        named(&answer["Instances"]["Instance"], "InstanceId", id)
            .cloned()
            .ok_or_else(|| CloudError {
                operation: "DescribeInstances",
                kind: ErrorKind::Retryable,
                message: format!(
                    "the answer does not name {id} (an eventually consistent read): what it says of the instance is unknown"
                ),
                request_id: request_id(&answer),
                retry_after: None,
            })
    }

    /// This instance's system disk, as `DescribeDisks` gives it.
    pub async fn system_disk(&self, id: &str) -> Result<Value, CloudError> {
        let answer = self
            .call(
                "DescribeDisks",
                &[
                    ("RegionId", &self.region),
                    ("InstanceId", id),
                    ("DiskType", "system"),
                ],
            )
            .await?;
        answer["Disks"]["Disk"]
            .as_array()
            .and_then(|d| {
                d.iter()
                    .find(|d| d["InstanceId"] == id && d["Type"] == "system")
            })
            .cloned()
            .ok_or_else(|| CloudError {
                operation: "DescribeDisks",
                kind: ErrorKind::Retryable,
                message: format!("the answer names no system disk of {id}"),
                request_id: request_id(&answer),
                retry_after: None,
            })
    }
}

/// The element of a list (`{"Instance": [...]}`'s array) whose `key` is `value`.
pub fn named<'a>(list: &'a Value, key: &str, value: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|i| i[key] == value)
}

/// The answer's `RequestId`, for the audit log.
pub fn request_id(answer: &Value) -> Option<String> {
    answer["RequestId"]
        .as_str()
        .map(|r| crate::redact::brief(r, 64))
}

/// What an error answer means: throttling and 5xx are retried; RAM denials, credentials and
/// signatures are permissions; the rest (an instance in the wrong state) is the request.
fn classify(action: &'static str, status: u16, e: ErrorBody) -> CloudError {
    let code = crate::redact::brief(&e.code, 128);
    let kind = if code.starts_with("Throttling") || code == "ServiceUnavailable" || status >= 500 {
        ErrorKind::Retryable
    } else if action == "TagResources" && tag_limit(&code) {
        // The instance has all the tags ECS allows (20): the tags are refused, not the instance.
        ErrorKind::Limit
    } else if code.starts_with("Forbidden")
        || code.starts_with("InvalidAccessKeyId")
        || code.starts_with("InvalidSecurityToken")
        || code.starts_with("Signature")
        || status == 401
    {
        ErrorKind::AccessDenied
    } else {
        ErrorKind::Other
    };
    let mut message = format!(
        "{} (HTTP {status}): {}",
        if code.is_empty() { "error" } else { &code },
        if e.message.is_empty() {
            "no message".to_string()
        } else {
            // ECS may quote what it was sent: no credential the daemon holds goes further.
            crate::redact::brief(&crate::redact::scrub(&e.message), 1024)
        }
    );
    if code.starts_with("Forbidden") {
        message.push_str(&format!(
            " (the instance's RAM role needs {}: see config/alibaba-ram-policy.json)",
            ram_action(action)
        ));
    }
    CloudError {
        operation: action,
        kind,
        message,
        request_id: (!e.request_id.is_empty()).then(|| crate::redact::brief(&e.request_id, 64)),
        retry_after: None,
    }
}

/// A code that says the resource has all the tags it may have (`NumberExceed.Tags`, and the
/// like: a tag quota or limit exceeded).
fn tag_limit(code: &str) -> bool {
    let code = code.to_ascii_lowercase();
    code.contains("tag")
        && ["exceed", "limit", "quota"]
            .iter()
            .any(|w| code.contains(w))
}

/// `yyyy-MM-ddTHH:mm:ssZ`, as `x-acs-date` takes it.
fn rfc3339_seconds(t: f64) -> String {
    crate::time::rfc3339(t.floor())
}

/// A nonce never used before: the time and a counter, with the process id.
fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let t = crate::time::now();
    sign::sha256_hex(format!("{t}-{}-{n}", std::process::id()).as_bytes())[..32].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_their_code_and_a_ram_denial_names_the_action() {
        let e = |code: &str| ErrorBody {
            request_id: "473469C7".into(),
            code: code.into(),
            message: "m".into(),
        };
        let denied = classify("StopInstance", 403, e("Forbidden.RAM"));
        assert_eq!(denied.kind, ErrorKind::AccessDenied);
        assert!(
            denied.message.contains("needs ecs:StopInstance"),
            "{}",
            denied.message
        );
        assert_eq!(denied.request_id.as_deref(), Some("473469C7"));
        // (action, status, code, kind): only the stamp is refused for the tags' limit.
        let cases = [
            ("StopInstance", 400, "Throttling.User", ErrorKind::Retryable),
            (
                "StopInstance",
                403,
                "IncorrectInstanceStatus",
                ErrorKind::Other,
            ),
            (
                "StopInstance",
                400,
                "SignatureDoesNotMatch",
                ErrorKind::AccessDenied,
            ),
            ("TagResources", 400, "NumberExceed.Tags", ErrorKind::Limit),
            ("TagResources", 400, "QuotaExceed.Tags", ErrorKind::Limit),
            (
                "TagResources",
                400,
                "InvalidTagKey.Malformed",
                ErrorKind::Other,
            ),
            ("StopInstance", 400, "NumberExceed.Tags", ErrorKind::Other),
        ];
        for (action, status, code, kind) in cases {
            assert_eq!(
                classify(action, status, e(code)).kind,
                kind,
                "{action} {code}"
            );
        }
        assert_eq!(rfc3339_seconds(1_698_315_752.9), "2023-10-26T10:22:32Z");
        assert_ne!(nonce(), nonce());
        assert_eq!(nonce().len(), 32);
    }
}
