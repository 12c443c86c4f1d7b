//! `[actions]`, `[vetoes]` and `[spot]`: what gpuwatch may do, what keeps a node busy, and what
//! runs on a spot interruption notice.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    DryRun,
    Enforce,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::DryRun => "dry-run",
            Mode::Enforce => "enforce",
        }
    }
}

pub use gpuwatch_core::plan::SpotStop;

#[derive(Debug, Clone, PartialEq)]
pub struct ActionsConfig {
    pub mode: Mode,
    pub boot_grace: Duration,
    pub warning: Duration,
    pub spot_stop: SpotStop,
    pub webhook_url: Option<String>,
    pub wall: bool,
    pub exec_timeout: Duration,
    /// How long cloud calls are retried through throttling, 5xx and outages.
    pub retry_for: Duration,
    pub state_dir: PathBuf,
    /// When `audit.jsonl` is rotated, and how many rotated files are kept.
    pub audit_rotation: Rotation,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct VetoesConfig {
    pub ssh_sessions: bool,
    /// Absolute paths match the executable; bare names match `comm`.
    pub processes: Vec<String>,
    /// Only processes of this user count.
    pub process_uid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpotConfig {
    pub interruption_hook: Vec<String>,
    pub hook_timeout: Duration,
}

impl RawActions {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<ActionsConfig> {
        let mode = pick(
            invalid,
            "actions.mode",
            &self.mode,
            &[("dry-run", Mode::DryRun), ("enforce", Mode::Enforce)],
        );
        let spot_stop = pick(
            invalid,
            "actions.spot_stop",
            &self.spot_stop,
            &[
                ("refuse", SpotStop::Refuse),
                ("terminate", SpotStop::Terminate),
            ],
        );
        let webhook_url = url(invalid, "actions.webhook_url", &self.webhook_url, false);
        let boot_grace = duration(
            invalid,
            "actions.boot_grace",
            &self.boot_grace,
            Duration::ZERO..=WEEK,
        );
        let warning = duration(
            invalid,
            "actions.warning",
            &self.warning,
            Duration::ZERO..=WEEK,
        );
        let exec_timeout = duration(
            invalid,
            "actions.exec_timeout",
            &self.exec_timeout,
            Duration::from_millis(10)..=Duration::from_secs(3600),
        );
        if self.state_dir.trim().is_empty() {
            invalid(
                "actions.state_dir",
                "\"\" is empty; name a directory, such as \"/var/lib/gpuwatch\"".into(),
            );
        }
        let retry_for = duration(
            invalid,
            "actions.retry_for",
            &self.retry_for,
            Duration::ZERO..=DAY,
        );
        count(
            invalid,
            "actions.audit_max_mib",
            self.audit_max_mib,
            1..=1024,
            "a size in MiB between 1 and 1024",
        );
        count(
            invalid,
            "actions.audit_keep",
            self.audit_keep,
            1..=100,
            "a count of rotated files between 1 and 100",
        );
        Some(ActionsConfig {
            mode: mode?,
            boot_grace: boot_grace?,
            warning: warning?,
            spot_stop: spot_stop?,
            webhook_url: webhook_url?,
            wall: self.wall,
            exec_timeout: exec_timeout?,
            retry_for: retry_for?,
            state_dir: PathBuf::from(&self.state_dir),
            audit_rotation: Rotation {
                max_bytes: self.audit_max_mib << 20,
                keep: self.audit_keep,
            },
        })
    }
}

impl RawVetoes {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<VetoesConfig> {
        if self.processes.iter().any(|p| p.trim().is_empty()) {
            invalid("vetoes.processes", "\"\" is not a process name".into());
            return None;
        }
        Some(VetoesConfig {
            ssh_sessions: self.ssh_sessions,
            processes: self.processes.clone(),
            process_uid: self.process_uid,
        })
    }
}

impl RawSpot {
    pub(super) fn validate(&self, invalid: &mut impl FnMut(&str, String)) -> Option<SpotConfig> {
        let hook_timeout = duration(
            invalid,
            "spot.hook_timeout",
            &self.hook_timeout,
            Duration::from_millis(10)..=Duration::from_secs(600),
        );
        Some(SpotConfig {
            interruption_hook: self.interruption_hook.clone(),
            hook_timeout: hook_timeout?,
        })
    }
}

/// How large `audit.jsonl` grows before it is rotated, and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    pub max_bytes: u64,
    pub keep: u32,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            max_bytes: 16 << 20,
            keep: 5,
        }
    }
}
