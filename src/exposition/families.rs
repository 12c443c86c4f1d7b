//! The gpuwatch families of the device table: each one's name, help, unit and type.

use super::table::Family;

const fn gauge_family(
    name: &'static str,
    help: &'static str,
    unit: Option<&'static str>,
) -> Family {
    Family {
        name,
        help,
        unit,
        counter: false,
    }
}

pub(super) static UTILIZATION: Family = gauge_family(
    "gpu_utilization",
    "Fraction of the last sample period a kernel was running",
    Some("ratio"),
);
pub(super) static MEMORY_UTILIZATION: Family = gauge_family(
    "gpu_memory_utilization",
    "Fraction of the last sample period device memory was read or written",
    Some("ratio"),
);
pub(super) static MEMORY_USED: Family =
    gauge_family("gpu_memory_used", "Device memory in use", Some("bytes"));
pub(super) static MEMORY_FREE: Family =
    gauge_family("gpu_memory_free", "Device memory free", Some("bytes"));
pub(super) static MEMORY_TOTAL: Family =
    gauge_family("gpu_memory_total", "Device memory in all", Some("bytes"));
pub(super) static TEMPERATURE: Family =
    gauge_family("gpu_temperature", "GPU core temperature", Some("celsius"));
pub(super) static POWER: Family = gauge_family("gpu_power", "Power draw", Some("watts"));
pub(super) static POWER_LIMIT: Family =
    gauge_family("gpu_power_limit", "Enforced power limit", Some("watts"));
pub(super) static ENERGY: Family = Family {
    name: "gpu_energy",
    help: "Energy consumed since the driver loaded",
    unit: Some("joules"),
    counter: true,
};
pub(super) static CLOCK: Family =
    gauge_family("gpu_clock", "Current clock frequency", Some("hertz"));
pub(super) static SM_ACTIVE: Family = gauge_family(
    "gpu_sm_active",
    "Fraction of the last cycle the SMs had at least one warp resident (GPM SM_UTIL)",
    Some("ratio"),
);
pub(super) static SM_OCCUPANCY: Family = gauge_family(
    "gpu_sm_occupancy",
    "Warps resident on the SMs as a fraction of the most they hold (GPM SM_OCCUPANCY)",
    Some("ratio"),
);
pub(super) static GRAPHICS_ACTIVE: Family = gauge_family(
    "gpu_graphics_engine_active",
    "Fraction of the last cycle the graphics or compute engine was busy (GPM GRAPHICS_UTIL)",
    Some("ratio"),
);
pub(super) static TENSOR_ACTIVE: Family = gauge_family(
    "gpu_tensor_active",
    "Fraction of the last cycle any tensor pipe was busy (GPM ANY_TENSOR_UTIL)",
    Some("ratio"),
);
pub(super) static DRAM_ACTIVE: Family = gauge_family(
    "gpu_dram_active",
    "Fraction of the last cycle the memory interface was busy (GPM DRAM_BW_UTIL)",
    Some("ratio"),
);
pub(super) static PIPE_ACTIVE: Family = gauge_family(
    "gpu_pipe_active",
    "Fraction of the last cycle each arithmetic pipe was busy (GPM FP64/FP32/FP16/INTEGER_UTIL)",
    Some("ratio"),
);
pub(super) static PCIE: Family = gauge_family(
    "gpu_pcie",
    "PCIe traffic over the last cycle (GPM PCIE_TX/RX_PER_SEC)",
    Some("bytes_per_second"),
);
pub(super) static NVLINK: Family = gauge_family(
    "gpu_nvlink",
    "NVLink traffic over the last cycle, all links (GPM NVLINK_TOTAL_TX/RX_PER_SEC)",
    Some("bytes_per_second"),
);
pub(super) static ECC_ERRORS: Family = Family {
    name: "gpu_ecc_errors",
    help: "ECC errors since the driver loaded (volatile counters)",
    unit: None,
    counter: true,
};
pub(super) static PROCESSES: Family =
    gauge_family("gpu_processes", "Running compute processes", None);
pub(super) static ENCODER: Family = gauge_family(
    "gpu_encoder_utilization",
    "Fraction of the last sample period the video encoder was busy",
    Some("ratio"),
);
pub(super) static DECODER: Family = gauge_family(
    "gpu_decoder_utilization",
    "Fraction of the last sample period the video decoder was busy",
    Some("ratio"),
);
pub(super) static PCIE_REPLAYS: Family = Family {
    name: "gpu_pcie_replays",
    help: "PCIe link-level retransmissions since the driver loaded",
    unit: None,
    counter: true,
};
pub(super) static PCIE_LINK_GENERATION: Family = gauge_family(
    "gpu_pcie_link_generation",
    "The PCIe link's generation: now, and the most it trains to",
    None,
);
pub(super) static PCIE_LINK_WIDTH: Family = gauge_family(
    "gpu_pcie_link_width",
    "The PCIe link's width in lanes: now, and the most it trains to",
    None,
);
pub(super) static MEMORY_RESERVED: Family = gauge_family(
    "gpu_memory_reserved",
    "Framebuffer memory the driver reserves for itself, neither used nor free",
    Some("bytes"),
);
pub(super) static MEMORY_TEMPERATURE: Family = gauge_family(
    "gpu_memory_temperature",
    "Memory (HBM or GDDR) temperature",
    Some("celsius"),
);
pub(super) static REMAPPED_ROWS: Family = gauge_family(
    "gpu_remapped_rows",
    "Memory rows remapped to spares since the GPU was made, by the errors that caused it",
    None,
);
pub(super) static ROW_REMAP_PENDING: Family = gauge_family(
    "gpu_row_remap_pending",
    "1 while a row remapping waits for a GPU reset",
    None,
);
pub(super) static ROW_REMAP_FAILED: Family = gauge_family(
    "gpu_row_remap_failed",
    "1 once a row could not be remapped: the GPU has run out of spare rows",
    None,
);
pub(super) static RETIRED_PAGES: Family = gauge_family(
    "gpu_retired_pages",
    "Memory pages retired (GPUs before Ampere), by the errors that caused it",
    None,
);
pub(super) static RETIRED_PAGES_PENDING: Family = gauge_family(
    "gpu_retired_pages_pending",
    "1 while pages wait for a GPU reset to be retired",
    None,
);
pub(super) static CLOCK_EVENTS: Family = Family {
    name: "gpu_clock_event",
    help: "Time the clocks were held below what was asked since the driver loaded, by reason",
    unit: Some("seconds"),
    counter: true,
};
pub(super) static NVLINK_ERRORS: Family = Family {
    name: "gpu_nvlink_errors",
    help: "NVLink errors over every link since the driver loaded, by kind",
    unit: None,
    counter: true,
};
pub(super) static NVLINK_DATA: Family = Family {
    name: "gpu_nvlink",
    help: "NVLink data over every link since the driver loaded (NVML's throughput counters)",
    unit: Some("bytes"),
    counter: true,
};
