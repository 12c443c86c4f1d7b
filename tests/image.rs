//! The image, built for real with Debian's buildah from the project's `Containerfile`, offline:
//! the runtime base is assembled here (glibc as `ldd` names it), and the binaries come from an
//! image holding what cargo built (`BINARIES`: the binary, and the fake NVML library a build
//! leaves beside it), so no registry is reached. Then the image's root filesystem holds no shell,
//! no package manager and no NVML library, neither the fake one nor any other (no file of those
//! names, and no ELF file that exports NVML's entry point), says non-root and `gpuwatch run`, and
//! runs its entrypoint and command under chroot, with the fake library put where the NVIDIA
//! container runtime puts the host's NVML. Needs root, buildah (`scripts/test` installs it) and
//! binutils.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The symbol every NVML library, fake or real, exports: nvml-wrapper's first call.
const NVML_ENTRY: &str = "nvmlInit_v2";
/// Where the NVIDIA container runtime mounts the host's NVML in a Debian-based image: a directory
/// the loader searches without a cache.
const RUNTIME_NVML: &str = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";

/// Runs buildah on the vfs driver, asserts success, and returns its stdout, trimmed.
fn buildah(args: &[&str]) -> String {
    let out = Command::new("buildah")
        .args(["--storage-driver", "vfs"])
        .args(args)
        .output()
        .expect("buildah not found: scripts/test installs Debian's buildah");
    assert!(
        out.status.success(),
        "buildah {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Containers and images made by this test, removed when it ends (also when it fails).
#[derive(Default)]
struct Made {
    containers: Vec<String>,
    images: Vec<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = Command::new("buildah")
                .args(["--storage-driver", "vfs", "rm", c])
                .output();
        }
        for i in &self.images {
            let _ = Command::new("buildah")
                .args(["--storage-driver", "vfs", "rmi", "-f", i])
                .output();
        }
    }
}

/// A mount point unmounted when dropped.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The shared libraries `file` needs, by absolute path, as the loader resolves them.
fn libraries(file: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(file).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Copies `from` to the same absolute path under `root`, following links.
fn install(root: &Path, from: &Path) {
    let to = root.join(from.strip_prefix("/").unwrap());
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(std::fs::canonicalize(from).unwrap(), &to).unwrap();
}

/// A binary with its debug information stripped: the image gets what runs, not 700 MB of
/// symbols (CI builds the debug profile).
fn stripped(from: &Path, to: &Path) {
    let status = Command::new("strip")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .unwrap();
    assert!(status.success(), "strip {}", from.display());
}

/// Every regular file under `root` (links not followed), as paths relative to it.
fn files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                found.push(entry.path().strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    found.sort();
    found
}

/// Whether `file` is an ELF object whose dynamic symbol table defines `symbol`.
fn exports(file: &Path, symbol: &str) -> bool {
    let mut magic = [0u8; 4];
    let is_elf = std::fs::File::open(file)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF";
    if !is_elf {
        return false;
    }
    let out = Command::new("nm")
        .args(["--dynamic", "--defined-only"])
        .arg(file)
        .output()
        .expect("nm not found: install binutils");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().last() == Some(symbol))
}

/// The NVML libraries among `files` under `root`: by name (the fake library, or any
/// `libnvidia-ml`), or by content (an ELF file that exports NVML's entry point).
fn nvml_libraries(root: &Path, files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .filter(|f| {
            let name = f.file_name().unwrap().to_string_lossy();
            name == "libgpuwatch_fake_nvml.so"
                || name.starts_with("libnvidia-ml")
                || exports(&root.join(f), NVML_ENTRY)
        })
        .map(|f| f.display().to_string())
        .collect()
}

#[test]
fn the_image_holds_only_gpuwatch_and_runs_on_the_hosts_nvml() {
    if unsafe { libc::geteuid() } != 0 {
        panic!("building images with buildah here needs root");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tag = std::process::id();
    let mut made = Made::default();
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    stripped(Path::new(common::BIN), &out.join("gpuwatch"));
    stripped(
        Path::new(common::CONTROLLER_BIN),
        &out.join("gpuwatch-controller"),
    );
    stripped(
        &common::fake_library(),
        &out.join("libgpuwatch_fake_nvml.so"),
    );

    // The runtime base, as distroless is: glibc, a passwd with the non-root user, /tmp.
    let base = buildah(&["from", "scratch"]);
    made.containers.push(base.clone());
    let base_root = PathBuf::from(buildah(&["mount", &base]));
    let mut libs = libraries(&out.join("gpuwatch"));
    libs.extend(libraries(&out.join("gpuwatch-controller")));
    libs.extend(libraries(&out.join("libgpuwatch_fake_nvml.so")));
    libs.push("/lib64/ld-linux-x86-64.so.2".into());
    libs.sort();
    libs.dedup();
    for lib in &libs {
        install(&base_root, lib);
    }
    std::fs::create_dir_all(base_root.join("etc")).unwrap();
    std::fs::write(
        base_root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    let tmp = base_root.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    buildah(&["umount", &base]);
    let base_image = format!("localhost/gpuwatch-test-base:{tag}");
    buildah(&["commit", "--quiet", &base, &base_image]);
    made.images.push(base_image.clone());

    // The binaries, as the build stage would leave them in /out.
    let bins = buildah(&["from", "scratch"]);
    made.containers.push(bins.clone());
    buildah(&["copy", &bins, out.to_str().unwrap(), "/out"]);
    let bins_image = format!("localhost/gpuwatch-test-binaries:{tag}");
    buildah(&["commit", "--quiet", &bins, &bins_image]);
    made.images.push(bins_image.clone());

    // The project's Containerfile, with those two standing in for the registry.
    let image = format!("localhost/gpuwatch-test:{tag}");
    buildah(&[
        "bud",
        "--quiet",
        "--layers=false",
        "-f",
        root.join("Containerfile").to_str().unwrap(),
        "--build-arg",
        &format!("BASE_IMAGE={base_image}"),
        "--build-arg",
        &format!("BINARIES={bins_image}"),
        "-t",
        &image,
        root.to_str().unwrap(),
    ]);
    made.images.push(image.clone());

    // What the image says it is.
    let config: serde_json::Value =
        serde_json::from_str(&buildah(&["inspect", "--type", "image", &image])).unwrap();
    let oci = &config["OCIv1"]["config"];
    assert_eq!(oci["User"], "65532:65532", "{oci}");
    // The allocator runs with glibc's defaults, as everywhere.
    assert!(
        !oci["Env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().is_some_and(|e| e.starts_with("GLIBC_TUNABLES="))),
        "{oci}"
    );
    assert_eq!(oci["Entrypoint"], serde_json::json!(["/usr/bin/gpuwatch"]));
    assert_eq!(
        oci["Cmd"],
        serde_json::json!(["run", "--config", "/etc/gpuwatch/gpuwatch.toml"])
    );

    // What it holds: gpuwatch, and nothing to run but gpuwatch.
    let ctr = buildah(&["from", &image]);
    made.containers.push(ctr.clone());
    let rootfs = PathBuf::from(buildah(&["mount", &ctr]));
    assert!(rootfs.join("usr/bin/gpuwatch").is_file());
    assert!(rootfs.join("usr/bin/gpuwatch-controller").is_file());
    // No NVML: the fake one is for tests and `cargo run -- demo`, the real one the runtime's.
    // The check finds the fake library as the build left it, by name and by content, and passes
    // the binary.
    assert_eq!(
        nvml_libraries(&out, &files(&out)),
        ["libgpuwatch_fake_nvml.so"]
    );
    assert!(exports(&out.join("libgpuwatch_fake_nvml.so"), NVML_ENTRY));
    assert!(!exports(&out.join("gpuwatch"), NVML_ENTRY));
    let held = files(&rootfs);
    assert!(held.len() > 3, "{held:?}");
    let nvml = nvml_libraries(&rootfs, &held);
    assert!(nvml.is_empty(), "the image holds NVML: {nvml:?}");
    for absent in [
        "bin/sh",
        "bin/bash",
        "usr/bin/sh",
        "usr/bin/apt",
        "usr/bin/apt-get",
        "usr/bin/dpkg",
        "sbin/apk",
        "usr/bin/microdnf",
    ] {
        assert!(!rootfs.join(absent).exists(), "the image holds {absent}");
    }

    // And it runs: its entrypoint and command, under chroot into the image's root filesystem, in
    // the image's environment, with /proc mounted and NVML put in place as a container runtime
    // does (in the container, never in the image). The fake library reads its GPUs from a
    // scenario file.
    let runtime_nvml = rootfs.join(RUNTIME_NVML);
    std::fs::create_dir_all(runtime_nvml.parent().unwrap()).unwrap();
    std::fs::copy(common::fake_library(), &runtime_nvml).unwrap();
    let scenario = "[[gpu]]\nutilization = 30\n".repeat(4);
    std::fs::write(rootfs.join("tmp/scenario.toml"), scenario).unwrap();
    let env: Vec<(String, String)> = oci["Env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            let (k, v) = e.as_str()?.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect();
    let mut command: Vec<String> = [&oci["Entrypoint"], &oci["Cmd"]]
        .iter()
        .flat_map(|v| v.as_array().unwrap().iter())
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let port = common::free_port();
    command.extend(["--listen".to_string(), format!("127.0.0.1:{port}")]);
    let proc_dir = rootfs.join("proc");
    std::fs::create_dir_all(&proc_dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "proc", "proc"])
        .arg(&proc_dir)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount -t proc");
    let proc_mount = Unmount(proc_dir);
    let mut daemon = common::Killed(
        Command::new("/usr/sbin/chroot")
            .arg(&rootfs)
            .args(&command)
            .env_clear()
            .envs(env)
            .env("GPUWATCH_FAKE_NVML_SCENARIO", "/tmp/scenario.toml")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = daemon.0.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    let Some(addr) = BufReader::new(daemon.0.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| common::ready_address(&l))
    else {
        drop(daemon);
        panic!(
            "the daemon in the image did not start ({command:?}):\n{}",
            log.join().unwrap()
        );
    };
    let first = common::get(addr, "/api/v1/snapshot?after=0&timeout=10s");
    let snap: serde_json::Value = serde_json::from_str(&first.body).unwrap();
    assert_eq!(snap["gpus"].as_array().unwrap().len(), 4, "{snap}");
    let scrape = common::Scrape::parse(&common::get(addr, "/metrics").body);
    common::metric("gpuwatch_gpus")
        .value(4.0)
        .assert_in(&scrape);
    drop(daemon);
    drop(proc_mount);
    buildah(&["umount", &ctr]);
}
