//! The shipped unit, `systemd/gpuwatch.service`, is valid and hardened: `systemd-analyze verify`
//! accepts it without a single warning, and `systemd-analyze security` rates its exposure at
//! 2.0 or lower. Both run against a throwaway root directory, never the machine's own units.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const UNIT: &str = "gpuwatch.service";
const MAX_EXPOSURE: f64 = 2.0;

/// A root holding the unit, a stand-in for the binary that verify checks ExecStart against, and
/// the two targets that the unit's default dependencies require.
fn fake_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let units = root.path().join("etc/systemd/system");
    let bin = root.path().join("usr/bin");
    fs::create_dir_all(&units).unwrap();
    fs::create_dir_all(&bin).unwrap();
    let unit = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/gpuwatch.service");
    fs::copy(unit, units.join(UNIT)).unwrap();
    for target in ["sysinit.target", "shutdown.target"] {
        fs::write(units.join(target), "[Unit]\n").unwrap();
    }
    fs::write(bin.join("gpuwatch"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(bin.join("gpuwatch"), fs::Permissions::from_mode(0o755)).unwrap();
    root
}

/// Runs `systemd-analyze ARGS --root=ROOT gpuwatch.service`; returns whether it succeeded and
/// its stdout and stderr.
fn systemd_analyze(args: &[&str], root: &Path) -> (bool, String, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .arg(format!("--root={}", root.display()))
        .arg(UNIT)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run systemd-analyze ({e}): install Debian's `systemd` package")
        });
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn verify_accepts_the_unit_without_warnings() {
    let root = fake_root();
    let (ok, stdout, stderr) = systemd_analyze(&["verify"], root.path());
    // An unknown key or a bad value is only a warning: the status stays 0.
    assert!(
        ok && stdout.trim().is_empty() && stderr.trim().is_empty(),
        "systemd-analyze verify:\n{stdout}{stderr}"
    );
}

#[test]
fn security_rates_the_exposure_at_most_2() {
    let root = fake_root();
    let (ok, stdout, stderr) = systemd_analyze(&["security", "--offline=true"], root.path());
    assert!(ok, "systemd-analyze security:\n{stdout}{stderr}");
    let prefix = format!("Overall exposure level for {UNIT}:");
    let score: f64 = stdout
        .lines()
        .find_map(|l| l.split_once(prefix.as_str()))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{stdout}{stderr}"));
    println!("systemd-analyze security: exposure level {score}");
    assert!(
        score <= MAX_EXPOSURE,
        "exposure {score} > {MAX_EXPOSURE:.1}:\n{stdout}"
    );
}

/// The config may hold a webhook URL, so the package installs it 0640 root: the unit has systemd
/// (as root) hand the daemon's dynamic user a copy as a credential, and runs the daemon on that
/// copy. Other secrets (a web config, a TLS key, a webhook URL file) follow it the same way,
/// named relative to it, with `LoadCredential=` lines in a drop-in.
#[test]
fn the_daemon_reads_its_config_through_a_credential() {
    let unit = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/gpuwatch.service"
    ))
    .unwrap();
    let lines: Vec<&str> = unit.lines().collect();
    assert!(
        lines.contains(&"LoadCredential=gpuwatch.toml:/etc/gpuwatch/gpuwatch.toml"),
        "the unit does not hand the daemon its config as a credential:\n{unit}"
    );
    let exec: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with("ExecStart="))
        .collect();
    assert_eq!(
        exec,
        [&"ExecStart=/usr/bin/gpuwatch run --config ${CREDENTIALS_DIRECTORY}/gpuwatch.toml"]
    );
}
