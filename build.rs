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
/// Only with rust-lld: rustc 1.90 or later on x86_64 Linux, built with its own lld (the sysroot
/// has `gcc-ld/ld.lld`; a distribution's rustc may not be), and no linker of the user's own
/// (`linker`, `-fuse-ld`, linker features or flavor), which links as before: the script is
/// tested with rust-lld only. `GPUWATCH_SYMBOL_ORDER=0` turns it off.
fn symbol_order() {
    const FILE: &str = "link/symbol-order.txt";
    println!("cargo:rerun-if-changed={FILE}");
    for var in ["GPUWATCH_SYMBOL_ORDER", "RUSTC_LINKER"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let ask = |arg: &str| {
        Command::new(&rustc)
            .arg(arg)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // "rustc 1.95.0 (...)" as (1, 95).
    let version = ask("--version").and_then(|v| {
        let mut n = v.split_whitespace().nth(1)?.split('.');
        Some((
            n.next()?.parse::<u32>().ok()?,
            n.next()?.parse::<u32>().ok()?,
        ))
    });
    let target = env("TARGET");
    let own_lld = ask("--print=sysroot").is_some_and(|root| {
        std::path::Path::new(&root)
            .join("lib/rustlib")
            .join(&target)
            .join("bin/gcc-ld/ld.lld")
            .is_file()
    });
    let own_linker = std::env::var_os("RUSTC_LINKER").is_some()
        || env("CARGO_ENCODED_RUSTFLAGS").split('\x1f').any(|f| {
            ["linker", "link-self-contained", "fuse-ld"]
                .iter()
                .any(|k| f.contains(k))
        });
    let wanted = env("PROFILE") == "release"
        && target == "x86_64-unknown-linux-gnu"
        && version.is_some_and(|v| v >= (1, 90))
        && own_lld
        && !own_linker
        && env("GPUWATCH_SYMBOL_ORDER") != "0";
    let path = std::path::Path::new(&env("CARGO_MANIFEST_DIR")).join(FILE);
    if !wanted {
        return;
    }
    let Ok(list) = std::fs::read_to_string(&path) else {
        return;
    };
    let script = std::path::Path::new(&env("OUT_DIR")).join("symbol-order.ld");
    std::fs::write(&script, linker_script(&list)).expect("OUT_DIR is writable");
    // -Xlinker, not -Wl,: a comma in the path would split it. A script of INSERT commands adds to
    // the linker's default layout; it does not replace it.
    println!("cargo:rustc-link-arg-bins=-Xlinker");
    println!("cargo:rustc-link-arg-bins=--script={}", script.display());
}

/// The ordering file as a linker script. It describes the `.text` output section: first each
/// listed function's section, in the file's order (rustc emits one section per function:
/// `.text.<symbol>`, or `.text.unlikely.<symbol>` for a function marked cold), between the
/// symbols `gpuwatch_hot_start` and `gpuwatch_hot_end`; then the rest, as the linker would place
/// it. One `.text`, so that tools that look for it (valgrind's symbol reader does) see it all.
///
/// ThinLTO renames the local functions it shares between modules to `<name>.llvm.<hash>`, a hash
/// that changes with any change to the code: `--symbol-ordering-file` would need the exact name,
/// where the script matches the name with any hash, or none. A name the build lacks matches
/// nothing. Names with characters a script would read as syntax or as a pattern are left out
/// (mangled names have none).
fn linker_script(list: &str) -> String {
    let mut script = String::from(
        "/* Written by build.rs from link/symbol-order.txt. */\nSECTIONS {\n  .text : {\n    \
         HIDDEN(gpuwatch_hot_start = .);\n",
    );
    for name in list.lines().map(str::trim) {
        if name.is_empty()
            || name.starts_with('#')
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_$.".contains(&b))
        {
            continue;
        }
        let base = match name.rsplit_once(".llvm.") {
            Some((base, hash)) if hash.bytes().all(|b| b.is_ascii_digit()) => base,
            _ => name,
        };
        // With or without the suffix: whether a function is shared between modules changes too.
        script.push_str("    *(");
        for prefix in [".text.", ".text.unlikely."] {
            script.push_str(&format!("{prefix}{base} {prefix}{base}.llvm.* "));
        }
        script.push_str(")\n");
    }
    // Then the rest of the code, as the linker would place it.
    script.push_str(
        "    HIDDEN(gpuwatch_hot_end = .);\n    *(.text .text.*)\n  }\n}\nINSERT BEFORE .init;\n",
    );
    script
}
