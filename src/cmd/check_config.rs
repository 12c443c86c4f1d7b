//! `gpuwatch check-config`: validates a config file, naming every bad key. When a rule judges a
//! GPM metric (`sm_active`, `tensor_active`, `dram_active`), it also asks this node's NVML
//! whether its GPUs have GPM, and warns when they do not: such a rule sees unknown data there,
//! which counts as busy, so it never acts.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::Config;
use crate::gpu::counters::SamplerCounters;
use crate::gpu::nvml::NvmlSource;
use crate::gpu::GpuSource;

pub fn run(path: &Path) -> ExitCode {
    // The certificates and keys are loaded as the daemon loads them at start.
    let loaded = crate::cloud::load_config(path)
        .and_then(|config| crate::http::tls::load(config.server.web.as_ref()).map(|_| config));
    match loaded {
        Ok(config) => {
            for warning in config.warnings.iter().cloned().chain(gpm_warnings(&config)) {
                eprintln!("config: {}: warning: {warning}", path.display());
            }
            println!("config: {}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::config_failure(&e),
    }
}

/// One warning per rule on a GPM metric that this node's GPUs cannot serve.
fn gpm_warnings(config: &Config) -> Vec<String> {
    let rules: Vec<_> = config
        .rules
        .iter()
        .filter_map(|r| Some((r, r.condition()?.metric)))
        .filter(|(_, m)| m.needs_gpm())
        .collect();
    if rules.is_empty() {
        return Vec::new();
    }
    let sample = NvmlSource::new(
        config.nvml.library.clone(),
        false,
        Arc::new(SamplerCounters::default()),
    )
    .without_xid()
    .sample();
    let why = if !sample.nvml.up {
        Some(format!(
            "NVML is not available here ({}), so GPM support is not known",
            sample.nvml.error.as_deref().unwrap_or("unknown error")
        ))
    } else {
        let list = |want: Option<bool>| -> Vec<String> {
            sample
                .gpus
                .iter()
                .filter(|g| g.gpm_supported == want)
                .map(|g| g.index.to_string())
                .collect()
        };
        let (without, unknown) = (list(Some(false)), list(None));
        match (without.is_empty(), unknown.is_empty()) {
            (true, true) => None,
            (false, _) => Some(format!(
                "GPU {} of this node has no GPM (Hopper and later have it)",
                without.join(", ")
            )),
            (true, false) => Some(format!(
                "GPU {} of this node did not answer, so whether it has GPM is not known",
                unknown.join(", ")
            )),
        }
    };
    let Some(why) = why else {
        return Vec::new();
    };
    rules
        .into_iter()
        .map(|(r, m)| {
            format!(
                "rules.{}: metric \"{}\": {why}; there the rule sees unknown data, which counts as busy, and never acts",
                r.name,
                m.as_str()
            )
        })
        .collect()
}
