//! Adaptive context requests (paper §6.3): the next chunks a receiver has
//! not seen, for its specific question, under the budget it has left.

use std::collections::HashMap;

use tracing::instrument;

use super::{ContextRequest, MoreContext, Scd, MAX_CHUNK_IDS};
use crate::cancel::Cancel;
use crate::context::check_no_nul;
use crate::encoder::InputKind;
use crate::{Error, Result};

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
        if !(0.0..=1.0).contains(&req.current_confidence) {
            return Err(Error::invalid(
                "current_confidence",
                format!("must be in [0, 1], got {}", req.current_confidence),
            ));
        }
        check_no_nul(|| "specific_question".into(), &req.specific_question)?;
        check_no_nul(|| "reasoning".into(), &req.reasoning)?;
        let query = format!("{} {}", req.specific_question, req.reasoning);
        if query.len() > self.cfg.max_task_bytes {
            return Err(Error::invalid(
                "specific_question",
                format!("{} bytes with the reasoning, over the limit {}", query.len(), self.cfg.max_task_bytes),
            ));
        }
        let entry = self.sessions.get(&req.session_id, &req.session_token, req.caller.as_deref())?;
        // this session's own lock, held through scoring: concurrent requests
        // on one session take turns, so none can pick a chunk another sends
        let mut session = entry.lock();
        if req.current_confidence >= self.cfg.confidence_threshold {
            return Ok(MoreContext {
                chunks: vec![],
                remaining_tokens: session.remaining,
                reason: Some(format!(
                    "confidence {} is at or above the threshold {}; no context sent",
                    req.current_confidence, self.cfg.confidence_threshold
                )),
            });
        }
        let context = session.context.clone();
        let counting = session.counting.clone();
        let chunks = &context.chunks;
        // each new chunk pays for the separator before it, in the session's
        // budget tokenizer
        let cost = |i: usize| counting.tokens[i] + counting.separator;
        let qvec = self.embed_cached_with(&[query.trim()], InputKind::Query, cancel)?.remove(0);
        cancel.check("score")?;
        let scores = self.score(&context, &qvec, &query).fused;
        let mut picked = Vec::new();
        let mut reason = None;
        // explicit ids first, then by relevance
        let mut order: Vec<usize> = Vec::new();
        if req.chunk_ids.len() > MAX_CHUNK_IDS {
            return Err(Error::invalid(
                "chunk_ids",
                format!("{} ids, over the limit {MAX_CHUNK_IDS}", req.chunk_ids.len()),
            ));
        }
        let by_id: HashMap<&str, usize> = chunks.iter().enumerate().map(|(i, c)| (c.id.as_str(), i)).collect();
        for id in &req.chunk_ids {
            match by_id.get(id.as_str()).copied() {
                Some(i) => order.push(i),
                None => return Err(Error::invalid("chunk_ids", format!("unknown chunk id {id:?}"))),
            }
        }
        if req.specific_question.trim().is_empty() && order.is_empty() {
            return Err(Error::invalid("specific_question", "must not be empty (or name chunk_ids)"));
        }
        let mut ranked: Vec<usize> = (0..chunks.len()).collect();
        ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        let explicit = order.len();
        order.extend(ranked);
        let mut used = 0;
        for (n, &i) in order.iter().enumerate() {
            // by relevance, a container's header or closing line is no answer
            if session.sent.contains(&i) || picked.contains(&i) || (n >= explicit && chunks[i].rides) {
                continue;
            }
            if used + cost(i) > session.remaining {
                if n < explicit {
                    reason = Some(format!(
                        "chunk {} needs {} tokens, {} left",
                        chunks[i].id,
                        cost(i),
                        session.remaining - used
                    ));
                }
                continue;
            }
            // beyond explicit ids, stop at chunks scoring below the context's average
            if n >= explicit && scores[i] < 0.0 && !picked.is_empty() {
                break;
            }
            picked.push(i);
            used += cost(i);
            if n >= explicit && picked.len() >= explicit + self.cfg.more_max_chunks {
                break;
            }
        }
        // counted whole (a separator before each), drop the last taken until it fits
        if counting.tokenizer.is_some() {
            loop {
                let mut reading = picked.clone();
                reading.sort_unstable();
                let mut texts: Vec<&str> = vec![""];
                texts.extend(reading.iter().map(|&i| chunks[i].text.as_str()));
                let n = if picked.is_empty() { 0 } else { counting.joined(&texts)? };
                if n <= session.remaining {
                    used = n;
                    break;
                }
                picked.pop();
            }
        }
        session.sent.extend(picked.iter().copied());
        session.remaining -= used;
        if picked.is_empty() && reason.is_none() {
            reason = Some("no unseen chunk fits the remaining budget".into());
        }
        picked.sort_unstable();
        Ok(MoreContext {
            chunks: picked.iter().map(|&i| context.selected(i, scores[i], counting.tokens[i])).collect(),
            remaining_tokens: session.remaining,
            reason,
        })
    }
}
