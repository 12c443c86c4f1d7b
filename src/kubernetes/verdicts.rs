//! Verdicts of idleness for the cluster controller. A pod-scoped rule with `action = "reclaim"`
//! that acts for a pod (after its warning and re-check, as any rule) does not touch the
//! cluster: it gives a verdict, which this node serves on `/metrics` as
//! `gpuwatch_pod_reclaim_verdict` while every device the pod holds stays idle by the rule. The
//! controller reads the verdicts from the fleet's Prometheus and decides what to give back.
//! A busy or unknown device, an incomplete sample or the pod gone withdraws the verdict at
//! once (`gpuwatch_core::step::verdict_stands`); a new one takes a whole window, warning and
//! re-check again.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::encode::*;
use crate::metrics::Text;

/// One pod judged idle by one rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The configured rule's name.
    pub rule: String,
    pub namespace: String,
    pub pod: String,
    /// The devices the pod holds, as the rule judged them (`0`, `0:1` for a GPU instance).
    pub gpus: Vec<String>,
    /// Unix seconds the verdict was given.
    pub since: f64,
    /// The node daemon's mode: a controller that enforces acts only on verdicts of nodes that
    /// enforce too, so that a node in dry-run is a rehearsal end to end.
    pub mode: &'static str,
}

/// The verdicts standing now, by the expanded rule's name (`rule namespace/pod`).
#[derive(Default)]
pub struct Verdicts {
    standing: Mutex<BTreeMap<String, Verdict>>,
    /// The node's name (`NODE_NAME`, the DaemonSet sets it), which the controller matches with
    /// each pod's `spec.nodeName`.
    node: std::sync::OnceLock<String>,
    /// Verdicts given and withdrawn since the daemon started.
    counts: Mutex<(u64, u64)>,
}

impl fmt::Debug for Verdicts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdicts").finish_non_exhaustive()
    }
}

/// The most verdicts one node serves: far beyond the pods one node's GPUs can hold, and a
/// bound on the series a broken kubelet answer could make.
pub const MAX_VERDICTS: usize = 1024;

impl Verdicts {
    /// Names the node the verdicts are of (once).
    pub fn set_node(&self, node: String) {
        let _ = self.node.set(node);
    }

    /// Withdraws every verdict (a hold of the node, an activity veto), saying why once.
    pub fn withdraw_all(&self, why: &str) {
        let mut standing = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        if standing.is_empty() {
            return;
        }
        let n = standing.len() as u64;
        standing.clear();
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).1 += n;
        tracing::info!(verdicts = n, "{why}: every reclaim verdict is withdrawn");
    }

    /// Gives the verdict of the expanded rule `key` (or keeps the one standing, with its
    /// time). Returns false when the node already serves `MAX_VERDICTS` others.
    pub fn give(&self, key: &str, verdict: Verdict) -> bool {
        let mut standing = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        if !standing.contains_key(key) && standing.len() >= MAX_VERDICTS {
            return false;
        }
        match standing.get_mut(key) {
            // The rule acted again while its verdict stood: the same idle spell, given when it
            // began (the controller warns afresh only for a new one).
            Some(v) => v.gpus = verdict.gpus,
            None => {
                standing.insert(key.to_string(), verdict);
                self.counts.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
            }
        }
        true
    }

    /// Keeps the verdicts for which `stands(key, verdict)` holds, and says each one withdrawn.
    pub fn keep(&self, stands: impl Fn(&str, &Verdict) -> bool) {
        let mut standing = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        let before = standing.len();
        standing.retain(|key, v| {
            let keep = stands(key, v);
            if !keep {
                tracing::info!(
                    rule = %v.rule,
                    pod = %format!("{}/{}", v.namespace, v.pod),
                    "the pod's GPUs are no longer idle (or cannot be told): its reclaim verdict is withdrawn"
                );
            }
            keep
        });
        let withdrawn = (before - standing.len()) as u64;
        if withdrawn > 0 {
            self.counts.lock().unwrap_or_else(|e| e.into_inner()).1 += withdrawn;
        }
    }

    /// The verdicts standing now.
    pub fn standing(&self) -> Vec<Verdict> {
        let standing = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        standing.values().cloned().collect()
    }
}

/// `gpuwatch_pod_reclaim_verdict` and the counts of verdicts given and withdrawn.
pub struct VerdictCollector(pub Arc<Verdicts>);

impl fmt::Debug for VerdictCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerdictCollector").finish()
    }
}

impl Collector for VerdictCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let standing = self.0.standing();
        let (given, withdrawn) = *self.0.counts.lock().unwrap_or_else(|e| e.into_inner());
        let node = self.0.node.get().map_or("", String::as_str);
        let e = &mut enc;
        let gpus: Vec<String> = standing.iter().map(|v| v.gpus.join(",")).collect();
        gauges(
            e,
            desc(
                "gpuwatch_pod_reclaim_verdict",
                "1 while a reclaim rule judges every GPU of the pod idle, on this node; the cluster controller reads it (absent is busy)",
                None,
            ),
            standing.iter().zip(&gpus).map(|(v, gpus)| {
                (
                    [
                        ("namespace", Text(&v.namespace)),
                        ("pod", Text(&v.pod)),
                        ("rule", Text(&v.rule)),
                        ("gpus", Text(gpus)),
                        ("node", Text(node)),
                        ("mode", Text(v.mode)),
                    ],
                    1i64,
                )
            }),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_pod_reclaim_verdict_since",
                "When each standing reclaim verdict was given",
                Some("seconds"),
            ),
            standing.iter().map(|v| {
                (
                    [
                        ("namespace", Text(&v.namespace)),
                        ("pod", Text(&v.pod)),
                        ("rule", Text(&v.rule)),
                    ],
                    v.since,
                )
            }),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_pod_reclaim_verdicts",
                "Reclaim verdicts given and withdrawn since the daemon started",
                None,
            ),
            [
                ([("event", "given")], given),
                ([("event", "withdrawn")], withdrawn),
            ],
        )
    }
}
