//! The HTTP listener's series: connections open, accepted and closed early, TLS failures.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::encode::*;

/// The HTTP listener's connection counts.
#[derive(Debug)]
pub struct HttpCollector(pub std::sync::Arc<super::listener::Stats>);

impl Collector for HttpCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.0;
        let e = &mut enc;
        gauge(
            e,
            desc(
                "gpuwatch_http_connections_open",
                "HTTP connections open now",
                None,
            ),
            s.open.load(Relaxed) as i64,
        )?;
        counters(
            e,
            desc(
                "gpuwatch_http_connections",
                "HTTP connections accepted",
                None,
            ),
            [(NO_LABELS, s.accepted.load(Relaxed))],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_http_connections_closed_early",
                "Connections closed by the connection limit: evicted (the longest idle, to make room) or refused (every connection busy)",
                None,
            ),
            [
                ([("reason", "evicted")], s.evicted.load(Relaxed)),
                ([("reason", "refused")], s.refused.load(Relaxed)),
            ],
        )?;
        counters(
            e,
            desc(
                "gpuwatch_http_tls_handshake_failures",
                "TLS handshakes that failed or timed out (no TLS, a bad or expired client certificate)",
                None,
            ),
            [(NO_LABELS, s.tls_failures.load(Relaxed))],
        )
    }
}
