//! One compression, stage by stage: the request checked ([`Checked`]), the
//! context prepared and scored for the task ([`Scored`]), the chunks that
//! may go judged ([`Gates`]), packed and fitted to the budget ([`Picked`]),
//! then the answer assembled, explained and recorded in its session.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use tracing::debug;

use super::assemble::{Gate, Sums};
use super::pack::{paragraph_limit, Costs, PackTrace};
use super::parts::Scores;
use super::prepare::{PreparedContext, Split};
use super::sessions::{Guard, Handle};
use super::{
    render, CompressOptions, CompressRequest, Compressed, Counting, Envelope, Ledger, Margin, Scd, SelectedChunk,
    SessionRequest,
};
use crate::cancel::Cancel;
use crate::context::ContextRequirement;
use crate::encoder::InputKind;
use crate::score::{dot, zscores};
use crate::session::SessionGrant;
use crate::{Error, Param, Result};

/// A request whose limits hold: its context split (confidential fields
/// apart), the public fields it must and may send, the task's text, and
/// the session it continues or opens.
struct Checked<'r> {
    split: Split<'r>,
    required: HashSet<usize>,
    optional: HashSet<usize>,
    task_text: String,
    continued: Option<Handle>,
    opening: Option<&'r SessionRequest>,
}

/// The context prepared and scored for the task, and the times it took.
struct Scored {
    prepared: Arc<PreparedContext>,
    task_vec: Arc<[f32]>,
    counting: Counting,
    context_tokens: usize,
    parts: Scores,
    /// The task's embedding.
    embed_ms: f64,
    /// The second hop (it embeds the task again).
    hop_ms: f64,
    /// When counting, scoring and selection began.
    select_start: Instant,
}

/// The selection: chunks in the order they were picked, how packing went,
/// the warnings, and the tokens of the text the receiver gets.
struct Picked {
    selected: Vec<usize>,
    trace: PackTrace,
    warnings: Vec<String>,
    sent_tokens: usize,
    /// The lines around each code piece ([`Scd::lines_around`]).
    around: usize,
}

/// Where each chunk stands before packing: the request's field lists and
/// thresholds against the scored context.
struct Gates<'a> {
    rq: &'a ContextRequirement,
    checked: &'a Checked<'a>,
    scored: &'a Scored,
    /// z-scores of the fused scores (`min_relative_score`'s scale).
    z: Vec<f32>,
}

impl Gates<'_> {
    fn field(&self, i: usize) -> usize {
        self.scored.prepared.chunks[i].field
    }

    fn required(&self, i: usize) -> bool {
        self.checked.required.contains(&self.field(i))
    }

    fn relevance(&self, i: usize) -> f32 {
        dot(&self.scored.task_vec, &self.scored.prepared.chunks[i].embedding)
    }

    fn below_relevance(&self, i: usize) -> bool {
        self.rq.relevance_threshold.is_some_and(|t| self.relevance(i) < t)
    }

    /// An optional chunk packing may consider (before `min_relative_score`).
    fn eligible(&self, i: usize, already: &HashSet<usize>) -> bool {
        let f = self.field(i);
        self.checked.optional.contains(&f)
            && !self.checked.required.contains(&f)
            && !self.below_relevance(i)
            && !already.contains(&i)
    }

    fn gate(&self, i: usize) -> Gate {
        if self.required(i) {
            Gate::Required
        } else if !self.checked.optional.contains(&self.field(i)) {
            Gate::NotEligible
        } else if self.below_relevance(i) {
            Gate::Below("relevance_threshold", self.relevance(i))
        } else if self.rq.min_relative_score.is_some_and(|t| self.z[i] < t) {
            Gate::Below("min_relative_score", self.z[i])
        } else {
            Gate::Candidate
        }
    }
}

/// What the receiver gets for `sel`: the envelope's text, or the chunks
/// rendered under their headers, each code piece with up to `around` lines
/// around it that the receiver does not hold (`held`).
fn wrap(scored: &Scored, envelope: &Option<Envelope>, sel: &[usize], held: &HashSet<usize>, around: usize) -> String {
    wrap_margins(scored, envelope, sel, held, around).0
}

/// [`wrap`], and the margins the rendered text holds ([`render::render_margins`]).
fn wrap_margins(
    scored: &Scored,
    envelope: &Option<Envelope>,
    sel: &[usize],
    held: &HashSet<usize>,
    around: usize,
) -> (String, Vec<render::FieldSpan>) {
    match envelope {
        Some(e) => {
            let mut sel = sel.to_vec();
            sel.sort_unstable();
            let scores = &scored.parts.fused;
            let picked: Vec<SelectedChunk> =
                sel.iter().map(|&i| scored.prepared.selected(i, scores[i], scored.counting.tokens[i])).collect();
            ((e.0)(&picked), Vec::new())
        }
        None => render::render_margins(&scored.prepared, sel, held, around),
    }
}

/// What this answer may send: the budget, less what an opening answer
/// reserves, cut to what a continued session's total leaves (with a warning
/// when that cuts it).
fn budget(rq: &ContextRequirement, opening: Option<&SessionRequest>, ledger: Option<&Ledger>) -> (usize, Vec<String>) {
    let budget = match (opening, ledger) {
        (Some(sr), _) => (rq.max_context_tokens - sr.reserve_tokens).min(sr.max_total_tokens.unwrap_or(usize::MAX)),
        (None, Some(l)) => rq.max_context_tokens.min(l.total_left()),
        (None, None) => rq.max_context_tokens,
    };
    let mut warnings = Vec::new();
    if budget < rq.max_context_tokens && opening.is_none() {
        warnings.push(format!("the session's total leaves {budget} of the {} tokens asked for", rq.max_context_tokens));
    }
    (budget, warnings)
}

impl Scd {
    /// One attempt at [`Scd::compress_opts`] (redone when another replica
    /// commits to the session first).
    pub(super) fn compress_once(
        &self,
        req: &CompressRequest,
        opts: &CompressOptions,
        cancel: &Cancel,
    ) -> Result<Compressed> {
        let checked = self.check(req)?;
        let t0 = Instant::now();
        let prepared = self.prepare(&checked.split.public, cancel)?;
        // a continued session's own lock, held to the end: what it already
        // sent is never sent again, and no concurrent request picks it too
        let mut ledger = match &checked.continued {
            Some(handle) => Some(self.continued_ledger(req, handle, &prepared, cancel)?),
            None => None,
        };
        let already: HashSet<usize> = ledger.as_ref().map(|l| l.sent.clone()).unwrap_or_default();
        let chunk_embed_ms = t0.elapsed().as_secs_f64() * 1e3;
        let scored = self.scored(&checked, prepared, opts, cancel)?;
        let rq = &req.requirement;
        let (budget, warnings) = budget(rq, checked.opening, ledger.as_deref());
        let gates = Gates { rq, checked: &checked, scored: &scored, z: zscores(&scored.parts.fused) };
        let picked = self.pick(&gates, &already, opts, budget, warnings, cancel)?;
        let select_ms = scored.select_start.elapsed().as_secs_f64() * 1e3 - scored.hop_ms;
        let embed_ms = scored.embed_ms + scored.hop_ms;

        let mut out = self.assemble(
            &scored.prepared,
            &picked.selected,
            &scored.parts,
            &scored.counting,
            Sums {
                context_tokens: scored.context_tokens,
                sent_tokens: Some(picked.sent_tokens),
                budget,
                already: &already,
            },
            &scored.task_vec,
            picked.warnings,
            (chunk_embed_ms, embed_ms, select_ms),
        );
        let (text, margins) = wrap_margins(&scored, &opts.envelope, &picked.selected, &already, picked.around);
        let names = &scored.prepared.field_names;
        out.margins = margins.into_iter().map(|(f, span)| Margin { field: names[f].clone(), span }).collect();
        out.text = text;
        out.timings.hop_embed_ms = scored.hop_ms;
        if opts.explain {
            let why =
                self.explain(&scored.prepared, &picked.selected, &scored.parts, &scored.counting, &picked.trace, |i| {
                    gates.gate(i)
                });
            out.explanation = Some(why);
        }
        let sent = out.totals.sent_tokens;
        out.session = self.record(req, &checked, ledger.as_mut(), scored, &picked.selected, sent)?;
        out.withheld = checked.split.withheld;
        drop(ledger);
        debug!(sent = out.totals.sent_tokens, ratio = out.totals.reduction_ratio, "compressed");
        Ok(out)
    }

    /// The request's limits, field lists, task and session checked before
    /// any work.
    fn check<'r>(&self, req: &'r CompressRequest) -> Result<Checked<'r>> {
        let ctx = &req.context;
        ctx.validate_within(&self.cfg.limits.context_limits)?;
        let rq = &req.requirement;
        rq.validate(self.cfg.limits.max_budget_tokens)?;
        req.task.validate(self.cfg.limits.max_task_bytes, self.cfg.limits.max_constraints)?;
        let split = Split::new(ctx);
        let names: HashMap<&str, usize> = split.public.iter().enumerate().map(|(i, f)| (f.name.as_str(), i)).collect();
        let required: HashSet<usize> =
            rq.required_fields.iter().map(|n| split.index(&names, n, Param::RequiredFields)).collect::<Result<_>>()?;
        let listed: HashSet<usize> =
            rq.optional_fields.iter().map(|n| split.index(&names, n, Param::OptionalFields)).collect::<Result<_>>()?;
        let optional = if rq.required_fields.is_empty() && rq.optional_fields.is_empty() {
            (0..split.public.len()).collect()
        } else {
            listed
        };
        let task_text = req.task.text();
        let task_tokens = self.encoder.count_tokens(&task_text)?;
        if task_tokens > self.cfg.limits.max_task_tokens {
            return Err(Error::invalid(
                "task",
                format!("{task_tokens} tokens, over the limit {}", self.cfg.limits.max_task_tokens),
            ));
        }
        let continued = match &req.session {
            Some(sr) => self.find_session(sr)?,
            None => None,
        };
        let opening = req.session.as_ref().filter(|_| continued.is_none());
        if let Some(sr) = opening {
            if sr.reserve_tokens >= rq.max_context_tokens {
                return Err(Error::invalid(
                    Param::ReserveTokens,
                    format!("{} is not below the budget {}", sr.reserve_tokens, rq.max_context_tokens),
                ));
            }
            if sr.max_total_tokens == Some(0) {
                return Err(Error::invalid("max_total_tokens", "must be at least 1 (leave it out for no total)"));
            }
        }
        Ok(Checked { split, required, optional, task_text, continued, opening })
    }

    /// The ledger of the session `req` continues, which must hold the same
    /// context.
    fn continued_ledger<'h>(
        &self,
        req: &CompressRequest,
        handle: &'h Handle,
        prepared: &Arc<PreparedContext>,
        cancel: &Cancel,
    ) -> Result<Guard<'h>> {
        if handle.context_key() != Some(prepared.key) {
            let id = req.session.as_ref().and_then(|s| s.id.clone()).unwrap_or_default();
            return Err(Error::SessionContextMismatch { session_id: id });
        }
        self.ledger(handle, Some(prepared.clone()), cancel)
    }

    /// The task embedded, the chunks counted in the budget tokenizer and
    /// scored (second hop and rescoring included).
    fn scored(
        &self,
        checked: &Checked<'_>,
        prepared: Arc<PreparedContext>,
        opts: &CompressOptions,
        cancel: &Cancel,
    ) -> Result<Scored> {
        let task_text = &checked.task_text;
        let t1 = Instant::now();
        let task_vec = self.embed_cached_with(&[task_text.as_str()], InputKind::Query, cancel)?.remove(0);
        let embed_ms = t1.elapsed().as_secs_f64() * 1e3;
        let select_start = Instant::now();
        cancel.check("count")?;
        let counting = self.counting(&prepared, opts.budget_tokenizer.clone())?;
        let context_tokens = match &counting.tokenizer {
            None => counting.tokens.iter().sum(),
            Some(t) => checked.split.public.iter().map(|f| t.count(&f.content)).sum::<Result<usize>>()?,
        };
        cancel.check("score")?;
        let mut parts = self.score(&prepared, &task_vec, task_text);
        // the second hop embeds the task again (with its bridge chunks): its
        // time is the task's embedding, not selection
        let t3 = Instant::now();
        self.second_hop(&prepared, task_text, &mut parts, cancel)?;
        self.rescore(&prepared, task_text, &mut parts);
        let hop_ms = t3.elapsed().as_secs_f64() * 1e3;
        // the second stage's model time is selection's (`select_ms`)
        self.rerank(&prepared, task_text, &mut parts, &|_| true, cancel)?;
        Ok(Scored { prepared, task_vec, counting, context_tokens, parts, embed_ms, hop_ms, select_start })
    }

    /// Required chunks first, then greedy packing by value
    /// ([`Self::pack_values`]: the score, adjusted for log and chat
    /// chunks), then the least
    /// valued dropped until the receiver's whole text fits `budget`.
    fn pick(
        &self,
        gates: &Gates<'_>,
        already: &HashSet<usize>,
        opts: &CompressOptions,
        budget: usize,
        mut warnings: Vec<String>,
        cancel: &Cancel,
    ) -> Result<Picked> {
        let (scored, rq) = (gates.scored, gates.rq);
        let (prepared, counting, scores) = (&scored.prepared, &scored.counting, &scored.parts.fused);
        let n = prepared.chunks.len();
        let mut around = self.lines_around(budget);
        // each chunk pays for one separator; n chunks need n - 1
        let sep = counting.separator;
        let cost: Vec<usize> = counting.tokens.iter().map(|t| t + sep).collect();
        // a piece's header: the plain text's (an envelope frames chunks its own way)
        let header_with = |around: usize| match opts.envelope {
            Some(_) => Ok(vec![0; n]),
            None => self.header_costs(prepared, counting, around),
        };
        let mut header = header_with(around)?;
        let room = budget + sep;
        let mut selected: Vec<usize> = (0..n).filter(|&i| gates.required(i) && !already.contains(&i)).collect();
        let needed_with = |header: &[usize]| {
            render::pieces(prepared, &selected).iter().map(|p| header[p[0]]).sum::<usize>()
                + selected.iter().map(|&i| cost[i]).sum::<usize>()
        };
        let mut needed = needed_with(&header);
        // the lines around code pieces never cost a required chunk its room
        if needed > room && around > 0 {
            (around, header) = (0, header_with(0)?);
            needed = needed_with(&header);
        }
        if needed > room {
            return Err(Error::BudgetTooSmall { needed: needed - sep, budget });
        }
        let mut used = needed;
        let mut order: Vec<usize> = (0..n).filter(|&i| gates.eligible(i, already)).collect();
        let candidates = order.len();
        order.retain(|&i| rq.min_relative_score.is_none_or(|t| gates.z[i] >= t));
        if candidates > 0 && order.is_empty() {
            warnings.push("no chunk passed the relevance threshold".to_string());
        }
        let value = self.pack_values(prepared, scores, &cost, &header);
        order.sort_by(|&a, &b| value[b].total_cmp(&value[a]));
        cancel.check("pack")?;
        let mut trace = PackTrace::default();
        // packed against what the receiver already holds: closure brings no
        // lead it has, nor a near-duplicate of one; those are then set aside
        // (built once: packing and the refill both see it ahead of the selection)
        let mut with_held: Vec<usize> = already.iter().copied().collect();
        with_held.sort_unstable();
        let n_held = with_held.len();
        with_held.append(&mut selected);
        let units = self.whole_units(prepared, &cost, room);
        let sc = &self.cfg.scoring;
        let paragraph = paragraph_limit(sc.group_closure_tokens, sc.group_closure_share, room);
        let costs = Costs { text: &cost, header: &header, score: &value, units: &units, paragraph };
        self.pack(prepared, &order, &costs, room, &mut with_held, &mut used, &mut trace);
        let mut selected = with_held.split_off(n_held);
        // what the receiver gets, counted whole (headers and wrapping
        // included): drop the weakest until it fits
        let text = |sel: &[usize]| wrap(scored, &opts.envelope, sel, already, around);
        let keep = |i: usize| gates.required(i);
        let fitted = self.fit(counting, &mut selected, &costs, keep, &text, budget, &mut trace)?;
        // what the fit freed (and what packing's estimate left) is refilled
        with_held.append(&mut selected);
        let refill_text = |sel: &[usize]| text(&sel[n_held..]);
        let sent_tokens =
            self.refill(counting, prepared, &mut with_held, &order, &costs, &refill_text, budget, fitted, &mut trace)?;
        let selected = with_held.split_off(n_held);
        Ok(Picked { selected, trace, warnings, sent_tokens, around })
    }

    /// The session after this answer: a continued one's ledger gains what
    /// was sent and is committed; an asked-for new one is opened holding it.
    fn record(
        &self,
        req: &CompressRequest,
        checked: &Checked<'_>,
        ledger: Option<&mut Guard<'_>>,
        scored: Scored,
        selected: &[usize],
        sent: usize,
    ) -> Result<Option<SessionGrant>> {
        let rq = &req.requirement;
        let Scored { prepared, counting, .. } = scored;
        Ok(match (&req.session, ledger) {
            (None, _) => None,
            (Some(sr), Some(l)) => {
                l.sent.extend(selected.iter().copied());
                l.total_sent += sent;
                l.counting = counting;
                // a later request: an older follow-up is no longer replayed
                l.last = None;
                self.commit(checked.continued.as_ref().expect("a ledger has its handle"), l)?;
                Some(SessionGrant {
                    id: sr.id.clone().unwrap_or_default(),
                    token: sr.token.clone().unwrap_or_default(),
                })
            }
            (Some(sr), None) => {
                let cap = sr.max_total_tokens.or((sr.reserve_tokens > 0).then_some(rq.max_context_tokens));
                Some(self.open_session(
                    sr,
                    &prepared,
                    &checked.split.public,
                    Ledger {
                        context: prepared.clone(),
                        sent: selected.iter().copied().collect(),
                        total_sent: sent,
                        cap,
                        reply_budget: rq.max_context_tokens,
                        counting,
                        last: None,
                    },
                )?)
            }
        })
    }
}
