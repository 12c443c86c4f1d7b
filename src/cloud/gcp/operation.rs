//! Following a zone operation Compute Engine accepted until its outcome is known. A read of
//! the operation that is throttled, fails with a 5xx or times out is read again, at the pace
//! the API asks; where the operation cannot be read at all (`zoneOperations.get` not granted
//! on the project, which a role bound on the VM cannot grant), the instance is read instead
//! until it shows the outcome. Only when neither tells within [`FOLLOW_FOR`] is the outcome
//! unknown. No error after the call was accepted is retryable: a retry would call again.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::Deserialize;

use super::compute::{classify, ComputeApi, Instance};
use crate::cloud::follow::{follow, Look, Pace};
use crate::cloud::{CloudError, ErrorKind, FOLLOW_FOR};

/// The wait between reads of an operation's status, or of the instance.
const POLL: Duration = Duration::from_secs(2);
/// The longest wait between reads while they fail.
const MOST: Duration = Duration::from_secs(30);

/// An operation: its name, status and errors.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct GceOperation {
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

/// What an operation's success looks like on the instance, for when the operation cannot be
/// read.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A stop: the instance is `TERMINATED` (Compute Engine's word for a stopped VM) or
    /// `STOPPED`.
    Stopped,
    /// A delete: the instance is gone (404).
    Deleted,
    /// A label change: the instance carries these labels.
    Labelled(BTreeMap<String, String>),
}

impl Outcome {
    /// Whether an `instances.get` that answered `status` (with `instance`, where it parsed)
    /// shows the outcome.
    pub fn shown(&self, status: u16, instance: Option<&Instance>) -> bool {
        match (self, status, instance) {
            (Outcome::Deleted, 404, _) => true,
            (Outcome::Stopped, 200, Some(i)) => {
                matches!(i.status.as_str(), "TERMINATED" | "STOPPED")
            }
            (Outcome::Labelled(want), 200, Some(i)) => {
                want.iter().all(|(k, v)| i.labels.get(k) == Some(v))
            }
            _ => false,
        }
    }

    fn words(&self) -> &'static str {
        match self {
            Outcome::Stopped => "stopped",
            Outcome::Deleted => "gone",
            Outcome::Labelled(_) => "labelled",
        }
    }
}

/// How operations and the instance are read while an operation runs.
const PACE: Pace = Pace {
    first: POLL,
    every: POLL,
    most: MOST,
};

/// A read of the operation or the instance.
enum Read<T> {
    /// What it answered.
    Got(T),
    /// Worth reading again: the API's wait, if it gave one, and why.
    Again(Option<Duration>, String),
    /// Not to be read: why.
    Refused(CloudError),
}

/// An error about an operation gpuwatch's call started: never retryable.
fn settled(method: &'static str, kind: ErrorKind, message: String) -> CloudError {
    CloudError {
        operation: method,
        kind: if kind == ErrorKind::Retryable {
            ErrorKind::Other
        } else {
            kind
        },
        message,
        request_id: None,
        retry_after: None,
    }
}

impl ComputeApi {
    /// Follows `op`, which `method` started, until its outcome is known (see the module).
    /// Returns the operation's name.
    pub(super) async fn follow(
        &self,
        method: &'static str,
        mut op: GceOperation,
        outcome: &Outcome,
    ) -> Result<Option<String>, CloudError> {
        // A name is a path segment: nothing that could leave it.
        let name = op.name.clone();
        if name.is_empty()
            || name.len() > 128
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(settled(
                method,
                ErrorKind::Other,
                "the answer names no operation: its outcome is unknown".into(),
            ));
        }
        let url = format!("{}/operations/{name}", self.zone_path);
        let deadline = Instant::now() + FOLLOW_FOR;
        let unknown = |_: &str| {
            settled(
                method,
                ErrorKind::Other,
                format!(
                    "operation {name} had not ended after {}: its outcome is unknown",
                    humantime::format_duration(FOLLOW_FOR)
                ),
            )
        };
        if op.status != "DONE" {
            let (url, name) = (&url, &name);
            // Ends with the operation, or with why it cannot be read.
            let read = follow(deadline, PACE, unknown, || async move {
                match self.read("zoneOperations.get", url).await {
                    Read::Got((_, body)) => {
                        let mut op: GceOperation =
                            serde_json::from_slice(&body).unwrap_or_default();
                        op.name = name.clone();
                        if op.status == "DONE" {
                            Look::Ended(Ok(Ok(op)))
                        } else {
                            Look::Running(None)
                        }
                    }
                    Read::Again(asked, why) => Look::Again(asked, why),
                    Read::Refused(why) => Look::Ended(Ok(Err(why))),
                }
            });
            op = match read.await? {
                Ok(op) => op,
                Err(why) => return self.watch(method, name, outcome, deadline, why).await,
            };
        }
        ended(method, &name, op)
    }

    /// Reads the instance until it shows `outcome`, for operation `name`, which cannot be read
    /// (`why`).
    async fn watch(
        &self,
        method: &'static str,
        name: &str,
        outcome: &Outcome,
        deadline: Instant,
        why: CloudError,
    ) -> Result<Option<String>, CloudError> {
        let denied = why.kind == ErrorKind::AccessDenied;
        let why = crate::redact::brief(&why.message, 512);
        if !self.ops_unread_said.swap(true, Ordering::Relaxed) {
            let grant = if denied {
                ": grant compute.zoneOperations.get on the project (config/gcp-operations-role.yaml) to follow operations themselves"
            } else {
                ""
            };
            tracing::warn!(operation = %name, error = %why, "the operation's status cannot be read, so the instance is read until it shows the outcome{grant}");
        } else {
            tracing::debug!(operation = %name, error = %why, "following the instance for the operation's outcome");
        }
        let unknown = |_: &str| {
            settled(
                method,
                ErrorKind::Other,
                format!(
                    "operation {name} was accepted, but cannot be read ({why}), and the instance did not show it {} within {}: its outcome is unknown",
                    outcome.words(),
                    humantime::format_duration(FOLLOW_FOR)
                ),
            )
        };
        let why = &why;
        follow(deadline, PACE, unknown, || async move {
            match self.read("instances.get", &self.instance).await {
                Read::Got((status, body)) => {
                    let instance: Option<Instance> = serde_json::from_slice(&body).ok();
                    if outcome.shown(status, instance.as_ref()) {
                        Look::Ended(Ok(Some(name.to_string())))
                    } else {
                        Look::Running(None)
                    }
                }
                Read::Again(asked, why) => Look::Again(asked, why),
                Read::Refused(e) => Look::Ended(Err(settled(
                    method,
                    e.kind,
                    format!(
                        "operation {name} was accepted, but neither it ({why}) nor the instance ({}) can be read: its outcome is unknown",
                        e.message
                    ),
                ))),
            }
        })
        .await
    }

    /// One read of `url` for `method`: a success, and the instance's 404 (a delete's outcome),
    /// are what it answered.
    async fn read(&self, method: &'static str, url: &str) -> Read<(u16, Vec<u8>)> {
        match self.rest.send(method, Method::GET, url, None).await {
            Ok(a) if a.status.is_success() || (method == "instances.get" && a.status == 404) => {
                Read::Got((a.status.as_u16(), a.body))
            }
            Ok(a) => match classify(method, &a) {
                e if e.kind == ErrorKind::Retryable => Read::Again(e.retry_after, e.message),
                e => Read::Refused(e),
            },
            Err(e) if e.kind == ErrorKind::Retryable => Read::Again(e.retry_after, e.message),
            Err(e) => Read::Refused(e),
        }
    }
}

/// What an operation that is `DONE` says: its name, or its errors.
fn ended(method: &'static str, name: &str, op: GceOperation) -> Result<Option<String>, CloudError> {
    match op.error.map(|e| e.errors).unwrap_or_default().as_slice() {
        [] => Ok(Some(name.to_string())),
        errors => Err(settled(
            method,
            ErrorKind::Other,
            format!(
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
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(status: &str, labels: &[(&str, &str)]) -> Instance {
        Instance {
            status: status.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Instance::default()
        }
    }

    /// Where the operation cannot be read, the instance tells: stopped is `TERMINATED` (or
    /// `STOPPED`), deleted is a 404, labelled is carrying the labels; nothing else is.
    #[test]
    fn the_instance_shows_an_outcome_only_once_it_is_there() {
        let stopping = instance("STOPPING", &[]);
        let stopped = instance("TERMINATED", &[]);
        assert!(Outcome::Stopped.shown(200, Some(&stopped)));
        assert!(Outcome::Stopped.shown(200, Some(&instance("STOPPED", &[]))));
        assert!(!Outcome::Stopped.shown(200, Some(&stopping)));
        assert!(!Outcome::Stopped.shown(200, Some(&instance("RUNNING", &[]))));
        assert!(!Outcome::Stopped.shown(404, None));
        assert!(!Outcome::Stopped.shown(200, None));
        assert!(Outcome::Deleted.shown(404, None));
        assert!(!Outcome::Deleted.shown(200, Some(&stopped)));
        let want = Outcome::Labelled(BTreeMap::from([
            ("gpuwatch-action".to_string(), "stop".to_string()),
            ("gpuwatch-rule".to_string(), "idle_2h".to_string()),
        ]));
        let on = instance(
            "RUNNING",
            &[
                ("team", "ml"),
                ("gpuwatch-action", "stop"),
                ("gpuwatch-rule", "idle_2h"),
            ],
        );
        assert!(want.shown(200, Some(&on)));
        let before = instance(
            "RUNNING",
            &[("team", "ml"), ("gpuwatch-action", "terminate")],
        );
        assert!(!want.shown(200, Some(&before)));
        assert!(!want.shown(404, None));
    }

    #[test]
    fn no_error_after_an_accepted_call_is_retryable() {
        let e = settled("instances.stop", ErrorKind::Retryable, "x".into());
        assert_eq!(e.kind, ErrorKind::Other);
        let e = settled("instances.stop", ErrorKind::AccessDenied, "x".into());
        assert_eq!(e.kind, ErrorKind::AccessDenied);
    }
}
