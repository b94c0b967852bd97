//! The link to SCD ([`ScdLink`]): task embeddings, compress in a session,
//! adaptive requests, every error naming SCD's URL.

use std::time::Duration;

use scd_proto::scd::v1 as scd;
use scd_proto::scd::v1::scd_client::ScdClient;
use tonic::transport::Channel;
use tracing::{debug, instrument};

use super::convert::embedding_from_scd;
use super::convert::requirement_from_offer;
use super::convert::response_from_scd;
use super::convert::transfer_from_scd;
use super::session::ChunkRef;
use super::session::SessionHandle;
use super::session::Transfer;
use crate::{pb, Error, Result};
use scd_context::{Field, Task};

/// θ_conf (paper §6.3): a receiver at or above this confidence gets no more
/// context.
pub const THETA: f64 = 0.7;

/// How long [`ScdLink::connect`] waits for SCD to accept the connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest SCD reply accepted (a compress of a large context carries its
/// task embedding, chunks and stubs).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// SCD's gRPC client with the URL it reaches, named in every error.
#[derive(Clone)]
pub struct ScdLink {
    url: String,
    client: ScdClient<Channel>,
}

impl std::fmt::Debug for ScdLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScdLink").field("url", &self.url).finish()
    }
}

impl ScdLink {
    /// Connects to SCD at `url` (`http://host:port`), waiting at most
    /// [`CONNECT_TIMEOUT`]. Errors name the URL.
    pub async fn connect(url: &str) -> Result<Self> {
        if !url.starts_with("http://") {
            return Err(Error::Invalid {
                field: "scd_url".into(),
                reason: format!("{url:?} must start with http:// (this client speaks plaintext gRPC)"),
            });
        }
        let endpoint = Channel::from_shared(url.to_string())
            .map_err(|e| Error::Invalid { field: "scd_url".into(), reason: format!("{url:?} is not a URI: {e}") })?
            .connect_timeout(CONNECT_TIMEOUT);
        let channel = endpoint.connect().await.map_err(|source| Error::ScdConnect { url: url.to_string(), source })?;
        debug!(url, "connected to SCD");
        Ok(Self::from_channel(channel, url))
    }

    /// A link over an existing channel; `url` names it in errors.
    pub fn from_channel(channel: Channel, url: impl Into<String>) -> Self {
        Self { url: url.into(), client: ScdClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES) }
    }

    /// The SCD URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn status(&self, rpc: &'static str, status: tonic::Status) -> Error {
        Error::Scd { url: self.url.clone(), rpc, status: Box::new(status) }
    }

    /// SCD's model, dimension and limits.
    pub async fn info(&self) -> Result<scd::InfoResponse> {
        let mut c = self.client.clone();
        c.info(scd::InfoRequest {}).await.map(|r| r.into_inner()).map_err(|s| self.status("Info", s))
    }

    /// e_task: the task's embedding as a query, from the same text SCD's
    /// Compress embeds ([`Task::text`]); like Compress, a task over the
    /// model's input length is refused rather than embedded in windows.
    #[instrument(skip_all, fields(url = %self.url))]
    pub async fn embed_task(&self, task: &Task) -> Result<pb::Embedding> {
        let text = task.text();
        if text.is_empty() {
            return Err(Error::Invalid { field: "task.description".into(), reason: "must not be empty".into() });
        }
        let mut c = self.client.clone();
        let resp = c
            .embed(scd::EmbedRequest { texts: vec![text], kind: scd::InputKind::Query as i32, windows: false })
            .await
            .map_err(|s| self.status("Embed", s))?
            .into_inner();
        match resp.embeddings.as_slice() {
            [e] => Ok(embedding_from_scd(&e.values)),
            other => Err(Error::ScdReply { rpc: "Embed", reason: format!("{} embeddings for one text", other.len()) }),
        }
    }

    /// Minimal sufficient context of `fields` for `task` under the receiver's
    /// `requirement`, in a new SCD session with a server-chosen id (so the
    /// receiver can ask for more). Confidential fields are withheld by SCD
    /// and checked here ([`transfer_from_scd`]).
    #[instrument(skip_all, fields(url = %self.url, fields = fields.len(), budget = requirement.max_context_tokens))]
    pub async fn compress(
        &self,
        task: &Task,
        fields: &[Field],
        requirement: &pb::ContextRequirement,
    ) -> Result<Transfer> {
        let req = requirement_from_offer(requirement)?;
        let compress = scd::CompressRequest {
            task: Some(scd::Task::from(task)),
            fields: fields.iter().map(scd::Field::from).collect(),
            requirement: Some(req),
            session_id: String::new(),
            session_token: String::new(),
            // ATP carries context, not hand-off reports
            render: scd::ReportFormat::Unspecified as i32,
            // the offer's budget is the receiver's whole window: the first
            // transfer and every adaptive request share it
            session_max_total_tokens: requirement.max_context_tokens,
            ..Default::default()
        };
        let mut c = self.client.clone();
        let open = c
            .open_session(scd::OpenSessionRequest { compress: Some(compress) })
            .await
            .map_err(|s| self.status("OpenSession", s))?
            .into_inner();
        let (Some(mut result), false) = (open.result, open.session_id.is_empty()) else {
            return Err(Error::ScdReply { rpc: "OpenSession", reason: "no result or no session id".into() });
        };
        result.session_id = open.session_id;
        match transfer_from_scd(&result, fields, requirement.max_context_tokens, &open.session_token) {
            Ok(t) => {
                debug!(full = t.full_tokens, sent = t.sent_tokens, stubs = t.diff.dropped.len(), "context transfer");
                Ok(t)
            }
            Err(e) => {
                // do not leave a session behind that nobody will use
                let _ = c
                    .close_session(scd::CloseSessionRequest {
                        session_id: result.session_id,
                        session_token: open.session_token,
                    })
                    .await;
                Err(e)
            }
        }
    }

    /// Adaptive context request (paper §6.3): below [`THETA`], the next
    /// unseen chunks for `question`, the ones named in `wanted` first (an
    /// index is a stub's index in the diff). At or above θ nothing is sent
    /// and the reason says why; SCD is not asked.
    pub async fn request_more(
        &self,
        session: &SessionHandle,
        question: &str,
        current_confidence: f64,
        wanted: &[ChunkRef],
    ) -> Result<pb::ContextResponse> {
        self.more(session, question, "", current_confidence, wanted).await
    }

    /// Answers a worker's `atp.v1.ContextRequest` ([`ScdLink::request_more`]
    /// with its question, reasoning, indices and ids); the reply carries the
    /// request's `task_id`. `from`, nonce and signature are the caller's.
    pub async fn answer(&self, session: &SessionHandle, req: &pb::ContextRequest) -> Result<pb::ContextResponse> {
        let wanted: Vec<ChunkRef> = req
            .requested_chunk_indices
            .iter()
            .map(|&i| ChunkRef::Index(i))
            .chain(req.requested_chunk_ids.iter().map(|id| ChunkRef::Id(id.clone())))
            .collect();
        let mut resp =
            self.more(session, &req.specific_question, &req.reasoning, req.current_confidence, &wanted).await?;
        resp.task_id = req.task_id.clone();
        Ok(resp)
    }

    #[instrument(skip_all, fields(url = %self.url, session = %session.id, confidence = current_confidence))]
    async fn more(
        &self,
        session: &SessionHandle,
        question: &str,
        reasoning: &str,
        current_confidence: f64,
        wanted: &[ChunkRef],
    ) -> Result<pb::ContextResponse> {
        if !current_confidence.is_finite() || !(0.0..=1.0).contains(&current_confidence) {
            return Err(Error::Invalid {
                field: "current_confidence".into(),
                reason: format!("must be in [0, 1], got {current_confidence}"),
            });
        }
        if current_confidence >= THETA {
            return Ok(pb::ContextResponse {
                reason: format!("confidence {current_confidence} is at or above θ = {THETA}; no context sent"),
                remaining_tokens: session.remaining_tokens(),
                ..Default::default()
            });
        }
        let mut chunk_ids = Vec::with_capacity(wanted.len());
        for w in wanted {
            match w {
                ChunkRef::Id(id) => chunk_ids.push(id.clone()),
                ChunkRef::Index(i) => match session.chunk_id(*i) {
                    Some(id) => chunk_ids.push(id.to_string()),
                    None => {
                        return Err(Error::Invalid {
                            field: "requested_chunk_indices".into(),
                            reason: format!("index {i} is not in the transfer (it has {} chunks)", session.ids.len()),
                        })
                    }
                },
            }
        }
        if question.trim().is_empty() && chunk_ids.is_empty() {
            return Err(Error::Invalid {
                field: "specific_question".into(),
                reason: "must not be empty (or name chunks by index or id)".into(),
            });
        }
        let mut c = self.client.clone();
        let resp = c
            .request_context(scd::ContextRequest {
                session_id: session.id.clone(),
                specific_question: question.to_string(),
                current_confidence: current_confidence as f32,
                reasoning: reasoning.to_string(),
                chunk_ids,
                session_token: session.token.clone(),
                report: String::new(),
                // the session's total bounds it (the offer's budget)
                max_tokens: 0,
                // no retry here: a failed call is the worker's to report
                request_id: String::new(),
            })
            .await
            .map_err(|s| self.status("RequestContext", s))?
            .into_inner();
        let out = response_from_scd(&resp, session)?;
        debug!(chunks = out.chunks.len(), remaining = out.remaining_tokens, "adaptive context");
        Ok(out)
    }

    /// Closes the session; `false` when SCD had no such session open (it
    /// expired).
    pub async fn close(&self, session: &SessionHandle) -> Result<bool> {
        let mut c = self.client.clone();
        let resp = c
            .close_session(scd::CloseSessionRequest {
                session_id: session.id.clone(),
                session_token: session.token.clone(),
            })
            .await
            .map_err(|s| self.status("CloseSession", s))?
            .into_inner();
        Ok(resp.closed)
    }
}
