//! What the controller does with one workload, decided from what it read this round: pure, and
//! table-tested. The order is the node daemon's: exclusions and holds first, then every GPU pod
//! idle (one busy replica, or one without a fresh verdict, keeps the whole workload), then a
//! warning, and the action only once the warning is due and everything still says so.

use std::time::Duration;

/// What kind of workload the pods belong to, and so how it is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Deployment,
    StatefulSet,
    ReplicaSet,
    Job,
    Notebook,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::StatefulSet => "StatefulSet",
            Kind::ReplicaSet => "ReplicaSet",
            Kind::Job => "Job",
            Kind::Notebook => "Notebook",
        }
    }

    /// The kind as `restore` names it: `deployment`, `statefulset`, ...
    pub fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Deployment,
            Kind::StatefulSet,
            Kind::ReplicaSet,
            Kind::Job,
            Kind::Notebook,
        ]
        .into_iter()
        .find(|k| k.as_str().eq_ignore_ascii_case(s))
    }

    /// What giving it back means, in words.
    pub fn verb(self) -> &'static str {
        match self {
            Kind::Deployment | Kind::StatefulSet | Kind::ReplicaSet => "scale to 0",
            Kind::Job => "suspend",
            Kind::Notebook => "stop",
        }
    }
}

/// A hold, as read from the workload's or its namespace's `gpuwatch.io/hold` annotation.
#[derive(Debug, Clone, PartialEq)]
pub enum Hold {
    None,
    /// Until this time (Unix seconds), or for ever.
    Until(f64),
    Forever,
    /// A value that is neither RFC 3339 nor `forever`: it holds.
    Unreadable(String),
}

impl Hold {
    /// Reads an annotation's value.
    pub fn parse(value: Option<&str>) -> Hold {
        match value.map(str::trim) {
            None => Hold::None,
            Some("forever") => Hold::Forever,
            Some(v) => match gpuwatch_core::time::parse_rfc3339(v) {
                Some(t) => Hold::Until(t),
                None => Hold::Unreadable(crate::redact::brief(v, 64)),
            },
        }
    }

    /// Why it holds at `now`, if it does.
    pub fn holds(&self, now: f64) -> Option<String> {
        match self {
            Hold::None => None,
            Hold::Until(t) if *t <= now => None,
            Hold::Until(t) => Some(format!(
                "held until {}",
                gpuwatch_core::time::rfc3339(*t)
            )),
            Hold::Forever => Some("held for ever".into()),
            Hold::Unreadable(v) => Some(format!(
                "held: the hold \"{v}\" is neither an RFC 3339 time nor \"forever\", and an unreadable hold holds"
            )),
        }
    }
}

/// One workload as read this round.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// `metadata.generation`: a change of its spec.
    pub generation: i64,
    /// `spec.replicas` (a Job's parallelism or a Notebook's 1 otherwise).
    pub replicas: i64,
    /// Already given back: scaled to 0, suspended, stopped.
    pub given_back: bool,
    /// The label `gpuwatch.io/reclaim: "false"`.
    pub opted_out: bool,
    pub hold: Hold,
    pub namespace_hold: Hold,
    pub excluded: bool,
    /// Its pods that hold a GPU (or any accelerator, or are ending), each with its fresh
    /// verdict (none: busy).
    pub pods: Vec<Pod>,
    /// Its live pods seen in the cache, with or without a GPU.
    pub seen: i64,
    /// The pods it should have now, by its own status (`status.replicas`, a Job's
    /// `status.active`): they must agree with its spec and with those seen.
    pub status_pods: i64,
}

/// One pod of a workload, as the round saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub name: String,
    /// Its fresh verdict: the rule, and when the node daemon gave it.
    pub idle: Option<(String, f64)>,
    /// Being deleted: it may be busy to its end, and a new one may take its place.
    pub terminating: bool,
}

impl Pod {
    pub fn idle(name: &str, rule: &str, since: f64) -> Pod {
        Pod {
            name: name.into(),
            idle: Some((rule.into(), since)),
            terminating: false,
        }
    }
}

/// What the controller remembers of a warning it gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Warned {
    pub at: f64,
    pub due: f64,
    pub generation: i64,
    pub replicas: i64,
    /// Each pod's verdict warned of (its name, when it was given): a verdict given since is
    /// another idle spell, warned of afresh.
    pub verdicts: Vec<(String, f64)>,
}

impl Warned {
    /// The warning of `w` given at `at`, due at `due`.
    pub fn of(w: &Workload, at: f64, due: f64) -> Warned {
        Warned {
            at,
            due,
            generation: w.generation,
            replicas: w.replicas,
            verdicts: spells(w),
        }
    }
}

/// Each pod's verdict: its name and when it was given.
fn spells(w: &Workload) -> Vec<(String, f64)> {
    w.pods
        .iter()
        .filter_map(|p| Some((p.name.clone(), p.idle.as_ref()?.1)))
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing to do, and any warning is off: why.
    Keep(String),
    /// Warn now; act at `due` if everything still says so.
    Warn { due: f64 },
    /// Warned; not yet due.
    Wait,
    /// Warned, due, and everything still says so: act.
    Act,
}

/// What to do with `w` at `now`, given the warning given before (if any).
pub fn decide(w: &Workload, warned: Option<&Warned>, now: f64, warning: Duration) -> Decision {
    if w.excluded {
        return Decision::Keep(format!("namespace {} is excluded", w.namespace));
    }
    if w.opted_out {
        return Decision::Keep("opted out (gpuwatch.io/reclaim: \"false\")".into());
    }
    if let Some(why) = w.hold.holds(now) {
        return Decision::Keep(why);
    }
    if let Some(why) = w.namespace_hold.holds(now) {
        return Decision::Keep(format!("its namespace is {why}"));
    }
    if w.given_back {
        return Decision::Keep(format!("already given back ({})", w.kind.verb()));
    }
    if w.pods.is_empty() {
        return Decision::Keep("no pod of it holds a GPU".into());
    }
    if let Some(p) = w.pods.iter().find(|p| p.terminating) {
        return Decision::Keep(format!("pod {} is being deleted", p.name));
    }
    if w.seen != w.replicas || w.status_pods != w.replicas {
        return Decision::Keep(format!(
            "it should have {} pods; its status says {} and {} are seen: it is changing, or the pod cache is behind",
            w.replicas, w.status_pods, w.seen
        ));
    }
    if let Some(p) = w.pods.iter().find(|p| p.idle.is_none()) {
        return Decision::Keep(format!(
            "pod {} has no fresh idle verdict (busy, or its node cannot tell)",
            p.name
        ));
    }
    match warned {
        Some(x)
            if x.generation == w.generation
                && x.replicas == w.replicas
                && x.verdicts == spells(w) =>
        {
            if now >= x.due {
                Decision::Act
            } else {
                Decision::Wait
            }
        }
        // Never warned, or changed since: decided again from the start.
        _ => Decision::Warn {
            due: now + warning.as_secs_f64(),
        },
    }
}

#[cfg(test)]
mod tests;
