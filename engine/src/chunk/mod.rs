//! Structure-aware chunking: prose by sentences, code by blocks, logs around
//! errors, JSON by key paths, chat by turns, tables by table. No chunk
//! crosses a field; every chunk is a byte span of its field's content.
//! Code in a language with a built-in grammar is parsed (see [`code`]);
//! each chunk records which chunker made it.

mod chat;
pub mod code;
pub mod json;
mod log;
pub mod markdown;

pub use log::severity;

use crate::context::{Field, FieldKind};

/// A piece of one field.
#[derive(Debug, Clone, PartialEq)]
pub struct RawChunk {
    /// Byte span in the field's content.
    pub start: usize,
    /// End of the span (exclusive).
    pub end: usize,
    /// Heading in force (markdown heading, JSON path, table name).
    pub heading: Option<String>,
    /// Chunks with the same group belong together (a paragraph, a question
    /// and its answer, a table).
    pub group: usize,
    /// The group's lead (first sentence of a paragraph, the question of a
    /// chat exchange, a table's header).
    pub lead: bool,
    /// Names this chunk defines (functions, tables), for dependency links.
    pub defines: Vec<String>,
    /// Which chunker made it: `prose`, `log`, `json`, `chat`, `table`,
    /// `heuristic:code`, or `tree-sitter:<language>` (`tree-sitter:rust`).
    pub chunker: &'static str,
    /// Structure only: a container's header or closing line (`impl Foo for
    /// Bar {`, `}`), sent only together with a member of its group, never on
    /// its own (alone it tells the receiver nothing and costs budget).
    pub rides: bool,
}

impl RawChunk {
    /// A lead chunk of its own group that defines `name` (a function, a table).
    fn block(start: usize, end: usize, group: usize, name: Option<String>, chunker: &'static str) -> Self {
        RawChunk {
            start,
            end,
            heading: name.clone(),
            group,
            lead: true,
            defines: name.into_iter().collect(),
            chunker,
            rides: false,
        }
    }
}

/// Chunking parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkConfig {
    /// Prose sentences are grouped up to about this many bytes (0: one sentence per chunk).
    pub target_bytes: usize,
    /// Longest chunk in bytes: a longer one (a sentence with no end, a huge
    /// function, a megabyte log line) is cut at line breaks, else at
    /// whitespace, else at a character boundary, into pieces of one group
    /// led by the first, so every piece can fit a budget.
    pub max_chunk_bytes: usize,
    /// Longest code chunk in bytes: a chunk of code (with long functions
    /// whole, a function) up to this size stays one chunk (the encoder
    /// embeds long chunks in windows). Longer ones are cut at line breaks
    /// like any chunk.
    pub max_code_chunk_bytes: usize,
    /// A function (or method) longer than this many bytes is cut into its
    /// signature, which leads a group of its own, pieces of its body (cut
    /// at blank lines and between statements) and its closing line, so the
    /// lines that matter can be sent with the signature and `…` for the
    /// rest; 0: a function stays whole up to `max_code_chunk_bytes`. The
    /// default, 8 KiB (about 2,000 tokens), is the lowest of 4, 8 and
    /// 12 KiB that leaves the code-search dev set (gold: a whole function)
    /// where it was at every budget; 4 KiB lifts the 55 multi-file code dev
    /// cases (gold: the lines a commit edits) the most but lowers code search
    /// at 3× and 2× (BENCHMARKS.md).
    pub long_function_bytes: usize,
    /// Parse code with tree-sitter where a grammar exists (else only the
    /// line heuristic, as before the parser came: for comparisons).
    pub code_parser: bool,
    /// A JSON value up to this many bytes stays one chunk; a larger object
    /// or array is cut into runs of members of about this size ([`json`]).
    pub json_unit_bytes: usize,
    /// A log's ordinary entries (neither an error nor a frame) are grouped
    /// into chunks of up to this many lines (1: each entry a chunk of its
    /// own, as an error line is).
    pub log_run_lines: usize,
    /// A markdown list item over this many bytes is cut by sentences, its
    /// lead (its bold phrase, else its first sentence) riding with each
    /// ([`markdown`]); 0: never, a list item is one chunk however long.
    pub item_sentence_bytes: usize,
    /// A chat's consecutive turns are grouped into runs of up to this many
    /// bytes, one run a chunk (`chunk/chat.rs`); 0: each turn a chunk of its own,
    /// a question grouped with its answer.
    pub chat_run_bytes: usize,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        Self {
            target_bytes: 0,
            max_chunk_bytes: 2048,
            max_code_chunk_bytes: 16 << 10,
            long_function_bytes: 8 << 10,
            code_parser: true,
            json_unit_bytes: 768,
            log_run_lines: 4,
            item_sentence_bytes: 0,
            chat_run_bytes: 512,
        }
    }
}

/// Splits a field into chunks according to its kind.
pub fn chunk_field(field: &Field, cfg: ChunkConfig) -> Vec<RawChunk> {
    let text = field.content.as_str();
    let mut out = match field.kind {
        FieldKind::Prose if markdown::looks_like_markdown(text) => {
            markdown::chunk(text, "markdown:detected", cfg.max_chunk_bytes, cfg.item_sentence_bytes)
        }
        FieldKind::Prose => prose(text, cfg),
        FieldKind::Markdown => markdown::chunk(text, "markdown", cfg.max_chunk_bytes, cfg.item_sentence_bytes),
        FieldKind::Code if cfg.code_parser => code_field(field, cfg.long_function_bytes),
        FieldKind::Code => code(text),
        FieldKind::Log => log::chunk(text, cfg.log_run_lines),
        FieldKind::Json => json::chunk(text, cfg.json_unit_bytes).unwrap_or_else(|| json_lines(text)),
        FieldKind::Chat => chat::chunk(text, cfg.chat_run_bytes),
        FieldKind::Table => table(text),
    };
    out.retain(|c| !text[c.start..c.end].trim().is_empty());
    for c in &mut out {
        trim_span(text, &mut c.start, &mut c.end);
    }
    // code, and markdown's fenced blocks, stay whole up to the code bound;
    // every other chunk (a markdown list item or paragraph included) to the
    // chunk bound
    let max = |c: &RawChunk| {
        let fence = c.chunker.starts_with("markdown") && markdown::opens_fence(&text[c.start..c.end]);
        if field.kind == FieldKind::Code || fence { cfg.max_code_chunk_bytes } else { cfg.max_chunk_bytes }.max(1)
    };
    if out.iter().any(|c| c.end - c.start > max(c)) {
        out = out
            .into_iter()
            .flat_map(|c| {
                let m = max(&c);
                split_long(text, c, m)
            })
            .collect();
    }
    out
}

/// A code field by its language's parser (named by the field's extension,
/// else sniffed), else by the line heuristic.
fn code_field(field: &Field, long_function_bytes: usize) -> Vec<RawChunk> {
    let text = field.content.as_str();
    Lang::from_name(&field.name)
        .or_else(|| Lang::sniff(text))
        .and_then(|lang| code::chunk(text, lang, long_function_bytes))
        .unwrap_or_else(|| code(text))
}

pub use code::Lang;

/// Cuts `c` into pieces of at most `max` bytes (see [`ChunkConfig::max_chunk_bytes`]).
fn split_long(text: &str, c: RawChunk, max: usize) -> Vec<RawChunk> {
    if c.end - c.start <= max {
        return vec![c];
    }
    let mut out = Vec::new();
    let mut start = c.start;
    while start < c.end {
        let mut end = if c.end - start <= max {
            c.end
        } else {
            let mut limit = start + max;
            while !text.is_char_boundary(limit) {
                limit -= 1;
            }
            let window = &text[start..limit];
            // the last line break, else the last whitespace, in the second half
            let half = window.len() / 2;
            let cut = window.rfind('\n').filter(|&i| i >= half).or_else(|| {
                window.char_indices().rev().find(|&(i, ch)| i >= half && ch.is_whitespace()).map(|(i, _)| i)
            });
            match cut {
                Some(i) => start + i,
                None if limit > start => limit,
                // one character longer than max: take it whole
                None => start + text[start..].chars().next().map_or(1, char::len_utf8),
            }
        };
        let (mut s, mut e) = (start, end);
        trim_span(text, &mut s, &mut e);
        if s < e {
            let first = out.is_empty();
            out.push(RawChunk {
                start: s,
                end: e,
                heading: c.heading.clone(),
                group: c.group,
                lead: c.lead && first,
                defines: if first { c.defines.clone() } else { Vec::new() },
                chunker: c.chunker,
                rides: c.rides,
            });
        }
        if end <= start {
            end = start + 1;
        }
        start = end;
    }
    out
}

fn trim_span(text: &str, start: &mut usize, end: &mut usize) {
    let s = &text[*start..*end];
    let lead = s.len() - s.trim_start().len();
    let trail = s.len() - s.trim_end().len();
    *start += lead;
    *end -= trail;
}

/// Line spans (start, end without the newline).
fn lines(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, b) in text.bytes().enumerate() {
        if b == b'\n' {
            out.push((start, i));
            start = i + 1;
        }
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// Common abbreviations: a stop after one does not end a sentence.
const ABBREVIATIONS: [&str; 15] =
    ["Mr", "Mrs", "Ms", "Dr", "St", "Jr", "Sr", "vs", "e.g", "i.e", "etc", "No", "Inc", "Co", "Ltd"];

/// The word before byte `pos`: back to the last whitespace.
fn word_before(text: &str, pos: usize) -> &str {
    let start =
        text[..pos].char_indices().rev().find(|(_, ch)| ch.is_whitespace()).map_or(0, |(p, ch)| p + ch.len_utf8());
    &text[start..pos]
}

/// A sentence glued to the next with no space (`born in 1987.He was`, as
/// text built by concatenating sentences arrives): the stop at `i` follows
/// a lower-case letter or a digit, and `j` (after any closing quotes) is an
/// upper-case letter followed by a lower-case one. Abbreviations, initials
/// (`U.S.Army`: an upper-case letter before), and addresses (`/`, `@`) are
/// not boundaries.
fn glued_boundary(text: &str, chars: &[(usize, char)], i: usize, j: usize) -> bool {
    let before = i.checked_sub(1).map(|b| chars[b].1);
    let opens = chars[j].1.is_uppercase() && chars.get(j + 1).is_some_and(|&(_, c)| c.is_lowercase());
    if !opens || !before.is_some_and(|b| b.is_lowercase() || b.is_ascii_digit()) {
        return false;
    }
    let word = word_before(text, chars[i].0);
    !(ABBREVIATIONS.contains(&word) || word.contains(['/', '@', ':']))
}

/// Sentence spans of a paragraph: ends after `.`, `!`, `?` (or CJK stops)
/// followed by whitespace and an upper-case letter, digit or quote, or
/// glued to the next sentence (see [`glued_boundary`]).
pub fn sentences(text: &str, offset: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for i in 0..chars.len() {
        let (pos, c) = chars[i];
        let end = pos + c.len_utf8();
        let cjk_stop = matches!(c, '。' | '！' | '？');
        if !(matches!(c, '.' | '!' | '?') || cjk_stop) {
            continue;
        }
        if cjk_stop {
            out.push((offset + start, offset + end));
            start = end;
            continue;
        }
        // need whitespace then a sentence opener
        let mut j = i + 1;
        while j < chars.len() && matches!(chars[j].1, '"' | '\'' | ')' | '”' | '’') {
            j += 1;
        }
        if j >= chars.len() {
            continue;
        }
        if !chars[j].1.is_whitespace() {
            if glued_boundary(text, &chars, i, j) {
                let cut = chars[j].0;
                out.push((offset + start, offset + cut));
                start = cut;
            }
            continue;
        }
        let mut k = j;
        while k < chars.len() && chars[k].1.is_whitespace() {
            k += 1;
        }
        if k < chars.len() {
            let n = chars[k].1;
            if !(n.is_uppercase() || n.is_numeric() || matches!(n, '"' | '“' | '(' | '\'') || !n.is_alphabetic()) {
                continue;
            }
            // common abbreviations do not end a sentence
            let word = word_before(text, pos);
            if ABBREVIATIONS.contains(&word) || (word.len() == 1 && word.chars().all(|ch| ch.is_uppercase())) {
                continue;
            }
        }
        let cut = chars.get(j).map(|&(p, _)| p).unwrap_or(text.len());
        out.push((offset + start, offset + cut));
        start = cut;
    }
    if start < text.len() {
        out.push((offset + start, offset + text.len()));
    }
    out
}

fn prose(text: &str, cfg: ChunkConfig) -> Vec<RawChunk> {
    let mut out = Vec::new();
    let mut heading: Option<String> = None;
    let mut group = 0usize;
    // paragraphs: blocks separated by blank lines; `#` lines are headings
    let mut para: Vec<(usize, usize)> = Vec::new();
    let flush =
        |para: &mut Vec<(usize, usize)>, out: &mut Vec<RawChunk>, group: &mut usize, heading: &Option<String>| {
            if para.is_empty() {
                return;
            }
            let (s, e) = (para[0].0, para.last().unwrap().1);
            let g = *group;
            let sentence_chunk = |start, end, lead| RawChunk {
                start,
                end,
                heading: heading.clone(),
                group: g,
                lead,
                defines: vec![],
                chunker: "prose",
                rides: false,
            };
            let mut first = true;
            let mut cur: Option<(usize, usize)> = None;
            for (a, b) in sentences(&text[s..e], s) {
                cur = match cur {
                    Some((ca, _)) if cfg.target_bytes > 0 && b - ca <= cfg.target_bytes => Some((ca, b)),
                    Some((ca, cb)) => {
                        out.push(sentence_chunk(ca, cb, first));
                        first = false;
                        Some((a, b))
                    }
                    None => Some((a, b)),
                };
            }
            if let Some((ca, cb)) = cur {
                out.push(sentence_chunk(ca, cb, first));
            }
            *group += 1;
            para.clear();
        };
    for (s, e) in lines(text) {
        let line = text[s..e].trim();
        if line.is_empty() {
            flush(&mut para, &mut out, &mut group, &heading);
        } else if line.starts_with('#') {
            flush(&mut para, &mut out, &mut group, &heading);
            heading = Some(heading_text(line));
            out.push(RawChunk {
                start: s,
                end: e,
                heading: heading.clone(),
                group,
                lead: true,
                defines: vec![],
                chunker: "prose",
                rides: false,
            });
            group += 1;
        } else {
            para.push((s, e));
        }
    }
    flush(&mut para, &mut out, &mut group, &heading);
    out
}

/// Longest heading kept, in bytes: every chunk under a heading carries a
/// copy, so an unbounded one makes chunking quadratic in memory.
const MAX_HEADING_BYTES: usize = 256;

/// The text of a `#` heading line, cut to [`MAX_HEADING_BYTES`] on a char boundary.
fn heading_text(line: &str) -> String {
    let h = line.trim_start_matches('#').trim();
    let cut = (0..=h.len().min(MAX_HEADING_BYTES)).rev().find(|&i| h.is_char_boundary(i)).unwrap_or(0);
    h[..cut].to_string()
}

/// Name defined by a code line (`fn x`, `def x`, `class X`, `function x`, `struct X`).
fn defined_name(line: &str) -> Option<String> {
    let t = line.trim_start();
    let t = t.strip_prefix("pub ").unwrap_or(t);
    let t = t.strip_prefix("async ").unwrap_or(t);
    for kw in ["fn ", "def ", "class ", "function ", "struct ", "enum ", "trait ", "interface ", "func ", "impl "] {
        if let Some(rest) = t.strip_prefix(kw) {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                return Some(name);
            }
        }
    }
    None
}

fn code(text: &str) -> Vec<RawChunk> {
    // a block starts at a non-indented line after a blank line, or at a definition
    let mut out = Vec::new();
    let mut cur: Option<RawChunk> = None;
    let mut prev_blank = true;
    for (i, (s, e)) in lines(text).into_iter().enumerate() {
        let line = &text[s..e];
        let blank = line.trim().is_empty();
        let top = !blank && !line.starts_with(char::is_whitespace) && !line.trim_start().starts_with(['}', ')', ']']);
        let def = defined_name(line).filter(|_| !line.starts_with(char::is_whitespace));
        let starts = top && (prev_blank || def.is_some());
        if starts || cur.is_none() {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            cur = Some(RawChunk::block(s, e, i, def, "heuristic:code"));
        } else if let Some(c) = cur.as_mut() {
            c.end = e;
        }
        prev_blank = blank;
    }
    out.extend(cur);
    out
}

/// A JSON field that does not parse (JSON Lines, a fragment): by lines.
fn json_lines(text: &str) -> Vec<RawChunk> {
    lines(text)
        .into_iter()
        .enumerate()
        .map(|(i, (s, e))| RawChunk {
            start: s,
            end: e,
            heading: None,
            group: i,
            lead: true,
            defines: vec![],
            chunker: "json",
            rides: false,
        })
        .collect()
}

fn table(text: &str) -> Vec<RawChunk> {
    // blocks separated by blank lines or starting at CREATE TABLE; a block
    // names the table it defines
    let mut out: Vec<RawChunk> = Vec::new();
    let mut prev_blank = true;
    for (s, e) in lines(text) {
        let line = &text[s..e];
        if line.trim().is_empty() {
            prev_blank = true;
            continue;
        }
        let name = table_name(line);
        if prev_blank || name.is_some() || out.is_empty() {
            out.push(RawChunk::block(s, e, s, name, "table"));
        } else if let Some(last) = out.last_mut() {
            last.end = e;
        }
        prev_blank = false;
    }
    out
}

fn table_name(line: &str) -> Option<String> {
    let lower = line.to_ascii_lowercase();
    let i = lower.find("create table")?;
    let rest = line[i + 12..].trim_start();
    let rest =
        rest.strip_prefix("IF NOT EXISTS").or_else(|| rest.strip_prefix("if not exists")).unwrap_or(rest).trim_start();
    let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.').collect();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn field(kind: FieldKind, content: &str) -> Field {
        Field { name: "f".into(), kind, content: content.into(), confidential: false }
    }

    /// The text of each chunk of `f`, default settings.
    pub(super) fn texts(f: &Field) -> Vec<String> {
        chunk_field(f, ChunkConfig::default()).iter().map(|c| f.content[c.start..c.end].to_string()).collect()
    }

    #[test]
    fn long_chunks_are_cut_within_bounds_at_breaks() {
        let line = "pool timeout ".repeat(80_000); // a megabyte line, no sentence end
        let f = field(FieldKind::Prose, &line);
        let c = chunk_field(&f, ChunkConfig::default());
        assert!(c.len() >= line.len() / 2048);
        assert!(c.iter().all(|c| c.end - c.start <= 2048), "within bounds");
        assert!(c.iter().all(|c| c.end == line.trim_end().len() || line[c.end..].starts_with(' ')), "no word cut");
        assert!(c[0].lead && c[1..].iter().all(|x| !x.lead && x.group == c[0].group));
        assert!(c.windows(2).all(|w| w[0].end <= w[1].start), "in order, no overlap");
        // code is cut at line breaks; text without any break at char boundaries
        // (with long functions whole, a code chunk may be as long as
        // max_code_chunk_bytes)
        let code = (0..400).map(|i| format!("    let x{i} = {i};\n")).collect::<String>();
        let f = field(FieldKind::Code, &format!("fn big() {{\n{code}}}\n"));
        let whole = ChunkConfig { long_function_bytes: 0, ..ChunkConfig::default() };
        assert_eq!(chunk_field(&f, whole).len(), 1);
        let small = ChunkConfig { max_code_chunk_bytes: 2048, ..whole };
        let c = chunk_field(&f, small);
        assert!(c.len() > 1 && c.iter().all(|c| c.end - c.start <= 2048));
        assert_eq!(c[0].defines, vec!["big".to_string()]);
        assert!(c.iter().all(|x| x.chunker == "tree-sitter:rust"));
        assert!(c.iter().all(|x| f.content[x.start..x.end].ends_with(';') || f.content[x.start..x.end].ends_with('}')));
        let f = field(FieldKind::Log, &"é".repeat(5000));
        let c = chunk_field(&f, ChunkConfig { target_bytes: 0, max_chunk_bytes: 1001, ..ChunkConfig::default() });
        assert!(c.iter().all(|c| c.end - c.start <= 1001));
        assert_eq!(c.iter().map(|c| c.end - c.start).sum::<usize>(), 10_000, "nothing lost");
    }

    #[test]
    fn prose_splits_sentences_and_keeps_abbreviations() {
        let f = field(
            FieldKind::Prose,
            "Dr. Smith arrived at 5 p.m. on Monday. He left early! Did he return?\n\nNew paragraph here.",
        );
        let t = texts(&f);
        assert_eq!(
            t,
            vec!["Dr. Smith arrived at 5 p.m. on Monday.", "He left early!", "Did he return?", "New paragraph here."]
        );
        let c = chunk_field(&f, ChunkConfig::default());
        assert!(c[0].lead && !c[1].lead && c[3].lead);
        assert_ne!(c[0].group, c[3].group);
    }

    #[test]
    fn sentences_glued_without_a_space_are_split_but_initials_and_addresses_are_not() {
        let text = "Mathilde was born in 1187.She married Otto.He died in 1201.The U.S.Army e.g.This see example.com/Page and Node.js.";
        let got: Vec<&str> = sentences(text, 0).into_iter().map(|(a, b)| &text[a..b]).collect();
        assert_eq!(
            got,
            [
                "Mathilde was born in 1187.",
                "She married Otto.",
                "He died in 1201.",
                "The U.S.Army e.g.This see example.com/Page and Node.js."
            ]
        );
        // offsets are kept
        assert_eq!(sentences("ab.Cd", 10), [(10, 13), (13, 15)]);
    }

    #[test]
    fn sentences_survive_multibyte_whitespace() {
        let t = "He won in 1990\u{a0}A. Later\u{2003}B. came. Done.";
        let spans = sentences(t, 0);
        assert_eq!(spans.last().unwrap().1, t.len());
        for (a, b) in spans {
            assert!(t.is_char_boundary(a) && t.is_char_boundary(b));
        }
    }

    #[test]
    fn long_heading_is_cut_on_a_char_boundary() {
        let text = format!("# {}\nOne. Two.", "é".repeat(200));
        let c = chunk_field(&field(FieldKind::Prose, &text), ChunkConfig::default());
        assert_eq!(c.len(), 3);
        for ch in &c {
            assert_eq!(ch.heading.as_deref(), Some("é".repeat(128).as_str()));
        }
    }

    #[test]
    fn prose_groups_up_to_target() {
        let f = field(FieldKind::Prose, "One a. Two b. Three c. Four d.");
        let c = chunk_field(&f, ChunkConfig { target_bytes: 18, ..ChunkConfig::default() });
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn code_splits_at_definitions() {
        let f = field(FieldKind::Code, "use x;\n\nfn charge(o: &Order) {\n    pool.get()\n}\n\nfn refund() {\n}\n");
        let c = chunk_field(&f, ChunkConfig::default());
        assert_eq!(c.len(), 3);
        assert_eq!(c[1].defines, vec!["charge".to_string()]);
        assert!(f.content[c[1].start..c[1].end].ends_with('}'));
    }

    #[test]
    fn json_chunks_parse_and_bad_json_goes_by_lines() {
        let f = field(FieldKind::Json, r#"{"a": {"x": [1, 2]}, "b": "q,\"r\"", "c": 3}"#);
        let c = chunk_field(&f, ChunkConfig::default());
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].heading.as_deref(), Some("$"));
        let f = field(FieldKind::Json, "{\"a\": 1}\n{\"a\": 2}\n");
        let c = chunk_field(&f, ChunkConfig::default());
        assert_eq!(c.len(), 2);
        assert_eq!(&f.content[c[1].start..c[1].end], "{\"a\": 2}");
    }

    #[test]
    fn table_chunks_by_create_table() {
        let f = field(
            FieldKind::Table,
            "CREATE TABLE users (\n id int\n);\nCREATE TABLE charges (\n user_id int REFERENCES users\n);",
        );
        let c = chunk_field(&f, ChunkConfig::default());
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].defines, vec!["charges".to_string()]);
    }
}
