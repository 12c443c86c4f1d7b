//! The daemon's subsystems' series: the cost watch, CloudWatch publishing, the state directory
//! and the HTTP listener, each read from its own counters or view at scrape time.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::encode::*;
use super::Text;
/// The cost watch's series, from its latest view.
#[derive(Debug)]
pub struct WatchCollector(pub std::sync::Arc<crate::watch::WatchMetrics>);

impl Collector for WatchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let v = self.0.view();
        let e = &mut enc;
        if let Some(n) = &v.node {
            gauges(
                e,
                desc(
                    "gpuwatch_node_info",
                    "The instance gpuwatch runs on; value 1",
                    None,
                ),
                [(
                    [
                        ("instance_id", Text(&n.instance_id)),
                        ("instance_type", Text(&n.instance_type)),
                        ("availability_zone", Text(&n.availability_zone)),
                        ("lifecycle", Text(n.lifecycle_label())),
                    ],
                    1i64,
                )],
            )?;
        }
        let d = &v.decision;
        if let Some(price) = d.price {
            gauges(
                e,
                desc(
                    "gpuwatch_instance_hourly_cost_dollars",
                    "The instance's price per hour, and where it came from",
                    None,
                ),
                [([("source", price.source.as_str())], price.usd_per_hour)],
            )?;
        }
        if let Some(s) = d.spent {
            gauge(
                e,
                desc(
                    "gpuwatch_spend_dollars",
                    "Spend in the current budget period",
                    None,
                ),
                s,
            )?;
        }
        if let Some(f) = d.forecast {
            gauge(
                e,
                desc(
                    "gpuwatch_spend_forecast_dollars",
                    "Spend at the end of the period at the current price",
                    None,
                ),
                f,
            )?;
        }
        gauges(
            e,
            desc("gpuwatch_budget_limit_dollars", "The budget's limit", None),
            d.budgets
                .iter()
                .map(|b| ([("budget", Text(&b.name))], b.limit)),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_budget_spent_ratio",
                "Spend as a share of the budget's limit",
                None,
            ),
            d.budgets
                .iter()
                .filter_map(|b| Some(([("budget", Text(&b.name))], b.spent_ratio?))),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_budget_forecast_ratio",
                "Forecast spend as a share of the budget's limit",
                None,
            ),
            d.budgets
                .iter()
                .filter_map(|b| Some(([("budget", Text(&b.name))], b.forecast_ratio?))),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_budget_alerts",
                "Budget threshold alerts sent",
                None,
            ),
            v.alerts.iter().map(|(k, n)| {
                (
                    [
                        ("budget", Text(&k.budget)),
                        ("threshold", Text(&k.threshold)),
                    ],
                    *n,
                )
            }),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_gpu_idle",
                "How long the GPU has been idle without a break",
                Some("seconds"),
            ),
            v.gpu_idle.iter().map(|g| {
                (
                    GpuLabels {
                        gpu: g.gpu,
                        uuid: &g.uuid,
                        extra: NO_LABELS,
                    },
                    g.seconds,
                )
            }),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_rule_breaching",
                "1 while the rule's condition holds",
                None,
            ),
            d.rules
                .iter()
                .map(|r| ([("rule", Text(&r.name))], i64::from(r.breaching))),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_action_pending",
                "1 while an action is in its warning period",
                None,
            ),
            d.rules.iter().filter_map(|r| {
                let p = r.pending.as_ref()?;
                Some((
                    [("rule", Text(&r.name)), ("action", Text(p.action.as_str()))],
                    1i64,
                ))
            }),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_action_due_timestamp",
                "When the pending action is due unless the GPUs come back",
                Some("seconds"),
            ),
            d.rules.iter().filter_map(|r| {
                let p = r.pending.as_ref()?;
                Some((
                    [("rule", Text(&r.name)), ("action", Text(p.action.as_str()))],
                    p.due_at,
                ))
            }),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_actions",
                "Actions by result: done, dry_run, failed, cancelled or refused",
                None,
            ),
            v.actions.iter().map(|(k, n)| {
                (
                    [("action", Text(&k.action)), ("result", Text(&k.result))],
                    *n,
                )
            }),
        )?;
        if let Some(h) = v.hold_until {
            gauge(
                e,
                desc(
                    "gpuwatch_hold_until_timestamp",
                    "When the current hold expires",
                    Some("seconds"),
                ),
                h,
            )?;
        }
        gauge(
            e,
            desc(
                "gpuwatch_spot_interruption_pending",
                "1 while a spot interruption notice is in effect; actions wait",
                None,
            ),
            i64::from(v.interruption.is_some()),
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_spot_rebalance_recommended",
                "1 while a spot rebalance recommendation is in effect; it blocks nothing",
                None,
            ),
            i64::from(v.rebalance.is_some()),
        )?;
        if v.node.is_some() {
            counters(
                e,
                desc(
                    "gpuwatch_imds_errors",
                    "Instance metadata reads that failed (spot notices and tag holds go unseen meanwhile)",
                    None,
                ),
                [(NO_LABELS, v.imds_errors)],
            )?;
        }
        if let Some(t) = v.interruption {
            gauge(
                e,
                desc(
                    "gpuwatch_spot_interruption_timestamp",
                    "When the announced spot interruption takes effect",
                    Some("seconds"),
                ),
                t,
            )?;
        }
        Ok(())
    }
}

/// The CloudWatch publisher's counters.
#[derive(Debug)]
pub struct CloudWatchCollector(pub std::sync::Arc<crate::cloudwatch::Counters>);

impl Collector for CloudWatchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.0;
        let e = &mut enc;
        counters(
            e,
            desc(
                "gpuwatch_cloudwatch_datums",
                "Datums accepted by PutMetricData",
                None,
            ),
            [(NO_LABELS, c.datums.load(Relaxed))],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_cloudwatch_errors",
                "PutMetricData calls that failed",
                None,
            ),
            [(NO_LABELS, c.errors.load(Relaxed))],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_cloudwatch_dropped_datums",
                "Datums dropped from a full queue during an outage",
                None,
            ),
            [(NO_LABELS, c.dropped.load(Relaxed))],
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_cloudwatch_queue_datums",
                "Datums waiting to be published",
                None,
            ),
            c.queued.load(Relaxed) as i64,
        )
    }
}

/// Failures of the state directory: saves, audit records and reads. Any of them means a
/// decision may not be durable, and mutating actions wait.
#[derive(Debug)]
pub struct StateCollector(pub std::sync::Arc<crate::state::AuditLog>);

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use crate::state::DiskOp;
        counters(
            &mut enc,
            desc(
                "gpuwatch_state_errors",
                "State directory operations that failed: save (state.json), audit (audit.jsonl) or load",
                None,
            ),
            DiskOp::ALL
                .iter()
                .map(|op| ([("op", op.as_str())], self.0.errors.get(*op))),
        )
    }
}

/// The HTTP listener's connection counts.
#[derive(Debug)]
pub struct HttpCollector(pub std::sync::Arc<crate::serve::Stats>);

impl Collector for HttpCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.0;
        let e = &mut enc;
        gauge(
            e,
            desc(
                "gpuwatch_http_connections_open",
                "HTTP connections open now",
                None,
            ),
            s.open.load(Relaxed) as i64,
        )?;
        counters(
            e,
            desc(
                "gpuwatch_http_connections",
                "HTTP connections accepted",
                None,
            ),
            [(NO_LABELS, s.accepted.load(Relaxed))],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_http_connections_closed_early",
                "Connections closed by the connection limit: evicted (the longest idle, to make room) or refused (every connection busy)",
                None,
            ),
            [
                ([("reason", "evicted")], s.evicted.load(Relaxed)),
                ([("reason", "refused")], s.refused.load(Relaxed)),
            ],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_http_tls_handshake_failures",
                "TLS handshakes that failed or timed out (no TLS, a bad or expired client certificate)",
                None,
            ),
            [(NO_LABELS, s.tls_failures.load(Relaxed))],
        )
    }
}
