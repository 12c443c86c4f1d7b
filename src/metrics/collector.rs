//! Device and daemon metrics, encoded from the latest snapshot at scrape time.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabel, EncodeLabelSet,
    LabelSetEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::{ErrorKind, SelfMetrics, Text};
use crate::gpu::sampler::Snapshots;
use crate::gpu::{GpuSample, Snapshot};

/// Version and source revision of this build, for `gpuwatch_build_info`.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    pub version: String,
    pub revision: String,
}

impl BuildInfo {
    pub fn current() -> Self {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision: env!("GPUWATCH_REVISION").to_string(),
        }
    }
}

/// Encodes every `gpu_*` series and the snapshot-derived `gpuwatch_*` series.
pub struct SnapshotCollector {
    source: Source,
    build: BuildInfo,
}

enum Source {
    Live(Snapshots),
    Fixed(std::sync::Arc<Snapshot>),
}

impl fmt::Debug for SnapshotCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotCollector")
            .field("build", &self.build)
            .finish()
    }
}

impl SnapshotCollector {
    pub fn new(snapshots: Snapshots, build: BuildInfo) -> Self {
        SnapshotCollector {
            source: Source::Live(snapshots),
            build,
        }
    }

    /// A collector over one fixed snapshot, for `gpuwatch snapshot` and golden tests.
    pub fn fixed(snapshot: Snapshot, build: BuildInfo) -> Self {
        SnapshotCollector {
            source: Source::Fixed(std::sync::Arc::new(snapshot)),
            build,
        }
    }

    fn snapshot(&self) -> std::sync::Arc<Snapshot> {
        match &self.source {
            Source::Live(s) => s.latest(),
            Source::Fixed(s) => std::sync::Arc::clone(s),
        }
    }
}

/// `gpu` and `uuid`, which every GPU series carries, plus the series' own labels.
struct GpuLabels<'a, X> {
    gpu: u32,
    uuid: &'a str,
    extra: X,
}

impl<X: EncodeLabelSet> EncodeLabelSet for GpuLabels<'_, X> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        ("gpu", self.gpu).encode(encoder.encode_label())?;
        ("uuid", Text(self.uuid)).encode(encoder.encode_label())?;
        self.extra.encode(encoder)
    }
}

/// No labels of a series' own.
type NoLabels = [(&'static str, &'static str); 0];
const NO_LABELS: NoLabels = [];

fn labels(g: &GpuSample) -> GpuLabels<'_, NoLabels> {
    with(g, NO_LABELS)
}

fn with<X>(g: &GpuSample, extra: X) -> GpuLabels<'_, X> {
    GpuLabels {
        gpu: g.index,
        uuid: &g.uuid,
        extra,
    }
}

/// One metric family: its name (without unit or `_total`), help, unit and type.
struct Desc {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
}

fn desc(name: &'static str, help: &'static str, unit: Option<&'static str>) -> Desc {
    Desc {
        name,
        help,
        unit: unit.map(|u| Unit::Other(u.to_string())),
    }
}

/// Encodes one metric family; a family with no series is left out entirely.
fn family<L: EncodeLabelSet, V>(
    enc: &mut DescriptorEncoder,
    d: Desc,
    ty: MetricType,
    series: impl IntoIterator<Item = (L, V)>,
    value: impl Fn(&mut MetricEncoder, &V) -> Result<(), fmt::Error>,
) -> Result<(), fmt::Error> {
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let mut family = enc.encode_descriptor(d.name, d.help, d.unit.as_ref(), ty)?;
    for (l, v) in series {
        value(&mut family.encode_family(&l)?, &v)?;
    }
    Ok(())
}

fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    d: Desc,
    series: impl IntoIterator<Item = (L, V)>,
) -> Result<(), fmt::Error> {
    family(enc, d, MetricType::Gauge, series, |m, v| m.encode_gauge(v))
}

/// Counters: the encoder appends `_total` to the name.
fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    d: Desc,
    series: impl IntoIterator<Item = (L, V)>,
) -> Result<(), fmt::Error> {
    family(enc, d, MetricType::Counter, series, |m, v| {
        m.encode_counter::<NoLabelSet, V, f64>(v, None)
    })
}

/// Encodes a gauge without labels.
fn gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    d: Desc,
    v: V,
) -> Result<(), fmt::Error> {
    enc.encode_descriptor(d.name, d.help, d.unit.as_ref(), MetricType::Gauge)?
        .encode_gauge(&v)
}

/// Series of one optional reading of every GPU that is up.
fn per_gpu<'a, V: 'a>(
    gpus: &'a [GpuSample],
    read: impl Fn(&'a GpuSample) -> Option<V> + 'a,
) -> impl Iterator<Item = (GpuLabels<'a, NoLabels>, V)> + 'a {
    gpus.iter()
        .filter(|g| g.up)
        .filter_map(move |g| read(g).map(|v| (labels(g), v)))
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let snap = self.snapshot();
        let gpus = &snap.gpus[..];
        let e = &mut enc;

        gauges(
            e,
            desc(
                "gpuwatch_build_info",
                "gpuwatch version and source revision",
                None,
            ),
            [(
                [
                    ("version", self.build.version.as_str()),
                    ("revision", self.build.revision.as_str()),
                ],
                1i64,
            )],
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_nvml_up",
                "1 when the NVML library is loaded and answering",
                None,
            ),
            i64::from(snap.nvml.up),
        )?;
        if snap.nvml.up {
            let unknown = "unknown";
            gauges(
                e,
                desc(
                    "gpuwatch_nvml_info",
                    "NVIDIA driver, NVML and CUDA driver versions",
                    None,
                ),
                [(
                    [
                        (
                            "driver_version",
                            Text(snap.nvml.driver_version.as_deref().unwrap_or(unknown)),
                        ),
                        (
                            "nvml_version",
                            Text(snap.nvml.nvml_version.as_deref().unwrap_or(unknown)),
                        ),
                        (
                            "cuda_driver_version",
                            Text(snap.nvml.cuda_driver_version.as_deref().unwrap_or(unknown)),
                        ),
                    ],
                    1i64,
                )],
            )?;
        }
        if snap.is_ready() {
            gauge(
                e,
                desc(
                    "gpuwatch_gpus",
                    "GPUs NVML reports on this node, lost ones included",
                    None,
                ),
                gpus.len() as i64,
            )?;
            gauge(
                e,
                desc(
                    "gpuwatch_last_sample_timestamp",
                    "When the latest sample was taken",
                    Some("seconds"),
                ),
                snap.timestamp,
            )?;
            gauge(
                e,
                desc(
                    "gpuwatch_sample_duration",
                    "How long the latest sampling cycle took",
                    Some("seconds"),
                ),
                snap.duration_seconds,
            )?;
        }

        gauges(
            e,
            desc("gpu_info", "GPU identity; value 1", None),
            gpus.iter().filter(|g| g.up).map(|g| {
                let extra = [
                    ("name", Text(g.name.as_deref().unwrap_or(""))),
                    ("pci_bus_id", Text(g.pci_bus_id.as_deref().unwrap_or(""))),
                ];
                (with(g, extra), 1i64)
            }),
        )?;
        gauges(
            e,
            desc(
                "gpu_up",
                "1 when the GPU answers NVML, 0 when it is lost",
                None,
            ),
            gpus.iter().map(|g| (labels(g), i64::from(g.up))),
        )?;
        gauges(
            e,
            desc(
                "gpu_utilization",
                "Fraction of the last sample period a kernel was running",
                Some("ratio"),
            ),
            per_gpu(gpus, |g| g.utilization_ratio),
        )?;
        gauges(
            e,
            desc(
                "gpu_memory_utilization",
                "Fraction of the last sample period device memory was read or written",
                Some("ratio"),
            ),
            per_gpu(gpus, |g| g.memory_utilization_ratio),
        )?;
        gauges(
            e,
            desc("gpu_memory_used", "Device memory in use", Some("bytes")),
            per_gpu(gpus, |g| g.memory_used_bytes.map(|v| v as i64)),
        )?;
        gauges(
            e,
            desc("gpu_memory_free", "Device memory free", Some("bytes")),
            per_gpu(gpus, |g| g.memory_free_bytes.map(|v| v as i64)),
        )?;
        gauges(
            e,
            desc("gpu_memory_total", "Device memory in all", Some("bytes")),
            per_gpu(gpus, |g| g.memory_total_bytes.map(|v| v as i64)),
        )?;
        gauges(
            e,
            desc("gpu_temperature", "GPU core temperature", Some("celsius")),
            per_gpu(gpus, |g| g.temperature_celsius),
        )?;
        gauges(
            e,
            desc("gpu_power", "Power draw", Some("watts")),
            per_gpu(gpus, |g| g.power_watts),
        )?;
        gauges(
            e,
            desc("gpu_power_limit", "Enforced power limit", Some("watts")),
            per_gpu(gpus, |g| g.power_limit_watts),
        )?;
        counters(
            e,
            desc(
                "gpu_energy",
                "Energy consumed since the driver loaded",
                Some("joules"),
            ),
            per_gpu(gpus, |g| g.energy_joules),
        )?;
        gauges(
            e,
            desc("gpu_clock", "Current clock frequency", Some("hertz")),
            gpus.iter().filter(|g| g.up).flat_map(|g| {
                let sm = g.sm_clock_hertz.map(|v| (with(g, [("clock", "sm")]), v));
                let mem = g
                    .memory_clock_hertz
                    .map(|v| (with(g, [("clock", "memory")]), v));
                sm.into_iter().chain(mem)
            }),
        )?;
        gauges(
            e,
            desc(
                "gpu_clock_throttle_active",
                "1 while the reason is holding clocks down; one series per reason the GPU supports",
                None,
            ),
            gpus.iter().filter(|g| g.up).flat_map(|g| {
                g.throttle_reasons
                    .iter()
                    .map(move |t| (with(g, [("reason", t.reason)]), i64::from(t.active)))
            }),
        )?;
        counters(
            e,
            desc(
                "gpu_ecc_errors",
                "ECC errors since the driver loaded (volatile counters)",
                None,
            ),
            gpus.iter().filter(|g| g.up).flat_map(|g| {
                let c = g
                    .ecc_corrected
                    .map(|v| (with(g, [("kind", "corrected")]), v));
                let u = g
                    .ecc_uncorrected
                    .map(|v| (with(g, [("kind", "uncorrected")]), v));
                c.into_iter().chain(u)
            }),
        )?;
        // XID counts stay visible for lost GPUs: an XID is often what explains the loss, and a
        // counter that vanished and came back would read as a reset.
        counters(
            e,
            desc(
                "gpu_xid_errors",
                "Critical XID errors seen since gpuwatch started, by XID code",
                None,
            ),
            gpus.iter().flat_map(|g| {
                g.xid_errors
                    .iter()
                    .map(move |(xid, n)| (with(g, [("xid", *xid)]), *n))
            }),
        )?;
        gauges(
            e,
            desc("gpu_processes", "Running compute processes", None),
            per_gpu(gpus, |g| g.processes.map(i64::from)),
        )?;
        gauges(
            e,
            desc(
                "gpu_process_memory_used",
                "Device memory used by one compute process",
                Some("bytes"),
            ),
            gpus.iter().filter(|g| g.up).flat_map(|g| {
                g.process_memory.iter().flatten().filter_map(move |p| {
                    let extra = (
                        [("pid", p.pid)],
                        [("process", Text(p.name.as_deref().unwrap_or("")))],
                    );
                    p.used_memory_bytes.map(|b| (with(g, extra), b as i64))
                })
            }),
        )?;
        Ok(())
    }
}

impl Collector for SelfMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        counters(
            &mut enc,
            desc(
                "gpuwatch_sample_errors",
                "Sampling errors by kind: failed or out-of-range readings, lost GPUs, NVML init failures, abandoned cycles",
                None,
            ),
            ErrorKind::ALL
                .iter()
                .map(|k| ([("kind", k.as_str())], self.error_count(*k))),
        )
    }
}

/// The cost watch's series, from its latest view.
#[derive(Debug)]
pub struct WatchCollector(pub std::sync::Arc<crate::watch::WatchMetrics>);

impl Collector for WatchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let v = self.0.view();
        let e = &mut enc;
        if let Some(n) = &v.node {
            gauges(
                e,
                desc(
                    "gpuwatch_node_info",
                    "The instance gpuwatch runs on; value 1",
                    None,
                ),
                [(
                    [
                        ("instance_id", Text(&n.instance_id)),
                        ("instance_type", Text(&n.instance_type)),
                        ("availability_zone", Text(&n.availability_zone)),
                        ("lifecycle", Text(&n.lifecycle)),
                    ],
                    1i64,
                )],
            )?;
        }
        if let Some((usd, source)) = v.cost.price {
            gauges(
                e,
                desc(
                    "gpuwatch_instance_hourly_cost_dollars",
                    "The instance's price per hour, and where it came from",
                    None,
                ),
                [([("source", source)], usd)],
            )?;
        }
        if let Some(s) = v.cost.spent {
            gauge(
                e,
                desc(
                    "gpuwatch_spend_dollars",
                    "Spend in the current budget period",
                    None,
                ),
                s,
            )?;
        }
        if let Some(f) = v.cost.forecast {
            gauge(
                e,
                desc(
                    "gpuwatch_spend_forecast_dollars",
                    "Spend at the end of the period at the current price",
                    None,
                ),
                f,
            )?;
        }
        gauges(
            e,
            desc("gpuwatch_budget_limit_dollars", "The budget's limit", None),
            v.cost
                .budgets
                .iter()
                .map(|(b, l, _, _)| ([("budget", Text(b))], *l)),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_budget_spent_ratio",
                "Spend as a share of the budget's limit",
                None,
            ),
            v.cost
                .budgets
                .iter()
                .filter_map(|(b, _, s, _)| Some(([("budget", Text(b))], (*s)?))),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_budget_forecast_ratio",
                "Forecast spend as a share of the budget's limit",
                None,
            ),
            v.cost
                .budgets
                .iter()
                .filter_map(|(b, _, _, f)| Some(([("budget", Text(b))], (*f)?))),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_budget_alerts",
                "Budget threshold alerts sent",
                None,
            ),
            v.cost
                .alerts
                .iter()
                .map(|((b, t), n)| ([("budget", Text(b)), ("threshold", Text(t))], *n)),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_gpu_idle",
                "How long the GPU has been idle without a break",
                Some("seconds"),
            ),
            v.gpu_idle.iter().map(|(gpu, uuid, s)| {
                (
                    GpuLabels {
                        gpu: *gpu,
                        uuid,
                        extra: NO_LABELS,
                    },
                    *s,
                )
            }),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_rule_breaching",
                "1 while the rule's condition holds",
                None,
            ),
            v.breaching
                .iter()
                .map(|(r, b)| ([("rule", Text(r))], i64::from(*b))),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_action_pending",
                "1 while an action is in its warning period",
                None,
            ),
            v.pending
                .iter()
                .map(|(r, a, _)| ([("rule", Text(r)), ("action", Text(a))], 1i64)),
        )?;
        gauges(
            e,
            desc(
                "gpuwatch_action_due_timestamp",
                "When the pending action is due unless the GPUs come back",
                Some("seconds"),
            ),
            v.pending
                .iter()
                .map(|(r, a, due)| ([("rule", Text(r)), ("action", Text(a))], *due)),
        )?;
        counters(
            e,
            desc(
                "gpuwatch_actions",
                "Actions by result: done, dry_run, failed, cancelled or refused",
                None,
            ),
            v.actions
                .iter()
                .map(|((a, r), n)| ([("action", Text(a)), ("result", Text(r))], *n)),
        )?;
        if let Some(h) = v.hold_until {
            gauge(
                e,
                desc(
                    "gpuwatch_hold_until_timestamp",
                    "When the current hold expires",
                    Some("seconds"),
                ),
                h,
            )?;
        }
        gauge(
            e,
            desc(
                "gpuwatch_spot_interruption_pending",
                "1 while a spot interruption notice is in effect; actions wait",
                None,
            ),
            i64::from(v.interruption.is_some()),
        )?;
        gauge(
            e,
            desc(
                "gpuwatch_spot_rebalance_recommended",
                "1 while a spot rebalance recommendation is in effect; it blocks nothing",
                None,
            ),
            i64::from(v.rebalance.is_some()),
        )?;
        if v.node.is_some() {
            counters(
                e,
                desc(
                    "gpuwatch_imds_errors",
                    "Instance metadata reads that failed (spot notices and tag holds go unseen meanwhile)",
                    None,
                ),
                [(NO_LABELS, v.imds_errors)],
            )?;
        }
        if let Some(t) = v.interruption {
            gauge(
                e,
                desc(
                    "gpuwatch_spot_interruption_timestamp",
                    "When the announced spot interruption takes effect",
                    Some("seconds"),
                ),
                t,
            )?;
        }
        Ok(())
    }
}

/// The CloudWatch publisher's counters.
#[derive(Debug)]
pub struct CloudWatchCollector(pub std::sync::Arc<crate::cloudwatch::Counters>);

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

/// Failures of the state directory: saves, audit records and reads. Any of them means a
/// decision may not be durable, and mutating actions wait.
#[derive(Debug)]
pub struct StateCollector(pub std::sync::Arc<crate::state::AuditLog>);

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use crate::state::DiskOp;
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

/// The HTTP listener's connection counts.
#[derive(Debug)]
pub struct HttpCollector(pub std::sync::Arc<crate::serve::Stats>);

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
        )
    }
}
