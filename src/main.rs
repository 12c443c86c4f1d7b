//! The `gpuwatch` command: parse the arguments, start logging, and hand over to the library
//! (`cli` dispatches, `commands` does the work).

use std::process::ExitCode;

use clap::Parser;

use gpuwatch::cli::Cli;

fn main() -> ExitCode {
    gpuwatch::process_memory::at_start();
    let cli = Cli::parse();
    gpuwatch::logging::init();
    gpuwatch::cli::run(cli)
}
