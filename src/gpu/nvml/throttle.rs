//! NVML's clock throttle reasons, as gpuwatch names them.

use nvml_wrapper::bitmasks::device::ThrottleReasons;

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
