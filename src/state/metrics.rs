//! The state directory's series: operations that failed.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::encode::*;

/// Failures of the state directory: saves, audit records and reads. Any of them means a
/// decision may not be durable, and mutating actions wait.
#[derive(Debug)]
pub struct StateCollector(pub std::sync::Arc<super::AuditLog>);

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use super::DiskOp;
        counters(
            &mut enc,
            desc(
                "gpuwatch_state_errors",
                "State directory operations that failed: save (state.json), audit (audit.jsonl) or load",
                None,
            ),
            DiskOp::ALL
                .iter()
                .map(|op| ([("op", op.as_str())], self.0.errors.get(*op))),
        )
    }
}
