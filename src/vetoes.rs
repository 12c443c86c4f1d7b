//! Activity vetoes: an open SSH session or a named process keeps the node busy.

use crate::config::VetoesConfig;

/// Why the node counts as busy regardless of its GPUs, if it does.
pub fn check(cfg: &VetoesConfig) -> Option<String> {
    if !cfg.ssh_sessions && cfg.processes.is_empty() {
        return None;
    }
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        if !cfg.processes.is_empty() {
            if let Ok(comm) = std::fs::read_to_string(dir.join("comm")) {
                let comm = comm.trim();
                if cfg.processes.iter().any(|p| p == comm) {
                    return Some(format!("process \"{comm}\" is running"));
                }
            }
        }
        if cfg.ssh_sessions {
            if let Ok(cmdline) = std::fs::read(dir.join("cmdline")) {
                let cmd = String::from_utf8_lossy(&cmdline);
                // sshd names each session process "sshd: USER@pts/N" (or "USER@notty").
                if let Some(rest) = cmd.strip_prefix("sshd: ") {
                    if let Some(user) = rest.split('@').next().filter(|_| rest.contains('@')) {
                        return Some(format!("an SSH session of \"{}\" is open", user.trim()));
                    }
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_vetoes() {
        // This test binary's own name is in /proc.
        let me = std::fs::read_to_string("/proc/self/comm")
            .unwrap()
            .trim()
            .to_string();
        let cfg = VetoesConfig {
            ssh_sessions: false,
            processes: vec![me.clone()],
        };
        assert_eq!(check(&cfg), Some(format!("process \"{me}\" is running")));
        let none = VetoesConfig {
            ssh_sessions: false,
            processes: vec!["no-such-process-xyz".into()],
        };
        assert_eq!(check(&none), None);
        assert_eq!(check(&VetoesConfig::default()), None);
    }
}
