//! The readings a GPU may lack altogether: the video engines and the PCIe link (`known.rs`
//! says how often the link is read). (The field values, in `fields.rs`, are recorded the same
//! way.)
//! "Not supported" (or a library without the call) is recorded once per GPU and reading, and
//! the reading is not asked for again until NVML is initialised anew.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;

use super::GpuReader;

/// What `engines_and_links` read of one GPU.
pub(super) struct Links {
    pub(super) encoder: Option<u32>,
    pub(super) decoder: Option<u32>,
    pub(super) pcie_link: crate::gpu::PcieLink,
}

impl GpuReader<'_> {
    /// A reading a GPU may lack altogether: "not supported", or a library without the call, is
    /// recorded once (`GpuSample::unsupported`) and the reading is not asked for again; other
    /// failures count as `get`'s do.
    pub(super) fn optional<T>(
        &mut self,
        field: &'static str,
        call: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.lost.is_some() || self.src.unsupported.contains(&(self.index, field)) {
            return None;
        }
        match call() {
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                self.src.unsupported.insert((self.index, field));
                None
            }
            read => self.get(field, || read),
        }
    }

    /// The video engines' utilization (percent) and the PCIe link of GPU `d`.
    pub(super) fn engines_and_links(&mut self, d: &Device<'static>) -> Links {
        let encoder = self.optional("encoder_utilization", || d.encoder_utilization());
        let encoder = self.check("encoder_utilization", encoder.map(|u| u.utilization), |v| {
            v <= 100
        });
        let decoder = self.optional("decoder_utilization", || d.decoder_utilization());
        let decoder = self.check("decoder_utilization", decoder.map(|u| u.utilization), |v| {
            v <= 100
        });
        let pcie_link = self.pcie_link(d);
        Links {
            encoder,
            decoder,
            pcie_link,
        }
    }

    /// Every reading this GPU does not support, in order.
    pub(super) fn unsupported(&self) -> Vec<&'static str> {
        crate::gpu::unsupported_of(&self.src.unsupported, self.index)
    }
}
