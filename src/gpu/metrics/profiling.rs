//! The GPM (profiling) families of Hopper and later, and the labels that make a MIG device a
//! device of its own beside its GPU.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};

use super::{labels, with, GpuView};
use crate::gpu::gpm::GpmReadings;
use crate::gpu::MigSample;
use crate::metrics::encode::*;
use crate::metrics::Text;

/// The GPM families (Hopper and later): support per GPU, then each metric where it is known.
pub(super) fn encode_gpm<'a>(
    e: &mut DescriptorEncoder,
    unshared: &'a [GpuView<'a>],
    gpus: &'a [GpuView<'a>],
) -> Result<(), fmt::Error> {
    gauges(
        e,
        desc(
            "gpu_gpm_supported",
            "1 when the GPU supports GPM profiling metrics (Hopper and later), else 0",
            None,
        ),
        unshared
            .iter()
            .filter(|g| g.up)
            .filter_map(|g| g.gpm_supported.map(|s| (labels(g), i64::from(s)))),
    )?;
    type Read = fn(&GpmReadings) -> Option<f64>;
    let ratios: [(&'static str, &'static str, Read); 5] = [
        (
            "gpu_sm_active",
            "Fraction of the last cycle the SMs had at least one warp resident (GPM SM_UTIL)",
            |m| m.sm_active,
        ),
        (
            "gpu_sm_occupancy",
            "Warps resident on the SMs as a fraction of the most they hold (GPM SM_OCCUPANCY)",
            |m| m.sm_occupancy,
        ),
        (
            "gpu_graphics_engine_active",
            "Fraction of the last cycle the graphics or compute engine was busy (GPM GRAPHICS_UTIL)",
            |m| m.graphics_active,
        ),
        (
            "gpu_tensor_active",
            "Fraction of the last cycle any tensor pipe was busy (GPM ANY_TENSOR_UTIL)",
            |m| m.tensor_active,
        ),
        (
            "gpu_dram_active",
            "Fraction of the last cycle the memory interface was busy (GPM DRAM_BW_UTIL)",
            |m| m.dram_active,
        ),
    ];
    for (name, help, read) in ratios {
        gauges(
            e,
            desc(name, help, Some("ratio")),
            per_device(
                gpus,
                unshared,
                move |g| g.gpm.as_ref().and_then(read),
                move |m| m.gpm.as_ref().and_then(read),
            ),
        )?;
    }
    gauges(
        e,
        desc(
            "gpu_pipe_active",
            "Fraction of the last cycle each arithmetic pipe was busy (GPM FP64/FP32/FP16/INTEGER_UTIL)",
            Some("ratio"),
        ),
        gpus.iter().filter(|g| g.up).flat_map(|g| {
            let m = g.gpm.as_ref();
            [
                ("fp64", m.and_then(|m| m.fp64_active)),
                ("fp32", m.and_then(|m| m.fp32_active)),
                ("fp16", m.and_then(|m| m.fp16_active)),
                ("integer", m.and_then(|m| m.integer_active)),
            ]
            .into_iter()
            .filter_map(move |(pipe, v)| Some((with(g, [("pipe", pipe)]), v?)))
        }),
    )?;
    for (name, help, tx, rx) in [
        (
            "gpu_pcie",
            "PCIe traffic over the last cycle (GPM PCIE_TX/RX_PER_SEC)",
            (|m: &GpmReadings| m.pcie_tx_bytes_per_second) as Read,
            (|m: &GpmReadings| m.pcie_rx_bytes_per_second) as Read,
        ),
        (
            "gpu_nvlink",
            "NVLink traffic over the last cycle, all links (GPM NVLINK_TOTAL_TX/RX_PER_SEC)",
            |m: &GpmReadings| m.nvlink_tx_bytes_per_second,
            |m: &GpmReadings| m.nvlink_rx_bytes_per_second,
        ),
    ] {
        gauges(
            e,
            desc(name, help, Some("bytes_per_second")),
            gpus.iter().filter(|g| g.up).flat_map(move |g| {
                let m = g.gpm.as_ref();
                [("tx", m.and_then(tx)), ("rx", m.and_then(rx))]
                    .into_iter()
                    .filter_map(move |(direction, v)| {
                        Some((with(g, [("direction", direction)]), v?))
                    })
            }),
        )?;
    }
    Ok(())
}

/// A MIG device's own labels; none for a GPU.
#[derive(Debug, Clone, Copy)]
pub(super) struct MigLabels<'a>(Option<&'a MigSample>);

impl EncodeLabelSet for MigLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        let Some(m) = self.0 else {
            return Ok(());
        };
        if let Some(gi) = m.gpu_instance {
            ("gpu_instance", gi).encode(encoder.encode_label())?;
        }
        if let Some(ci) = m.compute_instance {
            ("compute_instance", ci).encode(encoder.encode_label())?;
        }
        if let Some(p) = &m.profile {
            ("mig_profile", Text(p)).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// Every GPU that is up, read by `read_gpu` (one series per pod, as `per_gpu`), then every MIG
/// device of each (from `unshared`: one series each, without pod labels), read by `read_mig`.
pub(super) fn per_device<'a, V: 'a>(
    gpus: &'a [GpuView<'a>],
    unshared: &'a [GpuView<'a>],
    read_gpu: impl Fn(&'a GpuView<'a>) -> Option<V> + 'a,
    read_mig: impl Fn(&'a MigSample) -> Option<V> + 'a,
) -> impl Iterator<Item = (GpuLabels<'a, MigLabels<'a>>, V)> + 'a {
    let gpu_series = gpus
        .iter()
        .filter(|g| g.up)
        .filter_map(move |g| read_gpu(g).map(|v| (with(g, MigLabels(None)), v)));
    let mig_series = unshared
        .iter()
        .filter(|g| g.up)
        .flat_map(|g| g.sample.mig.iter().map(move |m| (g.sample.index, m)))
        .filter_map(move |(gpu, m)| {
            let labels = GpuLabels {
                gpu,
                uuid: &m.uuid,
                pod: None,
                extra: MigLabels(Some(m)),
            };
            read_mig(m).map(|v| (labels, v))
        });
    gpu_series.chain(mig_series)
}
