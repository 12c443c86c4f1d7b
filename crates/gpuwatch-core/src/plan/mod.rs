//! What every cloud's plan shares: a plan's steps or its refusal, what it leaves the instance
//! as, and what a stop does to a spot instance. Each cloud's own plan (the calls an instance
//! action means there, pure and table-tested) lives beside its cloud, in `src/cloud/`.

/// What `stop` (and `hibernate`) does on a spot instance that cannot be stopped that way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpotStop {
    Refuse,
    Terminate,
}

/// The calls an action means, in order, or why it is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan<S> {
    Steps(Vec<S>),
    /// The action is impossible or not allowed here; nothing is called.
    Refuse(String),
}

impl<S> Plan<S> {
    /// The same plan, each step made into what `f` makes of it (the edge's calls).
    pub fn map<T>(self, f: impl FnMut(S) -> T) -> Plan<T> {
        match self {
            Plan::Steps(steps) => Plan::Steps(steps.into_iter().map(f).collect()),
            Plan::Refuse(why) => Plan::Refuse(why),
        }
    }
}

/// What a plan leaves the instance as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    Stopped,
    Hibernated,
    Terminated,
}

impl Down {
    pub fn as_str(self) -> &'static str {
        match self {
            Down::Stopped => "stopped",
            Down::Hibernated => "hibernated",
            Down::Terminated => "terminated",
        }
    }
}
