//! The task store on Redis (`scd serve --state`): the same operations and
//! bounds as the in-memory store, run as scripts by
//! [`crate::redis::tasks`], so that any replica serves any task and
//! context. Subscribers get the events of every replica through Redis
//! Pub/Sub, handed to a local broadcast channel per task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

use super::{ceil_s, json, parse, Event, ListFilter, Owner, Page, Session, StoreLimits, CONTEXT_BYTES, ENTRY_BYTES};
use crate::a2a::types::{rfc3339, Artifact, Message, Part, Task, TaskState, TaskStatus};
use crate::a2a::Error;
use crate::redis::tasks::{Bounds, Heard, RawEvent, RawTask, RedisTasks, Refusal};

/// A task's local subscribers, by task id.
type Subscribers = Mutex<HashMap<String, broadcast::Sender<Event>>>;

/// The task store on Redis.
pub(super) struct Shared {
    redis: Arc<RedisTasks>,
    bounds: Bounds,
    max_history: usize,
    subs: Arc<Subscribers>,
    /// Subscribed to the events of every replica (false while resubscribing).
    listening: Arc<AtomicBool>,
}

fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Runs a blocking call to Redis without stalling the runtime's other
/// tasks (on a multi-threaded runtime).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A status as held: its state's name, timestamp and message (JSON).
fn status(state: &str, timestamp: &str, message: &str) -> Option<TaskStatus> {
    Some(TaskStatus {
        state: TaskState::parse(state)?,
        message: if message.is_empty() { None } else { parse(message) },
        timestamp: timestamp.to_string(),
    })
}

/// Hands an event heard on the store to the task's local subscribers; a
/// new subscription tells every one of them to read its task again.
fn dispatch(subs: &Subscribers, heard: Heard<'_>) {
    let mut map = subs.lock().unwrap_or_else(|p| p.into_inner());
    map.retain(|_, tx| tx.receiver_count() > 0);
    let (id, raw) = match heard {
        Heard::Subscribed => {
            for tx in map.values() {
                let _ = tx.send(Event::Resync);
            }
            return;
        }
        Heard::Lost => return,
        Heard::Event(id, raw) => (id, raw),
    };
    let Some(tx) = map.get(id) else { return };
    let event = match raw {
        RawEvent::Artifact(a) => match parse::<Artifact>(&a) {
            Some(a) => Event::Artifact(a),
            None => return,
        },
        RawEvent::Status(st, ts, m) => match status(&st, &ts, &m) {
            Some(s) => Event::Status(s),
            None => Event::Resync,
        },
    };
    let end = matches!(&event, Event::Status(s) if s.state.is_terminal());
    let _ = tx.send(event);
    if end {
        // the last event is sent: subscribers see the channel close
        map.remove(id);
    }
}

impl Shared {
    /// The store on `redis` with `limits`; starts listening to its events.
    pub(super) fn new(redis: Arc<RedisTasks>, limits: &StoreLimits) -> Self {
        let subs: Arc<Subscribers> = Arc::default();
        let listening = Arc::new(AtomicBool::new(false));
        let (heard, on) = (Arc::downgrade(&subs), listening.clone());
        redis.listen(
            Arc::downgrade(&subs),
            Box::new(move |ev| {
                match ev {
                    Heard::Subscribed => on.store(true, Ordering::Release),
                    Heard::Lost => on.store(false, Ordering::Release),
                    Heard::Event(..) => {}
                }
                if let Some(subs) = heard.upgrade() {
                    dispatch(&subs, ev);
                }
            }),
        );
        let bounds = Bounds {
            ttl: limits.ttl,
            max_tasks: limits.max_tasks,
            max_bytes: limits.max_bytes,
            tasks_per_owner: limits.max_tasks_per_caller,
            bytes_per_owner: limits.max_bytes_per_caller,
            task_bytes: ENTRY_BYTES,
            context_bytes: CONTEXT_BYTES,
            waiting_ttl: limits.waiting_ttl,
        };
        Self { redis, bounds, max_history: limits.max_history, subs, listening }
    }

    pub(super) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    fn unavailable(&self, e: scd_engine::shared::StoreError) -> Error {
        Error::StoreUnavailable { store: self.redis.name().to_string(), reason: e.to_string() }
    }

    /// A refusal as the in-memory store words it.
    fn refused(&self, r: Refusal, id: &str, ctx: &str) -> Error {
        match r {
            Refusal::NotFound => Error::TaskNotFound(id.to_string()),
            Refusal::Terminal(st) => match TaskState::parse(&st) {
                Some(state) => Error::Terminal { id: id.to_string(), state },
                None => Error::Internal(format!("task {id}: the store holds an unknown state")),
            },
            Refusal::History(n) => Error::InvalidParams(format!(
                "message: task {id} holds {n} messages, the history limit is {}; start a new task in context {ctx}",
                self.max_history
            )),
            Refusal::Full { own, unit, retry_ms } => {
                let b = &self.bounds;
                let (limit, flag) = match (own, unit) {
                    (true, "bytes") => (b.bytes_per_owner, "--a2a-max-bytes-per-caller"),
                    (true, _) => (b.tasks_per_owner, "--a2a-max-tasks-per-caller"),
                    (false, "bytes") => (b.max_bytes, "--a2a-max-bytes"),
                    (false, _) => (b.max_tasks, "--a2a-max-tasks"),
                };
                Error::Exhausted {
                    what: if own { "this caller's share of the task store" } else { "task store" },
                    limit,
                    unit,
                    flag,
                    retry_after_s: ceil_s(std::time::Duration::from_millis(retry_ms)),
                }
            }
        }
    }

    fn task(&self, raw: RawTask) -> Result<Task, Error> {
        let status = status(&raw.state, &raw.timestamp, raw.message.as_deref().unwrap_or(""))
            .ok_or_else(|| Error::Internal(format!("task {}: the store holds an unknown state", raw.id)))?;
        Ok(Task {
            id: raw.id,
            context_id: raw.context_id,
            status,
            artifacts: raw.artifacts.iter().filter_map(|a| parse(a)).collect(),
            history: raw.history.iter().filter_map(|m| parse(m)).collect(),
        })
    }

    /// Stores `task`, new (see `new_task`), made at `updated`.
    pub(super) fn create(&self, task: Task, owner: &Owner, updated: SystemTime) -> Result<Task, Error> {
        let held = json(&task.history[0]);
        let state = task.status.state;
        blocking(|| {
            self.redis.create(
                &self.bounds,
                owner,
                &task.context_id,
                &task.id,
                &held,
                state.name(),
                &task.status.timestamp,
                micros(updated),
                state.is_terminal(),
            )
        })
        .map_err(|e| self.unavailable(e))?
        .map_err(|r| self.refused(r, &task.id, &task.context_id))?;
        Ok(task)
    }

    fn fetch(&self, id: &str, owner: &Owner, live_only: bool) -> Result<Task, Error> {
        let raw = blocking(|| self.redis.get(&self.bounds, owner, id, None, live_only))
            .map_err(|e| self.unavailable(e))?
            .map_err(|r| self.refused(r, id, ""))?;
        self.task(raw)
    }

    pub(super) fn get(&self, id: &str, owner: &Owner) -> Result<Task, Error> {
        self.fetch(id, owner, false)
    }

    pub(super) fn continue_task(
        &self,
        id: &str,
        owner: &Owner,
        mut msg: Message,
        state: TaskState,
    ) -> Result<Task, Error> {
        // a task's context never changes: read once, checked here
        let t = self.get(id, owner)?;
        if t.status.state.is_terminal() {
            return Err(Error::Terminal { id: id.to_string(), state: t.status.state });
        }
        if let Some(c) = &msg.context_id {
            if *c != t.context_id {
                return Err(Error::InvalidParams(format!(
                    "message.contextId {c}: task {id} belongs to context {}",
                    t.context_id
                )));
            }
        }
        msg.context_id = Some(t.context_id.clone());
        let updated = SystemTime::now();
        let held = json(&msg);
        let raw = blocking(|| {
            self.redis.continue_task(
                &self.bounds,
                owner,
                id,
                &held,
                state.name(),
                &rfc3339(updated),
                micros(updated),
                self.max_history,
                state.is_terminal(),
            )
        })
        .map_err(|e| self.unavailable(e))?
        .map_err(|r| self.refused(r, id, &t.context_id))?;
        self.task(raw)
    }

    fn set_state(
        &self,
        id: &str,
        owner: Option<&Owner>,
        state: TaskState,
        message: Option<&Message>,
        artifact: Option<&Artifact>,
    ) -> Result<Result<Task, Refusal>, Error> {
        let updated = SystemTime::now();
        let (m, a) = (message.map(json), artifact.map(json));
        let raw = blocking(|| {
            self.redis.update(
                &self.bounds,
                owner,
                id,
                state.name(),
                &rfc3339(updated),
                micros(updated),
                m.as_deref(),
                a.as_deref(),
                state.is_terminal(),
            )
        })
        .map_err(|e| self.unavailable(e))?;
        match raw {
            Ok(raw) => self.task(raw).map(Ok),
            Err(r) => Ok(Err(r)),
        }
    }

    pub(super) fn update(
        &self,
        id: &str,
        state: TaskState,
        message: Option<Message>,
        artifact: Option<Artifact>,
    ) -> Result<Task, Error> {
        self.set_state(id, None, state, message.as_ref(), artifact.as_ref())?.map_err(|r| self.refused(r, id, ""))
    }

    pub(super) fn take_back(&self, id: &str, prev: Option<TaskStatus>) {
        let m = prev.as_ref().and_then(|p| p.message.as_ref()).map(json).unwrap_or_default();
        let args = prev.as_ref().map(|p| [p.state.name(), p.timestamp.as_str(), &*m]);
        if let Err(e) = blocking(|| self.redis.take_back(&self.bounds, id, args)) {
            tracing::warn!(task = %id, store = self.redis.name(), error = %e, "A2A: a message could not be taken back");
        }
    }

    pub(super) fn cancel(&self, id: &str, owner: &Owner) -> Result<Task, Error> {
        let t = self.get(id, owner)?;
        if t.status.state.is_terminal() {
            return Err(Error::NotCancelable { id: id.to_string(), state: t.status.state });
        }
        let msg = Message::agent(id, &t.context_id, vec![Part::text("canceled by the client")]);
        match self.set_state(id, Some(owner), TaskState::Canceled, Some(&msg), None)? {
            Ok(t) => Ok(t),
            Err(Refusal::Terminal(st)) => Err(Error::NotCancelable {
                id: id.to_string(),
                state: TaskState::parse(&st).unwrap_or(TaskState::Canceled),
            }),
            Err(r) => Err(self.refused(r, id, &t.context_id)),
        }
    }

    pub(super) fn subscribe(&self, id: &str, owner: &Owner) -> Result<(Task, broadcast::Receiver<Event>), Error> {
        // listen first, then read: no event falls between the two (one
        // may come twice)
        let rx = self
            .subs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_insert_with(|| broadcast::channel(16).0)
            .subscribe();
        let refused = match self.fetch(id, owner, true) {
            Ok(t) => return Ok((t, rx)),
            Err(Error::Terminal { state, .. }) => Error::Unsupported(format!(
                "SubscribeToTask: task {id} is {} (terminal); read it with GetTask",
                state.name()
            )),
            Err(e) => e,
        };
        // no channel stays for a task that was not subscribed to
        drop(rx);
        let mut map = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(id).is_some_and(|tx| tx.receiver_count() == 0) {
            map.remove(id);
        }
        Err(refused)
    }

    pub(super) fn list(&self, filter: &ListFilter, owner: &Owner, page: Page) -> Result<(usize, Vec<Task>), Error> {
        let f = (filter.context_id.as_deref(), filter.state.map(TaskState::name), filter.updated_after.map(micros));
        let (total, raw) =
            blocking(|| self.redis.list(&self.bounds, owner, f, page.offset, page.size, page.history, page.artifacts))
                .map_err(|e| self.unavailable(e))?;
        Ok((total, raw.into_iter().map(|r| self.task(r)).collect::<Result<_, _>>()?))
    }

    fn session_of(pair: Option<(String, String)>) -> Option<Session> {
        pair.filter(|(id, _)| !id.is_empty()).map(|(id, token)| Session { id, token })
    }

    pub(super) fn session(&self, owner: &Owner, context_id: &str) -> Result<Option<Session>, Error> {
        blocking(|| self.redis.session(&self.bounds, owner, context_id))
            .map(Self::session_of)
            .map_err(|e| self.unavailable(e))
    }

    pub(super) fn set_session(
        &self,
        owner: &Owner,
        context_id: &str,
        session: Session,
    ) -> Result<Option<Session>, Error> {
        blocking(|| self.redis.set_session(&self.bounds, owner, context_id, &session.id, &session.token))
            .map(Self::session_of)
            .map_err(|e| self.unavailable(e))
    }

    pub(super) fn clear_session(&self, owner: &Owner, context_id: &str, session_id: &str) {
        if let Err(e) = blocking(|| self.redis.clear_session(&self.bounds, owner, context_id, session_id)) {
            tracing::warn!(store = self.redis.name(), error = %e, "A2A: a gone session could not be cleared");
        }
    }

    pub(super) fn count(&self) -> Result<(usize, usize), Error> {
        blocking(|| self.redis.count(&self.bounds)).map_err(|e| self.unavailable(e))
    }
}
