//! A fake `libnvidia-ml.so.1` for gpuwatch's tests and demo.
//!
//! This crate builds `libgpuwatch_fake_nvml.so`, a C library that exports the NVML functions
//! gpuwatch calls, with NVML's real signatures, units and return codes. gpuwatch loads it through
//! nvml-wrapper exactly as it loads the real driver, so every test runs the real GPU code path.
//! The values it answers come from a scenario file named by the `GPUWATCH_FAKE_NVML_SCENARIO`
//! environment variable, read once, at the first `nvmlInit`.
//!
//! # Scenario format (TOML)
//!
//! ```toml
//! driver_version = "550.54.15"        # default; nvml_version defaults to "12.<driver>"
//! cuda_driver_version = 12040         # as NVML reports it: 12.4
//! time = { speed = 1.0, start = "0s" } # simulated seconds per wall second; 0 freezes time at start
//! unknown_field_ids = [185, 186]      # field ids this driver predates: NOT_SUPPORTED on every GPU
//!
//! [[gpu]]                             # one table per GPU, index = position
//! name = "NVIDIA H100 80GB HBM3"      # default
//! uuid = "GPU-..."                    # default: GPU-00000000-0000-4000-8000-<index+1>
//! pci_bus_id = "00000000:18:00.0"     # default: 0x18 + 0x10 × index
//! memory_total_mib = 81559            # default
//! power_limit_watts = 700             # default
//! utilization = 37                    # percent, as NVML reports it (so 150 or 4294967295 are possible)
//! memory_utilization = { kind = "constant", value = 12 }
//! memory_used_mib = { kind = "ramp", from = 0, to = 60000, over = "10m", start = "1m" }
//! temperature = { kind = "bursts", busy = 71, idle = 38, period = "2m", duty = 0.75 }
//! power_watts = { kind = "trace", file = "power.csv" }  # "seconds,value" lines, relative to the scenario
//! sm_clock_mhz = 1980                 # also memory_clock_mhz (2619)
//! processes = 2                       # compute processes; pids are 10000 + 100 × gpu + n
//! pids_file = "gpu0.pids"              # or: these pids (whitespace apart), read at every call
//! process_name = "python3"             # strings may carry raw bytes as \\xHH (not UTF-8: "\\xff")
//! ecc_corrected = 0                   # also ecc_uncorrected
//! encoder_utilization = 0             # percent; also decoder_utilization
//! pcie_replays = 0                    # PCIe replays since the driver loaded
//! pcie_link_generation = 5            # the link now (defaults: the maximum); also pcie_link_width
//! pcie_link_max_generation = 5        # the most it trains to (5); also pcie_link_max_width (16)
//! memory_temperature = 45             # °C, a field value (default 45)
//! memory_reserved_mib = 0             # driver-reserved framebuffer, neither used nor free
//! remapped_rows_correctable = 0       # also remapped_rows_uncorrectable; row_remap_pending and
//!                                     # row_remap_failed are 0 or 1
//! retired_pages = { single_bit = 0, double_bit = 0, pending = 0 }  # given: the GPU retires
//!                                     # pages (before Ampere); absent: NOT_SUPPORTED
//! # Readings with a field-value twin (power, its limit, energy, ECC totals, violation counters,
//! # PCIe replays, retired pages) answer the same through nvmlDeviceGetFieldValues.
//! clock_event_seconds = { power = 0, thermal = 0 }  # seconds held down since the driver
//!                                     # loaded; also sync_boost, board_limit, low_utilization,
//!                                     # reliability
//! nvlink_links = 18                   # default; 0: no NVLink, its fields are NOT_SUPPORTED
//! nvlink_errors = { crc_flit = 0, crc_data = 0, replay = 0, recovery = 0 }  # every link
//! nvlink_tx_kib = 0                   # NVLink data since the driver loaded, KiB; also nvlink_rx_kib
//! throttle_supported = ["gpu_idle", "sw_power_cap", ...]  # default: every reason
//! throttle_active = ["sw_power_cap"]
//! mig_devices = ["MIG-..."]            # MIG devices (1g.10gb), by UUID: MIG mode is on when there are any
//! [[gpu.mig]]                         # or in full, one table per MIG device:
//! profile = "3g.40gb"                 # its name is "<GPU name> MIG 3g.40gb"; 40 GiB unless
//! uuid = "MIG-..."                    # memory_total_mib says otherwise
//! gpu_instance = 1                    # default: its position + 1; compute_instance = 0
//! memory_used_mib = 10240             # also processes = 2, and gpm = { ... } per GPU instance
//! from = "0s"                         # it exists from `from` until `until`: a layout change
//! until = "1h"                        # In MIG mode the GPU's utilization is NOT_SUPPORTED.
//! [gpu.gpm]                           # GPM (Hopper and later); without it the GPU has no GPM
//! sm_active = 37                      # percent, as GPM reports: also sm_occupancy,
//!                                     # graphics_active, tensor_active, dram_active, fp64_active,
//!                                     # fp32_active, fp16_active, integer_active; one not
//!                                     # named answers NOT_SUPPORTED, as a driver's may
//! pcie_tx_mib_per_second = 100        # MiB/s: also pcie_rx_, nvlink_tx_, nvlink_rx_mib_per_second
//!
//! [[fault]]
//! at = "90s"                          # simulated time the fault begins
//! until = "2m"                        # optional end; omitted means forever
//! gpu = 1                             # optional; omitted means every GPU
//! kind = "lost"                       # every call answers NVML_ERROR_GPU_IS_LOST
//! # kind = "lost", fields = ["utilization"]  only those calls: lost partway through a cycle
//! # kind = "not_supported", fields = ["power", "ecc"]  answers NVML_ERROR_NOT_SUPPORTED
//! # kind = "fails", fields = ["gpm"]   answers NVML_ERROR_UNKNOWN
//! #   fields: identity, events, utilization, memory, temperature, power, power_limit,
//! #           energy, clocks, throttle, ecc, processes, gpm, mig (MIG device handles),
//! #           mig_mode, encoder, decoder, pcie_replays, pcie_link, memory_temperature,
//! #           remapped_rows, retired_pages, clock_events, nvlink_errors, nvlink_bytes
//! # kind = "delay", delay = "10s"     every device call sleeps (wall clock) first
//! # kind = "xid", xid = 79            one critical XID event, delivered to every event set
//! # kind = "init_failure"             nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED
//! ```
//!
//! Every series is a number (constant), or a table with `kind` = `constant`, `ramp`, `bursts`,
//! `trace`, or `live` (`{ kind = "live", file = "u.txt" }`: the number in the file, read at every
//! call, for tests that drive a reading and await its effect). Energy is the exact integral of
//! power since simulated time 0 (for `live` power, the current value times the elapsed time).
//!
//! GPM metrics between two samples are each series' mean over the interval between them (the
//! integral over the interval divided by its length), as the driver computes them from its
//! counters; samples are allocated and freed by the caller, as with the driver.
//!
//! Time starts at the first `nvmlInit` call (a failed one too) and runs with the wall clock
//! times `time.speed`, so hours of a scenario can pass in seconds.

pub mod amd;
pub mod calls;
pub mod ffi;
pub mod scenario;

pub use scenario::{Scenario, ScenarioError};

/// The environment variable that names the scenario file.
pub const SCENARIO_ENV: &str = "GPUWATCH_FAKE_NVML_SCENARIO";

/// The scenario `gpuwatch demo` runs: four GPUs, two training in bursts, one steady, one
/// going idle.
pub const DEMO_SCENARIO: &str = include_str!("../scenarios/demo.toml");

/// The file name of the built library.
pub const LIBRARY_FILE: &str = "libgpuwatch_fake_nvml.so";
