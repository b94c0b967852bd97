//! The workspace's layering, checked on the source tree (ARCHITECTURE.md's
//! invariants): no cycle among any crate's top-level modules, the gRPC
//! server and the other surfaces never import the ATP stack (only `scd atp`,
//! with its demo and simulator, does), and the ATP stack never imports the
//! engine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::root;

/// Every crate's `src/`, relative to the workspace root.
const CRATES: [&str; 9] = [
    "engine/src",
    "engine/context/src",
    "proto/src",
    "service/src",
    "service/did/src",
    "service/audit/src",
    "service/atp/src",
    "service/net/src",
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

fn ident(s: &str) -> String {
    s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The first segment of each path in a `{a, b::c, d::{e, f}}` group.
fn group_heads(group: &str) -> Vec<String> {
    let (mut depth, mut start, mut out) = (0usize, 0usize, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(ident(&group[start..i]));
                return out;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(ident(&group[start..]));
    out
}

/// The items a crate root re-exports from its own modules
/// (`pub use error::{Error, Result};` → Error and Result live in `error`).
fn reexports(root_lines: &[String], modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for l in root_lines {
        let Some(rest) = l.strip_prefix("pub use ") else { continue };
        let module = ident(rest);
        if !modules.contains(&module) {
            continue;
        }
        let tail = rest[module.len()..].trim_start_matches("::").trim_end_matches(';');
        let names = match tail.strip_prefix('{') {
            Some(group) => group_heads(group),
            None => vec![tail.rsplit("::").next().unwrap_or(tail).to_string()],
        };
        for name in names {
            // `X as Y` is known as Y
            let name = name.rsplit(" as ").next().unwrap_or(&name).trim().to_string();
            out.insert(name, module.clone());
        }
    }
    out
}

/// The crate-level names `lines` use: the first segment after each
/// `crate::` (every head of a `crate::{…}` group), and after `super::` when
/// `super` is the crate root (`root_super`).
fn crate_refs(lines: &[String], root_super: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let prefixes: &[&str] = if root_super { &["crate::", "super::"] } else { &["crate::"] };
    for l in lines {
        for prefix in prefixes {
            for (at, _) in l.match_indices(prefix) {
                let before = l[..at].chars().last();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue; // e.g. `scd_crate::`, the second `super::` of `super::super::`
                }
                let rest = &l[at + prefix.len()..];
                match rest.strip_prefix('{') {
                    Some(group) => out.extend(group_heads(group)),
                    // `super::super::` is not the crate root
                    None if ident(rest) == "super" => {}
                    None => {
                        out.insert(ident(rest));
                    }
                }
            }
        }
    }
    out.remove("");
    out
}

/// The top-level modules of `src` and the ones each one uses (directly, or
/// through an item the crate root re-exports from it).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut root_lines = Vec::new();
    for f in rust_files(src) {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            root_lines.extend(code_lines(&f));
        } else {
            files.entry(top).or_default().push(f);
        }
    }
    let names: BTreeSet<String> = files.keys().cloned().collect();
    let via = reexports(&root_lines, &names);
    files
        .iter()
        .map(|(m, fs)| {
            let used = fs
                .iter()
                .flat_map(|f| {
                    // a file directly in src/ has the crate root as `super`
                    let top_file = f.parent() == Some(src);
                    crate_refs(&code_lines(f), top_file)
                })
                .filter_map(|r| if names.contains(&r) { Some(r) } else { via.get(&r).cloned() })
                .filter(|r| r != m);
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
    let refs = crate_refs(&["use crate::agent::Node; x = scd_crate::y; crate::work::f()".to_string()], false);
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["agent", "work"]);
    let line = "use crate::{merkle, pb::{self, X}, Error}; super::store::f(); super::super::z()".to_string();
    let refs = crate_refs(std::slice::from_ref(&line), true);
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["Error", "merkle", "pb", "store"]);
    let modules: BTreeSet<String> = ["error", "identity"].map(String::from).into();
    let root = ["pub use error::{Error, Result};", "pub use identity::Identity;", "pub use scd_proto::x as pb;"];
    let via = reexports(&root.map(String::from), &modules);
    assert_eq!(via.get("Result").map(String::as_str), Some("error"));
    assert_eq!(via.get("Identity").map(String::as_str), Some("identity"));
    assert!(!via.contains_key("pb"));
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
    let net: Vec<String> = dependencies("service/net").into_iter().filter(|d| d.starts_with("scd-")).collect();
    assert!(net.is_empty(), "the listener guard holds no protocol logic, yet depends on {net:?}");
}

#[test]
fn architecture_md_lists_every_crate_with_its_workspace_dependencies() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut listed = BTreeMap::new();
    for row in text.lines().filter(|l| l.starts_with("| `scd-")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (folder, deps) = (cells[2].trim_matches('`').trim_end_matches('/'), cells[3]);
        let deps: BTreeSet<String> =
            deps.split(',').map(|d| d.trim().trim_matches('`').to_string()).filter(|d| d.starts_with("scd-")).collect();
        listed.insert(folder.to_string(), deps);
    }
    let crates: BTreeSet<String> = CRATES.iter().map(|s| s.trim_end_matches("/src").to_string()).collect();
    assert_eq!(listed.keys().cloned().collect::<BTreeSet<_>>(), crates, "ARCHITECTURE.md's crate table");
    for (folder, deps) in listed {
        let actual: BTreeSet<String> = dependencies(&folder).into_iter().filter(|d| d.starts_with("scd-")).collect();
        assert_eq!(deps, actual, "{folder}: ARCHITECTURE.md says {deps:?}, Cargo.toml has {actual:?}");
    }
}
