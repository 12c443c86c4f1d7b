//! Wiring: builds the sampler, the registry and the HTTP server from a validated config.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::registry::Registry;

use crate::config::Config;
use crate::gpu::nvml::NvmlSource;
use crate::gpu::sampler;
use crate::metrics::{BuildInfo, SelfMetrics, SnapshotCollector};
use crate::server::{router, ServerState};

/// Runs the daemon until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let metrics = Arc::new(SelfMetrics::default());
    let source = NvmlSource::new(
        config.nvml.library.clone(),
        config.sampling.per_process_memory,
        Arc::clone(&metrics),
    );
    let snapshots = sampler::spawn(
        source,
        config.sampling.interval,
        config.sampling.timeout,
        Arc::clone(&metrics),
    )
    .context("cannot start the sampler thread")?;

    let mut registry = Registry::default();
    metrics.register(&mut registry);
    registry.register_collector(Box::new(SnapshotCollector::new(
        snapshots.clone(),
        BuildInfo::current(),
    )));

    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(
        interval = ?config.sampling.interval,
        library = %config.nvml.library.display(),
        "listening on http://{}/",
        display_addr(addr)
    );
    let app = router(ServerState {
        registry: Arc::new(registry),
        snapshots,
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("the HTTP server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// An address a browser can open: the wildcard address is shown as localhost.
pub fn display_addr(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("localhost:{}", addr.port())
    } else {
        addr.to_string()
    }
}

async fn shutdown_signal() {
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

/// Finds the fake NVML library: `GPUWATCH_FAKE_NVML_LIB`, else beside the running binary, where
/// cargo builds it (`target/<profile>/` or its `deps/`).
pub fn find_fake_library() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("GPUWATCH_FAKE_NVML_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("cannot find the running binary")?;
    let dir = exe
        .parent()
        .context("the running binary has no directory")?;
    let file = gpuwatch_fake_nvml::LIBRARY_FILE;
    let candidates = [dir.join(file), dir.join("deps").join(file)];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .with_context(|| {
            format!(
                "cannot find {file} beside {}; build it with `cargo build --release` or name it in GPUWATCH_FAKE_NVML_LIB",
                exe.display()
            )
        })
}
