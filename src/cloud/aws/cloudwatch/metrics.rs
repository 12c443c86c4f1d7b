//! CloudWatch publishing's own series: datums sent, failed calls, drops and the queue.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::encode::*;

/// The CloudWatch publisher's counters.
#[derive(Debug)]
pub struct CloudWatchCollector(pub std::sync::Arc<super::Counters>);

impl Collector for CloudWatchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.0;
        let e = &mut enc;
        counters(
            e,
            desc(
                "gpuwatch_cloudwatch_datums",
                "Datums accepted by PutMetricData",
                None,
            ),
            [(NO_LABELS, c.datums.load(Relaxed))],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_cloudwatch_errors",
                "PutMetricData calls that failed",
                None,
            ),
            [(NO_LABELS, c.errors.load(Relaxed))],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_cloudwatch_dropped_datums",
                "Datums dropped from a full queue during an outage",
                None,
            ),
            [(NO_LABELS, c.dropped.load(Relaxed))],
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_cloudwatch_queue_datums",
                "Datums waiting to be published",
                None,
            ),
            c.queued.load(Relaxed) as i64,
        )
    }
}
