//! `gpuwatch snapshot`: one sample, printed as a table or as JSON.

use std::process::ExitCode;
use std::sync::Arc;

use super::exit;
use crate::config::Config;
use crate::gpu::counters::SamplerCounters;
use crate::gpu::nvml::NvmlSource;
use crate::gpu::GpuSource;

pub fn run(config: &Config, json: bool) -> ExitCode {
    let mut source = NvmlSource::new(
        config.nvml.library.clone(),
        config.sampling.per_process_memory,
        Arc::new(SamplerCounters::default()),
    )
    .without_xid();
    let sample = source.sample();
    if !sample.nvml.up {
        eprintln!(
            "gpuwatch: NVML unavailable ({}): {}",
            sample.nvml.library,
            sample.nvml.error.as_deref().unwrap_or("unknown error")
        );
        return exit::UNAVAILABLE.into();
    }
    let mut snap = crate::gpu::Snapshot {
        seq: 1,
        timestamp: crate::time::now(),
        monotonic: crate::time::monotonic(),
        duration_seconds: 0.0,
        nvml: sample.nvml,
        gpus: sample.gpus,
        health_holds: None,
    };
    // One sample, and no XID events: health as the readings show it now, with nothing held
    // from before (the daemon's own view is `gpuwatch status`).
    let (mut judge, seed) = crate::gpu::health::Judge::new(config.health);
    drop(seed);
    judge.judge(&mut snap);
    if json {
        match serde_json::to_string_pretty(&snap) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("gpuwatch: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", crate::snapshot_table::table(&snap));
    }
    ExitCode::SUCCESS
}
