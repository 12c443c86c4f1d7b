//! This instance: the one description of it that metadata fills in and everything else reads
//! (the price lookup, actions, CloudWatch dimensions, `gpuwatch_node_info`).

use serde::Serialize;

use crate::rules::Lifecycle;

/// The instance gpuwatch runs on, as its metadata describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    /// The region gpuwatch uses: the configured one, or the one metadata reports.
    pub region: String,
    /// `None` when the metadata does not say.
    pub lifecycle: Option<Lifecycle>,
}

impl Node {
    /// The lifecycle as a label value: `spot`, `on-demand` or `unknown`.
    pub fn lifecycle_label(&self) -> &'static str {
        self.lifecycle.map_or("unknown", Lifecycle::as_str)
    }
}
