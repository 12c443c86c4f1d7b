//! Azure Resource Manager, for this one VM: the calls gpuwatch makes, and nothing else.
//! `AZURE_ACTIONS` and the roles in `config/` (`azure-role.json` at the VM's scope,
//! `azure-operations-role.json` at the subscription's, `azure-budgets-role.json` at a budget's)
//! list the same permissions; a test keeps them in step. Each call carries a token of the VM's
//! managed identity, fetched from instance metadata and renewed before it expires; no token is
//! ever logged or put in an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::imds::AzureMetadata;
use crate::cloud::follow::{follow, Look, Pace};
use crate::cloud::metadata::MetadataError;
use crate::cloud::rest::{same_origin, BearerToken, Rest, RestAnswer};
use crate::cloud::{CloudError, ErrorKind};

pub const COMPUTE_API_VERSION: &str = "2024-11-01";
pub const TAGS_API_VERSION: &str = "2021-04-01";
pub const BUDGETS_API_VERSION: &str = "2024-08-01";

/// Where a permission takes effect: the scope its role is assigned at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The VM itself: reading, deallocating, deleting and tagging it.
    Vm,
    /// The subscription: an operation's status is read under it
    /// (`/subscriptions/{id}/providers/Microsoft.Compute/locations/{region}/operations/{id}`).
    Subscription,
    /// A Consumption budget's own scope (a subscription or a resource group).
    Budget,
}

impl Scope {
    /// The role in `config/` that grants this scope's permissions.
    pub fn role_file(self) -> &'static str {
        match self {
            Scope::Vm => "config/azure-role.json",
            Scope::Subscription => "config/azure-operations-role.json",
            Scope::Budget => "config/azure-budgets-role.json",
        }
    }

    fn words(self) -> &'static str {
        match self {
            Scope::Vm => "the VM's scope",
            Scope::Subscription => "the subscription's scope",
            Scope::Budget => "the budget's scope",
        }
    }
}

/// Every Resource Manager operation gpuwatch calls (by the specification's operation id), with
/// the permission that allows it and the scope where granting it works. The roles in `config/`
/// grant exactly these, each at its scope; a test keeps them in step with the code.
pub const AZURE_ACTIONS: &[(&str, &str, Scope)] = &[
    (
        "VirtualMachines_Get",
        "Microsoft.Compute/virtualMachines/read",
        Scope::Vm,
    ),
    (
        "VirtualMachines_Deallocate",
        "Microsoft.Compute/virtualMachines/deallocate/action",
        Scope::Vm,
    ),
    (
        "VirtualMachines_Delete",
        "Microsoft.Compute/virtualMachines/delete",
        Scope::Vm,
    ),
    (
        "Operations_Get",
        "Microsoft.Compute/locations/operations/read",
        Scope::Subscription,
    ),
    (
        "Tags_UpdateAtScope",
        "Microsoft.Resources/tags/write",
        Scope::Vm,
    ),
    (
        "Budgets_Get",
        "Microsoft.Consumption/budgets/read",
        Scope::Budget,
    ),
];

/// The permission an operation needs, and where it is granted.
pub fn permission(operation: &str) -> (&'static str, Scope) {
    AZURE_ACTIONS
        .iter()
        .find(|(op, _, _)| *op == operation)
        .map_or(("", Scope::Vm), |(_, p, scope)| (p, *scope))
}

/// How long an operation is followed to its end. Deallocating a large GPU VM takes minutes.
use crate::cloud::FOLLOW_FOR;
/// The wait between status reads when Azure does not say (`Retry-After`); Compute allows 15
/// status reads a minute per resource.
const DEFAULT_POLL: Duration = Duration::from_secs(5);

fn request_id(answer: &RestAnswer) -> Option<String> {
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
        crate::redact::brief(&crate::redact::scrub(&message), 1024),
    )
}

/// A 409 for another operation on the VM still running (Compute's `OperationNotAllowed`:
/// "Operation 'deallocate' is not allowed on VM 'x' since another operation is in progress.",
/// or "An ongoing operation is changing power state of Virtual Machine x to y. Please perform
/// operation z after some time."; Resource Manager's `AnotherOperationInProgress`): it ends, and
/// the call may then succeed. Any other 409 (hibernation not enabled, a VM marked for
/// deletion) is the VM's state.
fn another_operation_runs(code: &str, message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    code == "AnotherOperationInProgress"
        || (code == "OperationNotAllowed"
            && (message.contains("since another operation is in progress")
                || message.starts_with("an ongoing operation is changing power state")))
}

/// A refusal for the resource's limit of 50 tags (the Tags API: "The specified entity can have
/// a maximum of 50 tags at the end of the operation"): a message about tags that names the
/// limit of 50, whatever its code. A tag's name or value too long, or with characters Azure
/// reserves, is not one.
fn too_many_tags(code: &str, message: &str) -> bool {
    // A code that says it outright (`TagLimitExceeded`, `TooManyTags`), whatever the words.
    let code = code.to_ascii_lowercase();
    if code.contains("tag")
        && ["limit", "toomany", "exceed"]
            .iter()
            .any(|w| code.contains(w))
    {
        return true;
    }
    let message = message.to_ascii_lowercase();
    let fifty = message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == "50");
    message.contains("tags")
        && fifty
        && ["maximum", "limit", "exceed", "more than"]
            .iter()
            .any(|w| message.contains(w))
}

/// What a failed answer means: throttling, 5xx and another operation on the VM in the way are
/// retried; 401 and 403 are permissions; a tag set full is the VM's limit; the rest (404, 409)
/// is the VM's state or the request.
pub fn classify(operation: &'static str, answer: &RestAnswer) -> CloudError {
    let status = answer.status.as_u16();
    let (code, message) = error_text(&answer.body);
    let kind = match status {
        409 if another_operation_runs(&code, &message) => ErrorKind::Retryable,
        400 | 409 if operation == "Tags_UpdateAtScope" && too_many_tags(&code, &message) => {
            ErrorKind::Limit
        }
        _ => ErrorKind::of_status(status),
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
        let (permission, scope) = permission(operation);
        message.push_str(&format!(
            " (the VM's identity needs {permission} at {}: see {})",
            scope.words(),
            scope.role_file()
        ));
    }
    CloudError {
        operation,
        kind,
        message,
        request_id: request_id(answer),
        retry_after: answer.retry_after(),
    }
}

/// Resource Manager, for one VM.
pub struct Arm {
    rest: Rest,
    /// The VM's resource id: `/subscriptions/.../virtualMachines/{name}`.
    pub vm: String,
}

impl Arm {
    pub fn new(base: &str, vm: String, imds: Arc<AzureMetadata>) -> Arm {
        let tokens: crate::cloud::rest::TokenSource = Box::new(move |operation| {
            let imds = Arc::clone(&imds);
            Box::pin(async move { token(&imds, operation).await })
        });
        Arm {
            rest: Rest::bearer(base, tokens),
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
    ) -> Result<RestAnswer, CloudError> {
        self.rest.send(operation, method, url, body).await
    }

    /// The VM's power state, from its instance view: `deallocated` for `PowerState/deallocated`.
    pub async fn power_state(&self) -> Result<Option<String>, CloudError> {
        let url = format!(
            "{}?api-version={COMPUTE_API_VERSION}&$expand=instanceView",
            self.vm
        );
        let answer = self
            .send("VirtualMachines_Get", Method::GET, &url, None)
            .await?;
        if !answer.status.is_success() {
            return Err(classify("VirtualMachines_Get", &answer));
        }
        Ok(power_state(&answer.body))
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
        let pace = Pace {
            first: retry_after(first),
            every: DEFAULT_POLL,
            most: DEFAULT_POLL,
        };
        let unknown = |_: &str| {
            fail(
                ErrorKind::Other,
                format!(
                    "the operation had not ended after {}: its outcome is unknown",
                    humantime::format_duration(FOLLOW_FOR)
                ),
            )
        };
        let fail = &fail;
        let deadline = Instant::now() + FOLLOW_FOR;
        follow(deadline, pace, unknown, || async move {
            let answer = match self.send("Operations_Get", Method::GET, url, None).await {
                Ok(a) => a,
                Err(e) if e.kind == ErrorKind::Retryable => {
                    return Look::Again(e.retry_after, e.to_string())
                }
                Err(e) => return Look::Ended(Err(e)),
            };
            look(operation, &answer, async_operation, fail)
        })
        .await
    }
}

/// What one read of an operation's status URL says: a `Location` URL answers 202 while the
/// operation runs, then its result; the `Azure-AsyncOperation` resource answers 200 with its
/// `status` while it can be read (a failure to read it says nothing of the operation).
fn look(
    operation: &'static str,
    answer: &RestAnswer,
    async_operation: bool,
    fail: &dyn Fn(ErrorKind, String) -> CloudError,
) -> Look<()> {
    let asked = answer.retry_after();
    if !async_operation {
        return match answer.status.as_u16() {
            202 | 429 => Look::Running(asked),
            200..=299 => Look::Ended(Ok(())),
            _ => {
                let e = classify(operation, answer);
                Look::Ended(Err(fail(
                    ErrorKind::Other,
                    format!("the operation ended: {}", e.message),
                )))
            }
        };
    }
    if !answer.status.is_success() {
        let e = classify("Operations_Get", answer);
        if e.kind == ErrorKind::Retryable {
            return Look::Again(e.retry_after, e.to_string());
        }
        return Look::Ended(Err(fail(
            e.kind,
            format!("the operation was accepted, but its status cannot be read: {e}"),
        )));
    }
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Status {
        status: String,
        error: Option<ErrorDetail>,
    }
    let s: Status = serde_json::from_slice(&answer.body).unwrap_or_default();
    match s.status.as_str() {
        "Succeeded" => Look::Ended(Ok(())),
        "Failed" | "Canceled" => {
            let e = s.error.unwrap_or_default();
            Look::Ended(Err(fail(
                ErrorKind::Other,
                format!(
                    "the operation ended {}: {}: {}",
                    s.status,
                    crate::redact::brief(&e.code, 128),
                    crate::redact::brief(&e.message, 1024)
                ),
            )))
        }
        _ => Look::Running(asked),
    }
}

/// The power state a VM's answer with its instance view gives (its `PowerState/` status), if
/// any.
pub fn power_state(body: &[u8]) -> Option<String> {
    let vm: serde_json::Value = serde_json::from_slice(body).ok()?;
    vm["properties"]["instanceView"]["statuses"]
        .as_array()?
        .iter()
        .filter_map(|s| s["code"].as_str()?.strip_prefix("PowerState/"))
        .map(|s| crate::redact::brief(s, 32))
        .next()
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
async fn token(imds: &AzureMetadata, operation: &'static str) -> Result<BearerToken, CloudError> {
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
        let answer = |status: u16, body: &str| RestAnswer {
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

    fn answer(status: u16, body: &str, retry_after: Option<&str>) -> RestAnswer {
        let mut headers = HeaderMap::new();
        if let Some(r) = retry_after {
            headers.insert(RETRY_AFTER, r.parse().unwrap());
        }
        RestAnswer {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: body.as_bytes().to_vec(),
        }
    }

    fn arm_error(code: &str, message: &str) -> String {
        serde_json::json!({"error": {"code": code, "message": message}}).to_string()
    }

    /// Another operation in the way ends, and the call may then succeed: retried, at the pace
    /// Azure asks. A 409 for the VM's state is not.
    #[test]
    fn a_409_for_another_operation_in_progress_is_retried_and_any_other_is_not() {
        let deallocate = "VirtualMachines_Deallocate";
        let cases = [
            (
                "OperationNotAllowed",
                "Operation 'deallocate' is not allowed on VM 'gpu-vm-1' since another operation is in progress.",
                ErrorKind::Retryable,
            ),
            (
                "OperationNotAllowed",
                "An ongoing operation is changing power state of Virtual Machine gpu-vm-1 to VM deallocated. Please perform operation deallocate after some time.",
                ErrorKind::Retryable,
            ),
            (
                "AnotherOperationInProgress",
                "Another operation on this or dependent resource is in progress.",
                ErrorKind::Retryable,
            ),
            (
                "OperationNotAllowed",
                "Hibernation is not enabled on the virtual machine 'gpu-vm-1'.",
                ErrorKind::Other,
            ),
            (
                "OperationNotAllowed",
                "Operation 'deallocate' is not allowed on VM 'gpu-vm-1' since the VM is marked for deletion. You can only retry the Delete operation (or wait for an ongoing one to complete).",
                ErrorKind::Other,
            ),
            (
                "Conflict",
                "since another operation is in progress",
                ErrorKind::Other,
            ),
        ];
        for (code, message, kind) in cases {
            let e = classify(
                deallocate,
                &answer(409, &arm_error(code, message), Some("7")),
            );
            assert_eq!(e.kind, kind, "{message}");
            assert_eq!(e.retry_after, Some(Duration::from_secs(7)), "{message}");
        }
        let e = classify(deallocate, &answer(429, "", None));
        assert_eq!((e.kind, e.retry_after), (ErrorKind::Retryable, None));
    }

    /// A tag set full is the VM's limit, and only that: a tag refused for its name or value,
    /// or a call other than the stamp, is not.
    #[test]
    fn a_tag_set_full_is_the_vm_s_limit_and_nothing_else_is() {
        let tags = "Tags_UpdateAtScope";
        let full = arm_error(
            "BadRequest",
            "The specified entity can have a maximum of 50 tags at the end of the operation.",
        );
        assert_eq!(
            classify(tags, &answer(400, &full, None)).kind,
            ErrorKind::Limit
        );
        // A code that says it outright, whatever its words.
        for code in ["TagLimitExceeded", "TooManyTags"] {
            let said = arm_error(code, "Too many tags.");
            assert_eq!(
                classify(tags, &answer(400, &said, None)).kind,
                ErrorKind::Limit,
                "{code}"
            );
        }
        let others = [
            arm_error(
                "InvalidTagValueLength",
                "The tag value must be a string of at most 256 characters.",
            ),
            arm_error(
                "InvalidTagNameCharacters",
                "The tag names 'a/b' have reserved characters '<,>,%,&,\\,?,/' or control characters.",
            ),
            arm_error("InvalidRequestContent", "The request content was invalid and could not be deserialized."),
            arm_error("BadRequest", "500 tags are more than the maximum of 1500."),
        ];
        for body in &others {
            assert_eq!(
                classify(tags, &answer(400, body, None)).kind,
                ErrorKind::Other,
                "{body}"
            );
        }
        assert_eq!(
            classify("VirtualMachines_Deallocate", &answer(400, &full, None)).kind,
            ErrorKind::Other
        );
    }

    #[test]
    fn the_power_state_is_read_from_the_instance_view() {
        let vm = |statuses: &str| {
            format!(
                r#"{{"name": "gpu-vm-1", "properties": {{"instanceView": {{"statuses": {statuses}}}}}}}"#
            )
        };
        let deallocated = vm(
            r#"[{"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded"},
            {"code": "PowerState/deallocated", "level": "Info", "displayStatus": "VM deallocated"}]"#,
        );
        assert_eq!(
            power_state(deallocated.as_bytes()).as_deref(),
            Some("deallocated")
        );
        let hibernated = vm(
            r#"[{"code": "ProvisioningState/succeeded"}, {"code": "HibernationState/Hibernated"},
            {"code": "PowerState/deallocated"}]"#,
        );
        assert_eq!(
            power_state(hibernated.as_bytes()).as_deref(),
            Some("deallocated")
        );
        assert_eq!(
            power_state(vm(r#"[{"code": "ProvisioningState/updating"}]"#).as_bytes()),
            None
        );
        assert_eq!(power_state(b"{}"), None);
        assert_eq!(power_state(b"not json"), None);
    }

    /// Each permission names the role file and scope that grant it, as a 403 says.
    #[test]
    fn a_denied_call_names_the_role_and_scope_that_grant_it() {
        let denied = arm_error(
            "AuthorizationFailed",
            "The client 'x' does not have authorization.",
        );
        let e = classify("Operations_Get", &answer(403, &denied, None));
        assert!(
            e.message.ends_with("(the VM's identity needs Microsoft.Compute/locations/operations/read at the subscription's scope: see config/azure-operations-role.json)"),
            "{}",
            e.message
        );
        let e = classify("Budgets_Get", &answer(403, &denied, None));
        assert!(
            e.message
                .contains("at the budget's scope: see config/azure-budgets-role.json"),
            "{}",
            e.message
        );
    }
}
