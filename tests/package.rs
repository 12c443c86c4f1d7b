//! The Debian package: `cargo deb` (cargo-deb, from `[package.metadata.deb]` in Cargo.toml) packs
//! the binary this `cargo test` built, without building again, into a throwaway directory. Then
//! `dpkg-deb` shows that its control fields name the package, version, section and a libc6
//! dependency; that it holds the binary, the unit, the config (a conffile, so upgrades keep the
//! admin's edits, and readable by root only, since it may hold a webhook URL), the example
//! configs, every dashboard with the Grafana provisioning file pointing at them, the Prometheus
//! rules and the README; and that its maintainer scripts never
//! enable or start the daemon, which can stop the machine. Extracted (never installed: no
//! `dpkg -i`, no `systemctl`), the packaged binary accepts the packaged configs, the packaged unit
//! hands the daemon the config as a systemd credential, `systemd-analyze verify` accepts the
//! unit against the packaged binary, and every dashboard is JSON.
//! Needs cargo-deb, dpkg-deb and systemd-analyze (`scripts/test` installs them).
//!
//! Also here, since it is about what the release binary is made of: the dev-dependencies change
//! no feature of a crate the daemon links.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CONF: &str = "/etc/gpuwatch/gpuwatch.toml";
/// The unit's copy of `CONF`, which only the service can read.
const CREDENTIAL: &str = "gpuwatch.toml";
const UNIT: &str = "usr/lib/systemd/system/gpuwatch.service";
const DASHBOARDS: &str = "usr/share/gpuwatch/dashboards";

/// Runs `cmd`, asserts that it succeeded, and returns its output.
fn ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({e}): scripts/test installs it"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the package from the binary cargo built for these tests. cargo-deb packages
/// `target/release/gpuwatch`, rewritten to `<target dir>/release/`: with `CARGO_TARGET_DIR`
/// pointing at a throwaway directory holding a link to this binary, `--no-build` packs exactly it
/// (cargo-deb refuses to name the dev profile's directory). Returns the .deb's path.
fn build_package(dir: &Path) -> PathBuf {
    let target = dir.join("target");
    fs::create_dir_all(target.join("release")).unwrap();
    // A link: cargo-deb strips into a file of its own (`strip -o`), never in place.
    for (built, name) in [
        (env!("CARGO_BIN_EXE_gpuwatch"), "gpuwatch"),
        (
            env!("CARGO_BIN_EXE_gpuwatch-controller"),
            "gpuwatch-controller",
        ),
    ] {
        std::os::unix::fs::symlink(built, target.join("release").join(name)).unwrap();
    }
    let out_dir = dir.join("deb");
    fs::create_dir_all(&out_dir).unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = std::time::Instant::now();
    ok(
        Command::new(cargo)
            .current_dir(ROOT)
            .env("CARGO_TARGET_DIR", &target)
            .args(["deb", "--no-build", "--offline", "--fast", "--output"])
            .arg(&out_dir)
            .arg("--manifest-path")
            .arg(Path::new(ROOT).join("Cargo.toml")),
        "cargo deb (cargo install cargo-deb)",
    );
    println!("cargo deb: {:.1?}", started.elapsed());
    let debs: Vec<PathBuf> = fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "one .deb in {}: {debs:?}", out_dir.display());
    debs.into_iter().next().unwrap()
}

/// The control file's fields (continuation lines folded into the field before them).
fn control_fields(deb: &Path) -> BTreeMap<String, String> {
    let out = ok(
        Command::new("dpkg-deb").arg("--field").arg(deb),
        "dpkg-deb --field",
    );
    let mut fields = BTreeMap::new();
    let mut last = String::new();
    for line in text(&out).lines() {
        if line.starts_with(' ') {
            let value: &mut String = fields.get_mut(&last).unwrap();
            value.push('\n');
            value.push_str(line);
        } else if let Some((k, v)) = line.split_once(':') {
            last = k.to_string();
            fields.insert(last.clone(), v.trim().to_string());
        }
    }
    fields
}

/// Path (without the leading `.`) to the `ls -l`-style mode and owner of every entry.
fn contents(deb: &Path) -> BTreeMap<String, (String, String)> {
    let out = ok(
        Command::new("dpkg-deb").arg("--contents").arg(deb),
        "dpkg-deb --contents",
    );
    text(&out)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f[5].trim_start_matches('.').trim_end_matches('/');
            (path.to_string(), (f[0].to_string(), f[1].to_string()))
        })
        .collect()
}

/// The files of `dir` in the source tree whose names pass `keep`.
fn source_files(dir: &str, keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    fs::read_dir(Path::new(ROOT).join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| keep(n))
        .collect()
}

#[test]
fn the_package_installs_a_working_daemon_that_is_not_enabled() {
    let tmp = tempfile::tempdir().unwrap();
    let deb = build_package(tmp.path());

    // Control fields.
    let fields = control_fields(&deb);
    let field = |k: &str| fields.get(k).map(String::as_str).unwrap_or_default();
    assert_eq!(field("Package"), "gpuwatch", "{fields:#?}");
    assert_eq!(
        field("Version"),
        format!("{}-1", env!("CARGO_PKG_VERSION")),
        "{fields:#?}"
    );
    assert_eq!(field("Section"), "admin", "{fields:#?}");
    assert!(
        field("Depends")
            .split(',')
            .any(|d| d.trim().starts_with("libc6")),
        "Depends has no libc6 ($auto needs dpkg-shlibdeps, from dpkg-dev): {fields:#?}"
    );
    assert!(!field("Maintainer").is_empty(), "{fields:#?}");
    // Folded to single spaces: dpkg wraps the extended description.
    let description = field("Description")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        description.starts_with(env!("CARGO_PKG_DESCRIPTION"))
            && description.contains("systemctl enable --now gpuwatch"),
        "Description, with the extended one: {description}"
    );

    // The file list: what the README promises is where it says.
    let files = contents(&deb);
    let mut expected: Vec<String> = [
        "/usr/bin/gpuwatch",
        "/usr/bin/gpuwatch-controller",
        CONF,
        "/usr/lib/systemd/system/gpuwatch.service",
        "/usr/share/doc/gpuwatch/README.md",
        "/usr/share/doc/gpuwatch/copyright",
        "/usr/share/doc/gpuwatch/examples/aws-spot.toml",
        "/usr/share/doc/gpuwatch/examples/iam-policy.json",
        "/usr/share/doc/gpuwatch/examples/azure-role.json",
        "/usr/share/doc/gpuwatch/examples/azure-operations-role.json",
        "/usr/share/doc/gpuwatch/examples/azure-budgets-role.json",
        "/usr/share/doc/gpuwatch/examples/gcp-role.yaml",
        "/usr/share/doc/gpuwatch/examples/gcp-operations-role.yaml",
        "/usr/share/doc/gpuwatch/examples/alibaba-ram-policy.json",
        "/usr/share/doc/gpuwatch/examples/alertmanager.yml",
        "/usr/share/gpuwatch/prometheus/alerts.yml",
        "/usr/share/gpuwatch/prometheus/fleet.yml",
        "/usr/share/gpuwatch/dashboards/provisioning.yml",
    ]
    .map(String::from)
    .into();
    let dashboards = source_files("dashboards", |n| n.ends_with(".json"));
    assert!(!dashboards.is_empty());
    expected.extend(dashboards.iter().map(|d| format!("/{DASHBOARDS}/{d}")));
    let listing = files.keys().cloned().collect::<Vec<_>>().join("\n");
    for path in &expected {
        let (mode, owner) = files
            .get(path)
            .unwrap_or_else(|| panic!("the package lacks {path}; it holds:\n{listing}"));
        assert_eq!(owner, "0/0", "{path} is owned by {owner}");
        let want = match path.as_str() {
            "/usr/bin/gpuwatch" | "/usr/bin/gpuwatch-controller" => "-rwxr-xr-x",
            // It may hold webhook_url: root reads it, and hands the daemon a copy.
            CONF => "-rw-r-----",
            _ => "-rw-r--r--",
        };
        assert_eq!(mode, want, "{path}'s mode");
    }
    println!("package contents:\n{listing}");

    // Control archive: the config is a conffile; the scripts neither enable nor start the unit.
    let control = tmp.path().join("control");
    ok(
        Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control),
        "dpkg-deb -e",
    );
    let conffiles = fs::read_to_string(control.join("conffiles")).unwrap();
    assert!(
        conffiles.lines().any(|l| l == CONF),
        "conffiles:\n{conffiles}"
    );
    check_maintainer_scripts(&control, tmp.path());

    // Extracted: the binary accepts the configs it ships.
    let root = tmp.path().join("root");
    ok(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        "dpkg-deb -x",
    );
    let binary = root.join("usr/bin/gpuwatch");
    for config in [
        root.join(CONF.trim_start_matches('/')),
        root.join("usr/share/doc/gpuwatch/examples/aws-spot.toml"),
    ] {
        let out = ok(
            Command::new(&binary)
                .arg("check-config")
                .arg(&config)
                // Loading a config reaches nothing; should that change, it reaches no AWS.
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
                .env("AWS_REGION", "us-east-1"),
            &format!("gpuwatch check-config {}", config.display()),
        );
        assert!(text(&out).contains(": ok"), "{}", text(&out));
    }

    // The unit runs the packaged binary on the packaged config, read through a credential (systemd
    // reads the file as root; the daemon's DynamicUser reads its private copy), and systemd
    // accepts it.
    let unit = fs::read_to_string(root.join(UNIT)).unwrap();
    let exec = unit
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .unwrap_or_else(|| panic!("no ExecStart= in:\n{unit}"));
    assert_eq!(
        exec,
        format!("ExecStart=/usr/bin/gpuwatch run --config ${{CREDENTIALS_DIRECTORY}}/{CREDENTIAL}")
    );
    let credential = format!("LoadCredential={CREDENTIAL}:{CONF}");
    assert!(
        unit.lines().any(|l| l == credential),
        "no {credential} in:\n{unit}"
    );
    verify_unit(&root);

    // Dashboards: every one is JSON, and Grafana's provider reads them where they are.
    let packaged = fs::read_dir(root.join(DASHBOARDS)).unwrap();
    let mut parsed = 0;
    for entry in packaged {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = fs::read_to_string(&path).unwrap();
            serde_json::from_str::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            parsed += 1;
        }
    }
    assert_eq!(parsed, dashboards.len());
    let provisioning = fs::read_to_string(root.join(DASHBOARDS).join("provisioning.yml")).unwrap();
    assert!(
        provisioning
            .lines()
            .any(|l| l.trim() == format!("path: /{DASHBOARDS}")),
        "provisioning.yml does not read /{DASHBOARDS}:\n{provisioning}"
    );
}

/// Runs postinst as dpkg does for a fresh install and for an upgrade of a unit the admin never
/// enabled, on a machine running systemd, and asserts that nothing was enabled or started.
/// `PATH` holds only stand-ins that record their arguments (deb-systemd-helper answers as it
/// would: a new unit counts as "was enabled", which the enabling snippet acts on), and the
/// script's probe for a running systemd, /run/systemd/system, is pointed at a directory that
/// exists: nothing on this machine is touched. prerm stops the daemon on removal.
fn check_maintainer_scripts(control: &Path, tmp: &Path) {
    let stubs = tmp.join("stubs");
    let booted = tmp.join("run-systemd-system");
    fs::create_dir_all(&stubs).unwrap();
    fs::create_dir_all(&booted).unwrap();
    let log = tmp.join("calls");
    let helper = r#"case "$*" in
debian-installed*) [ -n "$UPGRADE" ]; exit $?;;
"--quiet was-enabled"*) [ -z "$UPGRADE" ]; exit $?;;
esac"#;
    for (name, answer) in [
        ("deb-systemd-helper", helper),
        ("deb-systemd-invoke", ""),
        ("systemctl", ""),
        // No override of the config's mode.
        ("dpkg-statoverride", "exit 1"),
        ("chmod", "exec /bin/chmod \"$@\""),
    ] {
        let stub = stubs.join(name);
        fs::write(
            &stub,
            format!(
                "#!/bin/sh\necho \"${{0##*/}} $*\" >> '{}'\n{answer}\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&stub, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let postinst = fs::read_to_string(control.join("postinst")).unwrap();
    assert!(postinst.contains("/run/systemd/system"), "{postinst}");
    // The config an older package left world-readable, here in the test's own directory.
    let config = tmp.join("gpuwatch.toml");
    assert!(
        postinst.contains("/etc/gpuwatch/gpuwatch.toml"),
        "{postinst}"
    );
    let postinst = postinst
        .replace("/run/systemd/system", &booted.display().to_string())
        .replace("/etc/gpuwatch/gpuwatch.toml", &config.display().to_string());
    for (args, upgrade) in [(["configure", ""], ""), (["configure", "0.0.1-1"], "yes")] {
        let _ = fs::remove_file(&log);
        fs::write(&config, "").unwrap();
        fs::set_permissions(&config, fs::Permissions::from_mode(0o644)).unwrap();
        ok(
            Command::new("/bin/sh")
                .arg("-c")
                .arg(&postinst)
                .arg("postinst")
                .args(args)
                .env_clear()
                .env("PATH", &stubs)
                .env("UPGRADE", upgrade),
            &format!("postinst {args:?}"),
        );
        let calls = fs::read_to_string(&log).unwrap_or_default();
        assert!(
            calls.contains("daemon-reload"),
            "postinst {args:?} did not reach its systemd part:\n{calls}"
        );
        let mode = fs::metadata(&config).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "postinst {args:?} left the config {mode:o}");
        for call in calls.lines() {
            let words: Vec<&str> = call.split_whitespace().collect();
            let acts = match words.as_slice() {
                ["deb-systemd-helper", "enable", ..] => true,
                // try-restart restarts a running daemon onto the new binary, starts none.
                ["deb-systemd-invoke", action, ..] => *action != "try-restart",
                ["systemctl", rest @ ..] => rest.iter().any(|w| *w == "enable" || *w == "start"),
                _ => false,
            };
            assert!(
                !acts,
                "postinst {args:?} enables or starts the unit: {call}\n{calls}"
            );
        }
    }
    let prerm = fs::read_to_string(control.join("prerm")).unwrap();
    assert!(
        prerm.contains("deb-systemd-invoke stop gpuwatch.service"),
        "prerm does not stop the unit:\n{prerm}"
    );
}

/// `systemd-analyze verify` on the extracted unit, under `--root` so ExecStart is the extracted
/// binary and no unit of this machine is read. The two targets the unit's default dependencies
/// name are stubbed in the root's /etc. An unknown key is only a warning, so none may be printed.
fn verify_unit(root: &Path) {
    let etc = root.join("etc/systemd/system");
    fs::create_dir_all(&etc).unwrap();
    for target in ["sysinit.target", "shutdown.target"] {
        fs::write(etc.join(target), "[Unit]\n").unwrap();
    }
    let out = ok(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(format!("--root={}", root.display()))
            .arg("gpuwatch.service"),
        "systemd-analyze verify (Debian's systemd)",
    );
    let said = format!("{}{}", text(&out), String::from_utf8_lossy(&out.stderr));
    assert!(said.trim().is_empty(), "systemd-analyze verify:\n{said}");
}
