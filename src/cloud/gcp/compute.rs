//! The Compute Engine API, for this one VM: the calls gpuwatch makes, and nothing else.
//! `GCP_PERMISSIONS` and the roles in `config/` (`gcp-role.yaml`, bound on the VM;
//! `gcp-operations-role.yaml`, bound on the project) list the same permissions; a test keeps
//! them in step. Each call carries a token of the VM's service account, from the metadata server.
//! An operation is followed by its name under the configured endpoint (`operation.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use reqwest::Method;
use serde::Deserialize;

use super::metadata::GceMetadata;
use super::operation::{GceOperation, Outcome};
use crate::cloud::rest::{BearerToken, Rest, RestAnswer};
use crate::cloud::{CloudError, ErrorKind};

/// Every Compute Engine method gpuwatch calls, with the permission that allows it. The roles
/// in `config/` grant exactly these, each where it works (`role_file`); a test keeps them in
/// step with the code.
pub const GCP_PERMISSIONS: &[(&str, &str)] = &[
    ("instances.get", "compute.instances.get"),
    ("instances.stop", "compute.instances.stop"),
    ("instances.delete", "compute.instances.delete"),
    ("instances.setLabels", "compute.instances.setLabels"),
    ("zoneOperations.get", "compute.zoneOperations.get"),
];

/// The role in `config/` that grants `permission`, where it works: an operation carries no IAM
/// policy of its own, so `compute.zoneOperations.get` works only granted on the project
/// (`gcp-operations-role.yaml`); the others are granted on the VM alone (`gcp-role.yaml`).
pub fn role_file(permission: &str) -> &'static str {
    if permission == "compute.zoneOperations.get" {
        "config/gcp-operations-role.yaml"
    } else {
        "config/gcp-role.yaml"
    }
}

/// The permission a method needs.
pub fn permission(method: &str) -> &'static str {
    GCP_PERMISSIONS
        .iter()
        .find(|(m, _)| *m == method)
        .map_or("", |(_, p)| p)
}

/// The most labels a Compute Engine resource may have.
pub const MAX_LABELS: usize = 64;

/// The API's error body: `{"error": {"code", "message", "errors": [{"reason"}], "status",
/// "details": [{"@type", "reason", "metadata"}]}}`.
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
    /// An `ErrorInfo`'s: the field a refused value was in (`field`), the quota spent.
    metadata: BTreeMap<String, serde_json::Value>,
}

impl ErrorDetail {
    /// Whether any reason, in `errors[]` (`rateLimitExceeded`) or an `ErrorInfo` of
    /// `details[]` (`RATE_LIMIT_EXCEEDED`), is one of `these`.
    fn says(&self, these: &[&str]) -> bool {
        self.errors
            .iter()
            .chain(&self.details)
            .any(|r| these.contains(&r.reason.as_str()))
    }
}

/// Reasons of a rate quota spent: Compute Engine answers them with 403 (the Compute Engine
/// API's rate quota document), newer answers with an `ErrorInfo` saying `RATE_LIMIT_EXCEEDED`
/// too. The quota refills each minute, so they are retried.
const RATE_LIMITED: &[&str] = &[
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "RATE_LIMIT_EXCEEDED",
];
/// Reasons of a quota on the project's resources or a daily allowance spent: not a rate, so
/// not over within the minutes an action is retried, and not a permission to grant either.
const QUOTA_SPENT: &[&str] = &["quotaExceeded", "QUOTA_EXCEEDED", "dailyLimitExceeded"];

/// What a failed answer means, by its reason more than its status: a rate quota spent (403
/// `rateLimitExceeded`, or 429), and 5xx, are retried at the pace of `Retry-After` where it
/// is sent; a quota of the project spent is neither retried nor a permission; any other 401
/// or 403 is permissions (a 403 for want of an access scope says so, with the fix); the rest
/// (404, 409, 412) is the VM's state or the request.
pub fn classify(method: &'static str, answer: &RestAnswer) -> CloudError {
    let status = answer.status.as_u16();
    let e: ErrorBody = serde_json::from_slice(&answer.body).unwrap_or_default();
    let e = e.error;
    let reason = e
        .errors
        .first()
        .map(|r| r.reason.as_str())
        .filter(|r| !r.is_empty())
        .unwrap_or(&e.status);
    let rate_limited = e.says(RATE_LIMITED);
    let quota = !rate_limited && e.says(QUOTA_SPENT);
    let kind = match status {
        _ if rate_limited => ErrorKind::Retryable,
        403 if quota => ErrorKind::Other,
        _ => ErrorKind::of_status(status),
    };
    let mut message = format!(
        "{} (HTTP {status}): {}",
        crate::redact::brief(if reason.is_empty() { "error" } else { reason }, 64),
        if e.message.is_empty() {
            "no message".to_string()
        } else {
            // The API may quote what it was sent: no credential goes further.
            crate::redact::scrub(&e.message)
        }
    );
    let scopes = e.says(&["ACCESS_TOKEN_SCOPE_INSUFFICIENT"])
        || e.message.contains("insufficient authentication scopes");
    if rate_limited {
        message.push_str(" (the project's Compute Engine rate quota is spent for this minute)");
    } else if quota {
        message.push_str(
            " (a quota of the project is spent, not a permission: raise it on the console's Quotas page)",
        );
    } else if status == 403 && scopes {
        message.push_str(
            " (the VM's access scopes do not allow Compute Engine writes: stop the VM, then `gcloud compute instances set-service-account VM --zone ZONE --service-account SA --scopes=compute-rw`, or cloud-platform)",
        );
    } else if status == 403 {
        message.push_str(&format!(
            " (the VM's service account needs {}: see {})",
            permission(method),
            role_file(permission(method))
        ));
    }
    CloudError {
        operation: method,
        kind,
        message: crate::redact::brief(&message, 2048),
        request_id: None,
        retry_after: answer.retry_after(),
    }
}

/// `instances.setLabels` refused: a set of labels over Compute Engine's limit is
/// [`ErrorKind::Limit`] (the stamp is refused, not the action), and nothing else is. The
/// limit's refusal is a 400 on the `labels` field; so is a label Compute Engine finds
/// malformed, which is told apart by the count `sent`.
pub fn classify_labels(answer: &RestAnswer, sent: usize) -> CloudError {
    let mut e = classify("instances.setLabels", answer);
    let body: ErrorBody = serde_json::from_slice(&answer.body).unwrap_or_default();
    let detail = body.error;
    let on_labels = detail
        .details
        .iter()
        .any(|d| d.metadata.get("field").and_then(|f| f.as_str()) == Some("labels"))
        || detail
            .message
            .starts_with("Invalid value for field 'labels'");
    if answer.status.as_u16() == 400 && on_labels && sent > MAX_LABELS {
        e.kind = ErrorKind::Limit;
        e.message = crate::redact::brief(
            &format!(
                "{} (with the gpuwatch labels the VM would have {sent}, more than the {MAX_LABELS} Compute Engine allows: remove a label of the VM's to have its actions labelled)",
                e.message
            ),
            2048,
        );
    }
    e
}

/// The instance, as `instances.get` gives the fields read.
#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct Instance {
    pub status: String,
    pub labels: BTreeMap<String, String>,
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

/// Compute Engine, for one VM.
pub struct ComputeApi {
    pub(super) rest: Rest,
    /// `/compute/v1/projects/{project}/zones/{zone}`.
    pub(super) zone_path: String,
    /// `{zone_path}/instances/{name}`.
    pub instance: String,
    /// Whether an operation that could not be read has been said (once, loudly).
    pub(super) ops_unread_said: AtomicBool,
}

impl ComputeApi {
    pub fn new(
        base: &str,
        project: &str,
        zone: &str,
        name: &str,
        server: Arc<GceMetadata>,
    ) -> ComputeApi {
        let tokens: crate::cloud::rest::TokenSource = Box::new(move |operation| {
            let server = Arc::clone(&server);
            Box::pin(async move { token(&server, operation).await })
        });
        let zone_path = format!("/compute/v1/projects/{project}/zones/{zone}");
        ComputeApi {
            rest: Rest::bearer(base, tokens),
            instance: format!("{zone_path}/instances/{name}"),
            zone_path,
            ops_unread_said: AtomicBool::new(false),
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

    /// Calls `method`, then follows the operation it starts until its outcome is known: what
    /// the operation says, or, where it cannot be read, what `outcome` looks like on the
    /// instance. Returns the operation's name.
    pub async fn act(
        &self,
        method: &'static str,
        verb: Method,
        url: &str,
        outcome: Outcome,
    ) -> Result<Option<String>, CloudError> {
        let answer = self.rest.send(method, verb, url, None).await?;
        if !answer.status.is_success() {
            return Err(classify(method, &answer));
        }
        let op: GceOperation = serde_json::from_slice(&answer.body).unwrap_or_default();
        self.follow(method, op, &outcome).await
    }

    /// Sets `gpuwatch-action` and `gpuwatch-rule` among the instance's labels, with the
    /// fingerprint of the labels it read; a fingerprint gone stale (412) is read again, once.
    pub async fn label(&self, action: &str, rule: &str) -> Result<Option<String>, CloudError> {
        let method = "instances.setLabels";
        let url = format!("{}/setLabels", self.instance);
        let ours = BTreeMap::from([
            ("gpuwatch-action".to_string(), label_value(action)),
            ("gpuwatch-rule".to_string(), label_value(rule)),
        ]);
        let mut tries = 0;
        loop {
            tries += 1;
            let instance = self.get().await?;
            let mut labels = instance.labels;
            labels.extend(ours.clone());
            let body = serde_json::json!({
                "labels": labels,
                "labelFingerprint": instance.label_fingerprint,
            });
            let answer = self
                .rest
                .send(method, Method::POST, &url, Some(&body))
                .await?;
            if answer.status.as_u16() == 412 && tries < 2 {
                continue;
            }
            if !answer.status.is_success() {
                return Err(classify_labels(&answer, labels.len()));
            }
            let op: GceOperation = serde_json::from_slice(&answer.body).unwrap_or_default();
            return self.follow(method, op, &Outcome::Labelled(ours)).await;
        }
    }
}

/// A token of the VM's service account, for `operation`.
async fn token(server: &GceMetadata, operation: &'static str) -> Result<BearerToken, CloudError> {
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

    fn answer(status: u16, body: &str) -> RestAnswer {
        RestAnswer {
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
        assert_eq!(e.kind, ErrorKind::AccessDenied);
        assert!(
            e.message.ends_with(
                "(the VM's service account needs compute.instances.stop: see config/gcp-role.yaml)"
            ),
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

    /// Compute Engine says a rate quota is spent with 403 and its reason, not 429: that is
    /// throttling, retried (at the pace of `Retry-After` where sent), and names no permission.
    #[test]
    fn a_rate_limit_is_retried_by_its_reason_and_a_spent_quota_is_no_permission() {
        let quota_message = "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service 'compute.googleapis.com' for consumer 'project_number:123456789012'.";
        // As the API has answered for years: the reason in `errors[]`, the status PERMISSION_DENIED.
        let older = format!(
            r#"{{"error": {{"code": 403, "message": "{quota_message}",
              "errors": [{{"message": "{quota_message}", "domain": "usageLimits", "reason": "rateLimitExceeded"}}],
              "status": "PERMISSION_DENIED"}}}}"#
        );
        // As newer answers add it: an ErrorInfo saying RATE_LIMIT_EXCEEDED.
        let newer = format!(
            r#"{{"error": {{"code": 403, "message": "{quota_message}",
              "errors": [{{"message": "{quota_message}", "domain": "usageLimits", "reason": "forbidden"}}],
              "status": "PERMISSION_DENIED",
              "details": [{{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED", "domain": "googleapis.com",
                "metadata": {{"quota_metric": "compute.googleapis.com/default", "quota_limit": "defaultPerMinutePerProject", "service": "compute.googleapis.com"}}}},
                {{"@type": "type.googleapis.com/google.rpc.Help", "links": [{{"description": "Request a higher quota limit.", "url": "https://cloud.google.com/docs/quotas/help/request_increase"}}]}}]}}}}"#
        );
        let user = r#"{"error": {"code": 403, "message": "User Rate Limit Exceeded",
            "errors": [{"message": "User Rate Limit Exceeded", "domain": "usageLimits", "reason": "userRateLimitExceeded"}]}}"#;
        let operations = r#"{"error": {"code": 403, "message": "Rate Limit Exceeded",
            "errors": [{"message": "Rate Limit Exceeded", "domain": "usageLimits", "reason": "rateLimitExceeded"}]}}"#;
        for body in [older.as_str(), newer.as_str(), user, operations] {
            let e = classify("instances.stop", &answer(403, body));
            assert_eq!(e.kind, ErrorKind::Retryable, "{body}");
            assert!(!e.message.contains("needs"), "{}", e.message);
            assert!(e.message.contains("rate quota is spent"), "{}", e.message);
            assert_eq!(e.retry_after, None);
        }
        let mut throttled = answer(403, operations);
        throttled
            .headers
            .insert(reqwest::header::RETRY_AFTER, "17".parse().unwrap());
        assert_eq!(
            classify("zoneOperations.get", &throttled).retry_after,
            Some(std::time::Duration::from_secs(17))
        );
        // A quota of the project's resources is not over in a minute, nor a permission.
        let quota = r#"{"error": {"code": 403, "message": "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 8.0 in region us-central1.",
            "errors": [{"message": "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 8.0 in region us-central1.", "domain": "usageLimits", "reason": "quotaExceeded"}]}}"#;
        let e = classify("instances.stop", &answer(403, quota));
        assert_eq!(e.kind, ErrorKind::Other);
        assert!(e.message.contains("not a permission"), "{}", e.message);
        assert!(!e.message.contains("needs"), "{}", e.message);
    }

    /// Only a label set over Compute Engine's limit is a `Limit`: a malformed label, a refusal
    /// of another field and a denial are what they are.
    #[test]
    fn a_full_label_set_is_a_limit_and_nothing_else_is() {
        let refusal = |reason: &str| {
            format!(
                r#"{{"error": {{"code": 400, "message": "Invalid value for field 'labels': ''. {reason}",
                  "errors": [{{"message": "Invalid value for field 'labels': ''. {reason}", "domain": "global", "reason": "invalid"}}],
                  "status": "INVALID_ARGUMENT",
                  "details": [{{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "INVALID_FIELD_VALUE", "domain": "compute.googleapis.com",
                    "metadata": {{"field": "labels", "reason": "{reason}", "value": ""}}}}]}}}}"#
            )
        };
        let full = refusal("Resource cannot have more than 64 labels.");
        let e = classify_labels(&answer(400, &full), 65);
        assert_eq!(e.kind, ErrorKind::Limit);
        assert!(
            e.message
                .starts_with("invalid (HTTP 400): Invalid value for field 'labels'"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("would have 65, more than the 64"),
            "{}",
            e.message
        );
        // Without its details, the older answer's message names the field.
        let bare = r#"{"error": {"code": 400, "message": "Invalid value for field 'labels': ''. Resource cannot have more than 64 labels.", "errors": [{"reason": "invalid", "domain": "global", "message": "x"}]}}"#;
        assert_eq!(
            classify_labels(&answer(400, bare), 66).kind,
            ErrorKind::Limit
        );
        // Within the limit, a refusal of the labels is of a label's form.
        assert_eq!(
            classify_labels(&answer(400, &full), 64).kind,
            ErrorKind::Other
        );
        let form = refusal("Label value 'Idle 2h' violates format constraints.");
        assert_eq!(
            classify_labels(&answer(400, &form), 3).kind,
            ErrorKind::Other
        );
        let other = r#"{"error": {"code": 400, "message": "Invalid value for field 'labelFingerprint': 'x'.", "errors": [{"reason": "invalid", "message": "x"}]}}"#;
        assert_eq!(
            classify_labels(&answer(400, other), 65).kind,
            ErrorKind::Other
        );
        let denied = r#"{"error": {"code": 403, "message": "Required 'compute.instances.setLabels' permission for 'projects/p/zones/z/instances/vm'", "errors": [{"reason": "forbidden"}]}}"#;
        assert_eq!(
            classify_labels(&answer(403, denied), 65).kind,
            ErrorKind::AccessDenied
        );
        assert_eq!(
            classify_labels(&answer(503, "{}"), 65).kind,
            ErrorKind::Retryable
        );
    }

    #[test]
    fn label_values_are_what_compute_engine_takes() {
        assert_eq!(label_value("stop"), "stop");
        assert_eq!(label_value("Idle 2h: GPUs"), "idle_2h__gpus");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }
}
