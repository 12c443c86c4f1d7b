//! What the decision loop does with each event of a step: log it, put it on record, notify,
//! and carry out actions through the executor (or defer them, as `order::defer` says).

use super::ActionResult;
use crate::actions::Outcome;
use crate::rules::engine::Event;
use crate::rules::{Rule, Scope};
use crate::state::{AuditRecord, Persisted};
use gpuwatch_core::step::order::{on_deferred, on_executed, on_warned, Executed};

impl super::Watch {
    /// Logs and counts an action whose in-flight mark or audit record could not be made
    /// durable: it did not run, and the core withdrew it, so that it is tried again once the
    /// disk recovers (and the rule still breaches).
    pub(super) fn not_recorded(&self, rule: &str, action: crate::rules::Action, what: &str) {
        tracing::error!(
            rule = %rule, action = %action,
            "the {action} did not run: its record in {what} could not be made durable; it is retried when the disk recovers"
        );
        self.count(action, "not_recorded");
    }

    /// Takes back an action that `order::defer` kept from running, for `why`: it is pending
    /// again, durably, and the next step decides it on fresh data.
    pub(super) async fn defer_action(
        &self,
        persisted: &mut Persisted,
        rule: &str,
        action: crate::rules::Action,
        why: &str,
        at: f64,
    ) {
        let reason = format!("decided again on the next sample: {why}");
        tracing::info!(rule = %rule, action = %action, "action deferred: {reason}");
        let _ = self.executor.audit(AuditRecord::Postponed {
            rule: rule.to_string(),
            at,
            action,
            reason,
        });
        let save = on_deferred(persisted, rule);
        self.save(persisted, save.durable).await;
    }

    /// Logs, records and carries out one event of the step taken at `at` (the sample's time,
    /// recorded as `at` in Unix seconds).
    pub(super) async fn handle(
        &self,
        rules: &[Rule],
        persisted: &mut Persisted,
        event: Event,
        at: f64,
    ) {
        let rule_name = event.rule().to_string();
        let Some(rule) = rules.iter().find(|r| r.name == rule_name) else {
            return;
        };
        let mut evidence = match &event {
            Event::Breach { evidence, .. }
            | Event::Warning { evidence, .. }
            | Event::Action { evidence, .. } => serde_json::to_value(evidence).unwrap_or_default(),
            _ => serde_json::Value::Null,
        };
        // A job's rule names the job's user in its evidence, for the record and the command.
        if let (Scope::Job, Some(job), Some(h), Some(map)) = (
            rule.scope,
            &rule.subject,
            &self.holders,
            evidence.as_object_mut(),
        ) {
            if let Some(user) = h.view().jobs.get(job).and_then(|j| j.user.clone()) {
                map.insert("user".into(), user.into());
            }
        }
        match &event {
            Event::Breach { evidence: e, .. } => {
                tracing::info!(rule = %rule.name, periods = e.breaching_periods, "rule breaching");
                let _ = self.executor.audit(AuditRecord::Breach {
                    rule: rule.name.clone(),
                    at,
                    evidence,
                });
            }
            Event::Recovered { .. } => {
                tracing::info!(rule = %rule.name, "rule no longer breaching");
                let _ = self.executor.audit(AuditRecord::Recovered {
                    rule: rule.name.clone(),
                    at,
                });
            }
            Event::Warning { action, due_at, .. } => {
                // A job's or user's rule names whose GPUs, and holds only that one.
                let (will, hold) = match (rule.scope, &rule.subject) {
                    (Scope::Job | Scope::User, Some(who)) => (
                        format!("gpuwatch will {action} for it"),
                        format!("--{} {who} ", rule.scope.as_str()),
                    ),
                    _ => (format!("this instance will {action}"), String::new()),
                };
                let unless = rule.calls_off();
                let text = format!(
                    "gpuwatch: {}; {will} at {} (rule \"{}\", {}) unless {unless}. `gpuwatch hold 2h {hold}--reason ...` postpones it.",
                    rule.cause(),
                    crate::time::rfc3339(*due_at),
                    rule.name,
                    self.executor.mode.as_str()
                );
                let recorded = self.executor.audit(AuditRecord::Warning {
                    rule: rule.name.clone(),
                    at,
                    action: *action,
                    due_at: crate::time::rfc3339(*due_at),
                    unless,
                    evidence: evidence.clone(),
                });
                // A warning not on record is taken back, not sent: it comes again once the
                // audit log can be written, and no action follows an unrecorded one.
                on_warned(persisted, &rule.name, recorded);
                if recorded {
                    tracing::warn!("{text}");
                    self.executor.notify(&text, true);
                }
            }
            Event::Cancelled { action, reason, .. } => {
                let text = format!(
                    "gpuwatch: {action} cancelled (rule \"{}\"): {reason}",
                    rule.name
                );
                tracing::info!("{text}");
                let _ = self.executor.audit(AuditRecord::Cancelled {
                    rule: rule.name.clone(),
                    at,
                    action: *action,
                    reason: reason.clone(),
                });
                self.count(*action, "cancelled");
                self.executor.notify(&text, true);
            }
            Event::Postponed { action, reason, .. } => {
                tracing::info!(rule = %rule.name, action = %action, "action postponed: {reason}");
                let _ = self.executor.audit(AuditRecord::Postponed {
                    rule: rule.name.clone(),
                    at,
                    action: *action,
                    reason: reason.clone(),
                });
            }
            Event::Action { action, .. } => {
                // The state already says "in flight" durably: a restart from here on never
                // repeats the action.
                let outcome = {
                    let _acting = self
                        .progress
                        .acting(self.action_limit(), crate::watch::progress::ACTED_GRACE);
                    self.executor
                        .execute(rule, *action, &evidence, at, &|| {
                            Box::pin(self.called_off())
                        })
                        .await
                };
                let executed = if let Outcome::NotRecorded(_) = outcome {
                    self.not_recorded(&rule.name, *action, "audit.jsonl");
                    Executed::NotRecorded
                } else {
                    self.count(*action, outcome.label());
                    Executed::Recorded
                };
                let save = on_executed(persisted, &rule.name, executed);
                self.save(persisted, save.durable).await;
                if let Outcome::Failed(_) = outcome {
                    tracing::error!(rule = %rule.name, "the action failed; the rule re-arms on fresh data");
                }
            }
        }
    }

    /// The longest an action takes before its own limits end it: an `exec` its timeout, an EC2
    /// call its retries (and one last attempt).
    pub(super) fn action_limit(&self) -> std::time::Duration {
        let a = &self.config.actions;
        a.exec_timeout.max(a.retry_for) + std::time::Duration::from_secs(60)
    }

    /// Counts an action's result; it shows when the step publishes.
    pub(super) fn count(&self, action: crate::rules::Action, result: &str) {
        let key = ActionResult {
            action: action.to_string(),
            result: result.to_string(),
        };
        if let Ok(mut u) = self.unpublished.lock() {
            u.actions.push(key);
        }
    }
}
