//! `gpuwatch demo`: the daemon over four simulated GPUs, from the shipped scenario.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use super::exit;
use crate::config::Config;

/// The demo's rule: short periods, so that within two minutes GPU 3 goes idle, the warning
/// comes, and the dry-run "would stop" follows. The cloud stays "none": nothing leaves loopback.
const DEMO_CONFIG: &str = r#"
[sampling]
interval = "1s"

[actions]
mode = "dry-run"
boot_grace = "10s"
warning = "20s"
wall = false

[[rules]]
name = "demo-any-gpu-idle"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "15s"
evaluation_periods = 2
gpus = "any"
action = "stop"
"#;

pub fn run(listen: &str) -> ExitCode {
    let listen = match listen.parse() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("demo: --listen: \"{listen}\" is not an IP address and port, such as \"127.0.0.1:9400\"");
            return exit::USAGE.into();
        }
    };
    let library = match crate::app::find_fake_library() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("demo: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let dir = match tempfile::Builder::new().prefix("gpuwatch-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("demo: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let scenario = dir.path().join("demo.toml");
    if let Err(e) = std::fs::write(&scenario, gpuwatch_fake_nvml::DEMO_SCENARIO) {
        eprintln!("demo: cannot write {}: {e}", scenario.display());
        return ExitCode::FAILURE;
    }
    // Set before any thread starts; the fake library reads it at nvmlInit.
    std::env::set_var(gpuwatch_fake_nvml::SCENARIO_ENV, &scenario);
    let mut config = match Config::parse(DEMO_CONFIG, Path::new("demo")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    config.server.listen = listen;
    config.nvml.library = library;
    config.actions.state_dir = dir.path().join("state");
    // Written, not printed: a closed stdout must not stop the demo.
    let _ = writeln!(
        std::io::stdout(),
        "gpuwatch demo: 4 simulated GPUs (two training in bursts, one steady, one going idle)\n\
         rule \"demo-any-gpu-idle\" (dry-run): stop when any GPU idles for 2 periods of 15 s\n\
         open http://{}/ or scrape http://{}/metrics; Ctrl-C stops",
        crate::app::display_addr(listen),
        crate::app::display_addr(listen)
    );
    super::run::run(config)
}
