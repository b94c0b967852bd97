//! Markdown: a heading leads its section (it is sent only with a chunk of
//! the section, never alone), a fenced code block is one chunk from fence
//! to fence, a list item and its continuation lines are one chunk (one
//! over `item_bytes`, when that is set, is a group of its own whose lead,
//! the bold phrase it opens with or else its first sentence, rides with
//! each of its other sentences, one sentence a chunk), a table up to
//! `max_bytes` is one chunk with its header, a longer one is a group of
//! its own whose header (the first row and the separator) rides with each
//! row, one row a chunk, and paragraphs go by sentences as prose does.
//! Prose that is clearly
//! markdown ([`looks_like_markdown`]) is chunked this way too, under the
//! chunker name `markdown:detected`.

use super::{heading_text, lines, sentences, RawChunk};

/// Whether a prose field is clearly markdown: a closed code fence, or a
/// heading together with a list or a table.
pub fn looks_like_markdown(text: &str) -> bool {
    let (mut fences, mut headings, mut items, mut rows) = (0, 0, 0, 0);
    for line in text.lines().map(str::trim_start) {
        if is_fence(line).is_some() {
            fences += 1;
        } else if is_heading(line) {
            headings += 1;
        } else if is_item(line) {
            items += 1;
        } else if line.starts_with('|') && line.trim_end().ends_with('|') {
            rows += 1;
        }
    }
    fences >= 2 || (headings >= 1 && (items >= 2 || rows >= 2))
}

/// The fence of a fence line (```` ``` ```` or `~~~`, three or more).
fn is_fence(line: &str) -> Option<&str> {
    let t = line.trim_start();
    ["```", "~~~"].into_iter().find(|f| t.starts_with(f)).map(|f| {
        let n = t.bytes().take_while(|&b| b == f.as_bytes()[0]).count();
        &t[..n]
    })
}

/// Whether a chunk starts with a code fence (a fenced block, kept whole up
/// to the code bound).
pub(super) fn opens_fence(chunk: &str) -> bool {
    is_fence(chunk).is_some()
}

fn is_heading(line: &str) -> bool {
    let hashes = line.bytes().take_while(|&b| b == b'#').count();
    (1..=6).contains(&hashes) && line[hashes..].starts_with([' ', '\t'])
}

fn is_item(line: &str) -> bool {
    let t = line.trim_start();
    if t.starts_with("- ") || t.starts_with("* ") || t.starts_with("+ ") {
        return true;
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && (t[digits..].starts_with(". ") || t[digits..].starts_with(") "))
}

fn is_row(line: &str) -> bool {
    line.trim_start().starts_with('|')
}

/// The line after list item `i` and its continuation lines (indented, not a
/// new item, a heading, a fence or a table row).
fn item_end(text: &str, lines: &[(usize, usize)], i: usize) -> usize {
    let line = &text[lines[i].0..lines[i].1];
    let indent = line.len() - line.trim_start().len();
    let mut j = i + 1;
    while j < lines.len() {
        let next = &text[lines[j].0..lines[j].1];
        let nt = next.trim();
        let deeper = next.len() - next.trim_start().len() > indent;
        if nt.is_empty() || (is_item(nt) && !deeper) || is_heading(nt) || is_fence(nt).is_some() {
            break;
        }
        if !deeper && is_row(nt) {
            break;
        }
        j += 1;
    }
    j
}

/// The spans of a list item over `item_bytes` (0: never) cut by
/// sentences, its lead first: the bold phrase the item opens with when it
/// ends a sentence (`**Fair shares.**`), else its first sentence. `None`
/// (the item stays one chunk) for a short item, one with nested items or
/// rows, or one of a single sentence. `item` is the item's lines.
fn item_sentences(text: &str, item: &[(usize, usize)], item_bytes: usize) -> Option<Vec<(usize, usize)>> {
    let (s, end) = (item[0].0, item[item.len() - 1].1);
    if item_bytes == 0 || end - s <= item_bytes {
        return None;
    }
    if item[1..].iter().any(|&(a, b)| is_item(&text[a..b]) || is_row(&text[a..b])) {
        return None;
    }
    // the body starts after the marker (`- `, `12. `)
    let skip = |p: usize| p + (text[p..end].len() - text[p..end].trim_start().len());
    let marked = skip(s);
    let body = skip(marked + text[marked..end].find([' ', '\t'])?);
    let bold = text[body..end]
        .strip_prefix("**")
        .and_then(|b| b.find("**"))
        .filter(|&k| text[body + 2..body + 2 + k].trim_end().ends_with(['.', ':', '!', '?']))
        .map(|k| body + 2 + k + 2);
    let lead = match bold {
        Some(e) => e,
        None => sentences(&text[body..end], body).first()?.1,
    };
    let rest = sentences(&text[lead..end], lead);
    if rest.iter().all(|&(a, b)| text[a..b].trim().is_empty()) {
        return None;
    }
    Some(std::iter::once((s, lead)).chain(rest).collect())
}

/// The line after the table that starts at line `i`, and when the table
/// is over `max_bytes` (and has rows under its header), its header's span
/// then each row's.
fn table_rows(
    text: &str,
    lines: &[(usize, usize)],
    i: usize,
    max_bytes: usize,
) -> (usize, Option<Vec<(usize, usize)>>) {
    let mut j = i + 1;
    while j < lines.len() && is_row(text[lines[j].0..lines[j].1].trim()) {
        j += 1;
    }
    let head = if j > i + 1 && is_separator(&text[lines[i + 1].0..lines[i + 1].1]) { i + 2 } else { i + 1 };
    if lines[j - 1].1 - lines[i].0 <= max_bytes || head >= j {
        return (j, None);
    }
    (j, Some(std::iter::once((lines[i].0, lines[head - 1].1)).chain(lines[head..j].iter().copied()).collect()))
}

/// A table's header separator row (`|---|:---:|`).
fn is_separator(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.contains('-') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'))
}

/// Chunks `text` as markdown; `chunker` names it (`markdown` or
/// `markdown:detected`); a table over `max_bytes` is cut into rows, a list
/// item over `item_bytes` (0: never) into sentences.
pub fn chunk(text: &str, chunker: &'static str, max_bytes: usize, item_bytes: usize) -> Vec<RawChunk> {
    let lines = lines(text);
    let mut out: Vec<RawChunk> = Vec::new();
    // the section in force, and the last group id handed out (sections and long tables)
    let (mut group, mut last_group) = (0usize, 0usize);
    let mut heading: Option<String> = None;
    // whether the current section has a heading chunk leading it
    let mut led = false;
    let piece = |start, end, group, heading: &Option<String>, lead, rides| RawChunk {
        start,
        end,
        heading: heading.clone(),
        group,
        lead,
        defines: vec![],
        chunker,
        rides,
    };
    let mut i = 0;
    while i < lines.len() {
        let (s, e) = lines[i];
        let line = &text[s..e];
        let t = line.trim();
        if t.is_empty() {
            i += 1;
            continue;
        }
        if is_heading(t) {
            // a new section: the heading leads it and rides with its chunks
            last_group += 1;
            group = last_group;
            heading = Some(heading_text(t));
            out.push(piece(s, e, group, &heading, true, true));
            led = true;
            i += 1;
            continue;
        }
        if let Some(fence) = is_fence(t) {
            // to the closing fence (or the end): one chunk
            let mut j = i + 1;
            while j < lines.len() && !text[lines[j].0..lines[j].1].trim_start().starts_with(fence) {
                j += 1;
            }
            let end = lines[j.min(lines.len() - 1)].1;
            out.push(piece(s, end, group, &heading, !led, false));
            led = true;
            i = j + 1;
            continue;
        }
        if is_item(t) || is_row(t) {
            let (j, long) = if is_item(t) {
                let j = item_end(text, &lines, i);
                (j, item_sentences(text, &lines[i..j], item_bytes))
            } else {
                table_rows(text, &lines, i, max_bytes)
            };
            if let Some(spans) = long {
                // a long item or table: a group of its own, its lead (the
                // item's lead, the table's header) riding with each sentence
                // or row (the section's own lead is still to come)
                last_group += 1;
                for (k, &(a, b)) in spans.iter().enumerate() {
                    out.push(piece(a, b, last_group, &heading, k == 0, k == 0));
                }
            } else {
                out.push(piece(s, lines[j - 1].1, group, &heading, !led, false));
                led = true;
            }
            i = j;
            continue;
        }
        // a paragraph: to a blank line or a block of another kind, by sentences
        let mut j = i + 1;
        while j < lines.len() {
            let nt = text[lines[j].0..lines[j].1].trim();
            if nt.is_empty() || is_heading(nt) || is_fence(nt).is_some() || is_item(nt) || is_row(nt) {
                break;
            }
            j += 1;
        }
        let end = lines[j - 1].1;
        for (a, b) in sentences(&text[s..end], s) {
            out.push(piece(a, b, group, &heading, !led, false));
            led = true;
        }
        i = j;
    }
    out
}

/// Markdown as it reads: a link `[text](target)` or `[text][ref]` becomes
/// its text, an image `![alt](src)` its alt text, and an HTML anchor tag
/// (`<a id="rotate"></a>`) goes; everything else is kept. What a chunk is
/// embedded as, so a sentence is matched on its words rather than on a
/// URL's path segments.
pub fn link_text(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains("](") && !s.contains("][") && !s.contains("<a ") && !s.contains("</a>") {
        return std::borrow::Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if let Some((text, next)) = link_at(s, i) {
            out.push_str(link_text(text).as_ref());
            i = next;
        } else if let Some(next) = anchor_tag_at(s, i) {
            i = next;
        } else {
            let ch = s[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A link or image starting at byte `i`: its text and the byte after it.
fn link_at(s: &str, i: usize) -> Option<(&str, usize)> {
    let b = s.as_bytes();
    let open = match b[i] {
        b'[' => i,
        b'!' if b.get(i + 1) == Some(&b'[') => i + 1,
        _ => return None,
    };
    let close = open + 1 + s[open + 1..].find(']')?;
    let (closer, opener) = match b.get(close + 1)? {
        b'(' => (b')', b'('),
        b'[' => (b']', b'['),
        _ => return None,
    };
    // the target, with balanced parentheses (`(https://x/y_(z))`), on one line
    let mut depth = 0usize;
    for (k, &c) in b.iter().enumerate().skip(close + 1) {
        match c {
            b'\n' => return None,
            c if c == opener => depth += 1,
            c if c == closer => {
                depth -= 1;
                if depth == 0 {
                    return Some((&s[open + 1..close], k + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// An HTML anchor tag (`<a id="x">`, `<a href=…>`, `</a>`) at byte `i`: the byte after it.
fn anchor_tag_at(s: &str, i: usize) -> Option<usize> {
    let rest = &s[i..];
    if rest.starts_with("</a>") {
        return Some(i + 4);
    }
    if rest.starts_with("<a ") {
        let end = rest.find('>')?;
        return (!rest[..end].contains('\n')).then_some(i + end + 1);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::{chunk_field, ChunkConfig};
    use crate::context::{Field, FieldKind};

    const DOC: &str = "# Install\n\nRun the set-up first. It is idempotent.\n\n```sh\nmake setup\n\nmake test\n```\n\n## Options\n\n- `--budget`: the receiver's budget\n  in tokens, a hard limit\n- `--explain`: why each chunk\n\n| flag | default |\n| --- | --- |\n| --budget | none |\n";

    fn chunks(kind: FieldKind, text: &str) -> Vec<(String, usize, bool, bool, &'static str)> {
        chunks_with(kind, text, ChunkConfig::default())
    }

    fn chunks_with(kind: FieldKind, text: &str, cfg: ChunkConfig) -> Vec<(String, usize, bool, bool, &'static str)> {
        let f = Field { name: "README.md".into(), kind, content: text.into(), confidential: false };
        chunk_field(&f, cfg)
            .into_iter()
            .map(|c| (text[c.start..c.end].to_string(), c.group, c.lead, c.rides, c.chunker))
            .collect()
    }

    #[test]
    fn headings_lead_their_section_fences_lists_and_tables_stay_whole() {
        let c = chunks(FieldKind::Markdown, DOC);
        let texts: Vec<&str> = c.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            texts,
            [
                "# Install",
                "Run the set-up first.",
                "It is idempotent.",
                "```sh\nmake setup\n\nmake test\n```",
                "## Options",
                "- `--budget`: the receiver's budget\n  in tokens, a hard limit",
                "- `--explain`: why each chunk",
                "| flag | default |\n| --- | --- |\n| --budget | none |",
            ]
        );
        // a heading leads its section and rides: sent only with one of its chunks
        assert!(c[0].2 && c[0].3 && c[4].2 && c[4].3);
        assert!(c[1..4].iter().all(|x| x.1 == c[0].1 && !x.2 && !x.3));
        assert!(c[5..].iter().all(|x| x.1 == c[4].1 && x.1 != c[0].1));
        assert!(c.iter().all(|x| x.4 == "markdown"));
    }

    #[test]
    fn prose_that_is_clearly_markdown_is_chunked_as_markdown_and_says_so() {
        let c = chunks(FieldKind::Prose, DOC);
        assert!(c.iter().all(|x| x.4 == "markdown:detected"), "{c:?}");
        assert!(c.iter().any(|x| x.0 == "```sh\nmake setup\n\nmake test\n```"));
        // plain prose with a '#' line and no list, table or fence stays prose
        let plain = "# Notes\n\nThe pool is exhausted. Retries made it worse.\n";
        assert!(chunks(FieldKind::Prose, plain).iter().all(|x| x.4 == "prose"));
        assert!(!super::looks_like_markdown("- one item\nand text"));
    }

    #[test]
    fn an_unclosed_fence_runs_to_the_end_and_text_before_a_heading_has_a_lead() {
        let c = chunks(FieldKind::Markdown, "Intro line.\n\n```\ncode\nmore");
        assert_eq!(c.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(), ["Intro line.", "```\ncode\nmore"]);
        assert!(c[0].2 && !c[1].2 && c[0].1 == c[1].1);
    }

    #[test]
    fn a_long_table_is_cut_into_rows_its_header_riding_with_each_and_only_fences_stay_long() {
        let rows: String =
            (0..80).map(|i| format!("| `--flag-{i}` | `SCD_FLAG_{i}` | what flag {i} does |\n")).collect();
        let doc =
            format!("## Flags\n\nEvery flag:\n\n| flag | env | what |\n|---|---|---|\n{rows}\nAfter the table.\n");
        let c = chunks(FieldKind::Markdown, &doc);
        let table: Vec<_> = c.iter().filter(|x| x.0.starts_with('|')).collect();
        assert_eq!(table.len(), 81, "the header and one chunk a row: {c:?}");
        assert_eq!(table[0].0, "| flag | env | what |\n|---|---|---|");
        // the header leads the table's own group and rides: sent only with a row
        assert!(table[0].2 && table[0].3);
        assert!(table[1..].iter().all(|x| x.1 == table[0].1 && !x.2 && !x.3));
        assert_eq!(table[5].0, "| `--flag-4` | `SCD_FLAG_4` | what flag 4 does |");
        // the section goes on after the table, under its heading's group
        let (heading, after) = (&c[0], c.iter().find(|x| x.0 == "After the table.").unwrap());
        assert!(heading.2 && heading.3 && after.1 == heading.1 && table[0].1 != heading.1);
        // with no heading, the text after a long table still leads its section
        let c =
            chunks(FieldKind::Markdown, &format!("| flag | env | what |\n|---|---|---|\n{rows}\nAfter the table.\n"));
        let after = c.iter().find(|x| x.0 == "After the table.").unwrap();
        assert!(after.2 && after.1 != c[0].1, "{after:?}");
        // a long list item is cut to the chunk bound; a long fenced block stays whole
        let item = format!("- {}\n", "a long item line\n  ".repeat(300));
        let fence = format!("```sh\n{}```\n", "echo a long script line\n".repeat(300));
        let c = chunks(FieldKind::Markdown, &format!("# Doc\n\n{item}\n{fence}"));
        assert!(c.iter().filter(|x| x.0.starts_with("a long") || x.0.starts_with("- ")).count() > 1, "{c:?}");
        assert!(c.iter().all(|x| x.0.len() <= 2048 || x.0.starts_with("```")));
        assert_eq!(c.iter().filter(|x| x.0.starts_with("```")).count(), 1);
        assert!(c.iter().any(|x| x.0.len() > 2048 && x.0.starts_with("```sh")));
    }

    const ITEMS: &str = "## Under load\n\n- **One queue, fair across callers.** Embed requests\n  share one bounded \
                         queue. It takes one request of each caller in turn. A full\n  queue answers \
                         RESOURCE_EXHAUSTED with a hint.\n- **Short.** Stays whole. Two sentences.\n- Deadlines are \
                         honoured. A late request\n  is dropped unrun. A gone caller stops it.\n\nAfter the list.\n";

    #[test]
    fn a_long_list_item_is_cut_by_sentences_its_lead_riding_with_each_and_a_short_one_stays_whole() {
        let cfg = ChunkConfig { item_sentence_bytes: 60, ..ChunkConfig::default() };
        let c = chunks_with(FieldKind::Markdown, ITEMS, cfg);
        let texts: Vec<&str> = c.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            texts,
            [
                "## Under load",
                "- **One queue, fair across callers.**",
                "Embed requests\n  share one bounded queue.",
                "It takes one request of each caller in turn.",
                "A full\n  queue answers RESOURCE_EXHAUSTED with a hint.",
                "- **Short.** Stays whole. Two sentences.",
                "- Deadlines are honoured.",
                "A late request\n  is dropped unrun.",
                "A gone caller stops it.",
                "After the list.",
            ]
        );
        // each long item is a group of its own, its lead leading it and riding
        let (first, second) = (c[1].1, c[6].1);
        assert!(first != c[0].1 && second != c[0].1 && first != second);
        assert!(c[1].2 && c[1].3 && c[6].2 && c[6].3);
        assert!(c[2..5].iter().all(|x| x.1 == first && !x.2 && !x.3), "{c:?}");
        assert!(c[7..9].iter().all(|x| x.1 == second && !x.2 && !x.3), "{c:?}");
        // the short item and the text after stay in the section, led by its heading
        assert!(c[0].2 && c[0].3 && [5, 9].iter().all(|&k| c[k].1 == c[0].1 && !c[k].2 && !c[k].3));
        // 0 (the default) keeps every item whole, as does a bound over the item
        for off in [ChunkConfig::default(), ChunkConfig { item_sentence_bytes: 400, ..cfg }] {
            let c = chunks_with(FieldKind::Markdown, ITEMS, off);
            assert_eq!(c.iter().filter(|x| x.0.starts_with("- ")).count(), 3, "{c:?}");
            assert_eq!(c.len(), 5, "{c:?}");
        }
    }

    #[test]
    fn a_long_item_with_nested_items_or_of_one_sentence_stays_whole() {
        let cfg = ChunkConfig { item_sentence_bytes: 20, ..ChunkConfig::default() };
        let doc = "- An item with a child. It has two sentences.\n  - A nested item. Also long enough.\n\n- One \
                   long sentence with no end at all\n";
        let c = chunks_with(FieldKind::Markdown, doc, cfg);
        let texts: Vec<&str> = c.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            texts,
            [
                "- An item with a child. It has two sentences.\n  - A nested item. Also long enough.",
                "- One long sentence with no end at all"
            ]
        );
        // an item's bold phrase that is no sentence is no lead: the first sentence is
        let c = chunks_with(FieldKind::Markdown, "1. **Bad input** is refused. It names the field.\n", cfg);
        let texts: Vec<&str> = c.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(texts, ["1. **Bad input** is refused.", "It names the field."]);
        assert!(c[0].2 && c[0].3 && !c[1].2 && c[1].1 == c[0].1);
    }

    #[test]
    fn links_read_as_their_text_and_anchor_tags_go() {
        use super::link_text;
        let s = "Use [`pino.destination`](https://github.com/x/y#dest_(sync)) or ![logo](img.png) \
                 [here][ref].<a id=\"rotate\"></a> Keep [brackets] and (parens).";
        assert_eq!(link_text(s), "Use `pino.destination` or logo here. Keep [brackets] and (parens).");
        assert!(matches!(link_text("plain [text] only"), std::borrow::Cow::Borrowed(_)));
        // a target never runs past its line
        assert_eq!(link_text("[a](b\nc)"), "[a](b\nc)");
    }
}
