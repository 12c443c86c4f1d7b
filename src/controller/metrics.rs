//! The controller's own series, on its `/metrics`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::encode::*;
use crate::metrics::Text;

#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// By workload kind and result: done, dry_run, failed, conflict.
    pub actions: BTreeMap<(&'static str, &'static str), u64>,
    /// Warnings given, by kind.
    pub warnings: BTreeMap<&'static str, u64>,
    /// Workloads with an idle pod, at the last round.
    pub watched: u64,
    /// Workloads warned and waiting, at the last round.
    pub pending: u64,
    /// Fresh and stale verdicts at the last read.
    pub fresh: u64,
    pub stale: u64,
    /// Reads of the verdicts, by result.
    pub reads: BTreeMap<&'static str, u64>,
    /// Errors by what failed: prometheus, kubernetes, lease, events.
    pub errors: BTreeMap<&'static str, u64>,
    pub leader: bool,
    /// Pods of the informer's cache.
    pub pods: u64,
    /// Owners the controller never gives back whose pods are idle now, by namespace and
    /// `Kind/name`, with what their idle GPUs cost an hour where known.
    pub unmanaged: BTreeMap<(String, String), Option<f64>>,
}

#[derive(Default)]
pub struct Shared(pub Mutex<Stats>);

impl Shared {
    pub fn with(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn error(&self, what: &'static str) {
        self.with(|s| *s.errors.entry(what).or_default() += 1);
    }
}

pub struct ControllerCollector(pub Arc<Shared>);

impl fmt::Debug for ControllerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerCollector").finish()
    }
}

impl Collector for ControllerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = self.0 .0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let e = &mut enc;
        gauge(
            e,
            desc(
                "gpuwatch_controller_leader",
                "1 while this controller holds the Lease and may act",
                None,
            ),
            i64::from(s.leader),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_controller_actions",
                "Workloads given back (or that would be, in dry-run), by kind and result",
                None,
            ),
            s.actions
                .iter()
                .map(|((k, r), n)| ([("kind", *k), ("result", *r)], *n)),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_controller_warnings",
                "Warnings given before giving a workload back, by kind",
                None,
            ),
            s.warnings.iter().map(|(k, n)| ([("kind", *k)], *n)),
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_controller_workloads_watched",
                "Workloads with a pod judged idle, at the last round",
                None,
            ),
            s.watched,
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_controller_workloads_warned",
                "Workloads warned and waiting for their warning to end",
                None,
            ),
            s.pending,
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_controller_verdicts",
                "Verdicts read at the last round: fresh, and stale (too old, which count as busy)",
                None,
            ),
            [
                ([("state", "fresh")], s.fresh),
                ([("state", "stale")], s.stale),
            ],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_controller_verdict_reads",
                "Reads of the verdicts from Prometheus, by result",
                None,
            ),
            s.reads.iter().map(|(r, n)| ([("result", *r)], *n)),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_controller_errors",
                "Failures, by what failed: prometheus, kubernetes, lease, events",
                None,
            ),
            s.errors.iter().map(|(w, n)| ([("what", *w)], *n)),
        )?;
        unmanaged(e, &s)?;
        gauge(
            e,
            desc(
                "gpuwatch_controller_pods_cached",
                "Pods in the controller's watch cache",
                None,
            ),
            s.pods,
        )
    }
}

/// The owners gpuwatch never gives back whose pods are idle now, and what they cost.
fn unmanaged(e: &mut DescriptorEncoder, s: &Stats) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpuwatch_controller_unmanaged_idle",
            "1 for each owner gpuwatch never gives back (an InferenceService, a bare pod, ...) whose pods' GPUs are judged idle now",
            None,
        ),
        s.unmanaged.keys().map(|(ns, owner)| {
            (
                [("namespace", Text(ns)), ("owner", Text(owner))],
                1i64,
            )
        }),
    )?;
    gauges(
        e,
        desc(
            "gpuwatch_controller_unmanaged_idle_dollars_per_hour",
            "What the idle GPUs of each such owner cost an hour, where every node's price is known",
            None,
        ),
        s.unmanaged.iter().filter_map(|((ns, owner), usd)| {
            Some(([("namespace", Text(ns)), ("owner", Text(owner))], (*usd)?))
        }),
    )?;
    Ok(())
}
