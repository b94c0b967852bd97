//! The workspace's layering, checked on the source tree (ARCHITECTURE.md's
//! invariants): no cycle among any crate's top-level modules, the gRPC
//! server and the other surfaces never import the ATP stack (only `scd atp`,
//! with its demo and simulator, does), and the ATP stack never imports the
//! engine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::root;

/// Every crate's `src/`, relative to the workspace root.
const CRATES: [&str; 8] = [
    "engine/src",
    "engine/context/src",
    "proto/src",
    "service/src",
    "service/did/src",
    "service/audit/src",
    "service/atp/src",
    "benches/src",
];

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The code lines of a file: comments dropped, and everything from a
/// `#[cfg(test)]` on left out (test modules may reach anywhere).
fn code_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .map(str::trim)
        .filter(|l| !l.starts_with("//"))
        .map(str::to_string)
        .collect()
}

/// `crate::NAME` paths used in `lines`.
fn crate_refs(lines: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in lines {
        let mut rest = l.as_str();
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().last();
            rest = &rest[at + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // e.g. `scd_crate::`
            }
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.insert(name);
        }
    }
    out
}

/// The top-level modules of `src` and the ones each one uses.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for f in rust_files(src) {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top != "lib" && top != "main" {
            files.entry(top).or_default().push(f);
        }
    }
    let names: BTreeSet<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(m, fs)| {
            let used = fs.iter().flat_map(|f| crate_refs(&code_lines(f))).filter(|r| r != m && names.contains(r));
            (m.clone(), used.collect())
        })
        .collect()
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(t: &mut T<'g>, v: &'g str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        for w in &t.g[v] {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                t.low.insert(v, t.low[v].min(lw));
            } else if t.stack.contains(&w.as_str()) {
                let iw = t.index[w.as_str()];
                t.low.insert(v, t.low[v].min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T { g, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), out: Vec::new() };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"]), ("e", vec![])]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
            .collect();
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    let refs = crate_refs(&["use crate::agent::Node; x = scd_crate::y; crate::work::f()".to_string()]);
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["agent", "work"]);
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for src in CRATES {
        let dir = root().join(src);
        assert!(dir.is_dir(), "{} is missing: update CRATES", dir.display());
        let g = module_graph(&dir);
        found.extend(cycles(&g).into_iter().map(|c| format!("{src}: {}", c.join(" <-> "))));
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

/// Files of `src` (under `dir`) whose code names `needle`.
fn files_naming(dir: &str, needle: &str) -> Vec<String> {
    let base = root().join(dir);
    rust_files(&base)
        .into_iter()
        .filter(|f| code_lines(f).iter().any(|l| l.contains(needle)))
        .map(|f| f.strip_prefix(&base).unwrap().display().to_string())
        .collect()
}

/// The crates named under `[dependencies]` of `dir`'s Cargo.toml.
fn dependencies(dir: &str) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
    let mut inside = false;
    let mut out = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            out.insert(line.split(['=', '.', ' ']).next().unwrap().to_string());
        }
    }
    out
}

#[test]
fn only_the_atp_subcommand_imports_the_atp_stack() {
    let importers = files_naming("service/src", "scd_atp");
    assert!(importers.len() >= 3, "{importers:?}");
    assert!(importers.iter().all(|f| f.starts_with("cli/atp/")), "outside `scd atp`: {importers:?}");
    assert!(dependencies("service/atp").contains("scd-proto"), "the parser lost the dependencies");
    assert!(!dependencies("service/atp").contains("scd-engine"), "scd-atp depends on the engine");
    assert!(files_naming("service/atp/src", "scd_engine").is_empty());
    let engine = dependencies("engine");
    for runtime in ["tokio", "tonic", "clap", "anyhow", "axum"] {
        assert!(!engine.contains(runtime), "the engine depends on {runtime}");
    }
    for lower in ["service/did", "service/audit", "engine/context"] {
        let deps = dependencies(lower);
        for upper in ["scd-engine", "scd-atp", "scd-service", "tonic"] {
            assert!(!deps.contains(upper), "{lower} depends on {upper}");
        }
    }
}
