//! Pack: greedy by value ([`Scd::pack_values`]: the score; a log chunk's
//! less its size, a log or chat chunk's plus a share of a higher-scored
//! chunk before it) under the budget, skipping near-duplicates of
//! what is sent and bringing each chunk's group lead (a container's header
//! comes only that way). A chunk pays for its text and, when it opens a
//! piece of the rendered text ([`super::render`]), for that piece's header.

use std::collections::{HashMap, HashSet};

use super::adjacent::reads_on;
use super::prepare::PreparedContext;
use super::Scd;

/// What packing decided beyond the selection, for explanations.
#[derive(Debug, Default)]
pub(super) struct PackTrace {
    /// Chunks taken because a chunk of their group was (closure: its lead
    /// and a container's closing line, or the rest of a small group).
    pub(super) by_closure: HashSet<usize>,
    /// Chunks skipped as near-duplicates (or copies) of a sent chunk: that chunk.
    pub(super) duplicate_of: HashMap<usize, usize>,
    /// Chunks packed, then dropped for the whole text to fit the budget.
    pub(super) dropped_by_fit: HashSet<usize>,
    /// Near copies of sent code, with the value they waited at (their
    /// score less `near_duplicate_penalty`): what the fit and the refill
    /// weigh them by too.
    pub(super) deferred: HashMap<usize, f32>,
}

impl PackTrace {
    /// What chunk `i` is worth to the fit and the refill: its deferred value
    /// when it waited as a near copy, else `worth`.
    pub(super) fn value(&self, i: usize, worth: f32) -> f32 {
        self.deferred.get(&i).copied().unwrap_or(worth)
    }
}

/// What each chunk costs: its text (with one separator) and the header of
/// a piece it would open.
pub(super) struct Costs<'a> {
    pub(super) text: &'a [usize],
    pub(super) header: &'a [usize],
    /// What packing ranks by ([`Scd::pack_values`]; a chat answer waits at its own).
    pub(super) score: &'a [f32],
    /// The cut functions sent whole or not at all ([`Scd::whole_units`]).
    pub(super) units: &'a Units,
    /// The most tokens a prose paragraph may have to come whole
    /// ([`paragraph_limit`] in a first answer; `group_closure_tokens` alone
    /// in a follow-up).
    pub(super) paragraph: usize,
}

/// The candidates in score order, merged with the chat answers whose
/// question was taken: each answer waits at its own score (threshold or
/// not), so it comes with its question when it is worth its tokens, and a
/// better chunk elsewhere is not crowded out by it. A near copy of a sent
/// chunk that differs from it waits at its score less
/// `near_duplicate_penalty` (`deferred`).
struct Queue<'a> {
    order: &'a [usize],
    at: usize,
    waiting: Vec<usize>,
    deferred: Vec<(usize, f32)>,
}

impl Queue<'_> {
    fn next(&mut self, score: &[f32]) -> Option<usize> {
        let best = (0..self.waiting.len()).max_by(|&a, &b| score[self.waiting[a]].total_cmp(&score[self.waiting[b]]));
        let later = (0..self.deferred.len()).max_by(|&a, &b| self.deferred[a].1.total_cmp(&self.deferred[b].1));
        let next = self.order.get(self.at).map(|&o| score[o]);
        let waits = best.map(|w| score[self.waiting[w]]);
        // a deferred chunk comes once nothing else is worth more
        if let Some(d) = later.filter(|&d| {
            let v = self.deferred[d].1;
            next.is_none_or(|n| v > n) && waits.is_none_or(|w| v > w)
        }) {
            return Some(self.deferred.swap_remove(d).0);
        }
        match (self.order.get(self.at), best) {
            (Some(&o), Some(w)) if score[self.waiting[w]] <= score[o] => {
                self.at += 1;
                Some(o)
            }
            (_, Some(w)) => Some(self.waiting.swap_remove(w)),
            (Some(&o), None) => {
                self.at += 1;
                Some(o)
            }
            (None, None) => None,
        }
    }
}

/// The chosen chunks and what they cost, headers included.
struct Bag<'a> {
    ctx: &'a PreparedContext,
    costs: &'a Costs<'a>,
    chosen: HashSet<usize>,
    used: usize,
}

impl Bag<'_> {
    /// Whether `i` would join a piece already chosen (no header of its own).
    fn joins(&self, i: usize) -> bool {
        let c = &self.ctx.chunks[i];
        let before = c.prev.is_some_and(|p| self.chosen.contains(&p) && reads_on(self.ctx, p, i));
        let after = c.next.is_some_and(|n| self.chosen.contains(&n) && reads_on(self.ctx, i, n));
        before || after
    }

    /// What taking `i` adds to the total.
    fn cost(&self, i: usize) -> usize {
        self.costs.text[i] + if self.joins(i) { 0 } else { self.costs.header[i] }
    }

    fn take(&mut self, i: usize) {
        self.used += self.cost(i);
        self.chosen.insert(i);
    }
}

/// The chunks sent whole or not at all: each cut function (see
/// [`PreparedContext::cut_functions`]) of at most `function_whole_share` of
/// the budget, as a function left uncut is. Packing takes such a function's
/// chunks together, the fit drops them together (at its best chunk's
/// worth) and the refill adds them together; like closure, the rest of a
/// function comes whatever its chunks' own scores.
#[derive(Debug, Default)]
pub(super) struct Units {
    unit: HashMap<usize, usize>,
    members: Vec<Vec<usize>>,
}

impl Units {
    /// The chunks sent with `i` (none when it is not in such a unit).
    pub(super) fn of(&self, i: usize) -> &[usize] {
        self.unit.get(&i).map_or(&[], |&u| &self.members[u])
    }

    /// What `i` is worth when the fit weighs dropping it: the best of its
    /// unit's `score` (a function goes whole, for its best chunk's worth),
    /// else its own.
    pub(super) fn worth(&self, i: usize, score: &[f32]) -> f32 {
        self.of(i).iter().map(|&j| score[j]).fold(score[i], f32::max)
    }
}

/// The tokens (text and header) a log chunk may cost before
/// `log_size_weight` holds its size against it: one entry, however long its
/// line. At 32 the fixture showcase's 59-token error entry lost to shorter
/// chunks of other kinds; of 64 and 128, 64 cross-validated better on the
/// log cases (BENCHMARKS.md).
const LOG_SIZE_FLOOR: usize = 64;

impl Scd {
    /// What packing ranks each chunk by: its score; for a log chunk its
    /// score less `log_size_weight` times the log of its cost (text and
    /// header) over [`LOG_SIZE_FLOOR`] tokens (log chunks go by value for
    /// their tokens); and for a log or chat chunk that follows a
    /// higher-scored chunk of its kind in its field, plus `follow_weight`
    /// times the difference (in a stream, what an entry caused and what a
    /// discussion decided come after it, in fewer of the task's words); a
    /// chat chunk that is not its group's lead (an answer, which waits at
    /// its own score, or a later piece of a long turn) is not lifted.
    pub(super) fn pack_values(
        &self,
        ctx: &PreparedContext,
        scores: &[f32],
        cost: &[usize],
        header: &[usize],
    ) -> Vec<f32> {
        let (w, f) = (self.cfg.scoring.log_size_weight, self.cfg.scoring.follow_weight);
        let size = |i: usize| ((cost[i] + header[i]).max(LOG_SIZE_FLOOR) as f32 / LOG_SIZE_FLOOR as f32).ln();
        let chunks = &ctx.chunks;
        let follows = |i: usize| {
            let prev = chunks[i].prev.filter(|&p| chunks[p].chunker == chunks[i].chunker && scores[p] > scores[i]);
            prev.map_or(0.0, |p| f * (scores[p] - scores[i]))
        };
        (0..scores.len())
            .map(|i| match chunks[i].chunker {
                "log" => scores[i] - w * size(i) + follows(i),
                // a chat chunk that is not its group's lead (an answer in a
                // short chat cut by turns, a later piece of a turn or run
                // over 2 KiB) waits at its own score, as the queue has it
                "chat" if chunks[i].lead => scores[i] + follows(i),
                _ => scores[i],
            })
            .collect()
    }

    /// The cut functions sent whole or not at all under `budget` ([`Units`]),
    /// by each chunk's `cost` (its text).
    pub(super) fn whole_units(&self, ctx: &PreparedContext, cost: &[usize], budget: usize) -> Units {
        let max = (self.cfg.scoring.function_whole_share * budget as f32) as usize;
        let mut units = Units::default();
        if max == 0 {
            return units;
        }
        for m in ctx.cut_function_chunks().into_values().filter(|m| m.iter().map(|&i| cost[i]).sum::<usize>() <= max) {
            units.unit.extend(m.iter().map(|&i| (i, units.members.len())));
            units.members.push(m);
        }
        units
    }

    /// Greedy packing in `order` (by [`Scd::pack_values`]) with redundancy
    /// suppression and group closure.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pack(
        &self,
        ctx: &PreparedContext,
        order: &[usize],
        costs: &Costs<'_>,
        budget: usize,
        selected: &mut Vec<usize>,
        used: &mut usize,
        trace: &mut PackTrace,
    ) {
        let chunks = &ctx.chunks;
        let mut bag = Bag { ctx, costs, chosen: selected.iter().copied().collect(), used: *used };
        // the distinct embeddings already sent (with the chunk that sent
        // each): a chunk identical or near to one is redundant
        let mut sent: HashMap<u32, usize> = selected.iter().map(|&i| (ctx.distinct[i], i)).collect();
        let sc = &self.cfg.scoring;
        let limits = Limits {
            paragraph: costs.paragraph,
            section: sc.section_closure_tokens,
            function: sc.function_closure_tokens,
        };
        let groups = Groups::new(ctx, costs, limits);
        // a chat question's answers (the rest of its group)
        let mut answers: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
        for (j, c) in chunks.iter().enumerate().filter(|(_, c)| c.chunker == "chat" && !c.lead) {
            answers.entry(c.group).or_default().push(j);
        }
        let mut queue = Queue { order, at: 0, waiting: Vec::new(), deferred: Vec::new() };
        let sharing = sharing_embeddings(ctx);
        while let Some(mut i) = queue.next(costs.score) {
            // a container's header or closing line comes only with a member
            if bag.chosen.contains(&i) || chunks[i].rides || bag.used + bag.cost(i) > budget {
                continue;
            }
            if let Some(first) = first_occurrence(ctx, &sharing, i)
                .filter(|&j| !bag.chosen.contains(&j) && bag.used + bag.cost(j) <= budget)
            {
                trace.duplicate_of.insert(i, first);
                i = first;
            }
            let d = ctx.distinct[i];
            if self.repeats_sent(ctx, &sent, i, costs.score, &mut queue, trace) {
                continue;
            }
            // a cut function short enough for the budget comes whole or not at all
            let mut rest: Vec<usize> =
                costs.units.of(i).iter().copied().filter(|&j| j != i && !bag.chosen.contains(&j)).collect();
            if bag.used + bag.cost(i) + rest.iter().map(|&j| costs.text[j]).sum::<usize>() > budget {
                continue;
            }
            sent.entry(d).or_insert(i);
            bag.take(i);
            selected.push(i);
            // outwards from `i`, so that each joins its piece (no header of its own)
            rest.sort_by_key(|&j| if j > i { (0, j) } else { (1, i - j) });
            for j in rest {
                sent.entry(ctx.distinct[j]).or_insert(j);
                bag.take(j);
                selected.push(j);
                trace.by_closure.insert(j);
            }
            for &j in answers.get(&chunks[i].group).into_iter().flatten() {
                if !bag.chosen.contains(&j) && !queue.waiting.contains(&j) {
                    queue.waiting.push(j);
                }
            }
            // closure: a chunk brings the rest of a small group (a short
            // paragraph, a markdown section) when all of it fits, else its
            // group's lead (a paragraph's first sentence, a section's
            // heading, a chat answer's question)
            let closure = groups.closure(chunks[i].group, &bag, budget);
            for j in closure {
                sent.entry(ctx.distinct[j]).or_insert(j);
                bag.take(j);
                selected.push(j);
                trace.by_closure.insert(j);
            }
            for j in whole_container(&bag, i, budget, self.cfg.scoring.json_whole_tokens) {
                sent.entry(ctx.distinct[j]).or_insert(j);
                bag.take(j);
                selected.push(j);
                trace.by_closure.insert(j);
            }
        }
        bridge(&mut bag, budget, selected, trace);
        *used = bag.used;
    }

    /// Whether `i` is left for now because it nearly repeats a sent chunk
    /// (`sent`: distinct embedding → the chunk that sent it): skipped when
    /// it is the same text; a near copy of code that differs adds only the
    /// difference, so it waits once in `queue` at its score less
    /// `near_duplicate_penalty` (prose and log near copies that differ
    /// carry other facts: they fell when deferred, BENCHMARKS.md).
    fn repeats_sent(
        &self,
        ctx: &PreparedContext,
        sent: &HashMap<u32, usize>,
        i: usize,
        score: &[f32],
        queue: &mut Queue<'_>,
        trace: &mut PackTrace,
    ) -> bool {
        let d = ctx.distinct[i];
        let Some(&of) = sent.get(&d).or_else(|| ctx.near_duplicates[d as usize].iter().find_map(|j| sent.get(j)))
        else {
            return false;
        };
        if same_text(ctx, i, of) {
            trace.duplicate_of.insert(i, of);
            return true;
        }
        let penalty = self.cfg.scoring.near_duplicate_penalty;
        if penalty > 0.0 && ctx.chunks[i].is_code() && !trace.deferred.contains_key(&i) {
            let value = score[i] - penalty;
            trace.deferred.insert(i, value);
            queue.deferred.push((i, value));
            return true;
        }
        false
    }
}

/// The log chunks (not structure) of each distinct embedding in each field,
/// earliest first: chunks sharing an embedding share their embedded text.
fn sharing_embeddings(ctx: &PreparedContext) -> HashMap<(u32, usize), Vec<usize>> {
    let mut out: HashMap<(u32, usize), Vec<usize>> = HashMap::new();
    for (i, &d) in ctx.distinct.iter().enumerate() {
        let c = &ctx.chunks[i];
        if c.chunker == "log" && !c.rides {
            out.entry((d, c.field)).or_default().push(i);
        }
    }
    for list in out.values_mut() {
        list.sort_unstable_by_key(|&j| ctx.chunks[j].span.0);
    }
    out
}

/// A log entry repeated with only its timestamp or counters changed: the
/// first of the repeats in its field, when that is not `i`. It goes in
/// `i`'s place, since that is when the trouble began; the repeats' scores
/// differ only by what their numbers did to the embedding. Each embedding's
/// earliest chunk is the only one to look at (the others share its text), so
/// this costs the embedding's near-duplicates, not the field's repeats.
fn first_occurrence(ctx: &PreparedContext, sharing: &HashMap<(u32, usize), Vec<usize>>, i: usize) -> Option<usize> {
    let c = &ctx.chunks[i];
    if c.chunker != "log" {
        return None;
    }
    let d = ctx.distinct[i];
    std::iter::once(&d)
        .chain(&ctx.near_duplicates[d as usize])
        .filter_map(|dd| sharing.get(&(*dd, c.field)).and_then(|list| list.first()).copied())
        .filter(|&j| ctx.chunks[j].span.0 < c.span.0 && same_text(ctx, i, j))
        .min_by_key(|&j| ctx.chunks[j].span.0)
}

/// Whether chunk `i` repeats one of `selected` (the packer's rule: the
/// same or a near embedding, and [`same_text`]).
pub(super) fn repeats(ctx: &PreparedContext, selected: &[usize], i: usize) -> bool {
    let d = ctx.distinct[i];
    selected.iter().any(|&j| {
        let dj = ctx.distinct[j];
        (dj == d || ctx.near_duplicates[d as usize].contains(&dj)) && same_text(ctx, i, j)
    })
}

/// The most tokens of a group that comes whole once one of its chunks is
/// sent, by kind of group (0: none).
struct Limits {
    /// A prose paragraph.
    paragraph: usize,
    /// A markdown section.
    section: usize,
    /// A long function cut into its signature and body pieces.
    function: usize,
}

/// The most tokens a paragraph may have to come whole in a first answer:
/// `tokens`, and at most `share` of `budget` below a share of 1 (NaN and
/// below 0 act as 0). The whole paragraph is measured, also in a continued
/// session where the receiver holds part of it.
pub(super) fn paragraph_limit(tokens: usize, share: f32, budget: usize) -> usize {
    if share >= 1.0 {
        tokens
    } else {
        tokens.min((share.max(0.0) * budget as f32) as usize)
    }
}

/// What closure brings: each group's lead, a container's closing line, and
/// the members and tokens of each prose group (a paragraph, a markdown
/// section) or cut function no longer than its kind's limit.
struct Groups {
    leads: HashMap<(usize, usize), usize>,
    closings: HashMap<(usize, usize), usize>,
    members: HashMap<(usize, usize), (Vec<usize>, usize)>,
}

impl Groups {
    fn new(ctx: &PreparedContext, costs: &Costs<'_>, limits: Limits) -> Self {
        let chunks = &ctx.chunks;
        // a log group's lead is a header only in an error entry's group (the
        // error line its frames belong to, however it was cut); the first
        // piece of a long run of ordinary entries is not
        let errors: HashSet<(usize, usize)> =
            chunks.iter().filter(|c| c.chunker == "log" && c.severity >= 2).map(|c| c.group).collect();
        let header = |c: &super::prepare::Prepared| c.lead && (c.chunker != "log" || errors.contains(&c.group));
        let leads = chunks.iter().enumerate().filter(|(_, c)| header(c)).map(|(i, c)| (c.group, i)).collect();
        // a container's closing line (`}`), which comes with its header
        let closings =
            chunks.iter().enumerate().filter(|(_, c)| c.rides && !c.lead).map(|(i, c)| (c.group, i)).collect();
        let mut members: HashMap<(usize, usize), (Vec<usize>, usize)> = HashMap::new();
        // a group is a section when any of its chunks was cut by the markdown chunker
        let mut sections = HashSet::new();
        for (j, c) in
            chunks.iter().enumerate().filter(|(_, c)| ctx.is_prose(c.field) || ctx.cut_functions.contains_key(&c.group))
        {
            let e = members.entry(c.group).or_default();
            e.0.push(j);
            e.1 += costs.text[j];
            if c.chunker.starts_with("markdown") {
                sections.insert(c.group);
            }
        }
        members.retain(|g, (m, t)| {
            let limit = if sections.contains(g) {
                limits.section
            } else if ctx.is_prose(g.0) {
                limits.paragraph
            } else {
                limits.function
            };
            m.len() > 1 && limit > 0 && *t <= limit
        });
        Self { leads, closings, members }
    }

    /// The chunks group `g` brings once one of its chunks is taken: the
    /// rest of a small paragraph or section when all of it fits, else its
    /// lead, then a container's closing line once its header is in.
    fn closure(&self, g: (usize, usize), bag: &Bag<'_>, budget: usize) -> Vec<usize> {
        let costs = bag.costs;
        let rest: Vec<usize> = match self.members.get(&g) {
            Some((m, _)) => m.iter().copied().filter(|j| !bag.chosen.contains(j)).collect(),
            None => Vec::new(),
        };
        // the rest of a paragraph joins the chosen chunk's piece: no header
        let rest_cost: usize = rest.iter().map(|&j| costs.text[j]).sum();
        if !rest.is_empty() && bag.used + rest_cost <= budget {
            return rest;
        }
        let mut c = Vec::new();
        let lead = self.leads.get(&g).copied();
        let header_cost = |l: &usize| costs.text[*l] + costs.header[*l];
        if let Some(l) = lead.filter(|l| !bag.chosen.contains(l) && bag.used + header_cost(l) <= budget) {
            c.push(l);
        }
        let extra: usize = c.iter().map(header_cost).sum();
        let header_in = lead.is_some_and(|l| bag.chosen.contains(&l) || c.contains(&l));
        let closing = self.closings.get(&g).copied();
        if let Some(e) =
            closing.filter(|e| header_in && !bag.chosen.contains(e) && bag.used + extra + header_cost(e) <= budget)
        {
            c.push(e);
        }
        c
    }
}

/// The rest of the largest JSON container cut across chunks that holds
/// chunk `i` (just taken), has at most `max_tokens` tokens and whose rest
/// fits the budget: an array's element or an object's member sent in part
/// is sent whole, one subtree under its path, rather than as fragments.
fn whole_container(bag: &Bag<'_>, i: usize, budget: usize, max_tokens: usize) -> Vec<usize> {
    let mut best = Vec::new();
    for &(first, last) in &bag.ctx.chunks[i].containers {
        let all: usize = (first..=last).map(|j| bag.costs.text[j]).sum();
        let rest: Vec<usize> = (first..=last).filter(|j| !bag.chosen.contains(j)).collect();
        // the rest joins the taken chunk's piece: its text, no header
        let cost: usize = rest.iter().map(|&j| bag.costs.text[j]).sum();
        if all > max_tokens || bag.used + cost > budget {
            break;
        }
        best = rest;
    }
    best
}

/// Longest run of unsent chunks a bridge fills.
const MAX_BRIDGE: usize = 8;

/// Bridges: a run of unsent chunks between two chosen ones of one field
/// (whitespace around each) that costs at most twice the header the second
/// piece opens is sent too, when the budget holds it, so the two pieces
/// read as one (a chat's turns between two sent ones, a code line between
/// two blocks).
fn bridge(bag: &mut Bag<'_>, budget: usize, selected: &mut Vec<usize>, trace: &mut PackTrace) {
    let chunks = &bag.ctx.chunks;
    let mut starts: Vec<usize> = bag.chosen.iter().copied().collect();
    starts.sort_unstable();
    for a in starts {
        let mut run = Vec::new();
        let mut at = chunks[a].next;
        while let Some(j) = at {
            // JSON subtrees are joined by their containers, not bridged
            if chunks[j].gap.is_none() || chunks[j].wrap.is_some() || run.len() > MAX_BRIDGE {
                break;
            }
            if bag.chosen.contains(&j) {
                let cost: usize = run.iter().map(|&r| bag.costs.text[r]).sum();
                let saved = bag.costs.header[j];
                if !run.is_empty() && cost <= 2 * saved && bag.used + cost <= budget + saved {
                    bag.used = (bag.used + cost).saturating_sub(saved);
                    for &r in &run {
                        bag.chosen.insert(r);
                        selected.push(r);
                        trace.by_closure.insert(r);
                    }
                }
                break;
            }
            run.push(j);
            at = chunks[j].next;
        }
    }
}

/// Whether chunk `a` repeats chunk `b`: the same words (whitespace aside)
/// in code, nine in ten of the same distinct words elsewhere. Only then is
/// one a duplicate of the other: two similar functions that differ in one
/// word, or a heading and the sentence under it, are both kept.
pub(super) fn same_text(ctx: &PreparedContext, a: usize, b: usize) -> bool {
    let (ca, cb) = (&ctx.chunks[a], &ctx.chunks[b]);
    if ca.is_code() {
        return ca.text.split_whitespace().eq(cb.text.split_whitespace());
    }
    let x: HashSet<&str> = ca.lower.split_whitespace().collect();
    let y: HashSet<&str> = cb.lower.split_whitespace().collect();
    let common = x.intersection(&y).count();
    let all = x.len() + y.len() - common;
    all == 0 || common * 10 >= all * 9
}
