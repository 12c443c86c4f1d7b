//! Encoding helpers shared by the collectors: the GPU label set (`gpu`, and `uuid` once known),
//! family descriptors, and one-call encoders for gauge and counter families.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabel, EncodeLabelSet,
    LabelSetEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::Text;
/// `gpu` and `uuid`, which every GPU series carries, the pod holding the GPU (on Kubernetes,
/// while one does), plus the series' own labels.
pub(crate) struct GpuLabels<'a, X> {
    pub(crate) gpu: u32,
    pub(crate) uuid: &'a str,
    pub(crate) pod: Option<PodLabels<'a>>,
    /// The Slurm job holding the GPU, with `[slurm] job_label` (dcgm-exporter's `hpc_job`).
    pub(crate) hpc_job: Option<&'a str>,
    pub(crate) extra: X,
}

/// `pod`, `namespace` and `container`: who holds a GPU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodLabels<'a> {
    pub(crate) pod: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) container: &'a str,
}

impl EncodeLabelSet for PodLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        ("pod", Text(self.pod)).encode(encoder.encode_label())?;
        ("namespace", Text(self.namespace)).encode(encoder.encode_label())?;
        ("container", Text(self.container)).encode(encoder.encode_label())
    }
}

impl<X: EncodeLabelSet> EncodeLabelSet for GpuLabels<'_, X> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        ("gpu", self.gpu).encode(encoder.encode_label())?;
        // A GPU whose UUID was never read has no `uuid` label, rather than an empty one.
        if !self.uuid.is_empty() {
            ("uuid", Text(self.uuid)).encode(encoder.encode_label())?;
        }
        if let Some(pod) = &self.pod {
            pod.encode(encoder)?;
        }
        if let Some(job) = self.hpc_job {
            ("hpc_job", Text(job)).encode(encoder.encode_label())?;
        }
        self.extra.encode(encoder)
    }
}

/// No labels of a series' own.
pub(crate) type NoLabels = [(&'static str, &'static str); 0];
pub(crate) const NO_LABELS: NoLabels = [];

/// One metric family: its name (without unit or `_total`), help, unit and type.
pub(crate) struct Desc {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
}

pub(crate) fn desc(name: &'static str, help: &'static str, unit: Option<&'static str>) -> Desc {
    Desc {
        name,
        help,
        unit: unit.map(|u| Unit::Other(u.to_string())),
    }
}

/// Encodes one metric family; a family with no series is left out entirely.
pub(crate) fn family<L: EncodeLabelSet, V>(
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

pub(crate) fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    d: Desc,
    series: impl IntoIterator<Item = (L, V)>,
) -> Result<(), fmt::Error> {
    family(enc, d, MetricType::Gauge, series, |m, v| m.encode_gauge(v))
}

/// Counters: the encoder appends `_total` to the name.
pub(crate) fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    d: Desc,
    series: impl IntoIterator<Item = (L, V)>,
) -> Result<(), fmt::Error> {
    family(enc, d, MetricType::Counter, series, |m, v| {
        m.encode_counter::<NoLabelSet, V, f64>(v, None)
    })
}

/// Encodes a gauge without labels.
pub(crate) fn gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    d: Desc,
    v: V,
) -> Result<(), fmt::Error> {
    enc.encode_descriptor(d.name, d.help, d.unit.as_ref(), MetricType::Gauge)?
        .encode_gauge(&v)
}
