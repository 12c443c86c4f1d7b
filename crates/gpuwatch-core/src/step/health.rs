//! GPU health in the step: the observation each rule judges, and what unhealthy GPUs cost.
//!
//! Health and idleness are apart. An idle rule (and the idle view) sees an unhealthy GPU's
//! readings as unknown, which is busy: a GPU that broke never looks idle. A rule on health sees
//! every GPU's health, a lost GPU's included (it is unhealthy, not unknown).

use std::borrow::Cow;

use crate::rules::{Metric, Observation};

fn unhealthy(g: &crate::rules::GpuReading) -> bool {
    g.get(Metric::GpuUnhealthy) == Some(1.0)
}

/// The observation an idle rule judges: each unhealthy device's readings unknown.
pub(super) fn for_idle(obs: &Observation) -> Cow<'_, Observation> {
    if !obs.gpus.iter().any(unhealthy) {
        return Cow::Borrowed(obs);
    }
    let mut o = obs.clone();
    for g in o.gpus.iter_mut().filter(|g| unhealthy(g)) {
        for m in Metric::ALL {
            if m != Metric::GpuUnhealthy {
                g.set(m, None);
            }
        }
    }
    Cow::Owned(o)
}

/// The observation a rule on health judges: complete while every device's health is known.
pub(super) fn for_health(obs: &Observation) -> Observation {
    let mut o = obs.clone();
    o.complete = !o.gpus.is_empty() && o.gpus.iter().all(|g| g.get(Metric::GpuUnhealthy).is_some());
    o
}

/// The unhealthy GPUs' problems in words, each once, for a health rule's evidence.
pub(super) fn problems(obs: &Observation) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in obs
        .gpus
        .iter()
        .filter(|g| unhealthy(g))
        .flat_map(|g| &g.problems)
    {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

/// How many of the node's GPUs are unhealthy (a GPU in MIG mode counts once).
pub(super) fn unhealthy_gpus(obs: &Observation) -> usize {
    let mut indices: Vec<u32> = obs
        .gpus
        .iter()
        .filter(|g| unhealthy(g))
        .map(|g| g.index)
        .collect();
    indices.sort_unstable();
    indices.dedup();
    indices.len()
}

#[cfg(test)]
mod tests;
