//! Azure Resource Manager, for this one VM: the calls gpuwatch makes, and nothing else.
//! `AZURE_ACTIONS` and `config/azure-role.json` list the same permissions; a test keeps them in
//! step. Each call carries a token of the VM's managed identity, fetched from instance metadata
//! and renewed before it expires; no token is ever logged or put in an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::imds::Imds;
use crate::cloud::metadata::MetadataError;
use crate::cloud::rest::{same_origin, Answer, Rest, Token};
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

/// How long an operation is followed to its end. Deallocating a large GPU VM takes minutes.
use crate::cloud::FOLLOW_FOR;
/// The wait between status reads when Azure does not say (`Retry-After`); Compute allows 15
/// status reads a minute per resource.
const DEFAULT_POLL: Duration = Duration::from_secs(5);

fn request_id(answer: &Answer) -> Option<String> {
    answer
        .header("x-ms-request-id")
        .map(|v| crate::redact::brief(v, 128))
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
        request_id: request_id(answer),
        retry_after: None,
    }
}

/// Resource Manager, for one VM.
pub struct Arm {
    rest: Rest,
    /// The VM's resource id: `/subscriptions/.../virtualMachines/{name}`.
    pub vm: String,
}

impl Arm {
    pub fn new(base: &str, vm: String, imds: Arc<Imds>) -> Arm {
        let tokens: crate::cloud::rest::TokenSource = Box::new(move |operation| {
            let imds = Arc::clone(&imds);
            Box::pin(async move { token(&imds, operation).await })
        });
        Arm {
            rest: Rest::new(base, tokens),
            vm,
        }
    }

    /// Sends one request to `url` (a path under the endpoint, or a URL on it).
    pub async fn send(
        &self,
        operation: &'static str,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, CloudError> {
        self.rest.send(operation, method, url, body).await
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
        let id = request_id(&answer);
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
            retry_after: None,
        };
        if !same_origin(&self.rest.base, url) {
            return Err(fail(
                ErrorKind::Other,
                format!(
                    "the operation's status URL is not on {}: not followed, so its outcome is unknown",
                    self.rest.base
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
            // A `Location` URL answers 202 while the operation runs, then its result.
            if !async_operation {
                match status {
                    202 => continue,
                    200..=299 => return Ok(()),
                    429 => continue,
                    _ => {
                        let e = classify(operation, &answer);
                        return Err(fail(
                            ErrorKind::Other,
                            format!("the operation ended: {}", e.message),
                        ));
                    }
                }
            }
            // The `Azure-AsyncOperation` resource answers 200 while it can be read; a failure
            // to read it says nothing of the operation.
            if !answer.status.is_success() {
                let e = classify("Operations_Get", &answer);
                if e.kind == ErrorKind::Retryable {
                    continue;
                }
                return Err(fail(
                    e.kind,
                    format!("the operation was accepted, but its status cannot be read: {e}"),
                ));
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

/// A token of the VM's managed identity, for `operation`.
async fn token(imds: &Imds, operation: &'static str) -> Result<Token, CloudError> {
    imds.token().await.map_err(|e| CloudError {
        operation,
        // No identity (400, 403) will not come by retrying; metadata that is updating (404,
        // 410), throttled (429) or failing (5xx), or does not answer, may answer later.
        kind: match &e {
            MetadataError::Invalid { message, .. }
                if message.starts_with("HTTP 400") || message.starts_with("HTTP 403") =>
            {
                ErrorKind::AccessDenied
            }
            _ => ErrorKind::Retryable,
        },
        message: format!("no managed identity token: {e}"),
        request_id: None,
        retry_after: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
