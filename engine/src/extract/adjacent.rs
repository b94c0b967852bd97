//! Which chunks read on from each other in the field's text: what packing
//! counts as one piece and rendering joins under one header (its own room,
//! so packing and rendering both use it without importing each other).

use super::prepare::PreparedContext;
use crate::chunk::json;

/// Whether chunk `b` reads on from chunk `a` with only whitespace between
/// (two JSON subtrees: and the two parse as one).
pub(super) fn reads_on(ctx: &PreparedContext, a: usize, b: usize) -> bool {
    let (ca, cb) = (&ctx.chunks[a], &ctx.chunks[b]);
    let next = cb.prev == Some(a) && cb.gap.is_some();
    match (ca.wrap, cb.wrap) {
        (None, None) => next,
        (Some(_), Some(_)) => next && json_wrap(ctx, &[a, b]).is_some(),
        _ => false,
    }
}

/// The text of a run of adjacent JSON chunks (as the field has it) and how
/// it parses as one subtree.
pub(super) fn json_wrap(ctx: &PreparedContext, run: &[usize]) -> Option<(String, json::Wrap)> {
    let first = &ctx.chunks[run[0]];
    if run.len() == 1 {
        return first.wrap.map(|w| (first.text.clone(), w));
    }
    let mut text = first.text.clone();
    for &i in &run[1..] {
        let c = &ctx.chunks[i];
        text.push_str(c.gap.as_deref().unwrap_or(""));
        text.push_str(&c.text);
    }
    let w = json::wrapping(&text)?;
    // a whole container under its key is rendered as the value under its path
    let w = match (w.open, json::keyed_value(&text[w.core.0..w.core.1])) {
        ("{", Some((a, b))) => json::Wrap { open: "", close: "", core: (w.core.0 + a, w.core.0 + b) },
        _ => w,
    };
    Some((text, w))
}
