//! Rules of a pod, job or user scope: one rule per pod, job or user that holds a GPU now, each
//! judged on that holder's GPUs only.

use crate::rules::{Observation, Rule, Scope};

/// The rules one sample is judged by: every node rule, and each rule of a pod, job or user
/// scope once for each holder of that kind that holds a GPU now, named `rule namespace/pod`,
/// `rule job 42` or `rule user alice` and judged on that holder's GPUs only.
pub fn rules_for(rules: &[Rule], obs: &Observation) -> Vec<Rule> {
    let holders = |scope: Scope| {
        let mut all: Vec<&str> = obs
            .gpus
            .iter()
            .flat_map(|g| scope.holders(g).iter().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    };
    let mut out = Vec::with_capacity(rules.len());
    for rule in rules {
        match rule.scope {
            Scope::Node => out.push(rule.clone()),
            scope => out.extend(holders(scope).into_iter().map(|who| Rule {
                name: rule.name_for(who),
                subject: Some(who.to_string()),
                ..rule.clone()
            })),
        }
    }
    out
}

/// What a holder's rules see: the GPUs it holds, nothing else.
pub(super) fn subject_observation(obs: &Observation, scope: Scope, who: &str) -> Observation {
    // Holders unknown: a job's or user's devices cannot be told, so its data is incomplete
    // (a pod's come from the kubelet, which this does not concern).
    let unknown = obs.holders_unknown && matches!(scope, Scope::Job | Scope::User);
    Observation {
        t: obs.t,
        complete: obs.complete && !unknown,
        gpus: obs
            .gpus
            .iter()
            .filter(|g| scope.holders(g).iter().any(|h| h == who))
            .cloned()
            .collect(),
        veto: obs.veto.clone(),
        holders_unknown: obs.holders_unknown,
    }
}

/// The devices of a job's or user's rule, for its evidence and its command: `0`, or `0:1` for
/// GPU instance 1 of GPU 0.
pub(super) fn devices(obs: &Observation, scope: Scope, who: &str) -> Vec<String> {
    obs.gpus
        .iter()
        .filter(|g| scope.holders(g).iter().any(|h| h == who))
        .map(|g| crate::rules::device_label(g.index, g.mig.map(|m| m.gpu_instance)))
        .collect()
}

/// Whether a pod's verdict of idleness (a `reclaim` rule acted for it) still stands at this
/// sample: the sample is complete, the pod still holds a device, and every device it holds
/// meets the rule's condition now. A busy device, an unknown reading or a pod gone withdraws
/// it; a new one comes only through a whole window, warning and re-check again.
pub fn verdict_stands(rule: &Rule, obs: &Observation, pod: &str) -> bool {
    let Some(c) = rule.condition() else {
        return false;
    };
    let mut devices = obs
        .gpus
        .iter()
        .filter(|g| g.holders.iter().any(|h| h == pod))
        .peekable();
    obs.complete
        && devices.peek().is_some()
        && devices.all(|g| {
            g.get(c.metric)
                .is_some_and(|v| c.comparison.holds(v, c.threshold))
        })
}

#[cfg(test)]
mod tests;
