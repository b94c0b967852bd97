//! Render: the selection as the receiver pastes it. The selected chunks
//! that sit next to each other in one field form a piece; each piece opens
//! with one header line saying where it came from, `[name:first-last]`
//! (1-based lines of the field, the section or the JSON path after them
//! where there is one; a field of one line, such as a paragraph, is named
//! alone: `[name]`), and keeps the field's own text between its chunks,
//! so code keeps its indentation. A code piece also carries the lines just
//! before and after it ([`super::around`]), its header naming them. The
//! header is counted in the budget like any other text.

use std::collections::HashSet;

use super::adjacent::{json_wrap, reads_on};
use super::around;
use super::pack::{Costs, PackTrace};
use super::prepare::PreparedContext;
use super::{Counting, Scd};
use crate::chunk::json;
use crate::{Error, Result};

/// A field's index and a byte span of its content.
pub(super) type FieldSpan = (usize, (usize, usize));

/// The line that stands for lines left out inside a piece.
pub const GAP: &str = "…";

/// The most candidates [`Scd::refill`] counts in the whole text.
const REFILL_TRIES: usize = 8;

/// Longest section name a header repeats, in characters.
const MAX_HEADING_CHARS: usize = 60;

impl Scd {
    /// Per chunk, what the header of a piece it opens costs (with its line
    /// break), with up to `n` lines around a code piece ([`super::around`]).
    pub(super) fn header_costs(&self, ctx: &PreparedContext, counting: &Counting, n: usize) -> Result<Vec<usize>> {
        use rayon::prelude::*;
        (0..ctx.chunks.len())
            .into_par_iter()
            .map(|i| self.count_text(counting, &format!("{}\n{}", header(ctx, &[i]), around::around(ctx, i, n))))
            .collect()
    }

    /// Drops the weakest chunk not kept by `keep`, by what packing ranked
    /// by (`costs.score`; a function sent whole is worth its best chunk and
    /// goes whole), until `text(selected)` counts at most `budget`; its count.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fit(
        &self,
        counting: &Counting,
        selected: &mut Vec<usize>,
        costs: &Costs<'_>,
        keep: impl Fn(usize) -> bool,
        text: &dyn Fn(&[usize]) -> String,
        budget: usize,
        trace: &mut PackTrace,
    ) -> Result<usize> {
        // a near copy that waited is worth what it waited at
        let deferred = &trace.deferred;
        let (units, worth) =
            (costs.units, |i: usize| deferred.get(&i).copied().unwrap_or_else(|| costs.units.worth(i, costs.score)));
        loop {
            let n = self.count_text(counting, &text(selected))?;
            if n <= budget {
                return Ok(n);
            }
            let weakest = (0..selected.len())
                .filter(|&k| !keep(selected[k]))
                .min_by(|&a, &b| worth(selected[a]).total_cmp(&worth(selected[b])));
            match weakest {
                Some(k) => {
                    // a function sent whole goes whole
                    let i = selected[k];
                    let unit = units.of(i);
                    selected.retain(|&j| {
                        let gone = j == i || (unit.contains(&j) && !keep(j));
                        if gone {
                            trace.by_closure.remove(&j);
                            trace.dropped_by_fit.insert(j);
                        }
                        !gone
                    });
                }
                None => return Err(Error::BudgetTooSmall { needed: n, budget }),
            }
        }
    }

    /// After [`Self::fit`], which left `n` tokens of `budget` used: the
    /// best candidates of `order` not sent, not dropped by the fit, not a
    /// container's own line and not repeating a sent chunk, each taken when
    /// the whole text still fits (at most [`REFILL_TRIES`] counted), so the
    /// room a dropped chunk freed is not left empty. `costs.text` is each
    /// chunk's text alone, what it adds (less, when it joins a sent piece and
    /// closes a gap, by up to a header: that much more is tried); a function sent
    /// whole comes whole (its other chunks, like packing's, are not checked
    /// as repeats: a closing `}` repeats every other). The new count.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn refill(
        &self,
        counting: &Counting,
        ctx: &PreparedContext,
        selected: &mut Vec<usize>,
        order: &[usize],
        costs: &Costs<'_>,
        text: &dyn Fn(&[usize]) -> String,
        budget: usize,
        mut n: usize,
        trace: &mut PackTrace,
    ) -> Result<usize> {
        let mut tries = 0;
        // a near copy that waited in packing waits here too (`order` is by score)
        let ranked: std::borrow::Cow<'_, [usize]> = if trace.deferred.is_empty() {
            order.into()
        } else {
            let mut r = order.to_vec();
            r.sort_by(|&a, &b| trace.value(b, costs.score[b]).total_cmp(&trace.value(a, costs.score[a])));
            r.into()
        };
        for &i in ranked.iter() {
            if tries == REFILL_TRIES || n >= budget {
                break;
            }
            let mut add: Vec<usize> = costs.units.of(i).iter().copied().filter(|j| !selected.contains(j)).collect();
            if add.is_empty() {
                add.push(i);
            }
            // a chunk that joins a sent piece may also save the `…` line and
            // the header of the piece after it: counted, not guessed
            let joins = add.iter().any(|&j| {
                let c = &ctx.chunks[j];
                c.prev.is_some_and(|p| selected.contains(&p)) || c.next.is_some_and(|q| selected.contains(&q))
            });
            let saved = if joins { costs.header[i] } else { 0 };
            let skip = add.iter().map(|&j| costs.text[j]).sum::<usize>() > budget - n + saved
                || ctx.chunks[i].rides
                || add.iter().any(|j| trace.dropped_by_fit.contains(j))
                || trace.duplicate_of.contains_key(&i)
                || selected.contains(&i)
                || super::pack::repeats(ctx, selected, i);
            if skip {
                continue;
            }
            tries += 1;
            let before = selected.len();
            selected.extend(&add);
            match self.count_text(counting, &text(selected))? {
                m if m <= budget => {
                    n = m;
                    trace.by_closure.extend(add.into_iter().filter(|&j| j != i));
                }
                _ => selected.truncate(before),
            }
        }
        Ok(n)
    }
}

/// The text of `selected` (chunk indices, any order) as the receiver reads
/// it, each code piece with up to `around` lines that are not blank before
/// and after it ([`super::around`]; two pieces whose lines would meet are
/// one), none of them from a chunk in `held` (what the receiver holds).
pub(super) fn render(ctx: &PreparedContext, selected: &[usize], held: &HashSet<usize>, around: usize) -> String {
    render_margins(ctx, selected, held, around).0
}

/// [`render`], and the margins its text holds beyond the chunks of
/// `selected`: the lines around each code piece and the chunks between two
/// pieces joined by them, as (field, byte span).
pub(super) fn render_margins(
    ctx: &PreparedContext,
    selected: &[usize],
    held: &HashSet<usize>,
    around: usize,
) -> (String, Vec<FieldSpan>) {
    let mut taken: HashSet<usize> = held.clone();
    taken.extend(selected.iter().copied());
    let mut out = String::new();
    let mut spans = Vec::new();
    for piece in hunks(ctx, pieces(ctx, selected), around, &taken) {
        if !out.is_empty() {
            out.push('\n');
        }
        let field = ctx.chunks[piece[0]].field;
        spans.extend(piece.iter().filter(|i| !taken.contains(i)).map(|&i| (field, ctx.chunks[i].span)));
        for s in write_piece(ctx, &piece, &mut out, around, &taken) {
            spans.push((field, s));
        }
    }
    spans.sort_unstable();
    (out, spans)
}

/// `pieces` with each two in a row joined, the chunks between them
/// included, when the lines around them would meet ([`around::bridge`]).
fn hunks(ctx: &PreparedContext, pieces: Vec<Vec<usize>>, around: usize, taken: &HashSet<usize>) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let between = out.last().and_then(|p: &Vec<usize>| {
            let a = *p.last().expect("a piece is never empty");
            (ctx.chunks[a].field == ctx.chunks[piece[0]].field)
                .then(|| around::bridge(ctx, a, piece[0], around, taken))
                .flatten()
        });
        match (out.last_mut(), between) {
            (Some(p), Some(run)) => {
                p.extend(run);
                p.extend(piece);
            }
            _ => out.push(piece),
        }
    }
    out
}

/// The selection cut into pieces: runs of chunks of one field, each the
/// next in that field's reading order with only whitespace between.
pub(super) fn pieces(ctx: &PreparedContext, selected: &[usize]) -> Vec<Vec<usize>> {
    let chunks = &ctx.chunks;
    let mut sel = selected.to_vec();
    sel.sort_unstable_by_key(|&i| (chunks[i].field, chunks[i].span.0, chunks[i].span.1));
    sel.dedup();
    let set: HashSet<usize> = sel.iter().copied().collect();
    let mut out: Vec<Vec<usize>> = Vec::new();
    // the last piece's JSON bracket state, once a unit asked to join it
    let mut brackets: Option<json::Brackets> = None;
    let mut k = 0;
    while k < sel.len() {
        let unit = whole_from(ctx, &set, sel[k]);
        k += unit.len();
        match out.last_mut() {
            Some(p) if joins(ctx, p, &mut brackets, &unit) => p.extend(unit),
            _ => {
                brackets = None;
                out.push(unit);
            }
        }
    }
    out
}

/// Chunk `i`, or the chunks of the largest JSON container it opens when
/// `set` holds all of them: a container sent whole is one subtree.
fn whole_from(ctx: &PreparedContext, set: &HashSet<usize>, i: usize) -> Vec<usize> {
    let whole = |&&(s, e): &&(usize, usize)| s == i && (s..=e).all(|j| set.contains(&j));
    let last = ctx.chunks[i].containers.iter().filter(whole).map(|&(_, e)| e).max().unwrap_or(i);
    (i..=last).collect()
}

/// Whether `unit` (a chunk, or a whole JSON container's chunks) continues
/// `piece`: it comes right after the piece's last chunk with only
/// whitespace between, or later in its group (the rest of a long function,
/// a paragraph's later sentence), the lines between marked by a gap line.
/// JSON subtrees join only the chunk right before them, and only when the
/// run parses as one subtree: `brackets` carries the piece's bracket state
/// (scanned on the first such question), so each chunk is scanned once
/// however long the piece grows; `unit` is added to it when it joins.
fn joins(ctx: &PreparedContext, piece: &[usize], brackets: &mut Option<json::Brackets>, unit: &[usize]) -> bool {
    let a = *piece.last().expect("a piece is never empty");
    let b = unit[0];
    let (ca, cb) = (&ctx.chunks[a], &ctx.chunks[b]);
    if ca.wrap.is_some() || cb.wrap.is_some() {
        let next = ca.wrap.is_some() && cb.wrap.is_some() && cb.prev == Some(a) && cb.gap.is_some();
        if !next {
            return false;
        }
        let mut state = brackets.take().unwrap_or_else(|| scanned(ctx, json::Brackets::default(), piece, true));
        state = scanned(ctx, state, unit, false);
        let wraps = state.wraps();
        *brackets = wraps.then_some(state);
        return wraps;
    }
    // a state scanned before would miss the chunks this join adds
    *brackets = None;
    reads_on(ctx, a, b) || (ca.group == cb.group && ca.span.1 <= cb.span.0)
}

/// `state` with the text of `run` appended as [`json_wrap`] joins it: each
/// chunk after the white space before it, but the piece's first (`opens`).
fn scanned(ctx: &PreparedContext, mut state: json::Brackets, run: &[usize], opens: bool) -> json::Brackets {
    for (k, &i) in run.iter().enumerate() {
        let c = &ctx.chunks[i];
        if k > 0 || !opens {
            state.push(c.gap.as_deref().unwrap_or(""));
        }
        state.push(&c.text);
    }
    state
}

/// The JSON path of a run of subtrees: the path all their paths begin
/// with, cut at a step (`items[3]` for `items[3].status` and `items[3]`).
fn common_path(ctx: &PreparedContext, piece: &[usize]) -> Option<String> {
    let paths: Vec<&str> = piece.iter().filter_map(|&i| ctx.chunks[i].section.as_deref()).collect();
    let (first, rest) = paths.split_first()?;
    let mut n =
        rest.iter().fold(first.len(), |n, p| first.bytes().zip(p.bytes()).take(n).take_while(|(x, y)| x == y).count());
    let at_step = |p: &str, n: usize| matches!(p.as_bytes().get(n), None | Some(b'.' | b'['));
    while n > 0 && !(first.is_char_boundary(n) && paths.iter().all(|p| at_step(p, n))) {
        n -= 1;
    }
    Some(if n == 0 || first[..n] == *"$" { "$".to_string() } else { first[..n].to_string() })
}

/// One header line naming the piece's source.
fn header(ctx: &PreparedContext, piece: &[usize]) -> String {
    let (first, end) = (&ctx.chunks[piece[0]], &ctx.chunks[piece[piece.len() - 1]]);
    header_over(ctx, piece, (first.lines.0, end.lines.1))
}

/// [`header`] naming lines `a` to `b` (the piece with the lines around it).
fn header_over(ctx: &PreparedContext, piece: &[usize], (a, b): (usize, usize)) -> String {
    let first = &ctx.chunks[piece[0]];
    let name = &ctx.field_names[first.field];
    let section = match piece {
        [_, _, ..] if first.wrap.is_some() => common_path(ctx, piece),
        _ => first.section.clone(),
    };
    let lines = match () {
        _ if ctx.last_lines[first.field] <= 1 => String::new(),
        _ if a == b => format!(":{a}"),
        _ => format!(":{a}-{b}"),
    };
    match &section {
        Some(s) => {
            let s: String = s.chars().take(MAX_HEADING_CHARS).collect();
            format!("[{name}{lines} {s}]")
        }
        None => format!("[{name}{lines}]"),
    }
}

/// Writes `piece` under its header, with up to `around` lines around it
/// when it is code; the byte spans of those lines.
fn write_piece(
    ctx: &PreparedContext,
    piece: &[usize],
    out: &mut String,
    around: usize,
    taken: &HashSet<usize>,
) -> Vec<(usize, usize)> {
    let first = &ctx.chunks[piece[0]];
    let last = *piece.last().expect("a piece is never empty");
    let before = around::before(ctx, piece[0], around, taken);
    let after = around::after(ctx, last, around, taken);
    let lines = (
        before.as_ref().map_or(first.lines.0, |b| b.line),
        after.as_ref().map_or(ctx.chunks[last].lines.1, |a| a.line),
    );
    let spans: Vec<(usize, usize)> = before.iter().chain(&after).flat_map(|l| l.spans.iter().copied()).collect();
    out.push_str(&header_over(ctx, piece, lines));
    out.push('\n');
    if let Some((t, w)) = first.wrap.and_then(|_| json_wrap(ctx, piece)) {
        // a JSON subtree: parses on its own, indented from the margin
        let (a, b) = w.core;
        // the indentation of the line the core starts on (after a key, that key's)
        let line = t[..a].rfind('\n').map_or(0, |p| p + 1);
        let lead = &t[line..a];
        let lead = &lead[..lead.len() - lead.trim_start_matches([' ', '\t']).len()];
        let indent = if line == 0 { format!("{}{lead}", first.indent) } else { lead.to_string() };
        let body = dedent(&format!("{indent}{}", &t[a..b]));
        let (open, close) = (w.open, w.close);
        if open.is_empty() {
            out.push_str(&body);
        } else {
            out.push_str(open);
            for line in body.lines() {
                out.push_str("\n  ");
                out.push_str(line);
            }
            out.push('\n');
            out.push_str(close);
        }
        return spans;
    }
    for (k, &i) in piece.iter().enumerate() {
        let c = &ctx.chunks[i];
        match c.gap.as_deref() {
            // the lines before end with the indentation
            _ if k == 0 => out.push_str(before.as_ref().map_or(&c.indent, |b| &b.text)),
            Some(gap) if c.prev == Some(piece[k - 1]) => out.push_str(gap),
            // lines left out within the group
            _ => {
                out.push('\n');
                out.push_str(&c.indent);
                out.push_str(GAP);
                out.push('\n');
                out.push_str(&c.indent);
            }
        }
        out.push_str(&c.text);
    }
    if let Some(a) = after {
        out.push_str(&a.text);
    }
    spans
}

/// `text` with the indentation its lines share removed.
fn dedent(text: &str) -> String {
    let margin = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start_matches([' ', '\t']).len())
        .min()
        .unwrap_or(0);
    text.lines().map(|l| l.get(margin..).unwrap_or(l.trim_start())).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;
    use crate::cancel::Cancel;
    use crate::context::{Field, FieldKind};
    use crate::encoder::HashEncoder;
    use crate::extract::ScdConfig;

    fn prepared(name: &str, content: String, cfg: ScdConfig) -> Arc<PreparedContext> {
        let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), cfg);
        let field = Field { name: name.into(), kind: FieldKind::Json, confidential: false, content };
        scd.prepare(&[&field], &Cancel::new()).unwrap()
    }

    /// `pieces` as it was before [`json::Brackets`]: each join parsed the
    /// whole run again. The reference the running state must agree with.
    fn reference_pieces(ctx: &PreparedContext, selected: &[usize]) -> Vec<Vec<usize>> {
        let chunks = &ctx.chunks;
        let mut sel = selected.to_vec();
        sel.sort_unstable_by_key(|&i| (chunks[i].field, chunks[i].span.0, chunks[i].span.1));
        sel.dedup();
        let set: HashSet<usize> = sel.iter().copied().collect();
        let mut out: Vec<Vec<usize>> = Vec::new();
        let mut k = 0;
        while k < sel.len() {
            let unit = whole_from(ctx, &set, sel[k]);
            k += unit.len();
            match out.last_mut() {
                Some(p) if reference_joins(ctx, p, &unit) => p.extend(unit),
                _ => out.push(unit),
            }
        }
        out
    }

    fn reference_joins(ctx: &PreparedContext, piece: &[usize], unit: &[usize]) -> bool {
        let a = *piece.last().expect("a piece is never empty");
        let b = unit[0];
        let (ca, cb) = (&ctx.chunks[a], &ctx.chunks[b]);
        if ca.wrap.is_some() || cb.wrap.is_some() {
            let next = ca.wrap.is_some() && cb.wrap.is_some() && cb.prev == Some(a) && cb.gap.is_some();
            return next && json_wrap(ctx, &[piece, unit].concat()).is_some();
        }
        reads_on(ctx, a, b) || (ca.group == cb.group && ca.span.1 <= cb.span.0)
    }

    /// The pieces, and the text rendered from them, are those of the
    /// reference, byte for byte: generated documents (lists of objects,
    /// nested trees, strings with brackets, quotes, escapes and non-ASCII
    /// text) cut at many unit sizes, under seeded selections from sparse to
    /// all of it and runs of adjacent chunks.
    #[test]
    fn pieces_and_text_are_those_of_parsing_each_run_again() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(11);
        let (mut checked, mut joined) = (0, 0);
        for (d, doc) in crate::chunk::json::tests::documents(3, 5).into_iter().enumerate() {
            for unit in [8, 40, 120, 400] {
                let mut cfg = ScdConfig::default();
                cfg.prepare.chunk.json_unit_bytes = unit;
                let ctx = prepared("doc.json", doc.clone(), cfg);
                let n = ctx.chunks.len();
                for _ in 0..32 {
                    let selected: Vec<usize> = match rng.random_range(0..3) {
                        0 => {
                            let density = rng.random_range(0.1..=1.0);
                            (0..n).filter(|_| rng.random_bool(density)).collect()
                        }
                        1 => {
                            let a = rng.random_range(0..n);
                            (a..rng.random_range(a..=n)).collect()
                        }
                        _ => (0..n).collect(),
                    };
                    let want = reference_pieces(&ctx, &selected);
                    assert_eq!(pieces(&ctx, &selected), want, "document {d}, unit {unit}: {selected:?}");
                    let mut text = String::new();
                    for piece in &want {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        write_piece(&ctx, piece, &mut text, 0, &HashSet::new());
                    }
                    assert_eq!(
                        render(&ctx, &selected, &HashSet::new(), 0),
                        text,
                        "document {d}, unit {unit}: {selected:?}"
                    );
                    checked += 1;
                    joined += want.iter().filter(|p| p.len() > 2).count();
                }
            }
        }
        assert!(checked > 1000 && joined > 1000, "{checked} selections, {joined} pieces of three chunks or more");
    }

    /// A timing, not a check: rendering nine chunks in ten of a large pod
    /// list, whose pods join into long pieces. The list is the file named by
    /// `SCD_PODS_JSON`, made for example with
    /// `python3 -c "import json;print(json.dumps({'kind':'List','apiVersion':'v1','items':[{'metadata':{'name':f'web-{i}','namespace':'shop'},'spec':{'containers':[{'name':'app','image':'web:1.2'}]},'status':{'phase':'Running','restartCount':i%3,'containerStatuses':[{'ready':i!=1234,'state':{'waiting':{'reason':'CrashLoopBackOff'}} if i==1234 else {'running':{}}}]}} for i in range(4000)]},indent=1))" > /tmp/pods.json`
    /// (1.46 MB). Run: `SCD_PODS_JSON=/tmp/pods.json cargo test -p scd-engine --lib render_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn render_timing() {
        let path = std::env::var("SCD_PODS_JSON").expect("SCD_PODS_JSON names the pod list");
        let content = std::fs::read_to_string(path).unwrap();
        let t = Instant::now();
        let ctx = prepared("pods.json", content, ScdConfig::default());
        let prepare_ms = t.elapsed().as_millis();
        let all = ctx.chunks.len();
        // the first nine tenths (long runs), and nine chunks in every ten (short ones)
        for (how, selected) in [
            ("first 90%", (0..all * 9 / 10).collect::<Vec<usize>>()),
            ("9 in 10", (0..all).filter(|i| i % 10 != 9).collect()),
        ] {
            let t = Instant::now();
            let text = render(&ctx, &selected, &HashSet::new(), 0);
            let render_ms = t.elapsed().as_secs_f64() * 1e3;
            let n = pieces(&ctx, &selected).len();
            println!(
                "{all} chunks (prepare {prepare_ms} ms); {how}: {} selected, {n} pieces, {} bytes, render {render_ms:.1} ms",
                selected.len(),
                text.len()
            );
        }
    }
}
