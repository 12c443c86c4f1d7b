//! What the decision loop does with each event of a step, as the daemon's edge of the safety
//! order (`edge.rs`, `order::drive`): log it, put it on record, notify, and carry out actions
//! through the executor. None of it settles the state: `order::drive` does, from the answers.

use super::ActionResult;
use crate::actions::Outcome;
use crate::rules::engine::Event;
use crate::rules::{Rule, Scope};
use crate::state::AuditRecord;
use gpuwatch_core::step::order::{self, Executed};

impl super::Watch {
    /// Logs and counts an action whose in-flight mark or audit record could not be made
    /// durable: it did not run, and the core withdrew it, so that it is tried again once the
    /// disk recovers (and the rule still breaches).
    pub(super) fn not_recorded(&self, rule: &str, action: crate::rules::Action, what: &str) {
        tracing::error!(
            rule = %rule, action = %action,
            "{}", order::not_recorded(action, what)
        );
        self.count(action, "not_recorded");
    }

    /// Logs and records an action that `order::defer` kept from running, for `why`: the core
    /// takes it back, durably, and the next step decides it on fresh data.
    pub(super) async fn deferred(
        &self,
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
    }

    /// What the audit record of `event` holds as its evidence; a job's rule names the job's
    /// user there, where the holders knew it, for the record and the command.
    fn evidence(&self, rule: &Rule, event: &Event) -> serde_json::Value {
        let mut evidence = match event {
            Event::Breach { evidence, .. }
            | Event::Warning { evidence, .. }
            | Event::Action { evidence, .. } => serde_json::to_value(evidence).unwrap_or_default(),
            _ => serde_json::Value::Null,
        };
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
        evidence
    }

    /// Logs, records and sends an event of the before-save phase of the step taken at `at`
    /// (a breach, a recovery, a warning, a postponement). Returns whether it is on record: a
    /// warning that is not is not sent either, and the core takes it back.
    pub(super) async fn record(&self, rules: &[Rule], event: &Event, at: f64) -> bool {
        let Some(rule) = rules.iter().find(|r| r.name == event.rule()) else {
            return true;
        };
        let evidence = self.evidence(rule, event);
        let rule_name = rule.name.clone();
        match event {
            Event::Breach { evidence: e, .. } => {
                tracing::info!(rule = %rule.name, periods = e.breaching_periods, "rule breaching");
                self.executor.audit(AuditRecord::Breach {
                    rule: rule_name,
                    at,
                    evidence,
                })
            }
            Event::Recovered { .. } => {
                tracing::info!(rule = %rule.name, "rule no longer breaching");
                self.executor.audit(AuditRecord::Recovered {
                    rule: rule_name,
                    at,
                })
            }
            Event::Warning { action, due_at, .. } => {
                self.warn(rule, *action, *due_at, evidence, at)
            }
            Event::Postponed { action, reason, .. } => {
                tracing::info!(
                    "rule \"{}\": {}",
                    rule.name,
                    crate::rules::engine::postponed(*action, reason)
                );
                self.executor.audit(AuditRecord::Postponed {
                    rule: rule_name,
                    at,
                    action: *action,
                    reason: reason.clone(),
                })
            }
            // After the save, not here.
            Event::Cancelled { .. } | Event::Action { .. } => true,
        }
    }

    /// Records a warning, then (only if it is on record) logs it and sends it to the webhook
    /// and the terminals, in words true to its rule's cause. Returns whether it is on record.
    fn warn(
        &self,
        rule: &Rule,
        action: crate::rules::Action,
        due_at: f64,
        evidence: serde_json::Value,
        at: f64,
    ) -> bool {
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
            crate::time::rfc3339(due_at),
            rule.name,
            self.executor.mode.as_str()
        );
        let recorded = self.executor.audit(AuditRecord::Warning {
            rule: rule.name.clone(),
            at,
            action,
            due_at: crate::time::rfc3339(due_at),
            unless,
            evidence,
        });
        if recorded {
            tracing::warn!("{text}");
            self.executor.notify(&text, true);
        }
        recorded
    }

    /// Logs, records and sends a cancellation (after the save, whether it worked or not).
    pub(super) async fn announce(&self, rules: &[Rule], event: &Event, at: f64) {
        let (Some(rule), Event::Cancelled { action, reason, .. }) =
            (rules.iter().find(|r| r.name == event.rule()), event)
        else {
            return;
        };
        let text = format!(
            "gpuwatch: rule \"{}\": {}",
            rule.name,
            crate::rules::engine::cancelled(*action, reason)
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

    /// Carries out an action of the step taken at `at`; the state already says "in flight"
    /// durably, so a restart from here on never repeats it. Returns whether its record was
    /// made (and so whether it ran).
    pub(super) async fn act(&self, rules: &[Rule], event: &Event, at: f64) -> Executed {
        let (Some(rule), Event::Action { action, .. }) =
            (rules.iter().find(|r| r.name == event.rule()), event)
        else {
            return Executed::Recorded;
        };
        let evidence = self.evidence(rule, event);
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
        if let Outcome::NotRecorded(_) = outcome {
            self.not_recorded(&rule.name, *action, "audit.jsonl");
            return Executed::NotRecorded;
        }
        self.count(*action, outcome.label());
        if let Outcome::Failed(_) = outcome {
            tracing::error!(rule = %rule.name, "the action failed; the rule re-arms on fresh data");
        }
        Executed::Recorded
    }

    /// The longest an action takes before its own limits end it: an `exec` its timeout, a cloud
    /// call its retries (and one last attempt), and on a cloud whose calls start operations,
    /// following the last one to its end.
    pub(super) fn action_limit(&self) -> std::time::Duration {
        let a = &self.config.actions;
        // Two operations may be followed (the stamp's and the action's, where a cloud answers
        // both with an operation), and the result read back for ten minutes more (a power
        // state that settles after the operation ends).
        let follow =
            if crate::cloud::provider(&self.config.cloud).is_some_and(|p| p.follows_operations) {
                crate::cloud::FOLLOW_FOR * 2 + std::time::Duration::from_secs(600)
            } else {
                std::time::Duration::ZERO
            };
        a.exec_timeout.max(a.retry_for + follow) + std::time::Duration::from_secs(60)
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
