//! Alibaba Cloud ECS: which API calls an instance action means on this instance.
//!
//! - `stop` is `StopInstance` in economical mode (`StoppedMode=StopCharging`: compute, GPUs and
//!   memory stop billing; disks still bill). Where economical mode does not apply (a
//!   subscription instance; the families with local disks or persistent memory: `i`, `d`,
//!   `gn5`, `re6p`, `ebmre6p`), ECS would stop the instance and keep billing it without a
//!   word, so the stop is refused, unless `[cloud.alibaba] keep_charging = true` asks for it anyway.
//! - `terminate` is `DeleteInstance` with `Force=true`, refused for a subscription instance:
//!   ECS releases one only once it has expired (`ChargeTypeViolation` before), and its time is
//!   paid for whether it runs or not.
//! - `hibernate` is refused: ECS hibernation is an invitational preview, not a public API.

use gpuwatch_core::plan::{Down, Plan};
use gpuwatch_core::rules::Action;

/// This instance, as metadata and `DescribeInstances` describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    /// `InstanceType`, such as `ecs.gn7i-c8g1.2xlarge`.
    pub instance_type: String,
    /// `InstanceChargeType` is `PrePaid` (a subscription).
    pub prepaid: bool,
}

impl Instance {
    /// Whether ECS can stop this instance in economical mode, as its documents list.
    pub fn economical(&self) -> bool {
        let family = self
            .instance_type
            .strip_prefix("ecs.")
            .unwrap_or(&self.instance_type)
            .split(['.', '-'])
            .next()
            .unwrap_or("");
        let local_disks = family.starts_with('i')
            || family.starts_with('d')
            || family == "gn5"
            || family.starts_with("re6p")
            || family == "ebmre6p";
        !self.prepaid && !local_disks
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `StopInstance`; `economical` is `StoppedMode=StopCharging`, else `KeepCharging`.
    Stop { economical: bool },
    /// `DeleteInstance` with `Force=true`.
    Delete,
}

impl Step {
    /// What the instance is once this step has run.
    pub fn leaves(&self) -> Option<Down> {
        Some(match self {
            Step::Stop { .. } => Down::Stopped,
            Step::Delete => Down::Terminated,
        })
    }
}

/// Why `hibernate` is never planned on ECS.
pub const NO_HIBERNATE: &str =
    "\"hibernate\" is not a public ECS API (an invitational preview): use \"stop\", which stops the instance in economical mode";

/// What the plan refuses on every instance, and why: refused at load.
pub fn refused_everywhere(action: Action) -> Option<&'static str> {
    (action == Action::Hibernate).then_some(NO_HIBERNATE)
}

/// Maps an instance action to ECS calls (see the module's rules).
pub fn plan(action: Action, instance: &Instance, keep_charging: bool) -> Plan<Step> {
    match action {
        Action::Alert | Action::Exec | Action::Reclaim => Plan::Steps(Vec::new()),
        Action::Terminate if instance.prepaid => Plan::Refuse(format!(
            "{} is a subscription instance: ECS releases one only once it has expired, and its time is paid for whether it runs or not",
            instance.instance_type
        )),
        Action::Terminate => Plan::Steps(vec![Step::Delete]),
        Action::Hibernate => Plan::Refuse(NO_HIBERNATE.into()),
        Action::Stop if instance.economical() => Plan::Steps(vec![Step::Stop { economical: true }]),
        Action::Stop if keep_charging => Plan::Steps(vec![Step::Stop { economical: false }]),
        Action::Stop => Plan::Refuse(format!(
            "{} cannot stop in economical mode ({}), and a stop that keeps billing is not what an idle rule is for; set [cloud.alibaba] keep_charging = true to stop it anyway",
            instance.instance_type,
            if instance.prepaid {
                "a subscription instance"
            } else {
                "its family has local disks"
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(t: &str, prepaid: bool) -> Instance {
        Instance {
            instance_type: t.into(),
            prepaid,
        }
    }

    #[test]
    fn table() {
        let gpu = instance("ecs.gn7i-c8g1.2xlarge", false);
        let cases: Vec<(Action, Instance, bool, Plan<Step>)> = vec![
            (
                Action::Stop,
                gpu.clone(),
                false,
                Plan::Steps(vec![Step::Stop { economical: true }]),
            ),
            (
                Action::Terminate,
                gpu.clone(),
                false,
                Plan::Steps(vec![Step::Delete]),
            ),
            (
                Action::Hibernate,
                gpu.clone(),
                true,
                Plan::Refuse(NO_HIBERNATE.into()),
            ),
            (Action::Alert, gpu.clone(), false, Plan::Steps(vec![])),
            (
                Action::Stop,
                instance("ecs.gn5-c4g1.xlarge", false),
                true,
                Plan::Steps(vec![Step::Stop { economical: false }]),
            ),
            (
                Action::Terminate,
                instance("ecs.gn5-c4g1.xlarge", false),
                false,
                Plan::Steps(vec![Step::Delete]),
            ),
        ];
        match plan(
            Action::Terminate,
            &instance("ecs.gn7i-c8g1.2xlarge", true),
            true,
        ) {
            Plan::Refuse(m) => assert!(m.contains("subscription instance"), "{m}"),
            other => panic!("a subscription instance is deleted: {other:?}"),
        }
        for (action, i, keep, want) in cases {
            assert_eq!(plan(action, &i, keep), want, "{action} {i:?} {keep}");
        }
    }

    #[test]
    fn economical_mode_follows_the_documented_families_and_billing() {
        for t in [
            "ecs.gn7i-c8g1.2xlarge",
            "ecs.gn7e-c16g1.4xlarge",
            "ecs.gn5i-c8g1.2xlarge",
            "ecs.ebmgn7e.32xlarge",
        ] {
            assert!(instance(t, false).economical(), "{t}");
        }
        for t in [
            "ecs.gn5-c4g1.xlarge",
            "ecs.i3.xlarge",
            "ecs.d2s.5xlarge",
            "ecs.re6p.large",
            "ecs.ebmre6p.26xlarge",
        ] {
            assert!(!instance(t, false).economical(), "{t}");
        }
        assert!(!instance("ecs.gn7i-c8g1.2xlarge", true).economical());
        for (t, prepaid, why) in [
            ("ecs.gn5-c4g1.xlarge", false, "local disks"),
            ("ecs.gn7i-c8g1.2xlarge", true, "subscription"),
        ] {
            match plan(Action::Stop, &instance(t, prepaid), false) {
                Plan::Refuse(m) => assert!(m.contains(why) && m.contains("keep_charging"), "{m}"),
                other => panic!("{t}: {other:?}"),
            }
        }
    }
}
