//! `gpuwatch snapshot`: one sample of every GPU of the node (NVIDIA's and AMD's), printed as a
//! table or as JSON.

use std::process::ExitCode;

use super::exit;
use crate::config::Config;

pub fn run(config: &Config, json: bool) -> ExitCode {
    let sample = crate::gpu::sampler::sample_once(config);
    // A node with no NVIDIA driver but other GPUs is whole without NVML.
    if !sample.nvml.complete() {
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
