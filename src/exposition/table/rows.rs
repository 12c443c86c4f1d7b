//! The rows of the table: every device family, in the order gpuwatch's names show them.

use super::super::families::*;
use super::super::series::{
    gpm_supported, health, info, process_memory, throttle, unsupported, up, xid_errors,
};
use super::super::value::{flag, float, int, kib, mega, mib, micro, milli, percent, rounded, same};
use super::{gpm_row, gpu_row, twin, Family, ReadGpu, Reading, Row, Scope, Value};
use crate::gpu::gpm::GpmReadings;
use crate::gpu::{GpuSample, MigSample};

/// A GPM reading of a GPU, and of a MIG device (its GPU instance's), in Prometheus units.
macro_rules! gpm {
    ($field:ident) => {
        (
            |g: &GpuSample| float(g.gpm.as_ref().and_then(|m: &GpmReadings| m.$field)),
            |m: &MigSample| float(m.gpm.as_ref().and_then(|m: &GpmReadings| m.$field)),
        )
    };
}

/// Every device family, in the order gpuwatch's names show them.
pub static TABLE: &[Row] = &[
    Row::Series(info),
    Row::Series(up),
    Row::Series(health),
    gpu_row(
        &UTILIZATION,
        None,
        |g| float(g.utilization_ratio),
        twin("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", percent, 1),
    ),
    gpu_row(
        &MEMORY_UTILIZATION,
        None,
        |g| float(g.memory_utilization_ratio),
        twin("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", percent, 2),
    ),
    Row::Reading(Reading {
        family: Some(&MEMORY_USED),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.memory_used_bytes),
        mig: Some(|m| int(m.memory_used_bytes)),
        dcgm: twin("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", mib, 3),
    }),
    Row::Reading(Reading {
        family: Some(&MEMORY_FREE),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.memory_free_bytes),
        mig: Some(|m| int(m.memory_free_bytes())),
        dcgm: twin("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", mib, 4),
    }),
    Row::Reading(Reading {
        family: Some(&MEMORY_TOTAL),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.memory_total_bytes),
        mig: Some(|m| int(m.memory_total_bytes)),
        dcgm: None,
    }),
    gpu_row(
        &MEMORY_RESERVED,
        None,
        |g| int(g.memory_reserved_bytes),
        twin(
            "DCGM_FI_DEV_FB_RESERVED",
            "Framebuffer memory reserved (in MiB).",
            mib,
            28,
        ),
    ),
    gpu_row(
        &TEMPERATURE,
        None,
        |g| float(g.temperature_celsius),
        twin("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", rounded, 5),
    ),
    gpu_row(
        &MEMORY_TEMPERATURE,
        None,
        |g| float(g.memory_temperature_celsius),
        twin("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", rounded, 29),
    ),
    gpu_row(
        &POWER,
        None,
        |g| float(g.power_watts),
        twin("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", same, 6),
    ),
    gpu_row(
        &POWER_LIMIT,
        None,
        |g| float(g.power_limit_watts),
        None,
    ),
    gpu_row(
        &ENERGY,
        None,
        |g| float(g.energy_joules),
        twin(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since boot (in mJ).",
            milli,
            7,
        ),
    ),
    gpu_row(
        &CLOCK,
        Some(("clock", "sm")),
        |g| float(g.sm_clock_hertz),
        twin("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", mega, 8),
    ),
    gpu_row(
        &CLOCK,
        Some(("clock", "memory")),
        |g| float(g.memory_clock_hertz),
        twin("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", mega, 9),
    ),
    Row::Series(throttle),
    Row::Series(gpm_supported),
    gpm_row(
        &SM_ACTIVE,
        None,
        Scope::Device,
        gpm!(sm_active),
        twin(
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            same,
            14,
        ),
    ),
    gpm_row(
        &SM_OCCUPANCY,
        None,
        Scope::Device,
        gpm!(sm_occupancy),
        twin(
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "The ratio of number of warps resident on an SM.",
            same,
            15,
        ),
    ),
    gpm_row(
        &GRAPHICS_ACTIVE,
        None,
        Scope::Device,
        gpm!(graphics_active),
        twin(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
            same,
            13,
        ),
    ),
    gpm_row(
        &TENSOR_ACTIVE,
        None,
        Scope::Device,
        gpm!(tensor_active),
        twin(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            same,
            16,
        ),
    ),
    gpm_row(
        &DRAM_ACTIVE,
        None,
        Scope::Device,
        gpm!(dram_active),
        twin(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            same,
            17,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "fp64")),
        Scope::Device,
        gpm!(fp64_active),
        twin(
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "Ratio of cycles the fp64 pipes are active.",
            same,
            18,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "fp32")),
        Scope::Device,
        gpm!(fp32_active),
        twin(
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "Ratio of cycles the fp32 pipes are active.",
            same,
            19,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "fp16")),
        Scope::Device,
        gpm!(fp16_active),
        twin(
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "Ratio of cycles the fp16 pipes are active.",
            same,
            20,
        ),
    ),
    gpm_row(
        &PIPE_ACTIVE,
        Some(("pipe", "integer")),
        Scope::Device,
        gpm!(integer_active),
        None,
    ),
    gpm_row(
        &PCIE,
        Some(("direction", "tx")),
        Scope::Gpu,
        gpm!(pcie_tx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            same,
            21,
        ),
    ),
    gpm_row(
        &PCIE,
        Some(("direction", "rx")),
        Scope::Gpu,
        gpm!(pcie_rx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            same,
            22,
        ),
    ),
    gpm_row(
        &NVLINK,
        Some(("direction", "tx")),
        Scope::Gpu,
        gpm!(nvlink_tx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            same,
            23,
        ),
    ),
    gpm_row(
        &NVLINK,
        Some(("direction", "rx")),
        Scope::Gpu,
        gpm!(nvlink_rx_bytes_per_second),
        twin(
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            same,
            24,
        ),
    ),
    gpu_row(
        &ECC_ERRORS,
        Some(("kind", "corrected")),
        |g| int(g.ecc_corrected),
        twin(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Total number of single-bit volatile ECC errors.",
            same,
            11,
        ),
    ),
    gpu_row(
        &ECC_ERRORS,
        Some(("kind", "uncorrected")),
        |g| int(g.ecc_uncorrected),
        twin(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit volatile ECC errors.",
            same,
            12,
        ),
    ),
    Row::Series(xid_errors),
    // dcgm-exporter's XID gauge is the last XID seen (0 for none); gpuwatch counts them by code.
    Row::Reading(Reading {
        family: None,
        label: None,
        scope: Scope::Gpu,
        gpu: |g| Some(Value::Int(g.last_xid.unwrap_or(0) as i64)),
        mig: None,
        dcgm: twin(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            same,
            10,
        ),
    }),
    Row::Reading(Reading {
        family: Some(&PROCESSES),
        label: None,
        scope: Scope::Device,
        gpu: |g| int(g.processes),
        mig: Some(|m| int(m.processes)),
        dcgm: None,
    }),
    Row::Series(process_memory),
    gpu_row(
        &ENCODER,
        None,
        |g| float(g.encoder_utilization_ratio),
        twin("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", percent, 25),
    ),
    gpu_row(
        &DECODER,
        None,
        |g| float(g.decoder_utilization_ratio),
        twin("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", percent, 26),
    ),
    gpu_row(
        &PCIE_REPLAYS,
        None,
        |g| int(g.pcie_replays),
        twin(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "Total number of PCIe retries.",
            same,
            27,
        ),
    ),
    pcie_link(&PCIE_LINK_GENERATION, "current", |g| int(g.pcie_link.generation)),
    pcie_link(&PCIE_LINK_GENERATION, "max", |g| int(g.pcie_link.max_generation)),
    pcie_link(&PCIE_LINK_WIDTH, "current", |g| int(g.pcie_link.width)),
    pcie_link(&PCIE_LINK_WIDTH, "max", |g| int(g.pcie_link.max_width)),
    repair(
        &REMAPPED_ROWS,
        Some(("cause", "correctable")),
        |g| int(g.memory_repair.remapped_correctable),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        30,
    ),
    repair(
        &REMAPPED_ROWS,
        Some(("cause", "uncorrectable")),
        |g| int(g.memory_repair.remapped_uncorrectable),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        31,
    ),
    repair(
        &ROW_REMAP_PENDING,
        None,
        |g| flag(g.memory_repair.remap_pending),
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Whether remapping of rows is pending",
        32,
    ),
    repair(
        &ROW_REMAP_FAILED,
        None,
        |g| flag(g.memory_repair.remap_failed),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        33,
    ),
    repair(
        &RETIRED_PAGES,
        Some(("cause", "single_bit")),
        |g| int(g.memory_repair.retired_single_bit),
        "DCGM_FI_DEV_RETIRED_SBE",
        "Total number of retired pages due to single-bit errors.",
        34,
    ),
    repair(
        &RETIRED_PAGES,
        Some(("cause", "double_bit")),
        |g| int(g.memory_repair.retired_double_bit),
        "DCGM_FI_DEV_RETIRED_DBE",
        "Total number of retired pages due to double-bit errors.",
        35,
    ),
    repair(
        &RETIRED_PAGES_PENDING,
        None,
        |g| flag(g.memory_repair.retired_pending),
        "DCGM_FI_DEV_RETIRED_PENDING",
        "Total number of pages pending retirement.",
        36,
    ),
    clock_event(
        "power",
        |g| float(g.clock_events.power),
        "DCGM_FI_DEV_POWER_VIOLATION",
        "Throttling duration due to power constraints (in us).",
        37,
    ),
    clock_event(
        "thermal",
        |g| float(g.clock_events.thermal),
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "Throttling duration due to thermal constraints (in us).",
        38,
    ),
    clock_event(
        "sync_boost",
        |g| float(g.clock_events.sync_boost),
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        "Throttling duration due to sync-boost constraints (in us).",
        39,
    ),
    clock_event(
        "board_limit",
        |g| float(g.clock_events.board_limit),
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "Throttling duration due to board limit constraints (in us).",
        40,
    ),
    clock_event(
        "low_utilization",
        |g| float(g.clock_events.low_utilization),
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        "Throttling duration due to low utilization (in us).",
        41,
    ),
    clock_event(
        "reliability",
        |g| float(g.clock_events.reliability),
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "Throttling duration due to reliability constraints (in us).",
        42,
    ),
    nvlink_error(
        "crc_flit",
        |g| int(g.nvlink.crc_flit_errors),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "Total number of NVLink flow-control CRC errors.",
        43,
    ),
    nvlink_error(
        "crc_data",
        |g| int(g.nvlink.crc_data_errors),
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "Total number of NVLink data CRC errors.",
        44,
    ),
    nvlink_error(
        "replay",
        |g| int(g.nvlink.replay_errors),
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "Total number of NVLink retries.",
        45,
    ),
    nvlink_error(
        "recovery",
        |g| int(g.nvlink.recovery_errors),
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        46,
    ),
    gpu_row(
        &NVLINK_DATA,
        Some(("direction", "tx")),
        |g| int(g.nvlink.tx_bytes),
        None,
    ),
    gpu_row(
        &NVLINK_DATA,
        Some(("direction", "rx")),
        |g| int(g.nvlink.rx_bytes),
        None,
    ),
    // dcgm-exporter's one NVLink counter is both directions over every link, in KiB as NVML
    // counts them.
    Row::Reading(Reading {
        family: None,
        label: None,
        scope: Scope::Gpu,
        gpu: |g| int(g.nvlink.tx_bytes?.checked_add(g.nvlink.rx_bytes?)),
        mig: None,
        dcgm: twin(
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "Total number of NVLink bandwidth counters for all lanes",
            kib,
            47,
        ),
    }),
    Row::Series(unsupported),
];

/// A reading of how the GPU repaired its memory, with its DCGM twin.
const fn repair(
    family: &'static Family,
    label: Option<(&'static str, &'static str)>,
    gpu: ReadGpu,
    name: &'static str,
    help: &'static str,
    order: u8,
) -> Row {
    gpu_row(family, label, gpu, twin(name, help, same, order))
}

/// The seconds the clocks were held down for one reason; DCGM counts microseconds.
const fn clock_event(
    reason: &'static str,
    gpu: ReadGpu,
    name: &'static str,
    help: &'static str,
    order: u8,
) -> Row {
    gpu_row(
        &CLOCK_EVENTS,
        Some(("reason", reason)),
        gpu,
        twin(name, help, micro, order),
    )
}

/// One kind of NVLink error, over every link.
const fn nvlink_error(
    kind: &'static str,
    gpu: ReadGpu,
    name: &'static str,
    help: &'static str,
    order: u8,
) -> Row {
    gpu_row(
        &NVLINK_ERRORS,
        Some(("kind", kind)),
        gpu,
        twin(name, help, same, order),
    )
}

/// One side of the PCIe link (`which="current"` or `"max"`); dcgm-exporter has no such field.
const fn pcie_link(family: &'static Family, which: &'static str, gpu: ReadGpu) -> Row {
    gpu_row(family, Some(("which", which)), gpu, None)
}
