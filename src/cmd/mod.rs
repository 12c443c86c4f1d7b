//! One module per subcommand, each a `run` that returns the exit status, and the exit
//! statuses themselves, named once (sysexits).

pub mod audit;
pub mod check_config;
pub mod controller;
pub mod demo;
pub mod hold;
pub mod run;
pub mod simulate;
pub mod snapshot;
pub mod status;

use crate::config::ConfigErrors;

/// Exit statuses, from sysexits(3). Success is 0 and any other failure 1.
pub mod exit {
    /// EX_USAGE: a bad config, flag or argument.
    pub const USAGE: u8 = 64;
    /// EX_DATAERR: input that cannot be read as what it should be (a trace line).
    pub const DATAERR: u8 = 65;
    /// EX_NOINPUT: an input file that cannot be opened.
    pub const NOINPUT: u8 = 66;
    /// EX_UNAVAILABLE: a service gpuwatch needs is not there (NVML).
    pub const UNAVAILABLE: u8 = 69;
}

/// Prints every config error and returns EX_USAGE.
pub(crate) fn config_failure(e: &ConfigErrors) -> std::process::ExitCode {
    eprintln!("{e}");
    exit::USAGE.into()
}

/// This build's version: the package's, its revision, and its price table's date.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("GPUWATCH_REVISION"),
    "; prices as of ",
    env!("GPUWATCH_PRICES_AS_OF"),
    ")"
);
