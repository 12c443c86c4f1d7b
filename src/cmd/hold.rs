//! `gpuwatch hold` and `gpuwatch release`: write or remove `hold.json` in the state directory,
//! or, with `--job` or `--user`, that job's or user's hold file.

use std::process::ExitCode;

use super::exit;
use crate::config::Config;
use crate::state::Subject;

/// The job or user a command names, if any; `Err` is a usage error, already said.
fn subject(
    command: &str,
    (job, user): (Option<&str>, Option<&str>),
) -> Result<Option<Subject>, ExitCode> {
    match (job, user) {
        (None, None) => Ok(None),
        (Some(j), _) => Subject::job(j).map(Some).ok_or_else(|| {
            eprintln!("{command}: --job \"{j}\" is not a Slurm job id, such as 1234 or 1234_7");
            exit::USAGE.into()
        }),
        (_, Some(u)) => Subject::user(u).map(Some).ok_or_else(|| {
            eprintln!("{command}: --user \"{u}\" is not a user name of letters, digits, '.', '_', '-' and '@'");
            exit::USAGE.into()
        }),
    }
}

/// " of job 42" for a subject's hold, nothing for the node's.
fn of(subject: Option<&Subject>) -> String {
    subject.map_or(String::new(), |s| format!(" of {}", s.key()))
}

pub fn hold(
    config: &Config,
    duration: &str,
    reason: &str,
    who: (Option<&str>, Option<&str>),
) -> ExitCode {
    let subject = match subject("hold", who) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // A year at most: a hold past that is a mistake, and a hold that never ends would be
    // written as "never", which reads as unreadable.
    const MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);
    let d = match crate::time::parse_duration(duration) {
        Some(d) if !d.is_zero() && d <= MAX_HOLD => d,
        Some(d) if d > MAX_HOLD => {
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
    let written = match &subject {
        None => dir.set_hold(&hold),
        Some(s) => dir.set_subject_hold(s, &hold),
    };
    let of = of(subject.as_ref());
    match written {
        Ok(()) => {
            println!("hold{of} until {} ({})", hold.until, dir.path().display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hold: cannot write to {}: {e}", dir.path().display());
            ExitCode::FAILURE
        }
    }
}

pub fn release(config: &Config, who: (Option<&str>, Option<&str>)) -> ExitCode {
    let subject = match subject("release", who) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let dir = crate::state::StateDir::new(&config.actions.state_dir);
    let released = match &subject {
        None => dir.release(),
        Some(s) => dir.release_subject(s),
    };
    let of = of(subject.as_ref());
    match released {
        Ok(true) => {
            println!("hold{of} released");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("no hold{of} was in place");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("release: {}: {e}", dir.path().display());
            ExitCode::FAILURE
        }
    }
}
