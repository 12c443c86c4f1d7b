//! The one table of device readings. Each row is one reading of a GPU sample: how to read it
//! (from the GPU, and from a MIG device where it has its own), its gpuwatch family (name, unit,
//! type, and the row's own label in a family of several readings), its scope under gpuwatch's
//! names, and its dcgm-exporter twin with the unit conversion. Both naming modes are generated
//! from it: `encode` here for gpuwatch's, `dcgm::encode` for dcgm-exporter's. Adding a field is
//! one row, plus its NVML read.
//!
//! A few families are not one reading per device: identity, per-reason, per-XID and
//! per-process series. They are rows too (`Row::Series`), at their place in the output.
//!
//! The rows themselves are in `rows.rs`; this module holds what a row is, and the encoder.

mod rows;

pub use rows::TABLE;

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};

pub use super::value::Value;
use super::{MigLabels, Scrape};
use crate::gpu::{GpuSample, MigSample};
use crate::kubernetes::PodRef;
use crate::metrics::encode::*;

/// A gpuwatch family: the rows that name it, next to each other in the table, are its series.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub unit: Option<&'static str>,
    pub counter: bool,
}

/// A reading's dcgm-exporter name, help and unit. Every DCGM family is typed gauge: in
/// OpenMetrics a counter's samples would end in `_total`, and queries ask for the bare name.
#[derive(Debug)]
pub struct Twin {
    pub name: &'static str,
    pub help: &'static str,
    /// From the reading's base unit to DCGM's (percent, MiB, MHz, mJ).
    pub convert: fn(Value) -> Value,
    /// Its place among the DCGM families, which keep the order they have always had; a new
    /// twin takes the next number.
    pub order: u8,
}

/// Which devices a reading has series for under gpuwatch's names. Under DCGM's, a GPU in MIG
/// mode is its GPU instances: each reads the row's MIG read on its first MIG device where
/// there is one, else its GPU's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Each GPU that is up.
    Gpu,
    /// Each GPU that is up, then each MIG device, read on its own.
    Device,
}

/// How a reading is read from a GPU's sample, and from a MIG device's.
pub type ReadGpu = fn(&GpuSample) -> Option<Value>;
pub type ReadMig = fn(&MigSample) -> Option<Value>;

pub struct Reading {
    /// `None` for a reading only dcgm-exporter's names show.
    pub family: Option<&'static Family>,
    /// The row's own label in its family (`clock="sm"`).
    pub label: Option<(&'static str, &'static str)>,
    pub scope: Scope,
    pub gpu: ReadGpu,
    pub mig: Option<ReadMig>,
    pub dcgm: Option<Twin>,
}

/// Encodes a family whose series are not one reading per device.
pub type Series = fn(&mut DescriptorEncoder, &Scrape<'_>) -> Result<(), fmt::Error>;

pub enum Row {
    Reading(Reading),
    Series(Series),
}

/// One row of a GPM reading: per device under gpuwatch's names, unless `scope` says the GPU.
pub(super) const fn gpm_row(
    family: &'static Family,
    label: Option<(&'static str, &'static str)>,
    scope: Scope,
    read: (ReadGpu, ReadMig),
    dcgm: Option<Twin>,
) -> Row {
    Row::Reading(Reading {
        family: Some(family),
        label,
        scope,
        gpu: read.0,
        mig: Some(read.1),
        dcgm,
    })
}

/// A reading of the GPU alone: one series per GPU that is up, and under DCGM's names its GPU
/// instances show the GPU's value.
pub(super) const fn gpu_row(
    family: &'static Family,
    label: Option<(&'static str, &'static str)>,
    gpu: ReadGpu,
    dcgm: Option<Twin>,
) -> Row {
    Row::Reading(Reading {
        family: Some(family),
        label,
        scope: Scope::Gpu,
        gpu,
        mig: None,
        dcgm,
    })
}

pub(super) const fn twin(
    name: &'static str,
    help: &'static str,
    convert: fn(Value) -> Value,
    order: u8,
) -> Option<Twin> {
    Some(Twin {
        name,
        help,
        convert,
        order,
    })
}

/// The readings with a DCGM twin, in the DCGM families' order: sorted once, not per scrape.
pub fn twins() -> &'static [(&'static Reading, &'static Twin)] {
    static TWINS: std::sync::OnceLock<Vec<(&'static Reading, &'static Twin)>> =
        std::sync::OnceLock::new();
    TWINS.get_or_init(|| {
        let mut out: Vec<_> = TABLE
            .iter()
            .filter_map(|row| match row {
                Row::Reading(r) => Some((r, r.dcgm.as_ref()?)),
                Row::Series(_) => None,
            })
            .collect();
        out.sort_by_key(|(_, t)| t.order);
        out
    })
}

/// The row's own label, if any.
struct Own(Option<(&'static str, &'static str)>);

impl EncodeLabelSet for Own {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        match self.0 {
            Some(label) => label.encode(encoder.encode_label()),
            None => Ok(()),
        }
    }
}

/// Encodes every device family under gpuwatch's names.
pub(super) fn encode(e: &mut DescriptorEncoder, s: &Scrape<'_>) -> Result<(), fmt::Error> {
    let same_family = |a: &Row, b: &Row| match (a, b) {
        (Row::Reading(a), Row::Reading(b)) => match (a.family, b.family) {
            (Some(x), Some(y)) => std::ptr::eq(x, y),
            _ => false,
        },
        _ => false,
    };
    for rows in TABLE.chunk_by(same_family) {
        let readings: Vec<&'static Reading> = rows
            .iter()
            .filter_map(|r| match r {
                Row::Reading(r) => Some(r),
                Row::Series(_) => None,
            })
            .collect();
        let family = match (rows, readings.first()) {
            // A family of series: one row of its own.
            ([Row::Series(series)], _) => {
                series(e, s)?;
                continue;
            }
            (
                _,
                Some(Reading {
                    family: Some(f), ..
                }),
            ) => *f,
            // A reading only dcgm-exporter's names show.
            _ => continue,
        };
        let series = family_series(&readings, s);
        let d = desc(family.name, family.help, family.unit);
        if family.counter {
            counters(e, d, series)?;
        } else {
            gauges(e, d, series)?;
        }
    }
    Ok(())
}

/// The series of one family's readings: device by device, each device's readings in row order.
fn family_series<'a>(
    readings: &[&'static Reading],
    s: &Scrape<'a>,
) -> Vec<(GpuLabels<'a, (MigLabels<'a>, Own)>, Value)> {
    let mut out = Vec::new();
    for g in s.gpus.iter().filter(|g| g.up) {
        for r in readings {
            if let Some(v) = (r.gpu)(g.sample) {
                out.push((g.labels_with((MigLabels(None), Own(r.label))), v));
            }
        }
    }
    if readings.first().is_some_and(|r| r.scope == Scope::Device) {
        for v in s.migs {
            for r in readings {
                if let Some(x) = r.mig.and_then(|read| read(v.mig)) {
                    let labels = GpuLabels {
                        gpu: v.gpu.index,
                        uuid: &v.mig.uuid,
                        pod: v.pod.map(PodRef::labels),
                        hpc_job: v.job,
                        extra: (MigLabels(Some(v.mig)), Own(r.label)),
                    };
                    out.push((labels, x));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dcgm_twins_are_numbered_once_each_in_order() {
        let orders: Vec<u8> = twins().iter().map(|(_, t)| t.order).collect();
        let want: Vec<u8> = (1..=orders.len() as u8).collect();
        assert_eq!(orders, want);
        let mut names: Vec<&str> = twins().iter().map(|(_, t)| t.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), orders.len(), "a DCGM name twice");
    }

    #[test]
    fn the_rows_of_a_family_are_next_to_each_other_and_agree_on_their_scope() {
        // A family is its name and unit (`gpu_nvlink` in bytes per second and in bytes are two).
        let mut seen: Vec<(&str, Option<&str>)> = Vec::new();
        let mut last: Option<&Family> = None;
        for row in TABLE {
            let Row::Reading(r) = row else {
                last = None;
                continue;
            };
            let Some(f) = r.family else { continue };
            if !last.is_some_and(|l| std::ptr::eq(l, f)) {
                let key = (f.name, f.unit);
                assert!(!seen.contains(&key), "{key:?} is split in the table");
                seen.push(key);
            }
            last = Some(f);
        }
        for row in TABLE {
            let Row::Reading(r) = row else { continue };
            if r.scope == Scope::Device {
                assert!(
                    r.mig.is_some(),
                    "{:?}: a per-device row reads MIG devices",
                    r.family
                );
            }
        }
    }
}
