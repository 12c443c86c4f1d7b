//! `gpuwatch run`: the daemon, on a runtime of one worker thread.
//!
//! One worker is enough for what the daemon does between samples, and every thread keeps the
//! stack pages it has touched. So the deep, one-time work (reading and validating the config,
//! building the app: the listener, the sampler, the cloud) runs on a startup thread that
//! ends when it is done, and its stack goes with it; the main thread then only waits. Blocking
//! work never stalls the worker: per-sample file I/O runs on the `gpuwatch-io` thread
//! (`state::on_io_thread`), rare file I/O hands the worker's tasks to another thread first
//! (`state::off_async`), and the rest runs on the blocking pool.

use std::process::ExitCode;

use crate::config::Config;

/// A validated config, and the TLS configuration its web config asks for (built once).
pub type Loaded = (Config, Option<std::sync::Arc<rustls::ServerConfig>>);

/// Runs the daemon with the config that `load` reads (on the startup thread); `load`'s `Err` is
/// the exit status of a config that cannot be used.
pub fn run(load: impl FnOnce() -> Result<Loaded, ExitCode> + Send + 'static) -> ExitCode {
    let open_files = raise_fd_limit();
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
    let handle = runtime.handle().clone();
    // What the app spawns while it is built runs on the worker; building it runs here.
    let startup = std::thread::Builder::new()
        .name("gpuwatch-start".into())
        .spawn(move || {
            let (config, tls) = load()?;
            fits_open_files(&config, open_files)?;
            handle
                .block_on(Box::pin(crate::app::App::build(config, tls)))
                .map_err(|e| {
                    eprintln!("gpuwatch: {e:#}");
                    ExitCode::FAILURE
                })
        });
    let built = match startup.map(std::thread::JoinHandle::join) {
        Ok(Ok(built)) => built,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(e) => {
            eprintln!("gpuwatch: cannot start the startup thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = match built {
        Ok(app) => app,
        Err(code) => return code,
    };
    // Boxed, the daemon's future is built on the heap; unboxed, spawning would copy it through
    // the main thread's stack.
    let daemon = runtime.spawn(Box::pin(app.run(shutdown_signal())));
    let code = match runtime.block_on(daemon) {
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
    };
    // The daemon has drained its own tasks; a blocking call stuck in the kernel (a file on a
    // hung disk) must not keep the process from exiting.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    code
}

/// Open files the daemon needs besides its connections: NVML's device files, the state
/// directory, cloud and webhook connections, the kubelet's socket, the runtime's own.
const OTHER_OPEN_FILES: u64 = 256;

/// Refuses `server.max_connections` that the open-file limit cannot hold: a flood of
/// connections would otherwise use up the files that state saves and audit records need, and
/// every action would wait on a full table. Exit status 64, as for a bad config.
fn fits_open_files(config: &Config, open_files: Option<u64>) -> Result<(), ExitCode> {
    let wanted = config.server.max_connections as u64;
    match open_files {
        Some(limit) if wanted + OTHER_OPEN_FILES > limit => {
            eprintln!(
                "config: server.max_connections: {wanted} connections and {OTHER_OPEN_FILES} other files need more open files than this process may have ({limit}); lower it, or raise the limit (LimitNOFILE= in the unit)"
            );
            Err(ExitCode::from(64))
        }
        _ => Ok(()),
    }
}

/// Raises the soft limit on open files to the hard limit, as servers do: systemd's default
/// soft limit of 1,024 is low for a daemon that serves connections and writes state. Also
/// ignores SIGXFSZ, so that a file size limit fails a write (which is counted, and stops
/// actions) instead of killing the daemon. Returns the soft limit it leaves, if it reads.
fn raise_fd_limit() -> Option<u64> {
    // SAFETY: setting a signal to be ignored has no preconditions. (The standard library
    // cannot set a signal's disposition.)
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass, and nothing else.
    // (The standard library has no resource-limit API.)
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur >= lim.rlim_max {
            return Some(lim.rlim_cur);
        }
        let soft = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
            tracing::debug!(from = soft, to = lim.rlim_max, "raised the open-file limit");
            return Some(lim.rlim_max);
        }
        Some(soft)
    }
}

/// Completes at SIGINT or SIGTERM: what `gpuwatch run` stops on.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
