//! An adaptive request through the core (§6.3): more of a session's
//! context, answered from what the receiver has not been sent yet, audited
//! under the [`Call`]'s surface and method.

use scd_audit::{AuditChunk, AuditRecord, AuditTimings};
use scd_engine::extract::{ContextRequest, MoreContext};
use scd_engine::handoff::{self, confidence_value, ConfidenceMap};

use super::audit::{recorded_id, Outcome};
use super::compress::Timing;
use super::{ms, AppError, Call, Core, Result};

/// More context as the core answers it.
#[derive(Debug)]
pub struct MoreOutput {
    /// The engine's answer: the chunks, the text and the session's totals.
    pub more: MoreContext,
    /// Where the time went (selection and total only).
    pub timing: Timing,
}

/// What the audit trail records of an adaptive request before it is run
/// (or refused): its question and session id.
#[derive(Debug, Clone, Default)]
pub struct MoreSeed {
    /// The question as sent.
    pub question: String,
    /// The session id as sent.
    pub session_id: String,
}

fn invalid(field: &str, why: impl std::fmt::Display) -> AppError {
    AppError::invalid(format!("{field}: {why}"))
}

/// Fills an adaptive request from the receiver's own report: its confidence
/// becomes `current_confidence` (which must then be 0), its next step the
/// question and its summary the reasoning when those are empty.
pub fn apply_report(req: &mut ContextRequest, text: &str, map: &ConfidenceMap) -> Result<(), AppError> {
    if req.current_confidence != 0.0 {
        return Err(invalid(
            "current_confidence",
            format!(
                "{} given with a report; the report's confidence sets it (give one or the other)",
                req.current_confidence
            ),
        ));
    }
    let p = handoff::parse_auto(text);
    let Some(level) = p.report.confidence else {
        let why = match &p.why_not {
            Some(w) => format!("read as {} ({w})", p.format),
            None => format!("read as {}", p.format),
        };
        return Err(invalid(
            "report",
            format!(
                "states no confidence ({why}); send a semi_structured or structured_soft report, or current_confidence"
            ),
        ));
    };
    req.current_confidence = confidence_value(level, map);
    if req.specific_question.trim().is_empty() {
        if let Some(next) = p.report.next.filter(|n| !n.trim().is_empty()) {
            req.specific_question = next;
        }
    }
    if req.reasoning.trim().is_empty() {
        if let Some(summary) = p.report.summary {
            req.reasoning = summary;
        }
    }
    Ok(())
}

fn fill_from_more(rec: &mut AuditRecord, out: &MoreOutput) {
    let chunks = &out.more.chunks;
    rec.chunks = chunks
        .iter()
        .map(|c| AuditChunk { id: c.id.clone(), field: c.field.clone(), score: c.score, tokens: c.tokens as u32 })
        .collect();
    rec.chunk_count = chunks.len() as u32;
    rec.selected_tokens = chunks.iter().map(|c| u64::from(c.tokens as u32)).sum();
    let t = out.timing;
    rec.timings = AuditTimings {
        queue_ms: t.queue_ms,
        inference_ms: t.inference_ms,
        selection_ms: t.selection_ms,
        total_ms: t.total_ms,
    };
}

impl Core {
    /// More context for `call`'s session, recorded in the audit trail (when
    /// there is one) under the call's method before it answers; `input` is
    /// the surface's converted request, or its refusal (recorded with
    /// `seed`, the request as sent). The session's caller and scope are the
    /// call's.
    pub async fn request_more<E>(
        &self,
        call: &Call,
        seed: MoreSeed,
        input: std::result::Result<ContextRequest, E>,
    ) -> std::result::Result<MoreOutput, E>
    where
        E: Outcome + From<AppError>,
    {
        // the question may have come from a report's next step
        let question = input.as_ref().map_or(&seed.question, |req| &req.specific_question);
        let rec = self.begin_record(call, |rec| {
            rec.session_id = recorded_id(&seed.session_id);
            rec.set_task(question);
        });
        self.audited(rec, input, |req| self.more_unaudited(call, req), fill_from_more).await
    }

    async fn more_unaudited(&self, call: &Call, mut req: ContextRequest) -> Result<MoreOutput> {
        let who = call.who();
        req.caller = call.caller.clone();
        req.scope = Some(who.clone());
        let start = std::time::Instant::now();
        let (more, total) =
            self.blocking(&who, 0, call.deadline, move |scd, cancel| scd.request_more_with(&req, cancel)).await?;
        let timing = Timing { queue_ms: 0.0, inference_ms: 0.0, selection_ms: ms(start), total_ms: total };
        Ok(MoreOutput { more, timing })
    }
}
