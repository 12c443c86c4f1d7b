//! The notice and tag poller: reads interruption notices, other notices (a rebalance
//! recommendation, a scheduled reboot) and the `gpuwatch:hold` tag from instance metadata (or
//! the cloud's API), and hands them to the decision loop through `NodeSignals`; and what of them
//! calls off an action still being carried out. It knows no cloud: `crate::cloud` reads them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::{NodeLabel, SharedWatchView};
use super::NodeSignals;
use crate::actions::Executor;
use crate::cloud::{ControlPlane, InstanceMetadata, MetadataError, NoticeKind};
use crate::config::{TagLabel, MAX_LABEL_VALUE};
use crate::state::{AuditRecord, HoldStatus};

/// How long the last tags read count while reads fail: three intervals of the slower of the
/// two sources (metadata every `every`, the API every `tag_every`). After that, a
/// `gpuwatch:hold` tag placed since may be there, and the tag hold is unknown again.
fn tags_stale_after(every: Duration, tag_every: Duration) -> Duration {
    every.max(tag_every) * 3
}

/// The notice and tag poller: instance metadata notices, and `gpuwatch:hold` tags.
pub struct CloudPoller {
    pub cloud: Arc<dyn InstanceMetadata>,
    pub api: Option<Arc<dyn ControlPlane>>,
    pub signals: Arc<NodeSignals>,
    pub executor: Arc<Executor>,
    pub metrics: Arc<SharedWatchView>,
    pub hook: Vec<String>,
    pub hook_timeout: Duration,
    /// Instance tags copied onto `gpuwatch_node_info`.
    pub tag_labels: Vec<TagLabel>,
    /// Where the notices whose hook ran are kept across restarts.
    pub state_dir: crate::state::StateDir,
    /// How often instance metadata is read.
    pub every: Duration,
    /// How often the API reads tags, when metadata carries none.
    pub tag_every: Duration,
}

/// What the poller remembers from one read to the next.
#[derive(Default)]
struct Seen {
    /// The interruptions the hook ran for, kept in the state directory: it runs once per
    /// notice, not once per process.
    hooks_ran: Vec<String>,
    /// The advice notices in force, by key: each is said once.
    advice: BTreeSet<String>,
    /// When the rebalance recommendation in force was issued.
    rebalance: Option<f64>,
    /// When the API last read the tags.
    api_read: Option<Instant>,
    /// When the tags were last read, and whether the hold went unknown since for want of a read.
    good_tags: Option<Instant>,
    stale: bool,
    /// When interruption notices were last read, and why the last read failed.
    good_notices: Option<Instant>,
    notices_failing: Option<String>,
    failures: Failures,
}

pub async fn poll_cloud(p: CloudPoller) {
    let mut ticker = tokio::time::interval(p.every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let dir = p.state_dir.clone();
    let mut seen = Seen {
        hooks_ran: crate::state::on_io_thread(move || dir.hooks_ran()).await,
        ..Seen::default()
    };
    loop {
        ticker.tick().await;
        p.interruption(&mut seen).await;
        p.advice(&mut seen).await;
        p.tags(&mut seen).await;
    }
}

impl CloudPoller {
    async fn interruption(&self, seen: &mut Seen) {
        let read = self.cloud.interruption().await;
        match &read {
            Ok(_) => {
                seen.good_notices = Some(Instant::now());
                seen.notices_failing = None;
            }
            Err(e) => seen.notices_failing = Some(e.to_string()),
        }
        match read {
            Ok(Some(notice)) => {
                let was = self
                    .signals
                    .interruption
                    .lock()
                    .map(|mut i| i.replace(notice.time))
                    .unwrap_or(None);
                if was != Some(notice.time) {
                    tracing::warn!(
                        notice = %notice.text,
                        "interruption notice: gpuwatch takes no action of its own"
                    );
                    let _ = self.executor.audit(AuditRecord::SpotInterruption {
                        notice: notice.text.clone(),
                    });
                    self.executor.notify(
                        &format!("gpuwatch: interruption notice ({})", notice.text),
                        true,
                    );
                }
                if !seen.hooks_ran.contains(&notice.key) && !self.hook.is_empty() {
                    seen.hooks_ran.push(notice.key);
                    let excess = seen
                        .hooks_ran
                        .len()
                        .saturating_sub(crate::state::MAX_HOOKS_KEPT);
                    seen.hooks_ran.drain(..excess);
                    Box::pin(run_hook(&self.hook, self.hook_timeout, &self.executor)).await;
                    self.remember_hooks(&seen.hooks_ran).await;
                }
            }
            Ok(None) => {
                if let Ok(mut i) = self.signals.interruption.lock() {
                    *i = None;
                }
            }
            Err(e) => seen
                .failures
                .report("interruption notice", &e, &self.metrics),
        }
    }

    /// Keeps the notices whose hook ran in the state directory, so that a restart during the
    /// notice does not run it again.
    async fn remember_hooks(&self, keys: &[String]) {
        let (dir, keys) = (self.state_dir.clone(), keys.to_vec());
        if let Err(e) = crate::state::on_io_thread(move || dir.set_hooks_ran(&keys)).await {
            tracing::warn!(error = %e, "cannot record that the interruption hook ran: a restart during this notice runs it again");
        }
    }

    /// Notices that are advice, not interruptions: each is logged, audited and exported, and
    /// blocks nothing. A cloud may leave an at-risk notice in place for the instance's whole
    /// life.
    async fn advice(&self, seen: &mut Seen) {
        let notices = match self.cloud.advice().await {
            Ok(n) => n,
            Err(e) => {
                seen.failures.report("notices", &e, &self.metrics);
                return;
            }
        };
        let rebalance = notices
            .iter()
            .find(|n| n.kind == NoticeKind::AtRisk)
            .map(|n| n.time);
        for n in &notices {
            if seen.advice.contains(&n.key) {
                continue;
            }
            match &n.kind {
                NoticeKind::AtRisk => {
                    tracing::info!(
                        at = %crate::time::rfc3339(n.time),
                        notice = %n.text,
                        "the cloud says the instance is at elevated risk of interruption; actions are not blocked"
                    );
                    let _ = self.executor.audit(AuditRecord::SpotRebalance);
                }
                NoticeKind::Event(kind) => {
                    tracing::info!(event = %kind, notice = %n.text, "scheduled event: actions are not blocked");
                    let _ = self.executor.audit(AuditRecord::ScheduledEvent {
                        event_type: kind.clone(),
                        notice: n.text.clone(),
                    });
                }
                NoticeKind::Interruption => {}
            }
        }
        seen.advice = notices.iter().map(|n| n.key.clone()).collect();
        if rebalance != seen.rebalance {
            seen.rebalance = rebalance;
            self.metrics.update(|v| v.rebalance = rebalance);
        }
    }

    /// Instance metadata tags cost nothing to read; an API read is counted against the
    /// account's rate limit, so it is made only every `tag_every`.
    async fn tags(&self, seen: &mut Seen) {
        let tags = match self.cloud.tags().await {
            Ok(t) if !t.is_empty() => Some(t),
            Err(e) => {
                seen.failures.report("instance tags", &e, &self.metrics);
                None
            }
            _ => match &self.api {
                Some(api) if seen.api_read.is_none_or(|t| t.elapsed() >= self.tag_every) => {
                    match api.tags() {
                        Some(read) => {
                            seen.api_read = Some(Instant::now());
                            match read.await {
                                Ok(t) => Some(t),
                                Err(e) => {
                                    tracing::warn!(error = %e, "cannot read instance tags");
                                    None
                                }
                            }
                        }
                        // Metadata is this cloud's only source of tags, and it has none.
                        None => Some(Vec::new()),
                    }
                }
                _ => None,
            },
        };
        let Some(tags) = tags else {
            self.tags_unread(seen);
            return;
        };
        seen.good_tags = Some(Instant::now());
        if std::mem::take(&mut seen.stale) {
            tracing::info!("the instance's tags are read again");
        }
        if !self.tag_labels.is_empty() {
            let values = tag_label_values(&self.tag_labels, &tags);
            self.metrics.update(|v| v.tag_labels = values);
        }
        // Some clouds take tag names without regard to case: so does the hold, on every cloud.
        let hold = match tags
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("gpuwatch:hold"))
        {
            None => HoldStatus::None,
            Some((_, v)) => match crate::time::parse_rfc3339(v) {
                Some(t) => HoldStatus::Until(t, "instance tag gpuwatch:hold".into()),
                None => HoldStatus::Unreadable(format!(
                    "instance tag gpuwatch:hold = \"{v}\" is not RFC 3339"
                )),
            },
        };
        if let Ok(mut h) = self.signals.tag_hold.lock() {
            *h = self.unless_notices_unknown(hold, seen);
        }
    }

    /// Interruption notices that have not been read (at all, or for three poll intervals) may
    /// hold one: then a node without a hold holds, as for tags unread.
    fn unless_notices_unknown(&self, hold: HoldStatus, seen: &Seen) -> HoldStatus {
        let stale_after = self.every * 3;
        let known = seen.good_notices.is_some_and(|t| t.elapsed() < stale_after);
        if known || hold != HoldStatus::None {
            return hold;
        }
        HoldStatus::Unknown(format!(
            "interruption notices have not been read{} ({}), and one may have been announced",
            if seen.good_notices.is_some() {
                format!(" for {}", humantime::format_duration(stale_after))
            } else {
                String::new()
            },
            seen.notices_failing.as_deref().unwrap_or("no answer yet")
        ))
    }

    /// A failed read leaves the last tags in force only for a while: a hold placed since must
    /// not go unseen for as long as the reads fail (metadata down, the API's tag read denied or
    /// throttled while its actions still work).
    fn tags_unread(&self, seen: &mut Seen) {
        // A cloud whose tags come from metadata alone reads them every `every`.
        let api_tags = self.api.as_ref().is_some_and(|a| a.tags().is_some());
        let stale_after = tags_stale_after(
            self.every,
            if api_tags { self.tag_every } else { self.every },
        );
        if !seen.stale && seen.good_tags.is_some_and(|t| t.elapsed() >= stale_after) {
            seen.stale = true;
            let why = format!(
                "the instance's tags have not been read for {} ({}), and may hold a gpuwatch:hold tag placed since",
                humantime::format_duration(stale_after),
                self.cloud.tag_sources(),
            );
            tracing::warn!("{why}: every action is held until they are read");
            if let Ok(mut h) = self.signals.tag_hold.lock() {
                *h = HoldStatus::Unknown(why);
            }
        } else if let Ok(mut h) = self.signals.tag_hold.lock() {
            let kept = std::mem::replace(&mut *h, HoldStatus::None);
            *h = self.unless_notices_unknown(kept, seen);
        }
    }
}

/// The values of the configured tags, as `gpuwatch_node_info` labels: a tag the instance does
/// not have is left out, and a value is cut to `MAX_LABEL_VALUE` characters (it is escaped when
/// encoded).
fn tag_label_values(wanted: &[TagLabel], tags: &[(String, String)]) -> Vec<NodeLabel> {
    wanted
        .iter()
        .filter_map(|w| {
            let (_, value) = tags.iter().find(|(k, _)| *k == w.tag)?;
            Some(NodeLabel {
                name: w.label.clone(),
                value: value.chars().take(MAX_LABEL_VALUE).collect(),
            })
        })
        .collect()
}

/// Failed instance metadata reads: each is counted, and logged at WARN once a minute at most
/// (spot notices and tag holds go unseen while they fail).
#[derive(Default)]
struct Failures(crate::time::Throttle);

impl Failures {
    fn report(&mut self, what: &str, e: &MetadataError, metrics: &SharedWatchView) {
        metrics.update(|v| v.imds_errors += 1);
        if let Some(suppressed) = self.0.due(Duration::from_secs(60)) {
            tracing::warn!(error = %e, suppressed, "cannot read the {what} from instance metadata");
        }
    }
}

async fn run_hook(hook: &[String], timeout: Duration, executor: &Executor) {
    let result = match crate::exec::run(hook, &[], &crate::cloud::credentials(), timeout).await {
        Ok(s) if s.success() => "done".to_string(),
        Ok(s) => format!("exited with {s}"),
        Err(e) => e.to_string(),
    };
    tracing::warn!(hook = ?hook, result = %result, "pre-interruption hook");
    let _ = executor.audit(AuditRecord::InterruptionHook {
        command: hook.to_vec(),
        result,
    });
}

impl super::Watch {
    /// What calls off an action whose cloud calls are still being retried: an interruption
    /// announced, or a hold (local or tag) placed since it was decided.
    pub(super) async fn called_off(&self) -> Option<String> {
        if self.signals.interruption().is_some() {
            return Some("an interruption was announced".into());
        }
        let dir = self.state_dir.clone();
        let local = crate::state::on_io_thread(move || dir.hold()).await;
        let tag = self.signals.tag_hold();
        let hold = crate::state::holds_in_force(crate::time::now(), &local, &tag)
            .into_iter()
            .next()?;
        Some(format!(
            "a {} hold was placed ({})",
            hold.source, hold.reason
        ))
    }
}
