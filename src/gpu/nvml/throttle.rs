//! NVML's clock throttle reasons, as gpuwatch names them.

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::Device;

use super::GpuReader;
use crate::gpu::ThrottleReason;

/// NVML's throttle reason bits and the label values gpuwatch exports for them.
pub(super) const THROTTLE_REASONS: &[(ThrottleReasons, &str)] = &[
    (ThrottleReasons::GPU_IDLE, "gpu_idle"),
    (
        ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
        "applications_clocks_setting",
    ),
    (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
    (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    (ThrottleReasons::SYNC_BOOST, "sync_boost"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
    (
        ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        "hw_power_brake_slowdown",
    ),
    (
        ThrottleReasons::DISPLAY_CLOCK_SETTING,
        "display_clock_setting",
    ),
];

impl GpuReader<'_> {
    /// Each throttle reason GPU `d` supports (asked once), and whether it holds the clocks now;
    /// none where either cannot be read.
    pub(super) fn throttle_reasons(&mut self, d: &Device<'static>) -> Vec<ThrottleReason> {
        let supported = self.supported_throttle_reasons(d);
        let current = self.get("throttle_reasons", || d.current_throttle_reasons());
        match (supported, current) {
            (Some(s), Some(c)) => THROTTLE_REASONS
                .iter()
                .filter(|(bit, _)| s.contains(*bit))
                .map(|(bit, reason)| ThrottleReason {
                    reason,
                    active: c.contains(*bit),
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}
