//! `gpuwatch run`: the daemon, on a runtime of two worker threads.

use std::process::ExitCode;

use crate::config::Config;

pub fn run(config: Config) -> ExitCode {
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
