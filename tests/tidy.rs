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

/// Every top-level module a file names through `crate::`, with the line it does so on.
fn imports(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            // `gpuwatch_core::…` and the like are other crates.
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::X, b}`: each item's first segment (on this line).
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.push((name, n + 1));
                    }
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push((name, n + 1));
                }
            }
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
        if from == "main" {
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
        .filter(|m| m != "main" && m != "lib")
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
                let x = crate::state::holds(); // crate::not_this\nuse gpuwatch_core::step;";
    let names: Vec<String> = imports(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["config", "gpu", "time", "state"]);
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

#[test]
fn every_unsafe_block_says_why_it_is_sound_and_needed() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut bare = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        // The NVML and GPM calls are unsafe by their nature (a C library through
        // nvml-wrapper); their reasons are the library's contract.
        if ["src/gpu/nvml.rs", "src/gpu/gpm.rs", "src/gpu/xid.rs"].contains(&rel.as_str()) {
            continue;
        }
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
