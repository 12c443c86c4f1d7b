//! `gpuwatch hold` and `gpuwatch release`: write or remove `hold.json` in the state directory.

use std::process::ExitCode;

use super::exit;
use crate::config::Config;

pub fn hold(config: &Config, duration: &str, reason: &str) -> ExitCode {
    // A year at most: a hold past that is a mistake, and a hold that never ends would be
    // written as "never", which reads as unreadable.
    const MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);
    let d = match humantime::parse_duration(duration) {
        Ok(d) if !d.is_zero() && d <= MAX_HOLD => d,
        Ok(d) if d > MAX_HOLD => {
            eprintln!("hold: \"{duration}\" is longer than a year; hold again when it expires");
            return exit::USAGE.into();
        }
        _ => {
            eprintln!("hold: \"{duration}\" is not a duration, such as \"3h\" or \"90m\"");
            return exit::USAGE.into();
        }
    };
    if reason.len() > 1024 || reason.chars().any(char::is_control) {
        eprintln!("hold: the reason must be one line of at most 1024 bytes");
        return exit::USAGE.into();
    }
    let until = crate::time::now() + d.as_secs_f64();
    let dir = crate::state::StateDir::new(&config.actions.state_dir);
    let hold = crate::state::HoldFile {
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
