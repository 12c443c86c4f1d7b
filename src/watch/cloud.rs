//! The spot and tag poller: reads spot interruption notices, rebalance recommendations and the
//! `gpuwatch:hold` tag from instance metadata (or EC2), and hands them to the decision loop
//! through `NodeSignals`; and what of them calls off an action still being carried out.

use std::sync::Arc;
use std::time::Duration;

use super::metrics::{NodeLabel, SharedWatchView};
use super::NodeSignals;
use crate::actions::Executor;
use crate::config::{TagLabel, MAX_LABEL_VALUE};
use crate::state::{AuditRecord, HoldStatus};

/// Why the tag hold is unknown before the instance's tags were first read (from instance
/// metadata, or with DescribeInstances): a hold tag may be there, and unknown holds.
pub const TAGS_UNREAD: &str = "the instance's tags have not been read yet (instance metadata tags, or ec2:DescribeInstances), and may hold a gpuwatch:hold tag";

/// How long the last tags read count while reads fail: three intervals of the slower of the
/// two sources (metadata every `every`, DescribeInstances every `tag_every`). After that, a
/// `gpuwatch:hold` tag placed since may be there, and the tag hold is unknown again.
fn tags_stale_after(every: Duration, tag_every: Duration) -> Duration {
    every.max(tag_every) * 3
}

/// The spot and tag poller: instance metadata notices, and `gpuwatch:hold` tags.
pub struct CloudPoller {
    pub imds: Arc<crate::cloud::imds::Imds>,
    pub ec2: Option<crate::cloud::ec2::Ec2>,
    pub signals: Arc<NodeSignals>,
    pub executor: Arc<Executor>,
    pub metrics: Arc<SharedWatchView>,
    pub hook: Vec<String>,
    pub hook_timeout: Duration,
    /// Instance tags copied onto `gpuwatch_node_info`.
    pub tag_labels: Vec<TagLabel>,
    /// How often instance metadata is read.
    pub every: Duration,
    /// How often DescribeInstances reads tags, when metadata tags are off.
    pub tag_every: Duration,
}

pub async fn poll_cloud(p: CloudPoller) {
    let CloudPoller {
        imds,
        ec2,
        signals,
        executor,
        metrics,
        hook,
        hook_timeout,
        tag_labels,
        every,
        tag_every,
    } = p;
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // The notice the hook last ran for: it runs once per notice, not once per process.
    let mut hook_ran_for: Option<f64> = None;
    let mut rebalance_seen: Option<f64> = None;
    let mut last_tag_read: Option<std::time::Instant> = None;
    // When the tags were last read, and whether the hold went unknown since for want of a read.
    let mut last_good_tags: Option<std::time::Instant> = None;
    let mut stale = false;
    let stale_after = tags_stale_after(every, tag_every);
    let mut failures = Failures::default();
    loop {
        ticker.tick().await;
        match imds.interruption().await {
            Ok(Some(notice)) => {
                let crate::cloud::imds::Notice::Interruption { time, .. } = notice else {
                    continue;
                };
                let was = signals
                    .interruption
                    .lock()
                    .map(|mut i| i.replace(time))
                    .unwrap_or(None);
                if was != Some(time) {
                    tracing::warn!(
                        ?notice,
                        "spot interruption notice: gpuwatch takes no action of its own"
                    );
                    let _ = executor.audit(AuditRecord::SpotInterruption {
                        notice: format!("{notice:?}"),
                    });
                    executor.notify(
                        &format!("gpuwatch: spot interruption notice ({notice:?})"),
                        true,
                    );
                }
                if hook_ran_for != Some(time) && !hook.is_empty() {
                    hook_ran_for = Some(time);
                    Box::pin(run_hook(&hook, hook_timeout, &executor)).await;
                }
            }
            Ok(None) => {
                if let Ok(mut i) = signals.interruption.lock() {
                    *i = None;
                }
            }
            Err(e) => failures.report("spot interruption notice", &e, &metrics),
        }
        // A rebalance recommendation is advice, not a notice: it is logged and exported, and
        // blocks nothing. AWS may leave it in place for the instance's whole life.
        match imds.rebalance().await {
            Ok(Some(crate::cloud::imds::Notice::Rebalance { time })) => {
                if rebalance_seen != Some(time) {
                    rebalance_seen = Some(time);
                    tracing::info!(
                        at = %crate::time::rfc3339(time),
                        "spot rebalance recommendation: the instance is at elevated risk of interruption; actions are not blocked"
                    );
                    let _ = executor.audit(AuditRecord::SpotRebalance);
                    metrics.update(|v| v.rebalance = Some(time));
                }
            }
            Ok(_) => {
                if rebalance_seen.take().is_some() {
                    metrics.update(|v| v.rebalance = None);
                }
            }
            Err(e) => failures.report("rebalance recommendation", &e, &metrics),
        }
        // Instance metadata tags cost nothing to read; DescribeInstances is an API call counted
        // against the account's rate limit, so it is made only every `tag_every`.
        let tags = match imds.tags().await {
            Ok(t) if !t.is_empty() => Some(t.into_iter().collect::<Vec<_>>()),
            Err(e) => {
                failures.report("instance tags", &e, &metrics);
                None
            }
            _ => match &ec2 {
                Some(ec2) if last_tag_read.is_none_or(|t| t.elapsed() >= tag_every) => {
                    last_tag_read = Some(std::time::Instant::now());
                    // Boxed, as is the hook: an AWS call is a large future, and this loop polls
                    // the metadata service every few seconds with whatever it holds inline on
                    // the worker's stack.
                    match Box::pin(ec2.tags()).await {
                        Ok(t) => Some(t),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read instance tags");
                            None
                        }
                    }
                }
                _ => None,
            },
        };
        let Some(tags) = tags else {
            // A failed read leaves the last tags in force only for a while: a hold placed since
            // must not go unseen for as long as the reads fail (IMDS down, DescribeInstances
            // denied or throttled while StopInstances still works).
            if !stale && last_good_tags.is_some_and(|t| t.elapsed() >= stale_after) {
                stale = true;
                let why = format!(
                    "the instance's tags have not been read for {} (instance metadata tags, or ec2:DescribeInstances), and may hold a gpuwatch:hold tag placed since",
                    humantime::format_duration(stale_after)
                );
                tracing::warn!("{why}: every action is held until they are read");
                if let Ok(mut h) = signals.tag_hold.lock() {
                    *h = HoldStatus::Unknown(why);
                }
            }
            continue;
        };
        last_good_tags = Some(std::time::Instant::now());
        if std::mem::take(&mut stale) {
            tracing::info!("the instance's tags are read again");
        }
        if !tag_labels.is_empty() {
            let values = tag_label_values(&tag_labels, &tags);
            metrics.update(|v| v.tag_labels = values);
        }
        let hold = match tags.iter().find(|(k, _)| k == "gpuwatch:hold") {
            None => HoldStatus::None,
            Some((_, v)) => match crate::time::parse_rfc3339(v) {
                Some(t) => HoldStatus::Until(t, "instance tag gpuwatch:hold".into()),
                None => HoldStatus::Unreadable(format!(
                    "instance tag gpuwatch:hold = \"{v}\" is not RFC 3339"
                )),
            },
        };
        if let Ok(mut h) = signals.tag_hold.lock() {
            *h = hold;
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
    fn report(&mut self, what: &str, e: &crate::cloud::imds::ImdsError, metrics: &SharedWatchView) {
        metrics.update(|v| v.imds_errors += 1);
        if let Some(suppressed) = self.0.due(Duration::from_secs(60)) {
            tracing::warn!(error = %e, suppressed, "cannot read the {what} from instance metadata");
        }
    }
}

async fn run_hook(hook: &[String], timeout: Duration, executor: &Executor) {
    let result = match crate::exec::run(hook, &[], timeout).await {
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
    /// What calls off an action whose EC2 calls are still being retried: a spot interruption
    /// announced, or a hold (local or tag) placed since it was decided.
    pub(super) async fn called_off(&self) -> Option<String> {
        if self.signals.interruption().is_some() {
            return Some("a spot interruption was announced".into());
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
