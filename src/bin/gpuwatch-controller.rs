//! `gpuwatch-controller`: the cluster controller. `gpuwatch controller` runs it in its own
//! place (see `cmd::controller::exec`), so its arguments are `gpuwatch controller`'s, with or
//! without the word `controller`: `gpuwatch-controller --config FILE` and
//! `gpuwatch-controller controller restore ml/deployment/train` both work.

use std::ffi::{OsStr, OsString};
use std::process::ExitCode;

use clap::Parser;

use gpuwatch::cli::Cli;

fn main() -> ExitCode {
    // One malloc arena, as the node daemon has.
    gpuwatch::process_memory::at_start();
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let first = args.get(1).map(OsString::as_os_str);
    let own = ["controller", "--version", "-V"].map(OsStr::new);
    if !first.is_some_and(|a| own.contains(&a)) {
        let at = args.len().min(1);
        args.insert(at, "controller".into());
    }
    let cli = Cli::parse_from(args);
    gpuwatch::logging::init();
    gpuwatch::cli::run_controller(cli)
}
