//! `gpuwatch run`: the daemon, on a runtime of one worker thread.
//!
//! One worker is enough for what the daemon does between samples, and every thread keeps the
//! stack pages it has touched. Blocking work never stalls it: per-sample file I/O runs on the
//! `gpuwatch-io` thread (`state::on_io_thread`), rare file I/O hands the worker's tasks to
//! another thread first (`state::off_async`), and the rest runs on the blocking pool. The
//! daemon's future runs on that worker, not on the main thread, which only waits, with the stack
//! pages that parsing the command line and the config touched given back.

use std::process::ExitCode;

use crate::config::Config;

pub fn run(config: Config) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        // An idle pool thread goes soon: the pool hands work to its idle threads in turn, so a
        // long keep-alive would keep every thread a burst once started.
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpuwatch: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Parsing the command line and the config is done: the main thread only waits from here.
    crate::memory::trim_stack();
    // Boxed, the daemon's future is built on the heap; unboxed, spawning would copy it through
    // the main thread's stack.
    let daemon = runtime.spawn(Box::pin(crate::app::run(config)));
    match runtime.block_on(daemon) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("gpuwatch: {e:#}");
            ExitCode::FAILURE
        }
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => {
            eprintln!("gpuwatch: the daemon's task ended: {e}");
            ExitCode::FAILURE
        }
    }
}
