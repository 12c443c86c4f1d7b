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

/// Logs to stderr, at the levels `GPUWATCH_LOG` gives: a level (`warn`), or targets with levels
/// (`info,gpuwatch=debug`). Unset or not understood, it is `info`.
fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let default = || tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO);
    let mut bad = None;
    let filter = match std::env::var("GPUWATCH_LOG") {
        Ok(text) if !text.trim().is_empty() => text.trim().parse().unwrap_or_else(|e| {
            bad = Some((text, e));
            default()
        }),
        _ => default(),
    };
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        // A closed stderr must not take the daemon down: log lines are dropped instead.
        .log_internal_errors(false);
    tracing_subscriber::registry()
        .with(format)
        .with(filter)
        .init();
    if let Some((text, e)) = bad {
        tracing::warn!(
            "GPUWATCH_LOG={text:?} is not a level or a list of target=level ({e}); logging at info"
        );
    }
}
