//! The GPM (profiling) families of Hopper and later, and the labels that make a MIG device a
//! device of its own beside its GPU.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};

use super::{labels, with, GpuView, MigView};
use crate::gpu::gpm::GpmReadings;
use crate::gpu::MigSample;
use crate::metrics::encode::*;
use crate::metrics::Text;

/// The GPM families (Hopper and later): support per GPU, then each metric where it is known.
pub(super) fn encode_gpm<'a>(
    e: &mut DescriptorEncoder,
    unshared: &'a [GpuView<'a>],
    gpus: &'a [GpuView<'a>],
    migs: &'a [MigView<'a>],
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
                migs,
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
        per_device(
            gpus,
            migs,
            |g| g.gpm.as_ref().map(pipes),
            |m| m.gpm.as_ref().map(pipes),
        )
        .flat_map(|(labels, pipes)| {
            pipes.into_iter().filter_map(move |(pipe, v)| {
                let labels = GpuLabels {
                    gpu: labels.gpu,
                    uuid: labels.uuid,
                    pod: labels.pod,
                    extra: (labels.extra, [("pipe", pipe)]),
                };
                Some((labels, v?))
            })
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

/// Each arithmetic pipe's activity.
fn pipes(m: &GpmReadings) -> [(&'static str, Option<f64>); 4] {
    [
        ("fp64", m.fp64_active),
        ("fp32", m.fp32_active),
        ("fp16", m.fp16_active),
        ("integer", m.integer_active),
    ]
}

/// A MIG device's own labels (`gpu_instance`, `compute_instance`, `mig_profile`); none for a
/// GPU.
#[derive(Debug, Clone, Copy)]
pub struct MigLabels<'a>(pub Option<&'a MigSample>);

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

/// Every GPU that is up, read by `read_gpu`, then every MIG device of each, read by `read_mig`
/// (each one series per pod holding it, as `per_gpu`).
pub(super) fn per_device<'a, V: 'a>(
    gpus: &'a [GpuView<'a>],
    migs: &'a [MigView<'a>],
    read_gpu: impl Fn(&'a GpuView<'a>) -> Option<V> + 'a,
    read_mig: impl Fn(&'a MigSample) -> Option<V> + 'a,
) -> impl Iterator<Item = (GpuLabels<'a, MigLabels<'a>>, V)> + 'a {
    let gpu_series = gpus
        .iter()
        .filter(|g| g.up)
        .filter_map(move |g| read_gpu(g).map(|v| (with(g, MigLabels(None)), v)));
    let mig_series = migs.iter().filter_map(move |v| {
        let labels = GpuLabels {
            gpu: v.gpu.index,
            uuid: &v.mig.uuid,
            pod: v.pod.map(PodLabels::of),
            extra: MigLabels(Some(v.mig)),
        };
        read_mig(v.mig).map(|x| (labels, x))
    });
    gpu_series.chain(mig_series)
}
