//! A2A v1.0: SCD as a remote agent on the HTTP listener (`--http-addr`),
//! beside `/metrics`.
//!
//! - `GET /.well-known/agent-card.json`: the agent card (public, also under
//!   `--auth did-wba`), skills `compress-context` and `more-context`.
//! - `POST /`: JSON-RPC 2.0 ([`jsonrpc`]): `SendMessage`,
//!   `SendStreamingMessage` (SSE), `GetTask`, `ListTasks`, `CancelTask`,
//!   `SubscribeToTask`.
//! - The HTTP+JSON binding ([`rest`]): `POST /message:send`,
//!   `POST /message:stream`, `GET /tasks`, `GET /tasks/{id}`,
//!   `POST /tasks/{id}:cancel`, `GET /tasks/{id}:subscribe`.
//!
//! A message whose data part is `{task, context: {fields}, budget,
//! required?, optional?, threshold?, min_relative_score?, render?}` runs
//! Compress and completes its task with an artifact: a data part (chunks,
//! totals, dropped manifest, withheld field names) and a text part (the
//! selection, or the hand-off report when `render` is given). It opens an
//! SCD session for the task's `contextId`; the session token stays on the
//! server. A text part alone on that context is a question
//! (RequestContext: `specific_question`; `metadata.currentConfidence`, or a
//! hand-off report's confidence): the next task of the context answers with
//! the chunks the receiver does not have yet.
//!
//! States: a message's task is `SUBMITTED`, then `WORKING` while the engine
//! runs, then `COMPLETED` (artifact), `REJECTED` (input the engine refuses)
//! or `FAILED`; `CANCELED` by the client. A text part on a context that has
//! never compressed stays `WORKING` with a status message asking for the
//! context (this text is then the task: send the data part in its taskId).
//! A text part on a context whose SCD session expired or was evicted goes
//! `INPUT_REQUIRED` ("the context's session expired; send the context
//! again"): a data part in that taskId compresses and completes it. When
//! the engine is at capacity the message is answered `-32000` (HTTP 429)
//! with `retryAfterMs` and not kept.
//!
//! Tasks live in a bounded [`store`] (`--a2a-max-tasks`, `--a2a-max-bytes`,
//! `--a2a-task-ttl-s`, each caller a share of them:
//! `--a2a-max-tasks-per-caller`, `--a2a-max-bytes-per-caller`); terminal
//! states never change.
//!
//! Who sees what: tasks and contexts belong to their caller ([`Caller`]):
//! its DID under `--auth did-wba`, else its IP address (not the port: each
//! HTTP/1.1 request may come on a new connection). Another caller's task is
//! not found (GetTask, CancelTask, SubscribeToTask, ListTasks, a message in
//! its taskId), and a contextId another caller uses is, for this one, a new
//! context of its own: it reaches none of the other's session and learns
//! nothing of whether it exists. Without auth, clients on one host (one
//! address) are one caller and share a view; run `--auth did-wba` to tell
//! them apart.
//!
//! ```text
//! curl -s localhost:9090/ -d '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":
//!   {"messageId":"m1","role":"ROLE_USER","parts":[{"data":{"task":"fix checkout",
//!   "context":{"fields":[{"name":"logs","kind":"log","content":"..."}]},"budget":200}}]}}}'
//! ```

mod error;
mod input;
pub mod jsonrpc;
pub mod rest;
pub mod store;
pub mod types;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::{json, Value};
use tracing::debug;

use scd_engine::extract::ContextRequest;

use crate::app::json;
use crate::app::more::{apply_report, MoreSeed};
use crate::app::{AppError, Call, Core};
pub(crate) use input::CompressInput;
use store::{Session, Store, StoreLimits};
use types::{Artifact, Message, Part, Role, SendMessageRequest, Task, TaskState};

pub use error::Error;

/// The protocol version served.
pub const PROTOCOL_VERSION: &str = "1.0";

/// A2A settings (`scd serve --a2a-*`).
#[derive(Debug, Clone)]
pub struct A2aConfig {
    /// Task store bounds.
    pub store: StoreLimits,
    /// The shared store (`--state`): tasks and contexts in Redis, served
    /// by every replica on it; `None` keeps them in this process.
    pub state: Option<Arc<crate::redis::tasks::RedisTasks>>,
    /// Largest request body (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// The gRPC listener, listed in the card as SCD's own binding (on the
    /// card's host).
    pub grpc_addr: std::net::SocketAddr,
    /// `http` or `https` (TLS) for the gRPC listener.
    pub grpc_scheme: &'static str,
    /// `--auth did-wba` is on (the card declares the DIDWba scheme).
    pub did_wba: bool,
    /// The URL clients reach the HTTP listener at (`--a2a-public-url`);
    /// `None`: [`A2aConfig::http_scheme`] and [`A2aConfig::http_addr`] (never the request's
    /// Host header, which the client chooses).
    pub public_url: Option<String>,
    /// The HTTP listener's own address, the card's URLs without
    /// `public_url`.
    pub http_addr: SocketAddr,
    /// `http` or `https` (TLS) for the HTTP listener.
    pub http_scheme: &'static str,
}

impl A2aConfig {
    /// The base of the card's URLs: `--a2a-public-url`, else the HTTP
    /// listener's scheme and address.
    ///
    /// A loopback or unspecified (`0.0.0.0`, `[::]`) listener is named
    /// `localhost`: a card never lists an internal address (the A2A
    /// conformance kit's sensitive-information check), and a listener on
    /// every interface should set `--a2a-public-url` (`scd serve` warns).
    pub fn base_url(&self) -> String {
        match &self.public_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None if self.http_addr.ip().is_loopback() || self.http_addr.ip().is_unspecified() => {
                format!("{}://localhost:{}", self.http_scheme, self.http_addr.port())
            }
            None => format!("{}://{}", self.http_scheme, self.http_addr),
        }
    }
}

pub use crate::http::Caller;

/// The agent: the task store over the in-process [`Core`].
pub struct Agent {
    svc: Arc<Core>,
    store: Store,
    cfg: A2aConfig,
}

/// What a message asks for.
pub(crate) enum Input {
    Compress(Box<CompressInput>),
    Question { text: String, confidence: Option<f32> },
}

/// Longest client-chosen id (`messageId`, `contextId`, `taskId`,
/// `referenceTaskIds`), in bytes.
pub const MAX_ID_BYTES: usize = 256;

fn check_id(field: &str, id: &str) -> Result<(), Error> {
    if id.len() > MAX_ID_BYTES {
        return Err(Error::InvalidParams(format!("{field}: {} bytes, the limit is {MAX_ID_BYTES}", id.len())));
    }
    Ok(())
}

/// Reads `message` into what it asks for; errors name the JSON path.
pub(crate) fn classify(m: &Message) -> Result<Input, Error> {
    if m.message_id.is_empty() {
        return Err(Error::InvalidParams("message.messageId: must not be empty".into()));
    }
    check_id("message.messageId", &m.message_id)?;
    check_id("message.contextId", m.context_id.as_deref().unwrap_or(""))?;
    check_id("message.taskId", m.task_id.as_deref().unwrap_or(""))?;
    for (i, r) in m.reference_task_ids.iter().enumerate() {
        check_id(&format!("message.referenceTaskIds[{i}]"), r)?;
    }
    if m.role != Role::User {
        return Err(Error::InvalidParams("message.role: must be ROLE_USER".into()));
    }
    if m.parts.is_empty() {
        return Err(Error::InvalidParams("message.parts: must not be empty".into()));
    }
    let mut data = None;
    let mut texts = Vec::new();
    for (i, p) in m.parts.iter().enumerate() {
        if p.contents() != 1 {
            return Err(Error::InvalidParams(format!(
                "message.parts[{i}]: exactly one of text, raw, url or data, got {}",
                p.contents()
            )));
        }
        if p.raw.is_some() || p.url.is_some() {
            return Err(Error::ContentType(format!(
                "message.parts[{i}]: files are not accepted; send a data part {{task, context, budget}} or a text question"
            )));
        }
        if let Some(d) = &p.data {
            if data.is_some() {
                return Err(Error::InvalidParams(format!("message.parts[{i}]: one data part per message")));
            }
            if let Some(hint) = d.get("context").and_then(scd_engine::context::Context::mistaken_shape) {
                return Err(Error::InvalidParams(format!("message.parts[{i}].data.context: {hint}")));
            }
            let input: CompressInput = serde_path_to_error::deserialize(d.clone()).map_err(|e| {
                let path = crate::input::shown_path(e.path());
                let at = if path == "." { String::new() } else { format!(".{path}") };
                Error::InvalidParams(format!(
                    "message.parts[{i}].data{at}: {} (expected {{task, context: {{fields}}, budget or rate, required?, optional?, threshold?, min_relative_score?, render?, budget_tokenizer?, reserve?, list_dropped?}})",
                    crate::input::redact_json_error(&e.into_inner().to_string())
                ))
            })?;
            input.check_budget().map_err(|e| Error::InvalidParams(format!("message.parts[{i}].data.{e}")))?;
            data = Some(input);
        }
        if let Some(t) = &p.text {
            texts.push(t.as_str());
        }
    }
    if let Some(d) = data {
        return Ok(Input::Compress(Box::new(d)));
    }
    let text = texts.join("\n");
    if text.trim().is_empty() {
        return Err(Error::InvalidParams("message.parts: the text is empty".into()));
    }
    let confidence = match m.metadata.as_ref().and_then(|md| md.get("currentConfidence")) {
        None => None,
        Some(v) => match v.as_f64() {
            Some(c) if (0.0..=1.0).contains(&c) => Some(c as f32),
            _ => {
                return Err(Error::InvalidParams(format!(
                    "message.metadata.currentConfidence: must be a number in [0, 1], got {v}"
                )))
            }
        },
    };
    Ok(Input::Question { text, confidence })
}

/// The message as the task's history keeps it: a compress data part's
/// context is summarized (each field's name, kind, confidential flag and
/// `contentBytes`; no content, so no confidential content is ever sent
/// back and a task does not hold a whole context); the other keys (task,
/// budget, ...) and text parts are kept as sent.
fn summarized(m: &Message) -> Message {
    let mut m = m.clone();
    for p in &mut m.parts {
        let fields = p.data.as_mut().and_then(|d| d.pointer_mut("/context/fields")).and_then(Value::as_array_mut);
        let Some(fields) = fields else { continue };
        for f in fields.iter_mut() {
            if let Some(f) = f.as_object_mut() {
                let bytes = f.remove("content").as_ref().and_then(Value::as_str).map_or(0, str::len);
                f.insert("contentBytes".into(), json!(bytes));
            }
        }
        p.metadata.get_or_insert_with(Default::default).insert(
            "scdContextSummary".into(),
            json!("the context's content is not kept in history: each field has its contentBytes"),
        );
    }
    m
}

/// How an engine error ends a task: bad input rejects it, overload and the
/// rest fail it.
fn failed_state(e: &AppError) -> TaskState {
    match e {
        AppError::InvalidArgument { .. }
        | AppError::FailedPrecondition { .. }
        | AppError::NotFound { .. }
        | AppError::PermissionDenied { .. } => TaskState::Rejected,
        _ => TaskState::Failed,
    }
}

/// The core's call of `method` for an A2A message from `who`: a compress
/// message opens a session (`A2A OpenSession` in the audit trail), a
/// question asks it for more (`A2A RequestContext`). Its deadline is the
/// SendMessage request's ([`Caller::deadline`]), a run the client does not
/// wait for (streaming, `returnImmediately`) included: a task's run is that
/// call's work, bounded by the server's limit on a call.
fn a2a_call(method: &str, who: &Caller) -> Call {
    who.call("A2A", method)
}

/// What one run of the engine produced.
struct Outcome {
    state: TaskState,
    note: String,
    artifact: Option<Artifact>,
    /// The engine was at capacity: the task is taken back (see
    /// [`Agent::run`]), not failed.
    busy: Option<Error>,
}

impl Outcome {
    fn done(state: TaskState, note: String, artifact: Option<Artifact>) -> Self {
        Self { state, note, artifact, busy: None }
    }

    /// An engine error: overload is answered as such, the rest ends the task.
    fn engine_error(e: &AppError) -> Self {
        if let AppError::ResourceExhausted { .. } = e {
            let busy = Error::overloaded(e);
            return Self { state: TaskState::Failed, note: busy.to_string(), artifact: None, busy: Some(busy) };
        }
        Self::done(failed_state(e), e.message().to_string(), None)
    }
}

impl Agent {
    /// An agent over `svc`.
    pub fn new(svc: Arc<Core>, cfg: A2aConfig) -> Self {
        let store = match &cfg.state {
            Some(redis) => Store::shared(cfg.store, redis.clone()),
            None => Store::new(cfg.store),
        };
        Self { store, svc, cfg }
    }

    /// The settings.
    pub fn config(&self) -> &A2aConfig {
        &self.cfg
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The gRPC listener's URL on `base`'s host.
    fn grpc_url(&self, base: &str) -> String {
        let rest = base.split_once("://").map_or(base, |(_, r)| r);
        let hostport = rest.split(['/', '?']).next().unwrap_or(rest);
        let host = match hostport.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
            _ => hostport,
        };
        format!("{}://{host}:{}", self.cfg.grpc_scheme, self.cfg.grpc_addr.port())
    }

    /// The agent card, with URLs on `base` (`http://host:port`).
    pub fn card(&self, base: &str) -> Value {
        let mut card = json!({
            "name": "SCD",
            "description": "Semantic Context Differentials (SCD): give it a task, an agent context and a budget; it answers the minimal sufficient context (chunks ranked by relevance, confidential fields withheld) and, in the same contextId, more context on request.",
            "version": env!("CARGO_PKG_VERSION"),
            "supportedInterfaces": [
                {"url": format!("{base}/"), "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION},
                {"url": base, "protocolBinding": "HTTP+JSON", "protocolVersion": PROTOCOL_VERSION},
                {"url": self.grpc_url(base), "protocolBinding": "scd.v1.Scd", "protocolVersion": "1"}
            ],
            "provider": {"organization": "SCD", "url": base},
            "capabilities": {"streaming": true, "pushNotifications": false, "extendedAgentCard": false},
            "defaultInputModes": ["application/json", "text/plain"],
            "defaultOutputModes": ["application/json", "text/plain"],
            "skills": [
                {
                    "id": "compress-context",
                    "name": "Compress context",
                    "description": "A data part {task, context: {fields: [{name, kind, content, confidential}]}, budget (or rate: the share of the context to keep, in (0, 1]), required?, optional?, threshold?, min_relative_score?, render?, reserve?, list_dropped?} yields a completed task whose artifact holds the minimal sufficient context within the budget: a text part (exactly the context to hand over, or a hand-off report in `render`: freeform, semi_structured or structured_soft; within the budget, wrapping included) and a data part (the same text, the chunk ids, totals, the count of chunks held back, withheld confidential field names; snake_case keys). reserve? holds part of the budget back for follow-ups; list_dropped? lists what was held back. It opens an SCD session for the contextId.",
                    "tags": ["context", "compression", "retrieval", "handoff"],
                    "examples": [
                        "{\"task\": \"Why does checkout time out?\", \"context\": {\"fields\": [{\"name\": \"error_logs\", \"kind\": \"log\", \"content\": \"ERROR payments::db: connection pool exhausted\"}]}, \"budget\": 200}"
                    ],
                    "inputModes": ["application/json"],
                    "outputModes": ["application/json", "text/plain"]
                },
                {
                    "id": "more-context",
                    "name": "More context",
                    "description": "A text part alone, in a contextId that compressed before, asks for more: the chunks the receiver has not been sent yet that answer the question. metadata.currentConfidence (0 to 1) or a hand-off report's confidence in the text tells how sure the receiver already is; at the server's threshold nothing more is sent.",
                    "tags": ["context", "adaptive", "session"],
                    "examples": ["Which function acquires the database connection?"],
                    "inputModes": ["text/plain"],
                    "outputModes": ["application/json", "text/plain"]
                }
            ]
        });
        if self.cfg.did_wba {
            card["securitySchemes"] = json!({"didwba": {"httpAuthSecurityScheme": {
                "scheme": "DIDWba",
                "description": "did:wba signed requests (Authorization: DIDWba did=..., nonce=..., timestamp=..., verification_method=..., signature=...); the agent card and DID documents are public"
            }}});
            card["securityRequirements"] = json!([{"schemes": {"didwba": {"list": []}}}]);
        }
        card
    }

    /// Checks the `A2A-Version` header (or query parameter): absent or
    /// `1.0` (any `1.0.x`) is served.
    pub fn check_version(headers: &HeaderMap, query: Option<&str>) -> Result<(), Error> {
        let from_query = query.and_then(|q| {
            q.split('&').find_map(|kv| {
                kv.split_once('=').filter(|(k, _)| k.eq_ignore_ascii_case("A2A-Version")).map(|(_, v)| v.to_string())
            })
        });
        let v = match headers.get("a2a-version") {
            Some(h) => Some(h.to_str().map_err(|_| Error::Version("(not ASCII)".into()))?.trim().to_string()),
            None => from_query,
        };
        match v.as_deref() {
            None | Some("") => Ok(()),
            Some(v) if v == PROTOCOL_VERSION || v.starts_with("1.0.") => Ok(()),
            Some(v) => Err(Error::Version(v.chars().take(32).collect())),
        }
    }

    pub(crate) fn check_tenant(tenant: &str) -> Result<(), Error> {
        if tenant.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidParams("tenant: this agent has no tenants; leave it empty".into()))
        }
    }

    /// Validates a SendMessage request and creates (or continues) its task,
    /// working; the caller then [`Agent::run`]s it.
    pub fn accept(&self, req: &SendMessageRequest, who: &Caller) -> Result<(Task, Prepared), Error> {
        let owner = who.owner();
        let owner = owner.as_str();
        Self::check_tenant(&req.tenant)?;
        if let Some(c) = &req.configuration {
            if c.task_push_notification_config.is_some() {
                return Err(Error::PushNotSupported);
            }
            if c.history_length.is_some_and(|h| h < 0) {
                return Err(Error::InvalidParams("configuration.historyLength: must be at least 0".into()));
            }
            let ours = ["application/json", "text/plain", "*/*"];
            if !c.accepted_output_modes.is_empty()
                && !c.accepted_output_modes.iter().any(|m| ours.contains(&m.as_str()))
            {
                return Err(Error::ContentType(format!(
                    "configuration.acceptedOutputModes {:?}: this agent answers application/json and text/plain",
                    c.accepted_output_modes
                )));
            }
        }
        let mut input = classify(&req.message)?;
        if let Input::Compress(c) = &mut input {
            if c.task.as_deref().is_none_or(|t| t.trim().is_empty()) {
                // the task is the text sent before in this taskId
                let earlier = match &req.message.task_id {
                    Some(id) => self.store.get(id, owner)?.history,
                    None => Vec::new(),
                };
                let text: Vec<&str> = earlier
                    .iter()
                    .filter(|m| m.role == Role::User)
                    .flat_map(|m| m.parts.iter().filter_map(|p| p.text.as_deref()))
                    .collect();
                if text.is_empty() {
                    return Err(Error::InvalidParams(
                        "message.parts: data.task is required (or send the task as text first, then the data part in its taskId)".into(),
                    ));
                }
                c.task = Some(text.join("\n"));
            }
        }
        let (task, prev) = match &req.message.task_id {
            Some(id) => {
                let prev = self.store.get(id, owner)?.status;
                (self.store.continue_task(id, owner, summarized(&req.message), TaskState::Working)?, Some(prev))
            }
            None => {
                let t = self.store.create(
                    req.message.context_id.clone(),
                    owner,
                    summarized(&req.message),
                    TaskState::Submitted,
                )?;
                (self.store.update(&t.id, TaskState::Working, None, None)?, None)
            }
        };
        Ok((
            task.clone(),
            Prepared { task_id: task.id, context_id: task.context_id, input, prev, detached: false, who: who.clone() },
        ))
    }

    /// Runs a prepared task to its next state and stores it; a task
    /// canceled meanwhile stays canceled. When the engine is at capacity
    /// the message is taken back (a new task removed, a continued one
    /// returned to its previous state) and the overload answered, unless
    /// the client already holds the task (streaming, `returnImmediately`):
    /// then it fails with the retry hint in its status message.
    pub async fn run(&self, p: Prepared) -> Result<Task, Error> {
        let out = match p.input {
            Input::Compress(input) => self.compress(&p.context_id, *input, &p.who).await,
            Input::Question { text, confidence } => self.question(&p.context_id, text, confidence, &p.who).await,
        };
        if let Some(busy) = out.busy {
            if !p.detached {
                self.store.take_back(&p.task_id, p.prev);
                return Err(busy);
            }
        }
        let msg = Message::agent(&p.task_id, &p.context_id, vec![Part::text(out.note)]);
        Ok(match self.store.update(&p.task_id, out.state, Some(msg), out.artifact) {
            Ok(t) => t,
            Err(e) => {
                debug!(task = %p.task_id, error = %e, "A2A result not stored");
                self.store.get(&p.task_id, &p.who.owner()).unwrap_or_else(|_| placeholder(&p.task_id, &p.context_id))
            }
        })
    }

    async fn compress(&self, context_id: &str, input: CompressInput, who: &Caller) -> Outcome {
        let caller = who.did.clone();
        let call = a2a_call("OpenSession", who);
        let (args, budget) = input.into_arguments();
        let list_dropped = args.list_dropped;
        let seed = json::audit_seed(&args, budget, "");
        let input = json::compress_input(&self.svc, args, budget, String::new(), String::new());
        match self.svc.compress_seeded(&call, seed, input).await.map_err(json::named) {
            Ok(mut out) => {
                let session = out.compressed.session.as_mut();
                let (id, token) = session.map(|g| (g.id.clone(), std::mem::take(&mut g.token))).unwrap_or_default();
                let old = self.store.set_session(&who.owner(), context_id, Session { id, token });
                let old = match old {
                    Ok(old) => old,
                    Err(e) => {
                        // the selection is answered; its follow-ups need the context sent again
                        tracing::warn!(context = %context_id, error = %e, "A2A: the context's session is not stored");
                        None
                    }
                };
                if let Some(old) = old {
                    let scope = crate::app::shares::key(caller.as_deref(), who.peer().as_deref());
                    let _ = self.svc.scd.close_session(&old.id, &old.token, caller.as_deref(), Some(&scope));
                }
                let view = crate::view::compressed_view(out.compressed, list_dropped);
                let note = format!(
                    "sent {} chunks, {} of {} {} tokens ({} held back, {} withheld); ask for more with a text message in contextId {context_id}",
                    view.chunks.len(),
                    view.totals.sent_tokens,
                    view.totals.context_tokens,
                    view.totals.tokenizer,
                    view.dropped.count,
                    view.withheld_fields.len()
                );
                let text = view.text.clone();
                let data = serde_json::to_value(&view).unwrap_or_default();
                Outcome::done(
                    TaskState::Completed,
                    note,
                    Some(Artifact {
                        artifact_id: types::uuid_v4(),
                        name: "minimal-sufficient-context".into(),
                        description: "The context selected for the task within the budget".into(),
                        parts: vec![
                            Part::data(data),
                            Part { media_type: Some("text/plain".into()), ..Part::text(text) },
                        ],
                    }),
                )
            }
            Err(e) => Outcome::engine_error(&e),
        }
    }

    async fn question(&self, context_id: &str, text: String, confidence: Option<f32>, who: &Caller) -> Outcome {
        let owner = who.owner();
        let session = match self.store.session(&owner, context_id) {
            Ok(s) => s,
            Err(e) => return Outcome::done(TaskState::Failed, e.to_string(), None),
        };
        let Some(session) = session else {
            // the task stays working on the question, waiting for its
            // context (a status message with TASK_STATE_WORKING: see
            // `ends_stream`)
            return Outcome::done(
                TaskState::Working,
                format!(
                    "waiting for the context: send a data part {{context: {{fields}}, budget}} in this taskId (this text is the task) or {{task, context, budget}} in contextId {context_id}; questions (skill more-context) follow a compression"
                ),
                None,
            );
        };
        let mut req = ContextRequest { session_id: session.id, session_token: session.token, ..Default::default() };
        let mut report = None;
        match confidence {
            Some(c) => {
                req.specific_question = text;
                req.current_confidence = c;
            }
            None if scd_engine::handoff::parse_auto(&text).report.confidence.is_some() => report = Some(text),
            None => req.specific_question = text,
        }
        let session_id = req.session_id.clone();
        let seed = MoreSeed { question: req.specific_question.clone(), session_id: session_id.clone() };
        let input = match report {
            Some(r) => apply_report(&mut req, &r, &self.svc.confidence_map).map(|()| req),
            None => Ok(req),
        };
        match self.svc.request_more(&a2a_call("RequestContext", who), seed, input).await.map_err(json::named) {
            Ok(out) => {
                let view = crate::view::more_context_view(out.more);
                let note = if view.chunks.is_empty() {
                    format!(
                        "nothing more to send: {}",
                        if view.reason.is_empty() { "no unsent chunk answers the question" } else { &view.reason }
                    )
                } else {
                    format!(
                        "sent {} more chunks, {} of {} tokens asked; {} tokens sent in this context",
                        view.chunks.len(),
                        view.sent_tokens,
                        view.budget,
                        view.session_sent_tokens
                    )
                };
                let text = view.text.clone();
                let data = serde_json::to_value(&view).unwrap_or_default();
                Outcome::done(
                    TaskState::Completed,
                    note,
                    Some(Artifact {
                        artifact_id: types::uuid_v4(),
                        name: "more-context".into(),
                        description: "Chunks of the session's context not sent before".into(),
                        parts: vec![
                            Part::data(data),
                            Part { media_type: Some("text/plain".into()), ..Part::text(text) },
                        ],
                    }),
                )
            }
            Err(e @ AppError::NotFound { .. }) => {
                // the session expired or was evicted: the context is needed again
                self.store.clear_session(&owner, context_id, &session_id);
                debug!(context = %context_id, error = %e.message(), "A2A context's session is gone");
                Outcome::done(
                    TaskState::InputRequired,
                    format!(
                        "the context's session expired; send the context again (a data part {{context: {{fields}}, budget}} in this taskId; the question is its task): {}",
                        e.message()
                    ),
                    None,
                )
            }
            Err(e) => Outcome::engine_error(&e),
        }
    }

    /// SendMessage from `who`: the task when it stops working (or at once
    /// with `returnImmediately`).
    pub async fn send(self: &Arc<Self>, req: SendMessageRequest, who: Caller) -> Result<Task, Error> {
        let (task, mut prepared) = self.accept(&req, &who)?;
        let history = req.configuration.as_ref().and_then(|c| c.history_length).map(|h| h as usize);
        prepared.detached = req.configuration.as_ref().is_some_and(|c| c.return_immediately);
        let detached = prepared.detached;
        let me = self.clone();
        // spawned, so a client that disconnects drops only the wait: the
        // run goes on and the task reaches its next state
        let run = tokio::spawn(async move { me.run(prepared).await });
        if detached {
            return Ok(store::trim_history(task, history));
        }
        let t = run.await.map_err(|e| Error::Internal(format!("task {}: its run ended: {e}", task.id)))??;
        Ok(store::trim_history(t, history))
    }
}

impl Agent {
    /// GetTask.
    pub fn get(&self, r: types::GetTaskRequest, who: &Caller) -> Result<Task, Error> {
        Self::check_tenant(&r.tenant)?;
        check_id("id", &r.id)?;
        let n = history_len("historyLength", r.history_length)?;
        Ok(store::trim_history(self.store.get(&r.id, &who.owner())?, n))
    }

    /// CancelTask.
    pub fn cancel(&self, r: types::TaskIdRequest, who: &Caller) -> Result<Task, Error> {
        Self::check_tenant(&r.tenant)?;
        check_id("id", &r.id)?;
        self.store.cancel(&r.id, &who.owner())
    }

    /// ListTasks (`who`'s tasks): `{tasks, nextPageToken, pageSize, totalSize}`.
    pub fn list(&self, r: types::ListTasksRequest, who: &Caller) -> Result<Value, Error> {
        Self::check_tenant(&r.tenant)?;
        let page_size = match r.page_size {
            None => 50,
            Some(n @ 1..=100) => n as usize,
            Some(n) => return Err(Error::InvalidParams(format!("pageSize: {n}, must be 1 to 100"))),
        };
        let offset = match r.page_token.as_deref() {
            None | Some("") => 0,
            Some(t) => t
                .strip_prefix("o")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| Error::InvalidParams("pageToken: not a token this agent gave".to_string()))?,
        };
        let state = match r.status.as_deref() {
            None | Some("") | Some("TASK_STATE_UNSPECIFIED") => None,
            Some(s) => Some(TaskState::parse(s).ok_or_else(|| {
                Error::InvalidParams("status: not a TaskState (TASK_STATE_SUBMITTED, _WORKING, ...)".to_string())
            })?),
        };
        let updated_after =
            match r.status_timestamp_after.as_deref() {
                None => None,
                Some(t) => Some(types::parse_rfc3339(t).ok_or_else(|| {
                    Error::InvalidParams("statusTimestampAfter: not an RFC 3339 timestamp".to_string())
                })?),
            };
        let history = history_len("historyLength", r.history_length)?.unwrap_or(0);
        let filter = store::ListFilter { context_id: r.context_id.filter(|c| !c.is_empty()), state, updated_after };
        let artifacts = r.include_artifacts.unwrap_or(false);
        let (total, page) =
            self.store.list(&filter, &who.owner(), store::Page { offset, size: page_size, history, artifacts })?;
        let next = if offset + page.len() < total { format!("o{}", offset + page.len()) } else { String::new() };
        Ok(json!({"tasks": page, "nextPageToken": next, "pageSize": page.len(), "totalSize": total}))
    }
}

/// A stream ends at a terminal state or when the agent waits for input
/// (input-required, or working with an agent message: a question waiting
/// for its context).
fn ends_stream(s: &types::TaskStatus) -> bool {
    s.state.is_terminal()
        || matches!(s.state, TaskState::InputRequired | TaskState::AuthRequired)
        || (s.state == TaskState::Working && s.message.is_some())
}

impl Agent {
    /// The `StreamResponse` objects of a task: the task as it stands, then
    /// its status and artifact updates until it ends or waits for input.
    pub fn events(
        self: &Arc<Self>,
        task: Task,
        mut rx: tokio::sync::broadcast::Receiver<store::Event>,
        owner: String,
    ) -> tokio_stream::wrappers::ReceiverStream<Value> {
        use tokio::sync::broadcast::error::RecvError;
        let (tx, out) = tokio::sync::mpsc::channel(16);
        let me = self.clone();
        tokio::spawn(async move {
            let (id, ctx) = (task.id.clone(), task.context_id.clone());
            let done = ends_stream(&task.status);
            if tx.send(json!({"task": task})).await.is_err() || done {
                return;
            }
            loop {
                let (item, end) = match rx.recv().await {
                    Ok(store::Event::Artifact(a)) => (
                        json!({"artifactUpdate": {"taskId": id, "contextId": ctx, "artifact": a, "lastChunk": true}}),
                        false,
                    ),
                    Ok(store::Event::Status(s)) => {
                        let end = ends_stream(&s);
                        (json!({"statusUpdate": {"taskId": id, "contextId": ctx, "status": s}}), end)
                    }
                    Ok(store::Event::Resync) | Err(RecvError::Lagged(_)) => match me.store.get(&id, &owner) {
                        Ok(t) => {
                            let end = ends_stream(&t.status);
                            (json!({"task": t}), end)
                        }
                        Err(_) => break,
                    },
                    Err(RecvError::Closed) => break,
                };
                if tx.send(item).await.is_err() || end {
                    break;
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(out)
    }

    /// SendStreamingMessage: validates and starts the task, then streams it.
    pub fn send_streaming(
        self: &Arc<Self>,
        req: SendMessageRequest,
        who: Caller,
    ) -> Result<tokio_stream::wrappers::ReceiverStream<Value>, Error> {
        let (task, mut prepared) = self.accept(&req, &who)?;
        prepared.detached = true;
        let owner = who.owner();
        let (task, rx) = self.store.subscribe(&task.id, &owner)?;
        let me = self.clone();
        tokio::spawn(async move { me.run(prepared).await });
        Ok(self.events(task, rx, owner))
    }

    /// SubscribeToTask.
    pub fn subscribe(
        self: &Arc<Self>,
        r: types::TaskIdRequest,
        who: &Caller,
    ) -> Result<tokio_stream::wrappers::ReceiverStream<Value>, Error> {
        Self::check_tenant(&r.tenant)?;
        check_id("id", &r.id)?;
        let owner = who.owner();
        let (task, rx) = self.store.subscribe(&r.id, &owner)?;
        Ok(self.events(task, rx, owner))
    }
}

fn history_len(name: &str, h: Option<i32>) -> Result<Option<usize>, Error> {
    match h {
        None => Ok(None),
        Some(n) if n >= 0 => Ok(Some(n as usize)),
        Some(n) => Err(Error::InvalidParams(format!("{name}: {n}, must be at least 0"))),
    }
}

/// A validated message, ready to run.
pub struct Prepared {
    task_id: String,
    context_id: String,
    input: Input,
    /// The status of the task it continues (`None`: a new task).
    prev: Option<types::TaskStatus>,
    /// The client already holds the task (streaming, `returnImmediately`).
    detached: bool,
    /// Who sent it.
    who: Caller,
}

fn placeholder(id: &str, ctx: &str) -> Task {
    Task {
        id: id.to_string(),
        context_id: ctx.to_string(),
        status: types::TaskStatus {
            state: TaskState::Failed,
            message: None,
            timestamp: types::rfc3339(std::time::SystemTime::now()),
        },
        artifacts: vec![],
        history: vec![],
    }
}

/// An A2A path as its route (task ids are not labels).
fn route_of(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/.well-known/agent-card.json" => "/.well-known/agent-card.json",
        "/message:send" => "/message:send",
        "/message:stream" => "/message:stream",
        "/tasks" => "/tasks",
        "/extendedAgentCard" => "/extendedAgentCard",
        p if p.contains("/pushNotificationConfigs") => "/tasks/{id}/pushNotificationConfigs",
        _ => "/tasks/{id}",
    }
}

/// The A2A routes over `agent`, to merge into the HTTP listener's router.
pub fn router(agent: Arc<Agent>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/.well-known/agent-card.json", get(rest::card))
        .route("/", post(jsonrpc::handle))
        .route("/message:send", post(rest::send))
        .route("/message:stream", post(rest::stream))
        .route("/tasks", get(rest::list))
        .route("/tasks/{id}", get(rest::get_task).post(rest::post_task))
        .route("/extendedAgentCard", get(rest::extended_card))
        .route("/tasks/{id}/pushNotificationConfigs", get(rest::push).post(rest::push))
        .route("/tasks/{id}/pushNotificationConfigs/{cfg}", get(rest::push).delete(rest::push))
        // counted as `A2A <verb> <route>` (a JSON-RPC call is `A2A POST /`;
        // its errors ride a 200)
        .route_layer(axum::middleware::from_fn_with_state(
            crate::http::Counted { metrics: agent.svc.metrics.clone(), prefix: "A2A", route_of },
            crate::http::counted,
        ))
        .with_state(agent)
}

#[cfg(test)]
mod tests;
