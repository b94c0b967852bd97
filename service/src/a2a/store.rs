//! The bounded task store: at most `max_tasks` tasks (and as many
//! contexts) holding at most `max_bytes` together (each task counted as the
//! heap it holds, kept as a running sum: messages and artifacts are held as
//! compact JSON, so that this count is the memory; checked when a message is
//! accepted, while results, bounded by their budget, are always stored),
//! each dropped `ttl` after its last update; terminal states are immutable.
//!
//! Everything is namespaced by its [`Owner`] (the caller's DID, else its IP
//! address): a task is seen only by its owner, and a context is keyed by
//! (owner, contextId), so two owners naming the same contextId hold two
//! contexts, each with its own SCD session (id and token stay on the
//! server), and neither learns that the other's exists.
//!
//! Each owner has a share: `max_tasks_per_caller` tasks and
//! `max_bytes_per_caller` bytes. An owner at its share gives up its own
//! oldest terminal task (completed, failed, canceled, rejected) for the new
//! one; with only live tasks it is refused, told to retry when its earliest
//! task expires. A full store gives up the oldest terminal task of the owner
//! holding the most; with none terminal it is refused until the earliest
//! task in the store expires. A task that is waiting for its context (a
//! text sent alone: working, with a status message asking for the data
//! part) holds no work and gives way first, before any terminal task, and is
//! dropped [`WAITING_TTL`] after its last update (`waiting_ttl`, at most `ttl`):
//! tasks sent as text alone, from any number of addresses, cannot hold the
//! store for an hour. Contexts follow: a new context takes the
//! place of one of the owner's contexts that holds no task (or, in a full
//! store, of the largest owner's).
//!
//! With `--state` the store is in Redis ([`Store::shared`]), with the same
//! operations and bounds, so that every replica serves every task.

mod shared;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

use super::types::{rfc3339, uuid_v4, Artifact, Message, Task, TaskState, TaskStatus};
use super::Error;

/// Whom tasks and contexts belong to: the caller's DID under `--auth
/// did-wba`, else its IP address (see [`super::Caller::owner`]).
pub type Owner = str;

/// How long a task waiting for its context is kept after its last update
/// (see the module docs).
pub const WAITING_TTL: Duration = Duration::from_secs(120);

/// One change of a task, as sent to its subscribers.
#[derive(Debug, Clone)]
pub enum Event {
    /// A new status; `terminal` is the last event of the task.
    Status(TaskStatus),
    /// A new artifact.
    Artifact(Artifact),
    /// Events may have been missed (the shared store's subscription was
    /// re-established): read the task again.
    Resync,
}

/// Store bounds.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// Tasks held at once (and contexts).
    pub max_tasks: usize,
    /// Time a task (or context) is kept after its last update.
    pub ttl: Duration,
    /// Messages in one task's history.
    pub max_history: usize,
    /// Bytes all tasks may hold together (the heap they hold).
    pub max_bytes: usize,
    /// Tasks (and contexts) one owner may hold.
    pub max_tasks_per_caller: usize,
    /// Bytes one owner's tasks may hold.
    pub max_bytes_per_caller: usize,
    /// Time a task waiting for its context is kept after its last update
    /// (at most `ttl`); [`WAITING_TTL`] by default.
    pub waiting_ttl: Duration,
}

impl StoreLimits {
    /// The default share of a global bound: a tenth, at least 1.
    pub fn default_share(global: usize) -> usize {
        (global / 10).max(1)
    }
}

impl Default for StoreLimits {
    /// 10,000 tasks, one hour, 100 messages, 256 MiB; a tenth of each per
    /// owner.
    fn default() -> Self {
        let (max_tasks, max_bytes) = (10_000, 256 << 20);
        Self {
            max_tasks,
            ttl: Duration::from_secs(3600),
            max_history: 100,
            max_bytes,
            max_tasks_per_caller: Self::default_share(max_tasks),
            max_bytes_per_caller: Self::default_share(max_bytes),
            waiting_ttl: WAITING_TTL,
        }
    }
}

/// What an incoming message is counted as once held.
fn message_bytes(m: &Message) -> usize {
    json(m).len() + std::mem::size_of::<Box<str>>()
}

/// A task as it is held: its status typed, each message and artifact as
/// compact JSON (parsed again when read), so that what a task is counted as
/// is what it holds. Structs of `serde_json::Value`s hold about twice their
/// JSON size; their JSON holds its own size. Read under the store's lock
/// as a copy of the strings; parsed after the lock is released.
#[derive(Clone)]
struct Held {
    id: String,
    context_id: String,
    state: TaskState,
    timestamp: String,
    /// The status message, as JSON.
    message: Option<Box<str>>,
    history: Vec<Box<str>>,
    artifacts: Vec<Box<str>>,
}

/// What a held task is counted as beside its strings: the entry itself and
/// its key in the hash table, doubled for the table's free slots.
const ENTRY_BYTES: usize = 2 * (std::mem::size_of::<String>() + std::mem::size_of::<Entry>()) + 64;

/// What a task's broadcast channel is counted as while one is open: its 16
/// slots and its shared state.
const CHANNEL_BYTES: usize = 16 * (std::mem::size_of::<Event>() + 32) + 256;

fn json<T: serde::Serialize>(v: &T) -> Box<str> {
    // serializing these types (strings, numbers, maps with string keys) cannot fail
    serde_json::to_string(v).unwrap_or_default().into_boxed_str()
}

/// Reads back what [`json`] wrote, `None` (logged) should it ever fail.
fn parse<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_str(s)
        .map_err(|e| tracing::error!(error = %e, "a2a store: a held message does not parse back; it is left out"))
        .ok()
}

impl Held {
    fn new(t: &Task) -> Self {
        let mut h = Self {
            id: t.id.clone(),
            context_id: t.context_id.clone(),
            state: t.status.state,
            timestamp: String::new(),
            message: None,
            history: t.history.iter().map(json).collect(),
            artifacts: t.artifacts.iter().map(json).collect(),
        };
        h.set_status(&t.status);
        h
    }

    fn set_status(&mut self, s: &TaskStatus) {
        self.state = s.state;
        self.timestamp.clone_from(&s.timestamp);
        self.message = s.message.as_ref().map(json);
    }

    /// Whether the task is waiting for its context: working, with a status
    /// message (the agent's request for the data part); it holds no work.
    fn waiting(&self) -> bool {
        self.state == TaskState::Working && self.message.is_some()
    }

    fn status(&self) -> TaskStatus {
        TaskStatus {
            state: self.state,
            message: self.message.as_deref().and_then(parse),
            timestamp: self.timestamp.clone(),
        }
    }

    /// A copy with its last `history` messages and, when `artifacts`, its
    /// artifacts (only those are copied).
    fn view(&self, history: usize, artifacts: bool) -> Held {
        let from = self.history.len().saturating_sub(history);
        Held {
            id: self.id.clone(),
            context_id: self.context_id.clone(),
            state: self.state,
            timestamp: self.timestamp.clone(),
            message: self.message.clone(),
            history: self.history[from..].to_vec(),
            artifacts: if artifacts { self.artifacts.clone() } else { Vec::new() },
        }
    }

    /// The task, parsed (outside the store's lock).
    fn parsed(&self) -> Task {
        Task {
            id: self.id.clone(),
            context_id: self.context_id.clone(),
            status: self.status(),
            artifacts: self.artifacts.iter().filter_map(|a| parse(a)).collect(),
            history: self.history.iter().filter_map(|m| parse(m)).collect(),
        }
    }

    /// Heap bytes held, with [`ENTRY_BYTES`] for the entry around it.
    fn bytes(&self, owner: &str) -> usize {
        let boxed = |v: &Vec<Box<str>>| {
            v.capacity() * std::mem::size_of::<Box<str>>() + v.iter().map(|s| s.len()).sum::<usize>()
        };
        ENTRY_BYTES
            + 2 * self.id.len()
            + self.context_id.len()
            + self.timestamp.capacity()
            + owner.len()
            + self.message.as_ref().map_or(0, |m| m.len())
            + boxed(&self.history)
            + boxed(&self.artifacts)
    }
}

struct Entry {
    task: Held,
    owner: String,
    touched: Instant,
    updated: SystemTime,
    /// Order of last update (ties of `updated` broken by it).
    seq: u64,
    /// Open while someone subscribes, closed when the task ends.
    events: Option<broadcast::Sender<Event>>,
    /// What it is counted as in [`Inner::bytes`].
    bytes: usize,
}

impl Entry {
    /// How long the entry is kept after its last update: the waiting TTL
    /// (at most `ttl`) while its task waits for its context, else `ttl`.
    fn life(&self, l: &StoreLimits) -> Duration {
        if self.task.waiting() {
            l.ttl.min(l.waiting_ttl)
        } else {
            l.ttl
        }
    }

    /// Recounts the task's bytes into the store's running sum.
    fn recount(&mut self, total: &mut usize) {
        let now = self.task.bytes(&self.owner) + if self.events.is_some() { CHANNEL_BYTES } else { 0 };
        *total = total.saturating_sub(self.bytes) + now;
        self.bytes = now;
    }

    /// Sends `event` to the subscribers, if any.
    fn send(&self, event: Event) {
        if let Some(tx) = &self.events {
            let _ = tx.send(event);
        }
    }
}

/// A context's SCD session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Session id.
    pub id: String,
    /// Its secret (never sent to A2A clients).
    pub token: String,
}

struct ContextEntry {
    session: Option<Session>,
    touched: Instant,
    /// What it is counted as in [`Inner::bytes`].
    bytes: usize,
}

/// What a context is counted as beside its strings (as [`ENTRY_BYTES`]).
const CONTEXT_BYTES: usize = 2 * (std::mem::size_of::<ContextKey>() + std::mem::size_of::<ContextEntry>()) + 64;

impl ContextEntry {
    /// Recounts the context's bytes (its key is `k`) into the running sum.
    fn recount(&mut self, k: &ContextKey, total: &mut usize) {
        let now =
            CONTEXT_BYTES + k.0.len() + k.1.len() + self.session.as_ref().map_or(0, |s| s.id.len() + s.token.len());
        *total = total.saturating_sub(self.bytes) + now;
        self.bytes = now;
    }
}

/// A context's key: its owner and the contextId.
type ContextKey = (String, String);

fn key(owner: &Owner, context_id: &str) -> ContextKey {
    (owner.to_string(), context_id.to_string())
}

#[derive(Default)]
struct Inner {
    tasks: HashMap<String, Entry>,
    contexts: HashMap<ContextKey, ContextEntry>,
    last_purge: Option<Instant>,
    seq: u64,
    /// Bytes of all tasks and contexts (the sum of their `bytes`).
    bytes: usize,
}

/// What one owner holds.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    tasks: usize,
    bytes: usize,
}

impl Inner {
    fn usage(&self, owner: &Owner) -> Usage {
        self.tasks
            .values()
            .filter(|e| e.owner == owner)
            .fold(Usage::default(), |u, e| Usage { tasks: u.tasks + 1, bytes: u.bytes + e.bytes })
    }

    /// The task of `owner` that gives way first: its oldest waiting one
    /// (see [`Held::waiting`]), else its oldest terminal one; never `keep`
    /// (the task being continued).
    fn first_to_go(&self, owner: &Owner, keep: Option<&str>) -> Option<String> {
        let first = |pick: fn(&Held) -> bool| {
            self.tasks
                .values()
                .filter(|e| e.owner == owner && pick(&e.task) && keep != Some(e.task.id.as_str()))
                .min_by_key(|e| e.seq)
        };
        first(Held::waiting).or_else(|| first(|t| t.state.is_terminal())).map(|e| e.task.id.clone())
    }

    /// The task that gives way first of the owner holding the most (by
    /// `weigh`) among those holding one that may.
    fn first_to_go_of_largest(&self, weigh: impl Fn(Usage) -> usize, keep: Option<&str>) -> Option<String> {
        let mut usage: HashMap<&str, Usage> = HashMap::new();
        for e in self.tasks.values() {
            let u = usage.entry(e.owner.as_str()).or_default();
            u.tasks += 1;
            u.bytes += e.bytes;
        }
        let mut owners: Vec<(&str, Usage)> = usage.into_iter().collect();
        owners.sort_unstable_by_key(|(o, u)| (std::cmp::Reverse(weigh(*u)), *o));
        owners.into_iter().find_map(|(o, _)| self.first_to_go(o, keep))
    }

    fn remove(&mut self, id: &str) {
        if let Some(e) = self.tasks.remove(id) {
            self.bytes = self.bytes.saturating_sub(e.bytes);
        }
    }

    /// Seconds (rounded up, at least 1) until the first task of `owner`
    /// (of anyone when `None`) expires; `ttl` when it holds none.
    fn retry_after_s(&self, owner: Option<&Owner>, l: &StoreLimits, now: Instant) -> u64 {
        let left = self
            .tasks
            .values()
            .filter(|e| owner.is_none_or(|o| e.owner == o))
            .map(|e| (e.touched + e.life(l)).saturating_duration_since(now))
            .min()
            .unwrap_or(l.ttl);
        ceil_s(left)
    }

    /// Makes room for a context of `owner`: one of its contexts that holds
    /// no task gives way when it is at `share`, else one of the largest
    /// owner's when the store holds `max`.
    fn context_room(&mut self, owner: &Owner, share: usize, max: usize) {
        let busy: HashSet<(&str, &str)> =
            self.tasks.values().map(|e| (e.owner.as_str(), e.task.context_id.as_str())).collect();
        let idle = |k: &ContextKey| !busy.contains(&(k.0.as_str(), k.1.as_str()));
        let mine = self.contexts.keys().filter(|k| k.0 == owner).count();
        let victim = if mine >= share {
            self.contexts.iter().filter(|(k, _)| k.0 == owner && idle(k)).min_by_key(|(_, c)| c.touched)
        } else if self.contexts.len() >= max {
            let mut count: HashMap<&str, usize> = HashMap::new();
            for k in self.contexts.keys() {
                *count.entry(k.0.as_str()).or_default() += 1;
            }
            self.contexts
                .iter()
                .filter(|(k, _)| idle(k))
                .max_by_key(|(k, c)| (count[k.0.as_str()], std::cmp::Reverse(c.touched)))
        } else {
            None
        };
        let victim = victim.map(|(k, _)| k.clone());
        drop(busy);
        if let Some(c) = victim.and_then(|k| self.contexts.remove(&k)) {
            self.bytes = self.bytes.saturating_sub(c.bytes);
        }
    }
}

/// Whole seconds, rounded up, at least 1.
fn ceil_s(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}

/// What [`Store::list`] selects.
#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    /// Only this context.
    pub context_id: Option<String>,
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only tasks updated after this time.
    pub updated_after: Option<SystemTime>,
}

/// The task store (see the module docs).
pub struct Store {
    limits: StoreLimits,
    inner: Mutex<Inner>,
    /// `Some`: the tasks are in Redis and `inner` stays empty.
    shared: Option<shared::Shared>,
}

/// Which tasks of a [`Store::list`] to copy out, and how much of each.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    /// Tasks skipped.
    pub offset: usize,
    /// Tasks copied at most.
    pub size: usize,
    /// Messages of history per task.
    pub history: usize,
    /// Copy the artifacts too.
    pub artifacts: bool,
}

/// A new task in `state`: fresh ids (a new context when `context_id` is
/// `None`), `first` in its history, and when it was made.
fn new_task(context_id: Option<String>, mut first: Message, state: TaskState) -> (Task, SystemTime) {
    let context_id = context_id.unwrap_or_else(uuid_v4);
    let id = uuid_v4();
    first.task_id = Some(id.clone());
    first.context_id = Some(context_id.clone());
    let updated = SystemTime::now();
    let task = Task {
        id,
        context_id,
        status: TaskStatus { state, message: None, timestamp: rfc3339(updated) },
        artifacts: Vec::new(),
        history: vec![first],
    };
    (task, updated)
}

/// Messages kept of a history: the last `n` (all when `None`).
pub fn trim_history(mut t: Task, n: Option<usize>) -> Task {
    if let Some(n) = n {
        let len = t.history.len();
        t.history.drain(..len.saturating_sub(n));
    }
    t
}

impl Store {
    /// An empty store.
    pub fn new(limits: StoreLimits) -> Self {
        Self { limits, inner: Mutex::new(Inner::default()), shared: None }
    }

    /// A store in Redis (`--state`), shared by every replica on it.
    pub fn shared(limits: StoreLimits, redis: Arc<crate::redis::tasks::RedisTasks>) -> Self {
        let shared = Some(shared::Shared::new(redis, &limits));
        Self { limits, inner: Mutex::new(Inner::default()), shared }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn purge(&self, inner: &mut Inner, force: bool) {
        let now = Instant::now();
        if !force && inner.last_purge.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        inner.last_purge = Some(now);
        let (l, ttl) = (&self.limits, self.limits.ttl);
        let mut freed = 0;
        inner.tasks.retain(|_, e| {
            let keep = now.duration_since(e.touched) < e.life(l);
            if !keep {
                freed += e.bytes;
            }
            keep
        });
        inner.contexts.retain(|_, c| {
            let keep = now.duration_since(c.touched) < ttl;
            if !keep {
                freed += c.bytes;
            }
            keep
        });
        inner.bytes = inner.bytes.saturating_sub(freed);
    }

    /// Makes room for `tasks` (0 or 1) more tasks and `bytes` more bytes of
    /// `owner` (see the module docs): terminal tasks give way, or the
    /// message is refused with the time until a task expires.
    fn room(
        &self,
        inner: &mut Inner,
        owner: &Owner,
        tasks: usize,
        bytes: usize,
        keep: Option<&str>,
    ) -> Result<(), Error> {
        let l = &self.limits;
        let mut purged = false;
        loop {
            let mine = inner.usage(owner);
            let (victim, refusal) = if mine.tasks + tasks > l.max_tasks_per_caller {
                (inner.first_to_go(owner, keep), (true, l.max_tasks_per_caller, "tasks", "--a2a-max-tasks-per-caller"))
            } else if mine.bytes + bytes > l.max_bytes_per_caller {
                (inner.first_to_go(owner, keep), (true, l.max_bytes_per_caller, "bytes", "--a2a-max-bytes-per-caller"))
            } else if inner.tasks.len() + tasks > l.max_tasks {
                (inner.first_to_go_of_largest(|u| u.tasks, keep), (false, l.max_tasks, "tasks", "--a2a-max-tasks"))
            } else if inner.bytes + bytes > l.max_bytes {
                (inner.first_to_go_of_largest(|u| u.bytes, keep), (false, l.max_bytes, "bytes", "--a2a-max-bytes"))
            } else {
                return Ok(());
            };
            if !purged {
                // expired tasks go first
                purged = true;
                self.purge(inner, true);
                continue;
            }
            let (own, limit, unit, flag) = refusal;
            match victim {
                Some(id) => inner.remove(&id),
                None => {
                    return Err(Error::Exhausted {
                        what: if own { "this caller's share of the task store" } else { "task store" },
                        limit,
                        unit,
                        flag,
                        retry_after_s: inner.retry_after_s(own.then_some(owner), l, Instant::now()),
                    })
                }
            }
        }
    }

    /// A new task of `owner` in its context `context_id` (a new context
    /// when `None`, or when `owner` holds none of that id) holding `first`
    /// in its history.
    pub fn create(
        &self,
        context_id: Option<String>,
        owner: &Owner,
        first: Message,
        state: TaskState,
    ) -> Result<Task, Error> {
        let (task, updated) = new_task(context_id, first, state);
        if let Some(s) = &self.shared {
            return s.create(task, owner, updated);
        }
        let id = task.id.clone();
        let held = Held::new(&task);
        let mut inner = self.lock();
        self.purge(&mut inner, false);
        let k = key(owner, &task.context_id);
        let context = if inner.contexts.contains_key(&k) { 0 } else { CONTEXT_BYTES + k.0.len() + k.1.len() };
        self.room(&mut inner, owner, 1, held.bytes(owner) + context, None)?;
        if context > 0 {
            inner.context_room(owner, self.limits.max_tasks_per_caller, self.limits.max_tasks);
        }
        let now = Instant::now();
        let inner = &mut *inner;
        let c = inner.contexts.entry(k.clone()).or_insert(ContextEntry { session: None, touched: now, bytes: 0 });
        c.touched = now;
        c.recount(&k, &mut inner.bytes);
        inner.seq += 1;
        let seq = inner.seq;
        let mut e = Entry { task: held, owner: owner.to_string(), touched: now, updated, seq, events: None, bytes: 0 };
        e.recount(&mut inner.bytes);
        inner.tasks.insert(id, e);
        Ok(task)
    }

    fn entry<'a>(tasks: &'a mut HashMap<String, Entry>, id: &str, owner: &Owner) -> Result<&'a mut Entry, Error> {
        match tasks.get_mut(id) {
            Some(e) if e.owner == owner => Ok(e),
            // another owner's task is as good as absent
            _ => Err(Error::TaskNotFound(id.to_string())),
        }
    }

    /// The task, if `owner` holds it.
    pub fn get(&self, id: &str, owner: &Owner) -> Result<Task, Error> {
        if let Some(s) = &self.shared {
            return s.get(id, owner);
        }
        let held = Self::entry(&mut self.lock().tasks, id, owner).map(|e| e.task.clone())?;
        Ok(held.parsed())
    }

    /// Adds `msg` to a task that is not terminal, as `state`.
    pub fn continue_task(&self, id: &str, owner: &Owner, mut msg: Message, state: TaskState) -> Result<Task, Error> {
        if let Some(s) = &self.shared {
            return s.continue_task(id, owner, msg, state);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let max = self.limits.max_history;
        Self::entry(&mut inner.tasks, id, owner)?;
        self.room(inner, owner, 0, message_bytes(&msg), Some(id))?;
        let e = Self::entry(&mut inner.tasks, id, owner)?;
        if e.task.state.is_terminal() {
            return Err(Error::Terminal { id: id.to_string(), state: e.task.state });
        }
        if let Some(c) = &msg.context_id {
            if *c != e.task.context_id {
                return Err(Error::InvalidParams(format!(
                    "message.contextId {c}: task {id} belongs to context {}",
                    e.task.context_id
                )));
            }
        }
        if e.task.history.len() + 2 > max {
            return Err(Error::InvalidParams(format!(
                "message: task {id} holds {} messages, the history limit is {max}; start a new task in context {}",
                e.task.history.len(),
                e.task.context_id
            )));
        }
        msg.context_id = Some(e.task.context_id.clone());
        e.task.history.push(json(&msg));
        let ctx = key(owner, &e.task.context_id);
        let out = Self::set_state(e, &mut inner.seq, state, None);
        e.recount(&mut inner.bytes);
        if let Some(c) = inner.contexts.get_mut(&ctx) {
            c.touched = Instant::now();
        }
        drop(guard);
        Ok(out.parsed())
    }

    fn set_state(e: &mut Entry, seq: &mut u64, state: TaskState, message: Option<Message>) -> Held {
        *seq += 1;
        e.seq = *seq;
        e.updated = SystemTime::now();
        e.touched = Instant::now();
        let status = TaskStatus { state, message, timestamp: rfc3339(e.updated) };
        e.task.set_status(&status);
        if let Some(m) = &status.message {
            e.task.history.push(json(m));
        }
        e.send(Event::Status(status));
        if state.is_terminal() {
            // the last event is sent: subscribers see the channel close
            e.events = None;
        }
        e.task.clone()
    }

    /// Moves a task to `state` with the agent's `message` (kept in its
    /// history) and `artifact`; a terminal task is left as it is.
    pub fn update(
        &self,
        id: &str,
        state: TaskState,
        message: Option<Message>,
        artifact: Option<Artifact>,
    ) -> Result<Task, Error> {
        if let Some(s) = &self.shared {
            return s.update(id, state, message, artifact);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let e = inner.tasks.get_mut(id).ok_or_else(|| Error::TaskNotFound(id.to_string()))?;
        if e.task.state.is_terminal() {
            return Err(Error::Terminal { id: id.to_string(), state: e.task.state });
        }
        if let Some(a) = artifact {
            e.task.artifacts.push(json(&a));
            e.send(Event::Artifact(a));
        }
        let out = Self::set_state(e, &mut inner.seq, state, message);
        e.recount(&mut inner.bytes);
        drop(guard);
        Ok(out.parsed())
    }

    /// Takes back the message last accepted into task `id` (the engine was
    /// at capacity and the client is told to retry): a new task (`prev`
    /// `None`) is removed, a continued one returns to `prev` without that
    /// message. A task canceled meanwhile stays canceled.
    pub fn take_back(&self, id: &str, prev: Option<TaskStatus>) {
        if let Some(s) = &self.shared {
            return s.take_back(id, prev);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(e) = inner.tasks.get_mut(id) else { return };
        if e.task.state.is_terminal() {
            return;
        }
        match prev {
            None => {
                inner.bytes = inner.bytes.saturating_sub(e.bytes);
                inner.tasks.remove(id);
            }
            Some(prev) => {
                e.task.history.pop();
                inner.seq += 1;
                e.seq = inner.seq;
                e.task.set_status(&prev);
                e.send(Event::Status(prev));
                e.recount(&mut inner.bytes);
            }
        }
    }

    /// Cancels a task that is not terminal.
    pub fn cancel(&self, id: &str, owner: &Owner) -> Result<Task, Error> {
        if let Some(s) = &self.shared {
            return s.cancel(id, owner);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let e = Self::entry(&mut inner.tasks, id, owner)?;
        if e.task.state.is_terminal() {
            return Err(Error::NotCancelable { id: id.to_string(), state: e.task.state });
        }
        let msg =
            Message::agent(id, &e.task.context_id.clone(), vec![super::types::Part::text("canceled by the client")]);
        let out = Self::set_state(e, &mut inner.seq, TaskState::Canceled, Some(msg));
        e.recount(&mut inner.bytes);
        drop(guard);
        Ok(out.parsed())
    }

    /// The task and a receiver of its later events; a terminal task has none.
    pub fn subscribe(&self, id: &str, owner: &Owner) -> Result<(Task, broadcast::Receiver<Event>), Error> {
        if let Some(s) = &self.shared {
            return s.subscribe(id, owner);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let e = Self::entry(&mut inner.tasks, id, owner)?;
        if e.task.state.is_terminal() {
            return Err(Error::Unsupported(format!(
                "SubscribeToTask: task {id} is {} (terminal); read it with GetTask",
                e.task.state.name()
            )));
        }
        let rx = e.events.get_or_insert_with(|| broadcast::channel(16).0).subscribe();
        e.recount(&mut inner.bytes);
        let held = e.task.clone();
        drop(guard);
        Ok((held.parsed(), rx))
    }

    /// How many of `owner`'s tasks match `filter`, and the `page` of them,
    /// most recently updated first: references are sorted, only the page is
    /// copied.
    pub fn list(&self, filter: &ListFilter, owner: &Owner, page: Page) -> Result<(usize, Vec<Task>), Error> {
        if let Some(s) = &self.shared {
            return s.list(filter, owner, page);
        }
        let mut inner = self.lock();
        self.purge(&mut inner, false);
        let mut hits: Vec<&Entry> = inner
            .tasks
            .values()
            .filter(|e| e.owner == owner)
            .filter(|e| filter.context_id.as_ref().is_none_or(|c| *c == e.task.context_id))
            .filter(|e| filter.state.is_none_or(|s| s == e.task.state))
            .filter(|e| filter.updated_after.is_none_or(|t| e.updated > t))
            .collect();
        hits.sort_unstable_by_key(|e| std::cmp::Reverse(e.seq));
        let total = hits.len();
        let views: Vec<Held> = hits
            .into_iter()
            .skip(page.offset)
            .take(page.size)
            .map(|e| e.task.view(page.history, page.artifacts))
            .collect();
        drop(inner);
        Ok((total, views.iter().map(Held::parsed).collect()))
    }

    /// The SCD session of `owner`'s context `context_id`.
    pub fn session(&self, owner: &Owner, context_id: &str) -> Result<Option<Session>, Error> {
        if let Some(s) = &self.shared {
            return s.session(owner, context_id);
        }
        Ok(self.lock().contexts.get(&key(owner, context_id)).and_then(|c| c.session.clone()))
    }

    /// Sets the SCD session of `owner`'s context `context_id`, returning the
    /// one it replaces.
    pub fn set_session(&self, owner: &Owner, context_id: &str, session: Session) -> Result<Option<Session>, Error> {
        if let Some(s) = &self.shared {
            return s.set_session(owner, context_id, session);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let k = key(owner, context_id);
        let Some(c) = inner.contexts.get_mut(&k) else { return Ok(None) };
        let old = c.session.replace(session);
        c.recount(&k, &mut inner.bytes);
        Ok(old)
    }

    /// Forgets the SCD session `session_id` of `owner`'s context
    /// `context_id` (it is gone from the engine); a newer session is kept.
    pub fn clear_session(&self, owner: &Owner, context_id: &str, session_id: &str) {
        if let Some(s) = &self.shared {
            return s.clear_session(owner, context_id, session_id);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let k = key(owner, context_id);
        if let Some(c) = inner.contexts.get_mut(&k) {
            if c.session.as_ref().is_some_and(|s| s.id == session_id) {
                c.session = None;
                c.recount(&k, &mut inner.bytes);
            }
        }
    }

    /// Tasks held, and the bytes they (and the contexts) are counted as.
    pub fn count(&self) -> Result<(usize, usize), Error> {
        if let Some(s) = &self.shared {
            return s.count();
        }
        let inner = self.lock();
        Ok((inner.tasks.len(), inner.bytes))
    }

    /// Whether subscribers hear every replica's updates: always in memory;
    /// with a shared store, once its Pub/Sub subscription is made.
    pub fn listening(&self) -> bool {
        self.shared.as_ref().is_none_or(shared::Shared::listening)
    }

    /// Tasks held in this process (a shared store: see [`Store::count`]).
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// Bytes the tasks held in this process are counted as.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// No tasks held in this process.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
