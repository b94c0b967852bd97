//! Code chunking with a real parser (tree-sitter) for Rust, Python,
//! JavaScript, TypeScript, Go, Java, C and C++.
//!
//! Chunks are hierarchical: every top-level item (function, struct, enum,
//! impl, trait, class, ...) is a chunk; a container (`impl`, `trait`, `mod`,
//! `class`, `namespace`, ...) that holds functions is split into its header
//! (`impl Foo for Bar {`, `class Foo(Base):`), which leads the group, one
//! chunk per member (each method whole, unless cut as below), and its closing
//! line, all in one group, so a method arrives with its owner. Doc
//! comments, attributes and decorators attach to the item they precede;
//! runs of small glue (`use` and `import` lines, module statements) not
//! separated by a blank line form one chunk. A function is one chunk; one
//! longer than [`super::ChunkConfig::long_function_bytes`] is cut into
//! its signature, which leads a group of its own, pieces of its body and its
//! closing line, so it can be sent trimmed (the signature, the pieces that
//! matter, `…` for the rest); a method cut so leaves its container's group.
//!
//! ```
//! use scd_engine::chunk::{chunk_field, ChunkConfig};
//! use scd_engine::context::{Field, FieldKind};
//!
//! let src = "use std::fmt;\n\n/// A point.\nstruct P;\n\nimpl fmt::Display for P {\n    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {\n        write!(f, \"p\")\n    }\n}\n";
//! let field = Field { name: "src/p.rs".into(), kind: FieldKind::Code, content: src.into(), confidential: false };
//! let chunks = chunk_field(&field, ChunkConfig::default());
//! let texts: Vec<&str> = chunks.iter().map(|c| &src[c.start..c.end]).collect();
//! assert_eq!(texts[1], "/// A point.\nstruct P;");
//! assert_eq!(texts[2], "impl fmt::Display for P {");
//! assert!(texts[3].starts_with("fn fmt") && texts[3].ends_with('}'));
//! assert!(chunks[2].lead && !chunks[3].lead && chunks[2].group == chunks[3].group);
//! assert_eq!(chunks[3].chunker, "tree-sitter:rust");
//! ```

use tree_sitter::{Language, Node, Parser};

use super::RawChunk;

/// A language with a tree-sitter grammar built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Rust.
    Rust,
    /// Python.
    Python,
    /// JavaScript (and JSX).
    JavaScript,
    /// TypeScript.
    TypeScript,
    /// TSX.
    Tsx,
    /// Go.
    Go,
    /// Java.
    Java,
    /// C.
    C,
    /// C++.
    Cpp,
}

impl Lang {
    /// The chunker name recorded on each chunk (`tree-sitter:rust`).
    pub fn chunker(self) -> &'static str {
        match self {
            Lang::Rust => "tree-sitter:rust",
            Lang::Python => "tree-sitter:python",
            Lang::JavaScript => "tree-sitter:javascript",
            Lang::TypeScript => "tree-sitter:typescript",
            Lang::Tsx => "tree-sitter:tsx",
            Lang::Go => "tree-sitter:go",
            Lang::Java => "tree-sitter:java",
            Lang::C => "tree-sitter:c",
            Lang::Cpp => "tree-sitter:cpp",
        }
    }

    fn grammar(self) -> Language {
        match self {
            Lang::Rust => tree_sitter_rust::LANGUAGE.into(),
            Lang::Python => tree_sitter_python::LANGUAGE.into(),
            Lang::JavaScript => tree_sitter_javascript::LANGUAGE.into(),
            Lang::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
            Lang::Tsx => tree_sitter_typescript::LANGUAGE_TSX.into(),
            Lang::Go => tree_sitter_go::LANGUAGE.into(),
            Lang::Java => tree_sitter_java::LANGUAGE.into(),
            Lang::C => tree_sitter_c::LANGUAGE.into(),
            Lang::Cpp => tree_sitter_cpp::LANGUAGE.into(),
        }
    }

    /// The language of a field named like a file (`src/lib.rs`, `x.py`).
    pub fn from_name(name: &str) -> Option<Lang> {
        let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
        Some(match ext.as_str() {
            "rs" => Lang::Rust,
            "py" | "pyi" => Lang::Python,
            "js" | "mjs" | "cjs" | "jsx" => Lang::JavaScript,
            "ts" | "mts" | "cts" => Lang::TypeScript,
            "tsx" => Lang::Tsx,
            "go" => Lang::Go,
            "java" => Lang::Java,
            "c" | "h" => Lang::C,
            "cc" | "cpp" | "cxx" | "hpp" | "hh" | "hxx" | "c++" => Lang::Cpp,
            _ => return None,
        })
    }

    /// A cheap guess from the first 4 KiB, for fields not named like a file:
    /// each language's telltale keywords at line starts.
    pub fn sniff(text: &str) -> Option<Lang> {
        let mut end = text.len().min(4096);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut score = [0u32; 7]; // rust python js go java c cpp
        for line in text[..end].lines() {
            let t = line.trim_start();
            let has = |p: &str| t.starts_with(p);
            if has("fn ") || has("pub fn ") || has("impl ") || has("impl<") || has("use ") && t.contains("::") {
                score[0] += 2;
            }
            if has("let ") || has("pub struct ") || has("#[") || has("mod ") {
                score[0] += 1;
            }
            if (has("def ") || has("class ")) && t.trim_end().ends_with(':') || has("from ") && t.contains(" import ") {
                score[1] += 2;
            }
            if has("function ") || has("const ") && t.contains("=>") || has("export ") || has("module.exports") {
                score[2] += 2;
            }
            if has("package ") && !t.ends_with(';') || has("func ") {
                score[3] += 2;
            }
            if has("public class ") || has("import java.") || has("private ") && t.ends_with(';') {
                score[4] += 2;
            }
            if has("#include") {
                score[5] += 1;
                score[6] += 1;
            }
            if has("template<") || has("template <") || has("namespace ") || t.contains("std::") {
                score[6] += 2;
            }
        }
        let (best, &s) = score.iter().enumerate().max_by_key(|&(i, s)| (*s, std::cmp::Reverse(i)))?;
        if s < 2 {
            return None;
        }
        Some([Lang::Rust, Lang::Python, Lang::JavaScript, Lang::Go, Lang::Java, Lang::C, Lang::Cpp][best])
    }
}

/// Node kinds whose members are chunked one by one when they hold a function.
const CONTAINERS: &[&str] = &[
    "impl_item",
    "trait_item",
    "mod_item",
    "foreign_mod_item",
    "class_definition",
    "class_declaration",
    "abstract_class_declaration",
    "class",
    "interface_declaration",
    "enum_declaration",
    "record_declaration",
    "namespace_definition",
    "class_specifier",
    "struct_specifier",
    "linkage_specification",
    "internal_module",
    "module",
];

/// Wrappers whose inner declaration decides (decorators, `export`, `template<>`).
const WRAPPERS: &[&str] = &["decorated_definition", "export_statement", "template_declaration"];

/// Nodes walked through as if their children were at this level.
const TRANSPARENT: &[&str] = &["preproc_ifdef", "preproc_if", "preproc_else", "preproc_elif"];

/// Small statements that are glue between items.
fn is_glue(kind: &str) -> bool {
    kind.contains("import")
        || kind.starts_with("use_")
        || kind.starts_with("package")
        || kind.contains("include")
        || matches!(
            kind,
            "extern_crate_declaration"
                | "inner_attribute_item"
                | "expression_statement"
                | "empty_statement"
                | "preproc_def"
                | "preproc_call"
                | "identifier"
                | "access_specifier"
                | "pass_statement"
        )
}

/// Nodes that belong to the item right after them (no blank line between).
fn is_attachable(kind: &str) -> bool {
    kind.contains("comment") || matches!(kind, "attribute_item" | "decorator" | "annotation" | "marker_annotation")
}

fn is_function(kind: &str) -> bool {
    kind.contains("function") || kind.contains("method") || kind.contains("constructor")
}

/// The declaration a wrapper wraps (itself otherwise).
fn inner(node: Node<'_>) -> Node<'_> {
    let mut n = node;
    while WRAPPERS.contains(&n.kind()) {
        match n.child_by_field_name("definition").or_else(|| n.child_by_field_name("declaration")) {
            Some(d) => n = d,
            None => match n.named_child(u32::try_from(n.named_child_count().saturating_sub(1)).unwrap_or(0)) {
                Some(d) if d.id() != n.id() => n = d,
                _ => break,
            },
        }
    }
    n
}

/// Items longer than this (bytes) that are not functions are cut at their
/// blank lines (a function only by [`Walker::long_function`], at its own
/// bound).
const LONG_LEAF_BYTES: usize = 2048;

/// Containers nested deeper than this are chunked whole (bounds recursion
/// on adversarial input such as `mod a { mod a { ...`).
const MAX_DEPTH: usize = 8;

/// The member list of a container (at nesting `depth`) that holds at least
/// one function.
fn members_of(node: Node<'_>, depth: usize) -> Option<Node<'_>> {
    let decl = inner(node);
    if depth >= MAX_DEPTH || !CONTAINERS.contains(&decl.kind()) {
        return None;
    }
    let body = decl.child_by_field_name("body")?;
    let mut cursor = body.walk();
    let has_fn =
        body.named_children(&mut cursor).any(|m| is_function(inner(m).kind()) || members_of(m, depth + 1).is_some());
    has_fn.then_some(body)
}

/// Names a definition introduces (its `name` field, or an impl's type).
fn name_of(node: Node<'_>, text: &str) -> Option<String> {
    let decl = inner(node);
    let n = decl
        .child_by_field_name("name")
        .or_else(|| decl.child_by_field_name("type"))
        .or_else(|| decl.child_by_field_name("declarator").and_then(|d| d.child_by_field_name("declarator")))?;
    let s = &text[n.byte_range()];
    let name: String = s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

/// Chunks `text` in `lang`; `None` when the parser gives up.
/// `long_fn`: see [`super::ChunkConfig::long_function_bytes`].
pub fn chunk(text: &str, lang: Lang, long_fn: usize) -> Option<Vec<RawChunk>> {
    let mut parser = Parser::new();
    parser.set_language(&lang.grammar()).ok()?;
    let tree = parser.parse(text, None)?;
    let mut w = Walker { text, chunker: lang.chunker(), out: Vec::new(), group: 0, depth: 0, long_fn };
    w.list(tree.root_node(), None);
    Some(w.out)
}

/// A chunk's part in its group.
#[derive(Clone, Copy)]
enum Role {
    /// A top-level item: its own group's lead.
    Lead,
    /// A container's header (`impl Foo for Bar {`): leads the group, sent
    /// only with a member.
    Header,
    /// A container's member (a method, a field, a comment).
    Member,
    /// A container's closing line (`}`): sent only with a member.
    Closing,
}

struct Walker<'a> {
    text: &'a str,
    chunker: &'static str,
    out: Vec<RawChunk>,
    group: usize,
    /// Containers (and transparent nodes) entered.
    depth: usize,
    /// A function longer than this (bytes) is cut ([`Walker::long_function`]); 0: never.
    long_fn: usize,
}

impl Walker<'_> {
    /// Whether a blank line lies between byte offsets `a` and `b`.
    fn blank_between(&self, a: usize, b: usize) -> bool {
        self.text.get(a..b).is_some_and(|gap| gap.matches('\n').count() >= 2)
    }

    fn push(
        &mut self,
        start: usize,
        end: usize,
        group: usize,
        role: Role,
        heading: Option<String>,
        name: Option<String>,
    ) {
        let (mut start, mut end) = (start, end);
        super::trim_span(self.text, &mut start, &mut end);
        if start < end {
            self.out.push(RawChunk {
                start,
                end,
                heading,
                group,
                lead: matches!(role, Role::Lead | Role::Header),
                defines: name.into_iter().collect(),
                chunker: self.chunker,
                rides: matches!(role, Role::Header | Role::Closing),
            });
        }
    }

    fn next_group(&mut self) -> usize {
        self.group += 1;
        self.group
    }

    /// The named children of `parent` as chunks; inside a container
    /// (`owner` = its group and heading) members join the owner's group.
    fn list(&mut self, parent: Node<'_>, owner: Option<(usize, &str)>) {
        let mut cursor = parent.walk();
        let kids: Vec<Node<'_>> = parent.named_children(&mut cursor).collect();
        let mut pending: Option<usize> = None; // start of attached comments/attributes
        let mut glue: Option<(usize, usize)> = None;
        let mut i = 0;
        while i < kids.len() {
            let n = kids[i];
            let kind = n.kind();
            if TRANSPARENT.contains(&kind) && self.depth < MAX_DEPTH {
                self.flush_glue(&mut glue, owner);
                self.depth += 1;
                self.list(n, owner);
                self.depth -= 1;
                i += 1;
                continue;
            }
            let next_start = kids.get(i + 1).map(|k| k.start_byte());
            if is_attachable(kind) {
                let attaches = next_start.is_some_and(|s| !self.blank_between(n.end_byte(), s))
                    && kids.get(i + 1).is_some_and(|k| !is_glue(k.kind()));
                if attaches {
                    pending.get_or_insert(n.start_byte());
                } else {
                    // a free comment is glue
                    let s = pending.take().unwrap_or(n.start_byte());
                    self.add_glue(&mut glue, s, n.end_byte(), owner);
                }
                i += 1;
                continue;
            }
            let start = pending.take().unwrap_or(n.start_byte());
            if is_glue(kind) {
                self.add_glue(&mut glue, start, n.end_byte(), owner);
                i += 1;
                continue;
            }
            self.flush_glue(&mut glue, owner);
            self.item(n, start, owner);
            i += 1;
        }
        if let Some(s) = pending {
            let e = kids.last().map_or(s, |k| k.end_byte());
            self.add_glue(&mut glue, s, e, owner);
        }
        self.flush_glue(&mut glue, owner);
    }

    fn add_glue(&mut self, glue: &mut Option<(usize, usize)>, s: usize, e: usize, owner: Option<(usize, &str)>) {
        match glue {
            Some((_, ge)) if !self.blank_between(*ge, s) => *ge = e,
            _ => {
                self.flush_glue(glue, owner);
                *glue = Some((s, e));
            }
        }
    }

    fn flush_glue(&mut self, glue: &mut Option<(usize, usize)>, owner: Option<(usize, &str)>) {
        if let Some((s, e)) = glue.take() {
            match owner {
                Some((g, h)) => self.push(s, e, g, Role::Member, Some(h.to_string()), None),
                None => {
                    let g = self.next_group();
                    self.push(s, e, g, Role::Lead, None, None);
                }
            }
        }
    }

    /// A long item that is not a function (a `macro_rules!` body of
    /// methods, a table of constants): the parser sees no structure inside,
    /// so it is cut at its blank lines, into one group led by the first
    /// piece (or into the owner's group). Chunker `heuristic:code`.
    fn long_leaf(&mut self, start: usize, end: usize, owner: Option<(usize, &str)>, name: Option<String>) {
        let (g, heading, mut role) = match owner {
            Some((g, h)) => (g, Some(h.to_string()), Role::Member),
            None => (self.next_group(), None, Role::Lead),
        };
        let mut name = name;
        let mut piece = start;
        let mut at = start;
        let text = self.text;
        let parser = std::mem::replace(&mut self.chunker, "heuristic:code");
        for line in text[start..end].split_inclusive('\n') {
            let line_end = at + line.len();
            if line.trim().is_empty() && !text[piece..at].trim().is_empty() {
                self.push(piece, at, g, role, heading.clone(), name.take());
                role = Role::Member;
                piece = line_end;
            }
            at = line_end;
        }
        self.push(piece, end, g, role, heading, name);
        self.chunker = parser;
    }

    /// A long function: its signature (from its attached comments through
    /// the body's opening brace) leads a group of its own and is sent with
    /// any piece of it, its body comes in pieces ([`body_pieces`]) and its
    /// closing line rides with the signature, so the lines that matter can
    /// be sent with `…` for the rest. `false` when it has no body.
    fn long_function(&mut self, n: Node<'_>, start: usize, owner: Option<(usize, &str)>, name: Option<String>) -> bool {
        let decl = inner(n);
        let Some(body) = decl.child_by_field_name("body") else {
            return false;
        };
        let text = self.text;
        let mut hend = body.start_byte();
        if text[hend..].starts_with('{') {
            hend += 1;
        }
        let sig: String =
            text[decl.start_byte()..hend].trim().trim_end_matches('{').trim().lines().next().unwrap_or("").to_string();
        let sig: String = sig.chars().take(200).collect();
        let heading = match owner {
            Some((_, h)) => format!("{h} › {sig}"),
            None => sig,
        };
        // the closing line: the last one, when it opens with `}`
        let end = n.end_byte();
        let last = text[..end].rfind('\n').map_or(0, |i| i + 1);
        let close = (last > hend && text[last..end].trim_start().starts_with('}')).then_some(last);
        let g = self.next_group();
        self.push(start, hend, g, Role::Lead, owner.map(|(_, h)| h.to_string()), name);
        for (s, e) in body_pieces(text, hend, close.unwrap_or(end)) {
            self.push(s, e, g, Role::Member, Some(heading.clone()), None);
        }
        if let Some(c) = close {
            self.push(c, end, g, Role::Closing, Some(heading), None);
        }
        true
    }

    /// One item starting at `start` (its attached comments): whole, or as
    /// header + members + closing line when it is a container of functions.
    fn item(&mut self, n: Node<'_>, start: usize, owner: Option<(usize, &str)>) {
        let name = name_of(n, self.text);
        let Some(body) = members_of(n, self.depth) else {
            let function = is_function(inner(n).kind());
            let long = n.end_byte() - start;
            if function && self.long_fn > 0 && long > self.long_fn && self.long_function(n, start, owner, name.clone())
            {
                return;
            }
            if long > LONG_LEAF_BYTES && !function {
                return self.long_leaf(start, n.end_byte(), owner, name);
            }
            match owner {
                Some((g, h)) => self.push(start, n.end_byte(), g, Role::Member, Some(h.to_string()), name),
                None => {
                    let g = self.next_group();
                    self.push(start, n.end_byte(), g, Role::Lead, None, name);
                }
            }
            return;
        };
        // header: through the body's opening brace (or up to the body, for Python)
        let mut hend = body.start_byte();
        if self.text[hend..].starts_with('{') {
            hend += 1;
        }
        let header = self.text[n.start_byte()..hend].trim();
        let heading: String =
            header.trim_end_matches('{').trim().lines().next().unwrap_or("").chars().take(200).collect();
        let g = self.next_group();
        self.push(start, hend, g, Role::Header, owner.map(|(_, h)| h.to_string()), name);
        let before = self.out.len();
        self.depth += 1;
        self.list(body, Some((g, &heading)));
        self.depth -= 1;
        let last_end = if self.out.len() > before { self.out.last().map_or(hend, |c| c.end) } else { hend };
        // the closing line (`}`), in the group; nothing for Python
        let tail_start = last_end.max(hend);
        let tail_end = n.end_byte();
        if tail_start < tail_end && !self.text[tail_start..tail_end].trim().is_empty() {
            let s = &self.text[tail_start..tail_end];
            let s0 = tail_start + (s.len() - s.trim_start().len());
            self.push(s0, tail_end, g, Role::Closing, Some(heading.clone()), None);
        }
    }
}

/// A long function's body piece is cut at a blank line once it holds this
/// many bytes...
const PIECE_MIN_BYTES: usize = 256;
/// ...and at the start of a statement of the body (a line no deeper than
/// its first) once it holds this many.
const PIECE_MAX_BYTES: usize = 1024;

/// The pieces of the body between byte offsets `a` and `b`, cut by lines:
/// at a blank line once a piece holds [`PIECE_MIN_BYTES`], else at a line
/// that starts a statement of the body once it holds [`PIECE_MAX_BYTES`],
/// else at a deeper line once it holds twice that (a long loop's body);
/// never before a line that closes or continues one (`}`, `)`, `else`, `&&`).
fn body_pieces(text: &str, a: usize, b: usize) -> Vec<(usize, usize)> {
    const CONTINUES: [&str; 10] = ["else", "elif", "except", "catch", "finally", ".", "&&", "||", "?", ":"];
    let mut out = Vec::new();
    let (mut piece, mut at) = (a, a);
    // the body's indentation: where `a` stands when only blanks precede it
    // on its line (Python's body starts at its first statement), else that
    // of its first line with text
    let line_start = text[..a].rfind('\n').map_or(0, |i| i + 1);
    let mut base: Option<usize> = text[line_start..a].trim().is_empty().then_some(a - line_start).filter(|&i| i > 0);
    let mut after_blank = false;
    for line in text[a..b].split_inclusive('\n') {
        let body = line.trim_start();
        if !body.trim().is_empty() {
            let indent = line.len() - body.len() + if at == a { a - line_start } else { 0 };
            let base = *base.get_or_insert(indent);
            let opens = !body.starts_with(['}', ')', ']']) && !CONTINUES.iter().any(|c| body.starts_with(c));
            let size = at - piece;
            // a statement of the body, else (inside a long loop or branch)
            // any statement once the piece holds twice the bound
            let starts = (indent <= base && size >= PIECE_MAX_BYTES) || size >= 2 * PIECE_MAX_BYTES;
            let cut = opens && ((after_blank && size >= PIECE_MIN_BYTES) || starts);
            if cut && !text[piece..at].trim().is_empty() {
                out.push((piece, at));
                piece = at;
            }
        }
        after_blank = body.trim().is_empty();
        at += line.len();
    }
    out.push((piece, b));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(src: &str, lang: Lang) -> Vec<(&str, usize, bool)> {
        chunk(src, lang, 2048).unwrap().iter().map(|c| (&src[c.start..c.end], c.group, c.lead)).collect()
    }

    #[test]
    fn rust_methods_are_chunks_led_by_their_impl_header() {
        let src = "use a::b;\nuse c::d;\n\n/// Doc.\n#[derive(Debug)]\npub struct S { x: u8 }\n\nimpl<T: Clone> Tr for S\nwhere T: Copy\n{\n    /// Gets.\n    fn get(&self) -> u8 {\n        self.x\n    }\n\n    fn set(&mut self) {}\n}\n";
        let t = texts(src, Lang::Rust);
        let only: Vec<&str> = t.iter().map(|x| x.0).collect();
        assert_eq!(
            only,
            vec![
                "use a::b;\nuse c::d;",
                "/// Doc.\n#[derive(Debug)]\npub struct S { x: u8 }",
                "impl<T: Clone> Tr for S\nwhere T: Copy\n{",
                "/// Gets.\n    fn get(&self) -> u8 {\n        self.x\n    }",
                "fn set(&mut self) {}",
                "}",
            ]
        );
        assert!(t[2].2 && !t[3].2 && !t[4].2 && !t[5].2);
        assert!(t[2].1 == t[3].1 && t[3].1 == t[4].1 && t[4].1 == t[5].1 && t[1].1 != t[2].1);
        let c = chunk(src, Lang::Rust, 2048).unwrap();
        assert_eq!(c[3].defines, vec!["get".to_string()]);
        assert_eq!(c[3].heading.as_deref(), Some("impl<T: Clone> Tr for S"));
        assert_eq!(c[2].defines, vec!["S".to_string()]);
        // the header and the closing line ride with the methods
        assert_eq!(c.iter().map(|c| c.rides).collect::<Vec<_>>(), vec![false, false, true, false, false, true]);
    }

    #[test]
    fn python_class_methods_with_decorators() {
        let src = "import os\n\nclass A(B):\n    \"\"\"Doc.\"\"\"\n\n    @property\n    def x(self):\n        return 1\n\n    def y(self):\n        pass\n\ndef f():\n    return 2\n";
        let t = texts(src, Lang::Python);
        let only: Vec<&str> = t.iter().map(|x| x.0).collect();
        assert_eq!(
            only,
            vec![
                "import os",
                "class A(B):",
                "\"\"\"Doc.\"\"\"",
                "@property\n    def x(self):\n        return 1",
                "def y(self):\n        pass",
                "def f():\n    return 2"
            ]
        );
        assert!(t[1].2 && t[1].1 == t[3].1 && !t[3].2 && t[5].1 != t[1].1);
    }

    #[test]
    fn languages_by_name_and_sniff() {
        assert_eq!(Lang::from_name("crate/src/lib.rs"), Some(Lang::Rust));
        assert_eq!(Lang::from_name("a.TSX"), Some(Lang::Tsx));
        assert_eq!(Lang::from_name("notes"), None);
        assert_eq!(Lang::sniff("use std::io;\n\npub fn main() {\n    let x = 1;\n}\n"), Some(Lang::Rust));
        assert_eq!(Lang::sniff("import os\n\ndef main():\n    pass\n"), Some(Lang::Python));
        assert_eq!(Lang::sniff("package main\n\nfunc main() {\n}\n"), Some(Lang::Go));
        assert_eq!(Lang::sniff("hello there\nplain words"), None);
    }

    #[test]
    fn other_languages_split_classes_into_methods() {
        for (src, lang, method) in [
            ("class A {\n  m() {\n    return 1;\n  }\n}\n", Lang::JavaScript, "m() {\n    return 1;\n  }"),
            (
                "class A {\n  m(): number {\n    return 1;\n  }\n}\n",
                Lang::TypeScript,
                "m(): number {\n    return 1;\n  }",
            ),
            ("class A {\n  int m() {\n    return 1;\n  }\n}\n", Lang::Java, "int m() {\n    return 1;\n  }"),
            ("namespace n {\nint m() {\n  return 1;\n}\n}\n", Lang::Cpp, "int m() {\n  return 1;\n}"),
        ] {
            let t = texts(src, lang);
            assert!(t.iter().any(|x| x.0 == method && !x.2), "{lang:?}: {t:?}");
            assert!(t[0].2, "{lang:?}: header leads");
        }
        let go = "package p\n\n// F does.\nfunc F() int {\n\treturn 1\n}\n";
        assert_eq!(texts(go, Lang::Go).last().unwrap().0, "// F does.\nfunc F() int {\n\treturn 1\n}");
        let c = "#include <x.h>\n\nint f(void) {\n  return 1;\n}\n";
        assert_eq!(texts(c, Lang::C).last().unwrap().0, "int f(void) {\n  return 1;\n}");
    }

    #[test]
    fn a_long_macro_is_cut_at_blank_lines_and_a_long_function_stays_whole_when_asked() {
        let methods: Vec<String> = (0..24)
            .map(|i| format!("        /// Returns field {i} of the flags, as stored.\n        pub fn get_{i}(&self) -> u64 {{\n            self.{i}\n        }}\n"))
            .collect();
        let mac = format!("macro_rules! flags {{\n    ($t:ident) => {{\n{}    }};\n}}\n", methods.join("\n"));
        let body: String = (0..120).map(|i| format!("    let x{i} = compute({i});\n")).collect();
        let long_fn = format!("fn long() {{\n{body}}}\n");
        assert!(mac.len() > LONG_LEAF_BYTES && long_fn.len() > LONG_LEAF_BYTES);
        let src = format!("use a::b;\n\n{mac}\n{long_fn}");
        let c = chunk(&src, Lang::Rust, 0).unwrap();
        let pieces: Vec<&RawChunk> = c.iter().filter(|c| c.chunker == "heuristic:code").collect();
        assert_eq!(pieces.len(), 24, "one piece per blank-line block of the macro");
        assert!(pieces.iter().all(|p| p.group == pieces[0].group && !p.rides));
        assert!(pieces[0].lead && pieces[1..].iter().all(|p| !p.lead));
        assert_eq!(pieces[0].defines, vec!["flags".to_string()]);
        assert!(
            src[pieces[3].start..pieces[3].end].contains("pub fn get_3(&self) -> u64 {\n            self.3\n        }")
        );
        let f = c.iter().find(|c| src[c.start..c.end].starts_with("fn long()")).unwrap();
        assert_eq!(&src[f.start..f.end], long_fn.trim_end(), "the function is one chunk");
        assert_eq!(f.chunker, "tree-sitter:rust");
    }

    #[test]
    fn a_long_method_is_cut_into_its_signature_body_pieces_and_closing_line() {
        let mut body = String::new();
        for i in 0..24 {
            body.push_str(&format!("    if (input.x{i} > {i}) {{\n      out.push(render{i}(input, options))\n    }} else {{\n      out.push(fallback{i})\n    }}\n"));
            if i % 3 == 2 {
                body.push('\n');
            }
        }
        let src = format!("class Range {{\n  // Parses a range.\n  parseRange (input, options) {{\n{body}    return out\n  }}\n\n  short () {{\n    return 1\n  }}\n}}\n");
        let c = chunk(&src, Lang::JavaScript, 2048).unwrap();
        let t: Vec<&str> = c.iter().map(|c| &src[c.start..c.end]).collect();
        let sig = t.iter().position(|t| t.starts_with("// Parses a range.")).unwrap();
        assert_eq!(t[sig], "// Parses a range.\n  parseRange (input, options) {");
        assert!(c[sig].lead && !c[sig].rides && c[sig].defines == vec!["parseRange".to_string()]);
        assert_ne!(c[sig].group, c[0].group, "the method leads a group of its own");
        let pieces: Vec<usize> =
            (sig + 1..c.len()).take_while(|&j| c[j].group == c[sig].group && !c[j].rides).collect();
        assert!(pieces.len() >= 3, "{} pieces", pieces.len());
        for &j in &pieces {
            assert!(!c[j].lead && c[j].end - c[j].start <= 1024 + 200);
            assert_eq!(c[j].heading.as_deref(), Some("class Range › parseRange (input, options)"));
            assert!(!t[j].starts_with('}') && !t[j].starts_with("else"), "{:?}", t[j]);
        }
        // the pieces cover the body, and the closing line rides
        let close = pieces.last().unwrap() + 1;
        assert_eq!((t[close], c[close].rides, c[close].group), ("}", true, c[sig].group));
        let joined: String = pieces.iter().map(|&j| t[j].trim()).collect::<Vec<_>>().join("\n");
        let want: String = format!("{body}    return out")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(joined.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("\n"), want);
        // a short method stays whole; 0 keeps every function whole
        assert!(t.contains(&"short () {\n    return 1\n  }"));
        let whole = chunk(&src, Lang::JavaScript, 0).unwrap();
        assert!(whole
            .iter()
            .any(|c| src[c.start..c.end].starts_with("// Parses") && src[c.start..c.end].ends_with("return out\n  }")));
    }

    #[test]
    fn a_long_loop_without_blank_lines_is_cut_inside() {
        let inner: String = (0..150)
            .map(|i| format!("        if (arg === '-{i}') {{\n            push(arg, {i});\n        }}\n"))
            .collect();
        let src = format!("function parse(args) {{\n    for (let i = 0; i < args.length; i++) {{\n{inner}    }}\n}}\n");
        let c = chunk(&src, Lang::JavaScript, 1024).unwrap();
        let pieces: Vec<&RawChunk> = c.iter().filter(|c| !c.lead && !c.rides).collect();
        assert!(pieces.len() >= 3, "{} pieces", pieces.len());
        for p in &pieces {
            let t = &src[p.start..p.end];
            assert!(t.len() <= 2 * PIECE_MAX_BYTES + 64 && !t.starts_with('}'), "{t:?}");
        }
    }

    #[test]
    fn a_long_python_function_has_no_closing_line() {
        let body: String =
            (0..120).map(|i| format!("    x{i} = compute({i})\n{}", if i % 10 == 9 { "\n" } else { "" })).collect();
        let src = format!("def build(items):\n{body}    return x119\n");
        assert!(src.len() > 2048);
        let c = chunk(&src, Lang::Python, 2048).unwrap();
        assert_eq!(&src[c[0].start..c[0].end], "def build(items):");
        assert!(c.len() > 2 && c[1..].iter().all(|p| !p.lead && !p.rides && p.group == c[0].group));
        assert!(src[c.last().unwrap().start..].trim_end().ends_with("return x119"));
        // without blank lines, cut between the body's statements at the 1 KiB bound
        let dense = src.replace("\n\n", "\n");
        let c = chunk(&dense, Lang::Python, 2048).unwrap();
        assert!(c.len() > 3 && c[1..].iter().all(|p| p.end - p.start <= PIECE_MAX_BYTES + 32), "{}", c.len());
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let n = 20_000;
        let src = format!("{}fn f() {{}}{}", "mod a {\n".repeat(n), "}\n".repeat(n));
        let c = chunk(&src, Lang::Rust, 2048).unwrap();
        assert!(c.len() <= 3 * MAX_DEPTH, "{} chunks", c.len());
        assert!(c.iter().all(|c| c.end <= src.len() && c.start < c.end));
    }
}
