//! `gpuwatch check-config`: validates a config file, naming every bad key. When a rule judges a
//! GPM metric (`sm_active`, `tensor_active`, `dram_active`), it also looks at this node's GPUs:
//! where none can ever give the metric (no NVIDIA driver, and only GPUs without GPM), the rule
//! is refused, as `gpuwatch run` refuses it; where NVML says its GPUs lack GPM, or cannot say,
//! it warns: such a rule sees unknown data there, which counts as busy, so it never acts.

use crate::config::Config;
use std::path::Path;
use std::process::ExitCode;

pub fn run(path: &Path) -> ExitCode {
    // The certificates and keys are loaded as the daemon loads them at start.
    let loaded = crate::cloud::load_config(path)
        .and_then(|config| crate::http::tls::load(config.server.web.as_ref()).map(|_| config));
    match loaded {
        Ok(config) => {
            let sample =
                (!gpm_rules(&config).is_empty()).then(|| crate::gpu::sampler::sample_once(&config));
            let refused = unserved_in(&config, sample.as_ref());
            if !refused.is_empty() {
                return refuse(path, &refused);
            }
            let gpm = sample
                .map(|s| gpm_warnings(&config, &s))
                .unwrap_or_default();
            for warning in config.warnings.iter().cloned().chain(gpm) {
                eprintln!("config: {}: warning: {warning}", path.display());
            }
            println!("config: {}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::config_failure(&e),
    }
}

/// The rules on a GPM metric, each with its metric.
fn gpm_rules(config: &Config) -> Vec<(&crate::rules::Rule, crate::rules::Metric)> {
    config
        .rules
        .iter()
        .filter_map(|r| Some((r, r.condition()?.metric)))
        .filter(|(_, m)| m.needs_gpm())
        .collect()
}

/// For `gpuwatch run`: one error per rule on a metric that no GPU of this node can ever give
/// (GPM's, on a node with no NVIDIA driver, no NVIDIA GPU on its PCI bus, and only GPUs
/// without GPM). NVML is loaded only
/// where such a rule exists and the node has GPUs NVML does not read.
pub fn unserved(config: &Config) -> Vec<String> {
    if gpm_rules(config).is_empty() || !crate::gpu::sampler::has_other_gpus(config) {
        return Vec::new();
    }
    unserved_in(config, Some(&crate::gpu::sampler::sample_once(config)))
}

fn unserved_in(config: &Config, sample: Option<&crate::gpu::Sample>) -> Vec<String> {
    let Some(why) = sample.and_then(crate::gpu::Sample::never_gpm) else {
        return Vec::new();
    };
    // An NVIDIA GPU whose driver is not loaded (yet) may have GPM once it is.
    if crate::gpu::nvidia_on_bus(&config.amd.sysfs_root) {
        return Vec::new();
    }
    gpm_rules(config)
        .into_iter()
        .map(|(r, m)| {
            format!(
                "rules.{}.metric: \"{}\": no GPU of this node gives it: {why}",
                r.name,
                m.as_str()
            )
        })
        .collect()
}

/// Reports `errors` as a config that cannot be used: exit status 64.
pub fn refuse(path: &Path, errors: &[String]) -> ExitCode {
    for e in errors {
        eprintln!("config: {}: {e}", path.display());
    }
    super::exit::USAGE.into()
}

/// One warning per rule on a GPM metric that this node's GPUs cannot serve.
fn gpm_warnings(config: &Config, sample: &crate::gpu::Sample) -> Vec<String> {
    let rules = gpm_rules(config);
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
                .filter(|g| g.has_gpm() == want)
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
