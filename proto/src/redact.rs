//! `Debug` for the wire messages that carry content or secrets: sizes and
//! names, never text or tokens, so a logged request leaks nothing.

use std::fmt::{Debug, Formatter, Result};

use crate::atp::v1 as atp;
use crate::scd::v1 as pb;
use crate::Redacted;

fn secret(s: &str) -> &'static str {
    if s.is_empty() {
        "<none>"
    } else {
        "<secret>"
    }
}

impl Debug for pb::Field {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("Field")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("content", &Redacted(self.content.len()))
            .field("confidential", &self.confidential)
            .finish()
    }
}

impl Debug for pb::Task {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("Task")
            .field("description", &Redacted(self.description.len()))
            .field("constraints", &self.constraints.len())
            .field("output_schema", &Redacted(self.output_schema.len()))
            .finish()
    }
}

impl Debug for pb::CompressRequest {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("CompressRequest")
            .field("task", &self.task)
            .field("fields", &self.fields)
            .field("requirement", &self.requirement)
            .field("session_id", &self.session_id)
            .field("session_token", &secret(&self.session_token))
            .finish()
    }
}

impl Debug for pb::CompressResponse {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        let ids: Vec<&str> = self.chunks.iter().map(|c| c.id.as_str()).collect();
        f.debug_struct("CompressResponse")
            .field("chunks", &ids)
            .field("totals", &self.totals)
            .field("dropped", &self.dropped.len())
            .field("warnings", &self.warnings)
            .field("withheld_fields", &self.withheld_fields)
            .field("session_id", &self.session_id)
            .field("session_token", &secret(&self.session_token))
            .field("timing", &self.timing)
            .finish()
    }
}

impl Debug for pb::ContextRequest {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("ContextRequest")
            .field("session_id", &self.session_id)
            .field("session_token", &secret(&self.session_token))
            .field("specific_question", &Redacted(self.specific_question.len()))
            .field("current_confidence", &self.current_confidence)
            .field("reasoning", &Redacted(self.reasoning.len()))
            .field("chunk_ids", &self.chunk_ids)
            .finish()
    }
}

impl Debug for pb::EmbedRequest {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        let sizes: Vec<Redacted> = self.texts.iter().map(|t| Redacted(t.len())).collect();
        f.debug_struct("EmbedRequest")
            .field("texts", &sizes)
            .field("kind", &self.kind)
            .field("windows", &self.windows)
            .finish()
    }
}

impl Debug for pb::CountTokensRequest {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        let sizes: Vec<Redacted> = self.texts.iter().map(|t| Redacted(t.len())).collect();
        f.debug_struct("CountTokensRequest").field("texts", &sizes).finish()
    }
}

impl Debug for pb::CloseSessionRequest {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("CloseSessionRequest")
            .field("session_id", &self.session_id)
            .field("session_token", &secret(&self.session_token))
            .finish()
    }
}

impl Debug for pb::OpenSessionResponse {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("OpenSessionResponse")
            .field("session_id", &self.session_id)
            .field("session_token", &secret(&self.session_token))
            .field("result", &self.result)
            .finish()
    }
}

impl Debug for atp::ContextChunk {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("ContextChunk")
            .field("index", &self.index)
            .field("chunk_id", &self.chunk_id)
            .field("data", &Redacted(self.data.len()))
            .field("relevance_score", &self.relevance_score)
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl Debug for atp::TaskCheckpoint {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("TaskCheckpoint")
            .field("task_id", &self.task_id)
            .field("agent", &self.agent)
            .field("step_number", &self.step_number)
            .field("intermediate_state", &Redacted(self.intermediate_state.len()))
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl Debug for atp::TaskSubmit {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("TaskSubmit")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("task_id", &self.task_id)
            .field("task_type", &self.task_type)
            .field("payload", &Redacted(self.payload.len()))
            .field("context", &self.context)
            .field("contract_id", &self.contract_id)
            .field("resume_from", &self.resume_from)
            .finish_non_exhaustive()
    }
}

impl Debug for atp::TaskResult {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        f.debug_struct("TaskResult")
            .field("from", &self.from)
            .field("task_id", &self.task_id)
            .field("status", &self.status)
            .field("payload", &Redacted(self.payload.len()))
            .field("checkpoint", &self.checkpoint)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_requests_print_sizes_not_content() {
        let req = pb::OpenSessionResponse {
            session_id: "s-1".into(),
            session_token: "TOKEN-SECRET".into(),
            result: Some(pb::CompressResponse {
                chunks: vec![pb::Chunk { id: "a#0".into(), text: "CHUNK-TEXT".into(), ..Default::default() }],
                session_token: "TOKEN-SECRET".into(),
                ..Default::default()
            }),
        };
        let c = pb::CompressRequest {
            task: Some(pb::Task { description: "TASK-TEXT".into(), ..Default::default() }),
            fields: vec![pb::Field { name: "keys".into(), content: "FIELD-TEXT".into(), confidential: true, kind: 6 }],
            session_token: "TOKEN-SECRET".into(),
            ..Default::default()
        };
        let q = pb::ContextRequest { specific_question: "QUESTION-TEXT".into(), ..Default::default() };
        let e = pb::EmbedRequest { texts: vec!["EMBED-TEXT".into()], ..Default::default() };
        let t = pb::CountTokensRequest { texts: vec!["COUNT-TEXT".into()], ..Default::default() };
        let logged = format!("{req:?} {c:#?} {q:?} {e:?} {t:?}");
        for s in ["TOKEN-SECRET", "CHUNK-TEXT", "TASK-TEXT", "FIELD-TEXT", "QUESTION-TEXT", "EMBED-TEXT", "COUNT-TEXT"]
        {
            assert!(!logged.contains(s), "{s} in {logged}");
        }
        assert!(logged.contains("keys") && logged.contains("a#0") && logged.contains("<10 bytes>"), "{logged}");
    }

    #[test]
    fn atp_payloads_print_sizes_not_content() {
        let chunk = atp::ContextChunk { chunk_id: "a#0".into(), data: b"CHUNK-TEXT".to_vec(), ..Default::default() };
        let task = atp::TaskSubmit {
            payload: b"PAYLOAD-TEXT".to_vec(),
            context: Some(atp::ContextDiff { chunks: vec![chunk], ..Default::default() }),
            resume_from: Some(atp::TaskCheckpoint { intermediate_state: b"STATE-TEXT".to_vec(), ..Default::default() }),
            ..Default::default()
        };
        let result = atp::TaskResult { payload: b"RESULT-TEXT".to_vec(), ..Default::default() };
        let logged = format!("{task:?} {result:#?}");
        for s in ["CHUNK-TEXT", "PAYLOAD-TEXT", "STATE-TEXT", "RESULT-TEXT"] {
            assert!(!logged.contains(s), "{s} in {logged}");
        }
        assert!(logged.contains("a#0") && logged.contains("<12 bytes>"), "{logged}");
    }
}
