//! Carrying out decisions: notifications (log, webhook, wall), commands, and instance actions
//! through the cloud boundary, each written to the audit log with its evidence, its mode and
//! the cloud's request ids.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cloud::plan::Plan;
use crate::cloud::{Call, CloudError, ControlPlane, ErrorKind, Node};
use crate::config::{ActionsConfig, Mode, SpotStop};
use crate::rules::{Action, Rule, Scope};
use crate::state::{AuditLog, AuditRecord};

/// The result of one action, as `gpuwatch_actions_total{result}` counts it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done,
    DryRun(String),
    Failed(String),
    Refused(String),
    /// The audit record of a mutating action could not be made durable, so it did not run.
    NotRecorded(String),
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::DryRun(_) => "dry_run",
            Outcome::Failed(_) => "failed",
            Outcome::Refused(_) => "refused",
            Outcome::NotRecorded(_) => "not_recorded",
        }
    }
}

/// This instance and its cloud's API, once instance metadata has named it.
#[derive(Clone)]
pub struct Connected {
    pub node: Node,
    pub api: Arc<dyn ControlPlane>,
}

pub struct Executor {
    pub mode: Mode,
    pub spot_stop: SpotStop,
    pub exec_timeout: Duration,
    /// How long cloud calls are retried through throttling, 5xx and outages.
    pub retry_for: Duration,
    pub audit: Arc<AuditLog>,
    /// This instance, once instance metadata has named it (at start, or later).
    cloud: std::sync::OnceLock<Connected>,
    pub notifier: crate::notify::Notifier,
    denied_reported: AtomicBool,
    /// `gpuwatch:action` stamps the cloud refused for its own limits, whose actions went on.
    stamps_refused: AtomicU64,
    /// An audit log that cannot be written is said once, then once a minute with a count.
    audit_failing: std::sync::Mutex<crate::time::Throttle>,
    /// The reclaim verdicts this node serves to the cluster controller.
    pub verdicts: Arc<crate::kubernetes::verdicts::Verdicts>,
}

impl Executor {
    /// An executor with the `[actions]` settings, writing to `audit`, with no instance to act
    /// on until `set_cloud`. Starts the notification task in `tasks`.
    pub fn new(
        actions: &ActionsConfig,
        audit: Arc<AuditLog>,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Executor {
        Executor {
            mode: actions.mode,
            spot_stop: actions.spot_stop,
            exec_timeout: actions.exec_timeout,
            retry_for: actions.retry_for,
            audit,
            cloud: std::sync::OnceLock::new(),
            notifier: crate::notify::Notifier::start(
                actions.webhook_url.clone(),
                actions.wall,
                tasks,
            ),
            denied_reported: AtomicBool::new(false),
            stamps_refused: AtomicU64::new(0),
            audit_failing: std::sync::Mutex::default(),
            verdicts: Arc::default(),
        }
    }

    /// How many `gpuwatch:action` stamps the cloud refused for its own limits (the actions went
    /// on without them).
    pub fn stamps_refused(&self) -> u64 {
        self.stamps_refused.load(Ordering::Relaxed)
    }

    /// This instance and its cloud's API, once known.
    pub fn cloud(&self) -> Option<&Connected> {
        self.cloud.get()
    }

    /// Acts on `cloud` from now on. The instance is named once: a second call changes nothing.
    pub fn set_cloud(&self, cloud: Connected) {
        let _ = self.cloud.set(cloud);
    }

    /// Writes one audit record; an audit log that cannot be written is logged loudly and
    /// counted. Returns whether the record is durable.
    #[must_use = "no record, no act: what follows an audit record runs only if it was made durable"]
    pub fn audit(&self, record: AuditRecord) -> bool {
        let instance = self.cloud().map(|c| c.node.instance_id.as_str());
        let record = record.stamped(crate::time::now(), self.mode.as_str(), instance);
        // Each record is fsynced.
        let result = crate::state::off_async(|| self.audit.append(&record));
        let mut failing = self.audit_failing.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                if failing.clear() {
                    tracing::info!(path = %self.audit.path().display(), "the audit log is written again");
                }
                true
            }
            Err(e) => {
                self.audit.errors.count(crate::state::DiskOp::Audit);
                if let Some(unsaid) = failing.due(Duration::from_secs(60)) {
                    tracing::error!(
                        path = %self.audit.path().display(),
                        error = %e,
                        failed_since_last_said = unsaid,
                        "cannot write the audit log: what needs a record waits (gpuwatch_state_errors_total{{op=\"audit\"}} counts each failure)"
                    );
                }
                false
            }
        }
    }

    /// Queues a message for the webhook (Slack-compatible `text`) and, for warnings, for the
    /// terminals of logged-in users. Never waits: delivery happens off the decision loop.
    pub fn notify(&self, text: &str, to_terminals: bool) {
        self.notifier.send(text, to_terminals);
    }

    /// Carries out `action` for `rule`, exactly once, as decided on the sample taken `at`.
    /// Before each retry of a cloud call, `recheck` says whether the action has been called off
    /// since (a hold placed, a spot interruption announced): then it stops there, refused.
    /// Returns what happened.
    pub async fn execute(
        &self,
        rule: &Rule,
        action: Action,
        evidence: &serde_json::Value,
        at: f64,
        recheck: Recheck<'_>,
    ) -> Outcome {
        let recorded = self.audit(AuditRecord::ActionAttempt {
            rule: rule.name.clone(),
            at,
            action,
            evidence: evidence.clone(),
        });
        // No record, no action: a restart could not tell that it ran. Dry-run withholds it
        // the same way, so that a rehearsal shows what enforcement would do. An alert too is
        // withheld, as a budget alert is: sent once it is on record.
        if !recorded {
            let why = format!(
                "the audit log {} cannot be written; the {action} waits until it can{}",
                self.audit.path().display(),
                if self.mode == Mode::DryRun {
                    " (in dry-run, as enforcement would)"
                } else {
                    ""
                }
            );
            tracing::error!(rule = %rule.name, "{why}");
            return Outcome::NotRecorded(why);
        }
        let outcome = match action {
            Action::Alert => {
                let text = format!(
                    "gpuwatch: rule \"{}\" breached: {}",
                    rule.name,
                    rule.cause()
                );
                tracing::warn!(rule = %rule.name, "{text}");
                self.notify(&text, false);
                Outcome::Done
            }
            Action::Exec if self.mode == Mode::DryRun => {
                Outcome::DryRun(format!("would run {:?}", rule.command))
            }
            Action::Exec => self.exec(rule, evidence).await,
            Action::Reclaim => self.reclaim(rule, evidence, at),
            // Config refuses these; this is the second lock.
            _ if rule.scope != Scope::Node => Outcome::Refused(format!(
                "a {}-scoped rule never acts on the instance",
                rule.scope.as_str()
            )),
            _ => self.instance_action(rule, action, recheck).await,
        };
        let (result, detail) = match &outcome {
            Outcome::Done => ("done", String::new()),
            Outcome::DryRun(d)
            | Outcome::Failed(d)
            | Outcome::Refused(d)
            | Outcome::NotRecorded(d) => (outcome.label(), d.clone()),
        };
        let _ = self.audit(AuditRecord::ActionResult {
            rule: rule.name.clone(),
            action,
            result: result.to_string(),
            detail,
        });
        let text = match &outcome {
            Outcome::Done => format!("gpuwatch: {action} done (rule \"{}\")", rule.name),
            Outcome::DryRun(d) => format!("gpuwatch (dry-run): {d} (rule \"{}\")", rule.name),
            Outcome::Failed(d) => {
                format!("gpuwatch: {action} FAILED (rule \"{}\"): {d}", rule.name)
            }
            Outcome::Refused(d) | Outcome::NotRecorded(d) => {
                format!("gpuwatch: {action} refused (rule \"{}\"): {d}", rule.name)
            }
        };
        match &outcome {
            Outcome::Failed(_) | Outcome::Refused(_) => tracing::error!("{text}"),
            _ => tracing::warn!("{text}"),
        }
        if action != Action::Alert {
            self.notify(&text, false);
        }
        outcome
    }

    /// Gives the pod's verdict of idleness to the cluster controller, in either mode: the
    /// verdict writes nothing, and the controller's own mode says what it does with it.
    fn reclaim(&self, rule: &Rule, evidence: &serde_json::Value, at: f64) -> Outcome {
        let subject = rule.subject.as_deref().unwrap_or("");
        let (Scope::Pod, Some((namespace, pod))) = (rule.scope, subject.split_once('/')) else {
            return Outcome::Refused("only a pod-scoped rule gives a reclaim verdict".into());
        };
        let gpus: Vec<String> = evidence
            .get("gpus")
            .and_then(|g| g.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let configured = rule
            .name
            .strip_suffix(subject)
            .map_or(rule.name.as_str(), str::trim_end);
        let verdict = crate::kubernetes::verdicts::Verdict {
            rule: configured.to_string(),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            gpus,
            since: at,
            mode: self.mode.as_str(),
        };
        if !self.verdicts.give(&rule.name, verdict) {
            return Outcome::Refused(format!(
                "this node already serves {} reclaim verdicts",
                crate::kubernetes::verdicts::MAX_VERDICTS
            ));
        }
        let said =
            format!("pod {subject} is idle: its verdict is served to the cluster controller");
        match self.mode {
            Mode::DryRun => Outcome::DryRun(said),
            Mode::Enforce => Outcome::Done,
        }
    }

    async fn exec(&self, rule: &Rule, evidence: &serde_json::Value) -> Outcome {
        if rule.command.is_empty() {
            return Outcome::Refused("the rule has no command".into());
        }
        // A pod-scoped rule's command is told which pod: `namespace/pod`; a job's or a user's,
        // which job or user, and the devices judged (`0,1`, `0:1` for a GPU instance).
        let subject = rule.subject.as_deref().unwrap_or("");
        let (namespace, pod) = match rule.scope {
            Scope::Pod => subject.split_once('/').unwrap_or(("", "")),
            _ => ("", ""),
        };
        let job = if rule.scope == Scope::Job {
            subject
        } else {
            ""
        };
        // A job's user is in its evidence, where the holders knew it.
        let user = match rule.scope {
            Scope::User => subject,
            Scope::Job => evidence.get("user").and_then(|u| u.as_str()).unwrap_or(""),
            _ => "",
        };
        let gpus: Vec<&str> = evidence
            .get("gpus")
            .and_then(|g| g.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        let gpus = gpus.join(",");
        let env = [
            ("GPUWATCH_RULE", rule.name.as_str()),
            ("GPUWATCH_ACTION", "exec"),
            ("GPUWATCH_NAMESPACE", namespace),
            ("GPUWATCH_POD", pod),
            ("GPUWATCH_JOB", job),
            ("GPUWATCH_USER", user),
            ("GPUWATCH_GPUS", &gpus),
        ];
        match crate::exec::run(
            &rule.command,
            &env,
            &crate::cloud::credentials(),
            self.exec_timeout,
        )
        .await
        {
            Ok(status) if status.success() => Outcome::Done,
            Ok(status) => Outcome::Failed(format!("{:?} exited with {status}", rule.command[0])),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }

    async fn instance_action(&self, rule: &Rule, action: Action, recheck: Recheck<'_>) -> Outcome {
        let Some(Connected { api, .. }) = self.cloud() else {
            return match self.mode {
                Mode::DryRun => Outcome::DryRun(format!(
                    "would {action} this instance (no cloud provider is configured)"
                )),
                Mode::Enforce => Outcome::Refused(crate::cloud::no_provider()),
            };
        };
        let steps = match self
            .retry(recheck, api, || api.plan(action, self.spot_stop))
            .await
        {
            Ok(Plan::Refuse(why)) => return Outcome::Refused(why),
            Ok(Plan::Steps(s)) => s,
            Err(Stopped::Cloud(e)) => {
                return Outcome::Failed(format!(
                    "{}: {}",
                    e.operation,
                    crate::redact::scrub(&e.message)
                ))
            }
            Err(Stopped::CalledOff(why)) => return called_off(why),
        };
        let described: Vec<String> = steps.iter().map(|s| s.describe()).collect();
        if self.mode == Mode::DryRun {
            return Outcome::DryRun(format!("would {}", described.join(", then ")));
        }
        match self
            .retry(recheck, api, || api.tag_action(action.as_str(), &rule.name))
            .await
        {
            Ok(call) => self.api_call(rule, call),
            // A stamp refused for the cloud's own limits (a VM with all the tags it may have)
            // says nothing of the action: it goes on, on record, without the stamp.
            Err(Stopped::Cloud(e)) if e.kind == ErrorKind::Limit => self.unstamped(rule, action, e),
            Err(e) => return self.stopped(rule, e),
        }
        for step in &steps {
            match self.retry(recheck, api, || step.run()).await {
                Ok(call) => self.api_call(rule, call),
                Err(e) => return self.stopped(rule, e),
            }
        }
        Outcome::Done
    }

    /// Records a cloud call that succeeded; it has happened, so a record that fails is only
    /// logged (by `audit`).
    fn api_call(&self, rule: &Rule, call: Call) {
        let _ = self.audit(AuditRecord::ApiCall {
            rule: rule.name.clone(),
            operation: call.operation,
            request_id: call.request_id,
        });
    }

    /// Records a stamp the cloud refused for its limits: logged, audited and counted.
    fn unstamped(&self, rule: &Rule, action: Action, e: CloudError) {
        self.stamps_refused.fetch_add(1, Ordering::Relaxed);
        let error = crate::redact::scrub(&e.message);
        tracing::warn!(
            rule = %rule.name,
            operation = e.operation,
            error = %error,
            "the cloud refused the gpuwatch:action stamp for its own limits; the {action} goes on without it"
        );
        let _ = self.audit(AuditRecord::StampRefused {
            rule: rule.name.clone(),
            operation: e.operation.to_string(),
            error,
            request_id: e.request_id,
        });
    }

    fn stopped(&self, rule: &Rule, stopped: Stopped) -> Outcome {
        let e = match stopped {
            Stopped::Cloud(e) => e,
            Stopped::CalledOff(why) => return called_off(why),
        };
        // The cloud's own words may quote what it was sent: no credential the daemon holds
        // goes on record.
        let error = crate::redact::scrub(&e.message);
        let _ = self.audit(AuditRecord::ApiError {
            rule: rule.name.clone(),
            operation: e.operation.to_string(),
            error: error.clone(),
            request_id: e.request_id.clone(),
        });
        Outcome::Failed(format!("{}: {error}", e.operation))
    }

    /// Retries throttling, 5xx, unreachable endpoints and the cloud's own operations in the way
    /// for up to `retry_for`, with backoff, or at the pace the cloud's `Retry-After` asks (within
    /// a minute), unless `recheck` calls the action off before a retry. Access denied is
    /// reported once, loudly, and not retried.
    async fn retry<T, F, Fut>(
        &self,
        recheck: Recheck<'_>,
        api: &Arc<dyn ControlPlane>,
        call: F,
    ) -> Result<T, Stopped>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CloudError>>,
    {
        let started = Instant::now();
        let mut delay = Duration::from_millis(500);
        loop {
            match call().await {
                Ok(v) => return Ok(v),
                Err(e) if e.kind == ErrorKind::Retryable && started.elapsed() < self.retry_for => {
                    let wait = pace(delay, e.retry_after);
                    tracing::warn!(operation = e.operation, error = %crate::redact::scrub(&e.message), retry_in = ?wait, "cloud call failed; retrying");
                    tokio::time::sleep(wait).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                    // The decision is older now: what came since may call it off.
                    if let Some(why) = recheck().await {
                        return Err(Stopped::CalledOff(why));
                    }
                }
                Err(e) => {
                    if e.kind == ErrorKind::AccessDenied
                        && !self.denied_reported.swap(true, Ordering::SeqCst)
                    {
                        tracing::error!(operation = e.operation, error = %crate::redact::scrub(&e.message), "{}", api.grant_hint());
                    }
                    return Err(Stopped::Cloud(e));
                }
            }
        }
    }
}

/// Says, before a cloud call is retried, whether the action has been called off since it was
/// decided, and why.
pub type Recheck<'a> =
    &'a (dyn Fn() -> Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>> + Send + Sync);

/// Why an action's cloud calls ended before they all succeeded.
enum Stopped {
    /// A call failed for good, or its retries ran out.
    Cloud(CloudError),
    /// A hold or a spot interruption came while a call was being retried.
    CalledOff(String),
}

/// The wait before a retry: the cloud's `Retry-After` where it gave one (from half a second to
/// a minute: a zero never makes a loop spin), else the backoff's `delay`.
fn pace(delay: Duration, retry_after: Option<Duration>) -> Duration {
    retry_after.map_or(delay, |r| {
        r.clamp(Duration::from_millis(500), Duration::from_secs(60))
    })
}

fn called_off(why: String) -> Outcome {
    Outcome::Refused(format!("called off while cloud calls were retried: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cloud_s_retry_after_sets_the_pace_within_a_minute() {
        let backoff = Duration::from_millis(500);
        assert_eq!(pace(backoff, None), backoff);
        assert_eq!(
            pace(backoff, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(pace(backoff, Some(Duration::ZERO)), backoff);
        assert_eq!(
            pace(backoff, Some(Duration::from_secs(3600))),
            Duration::from_secs(60)
        );
    }
}
