//! The lines around a code piece, as a diff hunk shows them: up to
//! `code_context_lines` lines that are not blank before the piece and after
//! it, taken from the chunks of its field that are not sent, so the
//! receiver sees where the piece sits and where a change would go (the
//! import above a class, the constant after the one sent). Rendering adds
//! them ([`super::render`]); packing counts them with each code chunk's
//! header, as the lines a piece the chunk opens would carry. Under a
//! budget of [`MIN_BUDGET`] tokens there are none: every token goes to chunks.

use std::collections::HashSet;

use super::prepare::PreparedContext;

/// The smallest budget whose code pieces carry the lines around them: below
/// it they would take the room of a whole chunk (at 150 tokens, the fixture
/// showcase's error entry).
pub(super) const MIN_BUDGET: usize = 512;

impl super::Scd {
    /// The lines around each code piece under `budget`:
    /// `code_context_lines` (at most [`super::MAX_CODE_CONTEXT_LINES`]), or
    /// none under [`MIN_BUDGET`].
    pub(super) fn lines_around(&self, budget: usize) -> usize {
        if budget < MIN_BUDGET {
            0
        } else {
            self.cfg.scoring.code_context_lines.min(super::MAX_CODE_CONTEXT_LINES)
        }
    }
}

/// The chunk after `i` that a hunk may show: code, with only whitespace
/// between, and not in `taken`.
fn free_next(ctx: &PreparedContext, i: usize, taken: &HashSet<usize>) -> Option<usize> {
    let n = ctx.chunks[i].next?;
    let c = &ctx.chunks[n];
    (c.gap.is_some() && c.is_code() && ctx.chunks[i].is_code() && !taken.contains(&n)).then_some(n)
}

/// The chunk before `i` that a hunk may show (as [`free_next`]).
fn free_prev(ctx: &PreparedContext, i: usize, taken: &HashSet<usize>) -> Option<usize> {
    let c = &ctx.chunks[i];
    let p = c.prev?;
    (c.gap.is_some() && c.is_code() && ctx.chunks[p].is_code() && !taken.contains(&p)).then_some(p)
}

/// The longest line shown around a piece, in bytes: a longer one (minified
/// code, a long literal) ends the lines there, so it never makes a chunk
/// dear to open.
const MAX_LINE_BYTES: usize = 240;

/// How many lines of `lines`, counted from its end (`from_end`) or its
/// start, hold `n` that are not blank (all of them when fewer do).
fn take(lines: &[&str], n: usize, from_end: bool) -> usize {
    let mut left = n;
    let mut k = 0;
    while k < lines.len() && left > 0 {
        let line = if from_end { lines[lines.len() - 1 - k] } else { lines[k] };
        if line.len() > MAX_LINE_BYTES {
            break;
        }
        left -= usize::from(!line.trim().is_empty());
        k += 1;
    }
    k
}

/// Lines shown around a piece: their text as it goes beside the piece, the
/// line they reach (the first before it, the last after it) and the byte
/// spans of the field they come from.
pub(super) struct Lines {
    /// The text as it goes beside the piece (with the whitespace between).
    pub(super) text: String,
    /// The first line before the piece, or the last after it (1-based).
    pub(super) line: usize,
    /// The byte spans of the field they come from.
    pub(super) spans: Vec<(usize, usize)>,
}

/// The byte length of the first `k` of `lines` joined by line breaks.
fn joined_len(lines: &[&str], k: usize) -> usize {
    lines[..k].iter().map(|l| l.len()).sum::<usize>() + k.saturating_sub(1)
}

/// The lines that go before chunk `i` when it opens a piece: up to `n` that
/// are not blank from the chunks before it that `taken` does not hold, their
/// text ending with the whitespace before `i` (its indentation included).
pub(super) fn before(ctx: &PreparedContext, i: usize, n: usize, taken: &HashSet<usize>) -> Option<Lines> {
    if n == 0 || !ctx.chunks[i].is_code() {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    let mut spans = Vec::new();
    let (mut at, mut left, mut line) = (i, n, 0);
    // the indentation of the first line taken, when it opens its chunk (the
    // gap before a chunk already ends with that chunk's indentation)
    let mut indent = "";
    while left > 0 {
        let Some(p) = free_prev(ctx, at, taken) else { break };
        let pc = &ctx.chunks[p];
        let lines: Vec<&str> = pc.text.split('\n').collect();
        let k = take(&lines, left, true);
        if k == 0 {
            break;
        }
        let from = lines.len() - k;
        left -= lines[from..].iter().filter(|l| !l.trim().is_empty()).count();
        parts.push(ctx.chunks[at].gap.as_deref().unwrap_or_default());
        let tail = &pc.text[pc.text.len() - joined_len(&lines[from..], k)..];
        parts.push(tail);
        spans.push((pc.span.1 - tail.len(), pc.span.1));
        line = pc.lines.0 + from;
        indent = if from == 0 { &pc.indent } else { "" };
        if from > 0 {
            break;
        }
        at = p;
    }
    parts.push(indent);
    (!spans.is_empty()).then(|| Lines { text: parts.into_iter().rev().collect(), line, spans })
}

/// The lines that go after chunk `i` when it ends a piece: the whitespace
/// after it, then up to `n` lines that are not blank from the chunks after
/// it that `taken` does not hold.
pub(super) fn after(ctx: &PreparedContext, i: usize, n: usize, taken: &HashSet<usize>) -> Option<Lines> {
    if n == 0 || !ctx.chunks[i].is_code() {
        return None;
    }
    let mut text = String::new();
    let mut spans = Vec::new();
    let (mut at, mut left, mut line) = (i, n, 0);
    while left > 0 {
        let Some(x) = free_next(ctx, at, taken) else { break };
        let c = &ctx.chunks[x];
        let lines: Vec<&str> = c.text.split('\n').collect();
        let k = take(&lines, left, false);
        if k == 0 {
            break;
        }
        left -= lines[..k].iter().filter(|l| !l.trim().is_empty()).count();
        text.push_str(c.gap.as_deref().unwrap_or_default());
        let head = &c.text[..joined_len(&lines, k)];
        text.push_str(head);
        spans.push((c.span.0, c.span.0 + head.len()));
        line = c.lines.0 + k - 1;
        if k < lines.len() {
            break;
        }
        at = x;
    }
    (!text.is_empty()).then_some(Lines { text, line, spans })
}

/// What a piece opened by chunk `i` alone would carry around it (its cost
/// in packing, with the header's).
pub(super) fn around(ctx: &PreparedContext, i: usize, n: usize) -> String {
    let none = HashSet::new();
    let b = before(ctx, i, n, &none).map(|l| l.text).unwrap_or_default();
    let a = after(ctx, i, n, &none).map(|l| l.text).unwrap_or_default();
    b + &a
}

/// The chunks between the end of one piece (`a`) and the start of the next
/// (`b`) when their hunks would meet: every chunk between is code, free and
/// read on with only whitespace, and all of them hold at most `2 n` lines
/// that are not blank. The two pieces are then one, with these between.
pub(super) fn bridge(
    ctx: &PreparedContext,
    a: usize,
    b: usize,
    n: usize,
    taken: &HashSet<usize>,
) -> Option<Vec<usize>> {
    if n == 0 || !ctx.chunks[a].is_code() {
        return None;
    }
    let mut run = Vec::new();
    let mut lines = 0;
    let mut at = a;
    loop {
        let x = ctx.chunks[at].next?;
        let c = &ctx.chunks[x];
        if x == b {
            return (c.gap.is_some() && c.is_code() && ctx.chunks[at].is_code()).then_some(run);
        }
        at = free_next(ctx, at, taken)?;
        lines += c.text.lines().filter(|l| !l.trim().is_empty()).count();
        if lines > 2 * n || c.text.lines().any(|l| l.len() > MAX_LINE_BYTES) {
            return None;
        }
        run.push(x);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::super::render::render_margins;
    use super::super::tests::{compress_within, hash_scd, prose};
    use super::super::ScdConfig;
    use super::*;
    use crate::cancel::Cancel;
    use crate::context::{Context, Field, FieldKind};

    /// Lines: 4 `LIMIT`, 7–8 `first`, 11–12 `second`, 15–16 `third`.
    const SRC: &str = "import os\nimport re\n\nLIMIT = 3\n\n\ndef first():\n    return 1\n\n\n\
                       def second():\n    return 2\n\n\ndef third():\n    return 3\n";

    /// [`SRC`] as a code field, prepared on the hash encoder.
    fn prepared() -> Arc<PreparedContext> {
        field_prepared(FieldKind::Code, "m.py", SRC)
    }

    /// A field of `kind` named `name` holding `src`, prepared on the hash encoder.
    fn field_prepared(kind: FieldKind, name: &str, src: &str) -> Arc<PreparedContext> {
        let field = Field { kind, ..prose(name, src) };
        hash_scd(ScdConfig::default()).prepare(&[&field], &Cancel::new()).unwrap()
    }

    /// The chunk whose text starts with `start`.
    fn at(ctx: &PreparedContext, start: &str) -> usize {
        ctx.chunks.iter().position(|c| c.text.starts_with(start)).unwrap()
    }

    /// The text of each span of [`SRC`].
    fn texts(spans: &[(usize, (usize, usize))]) -> Vec<&'static str> {
        spans.iter().map(|&(_, (a, b))| &SRC[a..b]).collect()
    }

    /// A piece carries the line before it and the line after it, as a diff
    /// hunk does, its header naming them; their spans are those lines.
    #[test]
    fn a_code_piece_carries_the_line_before_and_after_it() {
        let ctx = prepared();
        let second = at(&ctx, "def second");
        let none = HashSet::new();
        let (bare, spans) = render_margins(&ctx, &[second], &none, 0);
        assert_eq!(bare, "[m.py:11-12]\ndef second():\n    return 2");
        assert!(spans.is_empty());
        let (text, spans) = render_margins(&ctx, &[second], &none, 1);
        assert_eq!(text, "[m.py:8-15]\n    return 1\n\n\ndef second():\n    return 2\n\n\ndef third():");
        assert_eq!(texts(&spans), ["    return 1", "def third():"]);
        // two lines each side reach into the chunk before (its signature too)
        let (text, spans) = render_margins(&ctx, &[second], &none, 2);
        assert_eq!(
            text,
            "[m.py:7-16]\ndef first():\n    return 1\n\n\ndef second():\n    return 2\n\n\ndef third():\n    return 3"
        );
        assert_eq!(texts(&spans), ["def first():\n    return 1", "def third():\n    return 3"]);
    }

    /// Lines taken across several one-line chunks keep each line's own
    /// indentation, once.
    #[test]
    fn lines_across_chunks_keep_their_indentation() {
        let src = "class C:\n    y = 0\n\n    x = 1\n\n    def f(self):\n        return 1\n";
        let ctx = field_prepared(FieldKind::Code, "c.py", src);
        let f = at(&ctx, "def f");
        let (text, _) = render_margins(&ctx, &[f], &HashSet::new(), 2);
        assert_eq!(text, "[c.py:2-7]\n    y = 0\n\n    x = 1\n\n    def f(self):\n        return 1");
    }

    /// What the receiver holds is not repeated around a new piece.
    #[test]
    fn no_line_the_receiver_holds_is_sent_again_around_a_piece() {
        let ctx = prepared();
        let (first, second) = (at(&ctx, "def first"), at(&ctx, "def second"));
        let (text, spans) = render_margins(&ctx, &[second], &HashSet::from([first]), 1);
        assert_eq!(text, "[m.py:11-15]\ndef second():\n    return 2\n\n\ndef third():");
        assert_eq!(texts(&spans), ["def third():"]);
    }

    /// Two pieces whose lines around them would meet are one piece, the
    /// chunk between them sent whole; a longer stretch keeps them apart.
    #[test]
    fn pieces_whose_lines_would_meet_are_one() {
        let ctx = prepared();
        let (first, third) = (at(&ctx, "def first"), at(&ctx, "def third"));
        let none = HashSet::new();
        let (text, spans) = render_margins(&ctx, &[first, third], &none, 1);
        assert_eq!(
            text,
            "[m.py:4-16]\nLIMIT = 3\n\n\ndef first():\n    return 1\n\n\ndef second():\n    return 2\n\n\n\
             def third():\n    return 3"
        );
        assert_eq!(texts(&spans), ["LIMIT = 3", "def second():\n    return 2"]);
        let limit = at(&ctx, "LIMIT");
        let (text, _) = render_margins(&ctx, &[limit, third], &none, 1);
        assert_eq!(text.matches("[m.py:").count(), 2, "{text}");
    }

    /// A line longer than [`MAX_LINE_BYTES`] (minified code) is not shown
    /// around a piece, nor bridges two.
    #[test]
    fn a_long_line_is_not_shown_around_a_piece() {
        let long = format!("TABLE = [{}]", "1, ".repeat(100));
        let src = format!("def f():\n    return 1\n\n\n{long}\n\n\ndef g():\n    return 2\n");
        let ctx = field_prepared(FieldKind::Code, "t.py", &src);
        let (f, g) = (at(&ctx, "def f"), at(&ctx, "def g"));
        let (text, spans) = render_margins(&ctx, &[f], &HashSet::new(), 1);
        assert_eq!(text, "[t.py:1-2]\ndef f():\n    return 1");
        assert!(spans.is_empty());
        let (text, _) = render_margins(&ctx, &[f, g], &HashSet::new(), 1);
        assert_eq!(text, "[t.py:1-2]\ndef f():\n    return 1\n[t.py:8-9]\ndef g():\n    return 2");
    }

    /// Prose, logs and JSON get none: only code pieces do.
    #[test]
    fn only_code_pieces_carry_lines_around_them() {
        let log = "INFO a\nINFO b\nERROR c failed\nINFO d\n";
        let ctx = field_prepared(FieldKind::Log, "app.log", log);
        let error = at(&ctx, "ERROR");
        let (text, spans) = render_margins(&ctx, &[error], &HashSet::new(), 3);
        assert_eq!(text, "[app.log:3]\nERROR c failed");
        assert!(spans.is_empty());
    }

    /// In a compression the lines around pieces are in `margins` and counted
    /// in the budget; under [`MIN_BUDGET`] there are none.
    #[test]
    fn a_compression_lists_its_margins_within_the_budget() {
        let mut code = String::new();
        for i in 0..80 {
            code.push_str(&format!("def step_{i}(queue):\n    return queue.pop({i})  # drain window {i}\n\n\n"));
        }
        code.push_str("def retry_backoff(attempt):\n    return min(60, 2 ** attempt)  # retry delivery backoff\n");
        let context = || Context { fields: vec![Field { kind: FieldKind::Code, ..prose("q.py", &code) }] };
        let scd = hash_scd(ScdConfig::default());
        let task = "How is a delivery retried with backoff?";
        let cl100k = crate::budget::builtin("cl100k").unwrap();
        let out = compress_within(&scd, task, context(), MIN_BUDGET);
        assert_eq!(cl100k.count(&out.text).unwrap(), out.totals.sent_tokens, "the text as counted");
        assert!(!out.margins.is_empty(), "{}", out.text);
        for m in &out.margins {
            assert_eq!(m.field, "q.py");
            let lines = &code[m.span.0..m.span.1];
            assert!(out.text.contains(lines), "{lines:?} in\n{}", out.text);
            let overlaps = |c: &crate::extract::SelectedChunk| c.span.0 < m.span.1 && m.span.0 < c.span.1;
            assert!(!out.chunks.iter().any(overlaps), "a margin is no part of a chunk sent");
        }
        let small = compress_within(&scd, task, context(), MIN_BUDGET - 1);
        assert!(!small.chunks.is_empty() && small.margins.is_empty(), "{}", small.text);
    }

    /// A required code field is sent whole in the least budget that holds
    /// it without the lines around pieces: it is not refused for the lines a
    /// piece of it alone would carry.
    #[test]
    fn the_lines_around_pieces_never_cost_a_required_field_its_room() {
        use crate::context::{ContextRequirement, Task};
        use crate::extract::CompressRequest;
        let mut code = String::new();
        for i in 0..60 {
            code.push_str(&format!("def step_{i}(queue):\n    return queue.pop({i})\n\n\n"));
        }
        let field = Field { kind: FieldKind::Code, ..prose("q.py", code.trim_end()) };
        let req = |budget: usize| {
            let mut requirement = ContextRequirement::with_budget(budget);
            requirement.required_fields = vec!["q.py".into()];
            let context = Context { fields: vec![field.clone()] };
            CompressRequest { task: Task::new("How is the queue drained?"), context, requirement, session: None }
        };
        let opts = super::super::tests::opts("cl100k", false);
        let mut cfg = ScdConfig::default();
        cfg.scoring.code_context_lines = 0;
        let bare = hash_scd(cfg);
        let least = (MIN_BUDGET..4 * MIN_BUDGET)
            .find(|&b| bare.compress_opts(&req(b), &opts, &Cancel::new()).is_ok())
            .expect("the field fits some budget");
        let out = hash_scd(ScdConfig::default()).compress_opts(&req(least), &opts, &Cancel::new()).unwrap();
        assert!(out.text.ends_with("return queue.pop(59)") && out.margins.is_empty(), "{}", out.text);
    }
}
