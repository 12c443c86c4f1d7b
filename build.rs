//! Records the source revision (for `gpuwatch_build_info` and `--version`) and the bundled price
//! table's date (for `--version`).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=GPUWATCH_REVISION");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let revision = std::env::var("GPUWATCH_REVISION").ok().or_else(|| {
        let out = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    });
    println!(
        "cargo:rustc-env=GPUWATCH_REVISION={}",
        revision.unwrap_or_else(|| "unknown".to_string())
    );

    // EC2's built-in price table's date, for `gpuwatch --version`.
    println!("cargo:rerun-if-changed=src/cloud/aws/prices.csv");
    let prices = std::fs::read_to_string("src/cloud/aws/prices.csv").unwrap_or_default();
    let as_of = prices
        .lines()
        .find_map(|l| l.strip_prefix("# prices as of "))
        .map_or("unknown", str::trim);
    println!("cargo:rustc-env=GPUWATCH_PRICES_AS_OF={as_of}");
}
