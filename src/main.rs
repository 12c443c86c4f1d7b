//! The `gpuwatch` command: parse arguments and config, then hand over to the library.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use gpuwatch::config::{Config, ConfigErrors, DEFAULT_PATH, EXIT_CONFIG};
use gpuwatch::gpu::nvml::NvmlSource;
use gpuwatch::gpu::GpuSource;
use gpuwatch::metrics::SelfMetrics;

#[derive(Parser)]
#[command(name = "gpuwatch", version = VERSION, about = "NVIDIA GPU exporter for Prometheus, with idle and cost watch")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: sample every GPU and serve /metrics
    Run {
        /// Config file (TOML)
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
        /// More rules, in the JSON form or as TOML [[rules]]
        #[arg(long, value_name = "PATH")]
        rules: Option<PathBuf>,
    },
    /// Run the daemon over four simulated GPUs; needs no GPU, config or root
    Demo {
        /// Address to serve on
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9400")]
        listen: String,
    },
    /// Take one sample and print it as a table, or as JSON
    Snapshot {
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
        /// Config file whose [nvml] library to use
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Validate a config file: exit 0, or exit 64 naming each bad key
    CheckConfig {
        /// Config file (TOML)
        path: PathBuf,
    },
    /// Replay a recorded trace through the rules and print what they would have done
    Simulate {
        /// Config file whose rules and [actions] timings to use
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
        /// CSV: timestamp,gpu,utilization[,memory_used_bytes,power_watts]
        #[arg(long, value_name = "FILE.csv")]
        trace: PathBuf,
        /// More rules, in the JSON form or as TOML [[rules]]
        #[arg(long, value_name = "PATH")]
        rules: Option<PathBuf>,
        /// The instance's lifecycle, for rules with a lifecycle filter
        #[arg(long, value_parser = ["spot", "on-demand"])]
        lifecycle: Option<String>,
        /// One JSON object per event
        #[arg(long)]
        json: bool,
        /// The instance's price in USD per hour, so that spend accrues over the trace
        #[arg(long, value_name = "USD")]
        price: Option<f64>,
        /// Spent in the budget period before the trace starts (with --price)
        #[arg(long, value_name = "USD", default_value_t = 0.0)]
        spend: f64,
        /// Each GPU's memory, so that the trace's memory_used_bytes become memory_used_ratio
        #[arg(long, value_name = "BYTES")]
        memory_total_bytes: Option<f64>,
        /// Each GPU's power limit, so that the trace's power_watts become power_ratio
        #[arg(long, value_name = "WATTS")]
        power_limit_watts: Option<f64>,
    },
    /// Postpone every action for a while (the running daemon honours it at once)
    Hold {
        /// How long, such as 3h or 90m
        duration: String,
        /// Why, for the audit log and for colleagues
        #[arg(long, default_value = "")]
        reason: String,
        /// Config file whose [actions] state_dir to use
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Remove a hold
    Release {
        /// Config file whose [actions] state_dir to use
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
}

const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("GPUWATCH_REVISION"),
    "; prices as of ",
    env!("GPUWATCH_PRICES_AS_OF"),
    ")"
);

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Run { config, rules } => with_config(&config, rules.as_deref(), daemon),
        Command::Simulate {
            config,
            trace,
            rules,
            lifecycle,
            json,
            price,
            spend,
            memory_total_bytes,
            power_limit_watts,
        } => with_config(&config, rules.as_deref(), |c| {
            let options = gpuwatch::simulate::Options {
                lifecycle: match lifecycle.as_deref() {
                    Some("spot") => Some(gpuwatch::rules::Lifecycle::Spot),
                    Some("on-demand") => Some(gpuwatch::rules::Lifecycle::OnDemand),
                    _ => None,
                },
                spend: price.map(|usd_per_hour| gpuwatch::simulate::Spend {
                    usd_per_hour,
                    start_usd: spend,
                }),
                memory_total_bytes,
                power_limit_watts,
            };
            simulate(&c, &trace, json, &options)
        }),
        Command::Hold {
            duration,
            reason,
            config,
        } => with_config(&config, None, |c| hold(&c, &duration, &reason)),
        Command::Release { config } => with_config(&config, None, |c| release(&c)),
        Command::Demo { listen } => demo(&listen),
        Command::Snapshot { json, config } => with_config(&config, None, |c| snapshot(&c, json)),
        Command::CheckConfig { path } => match Config::load(&path) {
            Ok(_) => {
                println!("config: {}: ok", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => config_failure(&e),
        },
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUWATCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        // A closed stderr must not take the daemon down: log lines are dropped instead.
        .log_internal_errors(false)
        .init();
}

/// Loads the config (plus a rules file) and runs `f` on it, or exits 64 naming each bad key.
/// A missing file at the default path means the defaults; a file named on the command line must
/// exist.
fn with_config(path: &Path, rules: Option<&Path>, f: impl FnOnce(Config) -> ExitCode) -> ExitCode {
    let loaded = if path == Path::new(DEFAULT_PATH) && !path.exists() {
        tracing::info!("no config at {}; using the defaults", path.display());
        Ok(Config::default())
    } else {
        Config::load(path)
    };
    let loaded = loaded.and_then(|mut c| {
        if let Some(r) = rules {
            c.add_rules_file(r)?;
        }
        Ok(c)
    });
    match loaded {
        Ok(c) => f(c),
        Err(e) => config_failure(&e),
    }
}

fn simulate(
    config: &Config,
    trace: &Path,
    json: bool,
    options: &gpuwatch::simulate::Options,
) -> ExitCode {
    let text = match gpuwatch::simulate::read_trace(trace) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("simulate: {}: cannot read: {e}", trace.display());
            return ExitCode::from(66); // EX_NOINPUT
        }
    };
    let rows = match gpuwatch::simulate::parse_trace(&text) {
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
    let reports = gpuwatch::simulate::replay_with(config, &rows, options);
    let mut out = std::io::stdout().lock();
    if json {
        for r in &reports {
            let _ = writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default());
        }
    } else {
        let _ = write!(out, "{}", gpuwatch::simulate::render(&reports));
    }
    ExitCode::SUCCESS
}

fn hold(config: &Config, duration: &str, reason: &str) -> ExitCode {
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
    let until = gpuwatch::time::now() + d.as_secs_f64();
    let dir = gpuwatch::state::StateDir::new(&config.actions.state_dir);
    let hold = gpuwatch::state::Hold {
        until: gpuwatch::time::rfc3339(until),
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

fn release(config: &Config) -> ExitCode {
    let dir = gpuwatch::state::StateDir::new(&config.actions.state_dir);
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

fn config_failure(e: &ConfigErrors) -> ExitCode {
    eprintln!("{e}");
    ExitCode::from(EXIT_CONFIG as u8)
}

fn daemon(config: Config) -> ExitCode {
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
    match runtime.block_on(gpuwatch::app::run(config)) {
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

fn demo(listen: &str) -> ExitCode {
    let listen = match listen.parse() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("demo: --listen: \"{listen}\" is not an IP address and port, such as \"127.0.0.1:9400\"");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    let library = match gpuwatch::app::find_fake_library() {
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
        gpuwatch::app::display_addr(listen),
        gpuwatch::app::display_addr(listen)
    );
    daemon(config)
}

fn snapshot(config: &Config, json: bool) -> ExitCode {
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
    let snap = gpuwatch::gpu::Snapshot {
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
        print!("{}", gpuwatch::report::table(&snap));
    }
    ExitCode::SUCCESS
}
