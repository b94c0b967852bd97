//! Where each chunk sits in its field: its lines, its indentation, the
//! chunk before it in reading order and the whitespace between them.
//! Computed once when a context is prepared, read when a selection is
//! rendered, so it sits below both.

use crate::chunk::RawChunk;

/// Where a chunk sits in its field, for rendering ([`layout`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Place {
    pub(super) lines: (usize, usize),
    pub(super) indent: String,
    /// The chunk before it in reading order (an index into the field's chunks).
    pub(super) prev: Option<usize>,
    /// The chunk after it in reading order (likewise).
    pub(super) next: Option<usize>,
    pub(super) gap: Option<String>,
}

/// Each chunk's place in `text`: its lines, its indentation, the chunk
/// before it in reading order and the whitespace between them.
pub(super) fn layout(text: &str, chunks: &[RawChunk]) -> Vec<Place> {
    let starts: Vec<usize> =
        std::iter::once(0).chain(text.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i + 1)).collect();
    let line_of = |pos: usize| starts.partition_point(|&s| s <= pos);
    let mut out: Vec<Place> = chunks
        .iter()
        .map(|c| {
            let first = line_of(c.start);
            let last = line_of(c.end.saturating_sub(1).max(c.start));
            let before = &text[starts[first - 1]..c.start];
            let indent =
                if before.chars().all(|ch| ch == ' ' || ch == '\t') { before.to_string() } else { String::new() };
            Place { lines: (first, last), indent, prev: None, next: None, gap: None }
        })
        .collect();
    let mut order: Vec<usize> = (0..chunks.len()).collect();
    order.sort_by_key(|&i| (chunks[i].start, chunks[i].end));
    for w in order.windows(2) {
        let (a, b) = (&chunks[w[0]], &chunks[w[1]]);
        out[w[1]].prev = Some(w[0]);
        out[w[0]].next = Some(w[1]);
        if a.end <= b.start && text[a.end..b.start].trim().is_empty() {
            out[w[1]].gap = Some(text[a.end..b.start].to_string());
        }
    }
    out
}
