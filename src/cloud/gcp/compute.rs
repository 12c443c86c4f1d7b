//! The Compute Engine API, for this one VM: the calls gpuwatch makes, and nothing else.
//! `GCP_PERMISSIONS` and `config/gcp-role.yaml` list the same permissions; a test keeps them
//! in step. Each call carries a token of the VM's service account, from the metadata server.
//! An operation is followed by its name under the configured endpoint, never by its
//! `selfLink`, which names Google's public host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::Deserialize;

use super::metadata::Server;
use crate::cloud::rest::{Answer, Rest, Token};
use crate::cloud::{CloudError, ErrorKind};

/// Every Compute Engine method gpuwatch calls, with the permission that allows it.
/// `config/gcp-role.yaml` grants exactly these; a test keeps them in step with the code.
pub const GCP_PERMISSIONS: &[(&str, &str)] = &[
    ("instances.get", "compute.instances.get"),
    ("instances.stop", "compute.instances.stop"),
    ("instances.delete", "compute.instances.delete"),
    ("instances.setLabels", "compute.instances.setLabels"),
    ("zoneOperations.get", "compute.zoneOperations.get"),
];

/// The permission a method needs.
pub fn permission(method: &str) -> &'static str {
    GCP_PERMISSIONS
        .iter()
        .find(|(m, _)| *m == method)
        .map_or("", |(_, p)| p)
}

/// How long an operation is followed to its end.
const FOLLOW_FOR: Duration = Duration::from_secs(30 * 60);
/// The wait between reads of an operation's status.
const POLL: Duration = Duration::from_secs(2);

/// The API's error body: `{"error": {"code", "message", "errors": [{"reason"}], "details"}}`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ErrorDetail {
    message: String,
    status: String,
    errors: Vec<Reason>,
    details: Vec<Reason>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Reason {
    reason: String,
    message: String,
}

/// What a failed answer means: throttling and 5xx are retried; 401 and 403 are permissions
/// (a 403 for want of an access scope says so, with the fix); the rest (404, 409, 412) is the
/// VM's state or the request.
pub fn classify(method: &'static str, answer: &Answer) -> CloudError {
    let status = answer.status.as_u16();
    let e: ErrorBody = serde_json::from_slice(&answer.body).unwrap_or_default();
    let e = e.error;
    let reason = e
        .errors
        .first()
        .map(|r| r.reason.as_str())
        .filter(|r| !r.is_empty())
        .unwrap_or(&e.status);
    let kind = match status {
        429 | 500..=599 => ErrorKind::Retryable,
        401 | 403 => ErrorKind::AccessDenied,
        _ => ErrorKind::Other,
    };
    let mut message = format!(
        "{} (HTTP {status}): {}",
        if reason.is_empty() { "error" } else { reason },
        if e.message.is_empty() {
            "no message"
        } else {
            &e.message
        }
    );
    let scopes = e
        .details
        .iter()
        .any(|d| d.reason == "ACCESS_TOKEN_SCOPE_INSUFFICIENT")
        || e.message.contains("insufficient authentication scopes");
    if status == 403 && scopes {
        message.push_str(
            " (the VM's access scopes do not allow Compute Engine writes: stop the VM, then `gcloud compute instances set-service-account VM --zone ZONE --service-account SA --scopes=compute-rw`, or cloud-platform)",
        );
    } else if status == 403 {
        message.push_str(&format!(
            " (the VM's service account needs {}: see config/gcp-role.yaml)",
            permission(method)
        ));
    }
    CloudError {
        operation: method,
        kind,
        message: crate::redact::brief(&message, 2048),
        request_id: None,
        retry_after: None,
    }
}

/// The instance, as `instances.get` gives the fields read.
#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct Instance {
    pub status: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub label_fingerprint: String,
    pub disks: Vec<Disk>,
    pub guest_accelerators: Vec<Accelerator>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct Disk {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct Accelerator {
    pub accelerator_type: String,
    pub accelerator_count: u32,
}

/// An operation: its name, status and errors.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Operation {
    name: String,
    status: String,
    error: Option<OperationErrors>,
    http_error_status_code: Option<u16>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct OperationErrors {
    errors: Vec<OperationError>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct OperationError {
    code: String,
    message: String,
}

/// Compute Engine, for one VM.
pub struct Compute {
    rest: Rest,
    /// `/compute/v1/projects/{project}/zones/{zone}`.
    zone_path: String,
    /// `{zone_path}/instances/{name}`.
    pub instance: String,
}

impl Compute {
    pub fn new(base: &str, project: &str, zone: &str, name: &str, server: Arc<Server>) -> Compute {
        let tokens: crate::cloud::rest::TokenSource = Box::new(move |operation| {
            let server = Arc::clone(&server);
            Box::pin(async move { token(&server, operation).await })
        });
        let zone_path = format!("/compute/v1/projects/{project}/zones/{zone}");
        Compute {
            rest: Rest::new(base, tokens),
            instance: format!("{zone_path}/instances/{name}"),
            zone_path,
        }
    }

    /// The instance.
    pub async fn get(&self) -> Result<Instance, CloudError> {
        let method = "instances.get";
        let answer = self
            .rest
            .send(method, Method::GET, &self.instance, None)
            .await?;
        if !answer.status.is_success() {
            return Err(classify(method, &answer));
        }
        serde_json::from_slice(&answer.body).map_err(|e| CloudError {
            operation: method,
            kind: ErrorKind::Other,
            message: format!("the instance does not parse: {e}"),
            request_id: None,
            retry_after: None,
        })
    }

    /// Calls `method` and follows the operation it starts until it is `DONE`. Returns the
    /// operation's name.
    pub async fn act(
        &self,
        method: &'static str,
        verb: Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Option<String>, CloudError> {
        let answer = self.rest.send(method, verb, url, body).await?;
        if !answer.status.is_success() {
            return Err(classify(method, &answer));
        }
        let op: Operation = serde_json::from_slice(&answer.body).unwrap_or_default();
        self.follow(method, op).await
    }

    async fn follow(
        &self,
        method: &'static str,
        mut op: Operation,
    ) -> Result<Option<String>, CloudError> {
        let fail = |message: String| CloudError {
            operation: method,
            kind: ErrorKind::Other,
            message,
            request_id: None,
            retry_after: None,
        };
        // A name is a path segment: nothing that could leave it.
        let name = op.name.clone();
        if name.is_empty()
            || name.len() > 128
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(fail(
                "the answer names no operation: its outcome is unknown".into(),
            ));
        }
        let url = format!("{}/operations/{name}", self.zone_path);
        let started = Instant::now();
        while op.status != "DONE" {
            if started.elapsed() > FOLLOW_FOR {
                return Err(fail(format!(
                    "operation {name} had not ended after {}: its outcome is unknown",
                    humantime::format_duration(FOLLOW_FOR)
                )));
            }
            tokio::time::sleep(POLL).await;
            let answer = match self
                .rest
                .send("zoneOperations.get", Method::GET, &url, None)
                .await
            {
                Ok(a) if a.status.is_success() => a,
                Ok(a) => {
                    let e = classify("zoneOperations.get", &a);
                    if e.kind == ErrorKind::Retryable {
                        continue;
                    }
                    return Err(CloudError {
                        message: format!(
                            "the operation was accepted, but its status cannot be read: {e}"
                        ),
                        ..e
                    });
                }
                Err(e) if e.kind == ErrorKind::Retryable => continue,
                Err(e) => return Err(e),
            };
            op = serde_json::from_slice(&answer.body).unwrap_or_default();
            op.name = name.clone();
        }
        match op.error.map(|e| e.errors).unwrap_or_default().as_slice() {
            [] => Ok(Some(name)),
            errors => Err(fail(format!(
                "operation {name} ended with errors{}: {}",
                op.http_error_status_code
                    .map(|c| format!(" (HTTP {c})"))
                    .unwrap_or_default(),
                errors
                    .iter()
                    .map(|e| format!(
                        "{}: {}",
                        crate::redact::brief(&e.code, 64),
                        crate::redact::brief(&e.message, 512)
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))),
        }
    }

    /// Sets `gpuwatch-action` and `gpuwatch-rule` among the instance's labels, with the
    /// fingerprint of the labels it read; a fingerprint gone stale (412) is read again, once.
    pub async fn label(&self, action: &str, rule: &str) -> Result<Option<String>, CloudError> {
        let url = format!("{}/setLabels", self.instance);
        let mut tries = 0;
        loop {
            tries += 1;
            let instance = self.get().await?;
            let mut labels = instance.labels;
            labels.insert("gpuwatch-action".into(), label_value(action));
            labels.insert("gpuwatch-rule".into(), label_value(rule));
            let body = serde_json::json!({
                "labels": labels,
                "labelFingerprint": instance.label_fingerprint,
            });
            match self
                .act("instances.setLabels", Method::POST, &url, Some(&body))
                .await
            {
                Err(e) if tries < 2 && e.message.starts_with("conditionNotMet") => continue,
                other => return other,
            }
        }
    }
}

/// A token of the VM's service account, for `operation`.
async fn token(server: &Server, operation: &'static str) -> Result<Token, CloudError> {
    server.token().await.map_err(|e| CloudError {
        operation,
        kind: ErrorKind::Retryable,
        message: format!("no service account token: {e}"),
        request_id: None,
        retry_after: None,
    })
}

/// A label value: lower case letters, digits, `-` and `_`, at most 63 characters.
pub fn label_value(text: &str) -> String {
    text.chars()
        .flat_map(char::to_lowercase)
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderMap;
    use reqwest::StatusCode;

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_missing_scope_says_so_with_the_fix_and_a_missing_permission_names_it() {
        let scope = r#"{"error": {"code": 403, "message": "Request had insufficient authentication scopes.",
            "errors": [{"message": "Insufficient Permission", "domain": "global", "reason": "insufficientPermissions"}],
            "status": "PERMISSION_DENIED",
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
              "domain": "googleapis.com", "metadata": {"service": "compute.googleapis.com", "method": "compute.v1.InstancesService.Stop"}}]}}"#;
        let e = classify("instances.stop", &answer(403, scope));
        assert_eq!(e.kind, ErrorKind::AccessDenied);
        assert!(e.message.starts_with("insufficientPermissions (HTTP 403): Request had insufficient authentication scopes."), "{}", e.message);
        assert!(e.message.contains("--scopes=compute-rw"), "{}", e.message);
        let iam = r#"{"error": {"code": 403, "message": "Required 'compute.instances.stop' permission for 'projects/p/zones/us-central1-a/instances/vm'",
            "errors": [{"message": "Required 'compute.instances.stop' permission", "domain": "global", "reason": "forbidden"}]}}"#;
        let e = classify("instances.stop", &answer(403, iam));
        assert!(
            e.message.contains("needs compute.instances.stop"),
            "{}",
            e.message
        );
        assert_eq!(
            classify("instances.get", &answer(429, "{}")).kind,
            ErrorKind::Retryable
        );
        let e = classify(
            "instances.setLabels",
            &answer(
                412,
                r#"{"error": {"code": 412, "message": "Labels fingerprint either invalid or resource labels have changed", "errors": [{"reason": "conditionNotMet", "message": "x"}]}}"#,
            ),
        );
        assert!(
            e.message.starts_with("conditionNotMet (HTTP 412)"),
            "{}",
            e.message
        );
        assert_eq!(e.kind, ErrorKind::Other);
    }

    #[test]
    fn label_values_are_what_compute_engine_takes() {
        assert_eq!(label_value("stop"), "stop");
        assert_eq!(label_value("Idle 2h: GPUs"), "idle_2h__gpus");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }
}
