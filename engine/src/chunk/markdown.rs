//! Markdown: a heading leads its section (it is sent only with a chunk of
//! the section, never alone), a fenced code block is one chunk from fence
//! to fence, a list item and its continuation lines are one chunk, a
//! table up to `max_bytes` is one chunk with its header, a longer one is a
//! group of its own whose header (the first row and the separator) rides
//! with each row, one row a chunk, and paragraphs go by sentences as prose
//! does. Prose that is clearly
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

/// A table's header separator row (`|---|:---:|`).
fn is_separator(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.contains('-') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'))
}

/// Chunks `text` as markdown; `chunker` names it (`markdown` or
/// `markdown:detected`); a table over `max_bytes` is cut into rows.
pub fn chunk(text: &str, chunker: &'static str, max_bytes: usize) -> Vec<RawChunk> {
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
        if is_item(t) {
            let j = item_end(text, &lines, i);
            out.push(piece(s, lines[j - 1].1, group, &heading, !led, false));
            led = true;
            i = j;
            continue;
        }
        if is_row(t) {
            let mut j = i + 1;
            while j < lines.len() && is_row(text[lines[j].0..lines[j].1].trim()) {
                j += 1;
            }
            let head = if j > i + 1 && is_separator(&text[lines[i + 1].0..lines[i + 1].1]) { i + 2 } else { i + 1 };
            if lines[j - 1].1 - s <= max_bytes || head >= j {
                out.push(piece(s, lines[j - 1].1, group, &heading, !led, false));
                led = true;
            } else {
                // a long table: a group of its own, its header riding with
                // each row (the section's own lead is still to come)
                last_group += 1;
                out.push(piece(s, lines[head - 1].1, last_group, &heading, true, true));
                for &(a, b) in &lines[head..j] {
                    out.push(piece(a, b, last_group, &heading, false, false));
                }
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

#[cfg(test)]
mod tests {
    use super::super::{chunk_field, ChunkConfig};
    use crate::context::{Field, FieldKind};

    const DOC: &str = "# Install\n\nRun the set-up first. It is idempotent.\n\n```sh\nmake setup\n\nmake test\n```\n\n## Options\n\n- `--budget`: the receiver's budget\n  in tokens, a hard limit\n- `--explain`: why each chunk\n\n| flag | default |\n| --- | --- |\n| --budget | none |\n";

    fn chunks(kind: FieldKind, text: &str) -> Vec<(String, usize, bool, bool, &'static str)> {
        let f = Field { name: "README.md".into(), kind, content: text.into(), confidential: false };
        chunk_field(&f, ChunkConfig::default())
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
}
