//! `gpuwatch simulate`: reads a trace, replays it through the decision step, prints the report.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use super::exit;
use crate::config::Config;

pub fn run(
    config: &Config,
    trace: &Path,
    json: bool,
    options: &crate::simulate::Options,
) -> ExitCode {
    let text = match crate::simulate::read_trace(trace) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("simulate: {}: cannot read: {e}", trace.display());
            return exit::NOINPUT.into();
        }
    };
    let rows = match crate::simulate::parse_trace(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simulate: {}: {e}", trace.display());
            return exit::DATAERR.into();
        }
    };
    if config.rules.is_empty() {
        eprintln!("simulate: no rules: add [[rules]] to the config or pass --rules PATH");
        return exit::USAGE.into();
    }
    let price_ok = |usd: f64| usd > 0.0 && usd <= crate::cost::MAX_HOURLY_USD;
    let spend_ok = |usd: f64| (0.0..1e12).contains(&usd);
    if options
        .spend
        .is_some_and(|s| !price_ok(s.usd_per_hour) || !spend_ok(s.start_usd))
    {
        eprintln!(
            "simulate: --price must be above 0 and at most {} USD an hour, and --spend at least 0 and finite",
            crate::cost::MAX_HOURLY_USD
        );
        return exit::USAGE.into();
    }
    for (flag, v) in [
        ("--memory-total-bytes", options.memory_total_bytes),
        ("--power-limit-watts", options.power_limit_watts),
    ] {
        if v.is_some_and(|v| !(v > 0.0 && v.is_finite())) {
            eprintln!("simulate: {flag} must be above 0");
            return exit::USAGE.into();
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
