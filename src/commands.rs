//! What each subcommand does, once its config is loaded: the daemon, the demo, `snapshot`,
//! `simulate`, `hold` and `release`.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::{Config, EXIT_CONFIG};
use crate::gpu::nvml::NvmlSource;
use crate::gpu::GpuSource;
use crate::metrics::SelfMetrics;

pub fn simulate(
    config: &Config,
    trace: &Path,
    json: bool,
    options: &crate::simulate::Options,
) -> ExitCode {
    let text = match crate::simulate::read_trace(trace) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("simulate: {}: cannot read: {e}", trace.display());
            return ExitCode::from(66); // EX_NOINPUT
        }
    };
    let rows = match crate::simulate::parse_trace(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simulate: {}: {e}", trace.display());
            return ExitCode::from(65); // EX_DATAERR
        }
    };
    if config.rules.is_empty() {
        eprintln!("simulate: no rules: add [[rules]] to the config or pass --rules PATH");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    if options
        .spend
        .is_some_and(|s| !(s.usd_per_hour > 0.0 && s.start_usd >= 0.0))
    {
        eprintln!("simulate: --price must be above 0 and --spend at least 0");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    for (flag, v) in [
        ("--memory-total-bytes", options.memory_total_bytes),
        ("--power-limit-watts", options.power_limit_watts),
    ] {
        if v.is_some_and(|v| !(v > 0.0 && v.is_finite())) {
            eprintln!("simulate: {flag} must be above 0");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    }
    let reports = crate::simulate::replay_with(config, &rows, options);
    let mut out = std::io::stdout().lock();
    if json {
        for r in &reports {
            let _ = writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default());
        }
    } else {
        let _ = write!(out, "{}", crate::simulate::render(&reports));
    }
    ExitCode::SUCCESS
}

pub fn hold(config: &Config, duration: &str, reason: &str) -> ExitCode {
    // A year at most: a hold past that is a mistake, and a hold that never ends would be
    // written as "never", which reads as unreadable.
    const MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);
    let d = match humantime::parse_duration(duration) {
        Ok(d) if !d.is_zero() && d <= MAX_HOLD => d,
        Ok(d) if d > MAX_HOLD => {
            eprintln!("hold: \"{duration}\" is longer than a year; hold again when it expires");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
        _ => {
            eprintln!("hold: \"{duration}\" is not a duration, such as \"3h\" or \"90m\"");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    if reason.len() > 1024 || reason.chars().any(char::is_control) {
        eprintln!("hold: the reason must be one line of at most 1024 bytes");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    let until = crate::time::now() + d.as_secs_f64();
    let dir = crate::state::StateDir::new(&config.actions.state_dir);
    let hold = crate::state::Hold {
        until: crate::time::rfc3339(until),
        reason: reason.to_string(),
    };
    match dir.set_hold(&hold) {
        Ok(()) => {
            println!("hold until {} ({})", hold.until, dir.path().display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hold: cannot write to {}: {e}", dir.path().display());
            ExitCode::FAILURE
        }
    }
}

pub fn release(config: &Config) -> ExitCode {
    let dir = crate::state::StateDir::new(&config.actions.state_dir);
    match dir.release() {
        Ok(true) => {
            println!("hold released");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("no hold was in place");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("release: {}: {e}", dir.path().display());
            ExitCode::FAILURE
        }
    }
}

pub fn daemon(config: Config) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpuwatch: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::app::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwatch: {e:#}");
            ExitCode::FAILURE
        }
    }
}

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

pub fn demo(listen: &str) -> ExitCode {
    let listen = match listen.parse() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("demo: --listen: \"{listen}\" is not an IP address and port, such as \"127.0.0.1:9400\"");
            return ExitCode::from(EXIT_CONFIG as u8);
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
    daemon(config)
}

pub fn snapshot(config: &Config, json: bool) -> ExitCode {
    let mut source = NvmlSource::new(
        config.nvml.library.clone(),
        config.sampling.per_process_memory,
        Arc::new(SelfMetrics::default()),
    )
    .without_xid();
    let sample = source.sample();
    if !sample.nvml.up {
        eprintln!(
            "gpuwatch: NVML unavailable ({}): {}",
            sample.nvml.library,
            sample.nvml.error.as_deref().unwrap_or("unknown error")
        );
        return ExitCode::from(69); // EX_UNAVAILABLE
    }
    let snap = crate::gpu::Snapshot {
        seq: 1,
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        duration_seconds: 0.0,
        nvml: sample.nvml,
        gpus: sample.gpus,
    };
    if json {
        match serde_json::to_string_pretty(&snap) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("gpuwatch: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", crate::report::table(&snap));
    }
    ExitCode::SUCCESS
}
