//! The bounded task store: at most `max_tasks` tasks (and as many
//! contexts) holding at most `max_bytes` together (each task counted as its
//! JSON size, kept as a running sum; checked when a message is accepted,
//! while results, bounded by their budget, are always stored), each dropped
//! `ttl` after its last update; terminal states are
//! immutable; each context holds its SCD session (id and token stay on the
//! server) and the caller (DID) it is bound to.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

use super::types::{rfc3339, uuid_v4, Artifact, Message, Task, TaskState, TaskStatus};
use super::Error;

/// One change of a task, as sent to its subscribers.
#[derive(Debug, Clone)]
pub enum Event {
    /// A new status; `terminal` is the last event of the task.
    Status(TaskStatus),
    /// A new artifact.
    Artifact(Artifact),
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
    /// Bytes all tasks may hold together (their JSON size).
    pub max_bytes: usize,
}

impl Default for StoreLimits {
    /// 10,000 tasks, one hour, 100 messages, 256 MiB.
    fn default() -> Self {
        Self { max_tasks: 10_000, ttl: Duration::from_secs(3600), max_history: 100, max_bytes: 256 << 20 }
    }
}

/// The bytes a task is counted as: its JSON size.
fn task_bytes(t: &Task) -> usize {
    serde_json::to_vec(t).map_or(0, |v| v.len())
}

fn message_bytes(m: &Message) -> usize {
    serde_json::to_vec(m).map_or(0, |v| v.len())
}

struct Entry {
    task: Task,
    caller: Option<String>,
    touched: Instant,
    updated: SystemTime,
    /// Order of last update (ties of `updated` broken by it).
    seq: u64,
    events: broadcast::Sender<Event>,
    /// What it is counted as in [`Inner::bytes`].
    bytes: usize,
}

impl Entry {
    /// Recounts the task's bytes into the store's running sum.
    fn recount(&mut self, total: &mut usize) {
        let now = task_bytes(&self.task);
        *total = total.saturating_sub(self.bytes) + now;
        self.bytes = now;
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
    caller: Option<String>,
    session: Option<Session>,
    touched: Instant,
}

#[derive(Default)]
struct Inner {
    tasks: HashMap<String, Entry>,
    contexts: HashMap<String, ContextEntry>,
    last_purge: Option<Instant>,
    seq: u64,
    /// Bytes of all tasks (the sum of their `Entry::bytes`).
    bytes: usize,
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

/// A copy of `t` with the last `history` messages and, when `artifacts`,
/// its artifacts (nothing else of its history is copied).
fn view(t: &Task, history: usize, artifacts: bool) -> Task {
    Task {
        id: t.id.clone(),
        context_id: t.context_id.clone(),
        status: t.status.clone(),
        artifacts: if artifacts { t.artifacts.clone() } else { Vec::new() },
        history: t.history[t.history.len().saturating_sub(history)..].to_vec(),
    }
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
        Self { limits, inner: Mutex::new(Inner::default()) }
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
        let ttl = self.limits.ttl;
        let mut freed = 0;
        inner.tasks.retain(|_, e| {
            let keep = now.duration_since(e.touched) < ttl;
            if !keep {
                freed += e.bytes;
            }
            keep
        });
        inner.bytes = inner.bytes.saturating_sub(freed);
        inner.contexts.retain(|_, c| now.duration_since(c.touched) < ttl);
    }

    /// A new task in `context_id` (a new context when `None`) holding `first`
    /// in its history, bound to `caller`.
    pub fn create(
        &self,
        context_id: Option<String>,
        caller: Option<&str>,
        mut first: Message,
        state: TaskState,
    ) -> Result<Task, Error> {
        let mut inner = self.lock();
        self.purge(&mut inner, false);
        if inner.tasks.len() >= self.limits.max_tasks {
            self.purge(&mut inner, true);
        }
        let full = inner.tasks.len() >= self.limits.max_tasks;
        let new_context = context_id.as_ref().is_none_or(|c| !inner.contexts.contains_key(c));
        if full || (new_context && inner.contexts.len() >= self.limits.max_tasks) {
            return Err(Error::Exhausted {
                what: "task store",
                limit: self.limits.max_tasks,
                unit: "tasks",
                flag: "--a2a-max-tasks",
                retry_after_s: 1,
            });
        }
        let size = message_bytes(&first);
        if inner.bytes + size > self.limits.max_bytes {
            self.purge(&mut inner, true);
        }
        self.check_bytes(&inner, size)?;
        let context_id = context_id.unwrap_or_else(uuid_v4);
        let now = Instant::now();
        let ctx = inner.contexts.entry(context_id.clone()).or_insert(ContextEntry {
            caller: caller.map(str::to_string),
            session: None,
            touched: now,
        });
        if ctx.caller.as_deref() != caller {
            return Err(Error::InvalidParams(format!("message.contextId {context_id}: bound to another caller")));
        }
        ctx.touched = now;
        let id = uuid_v4();
        first.task_id = Some(id.clone());
        first.context_id = Some(context_id.clone());
        let updated = SystemTime::now();
        let task = Task {
            id: id.clone(),
            context_id,
            status: TaskStatus { state, message: None, timestamp: rfc3339(updated) },
            artifacts: Vec::new(),
            history: vec![first],
        };
        let (events, _) = broadcast::channel(16);
        inner.seq += 1;
        let seq = inner.seq;
        let mut e = Entry {
            task: task.clone(),
            caller: caller.map(str::to_string),
            touched: now,
            updated,
            seq,
            events,
            bytes: 0,
        };
        e.recount(&mut inner.bytes);
        inner.tasks.insert(id, e);
        Ok(task)
    }

    /// Refuses `more` bytes past `--a2a-max-bytes`.
    fn check_bytes(&self, inner: &Inner, more: usize) -> Result<(), Error> {
        if inner.bytes + more > self.limits.max_bytes {
            return Err(Error::Exhausted {
                what: "task store",
                limit: self.limits.max_bytes,
                unit: "bytes",
                flag: "--a2a-max-bytes",
                retry_after_s: 1,
            });
        }
        Ok(())
    }

    fn entry<'a>(
        tasks: &'a mut HashMap<String, Entry>,
        id: &str,
        caller: Option<&str>,
    ) -> Result<&'a mut Entry, Error> {
        match tasks.get_mut(id) {
            Some(e) if e.caller.as_deref() == caller => Ok(e),
            // another caller's task is as good as absent
            _ => Err(Error::TaskNotFound(id.to_string())),
        }
    }

    /// The task, if `caller` may see it.
    pub fn get(&self, id: &str, caller: Option<&str>) -> Result<Task, Error> {
        Self::entry(&mut self.lock().tasks, id, caller).map(|e| e.task.clone())
    }

    /// Adds `msg` to a task that is not terminal, as `state`.
    pub fn continue_task(
        &self,
        id: &str,
        caller: Option<&str>,
        mut msg: Message,
        state: TaskState,
    ) -> Result<Task, Error> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let max = self.limits.max_history;
        self.check_bytes(inner, message_bytes(&msg))?;
        let e = Self::entry(&mut inner.tasks, id, caller)?;
        if e.task.status.state.is_terminal() {
            return Err(Error::Terminal { id: id.to_string(), state: e.task.status.state });
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
        e.task.history.push(msg);
        let ctx = e.task.context_id.clone();
        let out = Self::set_state(e, &mut inner.seq, state, None);
        e.recount(&mut inner.bytes);
        if let Some(c) = inner.contexts.get_mut(&ctx) {
            c.touched = Instant::now();
        }
        Ok(out)
    }

    fn set_state(e: &mut Entry, seq: &mut u64, state: TaskState, message: Option<Message>) -> Task {
        *seq += 1;
        e.seq = *seq;
        e.updated = SystemTime::now();
        e.touched = Instant::now();
        e.task.status = TaskStatus { state, message: message.clone(), timestamp: rfc3339(e.updated) };
        if let Some(m) = message {
            e.task.history.push(m);
        }
        let _ = e.events.send(Event::Status(e.task.status.clone()));
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
        let mut guard = self.lock();
        let inner = &mut *guard;
        let e = inner.tasks.get_mut(id).ok_or_else(|| Error::TaskNotFound(id.to_string()))?;
        if e.task.status.state.is_terminal() {
            return Err(Error::Terminal { id: id.to_string(), state: e.task.status.state });
        }
        if let Some(a) = artifact {
            e.task.artifacts.push(a.clone());
            let _ = e.events.send(Event::Artifact(a));
        }
        let out = Self::set_state(e, &mut inner.seq, state, message);
        e.recount(&mut inner.bytes);
        Ok(out)
    }

    /// Takes back the message last accepted into task `id` (the engine was
    /// at capacity and the client is told to retry): a new task (`prev`
    /// `None`) is removed, a continued one returns to `prev` without that
    /// message. A task canceled meanwhile stays canceled.
    pub fn take_back(&self, id: &str, prev: Option<TaskStatus>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(e) = inner.tasks.get_mut(id) else { return };
        if e.task.status.state.is_terminal() {
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
                e.task.status = prev;
                let _ = e.events.send(Event::Status(e.task.status.clone()));
                e.recount(&mut inner.bytes);
            }
        }
    }

    /// Cancels a task that is not terminal.
    pub fn cancel(&self, id: &str, caller: Option<&str>) -> Result<Task, Error> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let e = Self::entry(&mut inner.tasks, id, caller)?;
        if e.task.status.state.is_terminal() {
            return Err(Error::NotCancelable { id: id.to_string(), state: e.task.status.state });
        }
        let msg =
            Message::agent(id, &e.task.context_id.clone(), vec![super::types::Part::text("canceled by the client")]);
        let out = Self::set_state(e, &mut inner.seq, TaskState::Canceled, Some(msg));
        e.recount(&mut inner.bytes);
        Ok(out)
    }

    /// The task and a receiver of its later events; a terminal task has none.
    pub fn subscribe(&self, id: &str, caller: Option<&str>) -> Result<(Task, broadcast::Receiver<Event>), Error> {
        let mut inner = self.lock();
        let e = Self::entry(&mut inner.tasks, id, caller)?;
        if e.task.status.state.is_terminal() {
            return Err(Error::Unsupported(format!(
                "SubscribeToTask: task {id} is {} (terminal); read it with GetTask",
                e.task.status.state.name()
            )));
        }
        Ok((e.task.clone(), e.events.subscribe()))
    }

    /// How many of `caller`'s tasks match `filter`, and the `page` of them,
    /// most recently updated first: references are sorted, only the page is
    /// copied.
    pub fn list(&self, filter: &ListFilter, caller: Option<&str>, page: Page) -> (usize, Vec<Task>) {
        let mut inner = self.lock();
        self.purge(&mut inner, false);
        let mut hits: Vec<&Entry> = inner
            .tasks
            .values()
            .filter(|e| e.caller.as_deref() == caller)
            .filter(|e| filter.context_id.as_ref().is_none_or(|c| *c == e.task.context_id))
            .filter(|e| filter.state.is_none_or(|s| s == e.task.status.state))
            .filter(|e| filter.updated_after.is_none_or(|t| e.updated > t))
            .collect();
        hits.sort_unstable_by_key(|e| std::cmp::Reverse(e.seq));
        let total = hits.len();
        let tasks = hits
            .into_iter()
            .skip(page.offset)
            .take(page.size)
            .map(|e| view(&e.task, page.history, page.artifacts))
            .collect();
        (total, tasks)
    }

    /// The SCD session of `context_id`.
    pub fn session(&self, context_id: &str) -> Option<Session> {
        self.lock().contexts.get(context_id).and_then(|c| c.session.clone())
    }

    /// Sets the SCD session of `context_id`, returning the one it replaces.
    pub fn set_session(&self, context_id: &str, session: Session) -> Option<Session> {
        self.lock().contexts.get_mut(context_id).and_then(|c| c.session.replace(session))
    }

    /// Forgets the SCD session `session_id` of `context_id` (it is gone
    /// from the engine); a newer session is kept.
    pub fn clear_session(&self, context_id: &str, session_id: &str) {
        if let Some(c) = self.lock().contexts.get_mut(context_id) {
            if c.session.as_ref().is_some_and(|s| s.id == session_id) {
                c.session = None;
            }
        }
    }

    /// Tasks held.
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// Bytes the tasks held are counted as.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// No tasks held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::types::{Part, Role};
    use super::*;

    fn msg(text: &str) -> Message {
        Message {
            message_id: uuid_v4(),
            context_id: None,
            task_id: None,
            role: Role::User,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: vec![],
            reference_task_ids: vec![],
        }
    }

    fn store(max_tasks: usize) -> Store {
        Store::new(StoreLimits { max_tasks, ttl: Duration::from_secs(3600), max_history: 4, max_bytes: 1 << 20 })
    }

    #[test]
    fn terminal_states_are_immutable() {
        let s = store(10);
        let t = s.create(None, None, msg("a"), TaskState::Working).unwrap();
        s.update(&t.id, TaskState::Completed, None, None).unwrap();
        let err = s.update(&t.id, TaskState::Failed, None, None).unwrap_err();
        assert_eq!(err.code(), -32004);
        assert!(matches!(s.cancel(&t.id, None).unwrap_err(), Error::NotCancelable { .. }));
        assert!(matches!(s.continue_task(&t.id, None, msg("b"), TaskState::Working), Err(Error::Terminal { .. })));
        let got = s.get(&t.id, None).unwrap();
        assert_eq!(got.status.state, TaskState::Completed);
        assert_eq!(got.history.len(), 1);
    }

    #[test]
    fn the_store_is_bounded_and_another_callers_tasks_are_not_found() {
        let s = store(2);
        let a = s.create(None, Some("did:wba:a"), msg("a"), TaskState::Working).unwrap();
        s.create(Some(a.context_id.clone()), Some("did:wba:a"), msg("b"), TaskState::Working).unwrap();
        let full = s.create(None, None, msg("c"), TaskState::Working).unwrap_err();
        assert_eq!(
            full.to_string(),
            "resource exhausted: task store holds 2 tasks (the limit, --a2a-max-tasks); retry after 1 s"
        );
        assert!(matches!(s.get(&a.id, Some("did:wba:b")), Err(Error::TaskNotFound(_))));
        assert!(matches!(s.cancel(&a.id, None), Err(Error::TaskNotFound(_))));
        let all = Page { offset: 0, size: 10, history: 0, artifacts: false };
        assert_eq!(s.list(&ListFilter::default(), Some("did:wba:a"), all).0, 2);
        assert_eq!(s.list(&ListFilter::default(), None, all), (0, vec![]));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn the_store_is_bounded_in_bytes_as_a_running_sum() {
        let s = Store::new(StoreLimits { max_bytes: 2000, ..StoreLimits::default() });
        let t = s.create(None, None, msg(&"a".repeat(600)), TaskState::Working).unwrap();
        let one = s.bytes();
        assert_eq!(one, task_bytes(&t));
        s.update(&t.id, TaskState::InputRequired, Some(msg("b")), None).unwrap();
        assert_eq!(s.bytes(), task_bytes(&s.get(&t.id, None).unwrap()), "recounted on update");
        s.create(None, None, msg(&"a".repeat(600)), TaskState::Working).unwrap();
        let full = s.create(None, None, msg(&"a".repeat(600)), TaskState::Working).unwrap_err();
        assert_eq!(full.code(), -32000);
        assert_eq!(
            full.to_string(),
            "resource exhausted: task store holds 2000 bytes (the limit, --a2a-max-bytes); retry after 1 s"
        );
        let over = s.continue_task(&t.id, None, msg(&"c".repeat(900)), TaskState::Working).unwrap_err();
        assert!(over.to_string().contains("--a2a-max-bytes"), "{over}");
        assert_eq!(s.len(), 2);
        s.take_back(&t.id, None);
        assert_eq!(s.len(), 1);
        assert!(s.bytes() < one + 100, "a removed task's bytes are freed: {}", s.bytes());
    }

    #[test]
    fn a_list_page_is_sorted_then_copied_trimmed() {
        let s = store(10);
        let ids: Vec<String> =
            (0..5).map(|i| s.create(None, None, msg(&format!("m{i}")), TaskState::Working).unwrap().id).collect();
        s.update(&ids[0], TaskState::Completed, Some(msg("done")), None).unwrap();
        let (total, page) =
            s.list(&ListFilter::default(), None, Page { offset: 1, size: 2, history: 1, artifacts: false });
        assert_eq!(total, 5);
        // most recently updated first: 0 (just updated), 4, 3, ...
        assert_eq!(page.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [ids[4].as_str(), ids[3].as_str()]);
        assert_eq!(page[0].history.len(), 1);
        let (_, first) =
            s.list(&ListFilter::default(), None, Page { offset: 0, size: 1, history: 0, artifacts: false });
        assert_eq!(first[0].id, ids[0]);
        assert!(first[0].history.is_empty());
        let (_, past) = s.list(&ListFilter::default(), None, Page { offset: 9, size: 5, history: 0, artifacts: false });
        assert!(past.is_empty());
    }

    #[test]
    fn history_is_bounded_and_the_context_must_match() {
        let s = store(10);
        let t = s.create(None, None, msg("a"), TaskState::InputRequired).unwrap();
        let t2 = s.continue_task(&t.id, None, msg("b"), TaskState::InputRequired).unwrap();
        assert_eq!(t2.history.len(), 2);
        let mut other = msg("c");
        other.context_id = Some("elsewhere".into());
        assert!(s
            .continue_task(&t.id, None, other, TaskState::InputRequired)
            .unwrap_err()
            .to_string()
            .contains("belongs to context"));
        s.continue_task(&t.id, None, msg("d"), TaskState::InputRequired).unwrap();
        let over = s.continue_task(&t.id, None, msg("e"), TaskState::InputRequired).unwrap_err();
        assert!(over.to_string().contains("history limit is 4"), "{over}");
        assert_eq!(trim_history(s.get(&t.id, None).unwrap(), Some(1)).history.len(), 1);
    }

    #[test]
    fn subscribers_see_updates_until_terminal() {
        let s = store(10);
        let t = s.create(None, None, msg("a"), TaskState::Working).unwrap();
        let (_, mut rx) = s.subscribe(&t.id, None).unwrap();
        s.update(&t.id, TaskState::Completed, None, None).unwrap();
        assert!(matches!(rx.try_recv().unwrap(), Event::Status(st) if st.state == TaskState::Completed));
        assert!(matches!(s.subscribe(&t.id, None), Err(Error::Unsupported(_))));
    }
}
