//! The command line: its arguments (clap), and the dispatch from a subcommand to its
//! implementation in `cmd`. A bad config exits 64, naming each bad key.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd::{self, config_failure};
use crate::config::{Config, DEFAULT_PATH};

/// `simulate --lifecycle`: the instance's lifecycle, as instance metadata spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LifecycleArg {
    Spot,
    OnDemand,
}

impl From<LifecycleArg> for crate::rules::Lifecycle {
    fn from(l: LifecycleArg) -> Self {
        match l {
            LifecycleArg::Spot => crate::rules::Lifecycle::Spot,
            LifecycleArg::OnDemand => crate::rules::Lifecycle::OnDemand,
        }
    }
}

#[derive(Parser)]
#[command(name = "gpuwatch", version = cmd::VERSION, about = "NVIDIA GPU exporter for Prometheus, with idle and cost watch")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the daemon: sample every GPU and serve /metrics
    ///
    /// Once it serves, it prints one line to stdout, "listening on http://ADDR/" (https with
    /// TLS), and nothing else there: scripts read the address from it.
    Run {
        /// Config file (TOML)
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
        /// More rules, in the JSON form or as TOML [[rules]]
        #[arg(long, value_name = "PATH")]
        rules: Option<PathBuf>,
        /// Address to serve on, overriding [server] listen; port 0 lets the kernel choose
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Run the daemon over four simulated GPUs; needs no GPU, config or root
    Demo {
        /// Address to serve on
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9400")]
        listen: String,
        /// Add two simulated AMD GPUs, read from a generated sysfs and procfs tree
        #[arg(long)]
        amd: bool,
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
    /// Run the cluster controller: give back idle GPU workloads the node daemons judge idle
    ///
    /// It reads the verdicts of `action = "reclaim"` rules from the fleet's Prometheus
    /// ([controller] prometheus_url), and scales to 0, suspends or stops each workload whose
    /// every GPU pod is idle, after a warning and a re-check, unless it is held. Dry-run by
    /// default. Once it serves its /metrics, it prints "listening on http://ADDR/".
    Controller {
        /// Config file (TOML) with a [controller] section
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH, global = true)]
        config: PathBuf,
        /// Address to serve /metrics on, overriding [server] listen
        #[arg(long, value_name = "ADDR", global = true)]
        listen: Option<String>,
        #[command(subcommand)]
        action: Option<ControllerAction>,
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
        /// CSV: timestamp,gpu,utilization[,memory_used_bytes,power_watts,pod,sm_active,tensor_active,job,user]
        #[arg(long, value_name = "FILE.csv")]
        trace: PathBuf,
        /// More rules, in the JSON form or as TOML [[rules]]
        #[arg(long, value_name = "PATH")]
        rules: Option<PathBuf>,
        /// The instance's lifecycle, for rules with a lifecycle filter
        #[arg(long)]
        lifecycle: Option<LifecycleArg>,
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
        /// Hold only this Slurm job's rules (scope = "job"), not the node's
        #[arg(long, value_name = "ID", conflicts_with = "user")]
        job: Option<String>,
        /// Hold only this user's rules (scope = "user"), not the node's
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// Config file whose [actions] state_dir to use
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Print the audit log as sentences, rotated files included, oldest first
    Audit {
        /// Only what happened in this last while, such as 2h or 30m
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// Only this rule's records
        #[arg(long, value_name = "NAME")]
        rule: Option<String>,
        /// Only actions, warnings, cancellations or budget records
        #[arg(long)]
        kind: Option<cmd::audit::Kind>,
        /// The records as they are, one JSON object per line
        #[arg(long)]
        json: bool,
        /// Config file whose [actions] state_dir to read
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Show the node at a glance: GPUs, rules and pending actions, holds, spend, recent events
    ///
    /// It asks the running daemon (over its HTTP endpoint, with the config's TLS), or with
    /// --state-dir reads the state files when the daemon is down. Exit status: 0 all is well,
    /// 1 an action is pending, 2 NVML or a GPU is down, 3 the status cannot be read.
    Status {
        /// The daemon's address, such as https://gpu-7:9400/ (default: from [server] listen)
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Read the state files in this directory instead of asking the daemon
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// User for basic auth; the password is read from GPUWATCH_PASSWORD
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// CA certificate (PEM) to trust for the daemon's TLS certificate (default: the
        /// certificate in the web config, then the system's roots)
        #[arg(long, value_name = "PATH")]
        cacert: Option<PathBuf>,
        /// Send the password over plain HTTP to a daemon beyond this machine (refused
        /// without it: anyone on the path would read it)
        #[arg(long)]
        insecure: bool,
        /// Print the status as JSON, as /api/v1/status serves it
        #[arg(long)]
        json: bool,
        /// Config file whose [server] and web config to use
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Remove a hold
    Release {
        /// Release only this Slurm job's hold
        #[arg(long, value_name = "ID", conflicts_with = "user")]
        job: Option<String>,
        /// Release only this user's hold
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// Config file whose [actions] state_dir to use
        #[arg(long, short, value_name = "PATH", default_value = DEFAULT_PATH)]
        config: PathBuf,
    },
}

/// Runs the subcommand; the exit status follows sysexits (64: bad config or usage).
/// `gpuwatch run`'s config: the file (and rules file), with `--listen` over its address.
fn run_config(
    config: &Path,
    rules: Option<&Path>,
    listen: Option<String>,
) -> Result<(Config, Option<Tls>), ExitCode> {
    let (mut c, tls) = load_config(config, rules)?;
    // A rule on a metric that no GPU of this node can ever give is a config it cannot use.
    let unserved = cmd::check_config::unserved(&c);
    if !unserved.is_empty() {
        return Err(cmd::check_config::refuse(config, &unserved));
    }
    if let Some(listen) = listen {
        match listen.parse() {
            Ok(addr) => c.server.listen = addr,
            Err(_) => {
                eprintln!("run: --listen: \"{listen}\" is not an IP address and port, such as \"127.0.0.1:9400\"");
                return Err(cmd::exit::USAGE.into());
            }
        }
    }
    Ok((c, tls))
}

/// What `gpuwatch controller` does besides running.
#[derive(Subcommand)]
pub enum ControllerAction {
    /// Bring back a workload the controller gave back: its replicas, the Job resumed, the
    /// Notebook started
    Restore {
        /// NAMESPACE/KIND/NAME, such as ml/deployment/train (kind: deployment, statefulset,
        /// replicaset, job, notebook)
        workload: String,
    },
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run {
            config,
            rules,
            listen,
        } => cmd::run::run(move || run_config(&config, rules.as_deref(), listen)),
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
            let options = crate::simulate::Options {
                lifecycle: lifecycle.map(crate::rules::Lifecycle::from),
                spend: price.map(|usd_per_hour| crate::simulate::Spend {
                    usd_per_hour,
                    start_usd: spend,
                }),
                memory_total_bytes,
                power_limit_watts,
                state_unwritable: None,
            };
            cmd::simulate::run(&c, &trace, json, &options)
        }),
        Command::Hold {
            duration,
            reason,
            job,
            user,
            config,
        } => with_state_config(&config, |c| {
            cmd::hold::hold(&c, &duration, &reason, (job.as_deref(), user.as_deref()))
        }),
        Command::Audit {
            since,
            rule,
            kind,
            json,
            config,
        } => with_state_config(&config, |c| {
            let since = match since.as_deref().map(crate::time::parse_duration) {
                None => None,
                Some(Some(d)) => Some(crate::time::now() - d.as_secs_f64()),
                Some(None) => {
                    eprintln!(
                        "audit: --since: \"{}\" is not a duration, such as \"2h\"",
                        since.unwrap_or_default()
                    );
                    return cmd::exit::USAGE.into();
                }
            };
            let filter = cmd::audit::Filter { since, rule, kind };
            cmd::audit::run(&c, &filter, json)
        }),
        Command::Status {
            url,
            state_dir,
            user,
            cacert,
            insecure,
            json,
            config,
        } => with_config(&config, None, |c| {
            let how = match state_dir {
                Some(dir) => cmd::status::From::StateDir(dir),
                None => cmd::status::From::Daemon {
                    url,
                    user,
                    cacert,
                    insecure,
                },
            };
            cmd::status::run(&c, how, json)
        }),
        Command::Release { job, user, config } => with_state_config(&config, |c| {
            cmd::hold::release(&c, (job.as_deref(), user.as_deref()))
        }),
        Command::Demo { listen, amd } => cmd::demo::run(&listen, amd),
        Command::Snapshot { json, config } => {
            with_config(&config, None, |c| cmd::snapshot::run(&c, json))
        }
        Command::CheckConfig { path } => cmd::check_config::run(&path),
        // The controller is an executable of its own: see `cmd::controller::exec`.
        Command::Controller { .. } => cmd::controller::exec(),
    }
}

/// `gpuwatch-controller`'s dispatch: the `controller` subcommand, its only one.
pub fn run_controller(cli: Cli) -> ExitCode {
    if let Err(e) = cmd::controller::matches_caller() {
        eprintln!("{e}");
        return cmd::exit::UNAVAILABLE.into();
    }
    match cli.command {
        Command::Controller {
            config,
            listen,
            action,
        } => controller(&config, listen, action),
        _ => {
            eprintln!(
                "gpuwatch-controller runs the cluster controller only; gpuwatch runs the rest"
            );
            cmd::exit::USAGE.into()
        }
    }
}

/// `gpuwatch controller`, or its `restore`.
fn controller(config: &Path, listen: Option<String>, action: Option<ControllerAction>) -> ExitCode {
    match run_config(config, None, listen) {
        Err(code) => code,
        Ok((c, _)) => match action {
            None => cmd::controller::run(c),
            Some(ControllerAction::Restore { workload }) => cmd::controller::restore(c, &workload),
        },
    }
}

/// Loads the config (plus a rules file) and runs `f` on it, or exits 64 naming each bad key.
/// A missing file at the default path means the defaults; a file named on the command line must
/// exist.
fn with_config(path: &Path, rules: Option<&Path>, f: impl FnOnce(Config) -> ExitCode) -> ExitCode {
    match load_config(path, rules) {
        Ok((c, _)) => f(c),
        Err(code) => code,
    }
}

/// `with_config` for the commands that need only the state directory (`hold`, `release`,
/// `audit`): see `Config::load_for_state`.
fn with_state_config(path: &Path, f: impl FnOnce(Config) -> ExitCode) -> ExitCode {
    match load_with(path, None, crate::cloud::load_config_for_state) {
        Ok(c) => f(c),
        Err(code) => code,
    }
}

/// Loads the config as `with_config` does, with the TLS configuration of its web config built
/// (so a certificate or key that cannot be loaded is a config error for every command that
/// reads the whole config); `Err` is the exit status, the errors reported.
fn load_config(path: &Path, rules: Option<&Path>) -> Result<(Config, Option<Tls>), ExitCode> {
    let config = load_with(path, rules, crate::cloud::load_config)?;
    match crate::http::tls::load(config.server.web.as_ref()) {
        Ok(tls) => Ok((config, tls)),
        Err(e) => Err(config_failure(&e)),
    }
}

/// The TLS configuration the daemon serves with.
type Tls = std::sync::Arc<rustls::ServerConfig>;

fn load_with(
    path: &Path,
    rules: Option<&Path>,
    load: fn(&Path) -> Result<Config, crate::config::ConfigErrors>,
) -> Result<Config, ExitCode> {
    let loaded = if path == Path::new(DEFAULT_PATH) && !path.exists() {
        tracing::info!("no config at {}; using the defaults", path.display());
        Ok(Config::default())
    } else {
        load(path)
    };
    let loaded = loaded.and_then(|mut c| {
        if let Some(r) = rules {
            c.add_rules_file(r)?;
        }
        for warning in &c.warnings {
            tracing::warn!("config: {}: {warning}", path.display());
        }
        Ok(c)
    });
    loaded.map_err(|e| config_failure(&e))
}
