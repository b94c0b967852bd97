//! Structure-aware chunking: prose by sentences, code by blocks, logs around
//! errors, JSON by key paths, chat by turns, tables by table. No chunk
//! crosses a field; every chunk is a byte span of its field's content.
//! Code in a language with a built-in grammar is parsed (see [`code`]);
//! each chunk records which chunker made it.

mod chat;
pub mod code;
pub mod json;
pub mod markdown;

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
    /// Longest code chunk in bytes: a function up to this size stays one
    /// chunk, so it is sent whole or not at all (the encoder embeds long
    /// chunks in windows). Longer ones are cut at line breaks like any chunk.
    pub max_code_chunk_bytes: usize,
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
        FieldKind::Code if cfg.code_parser => code_field(field),
        FieldKind::Code => code(text),
        FieldKind::Log => log(text, cfg.log_run_lines),
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
fn code_field(field: &Field) -> Vec<RawChunk> {
    let text = field.content.as_str();
    Lang::from_name(&field.name)
        .or_else(|| Lang::sniff(text))
        .and_then(|lang| code::chunk(text, lang))
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

/// How bad the worst line of a log text is: 3 a raised exception's line
/// (`ValueError: bad input`, `java.io.IOException: closed`: the error's
/// name and message, which a traceback ends with), 2 another error, 1 a
/// warning, 0 neither.
pub fn severity(text: &str) -> u8 {
    text.lines().map(line_severity).max().unwrap_or(0)
}

/// How bad one log line is (as [`severity`]), its syslog level read once.
fn line_severity(line: &str) -> u8 {
    let level = syslog_level(line);
    if is_exception_line(line) {
        3
    } else if is_error(line, level) {
        2
    } else if has_word(line, "WARN") || level == 1 {
        1
    } else {
        0
    }
}

/// Words of an error line, upper-cased: log levels, a raised exception, and
/// a crash (a crash report's `Crashed Thread:`, `Thread 5 Crashed:`; a fatal
/// signal; a segmentation fault).
const ERROR_WORDS: [&str; 15] = [
    "ERROR",
    "FATAL",
    "PANIC",
    "EXCEPTION",
    "TRACEBACK",
    "CRITICAL",
    "FAILED",
    "CRASHED",
    "SIGSEGV",
    "SIGABRT",
    "SIGBUS",
    "SIGILL",
    "SIGFPE",
    "SEGFAULT",
    "SEGMENTATION FAULT",
];

/// Whether a line names a raised exception: a word that is a class name
/// ending in `Error` or `Exception` after at least one more letter (with an
/// optional package path: `AssertionError`, `java.io.IOException`, not
/// `SQLITE_ERROR` or a bare `Error`), followed by a colon or ending the
/// line.
fn is_exception_line(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.iter().enumerate().any(|(k, w)| {
        let name = match w.strip_suffix(':') {
            Some(n) => n,
            None if k + 1 == words.len() => w,
            None => return false,
        };
        let class = name.rsplit('.').next().unwrap_or(name);
        let path_ok = name
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$'));
        let stem = class.strip_suffix("Error").or_else(|| class.strip_suffix("Exception"));
        path_ok && class.starts_with(|c: char| c.is_ascii_uppercase()) && stem.is_some_and(|s| !s.is_empty())
    })
}

fn is_error_line(line: &str) -> bool {
    is_error(line, syslog_level(line))
}

/// Whether `line`, whose [`syslog_level`] is `level`, is an error line.
fn is_error(line: &str, level: u8) -> bool {
    ERROR_WORDS.iter().any(|k| has_word(line, k)) || level == 2
}

/// Syslog facilities, as `dmesg -x` and syslog files name them.
const FACILITIES: [&str; 20] = [
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv", "ftp", "local0",
    "local1", "local2", "local3", "local4", "local5", "local6", "local7",
];

/// A line's syslog level where the line states one in a standard form: the
/// `facility:level :` prefix of `dmesg -x` (`kern  :crit  : [18706.13] mce:
/// …`) or a `<N>` priority at its start (RFC 5424, `dmesg -r`): 2 for
/// emerg, alert, crit and err (levels 0–3), 1 for warning (4), else 0.
fn syslog_level(line: &str) -> u8 {
    let t = line.trim_start();
    if let Some((n, _)) = t.strip_prefix('<').and_then(|r| r.split_once('>')) {
        return match n.parse::<u32>() {
            Ok(p) if n.len() <= 3 => match p % 8 {
                0..=3 => 2,
                4 => 1,
                _ => 0,
            },
            _ => 0,
        };
    }
    let mut parts = t.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(facility), Some(level), Some(_)) if FACILITIES.contains(&facility.trim()) => match level.trim() {
            "emerg" | "alert" | "crit" | "err" => 2,
            "warn" | "warning" => 1,
            _ => 0,
        },
        _ => 0,
    }
}

/// Whether `line` holds `word` (upper case) case-insensitively where a word
/// starts: after a byte that is not a letter or digit, or at a camel-case
/// step (`ValueError`, `IOException`). So `NOERROR` (a DNS
/// answer's "no error") is not `ERROR`.
fn has_word(line: &str, word: &str) -> bool {
    let (b, w) = (line.as_bytes(), word.as_bytes());
    let starts_word = |p: usize| {
        let (prev, next) = (b[p - 1], b.get(p + 1).copied().unwrap_or(b' '));
        !prev.is_ascii_alphanumeric()
            || (b[p].is_ascii_uppercase() && (prev.is_ascii_lowercase() || next.is_ascii_lowercase()))
    };
    b.len() >= w.len()
        && (0..=b.len() - w.len()).any(|p| b[p..p + w.len()].eq_ignore_ascii_case(w) && (p == 0 || starts_word(p)))
}

fn is_frame(line: &str) -> bool {
    let t = line.trim_start();
    line.starts_with(char::is_whitespace)
        || t.starts_with("at ")
        || t.starts_with("File \"")
        || t.starts_with("Caused by")
        || t.starts_with("...")
        || numbered_frame(t)
}

/// A numbered stack frame with its address: an Apple crash report's
/// `4   kaki   0x0000000100081a1c main + 108` (number, image, address) or
/// gdb's `#0  0x00007f3a… in f ()`, so a thread's stack stays with the
/// line that names the thread.
fn numbered_frame(t: &str) -> bool {
    let mut w = t.split_whitespace();
    let (Some(n), Some(a), Some(b)) = (w.next(), w.next(), w.next()) else { return false };
    let hex = |x: &str| x.strip_prefix("0x").is_some_and(|h| h.len() >= 6 && h.bytes().all(|c| c.is_ascii_hexdigit()));
    match n.strip_prefix('#') {
        Some(k) => !k.is_empty() && k.bytes().all(|c| c.is_ascii_digit()) && hex(a),
        None => n.bytes().all(|c| c.is_ascii_digit()) && hex(b),
    }
}

fn log(text: &str, run_lines: usize) -> Vec<RawChunk> {
    // each entry is a line plus its continuation frames; an error entry is
    // its own group, its line the lead and its frames a second chunk (so
    // the line can go without them); runs of ordinary entries are grouped
    // (up to `run_lines` lines)
    let mut out: Vec<RawChunk> = Vec::new();
    let mut group = 0;
    let mut ordinary = 0;
    let entry = |s: usize, e: usize, group: usize, lead: bool| RawChunk {
        start: s,
        end: e,
        heading: None,
        group,
        lead,
        defines: vec![],
        chunker: "log",
        rides: false,
    };
    for (s, e) in lines(text) {
        let line = &text[s..e];
        if line.trim().is_empty() {
            continue;
        }
        if is_frame(line) {
            match out.last_mut() {
                // an error line's first frame opens its frames' chunk
                Some(last) if last.lead && ordinary == 0 => {
                    let g = last.group;
                    out.push(entry(s, e, g, false));
                }
                Some(last) => last.end = e,
                None => {}
            }
            if !out.is_empty() {
                continue;
            }
        }
        let error = is_error_line(line);
        match out.last_mut() {
            Some(last) if !error && ordinary > 0 && ordinary < run_lines => {
                last.end = e;
                ordinary += 1;
            }
            _ => {
                group += 1;
                out.push(entry(s, e, group, true));
                ordinary = usize::from(!error);
            }
        }
    }
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

    fn field(kind: FieldKind, content: &str) -> Field {
        Field { name: "f".into(), kind, content: content.into(), confidential: false }
    }

    fn texts(f: &Field) -> Vec<String> {
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
        // (a code chunk may be as long as max_code_chunk_bytes, so a function stays whole)
        let code = (0..400).map(|i| format!("    let x{i} = {i};\n")).collect::<String>();
        let f = field(FieldKind::Code, &format!("fn big() {{\n{code}}}\n"));
        assert_eq!(chunk_field(&f, ChunkConfig::default()).len(), 1);
        let small = ChunkConfig { max_code_chunk_bytes: 2048, ..ChunkConfig::default() };
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
    fn severity_reads_words_not_substrings() {
        for line in [
            "2024-01-01 ERROR db down",
            "error: could not compile",
            "Crashed Thread:  5",
            "Thread 5 Crashed:",
            "Exception Type:  EXC_CRASH (SIGABRT)",
            "Fatal signal 11 (SIGSEGV), code 1",
            "Segmentation fault (core dumped)",
            "SQLITE_ERROR: database is locked",
        ] {
            assert_eq!(severity(line), 2, "{line}");
        }
        // a raised exception's line (the end of a traceback) ranks above
        for line in [
            "ValueError: bad input",
            "java.io.IOException: closed",
            "java.lang.NullPointerException",
            "2015-10-29 10:51:12.480 3405 TRACE neutron.service AssertionError: Calling waitall() from within",
            "Caused by: org.postgresql.util.PSQLException: FATAL: the database system is in recovery mode",
        ] {
            assert_eq!(severity(line), 3, "{line}");
        }
        // a name mentioned, a bare `Error:`, an upper-case constant: an error, not an exception line
        for line in [
            "INFO handled NotFoundException for /x",
            "Error: Cannot find module 'x'",
            "SQLITE_ERROR: database is locked",
            "ERROR neutron.service [-] Unrecoverable error: please check log for details.",
        ] {
            assert_eq!(severity(line), 2, "{line}");
        }
        // a DNS answer's rcode `NOERROR` is no error; `FORWARNED` no warning
        let dns = "1379288690.38\tCYZ\t192.168.33.10\t53\tudp\tj.maxmind.com\t1\tA\t0\tNOERROR\tF";
        assert_eq!(severity(dns), 0);
        assert_eq!(severity("WARNING: disk 91% full"), 1);
        assert_eq!(severity("FORWARNED is forearmed"), 0);
    }

    #[test]
    fn severity_reads_syslog_levels_in_their_standard_forms() {
        let crit = "kern  :crit  : [18706.135478] mce: CPU6: Package temperature above threshold, cpu clock throttled";
        assert_eq!(severity(crit), 2);
        assert_eq!(severity("daemon:err   : [  12.5] foo.service: start request repeated too quickly"), 2);
        assert_eq!(severity("kern  :warn  : [    0.1] ACPI: _OSC evaluation failed"), 2, "a word still counts");
        assert_eq!(severity("kern  :warn  : [    0.1] x86/cpu: SGX disabled by BIOS."), 1);
        assert_eq!(severity("<3>[ 5.1] usb 1-1: device descriptor read/64, error -71"), 2);
        assert_eq!(severity("<11>kernel: disk gone"), 2, "facility 1, level 3");
        assert_eq!(severity("<4>[ 0.2] clocksource: unstable"), 1);
        assert_eq!(severity("<6>[ 0.3] usb 1-1: new device"), 0);
        // not a facility, or not a level: an ordinary line
        assert_eq!(severity("kern  :info  : [    0.0] Linux version 5.0.9"), 0);
        assert_eq!(severity("note: crit: the critics liked it"), 0);
        assert_eq!(severity("<html>crit</html>"), 0);
    }

    #[test]
    fn log_keeps_stack_frames_in_their_error_group() {
        let f = field(
            FieldKind::Log,
            "INFO start\nINFO ready\nERROR boom in charge\n    at payments::charge (src/pay.rs:10)\n    at main\nINFO retry",
        );
        let t = texts(&f);
        assert_eq!(
            t,
            [
                "INFO start\nINFO ready",
                "ERROR boom in charge",
                "at payments::charge (src/pay.rs:10)\n    at main",
                "INFO retry"
            ]
        );
        let c = chunk_field(&f, ChunkConfig::default());
        // the error line leads its group, so its frames bring it along
        assert!(c[1].lead && !c[2].lead);
        assert_eq!(c[1].group, c[2].group);
        assert_ne!(c[0].group, c[1].group);
        assert_ne!(c[3].group, c[1].group);
    }

    #[test]
    fn numbered_frames_of_a_crash_report_stay_with_their_thread() {
        let report = "Exception Type:  SIGSEGV\nCrashed Thread:  5\n\nThread 4:\n\
                      0   libsystem_kernel.dylib        0x00007fff61bca1b2 0x7fff61bc6000 + 16818\n\
                      1   YetAnotherMac                 0x0000000109482f6f 0x10864e000 + 14897007\n\n\
                      Thread 5 Crashed:\n\
                      0   YetAnotherMac                 0x00000001090a0132 0x10864e000 + 10821938\n\
                      #1  0x00007f3a2b in handler () at src/h.c:12\n\
                      2 apples 0x12 is no frame";
        let f = field(FieldKind::Log, report);
        let c = chunk_field(&f, ChunkConfig::default());
        let t: Vec<&str> = c.iter().map(|c| &report[c.start..c.end]).collect();
        let thread4 = t.iter().position(|x| x.starts_with("Thread 4:")).unwrap();
        assert!(t[thread4].ends_with("+ 14897007"), "{t:?}");
        let crashed = t.iter().position(|x| *x == "Thread 5 Crashed:").unwrap();
        // the crashed thread's frames: its error line's second chunk, in its group
        assert!(t[crashed + 1].starts_with("0   YetAnotherMac") && t[crashed + 1].ends_with("src/h.c:12"), "{t:?}");
        assert_eq!(c[crashed].group, c[crashed + 1].group);
        assert_eq!(t[crashed + 2], "2 apples 0x12 is no frame");
    }

    #[test]
    fn log_runs_of_ordinary_entries_are_bounded_by_log_run_lines() {
        let log = "INFO a\nINFO b\nINFO c\nINFO d\nINFO e\nERROR f failed\n    at g\nINFO h\nINFO i";
        let f = field(FieldKind::Log, log);
        let texts_at = |run: usize| -> Vec<String> {
            let cfg = ChunkConfig { log_run_lines: run, ..ChunkConfig::default() };
            chunk_field(&f, cfg).iter().map(|c| log[c.start..c.end].to_string()).collect()
        };
        assert_eq!(
            texts_at(4),
            ["INFO a\nINFO b\nINFO c\nINFO d", "INFO e", "ERROR f failed", "at g", "INFO h\nINFO i"]
        );
        assert_eq!(
            texts_at(2),
            ["INFO a\nINFO b", "INFO c\nINFO d", "INFO e", "ERROR f failed", "at g", "INFO h\nINFO i"]
        );
        // one entry per chunk, each its own group; an error keeps its frames apart
        let one = chunk_field(&f, ChunkConfig { log_run_lines: 1, ..ChunkConfig::default() });
        let t: Vec<&str> = one.iter().map(|c| &log[c.start..c.end]).collect();
        assert_eq!(t, ["INFO a", "INFO b", "INFO c", "INFO d", "INFO e", "ERROR f failed", "at g", "INFO h", "INFO i"]);
        assert!(one.iter().filter(|c| c.start != log.find("at g").unwrap()).all(|c| c.lead));
        assert_eq!(one[5].group, one[6].group);
        assert_eq!(ChunkConfig::default().log_run_lines, 4);
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
