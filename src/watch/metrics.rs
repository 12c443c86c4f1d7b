//! The watch's series: the node, each GPU's idle time, each rule's state and pending action,
//! actions by result, holds, and spot notices.

use std::collections::BTreeMap;
use std::fmt;

use gpuwatch_core::step::RuleView;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::encode::*;
use crate::metrics::{Shared, Text};

/// What the watch exports, swapped whole on each update and read by the collector.
#[derive(Debug, Clone, Default)]
pub struct WatchView {
    /// Each rule after the last decision step and its actions.
    pub rules: Vec<RuleView>,
    /// The idle time of every GPU that is up.
    pub gpu_idle: Vec<IdleGpu>,
    pub actions: BTreeMap<ActionResult, u64>,
    /// The holds in place: `gpuwatch hold` and the instance tag, with their reasons.
    pub holds: Vec<crate::state::Hold>,
    pub interruption: Option<f64>,
    /// When the current spot rebalance recommendation was issued.
    pub rebalance: Option<f64>,
    /// Instance metadata reads that failed.
    pub imds_errors: u64,
    /// `gpuwatch:action` stamps the cloud refused for its own limits (the actions went on).
    pub stamps_refused: u64,
    pub node: Option<crate::cloud::Node>,
    /// The cloud the node is on (its `[cloud] provider`), once metadata has named it.
    pub provider: Option<&'static str>,
    /// `[node] labels`.
    pub labels: Vec<NodeLabel>,
    /// `[cloud] tag_labels`, with the values the instance's tags have now.
    pub tag_labels: Vec<NodeLabel>,
}

/// One label of `gpuwatch_node_info` beyond the instance's own.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeLabel {
    pub name: String,
    pub value: String,
}

/// A GPU's idle time, or a MIG device's.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleGpu {
    pub gpu: u32,
    /// The GPU's UUID, or the MIG device's.
    pub uuid: String,
    pub mig: Option<crate::gpu::MigSample>,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ActionResult {
    pub action: String,
    pub result: String,
}

/// Shared between the loops that write it and the collector that reads it.
pub type SharedWatchView = Shared<WatchView>;

/// The cost watch's series, from its latest view.
#[derive(Debug)]
pub struct WatchCollector(pub std::sync::Arc<SharedWatchView>);

impl Collector for WatchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let v = self.0.view();
        let e = &mut enc;
        encode_node(e, &v)?;
        encode_rules(e, &v)?;
        encode_holds_and_notices(e, &v)
    }
}

/// The node, with its labels: those of the config and the instance tags copied, so that other
/// series can be summed by team with one join. Present on a cloud, and anywhere the config
/// names labels.
fn encode_node(e: &mut DescriptorEncoder, v: &WatchView) -> Result<(), fmt::Error> {
    let mut labels: Vec<(&str, Text)> = Vec::new();
    if let Some(n) = &v.node {
        labels.extend([
            ("provider", Text(v.provider.unwrap_or("unknown"))),
            ("instance_id", Text(&n.instance_id)),
            ("instance_type", Text(&n.instance_type)),
            ("availability_zone", Text(&n.availability_zone)),
            ("lifecycle", Text(n.lifecycle_label())),
        ]);
    }
    labels.extend(
        v.labels
            .iter()
            .chain(&v.tag_labels)
            .map(|l| (l.name.as_str(), Text(&l.value))),
    );
    if v.node.is_some() || !labels.is_empty() {
        gauges(
            e,
            desc(
                "gpuwatch_node_info",
                "The instance gpuwatch runs on and its labels; value 1",
                None,
            ),
            [(labels, 1i64)],
        )?;
    }
    Ok(())
}

/// Idle time, the rules, their pending actions and the actions' results.
fn encode_rules(e: &mut DescriptorEncoder, v: &WatchView) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpuwatch_gpu_idle",
            "How long the GPU (or MIG device) has been idle without a break",
            Some("seconds"),
        ),
        v.gpu_idle.iter().map(|g| {
            (
                GpuLabels {
                    gpu: g.gpu,
                    uuid: &g.uuid,
                    pod: None,
                    hpc_job: None,
                    extra: crate::exposition::MigLabels(g.mig.as_ref()),
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
        v.rules
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
        v.rules.iter().filter_map(|r| {
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
        v.rules.iter().filter_map(|r| {
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
    Ok(())
}

/// Holds, interruption notices and rebalance recommendations, and metadata's failures.
fn encode_holds_and_notices(e: &mut DescriptorEncoder, v: &WatchView) -> Result<(), fmt::Error> {
    if !v.holds.is_empty() {
        gauges(
            e,
            desc(
                "gpuwatch_hold_until_timestamp",
                "When each hold in place expires, by source (local or tag); +Inf for one whose expiry cannot be read, which holds until it is mended",
                Some("seconds"),
            ),
            v.holds.iter().map(|h| {
                let reason = match (h.until, h.source.as_str()) {
                    (Some(_), _) => "expires",
                    (None, "tag") if h.unknown => "unread tag",
                    (None, "tag") => "unparsable tag",
                    (None, _) => "unreadable file",
                };
                (
                    [("source", Text(&h.source)), ("reason", Text(reason))],
                    h.until.unwrap_or(f64::INFINITY),
                )
            }),
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
        counters(
            e,
            desc(
                "gpuwatch_cloud_stamps_refused",
                "gpuwatch:action stamps the cloud refused for its own limits (a VM with all the tags or labels it may have); the actions went on without them",
                None,
            ),
            [(NO_LABELS, v.stamps_refused)],
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
