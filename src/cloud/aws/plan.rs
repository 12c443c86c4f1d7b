//! EC2: which calls an instance action means on this instance, following its real lifecycle.

use gpuwatch_core::plan::{Down, Plan, SpotStop};
use gpuwatch_core::rules::{Action, Lifecycle};

/// The spot request behind this instance, as EC2 describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpotRequest {
    pub id: String,
    pub persistent: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    CancelSpotRequest(String),
    Stop { hibernate: bool },
    Terminate,
}

impl Step {
    /// What the instance is once this step has run.
    pub fn leaves(&self) -> Option<Down> {
        match self {
            Step::CancelSpotRequest(_) => None,
            Step::Stop { hibernate: false } => Some(Down::Stopped),
            Step::Stop { hibernate: true } => Some(Down::Hibernated),
            Step::Terminate => Some(Down::Terminated),
        }
    }
}

/// Maps an instance action to EC2 calls, following the instance's real lifecycle:
/// - a one-time spot instance cannot be stopped: `stop` and `hibernate` terminate it when
///   `actions.spot_stop = "terminate"`, and are refused otherwise;
/// - a persistent spot request is cancelled first, so that AWS does not launch a replacement.
pub fn plan(
    action: Action,
    lifecycle: Option<Lifecycle>,
    spot: Option<&SpotRequest>,
    spot_stop: SpotStop,
) -> Plan<Step> {
    let main = match action {
        Action::Stop => Step::Stop { hibernate: false },
        Action::Hibernate => Step::Stop { hibernate: true },
        Action::Terminate => Step::Terminate,
        Action::Alert | Action::Exec | Action::Reclaim => return Plan::Steps(Vec::new()),
    };
    match (lifecycle, spot) {
        (Some(Lifecycle::Spot), Some(req)) if req.persistent => {
            Plan::Steps(vec![Step::CancelSpotRequest(req.id.clone()), main])
        }
        (Some(Lifecycle::Spot), _) => match (main, spot_stop) {
            (Step::Terminate, _) => Plan::Steps(vec![Step::Terminate]),
            (_, SpotStop::Terminate) => Plan::Steps(vec![Step::Terminate]),
            (_, SpotStop::Refuse) => Plan::Refuse(format!(
                "a one-time spot instance cannot {action}; set actions.spot_stop = \"terminate\" to terminate it instead"
            )),
        },
        _ => Plan::Steps(vec![main]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Case<'a> = (
        Action,
        Option<Lifecycle>,
        Option<&'a SpotRequest>,
        SpotStop,
        Plan<Step>,
    );

    #[test]
    fn table() {
        let one_time = SpotRequest {
            id: "sir-1".into(),
            persistent: false,
        };
        let persistent = SpotRequest {
            id: "sir-2".into(),
            persistent: true,
        };
        let od = Some(Lifecycle::OnDemand);
        let spot = Some(Lifecycle::Spot);
        use Step::*;
        let cases: Vec<Case> = vec![
            (
                Action::Stop,
                od,
                None,
                SpotStop::Refuse,
                Plan::Steps(vec![Stop { hibernate: false }]),
            ),
            (
                Action::Hibernate,
                od,
                None,
                SpotStop::Refuse,
                Plan::Steps(vec![Stop { hibernate: true }]),
            ),
            (
                Action::Terminate,
                od,
                None,
                SpotStop::Refuse,
                Plan::Steps(vec![Terminate]),
            ),
            (
                Action::Terminate,
                spot,
                Some(&one_time),
                SpotStop::Refuse,
                Plan::Steps(vec![Terminate]),
            ),
            (
                Action::Stop,
                spot,
                Some(&one_time),
                SpotStop::Terminate,
                Plan::Steps(vec![Terminate]),
            ),
            (
                Action::Stop,
                spot,
                None,
                SpotStop::Terminate,
                Plan::Steps(vec![Terminate]),
            ),
            (
                Action::Terminate,
                spot,
                Some(&persistent),
                SpotStop::Refuse,
                Plan::Steps(vec![CancelSpotRequest("sir-2".into()), Terminate]),
            ),
            (
                Action::Stop,
                spot,
                Some(&persistent),
                SpotStop::Refuse,
                Plan::Steps(vec![
                    CancelSpotRequest("sir-2".into()),
                    Stop { hibernate: false },
                ]),
            ),
            (
                Action::Alert,
                spot,
                None,
                SpotStop::Refuse,
                Plan::Steps(vec![]),
            ),
        ];
        for (action, lc, req, ss, want) in cases {
            assert_eq!(
                plan(action, lc, req, ss),
                want,
                "{action} {lc:?} {req:?} {ss:?}"
            );
        }
        assert!(
            matches!(plan(Action::Stop, spot, Some(&one_time), SpotStop::Refuse), Plan::Refuse(m) if m.contains("cannot stop"))
        );
    }
}
