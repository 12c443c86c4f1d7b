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

    // The bundled price table's date, for `gpuwatch --version`.
    println!("cargo:rerun-if-changed=crates/gpuwatch-core/src/cost/prices.csv");
    let prices =
        std::fs::read_to_string("crates/gpuwatch-core/src/cost/prices.csv").unwrap_or_default();
    let as_of = prices
        .lines()
        .find_map(|l| l.strip_prefix("# prices as of "))
        .map_or("unknown", str::trim);
    println!("cargo:rustc-env=GPUWATCH_PRICES_AS_OF={as_of}");

    symbol_order();
}

/// Release builds link the functions that the steady state runs (`link/symbol-order.txt`,
/// written by the benchmark's profile mode) together at the start of the text. The kernel maps
/// file pages 64 kB at a time around each one touched, so hot code spread over 15 MB of text
/// keeps several MB resident, and hot code kept together keeps far less.
///
/// Only with rust-lld, which rustc uses on x86_64 Linux from 1.90 unless a linker is set: another
/// linker (GNU ld has no such option) links as before. `GPUWATCH_SYMBOL_ORDER=0` turns it off.
fn symbol_order() {
    const FILE: &str = "link/symbol-order.txt";
    println!("cargo:rerun-if-changed={FILE}");
    println!("cargo:rerun-if-env-changed=GPUWATCH_SYMBOL_ORDER");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    // "rustc 1.95.0 (...)" as (1, 95).
    let rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let v = String::from_utf8_lossy(&o.stdout).into_owned();
            let mut n = v.split_whitespace().nth(1)?.split('.');
            Some((
                n.next()?.parse::<u32>().ok()?,
                n.next()?.parse::<u32>().ok()?,
            ))
        });
    let own_linker = std::env::var_os("RUSTC_LINKER").is_some()
        || env("CARGO_ENCODED_RUSTFLAGS")
            .split('\x1f')
            .any(|f| f.contains("linker") || f.contains("link-self-contained"));
    let wanted = env("PROFILE") == "release"
        && env("TARGET") == "x86_64-unknown-linux-gnu"
        && rustc.is_some_and(|v| v >= (1, 90))
        && !own_linker
        && env("GPUWATCH_SYMBOL_ORDER") != "0";
    let path = std::path::Path::new(&env("CARGO_MANIFEST_DIR")).join(FILE);
    if wanted && path.is_file() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            path.display()
        );
        // Names the file lists that this build lacks (it is refreshed by hand) are skipped.
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}
