//! Google Compute Engine: which API calls an instance action means on this VM.
//!
//! - `stop` stops the VM (`instances.stop`). A VM with local SSDs says what becomes of their
//!   data: kept (`discardLocalSsd=false`, the safe default) or discarded, as the config says. A
//!   Spot VM can be stopped like any other; its `instanceTerminationAction` says only what
//!   Compute Engine does when it preempts the VM.
//! - `hibernate` would suspend the VM, which Compute Engine does not do for VMs with GPUs: it is
//!   refused (and refused at load, where the config can tell).
//! - `terminate` deletes the VM; its boot and other disks go with it where `autoDelete` is set.

use gpuwatch_core::plan::{Down, Plan};
use gpuwatch_core::rules::Action;

/// What becomes of local SSD data when a VM that has them is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalSsd {
    /// `discardLocalSsd=false`: the data is kept (and billed) while the VM is stopped.
    Keep,
    /// `discardLocalSsd=true`: the data is lost.
    Discard,
}

/// This VM, as the metadata server and `instances.get` describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vm {
    /// Local SSDs are attached (`disks[].type` is `SCRATCH`).
    pub local_ssd: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `POST .../stop?discardLocalSsd=...`.
    Stop { discard_local_ssd: bool },
    /// `DELETE` the VM.
    Delete,
}

impl Step {
    /// What the VM is once this step has run.
    pub fn leaves(&self) -> Option<Down> {
        Some(match self {
            Step::Stop { .. } => Down::Stopped,
            Step::Delete => Down::Terminated,
        })
    }
}

/// Why `hibernate` is never planned on Compute Engine.
pub const NO_SUSPEND: &str =
    "\"hibernate\" suspends the VM, which Compute Engine does not do for a VM with GPUs: use \"stop\"";

/// What the plan refuses on every VM, and why: refused at load.
pub fn refused_everywhere(action: Action) -> Option<&'static str> {
    (action == Action::Hibernate).then_some(NO_SUSPEND)
}

/// Maps an instance action to Compute Engine calls on `vm` (see the module's rules).
pub fn plan(action: Action, vm: &Vm, local_ssd: LocalSsd) -> Plan<Step> {
    match action {
        Action::Alert | Action::Exec | Action::Reclaim => Plan::Steps(Vec::new()),
        Action::Terminate => Plan::Steps(vec![Step::Delete]),
        Action::Hibernate => Plan::Refuse(NO_SUSPEND.into()),
        Action::Stop => Plan::Steps(vec![Step::Stop {
            discard_local_ssd: vm.local_ssd && local_ssd == LocalSsd::Discard,
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let plain = Vm { local_ssd: false };
        let ssd = Vm { local_ssd: true };
        let keep = Plan::Steps(vec![Step::Stop {
            discard_local_ssd: false,
        }]);
        let cases: Vec<(Action, &Vm, LocalSsd, Plan<Step>)> = vec![
            (Action::Stop, &plain, LocalSsd::Keep, keep.clone()),
            (Action::Stop, &plain, LocalSsd::Discard, keep.clone()),
            (Action::Stop, &ssd, LocalSsd::Keep, keep),
            (
                Action::Stop,
                &ssd,
                LocalSsd::Discard,
                Plan::Steps(vec![Step::Stop {
                    discard_local_ssd: true,
                }]),
            ),
            (
                Action::Terminate,
                &ssd,
                LocalSsd::Keep,
                Plan::Steps(vec![Step::Delete]),
            ),
            (
                Action::Hibernate,
                &plain,
                LocalSsd::Keep,
                Plan::Refuse(NO_SUSPEND.into()),
            ),
            (Action::Alert, &plain, LocalSsd::Keep, Plan::Steps(vec![])),
            (Action::Exec, &ssd, LocalSsd::Discard, Plan::Steps(vec![])),
        ];
        for (action, vm, ssd, want) in cases {
            assert_eq!(plan(action, vm, ssd), want, "{action} {vm:?} {ssd:?}");
        }
        assert_eq!(Step::Delete.leaves(), Some(Down::Terminated));
        assert_eq!(
            Step::Stop {
                discard_local_ssd: true
            }
            .leaves(),
            Some(Down::Stopped)
        );
    }
}
