//! `gpuwatch check-config`: validates a config file, naming every bad key.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;

pub fn run(path: &Path) -> ExitCode {
    match Config::load(path) {
        Ok(_) => {
            println!("config: {}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::config_failure(&e),
    }
}
