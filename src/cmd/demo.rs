//! `gpuwatch demo`: the daemon over four simulated GPUs, from the shipped scenario; with
//! `--amd`, two simulated AMD GPUs beside them, read from a generated sysfs and procfs tree.

use std::io::Write as _;
use std::process::ExitCode;

use super::exit;

/// The demo's rules: short periods, so that within two minutes GPU 3 goes idle, the warning
/// comes, and the dry-run "would stop" follows; and one on GPM's SM activity, which catches
/// GPU 1 (100% utilization, 2% SM activity) where the utilization rule does not. A price and a budget make spend, forecast and
/// idle dollars show. The cloud stays "none": nothing leaves loopback. The library, state
/// directory and address are added when the file is written.
const DEMO_CONFIG: &str = r#"
[sampling]
interval = "1s"

[cost]
hourly_price_usd = 49.16

[[budgets]]
name = "demo-monthly"
limit_usd = 5000.0

[actions]
mode = "dry-run"
boot_grace = "10s"
warning = "20s"
wall = false

[[rules]]
name = "demo-any-gpu-idle"
metric = "gpu_utilization"
comparison = "less_than"
threshold = 0.05
period = "15s"
evaluation_periods = 2
gpus = "any"
action = "stop"

[[rules]]
name = "demo-sm-idle"
metric = "sm_active"
comparison = "less_than"
threshold = 0.05
period = "15s"
evaluation_periods = 2
gpus = "any"
action = "alert"
"#;

pub fn run(listen: &str, amd: bool) -> ExitCode {
    let listen: std::net::SocketAddr = match listen.parse() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("demo: --listen: \"{listen}\" is not an IP address and port, such as \"127.0.0.1:9400\"");
            return exit::USAGE.into();
        }
    };
    let library = match find_fake_library() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = match tempfile::Builder::new().prefix("gpuwatch-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("demo: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let scenario = dir.path().join("demo.toml");
    if let Err(e) = std::fs::write(&scenario, gpuwatch_fake_nvml::DEMO_SCENARIO) {
        eprintln!("demo: cannot write {}: {e}", scenario.display());
        return ExitCode::FAILURE;
    }
    // Set before any thread starts; the fake library reads it at nvmlInit.
    std::env::set_var(gpuwatch_fake_nvml::SCENARIO_ENV, &scenario);
    // The demo's GPUs are all simulated: the machine's own AMD GPUs are not read.
    let amd_section = if amd {
        match amd_tree(dir.path()) {
            Ok(tree) => {
                let section = format!(
                    "[amd]\nsysfs_root = {}\nproc_root = {}\n",
                    toml_string(&tree.sysfs_root().to_string_lossy()),
                    toml_string(&tree.proc_root().to_string_lossy())
                );
                drive(tree);
                section
            }
            Err(e) => {
                eprintln!("demo: cannot lay out the AMD GPUs' files: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        "[amd]\nenabled = false\n".to_string()
    };
    // The config is a file, so that `gpuwatch hold --config` (which the status page shows)
    // finds the demo's state directory.
    let path = dir.path().join("gpuwatch.toml");
    let text = format!(
        "{DEMO_CONFIG}\n[server]\nlisten = {}\n\n[nvml]\nlibrary = {}\n\n{amd_section}",
        toml_string(&listen.to_string()),
        toml_string(&library.to_string_lossy()),
    )
    .replacen(
        "[actions]\n",
        &format!(
            "[actions]\nstate_dir = {}\n",
            toml_string(&dir.path().join("state").to_string_lossy())
        ),
        1,
    );
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("demo: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    let config = match crate::cloud::load_config(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Written, not printed: a closed stdout must not stop the demo.
    let _ = writeln!(
        std::io::stdout(),
        "gpuwatch demo: 4 simulated Hopper GPUs (one training in bursts, one spinning at 100% \
         utilization with 2% SM activity, one steady, one going idle on a degraded PCIe link)\n\
         {}rule \"demo-any-gpu-idle\" (dry-run): stop when any GPU's utilization idles for 2 periods of 15 s\n\
         rule \"demo-sm-idle\": alert when any GPU's SM activity idles for 2 periods of 15 s\n\
         price $49.16/h, budget \"demo-monthly\" $5000; config in {}\n\
         open http://{}/ for the status page, or scrape http://{}/metrics; Ctrl-C stops",
        if amd {
            "and 2 simulated AMD Instinct MI300X, read from a sysfs tree (one training in bursts, one \
             holding a model while no request comes)\n"
        } else {
            ""
        },
        path.display(),
        crate::http::display_addr(listen),
        crate::http::display_addr(listen)
    );
    // The demo serves plain HTTP on loopback: no web config, so no TLS.
    super::run::run(move || Ok((config, None)))
}

/// The demo scenario's AMD GPUs as files under `dir/amd`, at the scenario's start.
fn amd_tree(dir: &std::path::Path) -> Result<gpuwatch_fake_nvml::amd::Tree, String> {
    let scenario = gpuwatch_fake_nvml::Scenario::parse(gpuwatch_fake_nvml::DEMO_SCENARIO, dir)?;
    let root = dir.join("amd");
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
    let t = scenario.sim_time(0.0);
    gpuwatch_fake_nvml::amd::Tree::create(&root, &scenario, t).map_err(|e| e.to_string())
}

/// Rewrites the AMD GPUs' files every second on a thread of their own, for as long as the
/// demo runs (a failure is said once, and the files stay as they were).
fn drive(tree: gpuwatch_fake_nvml::amd::Tree) {
    let spawned = std::thread::Builder::new()
        .name("gpuwatch-demo-amd".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                if let Err(e) = tree.update_at(started.elapsed().as_secs_f64()) {
                    eprintln!("demo: the AMD GPUs' files cannot be rewritten: {e}");
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("demo: the AMD GPUs' values will not change: {e}");
    }
}

/// Finds the fake NVML library: `GPUWATCH_FAKE_NVML_LIB`, else where cargo builds it beside the
/// running binary. `deps/` comes first: cargo rebuilds it there whenever gpuwatch is built, while
/// the copy in `target/<profile>/` is refreshed only when the whole workspace is. `Err` is the
/// message for a person.
fn find_fake_library() -> Result<std::path::PathBuf, String> {
    if let Some(p) = std::env::var_os("GPUWATCH_FAKE_NVML_LIB") {
        return Ok(p.into());
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the running binary: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| "the running binary has no directory".to_string())?;
    let file = gpuwatch_fake_nvml::LIBRARY_FILE;
    [dir.join("deps").join(file), dir.join(file)]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "cannot find {file} beside {}; build it with `cargo build --release` or name it in GPUWATCH_FAKE_NVML_LIB",
                exe.display()
            )
        })
}

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}
