//! One compression through the core: [`CompressInput`] in (built from the
//! engine's types by each surface's one conversion), [`CompressOutput`] out,
//! audited under the [`Call`]'s surface and method.

use scd_audit::{AuditChunk, AuditRecord, AuditTimings};
use scd_engine::budget::BudgetTokenizer;
use scd_engine::extract::{CompressOptions, CompressRequest, Compressed};
use scd_engine::handoff::Format;

use super::audit::{recorded_id, Outcome};
use super::{AppError, Call, Core, Result};

/// A checked compression request: the engine's request (task, context,
/// requirement, and the session when one is named or opened; its caller
/// and scope come from the [`Call`]) and how to run and show it.
#[derive(Debug)]
pub struct CompressInput {
    /// Task, context, requirement and session.
    pub request: CompressRequest,
    /// LLMLingua's rate instead of a token budget: the share of the
    /// context's tokens (in the budget tokenizer) to keep.
    pub rate: Option<f64>,
    /// The receiver's tokenizer the budget is counted in (`None`: the
    /// encoder's).
    pub budget_tokenizer: Option<BudgetTokenizer>,
    /// Say why each chunk was sent or dropped.
    pub explain: bool,
    /// Write the selection as a hand-off report in this format (the one
    /// report-format type, the engine's).
    pub render: Option<Format>,
    /// A forwarded report's `Answer:` line, kept verbatim in the rendered
    /// report (its sections are already among the context's fields).
    pub answer: Option<String>,
}

/// Where a compression's time went, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// Waiting for a compress slot.
    pub queue_ms: f64,
    /// Preparing the context and embedding the task.
    pub inference_ms: f64,
    /// Scoring and packing.
    pub selection_ms: f64,
    /// The whole call.
    pub total_ms: f64,
}

/// A compression as the core answers it.
#[derive(Debug)]
pub struct CompressOutput {
    /// The engine's result (its `text` is what the receiver pastes).
    pub compressed: Compressed,
    /// The rendered hand-off report, when one was asked for.
    pub report: Option<String>,
    /// Where the time went.
    pub timing: Timing,
}

/// What the audit trail records of a request before it is run (or refused):
/// its task, budget and session id.
#[derive(Debug, Clone, Default)]
pub struct AuditSeed {
    /// The task's description.
    pub task: Option<String>,
    /// The token budget asked for.
    pub budget_tokens: Option<u32>,
    /// The session id the request named.
    pub session_id: String,
}

impl AuditSeed {
    /// The seed of a checked input.
    pub fn of(input: &CompressInput) -> AuditSeed {
        let r = &input.request;
        AuditSeed {
            task: Some(r.task.description.clone()),
            budget_tokens: Some(u32::try_from(r.requirement.max_context_tokens).unwrap_or(u32::MAX)),
            session_id: r.session.as_ref().and_then(|s| s.id.clone()).unwrap_or_default(),
        }
    }

    fn fill(&self, rec: &mut AuditRecord) {
        if let Some(t) = &self.task {
            rec.set_task(t);
        }
        rec.budget_tokens = self.budget_tokens;
        rec.session_id = recorded_id(&self.session_id);
    }
}

/// Fills a record from a compression: chunks, withheld names, totals,
/// timings and the session (when the result carries one); a call that gave
/// `rate` instead of a budget records the budget the rate came to.
pub fn fill_from_output(rec: &mut AuditRecord, out: &CompressOutput, rate: Option<f64>) {
    let c = &out.compressed;
    rec.chunks = c
        .chunks
        .iter()
        .map(|k| AuditChunk { id: k.id.clone(), field: k.field.clone(), score: k.score, tokens: k.tokens as u32 })
        .collect();
    rec.chunk_count = c.chunks.len() as u32;
    rec.withheld = c.withheld.clone();
    let context_tokens = c.totals.context_tokens as u32;
    rec.context_tokens = u64::from(context_tokens);
    rec.selected_tokens = u64::from(c.totals.sent_tokens as u32);
    rec.reduction_ratio = c.totals.reduction_ratio;
    if let Some(id) = c.session.as_ref().and_then(|g| recorded_id(&g.id)) {
        rec.session_id = Some(id);
    }
    let t = out.timing;
    rec.timings = AuditTimings {
        queue_ms: t.queue_ms,
        inference_ms: t.inference_ms,
        selection_ms: t.selection_ms,
        total_ms: t.total_ms,
    };
    if let Some(rate) = rate {
        let budget = scd_engine::budget::rate_budget(context_tokens as usize, rate);
        rec.budget_tokens = Some(u32::try_from(budget).unwrap_or(u32::MAX));
    }
}

impl Core {
    /// Compresses `input` for `call`, recorded in the audit trail (when
    /// there is one) under the call's method before it answers.
    pub async fn compress(&self, call: &Call, input: CompressInput) -> Result<CompressOutput> {
        let seed = AuditSeed::of(&input);
        self.compress_seeded(call, seed, Ok(input)).await
    }

    /// [`Self::compress`] of an input a surface may have failed to convert
    /// (`Err`: the refusal, recorded with `seed` as the surface saw the
    /// request).
    pub async fn compress_seeded<E>(
        &self,
        call: &Call,
        seed: AuditSeed,
        input: std::result::Result<CompressInput, E>,
    ) -> std::result::Result<CompressOutput, E>
    where
        E: Outcome + From<AppError>,
    {
        let rate = input.as_ref().ok().and_then(|i| i.rate);
        let rec = self.begin_record(call, |rec| seed.fill(rec));
        let run = |input| self.compress_unaudited(call, input);
        self.audited(rec, input, run, |rec, out| fill_from_output(rec, out, rate)).await
    }

    /// Compresses `input` for `call` without an audit record of its own
    /// (a hand-off forward records the whole call).
    pub async fn compress_unaudited(&self, call: &Call, input: CompressInput) -> Result<CompressOutput> {
        let who = call.who();
        let CompressInput { mut request, rate, budget_tokenizer, explain, render, answer } = input;
        if let Some(s) = request.session.as_mut() {
            s.caller = call.caller.clone();
            s.scope = Some(who.clone());
        }
        let rendered = render.is_some();
        let envelope = render.map(|format| scd_engine::handoff::envelope(&request, format, answer));
        let opts = CompressOptions { budget_tokenizer, explain, envelope };
        let bytes = request.context.fields.iter().map(|f| f.content.len()).sum();
        let ((compressed, report), total) = self
            .blocking(&who, bytes, call.deadline, move |scd, cancel| {
                // a rate's budget: the share of the context in the budget tokenizer
                if let Some(rate) = rate {
                    request.requirement.max_context_tokens =
                        scd.rate_budget(&request.context, opts.budget_tokenizer.as_ref(), rate)?;
                }
                let out = scd.compress_opts(&request, &opts, cancel)?;
                let report = rendered.then(|| out.text.clone());
                Ok((out, report))
            })
            .await?;
        let t = compressed.timings;
        self.metrics.stage("Compress", "inference", t.prepare_ms + t.task_embed_ms);
        self.metrics.stage("Compress", "selection", t.select_ms);
        let timing = Timing {
            queue_ms: (total - t.prepare_ms - t.task_embed_ms - t.select_ms).max(0.0),
            inference_ms: t.prepare_ms + t.task_embed_ms,
            selection_ms: t.select_ms,
            total_ms: total,
        };
        Ok(CompressOutput { compressed, report, timing })
    }
}
