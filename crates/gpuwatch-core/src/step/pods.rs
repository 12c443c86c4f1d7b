//! Pod-scoped rules: one rule per pod that holds a GPU, each judged on that pod's GPUs only.

use crate::rules::{Observation, Rule, Scope};

/// The rules one sample is judged by: every node rule, and each pod-scoped rule once for each
/// pod that holds a GPU now, named `rule namespace/pod` and judged on that pod's GPUs only.
pub fn rules_for(rules: &[Rule], obs: &Observation) -> Vec<Rule> {
    let mut pods: Vec<&str> = obs
        .gpus
        .iter()
        .flat_map(|g| g.holders.iter().map(String::as_str))
        .collect();
    pods.sort_unstable();
    pods.dedup();
    let mut out = Vec::with_capacity(rules.len());
    for rule in rules {
        match rule.scope {
            Scope::Node => out.push(rule.clone()),
            Scope::Pod => out.extend(pods.iter().map(|pod| Rule {
                name: format!("{} {pod}", rule.name),
                subject: Some((*pod).to_string()),
                ..rule.clone()
            })),
        }
    }
    out
}

/// What a pod's rules see: the GPUs the pod holds, nothing else.
pub(super) fn pod_observation(obs: &Observation, pod: &str) -> Observation {
    Observation {
        t: obs.t,
        complete: obs.complete,
        gpus: obs
            .gpus
            .iter()
            .filter(|g| g.holders.iter().any(|h| h == pod))
            .cloned()
            .collect(),
        veto: obs.veto.clone(),
    }
}
