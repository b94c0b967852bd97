//! A2A tasks and contexts in Redis (`scd serve --state`): every replica
//! started with the same store serves every task, and a subscriber on one
//! replica sees the updates another makes.
//!
//! This module knows strings, not A2A types: messages, artifacts and
//! statuses arrive as the JSON the A2A layer wrote and leave as it is.
//! Each operation is one Lua script, atomic on the server, enforcing the
//! bounds the in-memory store enforces (see `a2a::store`): a task count
//! and a byte sum, both global and per owner, tasks waiting for their
//! context and then terminal tasks giving way (the owner's oldest, or in a
//! full store the largest owner's), a waiting task's shorter idle time, a refusal
//! telling when the first task expires, and the idle time. Keys, under
//! `scd:v1:a2a:`:
//!
//! | key | holds |
//! |---|---|
//! | `t:<id>` | hash: context, state, timestamp, status message, updated (µs), order |
//! | `h:<id>`, `a:<id>` | lists: the history and the artifacts, as JSON |
//! | `exp` | sorted set: every live task by its last update (Redis `TIME`, ms) |
//! | `to`, `tc`, `tb` | hashes: each task's owner, context and bytes |
//! | `o:<owner>`, `ot:<owner>`, `ow:<owner>` | sorted sets: the owner's tasks, its terminal ones and its waiting ones, by order |
//! | `on`, `obz` | sorted sets: tasks and bytes per owner |
//! | `c:<len>:<owner><context>` | hash: the context's SCD session id and token |
//! | `cx`, `cs:<owner>`, `ocs` | contexts by last use, the owner's by last use, contexts per owner |
//! | `ctn`, `cb` | hashes: tasks per context, each context's bytes |
//! | `bytes`, `seq` | the byte sum (tasks and contexts), the order counter |
//! | `ev:<id>` | the Pub/Sub channel of a task's events |
//!
//! Bookkeeping hashes and sets hold one entry per live task, context or
//! owner; a script that meets an idle entry drops it, and a task's own
//! keys expire on their own a minute after its idle time.
//!
//! The store holds each context's SCD session token, as the in-memory
//! store does: Redis must be reachable only by the replicas
//! (`docs/deploy/`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::{Script, Value};
use scd_engine::shared::StoreError;

use super::Redis;

/// Every key's prefix: a new layout gets a new version.
const PREFIX: &str = "scd:v1:a2a:";

mod scripts;

use scripts::{CLEAR_SESSION, CONTINUE, COUNT, CREATE, GET, LIST, PRELUDE, SESSION, SET_SESSION, TAKE_BACK, UPDATE};

/// The bounds a script enforces (the A2A store's limits).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Idle time of a task or context.
    pub ttl: Duration,
    /// Tasks, and contexts, held at once.
    pub max_tasks: usize,
    /// Bytes of tasks and contexts together.
    pub max_bytes: usize,
    /// Tasks (and contexts) of one owner.
    pub tasks_per_owner: usize,
    /// Bytes of one owner's tasks.
    pub bytes_per_owner: usize,
    /// What a task is counted as beside its strings.
    pub task_bytes: usize,
    /// What a context is counted as beside its strings.
    pub context_bytes: usize,
    /// Idle time of a task waiting for its context (at most `ttl`).
    pub waiting_ttl: Duration,
}

/// A task as held: its strings, the JSON as the A2A layer wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTask {
    /// The task id.
    pub id: String,
    /// Its context id.
    pub context_id: String,
    /// Its state's name.
    pub state: String,
    /// Its status timestamp.
    pub timestamp: String,
    /// Its status message (JSON), if any.
    pub message: Option<String>,
    /// When it was last updated, µs since the Unix epoch.
    pub updated_us: u64,
    /// Its history (JSON messages), or the part asked for.
    pub history: Vec<String>,
    /// Its artifacts (JSON), when asked for.
    pub artifacts: Vec<String>,
}

/// Why a script did not do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No such task of this owner (or it expired).
    NotFound,
    /// The task is terminal, in this state.
    Terminal(String),
    /// The task's history holds this many messages.
    History(usize),
    /// The store, or the owner's share (`own`), is full of live tasks;
    /// `unit` is `tasks` or `bytes`; the first task expires in `retry_ms`.
    Full {
        /// The owner's share, not the whole store.
        own: bool,
        /// What is full.
        unit: &'static str,
        /// Milliseconds until the first task expires.
        retry_ms: u64,
    },
}

/// What an operation answers: done, or refused.
pub type Reply<T> = Result<T, Refusal>;

/// An event of a task, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEvent {
    /// A new status: state, timestamp, message (JSON, '' for none).
    Status(String, String, String),
    /// A new artifact (JSON) of the task.
    Artifact(String),
}

/// What [`RedisTasks::listen`] hears.
#[derive(Debug)]
pub enum Heard<'a> {
    /// Subscribed (again): events may have been missed meanwhile, every
    /// stream should read its task again.
    Subscribed,
    /// The subscription broke (or stopped answering); resubscribing.
    Lost,
    /// A task's event.
    Event(&'a str, RawEvent),
}

/// Receives what [`RedisTasks::listen`] hears.
pub type Listener = dyn Fn(Heard<'_>) + Send + Sync;

/// Quiet seconds on the subscription before it is pinged: a connection
/// that died without a word (half-open) is noticed within twice this.
const PING_AFTER_S: u32 = 5;

/// A2A tasks and contexts in Redis (see the module docs).
pub struct RedisTasks {
    redis: Redis,
    create: Script,
    get: Script,
    continue_: Script,
    update: Script,
    take_back: Script,
    session: Script,
    set_session: Script,
    clear_session: Script,
    list: Script,
    count: Script,
}

impl std::fmt::Debug for RedisTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTasks").field("store", &self.redis.name()).finish()
    }
}

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        v => text(v)?.parse().ok(),
    }
}

fn unexpected(what: &str) -> StoreError {
    StoreError(format!("unexpected reply to the A2A {what} script"))
}

fn texts(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Array(a) => a.iter().map(text).collect(),
        _ => None,
    }
}

fn raw_task(v: &Value) -> Option<RawTask> {
    let Value::Array(f) = v else { return None };
    let [id, c, st, ts, m, u, h, a] = f.as_slice() else { return None };
    let message = text(m)?;
    Some(RawTask {
        id: text(id)?,
        context_id: text(c)?,
        state: text(st)?,
        timestamp: text(ts)?,
        message: (!message.is_empty()).then_some(message),
        updated_us: int(u)?,
        history: texts(h)?,
        artifacts: texts(a)?,
    })
}

/// A refusal the scripts share, if `v` is one.
fn refusal(v: &Value) -> Option<Refusal> {
    if text(v).as_deref() == Some("nf") {
        return Some(Refusal::NotFound);
    }
    let Value::Array(f) = v else { return None };
    match (f.first().and_then(text).as_deref(), f.get(1)) {
        (Some("term"), Some(st)) => Some(Refusal::Terminal(text(st).unwrap_or_default())),
        (Some("hist"), Some(n)) => Some(Refusal::History(int(n)? as usize)),
        (Some("full"), Some(own)) => Some(Refusal::Full {
            own: int(own)? == 1,
            unit: if f.get(2).and_then(text).as_deref() == Some("bytes") { "bytes" } else { "tasks" },
            retry_ms: int(f.get(3)?)?,
        }),
        _ => None,
    }
}

/// `{'ok', task}` as the task, or a refusal.
fn task_reply(v: &Value, what: &str) -> Result<Reply<RawTask>, StoreError> {
    if let Some(r) = refusal(v) {
        return Ok(Err(r));
    }
    match v {
        Value::Array(f) if f.len() == 2 && text(&f[0]).as_deref() == Some("ok") => {
            raw_task(&f[1]).map(Ok).ok_or_else(|| unexpected(what))
        }
        _ => Err(unexpected(what)),
    }
}

/// A fresh id for one call: a script run twice (its reply lost, the call
/// retried on a new connection) finds it and does not apply twice.
fn op_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

impl RedisTasks {
    /// Tasks at `url` (`--state`); nothing is connected until used.
    pub fn open(url: &str) -> Result<Self, super::UrlError> {
        Ok(Self {
            redis: Redis::open("--state", url, Duration::from_secs(2))?,
            create: script(CREATE),
            get: script(GET),
            continue_: script(CONTINUE),
            update: script(UPDATE),
            take_back: script(TAKE_BACK),
            session: script(SESSION),
            set_session: script(SET_SESSION),
            clear_session: script(CLEAR_SESSION),
            list: script(LIST),
            count: script(COUNT),
        })
    }

    /// The store's name (`redis://host:port/db`, no credentials).
    pub fn name(&self) -> &str {
        self.redis.name()
    }

    fn run(&self, s: &Script, b: &Bounds, args: &[&str]) -> Result<Value, StoreError> {
        let head = [
            b.ttl.as_millis().max(1).to_string(),
            b.max_tasks.to_string(),
            b.max_bytes.to_string(),
            b.tasks_per_owner.to_string(),
            b.bytes_per_owner.to_string(),
            b.task_bytes.to_string(),
            b.context_bytes.to_string(),
            b.waiting_ttl.as_millis().max(1).to_string(),
        ];
        self.redis.with(|c| {
            let mut inv = s.prepare_invoke();
            inv.arg(PREFIX);
            for a in &head {
                inv.arg(a.as_str());
            }
            for a in args {
                inv.arg(*a);
            }
            inv.invoke::<Value>(c)
        })
    }

    /// A new task `id` of `owner` in `context` holding `first`.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        b: &Bounds,
        owner: &str,
        context: &str,
        id: &str,
        first: &str,
        state: &str,
        timestamp: &str,
        updated_us: u64,
        terminal: bool,
    ) -> Result<Reply<()>, StoreError> {
        let u = updated_us.to_string();
        let v = self.run(&self.create, b, &[owner, context, id, first, state, timestamp, &u, flag(terminal)])?;
        if let Some(r) = refusal(&v) {
            return Ok(Err(r));
        }
        match texts(&v).as_deref() {
            Some([ok]) if ok == "ok" => Ok(Ok(())),
            _ => Err(unexpected("create")),
        }
    }

    /// `owner`'s task `id` with its last `history` messages (all when
    /// `None`); with `live_only`, a terminal task is refused.
    pub fn get(
        &self,
        b: &Bounds,
        owner: &str,
        id: &str,
        history: Option<usize>,
        live_only: bool,
    ) -> Result<Reply<RawTask>, StoreError> {
        let h = history.map_or("-1".to_string(), |n| n.to_string());
        let v = self.run(&self.get, b, &[owner, id, &h, flag(live_only)])?;
        task_reply(&v, "get")
    }

    /// Adds `message` to `owner`'s live task `id`, which moves to `state`
    /// (published).
    #[allow(clippy::too_many_arguments)]
    pub fn continue_task(
        &self,
        b: &Bounds,
        owner: &str,
        id: &str,
        message: &str,
        state: &str,
        timestamp: &str,
        updated_us: u64,
        max_history: usize,
        terminal: bool,
    ) -> Result<Reply<RawTask>, StoreError> {
        let (u, max, op) = (updated_us.to_string(), max_history.to_string(), op_id());
        let v = self.run(&self.continue_, b, &[owner, id, message, state, timestamp, &u, &max, flag(terminal), &op])?;
        task_reply(&v, "continue")
    }

    /// Moves live task `id` (of `owner`, or of anyone when `None`) to
    /// `state`, with its status message and artifact (JSON, each
    /// published).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &self,
        b: &Bounds,
        owner: Option<&str>,
        id: &str,
        state: &str,
        timestamp: &str,
        updated_us: u64,
        message: Option<&str>,
        artifact: Option<&str>,
        terminal: bool,
    ) -> Result<Reply<RawTask>, StoreError> {
        let (u, op) = (updated_us.to_string(), op_id());
        let args = [
            id,
            state,
            timestamp,
            &u,
            message.unwrap_or(""),
            artifact.unwrap_or(""),
            flag(terminal),
            owner.unwrap_or(""),
            &op,
        ];
        let v = self.run(&self.update, b, &args)?;
        task_reply(&v, "update")
    }

    /// Takes back live task `id` whole (`prev` `None`), or its last
    /// message, returning it to `prev`: state, timestamp and status
    /// message ('' for none).
    pub fn take_back(&self, b: &Bounds, id: &str, prev: Option<[&str; 3]>) -> Result<(), StoreError> {
        let op = op_id();
        let args = match prev {
            None => [id, "1", "", "", "", &op],
            Some([st, ts, m]) => [id, "0", st, ts, m, &op],
        };
        self.run(&self.take_back, b, &args).map(drop)
    }

    /// The SCD session (id, token) of `owner`'s context: `None` when the
    /// context is not held, empty strings when it holds none.
    pub fn session(&self, b: &Bounds, owner: &str, context: &str) -> Result<Option<(String, String)>, StoreError> {
        let v = self.run(&self.session, b, &[owner, context])?;
        pair(&v, "session")
    }

    /// Sets the SCD session of `owner`'s context, answering the one it
    /// replaces (as [`Self::session`]).
    pub fn set_session(
        &self,
        b: &Bounds,
        owner: &str,
        context: &str,
        id: &str,
        token: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        let v = self.run(&self.set_session, b, &[owner, context, id, token])?;
        pair(&v, "set_session")
    }

    /// Forgets session `id` of `owner`'s context (not a newer one).
    pub fn clear_session(&self, b: &Bounds, owner: &str, context: &str, id: &str) -> Result<(), StoreError> {
        self.run(&self.clear_session, b, &[owner, context, id]).map(drop)
    }

    /// How many of `owner`'s tasks match, and the page of them: `filter`
    /// is (context, state, updated after ms), each `None` for any.
    #[allow(clippy::too_many_arguments)]
    pub fn list(
        &self,
        b: &Bounds,
        owner: &str,
        filter: (Option<&str>, Option<&str>, Option<u64>),
        offset: usize,
        size: usize,
        history: usize,
        artifacts: bool,
    ) -> Result<(usize, Vec<RawTask>), StoreError> {
        let after = filter.2.map(|t| t.to_string()).unwrap_or_default();
        let (offset, size, history) = (offset.to_string(), size.to_string(), history.to_string());
        let args =
            [owner, filter.0.unwrap_or(""), filter.1.unwrap_or(""), &after, &offset, &size, &history, flag(artifacts)];
        let v = self.run(&self.list, b, &args)?;
        let Value::Array(f) = &v else { return Err(unexpected("list")) };
        match f.as_slice() {
            [n, Value::Array(tasks)] => {
                let tasks: Option<Vec<RawTask>> = tasks.iter().map(raw_task).collect();
                Ok((int(n).ok_or_else(|| unexpected("list"))? as usize, tasks.ok_or_else(|| unexpected("list"))?))
            }
            _ => Err(unexpected("list")),
        }
    }

    /// Tasks held and the bytes they (and the contexts) are counted as.
    pub fn count(&self, b: &Bounds) -> Result<(usize, usize), StoreError> {
        let v = self.run(&self.count, b, &[])?;
        match &v {
            Value::Array(f) if f.len() == 2 => match (int(&f[0]), int(&f[1])) {
                (Some(n), Some(bytes)) => Ok((n as usize, bytes as usize)),
                _ => Err(unexpected("count")),
            },
            _ => Err(unexpected("count")),
        }
    }

    /// Listens to every task's events on a thread of its own, handing each
    /// to `on`, with [`Heard::Subscribed`] each time the subscription is
    /// made and [`Heard::Lost`] when it breaks. A quiet subscription is
    /// pinged. The thread ends once `alive` can no longer be upgraded (its
    /// owner was dropped).
    pub fn listen<T: Send + Sync + 'static>(self: &Arc<Self>, alive: Weak<T>, on: Box<Listener>) {
        let me = Arc::downgrade(self);
        let pattern = format!("{PREFIX}ev:*");
        let spawned = std::thread::Builder::new().name("a2a-events".into()).spawn(move || {
            let mut down_logged = false;
            while alive.strong_count() > 0 {
                let Some(store) = me.upgrade() else { return };
                match store.redis.subscriber(Duration::from_secs(1)) {
                    Ok(mut con) => {
                        drop(store);
                        let mut ps = con.as_pubsub();
                        if ps.psubscribe(&pattern).is_err() {
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                        if down_logged {
                            tracing::info!("A2A events: subscribed to the store again");
                            down_logged = false;
                        }
                        on(Heard::Subscribed);
                        let mut quiet = 0;
                        while alive.strong_count() > 0 {
                            match ps.get_message() {
                                Ok(msg) => {
                                    quiet = 0;
                                    let Some(id) = msg.get_channel_name().strip_prefix(&pattern[..pattern.len() - 1])
                                    else {
                                        continue;
                                    };
                                    let payload: Vec<u8> = msg.get_payload().unwrap_or_default();
                                    let Some(event) = raw_event(&payload) else { continue };
                                    on(Heard::Event(id, event));
                                }
                                Err(e) if e.is_timeout() => {
                                    quiet += 1;
                                    // a pong resets the count; none within as long again is a dead connection
                                    if quiet == PING_AFTER_S && ps.ping::<Value>().is_err() || quiet >= 2 * PING_AFTER_S {
                                        tracing::warn!("A2A events: the store's subscription stopped answering; resubscribing");
                                        down_logged = true;
                                        on(Heard::Lost);
                                        break;
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "A2A events: the store's subscription broke; resubscribing");
                                    down_logged = true;
                                    on(Heard::Lost);
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        drop(store);
                        if !down_logged {
                            tracing::warn!(error = %e, "A2A events: cannot subscribe to the store yet; retrying every second");
                            down_logged = true;
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "A2A events: cannot start the listening thread; streams see no other replica's updates");
        }
    }
}

/// A published event: `s` state `\n` timestamp `\n` message, or `a`
/// artifact.
fn raw_event(payload: &[u8]) -> Option<RawEvent> {
    let text = std::str::from_utf8(payload).ok()?;
    if let Some(a) = text.strip_prefix('a') {
        return Some(RawEvent::Artifact(a.to_string()));
    }
    let mut f = text.strip_prefix('s')?.splitn(3, '\n');
    let (st, ts, m) = (f.next()?, f.next()?, f.next()?);
    Some(RawEvent::Status(st.to_string(), ts.to_string(), m.to_string()))
}

/// `{id, token}` (empty strings: none) or `'none'`.
fn pair(v: &Value, what: &str) -> Result<Option<(String, String)>, StoreError> {
    if text(v).as_deref() == Some("none") {
        return Ok(None);
    }
    match texts(v).as_deref() {
        Some([id, token]) => Ok(Some((id.clone(), token.clone()))),
        _ => Err(unexpected(what)),
    }
}
