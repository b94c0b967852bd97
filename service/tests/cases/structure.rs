//! The workspace's layering and room sizes, checked on the source tree
//! (ARCHITECTURE.md's invariants): no module cycle at any depth in any
//! crate, the gRPC server and the other surfaces never import the ATP stack
//! (only `scd atp agent` does, and `scd-dev atp` with the demo, flood and
//! simulator), the ATP stack never imports the engine, no crate depends on
//! the developer tools, no transport module imports another, no
//! hand-written `.rs`, `.py` or `.sh` file is over 900 lines and no Rust function
//! over 100. What other work is still shrinking is listed in [`RATCHET`], which may only shrink.
//!
//! The source is read with a small lexer, not a parser: comments, strings
//! and chars are blanked first ([`blank_literals`]), then paths and braces
//! are counted. Each counter has a unit test on a sample it must flag.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::root;

/// Every crate's `src/`, relative to the workspace root.
const CRATES: [&str; 10] = [
    "engine/src",
    "engine/context/src",
    "proto/src",
    "service/src",
    "service/did/src",
    "service/audit/src",
    "service/atp/src",
    "service/net/src",
    "service/dev/src",
    "benches/src",
];

/// The most lines a hand-written source file may have.
const MAX_FILE_LINES: usize = 900;
/// The extensions of hand-written source files: Rust, and the Python and
/// shell scripts (models, benches, tests, clients), which keep the file rule.
const SOURCE_EXTENSIONS: [&str; 3] = ["rs", "py", "sh"];
/// The most lines a function may have, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 100;
/// The transport modules of `service/src`: none may import another.
const TRANSPORTS: [&str; 4] = ["grpc", "rest", "mcp", "a2a"];

/// Today's offenders, which other work is shrinking: (rule, item, size),
/// where a rule is `file` (lines), `fn` (`file::name`, lines) or
/// `transport` (`from -> to`, the files of `from` that name `to`). An item
/// may shrink but not grow; one that keeps its rule again must leave the
/// table, and nothing may join it. A failure prints the table as it should
/// read now. `engine/`, `proto/` and `benches/` have no entry.
const RATCHET: &[(&str, &str, usize)] = &[];

/// Every `.rs` file under `dir`, sorted; build output (`target/`, the
/// ignored `out/` folders of models and data) and hidden folders left out.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    files_with(dir, &["rs"])
}

/// Every file under `dir` with one of `extensions`, sorted, left out as in
/// [`rust_files`] (hidden folders hold the venvs and caches).
fn files_with(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = entry.unwrap().path();
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            if p.is_dir() && name != "target" && name != "out" && !name.starts_with('.') {
                stack.push(p);
            } else if p.extension().is_some_and(|e| extensions.iter().any(|x| e == *x)) {
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

// ---- reading Rust source ----

/// `text` with comments, strings and chars blanked to spaces (line breaks
/// kept), so that braces and paths inside them count for nothing.
/// Lifetimes and labels (`'a`) stay code.
fn blank_literals(text: &str) -> String {
    let mut s: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < s.len() {
        match literal_end(&s, i) {
            Some(end) => {
                s[i..end].iter_mut().filter(|c| **c != '\n').for_each(|c| *c = ' ');
                i = end;
            }
            None => i += 1,
        }
    }
    s.into_iter().collect()
}

/// Where the comment, string or char starting at `s[i]` ends (exclusive),
/// if one starts there: `//`, nested `/* */`, `"…"`, `r#"…"#`, `b"…"`,
/// `'x'`, `'\n'`, `b'x'`.
fn literal_end(s: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| s.get(k).copied().unwrap_or('\0');
    let find = |from: usize, pat: &[char]| {
        (from..s.len()).find(|&k| s[k..].starts_with(pat)).map_or(s.len(), |k| k + pat.len())
    };
    match (at(i), at(i + 1)) {
        ('/', '/') => return Some((i..s.len()).find(|&j| s[j] == '\n').unwrap_or(s.len())),
        ('/', '*') => return Some(block_comment_end(s, i)),
        _ if i > 0 && (at(i - 1).is_alphanumeric() || at(i - 1) == '_') => return None, // inside an identifier
        _ => {}
    }
    let k = if matches!(at(i), 'b' | 'c') { i + 1 } else { i };
    if at(k) == 'r' && matches!(at(k + 1), '"' | '#') {
        let hashes = s[k + 1..].iter().take_while(|c| **c == '#').count();
        if at(k + 1 + hashes) != '"' {
            return None; // a raw identifier, `r#type`
        }
        let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
        return Some(find(k + 2 + hashes, &close));
    }
    match (at(k), at(k + 1)) {
        ('"', _) => {
            let mut j = k + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            Some((j + 1).min(s.len()))
        }
        ('\'', '\\') => Some(find(k + 3, &['\''])),
        ('\'', _) if at(k + 2) == '\'' => Some(k + 3),
        _ => None,
    }
}

/// Where the (nested) block comment opening at `s[i]` ends (exclusive).
fn block_comment_end(s: &[char], i: usize) -> usize {
    let (mut depth, mut j) = (0, i);
    while j + 1 < s.len() {
        match (s[j], s[j + 1]) {
            ('/', '*') => (depth, j) = (depth + 1, j + 2),
            ('*', '/') if depth == 1 => return j + 2,
            ('*', '/') => (depth, j) = (depth - 1, j + 2),
            _ => j += 1,
        }
    }
    s.len()
}

/// Where the body of the function whose signature starts at `b[from]`
/// opens: the first `{` outside parentheses and brackets, unless a `;`
/// ends it first (a declaration without a body).
fn body_start(b: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0;
    for (j, &c) in b.iter().enumerate().skip(from) {
        match c {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b';' if depth == 0 => return None,
            b'{' if depth == 0 => return Some(j),
            _ => {}
        }
    }
    None
}

/// Every function with a body in `code` (literals blanked): its name and
/// its lines, from the `fn` line to the line of its closing brace.
fn fn_sizes(code: &str) -> Vec<(String, usize)> {
    let b = code.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    for (at, _) in code.match_indices("fn") {
        if (at > 0 && is_ident(b[at - 1])) || b.get(at + 2).is_some_and(|&c| is_ident(c)) {
            continue;
        }
        let name = ident(&code[at + 2..]);
        if name.is_empty() {
            continue; // a `fn(…)` type
        }
        let Some(open) = body_start(b, at + 2) else { continue };
        let mut depth = 0;
        let close = (open..b.len()).find(|&j| {
            depth += i32::from(b[j] == b'{') - i32::from(b[j] == b'}');
            depth == 0
        });
        if let Some(close) = close {
            out.push((name, code[at..=close].matches('\n').count() + 1));
        }
    }
    out
}

/// The text before the first `#[cfg(test)]` line (test modules may reach
/// anywhere) and the names of the modules declared after it.
fn split_tests(text: &str) -> (&str, Vec<String>) {
    let at = text.find("\n#[cfg(test)]").map_or(text.len(), |i| i + 1);
    let (code, tests) = text.split_at(at);
    let test_mods = tests.lines().filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';')).map(String::from);
    (code, test_mods.collect())
}

/// One path of a `use` tree or of code, and the name it is brought in as
/// (`as Y`).
type UsePath = (Vec<String>, Option<String>);

fn skip_ws(s: &str, i: usize) -> usize {
    i + s[i..].len() - s[i..].trim_start().len()
}

/// The paths of the use tree at `s[i..]` under `prefix` (a group expanded,
/// `self` in a group is the prefix), into `out`; returns where it ends.
fn use_tree(s: &str, i: usize, prefix: &[String], out: &mut Vec<UsePath>) -> usize {
    let i = skip_ws(s, i);
    if s[i..].starts_with('{') {
        let mut i = i + 1;
        loop {
            i = skip_ws(s, i);
            match s[i..].chars().next() {
                None => return i,
                Some('}') => return i + 1,
                Some(',') => i += 1,
                _ => match use_tree(s, i, prefix, out) {
                    j if j == i => return i,
                    j => i = j,
                },
            }
        }
    }
    let name = ident(&s[i..]);
    if name.is_empty() {
        out.push((prefix.to_vec(), None)); // `*`, or a path ending in `::<T>`
        return i + usize::from(s[i..].starts_with('*'));
    }
    let mut path = prefix.to_vec();
    if name != "self" {
        path.push(name.clone());
    }
    let j = skip_ws(s, i + name.len());
    if s[j..].starts_with("::") {
        return use_tree(s, j + 2, &path, out);
    }
    let alias = s[j..].strip_prefix("as ").map(ident);
    let end = alias.as_ref().map_or(j, |a| skip_ws(s, j + 3) + a.len());
    out.push((path, alias));
    end
}

/// Every path in `code` (literals blanked) that starts at `crate`, `super`
/// or `self`, with `use` groups expanded.
fn rooted_paths(code: &str) -> Vec<UsePath> {
    let mut out = Vec::new();
    for root in ["crate", "super", "self"] {
        for (at, _) in code.match_indices(root) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
                continue; // `scd_crate`, the second `super` of `super::super`, `$crate`
            }
            let after = skip_ws(code, at + root.len());
            if ident(&code[at..]) == root && code[after..].starts_with("::") {
                use_tree(code, after + 2, &[root.to_string()], &mut out);
            }
        }
    }
    out
}

// ---- the module graph ----

/// A module's path from its file under `src/`: `extract/score.rs` and
/// `extract/score/mod.rs` are `extract::score`; `lib.rs` and `main.rs` the
/// root, "".
fn module_path(rel: &str) -> String {
    let rel = rel.trim_end_matches(".rs");
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    if rel == "lib" || rel == "main" {
        return String::new();
    }
    rel.replace('/', "::")
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}::{name}")
    }
}

fn parent(m: &str) -> Option<&str> {
    (!m.is_empty()).then(|| m.rsplit_once("::").map_or("", |(p, _)| p))
}

/// The crate's modules (path → code before its tests), test-only modules
/// (declared after `#[cfg(test)]`) and their children left out.
fn crate_modules(files: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut test_only = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (rel, text) in files {
        let m = module_path(rel);
        let (code, tests) = split_tests(text);
        test_only.extend(tests.iter().map(|t| join(&m, t)));
        out.insert(m, blank_literals(code));
    }
    let tested = |m: &str| test_only.iter().any(|t| m == t || m.starts_with(&format!("{t}::")));
    out.retain(|m, _| !tested(m));
    out
}

/// The deepest module `path` names from module `at`: `crate`, `super` and
/// `self` resolved (a path starting elsewhere is relative to `at`), then
/// one segment at a time while it is a module, or an item a module
/// re-exports from another (`via`).
fn resolve(
    path: &[String],
    at: &str,
    modules: &BTreeMap<String, String>,
    via: &BTreeMap<String, String>,
) -> Option<String> {
    let (mut cur, rest) = match path.first().map(String::as_str) {
        Some("crate") => (String::new(), &path[1..]),
        Some("self") => (at.to_string(), &path[1..]),
        Some("super") => (parent(at)?.to_string(), &path[1..]),
        _ => (at.to_string(), path),
    };
    for seg in rest {
        if seg == "super" {
            cur = parent(&cur)?.to_string();
            continue;
        }
        let next = join(&cur, seg);
        if !modules.contains_key(&next) {
            return Some(via.get(&next).cloned().unwrap_or(cur));
        }
        cur = next;
    }
    Some(cur)
}

/// What modules re-export from others: `extract::Scorer` → `extract::config`
/// for `pub use self::config::Scorer;` in `extract`.
fn reexports(modules: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut via = BTreeMap::new();
    for (m, code) in modules {
        for (at, _) in code.match_indices("use ") {
            let head = code[..at].rsplit('\n').next().unwrap_or_default().trim();
            if head != "pub" && !(head.starts_with("pub(") && head.ends_with(')')) {
                continue;
            }
            let mut paths = Vec::new();
            use_tree(code, at + 4, &[], &mut paths);
            for (path, alias) in paths {
                let name = alias.or_else(|| path.last().cloned()).unwrap_or_default();
                match resolve(&path, m, modules, &BTreeMap::new()) {
                    Some(target) if &target != m => via.insert(join(m, &name), target),
                    _ => None,
                };
            }
        }
    }
    via
}

/// Every use of one module by another in a crate (`files`: path under
/// `src/` → text): (user, used, the path as written).
fn module_uses(files: &BTreeMap<String, String>) -> Vec<(String, String, String)> {
    let modules = crate_modules(files);
    let via = reexports(&modules);
    let mut out = Vec::new();
    for (m, code) in &modules {
        for (path, _) in rooted_paths(code) {
            if let Some(target) = resolve(&path, m, &modules, &via).filter(|t| t != m) {
                out.push((m.clone(), target, path.join("::")));
            }
        }
    }
    out
}

fn shown(m: &str) -> &str {
    if m.is_empty() {
        "crate"
    } else {
        m
    }
}

/// The two siblings under the deepest common ancestor of `a` and `b`
/// (`a::x`, `b::y` → `a`, `b`), unless one of them holds the other.
fn siblings(a: &str, b: &str) -> Option<(String, String)> {
    let segments = |m: &str| m.split("::").filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>();
    let (sa, sb) = (segments(a), segments(b));
    let common = sa.iter().zip(&sb).take_while(|(x, y)| x == y).count();
    if common == sa.len() || common == sb.len() {
        return None;
    }
    Some((sa[..=common].join("::"), sb[..=common].join("::")))
}

/// A module → the modules it depends on, each with the use that made the
/// edge.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// A crate's module graph at every depth. Edges join siblings: `a::x`
/// using `b::y` is `a -> b`, `a::x` using `a::y` is `a::x -> a::y`; a
/// module using its own ancestor or descendant adds none.
fn module_graph(files: &BTreeMap<String, String>) -> Graph {
    let mut g = Graph::new();
    for (user, used, path) in module_uses(files) {
        if let Some((from, to)) = siblings(&user, &used) {
            g.entry(to.clone()).or_default();
            g.entry(from).or_default().entry(to).or_insert_with(|| format!("{} names {path}", shown(&user)));
        }
    }
    g
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'g> {
        g: &'g Graph,
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
        for w in t.g[v].keys() {
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

/// One cycle through the first module of `comp` (a strongly connected
/// component of `g`): `a -> b -> a`, then the use behind each step.
fn cycle_path(g: &Graph, comp: &[String]) -> String {
    let start = comp[0].as_str();
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in g[v].keys().filter(|w| comp.contains(w)) {
            if w == start {
                let mut steps = vec![(v, start)];
                while steps[0].0 != start {
                    let x = steps[0].0;
                    steps.insert(0, (prev[x], x));
                }
                let names: Vec<&str> = std::iter::once(start).chain(steps.iter().map(|s| shown(s.1))).collect();
                let uses: Vec<String> = steps.iter().map(|(a, b)| format!("\n    {}", g[*a][*b])).collect();
                return format!("{}{}", names.join(" -> "), uses.concat());
            }
            if !prev.contains_key(w.as_str()) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    comp.join(" <-> ")
}

/// The `.rs` files under a crate's `src/`: path relative to it → text.
fn read_crate(src: &Path) -> BTreeMap<String, String> {
    rust_files(src)
        .into_iter()
        .map(|f| {
            (f.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/"), std::fs::read_to_string(&f).unwrap())
        })
        .collect()
}

/// Transport modules importing another: `from -> to` → how many modules
/// of `from` name `to`.
fn transport_imports(files: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_string();
    let mut edges: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (user, used, _) in module_uses(files) {
        let (from, to) = (top(&user), top(&used));
        if from != to && TRANSPORTS.contains(&from.as_str()) && TRANSPORTS.contains(&to.as_str()) {
            edges.insert((from, to, user));
        }
    }
    let mut out = BTreeMap::new();
    for (from, to, _) in edges {
        *out.entry(format!("{from} -> {to}")).or_insert(0) += 1;
    }
    out
}

// ---- sizes and the ratchet ----

/// Every hand-written source file of the workspace ([`SOURCE_EXTENSIONS`];
/// path from the root, text): test data (`fixtures/`) and generated files
/// (marked `@generated`) left out.
fn workspace_sources() -> Vec<(String, String)> {
    let base = root();
    files_with(&base, &SOURCE_EXTENSIONS)
        .into_iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&base).unwrap().to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&f).unwrap();
            let generated = text.lines().take(5).any(|l| l.contains("@generated"));
            (!rel.starts_with("fixtures/") && !generated).then_some((rel, text))
        })
        .collect()
}

/// A rule broken: (rule, item).
type Offence = (String, String);

/// How one file breaks the size rules: its lines over [`MAX_FILE_LINES`],
/// and in a Rust file each function over [`MAX_FN_LINES`] (two of one
/// name: the longer stands for both).
fn size_offences(rel: &str, text: &str) -> BTreeMap<Offence, usize> {
    let mut out = BTreeMap::new();
    let lines = text.lines().count();
    if lines > MAX_FILE_LINES {
        out.insert(("file".to_string(), rel.to_string()), lines);
    }
    if !rel.ends_with(".rs") {
        return out;
    }
    for (name, n) in fn_sizes(&blank_literals(text)).into_iter().filter(|(_, n)| *n > MAX_FN_LINES) {
        let size = out.entry(("fn".to_string(), format!("{rel}::{name}"))).or_insert(0);
        *size = n.max(*size);
    }
    out
}

/// Every item breaking a size or transport rule now, with its size.
fn offences() -> BTreeMap<Offence, usize> {
    let sources = workspace_sources();
    for needed in ["engine/src/lib.rs", "models/convert.py", "models/setup.sh"] {
        assert!(sources.iter().any(|(rel, _)| rel == needed), "the walk missed {needed}");
    }
    let mut found: BTreeMap<Offence, usize> = sources.iter().flat_map(|(rel, text)| size_offences(rel, text)).collect();
    for (edge, n) in transport_imports(&read_crate(&root().join("service/src"))) {
        found.insert(("transport".to_string(), edge), n);
    }
    found
}

/// What breaks the ratchet: an item found that `table` lacks or lists
/// smaller, and a listed item that keeps its rule now.
fn ratchet(found: &BTreeMap<Offence, usize>, table: &[(&str, &str, usize)]) -> Vec<String> {
    let listed: BTreeMap<Offence, usize> = table.iter().map(|(r, i, n)| ((r.to_string(), i.to_string()), *n)).collect();
    let mut problems = Vec::new();
    for ((rule, item), &n) in found {
        match listed.get(&(rule.clone(), item.clone())) {
            None => problems.push(format!("{rule} {item} ({n}) breaks its rule and is not in RATCHET")),
            Some(&was) if n > was => problems.push(format!("{rule} {item} grew from {was} to {n}")),
            Some(_) => {}
        }
    }
    for ((rule, item), was) in listed.iter().filter(|(k, _)| !found.contains_key(*k)) {
        problems.push(format!("{rule} {item} (was {was}) keeps its rule now: take it out of RATCHET"));
    }
    problems
}

/// [`RATCHET`] as it should read for `found`, ready to paste.
fn ratchet_table(found: &BTreeMap<Offence, usize>) -> String {
    let rows: String = found.iter().map(|((rule, item), n)| format!("    ({rule:?}, {item:?}, {n}),\n")).collect();
    format!("const RATCHET: &[(&str, &str, usize)] = &[\n{rows}];")
}

fn sample(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect()
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let g: Graph = [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"]), ("e", vec![])]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(|w| (w.to_string(), String::new())).collect()))
        .collect();
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    let paths = |code: &str| -> Vec<String> { rooted_paths(code).into_iter().map(|(p, _)| p.join("::")).collect() };
    assert_eq!(
        paths("use crate::agent::Node; x = scd_crate::y; crate::work::f()"),
        ["crate::agent::Node", "crate::work::f"]
    );
    let line = "use crate::{merkle, pb::{self, X},\n  Error as E}; super::store::f(); super::super::z(); $crate::q()";
    let want = ["crate::merkle", "crate::pb", "crate::pb::X", "crate::Error", "super::store::f", "super::super::z"];
    assert_eq!(paths(line), want);
    assert_eq!(rooted_paths("use crate::Error as E;")[0].1.as_deref(), Some("E"));
    let root = "mod error;\nmod identity;\npub use error::{Error, Result};\npub use identity::Identity;\npub use scd_proto::x as pb;";
    let files = sample(&[("lib.rs", root), ("error.rs", ""), ("identity.rs", "")]);
    let via = reexports(&crate_modules(&files));
    assert_eq!(via.get("Result").map(String::as_str), Some("error"));
    assert_eq!(via.get("Identity").map(String::as_str), Some("identity"));
    assert!(!via.contains_key("pb"));
}

#[test]
fn the_module_graph_finds_a_nested_cycle_through_reexports_and_reports_its_path() {
    let files = sample(&[
        ("lib.rs", "mod a;\nuse crate::a::x::f; // the root uses a descendant: no edge"),
        (
            "a/mod.rs",
            "mod x;\nmod y;\npub use self::x::G;\nfn f() { x::g(); \"crate::b::\"; }\n#[cfg(test)]\nmod tests;",
        ),
        ("a/x.rs", "use super::y::T; // one way\npub struct G;\nuse super::super::a::Thing; // the parent"),
        ("a/y.rs", "pub struct T;\nfn f() -> super::G { todo!() } // back, through a's re-export"),
        ("a/tests.rs", "use crate::a::y::T; use super::x::G; // test code may reach anywhere"),
    ]);
    let g = module_graph(&files);
    assert_eq!(g.keys().collect::<Vec<_>>(), ["a::x", "a::y"], "{g:?}");
    let found = cycles(&g);
    assert_eq!(found, vec![vec!["a::x".to_string(), "a::y".into()]]);
    assert_eq!(cycle_path(&g, &found[0]), "a::x -> a::y -> a::x\n    a::x names super::y::T\n    a::y names super::G");
    let acyclic =
        sample(&[("lib.rs", "mod a; mod b;"), ("a.rs", "use crate::b::c::D;"), ("b/mod.rs", ""), ("b/c.rs", "")]);
    let g = module_graph(&acyclic);
    assert!(cycles(&g).is_empty() && g["a"].contains_key("b"), "{g:?}");
}

#[test]
fn the_function_counter_sees_through_strings_chars_and_comments() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let code = format!(
        "fn long() {{\n{}}}\nfn exact() {{\n{}}}\n{}",
        body(99),
        body(98),
        r##"trait T { fn declared(&self) -> [u8; 2]; }
fn tricky<'a>(x: &'a str) -> usize {
    let a = "}}}"; let b = '}'; let c = b'{'; let d = '\''; let e = "\"}";
    let f = r#"}"#; let h = f/*}*/; // }}
    /* { /* } */ } */
    'outer: loop { break 'outer; }
    let g: fn(u8) -> u8 = |v| v;
    x.len()
}
"##
    );
    let sizes: BTreeMap<String, usize> = fn_sizes(&blank_literals(&code)).into_iter().collect();
    let want: BTreeMap<String, usize> =
        [("long", 101), ("exact", 100), ("tricky", 8)].map(|(n, s)| (n.into(), s)).into();
    assert_eq!(sizes, want);
    let found = size_offences("x.rs", &code);
    assert_eq!(found.into_iter().collect::<Vec<_>>(), [(("fn".to_string(), "x.rs::long".to_string()), 101)]);
    let big = "// a line\n".repeat(MAX_FILE_LINES + 1);
    assert_eq!(size_offences("big.rs", &big).get(&("file".into(), "big.rs".into())), Some(&901));
    assert!(size_offences("ok.rs", &"// a line\n".repeat(MAX_FILE_LINES)).is_empty());
    // scripts keep the file rule; their functions are not Rust's to count
    let script = "# a line\n".repeat(MAX_FILE_LINES + 1);
    for rel in ["models/big.py", "models/big.sh"] {
        assert_eq!(size_offences(rel, &script).into_iter().collect::<Vec<_>>(), [(("file".into(), rel.into()), 901)]);
    }
    assert!(size_offences("x.py", &code).is_empty());
}

#[test]
fn the_transport_check_flags_a_transport_importing_another() {
    let files = sample(&[
        ("lib.rs", "pub mod grpc; pub mod rest; pub mod mcp; pub mod view;\npub use grpc::ScdHandler;"),
        ("grpc/mod.rs", "mod http;\nuse crate::view::View;"),
        ("grpc/http.rs", "use crate::rest::Body; use crate::rest::Other;"),
        ("rest/mod.rs", "use crate::{grpc::http, view};"),
        ("rest/body.rs", "fn f() { crate::ScdHandler::new() }"),
        ("mcp/mod.rs", "use crate::view::View;"),
    ]);
    let want: BTreeMap<String, usize> = [("grpc -> rest", 1), ("rest -> grpc", 2)].map(|(e, n)| (e.into(), n)).into();
    assert_eq!(transport_imports(&files), want);
}

#[test]
fn the_ratchet_fails_on_new_grown_and_fixed_items_and_prints_the_table() {
    let found: BTreeMap<Offence, usize> =
        [("file", "a.rs", 950), ("fn", "b.rs::run", 130), ("fn", "c.rs::go", 120), ("transport", "rest -> mcp", 1)]
            .map(|(r, i, n)| ((r.to_string(), i.to_string()), n))
            .into();
    let table =
        [("file", "a.rs", 1000), ("fn", "b.rs::run", 120), ("fn", "d.rs::old", 150), ("transport", "rest -> mcp", 1)];
    assert_eq!(
        ratchet(&found, &table),
        [
            "fn b.rs::run grew from 120 to 130",
            "fn c.rs::go (120) breaks its rule and is not in RATCHET",
            "fn d.rs::old (was 150) keeps its rule now: take it out of RATCHET",
        ]
    );
    let printed = ratchet_table(&found);
    assert!(printed.contains("    (\"file\", \"a.rs\", 950),\n") && printed.ends_with("1),\n];"), "{printed}");
    assert!(ratchet(
        &found,
        &[("file", "a.rs", 950), ("fn", "b.rs::run", 130), ("fn", "c.rs::go", 120), ("transport", "rest -> mcp", 1)]
    )
    .is_empty());
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for src in CRATES {
        let dir = root().join(src);
        assert!(dir.is_dir(), "{} is missing: update CRATES", dir.display());
        let g = module_graph(&read_crate(&dir));
        if src == "engine/src" {
            assert!(g["extract::score"].contains_key("extract::parts"), "the graph missed a nested edge: {g:?}");
        }
        found.extend(cycles(&g).iter().map(|c| format!("{src}: {}", cycle_path(&g, c))));
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn no_file_function_or_transport_import_outgrows_its_rule() {
    for (_, item, _) in RATCHET {
        let mine = ["engine/", "proto/", "benches/"].iter().any(|p| item.starts_with(p));
        assert!(!mine, "{item}: the engine, proto and benches keep every rule, with no entry in RATCHET");
    }
    let found = offences();
    let problems = ratchet(&found, RATCHET);
    assert!(problems.is_empty(), "{}\n\nRATCHET should read:\n{}", problems.join("\n"), ratchet_table(&found));
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
    assert!(importers.iter().all(|f| f.starts_with("cli/atp/")), "outside `scd atp`: {importers:?}");
    // the ATP demo, flood and simulator are scd-dev's: there too only under atp/
    let dev = files_naming("service/dev/src", "scd_atp");
    assert!(importers.len() + dev.len() >= 3, "{importers:?} {dev:?}");
    assert!(dev.iter().all(|f| f.starts_with("atp/")), "outside `scd-dev atp`: {dev:?}");
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

/// The application core names no transport's type: each transport turns
/// its own outcome and error into the core's (`app::Code`, `AppError`) and
/// back, so the core builds the same under every surface.
#[test]
fn the_core_names_no_transport_type() {
    assert!(!files_naming("service/src/grpc", "tonic::").is_empty(), "the search lost the gRPC files");
    for transport in ["tonic::", "axum::", "rmcp::"] {
        let named = files_naming("service/src/app", transport);
        assert!(named.is_empty(), "the core names {transport} in {named:?}");
    }
}

/// The developer tools (`scd-dev`) sit on top: they use `scd-service`'s
/// library, and no crate depends on them, so the product binary links none.
#[test]
fn no_crate_depends_on_the_developer_tools() {
    assert!(dependencies("service/dev").contains("scd-service"), "the parser lost scd-dev's dependencies");
    for src in CRATES.iter().filter(|s| **s != "service/dev/src") {
        let dir = src.trim_end_matches("/src");
        assert!(!dependencies(dir).contains("scd-dev"), "{dir} depends on scd-dev");
    }
    assert!(files_naming("service/src", "scd_dev").is_empty(), "scd-service names scd_dev");
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
