//! `gpuwatch demo`: the daemon over four simulated GPUs, from the shipped scenario.

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

pub fn run(listen: &str) -> ExitCode {
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
    // The config is a file, so that `gpuwatch hold --config` (which the status page shows)
    // finds the demo's state directory.
    let path = dir.path().join("gpuwatch.toml");
    let text = format!(
        // The demo's GPUs are all simulated: the machine's own AMD GPUs are not read.
        "{DEMO_CONFIG}\n[server]\nlisten = {}\n\n[nvml]\nlibrary = {}\n\n[amd]\nenabled = false\n",
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
         rule \"demo-any-gpu-idle\" (dry-run): stop when any GPU's utilization idles for 2 periods of 15 s\n\
         rule \"demo-sm-idle\": alert when any GPU's SM activity idles for 2 periods of 15 s\n\
         price $49.16/h, budget \"demo-monthly\" $5000; config in {}\n\
         open http://{}/ for the status page, or scrape http://{}/metrics; Ctrl-C stops",
        path.display(),
        crate::http::display_addr(listen),
        crate::http::display_addr(listen)
    );
    // The demo serves plain HTTP on loopback: no web config, so no TLS.
    super::run::run(move || Ok((config, None)))
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
