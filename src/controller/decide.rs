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
    /// Its pods that hold a GPU, each with the rule of its fresh verdict (none: busy).
    pub pods: Vec<(String, Option<String>)>,
}

/// What the controller remembers of a warning it gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Warned {
    pub at: f64,
    pub due: f64,
    pub generation: i64,
    pub replicas: i64,
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
    if let Some((pod, _)) = w.pods.iter().find(|(_, v)| v.is_none()) {
        return Decision::Keep(format!(
            "pod {pod} has no fresh idle verdict (busy, or its node cannot tell)"
        ));
    }
    match warned {
        Some(x) if x.generation == w.generation && x.replicas == w.replicas => {
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
