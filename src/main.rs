//! The `gpuwatch` command: parse the arguments, start logging, and hand over to the library
//! (`cli` dispatches, `commands` does the work).

use std::process::ExitCode;

use clap::Parser;

use gpuwatch::cli::Cli;

fn main() -> ExitCode {
    gpuwatch::memory::at_start();
    let cli = Cli::parse();
    init_logging();
    gpuwatch::cli::run(cli)
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
