//! Adaptive context requests (paper §6.3): the next chunks a receiver has
//! not seen, for its specific question, under the budget it has left.

use std::collections::{HashMap, HashSet};

use tracing::instrument;

use super::pack::{Costs, PackTrace};
use super::prepare::PreparedContext;
use super::{render, ContextRequest, Counting, LastReply, Ledger, MoreContext, Scd, MAX_CHUNK_IDS};
use crate::cancel::Cancel;
use crate::context::{check_no_nul, FieldKind};
use crate::encoder::InputKind;
use crate::score::dot;
use crate::{Error, Param, Result};

impl Scd {
    /// Adaptive context request (paper §6.3): the next most relevant chunks
    /// for the question that the receiver has not seen, under the budget it
    /// has left. Never resends a chunk.
    pub fn request_more(&self, req: &ContextRequest) -> Result<MoreContext> {
        self.request_more_with(req, &Cancel::new())
    }

    /// [`Scd::request_more`] that stops between stages once `cancel` says so.
    #[instrument(skip_all)]
    pub fn request_more_with(&self, req: &ContextRequest, cancel: &Cancel) -> Result<MoreContext> {
        super::retry_contended(|| self.more_once(req, cancel))
    }

    fn more_once(&self, req: &ContextRequest, cancel: &Cancel) -> Result<MoreContext> {
        let query = self.more_query(req)?;
        let handle = self.session(&req.session_id, &req.session_token, req.caller.as_deref(), req.scope.as_deref())?;
        // this session's own turn, held through scoring: concurrent requests
        // on one session take turns, so none can pick a chunk another sends
        let mut session = self.ledger(&handle, None, cancel)?;
        let budget = req.max_tokens.unwrap_or(session.reply_budget).min(session.total_left());
        match req.max_tokens {
            Some(0) => {
                return Err(Error::invalid("max_tokens", "must be at least 1 (leave it out for the session's default)"))
            }
            Some(n) if n > self.cfg.limits.max_budget_tokens => {
                return Err(Error::invalid(
                    "max_tokens",
                    format!("{n} is over the limit {} of one budget", self.cfg.limits.max_budget_tokens),
                ))
            }
            _ => {}
        }
        if let (Some(id), Some(last)) = (&req.request_id, &session.last) {
            if &last.request_id == id {
                return Ok(self.replay(&session, last));
            }
        }
        let nothing = |session: &Ledger, reason: String| MoreContext {
            chunks: vec![],
            text: String::new(),
            sent_tokens: 0,
            budget,
            session_sent_tokens: session.total_sent,
            remaining_tokens: session.remaining(),
            reason: Some(reason),
        };
        if req.current_confidence >= self.cfg.sessions.confidence_threshold {
            let why = format!(
                "confidence {} is at or above the threshold {}; no context sent",
                req.current_confidence, self.cfg.sessions.confidence_threshold
            );
            return Ok(nothing(&session, why));
        }
        if req.chunk_ids.len() > MAX_CHUNK_IDS {
            return Err(Error::invalid(
                "chunk_ids",
                format!("{} ids, over the limit {MAX_CHUNK_IDS}", req.chunk_ids.len()),
            ));
        }
        let context = session.context.clone();
        let counting = session.counting.clone();
        let explicit = explicit_ids(&context, &req.chunk_ids)?;
        if req.specific_question.trim().is_empty() && explicit.is_empty() {
            return Err(Error::invalid(Param::SpecificQuestion, "must not be empty (or name chunk_ids)"));
        }
        if budget == 0 {
            let why = match session.cap {
                Some(cap) => format!("the session's total of {cap} tokens is spent"),
                None => "the reply's budget is 0".into(),
            };
            return Ok(nothing(&session, why));
        }
        let Candidates { ranked: Ranked { scores, rank }, named, unseen, about } =
            self.more_candidates(&context, &session.sent, &query, &explicit, cancel)?;
        let candidates = unseen.len();
        let (mut picked, sent_tokens) =
            self.pack_more(&context, &counting, &session.sent, (&named, unseen), &rank, budget)?;
        let asked = Asked { named: &named, picked: &picked, about: &about, candidates, budget };
        let reason = more_reason(&context, &counting, &session.sent, &asked);
        session.sent.extend(picked.iter().copied());
        session.total_sent += sent_tokens;
        picked.sort_unstable();
        session.last = req.request_id.clone().map(|request_id| LastReply {
            request_id,
            chunks: picked.iter().map(|&i| (i, scores[i])).collect(),
            sent_tokens,
            budget,
            reason: reason.clone(),
            around: self.lines_around(budget),
        });
        self.commit(&handle, &session)?;
        Ok(MoreContext {
            text: render::render(&context, &picked, &session.sent, self.lines_around(budget)),
            chunks: picked.iter().map(|&i| context.selected(i, scores[i], counting.tokens[i])).collect(),
            sent_tokens,
            budget,
            session_sent_tokens: session.total_sent,
            remaining_tokens: session.remaining(),
            reason,
        })
    }

    /// The request's own fields checked; the text the question is scored
    /// by (the question and the reasoning).
    fn more_query(&self, req: &ContextRequest) -> Result<String> {
        if !(0.0..=1.0).contains(&req.current_confidence) {
            return Err(Error::invalid(
                "current_confidence",
                format!("must be in [0, 1], got {}", req.current_confidence),
            ));
        }
        check_no_nul(|| Param::SpecificQuestion, &req.specific_question)?;
        check_no_nul(|| "reasoning", &req.reasoning)?;
        let query = format!("{} {}", req.specific_question, req.reasoning);
        if query.len() > self.cfg.limits.max_task_bytes {
            return Err(Error::invalid(
                Param::SpecificQuestion,
                format!("{} bytes with the reasoning, over the limit {}", query.len(), self.cfg.limits.max_task_bytes),
            ));
        }
        if let Some(id) = &req.request_id {
            if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::invalid("request_id", "must be 1 to 64 printable ASCII characters"));
            }
        }
        Ok(query)
    }

    /// The question's scores, what the follow-up ranks by ([`completing`]),
    /// the named chunks not yet sent, the other unseen chunks ranked at or
    /// above the context's average whose group the question is about
    /// ([`about`]), and how much it is about each chunk.
    fn more_candidates(
        &self,
        context: &PreparedContext,
        sent: &HashSet<usize>,
        query: &str,
        explicit: &[usize],
        cancel: &Cancel,
    ) -> Result<Candidates> {
        let qvec = self.embed_cached_with(&[query.trim()], InputKind::Query, cancel)?.remove(0);
        cancel.check("score")?;
        // the question is scored on its own: it is the receiver's next hop,
        // not the task again
        let mut parts = self.score(context, &qvec, query);
        self.rescore(context, query, &mut parts);
        // the second stage rescores the best of what the receiver has not got
        self.rerank(context, query.trim(), &mut parts, &|i| !sent.contains(&i), cancel)?;
        let scores = parts.fused;
        let rank = completing(context, sent, &scores);
        let about = about(context, &qvec, &|kind| self.more_floor(kind));
        let unseen: Vec<usize> = (0..context.chunks.len())
            .filter(|i| !sent.contains(i) && !explicit.contains(i))
            // beyond explicit ids, only chunks ranked at or above the context's
            // average, in a group the question is about
            .filter(|&i| rank[i] >= 0.0 && about.group[i] >= about.floor[i])
            .collect();
        let named: Vec<usize> = explicit.iter().copied().filter(|i| !sent.contains(i)).collect();
        Ok(Candidates { ranked: Ranked { scores, rank }, named, unseen, about })
    }

    /// The relevance below which a follow-up sends nothing unnamed of a
    /// field of `kind`: `more_min_relevance`, or the encoder's floor for
    /// the kind, or none.
    fn more_floor(&self, kind: FieldKind) -> f32 {
        let floor = self.cfg.sessions.more_min_relevance.or(self.encoder.relevance_floor(kind));
        floor.filter(|f| (-1.0..=1.0).contains(f)).unwrap_or(f32::NEG_INFINITY)
    }

    /// The `named` chunks (asked for by id), then the best `more_max_chunks`
    /// of `unseen` by value ([`Self::pack_values`] of `rank`, as in a first answer), packed
    /// as a first answer does (a sentence brings its paragraph, with no
    /// `group_closure_share` limit), against what the receiver already holds (`sent`: those
    /// are neither sent again nor repeated as near-duplicates), then counted
    /// whole, as the receiver pastes it, dropping the weakest until it fits:
    /// the chunks picked and their tokens.
    fn pack_more(
        &self,
        context: &PreparedContext,
        counting: &Counting,
        sent: &HashSet<usize>,
        (named, mut unseen): (&[usize], Vec<usize>),
        rank: &[f32],
        budget: usize,
    ) -> Result<(Vec<usize>, usize)> {
        let cost: Vec<usize> = counting.tokens.iter().map(|t| t + counting.separator).collect();
        let around = self.lines_around(budget);
        let header = self.header_costs(context, counting, around)?;
        let value = self.pack_values(context, rank, &cost, &header);
        unseen.sort_by(|&a, &b| value[b].total_cmp(&value[a]));
        unseen.truncate(self.cfg.sessions.more_max_chunks);
        let order: Vec<usize> = named.iter().copied().chain(unseen).collect();
        // nothing named and nothing the question is about: nothing, not the
        // bridges packing lays between held pieces (question-blind filler)
        if order.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let mut selected: Vec<usize> = sent.iter().copied().collect();
        selected.sort_unstable();
        let held = selected.len();
        let mut used = 0;
        let mut trace = PackTrace::default();
        let units = self.whole_units(context, &cost, budget + counting.separator);
        // a follow-up asks for its answer's paragraph: no share of the budget
        // limits it (with one, MuSiQue's adaptive loop kept every supporting
        // paragraph of up to 0.08 fewer questions; BENCHMARKS.md)
        let paragraph = self.cfg.scoring.group_closure_tokens;
        let costs = Costs { text: &cost, header: &header, score: &value, units: &units, paragraph };
        self.pack(context, &order, &costs, budget + counting.separator, &mut selected, &mut used, &mut trace);
        let mut picked: Vec<usize> = selected.split_off(held);
        let text_of = |picked: &[usize]| render::render(context, picked, sent, around);
        let sent_tokens = self.fit(counting, &mut picked, &costs, |_| false, &text_of, budget, &mut trace)?;
        Ok((picked, sent_tokens))
    }

    /// The session's last reply again, for a retry naming its request id:
    /// the ledger is unchanged (those chunks were counted when first sent).
    fn replay(&self, session: &Ledger, last: &LastReply) -> MoreContext {
        let context = &session.context;
        let chunks: Vec<_> =
            last.chunks.iter().map(|&(i, score)| context.selected(i, score, session.counting.tokens[i])).collect();
        let ids: Vec<usize> = last.chunks.iter().map(|&(i, _)| i).collect();
        MoreContext {
            text: render::render(context, &ids, &session.sent, last.around),
            chunks,
            sent_tokens: last.sent_tokens,
            budget: last.budget,
            session_sent_tokens: session.total_sent,
            remaining_tokens: session.remaining(),
            reason: last.reason.clone(),
        }
    }
}

/// A follow-up's candidates ([`Scd::more_candidates`]).
struct Candidates {
    ranked: Ranked,
    /// The named chunks not yet sent.
    named: Vec<usize>,
    /// The other unseen chunks the follow-up may send.
    unseen: Vec<usize>,
    /// How much the question is about each chunk.
    about: About,
}

/// A follow-up's scores for its question, and what it ranks by.
struct Ranked {
    scores: Vec<f32>,
    /// What packing ranks by ([`completing`]).
    rank: Vec<f32>,
}

/// How much less each sentence further from a held one ranks, in a
/// paragraph [`completing`] lifts: the rest comes nearest first, and the fit
/// drops the farthest first (equal ranks would drop the nearest, leaving a gap).
const FARTHER: f32 = 1e-3;

/// What a follow-up ranks each chunk by: its score, or for an unsent
/// sentence of a paragraph the receiver holds in part, when higher, the
/// best score the question gives a held sentence of that paragraph (less
/// [`FARTHER`] per sentence away from the nearest held one). No threshold
/// beyond the follow-up's own: only chunks ranked at or above the context's
/// average are candidates, so a paragraph whose held sentences score below
/// it lifts nothing there. A question that points at a paragraph an earlier
/// reply cut gets its rest first (on MuSiQue's train sample, 0.010 to 0.065
/// more questions kept every supporting paragraph; BENCHMARKS.md). Plain
/// paragraphs only (those the `prose` chunker cut): a Markdown section can be
/// long, and tables, code, logs, JSON and chats are cut otherwise. With a
/// reranker, held chunks keep their first stage score (the second rescores
/// unsent chunks only); not measured.
pub(super) fn completing(context: &PreparedContext, sent: &HashSet<usize>, scores: &[f32]) -> Vec<f32> {
    let chunks = &context.chunks;
    let paragraph = |i: usize| chunks[i].chunker == "prose";
    // per paragraph: the best held score, and the held chunks in order
    let mut held: HashMap<(usize, usize), (f32, Vec<usize>)> = HashMap::new();
    for &h in sent.iter().filter(|&&h| paragraph(h)) {
        let (best, at) = held.entry(chunks[h].group).or_insert((f32::NEG_INFINITY, Vec::new()));
        *best = best.max(scores[h]);
        at.push(h);
    }
    for (_, at) in held.values_mut() {
        at.sort_unstable();
    }
    (0..chunks.len())
        .map(|i| match held.get(&chunks[i].group) {
            Some((best, at)) if paragraph(i) && !sent.contains(&i) => {
                // the nearest held chunk: the last before `i` or the first after it
                let k = at.partition_point(|&h| h < i);
                let away = [k.checked_sub(1), Some(k)]
                    .into_iter()
                    .flatten()
                    .filter_map(|j| at.get(j))
                    .map(|&h| h.abs_diff(i))
                    .min()
                    .unwrap_or(0);
                scores[i].max(best - FARTHER * away as f32)
            }
            _ => scores[i],
        })
        .collect()
}

/// The chunks `ids` name (in the order named); an unknown id is an error
/// naming its place, never its text.
fn explicit_ids(context: &PreparedContext, ids: &[String]) -> Result<Vec<usize>> {
    let by_id: HashMap<&str, usize> = context.chunks.iter().enumerate().map(|(i, c)| (c.id.as_str(), i)).collect();
    let mut explicit: Vec<usize> = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        match by_id.get(id.as_str()).copied() {
            Some(i) => explicit.push(i),
            // the id is the client's text: named by its place, never quoted
            None => {
                return Err(Error::invalid(
                    format!("chunk_ids[{n}]"),
                    "not a chunk of the session's context (ids come from the dropped list or an earlier reply)",
                ))
            }
        }
    }
    Ok(explicit)
}

/// What a follow-up was asked for and what it sent: the chunks named by
/// id, those picked, how much the question is about each chunk, how many
/// unnamed candidates there were, and the reply's budget.
struct Asked<'a> {
    named: &'a [usize],
    picked: &'a [usize],
    about: &'a About,
    candidates: usize,
    budget: usize,
}

/// Why a reply holds less than asked: a named chunk that did not fit; no
/// unseen chunk the question is about, each under its kind's floor (with
/// the relevance of the one nearest its floor, and the held chunk the
/// question is about, when the receiver holds one); no unseen chunk it is
/// about ranked at or above the context's average; or none that fits
/// (`sent`: before this reply).
fn more_reason(context: &PreparedContext, counting: &Counting, sent: &HashSet<usize>, asked: &Asked) -> Option<String> {
    let &Asked { named, picked, about, candidates, budget } = asked;
    let chunks = &context.chunks;
    if let Some(&i) = named.iter().find(|i| !picked.contains(i)) {
        let cost = counting.tokens[i] + counting.separator;
        return Some(format!("chunk {} needs {} tokens, {} left in this reply", chunks[i].id, cost, budget));
    }
    if !picked.is_empty() {
        return None;
    }
    // the closest by `by`, the first on a tie (chunks sharing a text tie)
    let closest =
        |ids: &mut dyn Iterator<Item = usize>, by: &[f32]| ids.max_by(|&a, &b| by[a].total_cmp(&by[b]).then(b.cmp(&a)));
    // how far each chunk's group is above its kind's floor (own: the chunk itself)
    let margin = |by: &[f32]| -> Vec<f32> { by.iter().zip(&about.floor).map(|(r, f)| r - f).collect() };
    let mut unseen = (0..chunks.len()).filter(|i| !sent.contains(i));
    Some(match closest(&mut unseen, &margin(&about.group)) {
        None => "every chunk of the context was already sent".into(),
        Some(u) if about.group[u] < about.floor[u] => {
            let mut why = format!(
                "nothing unsent is about the question: the unsent chunk nearest its floor has relevance \
                 {:.3}, below its floor {}",
                about.group[u], about.floor[u]
            );
            // the held chunk the question is most about, by its own cosine
            // over its kind's floor, when it reaches it (a kind without a
            // floor says nothing of it)
            let mut floored = sent.iter().copied().filter(|&h| about.floor[h].is_finite());
            let held = closest(&mut floored, &margin(&about.own));
            if let Some(h) = held.filter(|&h| about.own[h] >= about.floor[h]) {
                let (id, r) = (&chunks[h].id, about.own[h]);
                why.push_str(&format!("; it is about {id} (relevance {r:.3}), sent earlier"));
            }
            why
        }
        Some(_) if candidates == 0 => {
            "no unsent chunk the question is about ranks at or above the context's average for it".into()
        }
        Some(_) => {
            format!("no unseen chunk above the context's average relevance fits the reply's {budget} tokens")
        }
    })
}

/// Per chunk, how much the question is about it: the cosine of the
/// question with the chunk, and with its group's best chunk (a paragraph's
/// pronoun sentence counts as its paragraph does); and the floor of its
/// field's kind (`floor`).
pub(super) fn about(context: &PreparedContext, qvec: &[f32], floor: &dyn Fn(FieldKind) -> f32) -> About {
    let chunks = &context.chunks;
    let mut best: HashMap<(usize, usize), f32> = HashMap::new();
    let own: Vec<f32> = chunks.iter().map(|c| dot(qvec, &c.embedding)).collect();
    for (c, &r) in chunks.iter().zip(&own) {
        let b = best.entry(c.group).or_insert(f32::NEG_INFINITY);
        *b = b.max(r);
    }
    let group = chunks.iter().map(|c| best[&c.group]).collect();
    let kinds: Vec<f32> = context.field_kinds.iter().map(|&k| floor(k)).collect();
    About { own, group, floor: chunks.iter().map(|c| kinds[c.field]).collect() }
}

/// How much a follow-up's question is about each chunk ([`about`]).
pub(super) struct About {
    /// The question's cosine with the chunk.
    pub(super) own: Vec<f32>,
    /// With the chunk's group's best chunk: what the floor applies to.
    pub(super) group: Vec<f32>,
    /// The floor of the chunk's field's kind.
    pub(super) floor: Vec<f32>,
}
