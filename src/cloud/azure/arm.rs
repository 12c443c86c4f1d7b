//! Azure Resource Manager, for this one VM: the calls gpuwatch makes, and nothing else.
//! `AZURE_ACTIONS` and `config/azure-role.json` list the same permissions; a test keeps them in
//! step. Each call carries a token of the VM's managed identity, fetched from instance metadata
//! and renewed before it expires; no token is ever logged or put in an error.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::imds::{Imds, Token};
use crate::cloud::metadata::MetadataError;
use crate::cloud::{CloudError, ErrorKind};

pub const COMPUTE_API_VERSION: &str = "2024-11-01";
pub const TAGS_API_VERSION: &str = "2021-04-01";
pub const BUDGETS_API_VERSION: &str = "2024-08-01";

/// Every Resource Manager operation gpuwatch calls (by the specification's operation id), with
/// the permission that allows it. `config/azure-role.json` grants exactly these; a test keeps
/// them in step with the code.
pub const AZURE_ACTIONS: &[(&str, &str)] = &[
    (
        "VirtualMachines_Get",
        "Microsoft.Compute/virtualMachines/read",
    ),
    (
        "VirtualMachines_Deallocate",
        "Microsoft.Compute/virtualMachines/deallocate/action",
    ),
    (
        "VirtualMachines_Delete",
        "Microsoft.Compute/virtualMachines/delete",
    ),
    (
        "Operations_Get",
        "Microsoft.Compute/locations/operations/read",
    ),
    ("Tags_UpdateAtScope", "Microsoft.Resources/tags/write"),
    ("Budgets_Get", "Microsoft.Consumption/budgets/read"),
];

/// The permission an operation needs.
pub fn permission(operation: &str) -> &'static str {
    AZURE_ACTIONS
        .iter()
        .find(|(op, _)| *op == operation)
        .map_or("", |(_, p)| p)
}

/// The largest answer read; real ones are a few KiB.
const MAX_BODY: usize = 1024 * 1024;
/// A token is renewed this long before it expires.
const RENEW_BEFORE: f64 = 300.0;
/// How long an operation is followed to its end. Deallocating a large GPU VM takes minutes.
const FOLLOW_FOR: Duration = Duration::from_secs(30 * 60);
/// The wait between status reads when Azure does not say (`Retry-After`); Compute allows 15
/// status reads a minute per resource.
const DEFAULT_POLL: Duration = Duration::from_secs(5);

/// An answer: its status, headers and body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    fn request_id(&self) -> Option<String> {
        header(&self.headers, "x-ms-request-id").map(|v| crate::redact::brief(v, 128))
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok()
}

/// ARM's error body: `{"error": {"code", "message"}}` (Compute's throttling answer can come
/// without the wrapper).
#[derive(Deserialize, Default)]
#[serde(default)]
struct ErrorBody {
    error: Option<ErrorDetail>,
    code: Option<String>,
    message: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ErrorDetail {
    code: String,
    message: String,
}

fn error_text(body: &[u8]) -> (String, String) {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let (code, message) = match parsed.error {
        Some(e) => (e.code, e.message),
        None => (
            parsed.code.unwrap_or_default(),
            parsed.message.unwrap_or_default(),
        ),
    };
    (
        crate::redact::brief(&code, 128),
        crate::redact::brief(&message, 1024),
    )
}

/// What a failed answer means: throttling and 5xx are retried; 401 and 403 are permissions;
/// the rest (404, 409) is the VM's state or the request.
pub fn classify(operation: &'static str, answer: &Answer) -> CloudError {
    let status = answer.status.as_u16();
    let (code, message) = error_text(&answer.body);
    let kind = match status {
        429 | 500..=599 => ErrorKind::Retryable,
        401 | 403 => ErrorKind::AccessDenied,
        _ => ErrorKind::Other,
    };
    let mut message = format!(
        "{} (HTTP {status}): {}",
        if code.is_empty() { "error" } else { &code },
        if message.is_empty() {
            "no message"
        } else {
            &message
        }
    );
    if status == 403 {
        message.push_str(&format!(
            " (the VM's identity needs {} at the VM's scope: see config/azure-role.json)",
            permission(operation)
        ));
    }
    CloudError {
        operation,
        kind,
        message,
        request_id: answer.request_id(),
    }
}

/// Resource Manager, for one VM.
pub struct Arm {
    /// The endpoint, without a trailing slash: `https://management.azure.com`.
    base: String,
    /// The VM's resource id: `/subscriptions/.../virtualMachines/{name}`.
    pub vm: String,
    imds: Arc<Imds>,
    token: tokio::sync::Mutex<Option<Token>>,
    http: OnceLock<reqwest::Client>,
}

impl Arm {
    pub fn new(base: &str, vm: String, imds: Arc<Imds>) -> Arm {
        Arm {
            base: base.trim_end_matches('/').to_string(),
            vm,
            imds,
            token: tokio::sync::Mutex::new(None),
            http: OnceLock::new(),
        }
    }

    /// The client, made on the first call. Redirects are not followed: a token goes only to
    /// the endpoint.
    fn http(&self) -> Result<&reqwest::Client, CloudError> {
        if let Some(c) = self.http.get() {
            return Ok(c);
        }
        let client = crate::client::http_client()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CloudError {
                operation: "Client",
                kind: ErrorKind::Other,
                message: e.to_string(),
                request_id: None,
            })?;
        Ok(self.http.get_or_init(|| client))
    }

    /// A token of the managed identity, renewed before it expires.
    async fn bearer(&self, operation: &'static str, renew: bool) -> Result<String, CloudError> {
        let mut cached = self.token.lock().await;
        let now = crate::time::now();
        match cached.as_ref() {
            Some(t) if !renew && t.expires_on - RENEW_BEFORE > now => return Ok(t.value.clone()),
            _ => {}
        }
        let token = self.imds.token().await.map_err(|e| CloudError {
            operation,
            // No identity (400) will not come by retrying; metadata that does not answer may.
            kind: match &e {
                MetadataError::Invalid { message, .. } if message.starts_with("HTTP 4") => {
                    ErrorKind::AccessDenied
                }
                _ => ErrorKind::Retryable,
            },
            message: format!("no managed identity token: {e}"),
            request_id: None,
        })?;
        let value = token.value.clone();
        *cached = Some(token);
        Ok(value)
    }

    /// Sends one request to `url` (a path under the endpoint, or a URL on it), with a token;
    /// a 401 renews the token and tries once more.
    pub async fn send(
        &self,
        operation: &'static str,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, CloudError> {
        let url = if url.starts_with('/') {
            format!("{}{url}", self.base)
        } else {
            url.to_string()
        };
        let mut renew = false;
        loop {
            let token = self.bearer(operation, renew).await?;
            let mut request = self
                .http()?
                .request(method.clone(), &url)
                .header(AUTHORIZATION, format!("Bearer {token}"));
            request = match body {
                Some(b) => request
                    .header(CONTENT_TYPE, "application/json")
                    .body(b.to_string()),
                // An action without a body says so: Azure's front end refuses one that doesn't.
                None if method != Method::GET => request.header(CONTENT_LENGTH, "0"),
                None => request,
            };
            let retryable = |message: String| CloudError {
                operation,
                kind: ErrorKind::Retryable,
                message,
                request_id: None,
            };
            let response = request
                .send()
                .await
                .map_err(|e| retryable(crate::redact::urls(&e.to_string())))?;
            let (status, headers) = (response.status(), response.headers().clone());
            let body = crate::client::read_body(response, MAX_BODY)
                .await
                .map_err(|e| retryable(crate::redact::urls(&e.to_string())))?
                .ok_or_else(|| retryable(format!("the answer is larger than {MAX_BODY} bytes")))?;
            if status == StatusCode::UNAUTHORIZED && !renew {
                renew = true;
                continue;
            }
            return Ok(Answer {
                status,
                headers,
                body,
            });
        }
    }

    /// Sends one request and follows the operation it starts to its end.
    pub async fn act(
        &self,
        operation: &'static str,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Option<String>, CloudError> {
        let answer = self.send(operation, method, url, body).await?;
        if !answer.status.is_success() {
            return Err(classify(operation, &answer));
        }
        let id = answer.request_id();
        let async_op = header(&answer.headers, "azure-asyncoperation");
        let location = header(&answer.headers, "location");
        match (async_op, location) {
            (Some(url), _) => self.follow(operation, url, true, &answer.headers).await?,
            (None, Some(url)) if answer.status == StatusCode::ACCEPTED => {
                self.follow(operation, url, false, &answer.headers).await?
            }
            _ => {}
        }
        Ok(id)
    }

    /// Follows an operation's status URL until it ends: the `Azure-AsyncOperation` resource's
    /// `status`, or the `Location` URL's answer (202 while running). A status URL elsewhere
    /// than the endpoint is refused: the token goes nowhere else.
    async fn follow(
        &self,
        operation: &'static str,
        url: &str,
        async_operation: bool,
        first: &HeaderMap,
    ) -> Result<(), CloudError> {
        let fail = |kind, message: String| CloudError {
            operation,
            kind,
            message,
            request_id: None,
        };
        if !same_origin(&self.base, url) {
            return Err(fail(
                ErrorKind::Other,
                format!(
                    "the operation's status URL is not on {}: not followed, so its outcome is unknown",
                    self.base
                ),
            ));
        }
        let started = Instant::now();
        let mut wait = retry_after(first);
        loop {
            if started.elapsed() > FOLLOW_FOR {
                return Err(fail(
                    ErrorKind::Other,
                    format!(
                        "the operation had not ended after {}: its outcome is unknown",
                        humantime::format_duration(FOLLOW_FOR)
                    ),
                ));
            }
            tokio::time::sleep(wait).await;
            let answer = match self.send("Operations_Get", Method::GET, url, None).await {
                Ok(a) => a,
                Err(e) if e.kind == ErrorKind::Retryable => {
                    tracing::warn!(error = %e, "cannot read the operation's status; reading it again");
                    wait = DEFAULT_POLL;
                    continue;
                }
                Err(e) => return Err(e),
            };
            wait = retry_after(&answer.headers);
            let status = answer.status.as_u16();
            if !answer.status.is_success() {
                let e = classify("Operations_Get", &answer);
                if e.kind == ErrorKind::Retryable {
                    continue;
                }
                // Reading the status failed; the operation itself may have run.
                return Err(fail(
                    e.kind,
                    format!("the operation was accepted, but its status cannot be read: {e}"),
                ));
            }
            if !async_operation {
                if status == 202 {
                    continue;
                }
                return Ok(());
            }
            #[derive(Deserialize, Default)]
            #[serde(default)]
            struct Status {
                status: String,
                error: Option<ErrorDetail>,
            }
            let s: Status = serde_json::from_slice(&answer.body).unwrap_or_default();
            match s.status.as_str() {
                "Succeeded" => return Ok(()),
                "Failed" | "Canceled" => {
                    let e = s.error.unwrap_or_default();
                    return Err(fail(
                        ErrorKind::Other,
                        format!(
                            "the operation ended {}: {}: {}",
                            s.status,
                            crate::redact::brief(&e.code, 128),
                            crate::redact::brief(&e.message, 1024)
                        ),
                    ));
                }
                _ => {}
            }
        }
    }
}

/// How long to wait before the next status read: `Retry-After` in seconds, within 1 s and a
/// minute, or `DEFAULT_POLL`.
fn retry_after(headers: &HeaderMap) -> Duration {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map_or(DEFAULT_POLL, |s| Duration::from_secs(s.clamp(1, 60)))
}

/// Whether `url` is on the same scheme, host and port as `base`.
fn same_origin(base: &str, url: &str) -> bool {
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

    #[test]
    fn a_status_url_elsewhere_is_not_followed() {
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

    #[test]
    fn errors_say_their_code_and_message_and_name_the_permission() {
        let answer = |status: u16, body: &str| Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: body.as_bytes().to_vec(),
        };
        let e = classify(
            "VirtualMachines_Deallocate",
            &answer(
                403,
                r#"{"error":{"code":"AuthorizationFailed","message":"The client 'x' with object id 'y' does not have authorization to perform action 'Microsoft.Compute/virtualMachines/deallocate/action' over scope '/subscriptions/s' or the scope is invalid."}}"#,
            ),
        );
        assert_eq!(e.kind, ErrorKind::AccessDenied);
        assert!(
            e.message
                .starts_with("AuthorizationFailed (HTTP 403): The client"),
            "{}",
            e.message
        );
        assert!(
            e.message
                .contains("needs Microsoft.Compute/virtualMachines/deallocate/action"),
            "{}",
            e.message
        );
        // Compute's throttling answer, unwrapped.
        let e = classify(
            "VirtualMachines_Get",
            &answer(
                429,
                r#"{"code":"OperationNotAllowed","message":"too many requests"}"#,
            ),
        );
        assert_eq!(e.kind, ErrorKind::Retryable);
        assert!(
            e.message.starts_with("OperationNotAllowed (HTTP 429)"),
            "{}",
            e.message
        );
        let e = classify(
            "VirtualMachines_Delete",
            &answer(409, "<html>conflict</html>"),
        );
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::Other, "error (HTTP 409): no message")
        );
        assert_eq!(
            classify("VirtualMachines_Get", &answer(503, "")).kind,
            ErrorKind::Retryable
        );
    }

    #[test]
    fn retry_after_is_bounded() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), DEFAULT_POLL);
        h.insert(RETRY_AFTER, "0".parse().unwrap());
        assert_eq!(retry_after(&h), Duration::from_secs(1));
        h.insert(RETRY_AFTER, "86400".parse().unwrap());
        assert_eq!(retry_after(&h), Duration::from_secs(60));
        h.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), DEFAULT_POLL);
    }
}
