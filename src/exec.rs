//! Runs the commands a user configures (`exec` actions, the spot interruption hook): in a
//! process group of their own, so that a timeout kills everything they started, and without the
//! daemon's cloud credentials or systemd's notify socket, which they have no need of.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

/// systemd's notify variables: they are the daemon's, not a command's to use.
const SYSTEMD: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the command is empty")]
    Empty,
    #[error("cannot run {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program:?} ran past {timeout:?}; its process group was killed")]
    Timeout { program: String, timeout: Duration },
}

/// Runs `argv` with `env` added and the variables `hidden` (the clouds' credentials) taken
/// away, and waits at most `timeout` for it. On the timeout the whole process group (the
/// command and whatever it started) is killed.
pub async fn run(
    argv: &[String],
    env: &[(&str, &str)],
    hidden: &[&str],
    timeout: Duration,
) -> Result<ExitStatus, RunError> {
    let (program, args) = argv.split_first().ok_or(RunError::Empty)?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    for var in hidden.iter().chain(&SYSTEMD) {
        cmd.env_remove(var);
    }
    let mut child = cmd.spawn().map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pgid = child.id();
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => Ok(status),
        Ok(Err(source)) => Err(RunError::Spawn {
            program: program.clone(),
            source,
        }),
        Err(_) => {
            if let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()) {
                // SAFETY: killpg only sends a signal; the group is the one we created. (The
                // standard library's `Child::kill` signals one process, not its group.)
                unsafe {
                    libc::killpg(pgid, libc::SIGKILL);
                }
            }
            let _ = child.wait().await;
            Err(RunError::Timeout {
                program: program.clone(),
                timeout,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_timeout_kills_the_whole_group_and_credentials_stay_behind() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild");
        // The command starts a grandchild that outlives it unless the group is killed.
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let argv = vec!["/bin/sh".to_string(), "-c".to_string(), script];
        let e = run(&argv, &[], &[], Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(e, RunError::Timeout { .. }), "{e}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild is gone, or a zombie waiting to be reaped. SIGKILL takes a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if state.is_empty() || state.contains(") Z ") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "grandchild {pid} survived: {state}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        std::env::set_var("GPUWATCH_TEST_SECRET", "exec-secret-not-passed");
        let out = dir.path().join("env");
        let argv = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!("env > {}", out.display()),
        ];
        let hidden = ["GPUWATCH_TEST_SECRET"];
        let status = run(
            &argv,
            &[("GPUWATCH_RULE", "r")],
            &hidden,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert!(status.success());
        let env = std::fs::read_to_string(&out).unwrap();
        assert!(env.contains("GPUWATCH_RULE=r"));
        assert!(!env.contains("exec-secret-not-passed"), "{env}");
    }
}
