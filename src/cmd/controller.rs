//! `gpuwatch controller`: the cluster controller, and `gpuwatch controller restore`.

use std::process::ExitCode;

use crate::config::Config;
use crate::controller::cluster::{Cluster, Key};
use crate::controller::decide::Kind;

/// Runs the controller until SIGTERM or SIGINT.
pub fn run(config: Config) -> ExitCode {
    if config.controller.is_none() {
        eprintln!("controller: [controller] prometheus_url is not set{}: the controller reads the node daemons' verdicts from the fleet's Prometheus", shown(&config.path));
        return super::exit::USAGE.into();
    }
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
