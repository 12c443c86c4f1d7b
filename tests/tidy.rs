//! The shape of the code, held as rust-analyzer's tidy tests hold theirs: the layers that
//! ARCHITECTURE.md states are the only directions an import may take, no module graph has a
//! circle, and no source file outgrows what a reader takes in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The layers, lowest first, from ARCHITECTURE.md's "Layers" section: each numbered line
/// names its modules in backquotes.
fn layers() -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Layers"))
        .expect("ARCHITECTURE.md has a \"## Layers\" section");
    let mut out = BTreeMap::new();
    for line in section.lines() {
        let Some((number, rest)) = line.split_once(". ") else {
            continue;
        };
        let Ok(layer) = number.trim().parse::<usize>() else {
            continue;
        };
        // The modules are the backquoted names before the line's colon.
        let names = rest.split(':').next().unwrap_or("");
        for name in names.split('`').skip(1).step_by(2) {
            assert!(
                out.insert(name.to_string(), layer).is_none(),
                "{name} is in two layers"
            );
        }
    }
    assert!(out.len() > 10, "no layers read: {out:?}");
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(root().join("src")).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.trim_end_matches(".rs").to_string()
}

/// Every top-level module a file names through `crate::`, with the line it does so on. A
/// group (`crate::{a::X, b::{Y, Z}}`) may span lines, as rustfmt wraps it, and nest: each of its
/// items counts, named by its first segment, on the line where the item starts.
fn imports(text: &str) -> Vec<(String, usize)> {
    // Comments out, line breaks kept: a position maps back to its line.
    let code: Vec<char> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .collect();
    let line_at = |i: usize| code[..i].iter().filter(|c| **c == '\n').count() + 1;
    let ident = |from: usize| -> String {
        code[from..]
            .iter()
            .take_while(|c| c.is_alphanumeric() || **c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let needle: Vec<char> = "crate::".chars().collect();
    let mut i = 0;
    while i + needle.len() <= code.len() {
        if code[i..i + needle.len()] != needle[..] {
            i += 1;
            continue;
        }
        // `gpuwatch_core::…` and the like are other crates.
        let before = i.checked_sub(1).map(|b| code[b]);
        i += needle.len();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if code.get(i) != Some(&'{') {
            let name = ident(i);
            if !name.is_empty() {
                out.push((name, line_at(i)));
            }
            continue;
        }
        // A group: each top-level item's first segment, to its matching brace.
        let mut depth = 0;
        let mut item_start = true;
        while i < code.len() {
            match code[i] {
                '{' => {
                    depth += 1;
                    item_start = depth == 1;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => item_start = true,
                c if item_start && (c.is_alphanumeric() || c == '_') => {
                    item_start = false;
                    let name = ident(i);
                    out.push((name.clone(), line_at(i)));
                    i += name.chars().count();
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// Each import from one module of `src/` to another, with where it is made.
fn arrows() -> BTreeMap<(String, String), Vec<String>> {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for file in files {
        let from = module_of(&file);
        if from == "main" || from == "bin" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        for (to, line) in imports(&text) {
            if to != from {
                out.entry((from.clone(), to))
                    .or_default()
                    .push(format!("{rel}:{line}"));
            }
        }
    }
    out
}

#[test]
fn every_import_points_down_the_layers() {
    let layers = layers();
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f))
        // The executables' entry points (`main.rs`, `bin/`) and the crate root sit above it all.
        .filter(|m| m != "main" && m != "bin" && m != "lib")
        .collect();
    for m in &modules {
        assert!(
            layers.contains_key(m),
            "src/{m} is in no layer of ARCHITECTURE.md"
        );
    }
    let mut wrong = Vec::new();
    for ((from, to), at) in arrows() {
        if from == "lib" {
            continue;
        }
        let (Some(&lo), Some(&hi)) = (layers.get(&to), layers.get(&from)) else {
            wrong.push(format!("{from} -> {to}: {to} is in no layer ({})", at[0]));
            continue;
        };
        if lo >= hi {
            wrong.push(format!(
                "{from} (layer {hi}) -> {to} (layer {lo}), at {}",
                at.join(", ")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers of ARCHITECTURE.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_module_graph_has_no_circle() {
    let mut next: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in arrows().into_keys() {
        if from != "lib" {
            next.entry(from).or_default().insert(to);
        }
    }
    // Depth-first, with the path so far: meeting a module on it again is a circle.
    fn visit(
        m: &str,
        next: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(i) = path.iter().position(|p| p == m) {
            panic!("import circle: {} -> {m}", path[i..].join(" -> "));
        }
        if !done.insert(m.to_string()) {
            return;
        }
        path.push(m.to_string());
        for to in next.get(m).into_iter().flatten() {
            visit(to, next, path, done);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for m in next.keys() {
        visit(m, &next, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_import_reader_sees_grouped_and_inline_paths() {
    let text = "use crate::config::{Config, Names};\nuse crate::{gpu::Snapshot, time};\n\
                let x = crate::state::holds(); // crate::not_this\nuse gpuwatch_core::step;\n\
                use crate::{\n    actions::{Executor, Outcome},\n    // crate::commented\n    \
                metrics::{self, Shared},\n    slurm,\n};";
    let found = imports(text);
    let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["config", "gpu", "time", "state", "actions", "metrics", "slurm"]
    );
    // Each on the line its item starts on, as rustfmt wraps a group.
    let lines: Vec<usize> = found.iter().map(|(_, l)| *l).collect();
    assert_eq!(lines, [1, 2, 2, 3, 6, 8, 9]);
}
#[test]
fn no_source_file_outgrows_a_reading() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    sources(&root().join("crates"), &mut files);
    let mut long = Vec::new();
    for file in files {
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        let most = match rel.as_str() {
            "src/main.rs" => 150,
            "src/app.rs" => 300,
            _ => 700,
        };
        if lines > most {
            long.push(format!("{rel}: {lines} lines, more than {most}"));
        }
    }
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// The most lines a function outside tests may take: one screen and a half.
const MAX_FN_LINES: usize = 100;

/// Functions still longer than `MAX_FN_LINES`, each held to the length it has: none may grow,
/// and none may join them. Each leaves this list as it is split into named parts.
const LONG_FNS: &[(&str, &str, usize)] = &[];

/// Each function of `text` outside its tests: its name, first line and length in lines. Test
/// code (from a top-level `#[cfg(test)]` on) is left out. Braces are counted outside comments
/// and character literals; a format string's braces come in pairs.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let code = |l: &str| {
        let l = l.split("//").next().unwrap_or("");
        l.replace("'{'", "").replace("'}'", "")
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("#[cfg(test)]") {
            break;
        }
        let Some(name) = fn_name(lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut opened, mut j) = (0i64, false, i);
        while j < lines.len() {
            let c = code(lines[j]);
            for ch in c.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            // A declaration without a body (in a trait, or extern).
            if !opened && c.trim_end().ends_with(';') {
                break;
            }
            if opened && depth == 0 {
                break;
            }
            j += 1;
        }
        if opened {
            out.push((name, i + 1, j - i + 1));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The name of the function a line starts, if it starts one.
fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "pub" | "const" | "async" | "unsafe" | "extern" | "\"C\"" | "default" => continue,
            w if w.starts_with("pub(") => continue,
            "fn" => {
                let name: String = words
                    .next()?
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                return (!name.is_empty()).then_some(name);
            }
            _ => return None,
        }
    }
    None
}

#[test]
fn no_function_outgrows_a_screen_and_a_half() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    sources(&root().join("crates"), &mut files);
    let mut long = Vec::new();
    let mut seen = BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        let name = file.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name.ends_with("_tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (f, line, n) in functions(&text) {
            let held = LONG_FNS
                .iter()
                .find(|(p, name, _)| *p == rel && *name == f)
                .map(|x| x.2);
            if held.is_some() && n >= MAX_FN_LINES {
                seen.insert((rel.clone(), f.clone()));
            }
            let most = held.unwrap_or(MAX_FN_LINES - 1);
            if n > most {
                long.push(format!("{rel}:{line} {f}: {n} lines, more than {most}"));
            }
        }
    }
    assert!(long.is_empty(), "name its parts:\n{}", long.join("\n"));
    // One split below the bar leaves the list, so that it cannot grow back unseen.
    for (p, f, _) in LONG_FNS {
        assert!(
            seen.contains(&(p.to_string(), f.to_string())),
            "{p} {f} is in LONG_FNS but no longer long (or gone): take it out"
        );
    }
}

#[test]
fn the_function_reader_measures_bodies_not_declarations() {
    let text =
        "pub(crate) async fn a(x: u8) -> u8 {\n    let c = '{';\n    format!(\"{x}\");\n    x\n}\n\
                trait T {\n    fn b(&self);\n    fn c() {}\n}\n#[cfg(test)]\nfn d() {\n}\n";
    assert_eq!(
        functions(text),
        [("a".to_string(), 1, 5), ("c".to_string(), 8, 1)]
    );
}

#[test]
fn every_unsafe_block_says_why_it_is_sound_and_needed() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut bare = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if !code.contains("unsafe {") {
                continue;
            }
            let before = lines[n.saturating_sub(4)..n].join("\n");
            if !before.contains("SAFETY:") {
                bare.push(format!("{rel}:{}", n + 1));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "unsafe without a SAFETY comment (why it is sound, and why no safe API does it): {}",
        bare.join(", ")
    );
}

/// Each cloud's plan (`src/cloud/<name>/plan.rs`, beside its cloud) stays as pure as the core it
/// was part of: it names nothing but the core's types (`gpuwatch_core`) and its own, so it does
/// no I/O, holds no clock, and is table-tested on its own.
#[test]
fn every_cloud_s_plan_is_pure() {
    let mut plans = 0;
    for entry in std::fs::read_dir(root().join("src/cloud")).unwrap() {
        let path = entry.unwrap().path().join("plan.rs");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        plans += 1;
        // The plan itself, not its tests (which may reach `super::*`).
        let plan = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (i, line) in plan.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default().trim();
            let at = format!("{}:{}: {line}", path.display(), i + 1);
            for word in [
                "crate::", "std::", "tokio", "reqwest", "unsafe", "Instant", "env!",
            ] {
                assert!(!code.contains(word), "{at}: a plan names {word}");
            }
            // `super` is the cloud's own module, which does I/O.
            assert!(
                !code.contains("super::"),
                "{at}: a plan names its cloud's module"
            );
            if let Some(path) = code.strip_prefix("use ").or(code.strip_prefix("pub use ")) {
                // The core's, or its own types' variants.
                let root = path.split("::").next().unwrap_or_default();
                assert!(
                    ["gpuwatch_core", "self"].contains(&root)
                        || root.starts_with(|c: char| c.is_ascii_uppercase()),
                    "{at}: a plan imports only the core's types and its own"
                );
            }
        }
    }
    assert!(plans >= 4, "{plans} plans found under src/cloud/*/plan.rs");
}

/// The names of the clouds, and of their compute services, as prose and code spell them.
const CLOUD_NAMES: &[&str] = &[
    "aws",
    "amazon",
    "ec2",
    "azure",
    "microsoft",
    "gcp",
    "google",
    "compute engine",
    "alibaba",
    "aliyun",
    "ecs",
];

/// Where each cloud's name is found in `text`, as whole words, case aside: (line, name).
fn cloud_names(text: &str) -> Vec<(usize, &'static str)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        for name in CLOUD_NAMES {
            let word = |at: usize| {
                let before = lower[..at].chars().next_back();
                let after = lower[at + name.len()..].chars().next();
                let edge = |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric());
                edge(before) && edge(after)
            };
            if lower.match_indices(name).any(|(at, _)| word(at)) {
                found.push((i + 1, *name));
            }
        }
    }
    found
}

/// A cloud is one folder: no file of `src/` outside `src/cloud/` names one (in code, strings or
/// comments), so a fifth cloud changes nothing there. The crypto library `aws-lc-rs` is a
/// library's name, not the cloud's, and a GPU's "compute engine" is NVML's.
#[test]
fn no_cloud_is_named_outside_its_folder() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let cloud = root().join("src/cloud");
    let mut named = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(&cloud)) {
        let text = std::fs::read_to_string(file).unwrap();
        // A library's name, and NVML's words for a GPU's engines.
        let text = (text.replace("aws-lc-rs", "the-crypto-library"))
            .replace("aws_lc_rs", "the_crypto_library")
            .replace("graphics or compute engine", "graphics or compute units");
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        for (line, name) in cloud_names(&text) {
            named.push(format!("{rel}:{line}: {name}"));
        }
    }
    assert!(
        named.is_empty(),
        "clouds named outside src/cloud/:\n{}",
        named.join("\n")
    );
}

#[test]
fn the_cloud_name_reader_sees_words_not_parts_of_words() {
    let text = "// EC2 and Compute Engine\nlet specs = 1; // aws_budgets\nlet gcpx = 2;";
    assert_eq!(
        cloud_names(text),
        [(1, "ec2"), (1, "compute engine"), (2, "aws")],
        "{text}"
    );
}
