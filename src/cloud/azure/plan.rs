//! Azure: which Resource Manager calls an instance action means on this virtual machine.
//!
//! - `stop` deallocates the VM, never powers it off: a VM that is only powered off keeps its
//!   compute reserved and billed. A Spot VM can be deallocated like any other, whatever its
//!   eviction policy (the policy says what Azure does when it evicts the VM, not what its owner
//!   may do); starting it again is subject to Spot capacity.
//! - `hibernate` deallocates with hibernation, on a VM created with hibernation enabled. Azure
//!   does not hibernate Spot VMs, so there it follows `actions.spot_stop`.
//! - `terminate` deletes the VM; its disks, NICs and public IPs follow their `deleteOption`.
//! - A VM in a scale set is refused: the scale set owns its count, and would bring a deleted or
//!   deallocated instance back, or fight the autoscale that should make it smaller.

use gpuwatch_core::plan::{Down, Plan, SpotStop};
use gpuwatch_core::rules::Action;

/// This VM, as instance metadata and Resource Manager describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vm {
    /// `priority` is `Spot` (or the scale sets' older `Low`).
    pub spot: bool,
    /// `additionalCapabilities.hibernationEnabled`; `None` when it could not be read.
    pub hibernation: Option<bool>,
    /// `vmScaleSetName`, when the VM is an instance of a scale set.
    pub scale_set: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `POST .../deallocate`, with `hibernate=true` to hibernate.
    Deallocate { hibernate: bool },
    /// `DELETE` the VM.
    Delete,
}

impl Step {
    /// What the VM is once this step has run.
    pub fn leaves(&self) -> Option<Down> {
        Some(match self {
            Step::Deallocate { hibernate: false } => Down::Stopped,
            Step::Deallocate { hibernate: true } => Down::Hibernated,
            Step::Delete => Down::Terminated,
        })
    }
}

/// Maps an instance action to Resource Manager calls on `vm` (see the module's rules).
pub fn plan(action: Action, vm: &Vm, spot_stop: SpotStop) -> Plan<Step> {
    let refuse = |why: String| Plan::Refuse(why);
    match action {
        Action::Alert | Action::Exec | Action::Reclaim => return Plan::Steps(Vec::new()),
        Action::Stop | Action::Hibernate | Action::Terminate => {}
    }
    if let Some(set) = &vm.scale_set {
        return refuse(format!(
            "the VM is an instance of the scale set \"{set}\", which owns its count and would replace or restart it: gpuwatch does not {action} it; scale the set in (or let its autoscale) instead"
        ));
    }
    match action {
        Action::Terminate => Plan::Steps(vec![Step::Delete]),
        Action::Hibernate if vm.spot => match spot_stop {
            SpotStop::Terminate => Plan::Steps(vec![Step::Delete]),
            SpotStop::Refuse => refuse(
                "Azure does not hibernate Spot VMs; set actions.spot_stop = \"terminate\" to delete it instead, or use stop, which deallocates it".into(),
            ),
        },
        Action::Hibernate => match vm.hibernation {
            Some(true) => Plan::Steps(vec![Step::Deallocate { hibernate: true }]),
            Some(false) => refuse(
                "hibernation is not enabled on this VM (additionalCapabilities.hibernationEnabled is false); use stop, which deallocates it".into(),
            ),
            None => refuse(
                "whether this VM can hibernate could not be read (additionalCapabilities.hibernationEnabled)".into(),
            ),
        },
        _ => Plan::Steps(vec![Step::Deallocate { hibernate: false }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(spot: bool, hibernation: Option<bool>, scale_set: Option<&str>) -> Vm {
        Vm {
            spot,
            hibernation,
            scale_set: scale_set.map(str::to_string),
        }
    }

    #[test]
    fn table() {
        use Step::*;
        let stop = Plan::Steps(vec![Deallocate { hibernate: false }]);
        let hibernate = Plan::Steps(vec![Deallocate { hibernate: true }]);
        let delete = Plan::Steps(vec![Delete]);
        let cases: Vec<(Action, Vm, SpotStop, Plan<Step>)> = vec![
            (
                Action::Stop,
                vm(false, None, None),
                SpotStop::Refuse,
                stop.clone(),
            ),
            (
                Action::Stop,
                vm(true, None, None),
                SpotStop::Refuse,
                stop.clone(),
            ),
            (
                Action::Stop,
                vm(true, Some(false), None),
                SpotStop::Terminate,
                stop,
            ),
            (
                Action::Terminate,
                vm(false, None, None),
                SpotStop::Refuse,
                delete.clone(),
            ),
            (
                Action::Terminate,
                vm(true, None, None),
                SpotStop::Refuse,
                delete.clone(),
            ),
            (
                Action::Hibernate,
                vm(false, Some(true), None),
                SpotStop::Refuse,
                hibernate,
            ),
            (
                Action::Hibernate,
                vm(true, Some(true), None),
                SpotStop::Terminate,
                delete,
            ),
            (
                Action::Alert,
                vm(false, None, Some("pool")),
                SpotStop::Refuse,
                Plan::Steps(vec![]),
            ),
            (
                Action::Exec,
                vm(true, None, None),
                SpotStop::Refuse,
                Plan::Steps(vec![]),
            ),
        ];
        for (action, vm, spot_stop, want) in cases {
            assert_eq!(
                plan(action, &vm, spot_stop),
                want,
                "{action} {vm:?} {spot_stop:?}"
            );
        }
    }

    #[test]
    fn refusals_say_why() {
        let refused = |action, vm: Vm, spot_stop| match plan(action, &vm, spot_stop) {
            Plan::Refuse(why) => why,
            other => panic!("{action} {vm:?}: {other:?}"),
        };
        let why = refused(
            Action::Hibernate,
            vm(true, Some(true), None),
            SpotStop::Refuse,
        );
        assert!(why.contains("does not hibernate Spot VMs"), "{why}");
        let why = refused(
            Action::Hibernate,
            vm(false, Some(false), None),
            SpotStop::Refuse,
        );
        assert!(why.contains("hibernationEnabled is false"), "{why}");
        let why = refused(
            Action::Hibernate,
            vm(false, None, None),
            SpotStop::Terminate,
        );
        assert!(why.contains("could not be read"), "{why}");
        for action in [Action::Stop, Action::Hibernate, Action::Terminate] {
            let why = refused(
                action,
                vm(false, Some(true), Some("gpu-pool")),
                SpotStop::Terminate,
            );
            assert!(why.contains("scale set \"gpu-pool\""), "{why}");
            assert!(why.contains(&format!("does not {action} it")), "{why}");
        }
    }

    #[test]
    fn every_step_leaves_the_vm_down() {
        assert_eq!(
            Step::Deallocate { hibernate: false }.leaves(),
            Some(Down::Stopped)
        );
        assert_eq!(
            Step::Deallocate { hibernate: true }.leaves(),
            Some(Down::Hibernated)
        );
        assert_eq!(Step::Delete.leaves(), Some(Down::Terminated));
    }
}
