//! The image, built for real with Debian's buildah from the project's `Containerfile`, offline:
//! the runtime base is assembled here (glibc as `ldd` names it), and the binaries come from an
//! image holding the ones cargo built (`BINARIES`), so no registry is reached. Then the image's
//! root filesystem holds no shell and no package manager, says non-root and `gpuwatch run`, and
//! runs `gpuwatch demo` under chroot. Needs root and buildah (`scripts/test` installs it).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

#[test]
fn the_image_holds_only_gpuwatch_and_runs_the_demo() {
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
        &common::fake_library(),
        &out.join("libgpuwatch_fake_nvml.so"),
    );

    // The runtime base, as distroless is: glibc, a passwd with the non-root user, /tmp.
    let base = buildah(&["from", "scratch"]);
    made.containers.push(base.clone());
    let base_root = PathBuf::from(buildah(&["mount", &base]));
    let mut libs = libraries(&out.join("gpuwatch"));
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
    // The allocator runs as the systemd unit runs it.
    let tunables = format!(
        "GLIBC_TUNABLES={}",
        common::unit_environment("GLIBC_TUNABLES")
    );
    assert!(
        oci["Env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == tunables.as_str()),
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

    // And it runs: the demo, under chroot into the image's root filesystem, with /proc
    // mounted as a container runtime mounts it.
    let proc_dir = rootfs.join("proc");
    std::fs::create_dir_all(&proc_dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "proc", "proc"])
        .arg(&proc_dir)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount -t proc");
    let proc_mount = Unmount(proc_dir);
    let port = common::free_port();
    let mut demo = common::Killed(
        Command::new("/usr/sbin/chroot")
            .arg(&rootfs)
            .args(["/usr/bin/gpuwatch", "demo", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .env_clear()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = demo.0.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    let Some(addr) = BufReader::new(demo.0.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| common::ready_address(&l))
    else {
        drop(demo);
        panic!(
            "the demo in the image did not start:\n{}",
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
    drop(demo);
    drop(proc_mount);
    buildah(&["umount", &ctr]);
}
