//! `gpuwatch controller`: the cluster controller, and `gpuwatch controller restore`.

use std::process::ExitCode;

use crate::config::Config;
use crate::controller::cluster::{Cluster, Key};
use crate::controller::decide::Kind;

/// Where `gpuwatch controller` runs `gpuwatch-controller`, the version it expects of it.
pub const CALLER_VERSION: &str = "GPUWATCH_CALLER_VERSION";

/// `gpuwatch-controller` run by a `gpuwatch` of another build (one of the two replaced by
/// hand): refused, so that a controller never acts with another build's code.
pub fn matches_caller() -> Result<(), String> {
    match std::env::var(CALLER_VERSION) {
        Ok(caller) if caller != super::VERSION => Err(format!(
            "controller: gpuwatch-controller {} is not of the same build as gpuwatch {caller}: install both from one build",
            super::VERSION
        )),
        _ => Ok(()),
    }
}

/// The controller's executable, installed beside `gpuwatch`.
pub const EXECUTABLE: &str = "gpuwatch-controller";

/// `gpuwatch controller`: runs [`EXECUTABLE`], found beside this executable, in this process's
/// place (the same PID, arguments and environment; `argv[0]` stays `gpuwatch`). The controller
/// is an executable of its own so that the node daemon never holds the Kubernetes client: the
/// code of `kube` and `k8s-openapi`, mapped and relocated in every process of a binary that
/// links them, would cost each node about 0.2 MiB of anonymous and 1 MiB of file-backed memory
/// for code it never runs. Returns only when the exec fails.
pub fn exec() -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let path = match std::env::current_exe() {
        Ok(p) => p.with_file_name(EXECUTABLE),
        Err(e) => {
            eprintln!("controller: cannot read this executable's path: {e}");
            return super::exit::UNAVAILABLE.into();
        }
    };
    let e = std::process::Command::new(&path)
        .arg0("gpuwatch")
        .args(std::env::args_os().skip(1))
        .env(CALLER_VERSION, super::VERSION)
        .exec();
    eprintln!(
        "controller: cannot run {}: {e}. The controller is the executable {EXECUTABLE}, installed beside gpuwatch: `cargo build --release` builds both, and the package and the image hold both",
        path.display()
    );
    super::exit::UNAVAILABLE.into()
}

/// Runs the controller until SIGTERM or SIGINT.
pub fn run(config: Config) -> ExitCode {
    if config.controller.is_none() {
        eprintln!("controller: [controller] prometheus_url is not set{}: the controller reads the node daemons' verdicts from the fleet's Prometheus", shown(&config.path));
        return super::exit::USAGE.into();
    }
    tracing::info!(version = super::VERSION, "gpuwatch-controller");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("controller: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::controller::run(
        config,
        super::run::shutdown_signal(),
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("controller: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Brings back a workload the controller gave back: `NAMESPACE/KIND/NAME`.
pub fn restore(config: Config, what: &str) -> ExitCode {
    let parts: Vec<&str> = what.split('/').collect();
    let key = match parts[..] {
        [ns, kind, name] if !ns.is_empty() && !name.is_empty() => match Kind::parse(kind) {
            Some(kind) => Key {
                kind,
                namespace: ns.into(),
                name: name.into(),
            },
            None => {
                eprintln!("controller restore: \"{kind}\" is not one of deployment, statefulset, replicaset, job, notebook");
                return super::exit::USAGE.into();
            }
        },
        _ => {
            eprintln!("controller restore: \"{what}\" is not NAMESPACE/KIND/NAME, such as ml/deployment/train");
            return super::exit::USAGE.into();
        }
    };
    let Some(c) = config.controller else {
        eprintln!(
            "controller restore: [controller] is not set{}",
            shown(&config.path)
        );
        return super::exit::USAGE.into();
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("controller restore: {e}");
            return ExitCode::FAILURE;
        }
    };
    let done = runtime.block_on(async {
        let (client, _, _) = crate::controller::connect(&c).await?;
        Cluster { client }
            .restore(&key)
            .await
            .map_err(anyhow::Error::from)
    });
    match done {
        Ok(said) => {
            println!("{said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("controller restore: {key}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// " in PATH", or nothing for the built-in defaults.
fn shown(path: &std::path::Path) -> String {
    if path.as_os_str().is_empty() {
        " (no config file: the defaults)".into()
    } else {
        format!(" in {}", path.display())
    }
}
