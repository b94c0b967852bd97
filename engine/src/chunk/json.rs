//! JSON by subtree: a value that fits the unit ([`super::ChunkConfig::json_unit_bytes`]) is one chunk; a larger
//! object or array is cut into its members, the small ones grouped in runs,
//! the large ones cut again. Each chunk is a run of members of one container
//! (so it parses once wrapped in `{}` or `[]`) and is headed by that
//! container's path (`items[37].status`). A chunk's group is the array
//! element it sits in (a pod of a pod list), led by its first chunk, so a
//! deep chunk can bring the element's name along.
//!
//! The chunks tile the document: a member's separating comma goes with the
//! chunk it ends, and a cut container's opening (its key and `{`) with its
//! first chunk, its closing bracket with its last. So a container sent in
//! all its chunks is sent whole, brackets included, and a chunk sent alone
//! is rendered from its [`Wrap`]: its members, wrapped so they parse.

use super::RawChunk;

/// Deepest nesting followed; below it a value is one chunk whatever its size.
const MAX_DEPTH: usize = 64;

/// One member of an object (with its key) or element of an array.
struct Member {
    /// The member's span: from its key (objects) or value start to its value's end.
    start: usize,
    end: usize,
    /// The key (objects) or index (arrays), for paths.
    step: Step,
    /// The value's span and whether it is a container.
    value: (usize, usize),
    container: bool,
}

enum Step {
    Key(String),
    Index(usize),
}

/// Chunks of a JSON document; `None` when `text` does not parse.
pub fn chunk(text: &str, unit_bytes: usize) -> Option<Vec<RawChunk>> {
    serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
    let bytes = text.as_bytes();
    let start = skip_ws(bytes, 0);
    let end = value_end(bytes, start)?;
    let mut out = Out::default();
    let root = Unit { start, end, path: String::new(), group: start, depth: 0, unit: unit_bytes.max(1) };
    emit(text, &root, &mut out);
    Some(out.chunks)
}

/// A value being chunked: its span, path and group.
struct Unit {
    start: usize,
    end: usize,
    path: String,
    group: usize,
    depth: usize,
    /// A value up to this many bytes stays one chunk.
    unit: usize,
}

/// Keys that say which thing an object is: the chunk holding one leads
/// its group (a pod's `metadata`, a release file's `filename`).
const IDENTITY: [&str; 10] = ["name", "id", "key", "title", "filename", "metadata", "kind", "path", "version", "uid"];

/// Members of one container collected into a chunk.
struct Run {
    start: usize,
    end: usize,
    /// First and last index of the members (array elements name them in the path).
    first: usize,
    last: usize,
    /// Whether a member's key is in [`IDENTITY`].
    ident: bool,
}

/// After a member ending at `end`: the end of the comma that follows it, if one does.
fn with_separator(b: &[u8], end: usize) -> usize {
    let j = skip_ws(b, end);
    if b.get(j) == Some(&b',') {
        j + 1
    } else {
        end
    }
}

fn emit(text: &str, u: &Unit, out: &mut Out) {
    let bytes = text.as_bytes();
    let open = bytes[u.start];
    if u.end - u.start <= u.unit || !(open == b'{' || open == b'[') || u.depth >= MAX_DEPTH {
        out.push(u.start, u.end, &u.path, u.group, false);
        return;
    }
    let first_chunk = out.chunks.len();
    members_of(text, u, out);
    // the container's brackets go with its first and last chunks
    if out.chunks.len() > first_chunk {
        out.chunks[first_chunk].start = u.start;
        let last = out.chunks.len() - 1;
        out.chunks[last].end = out.chunks[last].end.max(u.end);
    }
}

/// The chunks of a cut container's members (runs of small ones, big ones cut again).
fn members_of(text: &str, u: &Unit, out: &mut Out) {
    let bytes = text.as_bytes();
    let array = bytes[u.start] == b'[';
    let flush = |run: Run, out: &mut Out| {
        let path = match (array, run.first == run.last) {
            (false, _) => u.path.clone(),
            (true, true) => format!("{}[{}]", u.path, run.first),
            (true, false) => format!("{}[{}-{}]", u.path, run.first, run.last),
        };
        out.push(run.start, with_separator(bytes, run.end), &path, u.group, run.ident);
    };
    let mut run: Option<Run> = None;
    for (n, m) in members(bytes, u.start, u.end).into_iter().enumerate() {
        let ident = matches!(&m.step, Step::Key(k) if IDENTITY.contains(&k.to_ascii_lowercase().as_str()));
        if m.container && m.value.1 - m.value.0 > u.unit {
            if let Some(r) = run.take() {
                flush(r, out);
            }
            let path = match &m.step {
                Step::Key(k) if u.path.is_empty() => k.clone(),
                Step::Key(k) => format!("{}.{k}", u.path),
                Step::Index(i) => format!("{}[{i}]", u.path),
            };
            // an array's element is a group of its own (a pod of a list)
            let group = if array { m.value.0 } else { u.group };
            let first_chunk = out.chunks.len();
            emit(text, &Unit { start: m.value.0, end: m.value.1, path, group, depth: u.depth + 1, unit: u.unit }, out);
            // its key goes with its first chunk, the comma after it with its last
            if out.chunks.len() > first_chunk {
                out.chunks[first_chunk].start = m.start;
                let last = out.chunks.len() - 1;
                out.chunks[last].end = with_separator(bytes, out.chunks[last].end);
            }
            continue;
        }
        run = match run {
            Some(r) if m.end - r.start <= u.unit => Some(Run { end: m.end, last: n, ident: r.ident || ident, ..r }),
            other => {
                if let Some(r) = other {
                    flush(r, out);
                }
                Some(Run { start: m.start, end: m.end, first: n, last: n, ident })
            }
        };
    }
    if let Some(r) = run {
        flush(r, out);
    }
}

/// The chunks so far; per group, its lead so far and whether that lead
/// names the thing (holds an [`IDENTITY`] key).
#[derive(Default)]
struct Out {
    chunks: Vec<RawChunk>,
    leads: std::collections::HashMap<usize, (usize, bool)>,
}

impl Out {
    fn push(&mut self, start: usize, end: usize, path: &str, group: usize, ident: bool) {
        let at = self.chunks.len();
        let lead = match self.leads.get(&group).copied() {
            None => true,
            // a chunk that names the thing takes the lead from one that does not
            Some((old, false)) if ident => {
                self.chunks[old].lead = false;
                true
            }
            Some(_) => false,
        };
        if lead {
            self.leads.insert(group, (at, ident));
        }
        self.chunks.push(piece(start, end, path, group, lead));
    }
}

fn piece(start: usize, end: usize, path: &str, group: usize, lead: bool) -> RawChunk {
    RawChunk {
        start,
        end,
        heading: Some(if path.is_empty() { "$".to_string() } else { path.to_string() }),
        group,
        lead,
        defines: vec![],
        chunker: "json",
        rides: false,
    }
}

/// The members of the container spanning `start..end`.
fn members(b: &[u8], start: usize, end: usize) -> Vec<Member> {
    let object = b[start] == b'{';
    let mut out = Vec::new();
    let mut i = skip_ws(b, start + 1);
    let mut index = 0;
    while i < end - 1 {
        let m_start = i;
        let step = if object {
            let Some(k_end) = string_end(b, i) else { break };
            let key = serde_json::from_slice::<String>(&b[i..k_end]).unwrap_or_default();
            i = skip_ws(b, k_end);
            if b.get(i) != Some(&b':') {
                break;
            }
            i = skip_ws(b, i + 1);
            Step::Key(key)
        } else {
            Step::Index(index)
        };
        let Some(v_end) = value_end(b, i) else { break };
        out.push(Member {
            start: m_start,
            end: v_end,
            step,
            value: (i, v_end),
            container: matches!(b[i], b'{' | b'['),
        });
        index += 1;
        i = skip_ws(b, v_end);
        if b.get(i) == Some(&b',') {
            i = skip_ws(b, i + 1);
        }
    }
    out
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// End (exclusive) of the string starting at `i` (a `"`).
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// End (exclusive) of the value starting at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']') && !b[j].is_ascii_whitespace() {
                j += 1;
            }
            Some(j)
        }
    }
}

/// The containers cut across several chunks of one document, given its
/// chunks' texts in reading order (they tile it): each as the first and
/// last chunk it spans, an inner container before the one holding it.
pub fn containers(texts: &[&str]) -> Vec<(usize, usize)> {
    let mut open: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    for (k, t) in texts.iter().enumerate() {
        let (closes, opens) = unmatched(t.as_bytes());
        for _ in 0..closes {
            if let Some(s) = open.pop() {
                out.push((s, k));
            }
        }
        open.extend(std::iter::repeat_n(k, opens));
    }
    out
}

/// How many brackets `b` closes that it did not open, and how many it
/// opens and does not close.
fn unmatched(b: &[u8]) -> (usize, usize) {
    let (mut closes, mut depth) = (0, 0usize);
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i = string_end(b, i).unwrap_or(b.len());
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth == 0 => closes += 1,
            b'}' | b']' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    (closes, depth)
}

/// A whole value under its key (`"status": {…}`, the text of a cut container
/// sent in all its chunks): the value's range, so it is rendered alone under
/// its path.
pub fn keyed_value(text: &str) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let k = skip_ws(b, string_end(b, skip_ws(b, 0))?);
    if b.get(k) != Some(&b':') {
        return None;
    }
    let v = skip_ws(b, k + 1);
    let end = value_end(b, v)?;
    (matches!(b.get(v), Some(b'{' | b'[')) && text[end..].trim().is_empty()).then_some((v, end))
}

/// How a JSON chunk (or a run of adjacent ones) is rendered so that it
/// parses: `core` is the byte range of its text holding its members or its
/// whole value (without a cut container's opening before them, the closing
/// brackets after them or a trailing comma), put between `open` and `close`
/// (`{}` around object members, `[]` around array elements, nothing around
/// a value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wrap {
    /// What goes before the core.
    pub open: &'static str,
    /// What goes after it.
    pub close: &'static str,
    /// The core's byte range in the text.
    pub core: (usize, usize),
}

/// How a JSON chunk's text parses on its own ([`Wrap`]); `None` if it does
/// not (or holds the ends of two containers).
pub fn wrapping(text: &str) -> Option<Wrap> {
    let (a, b) = core(text.as_bytes())?;
    let t = &text[a..b];
    let parses = |s: &str| serde_json::from_str::<serde::de::IgnoredAny>(s).is_ok();
    let (open, close) = if parses(t) {
        ("", "")
    } else if parses(&format!("{{{t}}}")) {
        ("{", "}")
    } else if parses(&format!("[{t}]")) {
        ("[", "]")
    } else {
        return None;
    };
    Some(Wrap { open, close, core: (a, b) })
}

/// The bracket state of a run of adjacent JSON chunks, carried forward as
/// each chunk's text (and the white space before it) is appended, so that a
/// growing run is scanned once: what [`wrapping`] says of the run's whole
/// text, without parsing it again. Exact for runs of chunks of a document
/// that parses, as [`chunk`] cuts it (between members): there, a run whose
/// brackets leave a core (see `core`) is whole members of one container,
/// which parse once wrapped.
#[derive(Debug, Clone, Default)]
pub struct Brackets {
    /// The brackets opened and not closed yet, innermost last.
    open: Vec<Opening>,
    /// Inside a string, and right after a backslash in it.
    in_string: bool,
    escaped: bool,
    /// What the tokens so far are: only openings and keys (`"k":`), the
    /// same with a string last, or anything else.
    prefix: Prefix,
    /// A bracket closed that the run did not open.
    unopened: bool,
    /// Since the first such bracket: only closings, commas and white space.
    tail_clean: bool,
    /// Before it: a byte other than white space or a comma.
    content: bool,
}

#[derive(Debug, Clone, Copy)]
struct Opening {
    /// Only openings and keys came before this bracket.
    clean_before: bool,
    /// A byte other than white space or a comma came after it.
    content: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Prefix {
    #[default]
    Clean,
    AfterString,
    Dirty,
}

impl Brackets {
    /// Appends `text` to the run.
    pub fn push(&mut self, text: &str) {
        for &c in text.as_bytes() {
            if self.unopened && !(matches!(c, b'}' | b']' | b',') || c.is_ascii_whitespace()) {
                self.tail_clean = false;
            }
            if self.in_string {
                match c {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => {
                    self.mark_content();
                    self.in_string = true;
                    self.prefix = match self.prefix {
                        Prefix::Clean => Prefix::AfterString,
                        _ => Prefix::Dirty,
                    };
                }
                b'{' | b'[' => {
                    self.mark_content();
                    let clean_before = self.prefix == Prefix::Clean;
                    if !clean_before {
                        self.prefix = Prefix::Dirty;
                    }
                    self.open.push(Opening { clean_before, content: false });
                }
                b'}' | b']' => {
                    if self.open.pop().is_none() && !self.unopened {
                        self.unopened = true;
                        self.tail_clean = true;
                    }
                    self.prefix = Prefix::Dirty;
                }
                b':' => {
                    self.mark_content();
                    self.prefix = match self.prefix {
                        Prefix::AfterString => Prefix::Clean,
                        _ => Prefix::Dirty,
                    };
                }
                b',' => self.prefix = Prefix::Dirty,
                _ if c.is_ascii_whitespace() => {}
                _ => {
                    self.mark_content();
                    self.prefix = Prefix::Dirty;
                }
            }
        }
    }

    /// Whether the run so far parses as one subtree once wrapped
    /// ([`wrapping`] is `Some`).
    pub fn wraps(&self) -> bool {
        if self.in_string {
            return false;
        }
        match self.open.last() {
            // the members after the innermost unclosed bracket, only openings and keys before it
            Some(o) => !self.unopened && o.clean_before && o.content,
            // the members before the first unopened closing, only closings after it
            None => self.content && (!self.unopened || self.tail_clean),
        }
    }

    fn mark_content(&mut self) {
        if !self.unopened {
            self.content = true;
        }
        if let Some(o) = self.open.last_mut() {
            o.content = true;
        }
    }
}

/// The part of `b` between the brackets it opens and does not close (with
/// the keys before them) and the brackets it closes and did not open (with
/// the commas after them), trimmed of white space and a final comma.
/// `None` when something other than an opening comes before an unclosed
/// bracket, or something other than a closing after an unopened one.
fn core(b: &[u8]) -> Option<(usize, usize)> {
    let mut open: Vec<usize> = Vec::new();
    let mut first_unopened = None;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i = string_end(b, i)?;
                continue;
            }
            b'{' | b'[' => open.push(i),
            b'}' | b']' => {
                let unopened = open.pop().is_none();
                if unopened && first_unopened.is_none() {
                    first_unopened = Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    // before the last unclosed bracket: only unclosed brackets and their keys
    let start = match open.last() {
        Some(&last) => {
            let mut j = skip_ws(b, 0);
            while j < last {
                if open.contains(&j) {
                    j = skip_ws(b, j + 1);
                    continue;
                }
                let k = skip_ws(b, string_end(b, j)?);
                if b.get(k) != Some(&b':') {
                    return None;
                }
                j = skip_ws(b, k + 1);
            }
            last + 1
        }
        None => 0,
    };
    // after the first unopened bracket: only closing brackets and commas
    let end = match first_unopened {
        Some(f) if f < start => return None,
        Some(f) if b[f..].iter().all(|c| matches!(c, b'}' | b']' | b',') || c.is_ascii_whitespace()) => f,
        Some(_) => return None,
        None => b.len(),
    };
    let mut end = end;
    while end > start && (b[end - 1].is_ascii_whitespace() || b[end - 1] == b',') {
        end -= 1;
    }
    let start = skip_ws(b, start).min(end);
    (start < end).then_some((start, end))
}

#[cfg(test)]
pub(crate) mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const UNIT: usize = 384;

    fn pods(n: usize) -> String {
        let items: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                serde_json::json!({
                    "metadata": {"name": format!("pod-{i}"), "labels": {"app": "web", "tier": "front"}},
                    "spec": {"containers": [{"name": "app", "image": "web:1.2", "args": ["--port", "8080", "--verbose", "--workers", "4"]}]},
                    "status": {"phase": if i == 3 { "CrashLoopBackOff" } else { "Running" }, "restartCount": i * 7,
                               "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-01-01T00:00:00Z"}}}
                })
            })
            .collect();
        serde_json::to_string_pretty(&serde_json::json!({"kind": "List", "apiVersion": "v1", "items": items})).unwrap()
    }

    #[test]
    fn a_big_list_is_cut_by_element_with_paths() {
        let text = pods(8);
        let c = chunk(&text, UNIT).unwrap();
        assert!(c.len() > 8, "{} chunks", c.len());
        for ch in &c {
            let t = &text[ch.start..ch.end];
            assert!(ch.end - ch.start <= UNIT || !t.contains('\n'), "{}", t.len());
            assert!(wrapping(t).is_some(), "does not parse: {t}");
            // the chunks tile the document: only white space between them
            if let Some(next) = c.iter().find(|n| n.start >= ch.end) {
                assert!(text[ch.end..next.start].trim().is_empty(), "{:?}", &text[ch.end..next.start]);
            }
        }
        let paths: Vec<&str> = c.iter().map(|c| c.heading.as_deref().unwrap()).collect();
        assert!(paths.contains(&"$"), "{paths:?}");
        assert!(paths.iter().any(|p| p.starts_with("items[3]")), "{paths:?}");
        // the chunks of one pod share a group, led by the first
        let g: Vec<&RawChunk> =
            c.iter().filter(|c| c.heading.as_deref().unwrap_or("").starts_with("items[3]")).collect();
        assert!(g.iter().all(|c| c.group == g[0].group));
    }

    #[test]
    fn cut_containers_are_found_across_their_chunks_which_make_them_whole() {
        let text = pods(8);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let c = chunk(&text, UNIT).unwrap();
        assert_eq!((c[0].start, c[c.len() - 1].end), (0, text.len()), "the chunks tile the document");
        let texts: Vec<&str> = c.iter().map(|ch| &text[ch.start..ch.end]).collect();
        let found = containers(&texts);
        assert!(found.contains(&(0, c.len() - 1)), "the root: {found:?}");
        let value = |(s, e): (usize, usize)| {
            let t = &text[c[s].start..c[e].end];
            let w = wrapping(t).unwrap_or_else(|| panic!("does not parse: {t}"));
            let core = &t[w.core.0..w.core.1];
            let core = keyed_value(core).map_or(core, |(a, b)| &core[a..b]);
            serde_json::from_str::<serde_json::Value>(core).unwrap_or_else(|e| panic!("{e}: {core}"))
        };
        // every pod is cut into several chunks, which together are the pod
        for i in 0..8 {
            assert!(found.iter().any(|&f| value(f) == doc["items"][i]), "pod {i}: {found:?}");
        }
        // inner containers come before the ones that hold them
        for (k, &(s, e)) in found.iter().enumerate() {
            assert!(found[..k].iter().all(|&(s2, e2)| !(s2 <= s && e <= e2)), "{found:?}");
        }
    }

    #[test]
    fn small_documents_are_one_chunk_and_bad_ones_none() {
        let c = chunk(r#"{"a": 1, "b": [1, 2]}"#, UNIT).unwrap();
        assert_eq!(c.len(), 1);
        assert!(chunk("{\"a\": ", UNIT).is_none());
        fn wrap(t: &str) -> Option<(&str, &str, &str)> {
            wrapping(t).map(|w| (w.open, w.close, &t[w.core.0..w.core.1]))
        }
        assert_eq!(wrap(r#""a": 1, "b": 2"#), Some(("{", "}", r#""a": 1, "b": 2"#)));
        assert_eq!(wrap(r#"{"a": 1}, {"b": 2}"#), Some(("[", "]", r#"{"a": 1}, {"b": 2}"#)));
        // a cut container's opening, closing and separators are left out
        assert_eq!(wrap("\"k\": {\n \"a\": 1,\n \"b\": [2],"), Some(("{", "}", "\"a\": 1,\n \"b\": [2]")));
        assert_eq!(wrap("\"a\": 1\n }\n ],"), Some(("{", "}", "\"a\": 1")));
        assert_eq!(wrap("{\"a\": 1},"), Some(("", "", "{\"a\": 1}")));
        // the ends of two containers, or members before an opening, do not parse as one
        assert_eq!(wrap("\"a\": 1 }, \"b\": 2"), None);
        assert_eq!(wrap("\"a\": 1, \"b\": { \"c\": 2"), None);
        // a member and its container's closing: the member; text that is no JSON: none
        assert_eq!(wrap(r#""a": 1, }"#), Some(("{", "}", r#""a": 1"#)));
        assert_eq!(wrap(r#""a": 1, "b""#), None);
        assert_eq!(wrap(r#""a": 1, "b": }"#), None);
    }

    #[test]
    fn escaped_quotes_and_brackets_in_strings_do_not_cut() {
        let big = "x".repeat(UNIT);
        let text = format!(r#"{{"a": "q\"]}}{{[", "b": "{big}", "c": {{"d": "}}"}}}}"#);
        let c = chunk(&text, UNIT).unwrap();
        for ch in &c {
            assert!(wrapping(&text[ch.start..ch.end]).is_some(), "{}", &text[ch.start..ch.end]);
        }
        assert!(c.len() >= 2);
    }

    /// Strings with brackets, quotes, escapes, control characters and
    /// non-ASCII text in them.
    const AWKWARD: [&str; 10] = [
        "plain",
        "a{b[c",
        "}],{[",
        "say \"hi\" ]",
        "back\\slash",
        "ends in a backslash \\",
        "\\\"}",
        "tab\tnew\nline \u{1}",
        "é ü 日本語 🚀",
        "",
    ];

    fn value(rng: &mut StdRng, depth: usize) -> serde_json::Value {
        use serde_json::Value;
        let pick = if depth >= 5 { rng.random_range(0..4) } else { rng.random_range(0..7) };
        match pick {
            0 => Value::from(AWKWARD[rng.random_range(0..AWKWARD.len())]),
            1 => Value::from(rng.random_range(-1000..1000) as f64 / 8.0),
            2 => [Value::Null, Value::Bool(true), Value::Bool(false)][rng.random_range(0..3)].clone(),
            3 => Value::from(rng.random_range(0..100_000)),
            4 | 5 => {
                let n = rng.random_range(0..6);
                let keys: Vec<String> =
                    (0..n).map(|k| format!("{}{k}", AWKWARD[rng.random_range(0..AWKWARD.len())])).collect();
                Value::Object(keys.into_iter().map(|k| (k, value(rng, depth + 1))).collect())
            }
            _ => Value::Array((0..rng.random_range(0..6)).map(|_| value(rng, depth + 1)).collect()),
        }
    }

    /// Seeded JSON documents: a list of objects (as a pod list is), then
    /// random trees, each printed pretty and compact.
    pub(crate) fn documents(seed: u64, n: usize) -> Vec<String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut out = vec![pods(6)];
        for _ in 0..n {
            let items: Vec<serde_json::Value> = (0..rng.random_range(1..8))
                .map(|_| serde_json::json!({"name": AWKWARD[rng.random_range(0..AWKWARD.len())], "spec": value(&mut rng, 2)}))
                .collect();
            let doc = serde_json::json!({"kind": "List", "items": items, "more": value(&mut rng, 1)});
            out.push(serde_json::to_string_pretty(&doc).unwrap());
            out.push(doc.to_string());
        }
        out
    }

    /// [`Brackets`] says what [`wrapping`] of the whole text says, for
    /// every run of adjacent chunks of documents cut at many unit sizes,
    /// one chunk appended at a time (the white space between included).
    #[test]
    fn the_running_bracket_state_agrees_with_wrapping_the_whole_run() {
        let (mut runs, mut wrapped) = (0, 0);
        for text in documents(7, 12) {
            for unit in [1, 2, 5, 16, 40, 96, 200, 384, 768] {
                let c = chunk(&text, unit).unwrap();
                for i in 0..c.len() {
                    let mut state = Brackets::default();
                    let mut end = c[i].start;
                    for (j, next) in c.iter().enumerate().skip(i) {
                        state.push(&text[end..next.end]);
                        end = next.end;
                        let t = &text[c[i].start..end];
                        let want = wrapping(t).is_some();
                        assert_eq!(state.wraps(), want, "unit {unit}, chunks {i}..={j}: {t}");
                        runs += 1;
                        wrapped += usize::from(want);
                    }
                }
            }
        }
        // both answers are common
        assert!(wrapped > 1000 && runs - wrapped > 1000, "{wrapped} of {runs} runs wrap");
    }

    /// Strings split across appends, and text that is not cut between
    /// members, carry their state; an unclosed string never wraps.
    #[test]
    fn the_running_bracket_state_follows_strings_and_escapes_across_appends() {
        for text in [r#""a": "x\"}{", "b": [1, {"c": "]"}],"#, r#"{"k": ["\\", "q\"["]}"#] {
            for cut in (1..text.len()).filter(|&k| text.is_char_boundary(k)) {
                let mut state = Brackets::default();
                state.push(&text[..cut]);
                state.push(&text[cut..]);
                assert_eq!(state.wraps(), wrapping(text).is_some(), "cut at {cut}: {text}");
            }
        }
        let mut state = Brackets::default();
        let mut text = String::new();
        for (part, wraps) in [(r#""a": "open"#, false), (r#" \" still"#, false), (r#"", "b": 2"#, true)] {
            state.push(part);
            text.push_str(part);
            assert_eq!((state.wraps(), wrapping(&text).is_some()), (wraps, wraps), "{text}");
        }
    }
}
