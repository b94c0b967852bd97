//! The task store's tests.

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
    Store::new(StoreLimits {
        max_tasks,
        ttl: Duration::from_secs(3600),
        max_history: 4,
        max_bytes: 1 << 20,
        max_tasks_per_caller: max_tasks,
        max_bytes_per_caller: 1 << 20,
        ..StoreLimits::default()
    })
}

/// A store of `max_tasks`, `share` of them per owner, tasks kept `ttl`.
fn shared(max_tasks: usize, share: usize, ttl: Duration) -> Store {
    Store::new(StoreLimits { max_tasks, max_tasks_per_caller: share, ttl, ..StoreLimits::default() })
}

fn live(s: &Store, owner: &str) -> Result<Task, Error> {
    s.create(None, owner, msg("q"), TaskState::Working)
}

fn done(s: &Store, owner: &str) -> Task {
    let t = live(s, owner).unwrap();
    s.update(&t.id, TaskState::Completed, None, None).unwrap()
}

fn retry_s(e: &Error) -> u64 {
    match e {
        Error::Exhausted { retry_after_s, .. } => *retry_after_s,
        e => panic!("not exhausted: {e}"),
    }
}

#[test]
fn another_owner_sees_none_of_the_tasks_and_naming_a_context_gets_its_own() {
    let s = store(10);
    let a = s.create(Some("shared".into()), "127.0.0.1", msg("a"), TaskState::InputRequired).unwrap();
    let mine = Session { id: "s-a".into(), token: "t-a".into() };
    assert_eq!(s.set_session("127.0.0.1", "shared", mine.clone()).unwrap(), None);
    // B names A's contextId: no error, no hint that it exists, a fresh context
    let b = s.create(Some("shared".into()), "127.0.0.2", msg("b"), TaskState::InputRequired).unwrap();
    assert_eq!(b.context_id, "shared");
    assert_eq!(s.session("127.0.0.2", "shared").unwrap(), None, "B reaches A's session");
    assert_eq!(s.session("127.0.0.1", "shared").unwrap(), Some(mine.clone()));
    let theirs = Session { id: "s-b".into(), token: "t-b".into() };
    assert_eq!(s.set_session("127.0.0.2", "shared", theirs.clone()).unwrap(), None, "B replaced A's session");
    assert_eq!(s.session("127.0.0.1", "shared").unwrap(), Some(mine));
    s.clear_session("127.0.0.1", "shared", "s-b");
    assert_eq!(s.session("127.0.0.2", "shared").unwrap(), Some(theirs));
    // A's task is not found for B, whatever B does with it
    let gone = |r: Result<Task, Error>| assert!(matches!(r, Err(Error::TaskNotFound(_))), "{r:?}");
    gone(s.get(&a.id, "127.0.0.2"));
    gone(s.cancel(&a.id, "127.0.0.2"));
    gone(s.continue_task(&a.id, "127.0.0.2", msg("c"), TaskState::Working));
    assert!(matches!(s.subscribe(&a.id, "127.0.0.2"), Err(Error::TaskNotFound(_))));
    let all = Page { offset: 0, size: 10, history: 0, artifacts: false };
    let (n, listed) = s.list(&ListFilter::default(), "127.0.0.2", all).unwrap();
    assert_eq!((n, listed[0].id.as_str()), (1, b.id.as_str()));
    let in_ctx = ListFilter { context_id: Some("shared".into()), ..Default::default() };
    assert_eq!(s.list(&in_ctx, "127.0.0.1", all).unwrap().1.iter().map(|t| &t.id).collect::<Vec<_>>(), [&a.id]);
    assert_eq!(s.get(&a.id, "127.0.0.1").unwrap().status.state, TaskState::InputRequired);
}

#[test]
fn an_owner_at_its_share_does_not_stop_another() {
    let s = shared(10, 3, Duration::from_secs(3600));
    for _ in 0..3 {
        live(&s, "a").unwrap();
    }
    let e = live(&s, "a").unwrap_err();
    assert_eq!(e.code(), -32000);
    assert_eq!(
        e.to_string(),
        "resource exhausted: this caller's share of the task store holds 3 tasks (the limit, --a2a-max-tasks-per-caller); retry after 3600 s"
    );
    for _ in 0..3 {
        live(&s, "b").unwrap();
    }
    assert_eq!(s.len(), 6);
}

#[test]
fn terminal_tasks_give_way_to_new_ones() {
    // the owner's own oldest terminal task, at its share
    let s = shared(10, 3, Duration::from_secs(3600));
    let old = done(&s, "a");
    let newer = done(&s, "a");
    let running = live(&s, "a").unwrap();
    live(&s, "a").unwrap();
    assert!(matches!(s.get(&old.id, "a"), Err(Error::TaskNotFound(_))), "the oldest terminal task stays");
    assert!(s.get(&newer.id, "a").is_ok() && s.get(&running.id, "a").is_ok());
    // a full store: the oldest terminal task of the owner holding the most
    let s = shared(4, 3, Duration::from_secs(3600));
    let a_done = done(&s, "a");
    done(&s, "a");
    let b_done = done(&s, "b");
    live(&s, "a").unwrap();
    assert_eq!(s.len(), 4);
    live(&s, "c").unwrap();
    assert!(matches!(s.get(&a_done.id, "a"), Err(Error::TaskNotFound(_))));
    assert!(s.get(&b_done.id, "b").is_ok(), "b holds fewer: its task stays");
    assert_eq!(s.len(), 4);
}

#[test]
fn the_retry_hint_is_the_time_until_the_first_task_expires() {
    let ttl = Duration::from_millis(3000);
    let s = shared(2, 1, ttl);
    live(&s, "a").unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    // a's share: its own task expires in 1.8 s
    assert_eq!(retry_s(&live(&s, "a").unwrap_err()), 2);
    live(&s, "b").unwrap();
    // the whole store: a's task expires first
    let e = live(&s, "c").unwrap_err();
    assert!(e.to_string().contains("task store holds 2 tasks (the limit, --a2a-max-tasks)"), "{e}");
    assert_eq!(retry_s(&e), 2);
    std::thread::sleep(Duration::from_millis(1900));
    // a's task expired: its place is free
    live(&s, "c").unwrap();
}

#[test]
fn terminal_states_are_immutable() {
    let s = store(10);
    let t = s.create(None, "local", msg("a"), TaskState::Working).unwrap();
    s.update(&t.id, TaskState::Completed, None, None).unwrap();
    let err = s.update(&t.id, TaskState::Failed, None, None).unwrap_err();
    assert_eq!(err.code(), -32004);
    assert!(matches!(s.cancel(&t.id, "local").unwrap_err(), Error::NotCancelable { .. }));
    assert!(matches!(s.continue_task(&t.id, "local", msg("b"), TaskState::Working), Err(Error::Terminal { .. })));
    let got = s.get(&t.id, "local").unwrap();
    assert_eq!(got.status.state, TaskState::Completed);
    assert_eq!(got.history.len(), 1);
}

#[test]
fn the_store_is_bounded_and_another_callers_tasks_are_not_found() {
    let s = store(2);
    let a = s.create(None, "did:wba:a", msg("a"), TaskState::Working).unwrap();
    s.create(Some(a.context_id.clone()), "did:wba:a", msg("b"), TaskState::Working).unwrap();
    let full = s.create(None, "local", msg("c"), TaskState::Working).unwrap_err();
    assert_eq!(
        full.to_string(),
        "resource exhausted: task store holds 2 tasks (the limit, --a2a-max-tasks); retry after 3600 s"
    );
    assert!(matches!(s.get(&a.id, "did:wba:b"), Err(Error::TaskNotFound(_))));
    assert!(matches!(s.cancel(&a.id, "local"), Err(Error::TaskNotFound(_))));
    let all = Page { offset: 0, size: 10, history: 0, artifacts: false };
    assert_eq!(s.list(&ListFilter::default(), "did:wba:a", all).unwrap().0, 2);
    assert_eq!(s.list(&ListFilter::default(), "local", all).unwrap(), (0, vec![]));
    assert_eq!(s.len(), 2);
}

#[test]
fn the_store_is_bounded_in_bytes_as_a_running_sum() {
    let probe = Store::new(StoreLimits::default());
    probe.create(None, "local", msg(&"a".repeat(600)), TaskState::Working).unwrap();
    let limit = 2 * probe.bytes() + 1000;
    let s = Store::new(StoreLimits { max_bytes: limit, ..StoreLimits::default() });
    let t = s.create(None, "local", msg(&"a".repeat(600)), TaskState::Working).unwrap();
    let one = s.bytes();
    assert_eq!(one, Held::new(&t).bytes("local") + CONTEXT_BYTES + "local".len() + t.context_id.len());
    assert!(one > 600 + ENTRY_BYTES, "{one}");
    s.update(&t.id, TaskState::InputRequired, Some(msg("b")), None).unwrap();
    let grown = s.bytes() - one;
    assert!(grown >= 2 * json(&msg("b")).len() && grown < 1000, "recounted on update: {grown}");
    s.create(None, "local", msg(&"a".repeat(600)), TaskState::Working).unwrap();
    let full = s.create(None, "local", msg(&"a".repeat(600)), TaskState::Working).unwrap_err();
    assert_eq!(full.code(), -32000);
    assert_eq!(
        full.to_string(),
        format!("resource exhausted: task store holds {limit} bytes (the limit, --a2a-max-bytes); retry after 3600 s")
    );
    let over = s.continue_task(&t.id, "local", msg(&"c".repeat(900)), TaskState::Working).unwrap_err();
    assert!(over.to_string().contains("--a2a-max-bytes"), "{over}");
    assert_eq!(s.len(), 2);
    s.take_back(&t.id, None);
    assert_eq!(s.len(), 1);
    // its context stays (contexts outlive their tasks)
    assert!(s.bytes() < one + CONTEXT_BYTES + 100, "a removed task's bytes are freed: {}", s.bytes());
}

/// Counts the heap each thread holds, so that a test can weigh what a
/// store holds (the store works on the calling thread).
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        static NET: Cell<isize> = const { Cell::new(0) };
    }

    fn add(n: isize) {
        let _ = NET.try_with(|c| c.set(c.get() + n));
    }

    // SAFETY: every call goes to `System` unchanged; only sizes are counted.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            add(l.size() as isize);
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            add(-(l.size() as isize));
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            add(new as isize - l.size() as isize);
            unsafe { System.realloc(p, l, new) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// Heap bytes this thread holds, net of what it freed.
    pub fn held() -> isize {
        NET.with(Cell::get)
    }
}

/// A message as an A2A client sends SCD one: a task and a context of
/// `fields` fields, as a data part of nested JSON.
fn data_message(fields: usize) -> Message {
    let fields: Vec<serde_json::Value> = (0..fields)
        .map(|i| {
            serde_json::json!({"id": format!("f{i}"), "kind": "prose", "role": "user",
                "text": format!("Sentence {i} of the context, about the service's deploy steps."),
                "tags": ["a", "b"], "confidential": i % 7 == 0})
        })
        .collect();
    let mut m = msg("what changed in the deploy?");
    m.parts.push(Part::data(serde_json::json!({"context": {"fields": fields}, "budget": 512})));
    m
}

#[test]
fn what_the_store_counts_is_the_heap_it_holds() {
    for (what, make) in
        [("short text", (|_| msg("q")) as fn(usize) -> Message), ("nested data", |i| data_message(20 + i % 30))]
    {
        let s = Store::new(StoreLimits { max_tasks: 2000, ..StoreLimits::default() });
        let before = heap::held();
        for i in 0..1000 {
            let t = s.create(None, &format!("10.0.{}.{}", i % 4, i % 250), make(i), TaskState::Working).unwrap();
            let artifact = Artifact {
                artifact_id: uuid_v4(),
                name: "context".into(),
                description: "the selected chunks".into(),
                parts: vec![Part::text("chunk ".repeat(i % 40))],
            };
            if i % 2 == 0 {
                s.update(&t.id, TaskState::Completed, None, Some(artifact)).unwrap();
            }
        }
        let held = (heap::held() - before) as f64;
        let counted = s.bytes() as f64;
        // tasks and their contexts held, against what the store counts
        let ratio = held / counted;
        eprintln!("{what}: held {held} heap bytes, counted {counted}: {ratio:.3}");
        assert!((0.5..=1.2).contains(&ratio), "{what}: the store holds {held} heap bytes, counts {counted}");
        drop(s);
        let left = heap::held() - before;
        assert!(left < 4096, "{what}: {left} bytes stay after the store is dropped");
    }
}

#[test]
fn a_list_page_is_sorted_then_copied_trimmed() {
    let s = store(10);
    let ids: Vec<String> =
        (0..5).map(|i| s.create(None, "local", msg(&format!("m{i}")), TaskState::Working).unwrap().id).collect();
    s.update(&ids[0], TaskState::Completed, Some(msg("done")), None).unwrap();
    let (total, page) =
        s.list(&ListFilter::default(), "local", Page { offset: 1, size: 2, history: 1, artifacts: false }).unwrap();
    assert_eq!(total, 5);
    // most recently updated first: 0 (just updated), 4, 3, ...
    assert_eq!(page.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [ids[4].as_str(), ids[3].as_str()]);
    assert_eq!(page[0].history.len(), 1);
    let (_, first) =
        s.list(&ListFilter::default(), "local", Page { offset: 0, size: 1, history: 0, artifacts: false }).unwrap();
    assert_eq!(first[0].id, ids[0]);
    assert!(first[0].history.is_empty());
    let (_, past) =
        s.list(&ListFilter::default(), "local", Page { offset: 9, size: 5, history: 0, artifacts: false }).unwrap();
    assert!(past.is_empty());
}

#[test]
fn history_is_bounded_and_the_context_must_match() {
    let s = store(10);
    let t = s.create(None, "local", msg("a"), TaskState::InputRequired).unwrap();
    let t2 = s.continue_task(&t.id, "local", msg("b"), TaskState::InputRequired).unwrap();
    assert_eq!(t2.history.len(), 2);
    let mut other = msg("c");
    other.context_id = Some("elsewhere".into());
    assert!(s
        .continue_task(&t.id, "local", other, TaskState::InputRequired)
        .unwrap_err()
        .to_string()
        .contains("belongs to context"));
    s.continue_task(&t.id, "local", msg("d"), TaskState::InputRequired).unwrap();
    let over = s.continue_task(&t.id, "local", msg("e"), TaskState::InputRequired).unwrap_err();
    assert!(over.to_string().contains("history limit is 4"), "{over}");
    assert_eq!(trim_history(s.get(&t.id, "local").unwrap(), Some(1)).history.len(), 1);
}

#[test]
fn subscribers_see_updates_until_terminal() {
    let s = store(10);
    let t = s.create(None, "local", msg("a"), TaskState::Working).unwrap();
    let (_, mut rx) = s.subscribe(&t.id, "local").unwrap();
    s.update(&t.id, TaskState::Completed, None, None).unwrap();
    assert!(matches!(rx.try_recv().unwrap(), Event::Status(st) if st.state == TaskState::Completed));
    assert!(matches!(s.subscribe(&t.id, "local"), Err(Error::Unsupported(_))));
}

/// A task waiting for its context: working, with the agent's request.
fn waiting(s: &Store, owner: &str) -> Result<Task, Error> {
    let t = live(s, owner)?;
    let ask = Message { role: Role::Agent, ..msg("waiting for the context") };
    s.update(&t.id, TaskState::Working, Some(ask), None)
}

#[test]
fn waiting_tasks_give_way_first() {
    let s = shared(4, 4, Duration::from_secs(3600));
    let w: Vec<_> = (0..2).map(|_| waiting(&s, "a").unwrap()).collect();
    let done_a = done(&s, "a");
    live(&s, "b").unwrap();
    // full: a (holding the most) gives up its oldest waiting task, before
    // its terminal one
    live(&s, "c").unwrap();
    assert!(matches!(s.get(&w[0].id, "a"), Err(Error::TaskNotFound(_))));
    assert!(s.get(&done_a.id, "a").is_ok() && s.get(&w[1].id, "a").is_ok());
    live(&s, "c").unwrap();
    assert!(s.get(&w[1].id, "a").is_err() && s.get(&done_a.id, "a").is_ok());
    live(&s, "c").unwrap();
    assert!(s.get(&done_a.id, "a").is_err(), "then the terminal one");
    // only live work: refused until the first task expires
    assert_eq!(retry_s(&live(&s, "d").unwrap_err()), 3600);
    // an owner at its share gives up its own waiting task
    let s = shared(10, 2, Duration::from_secs(3600));
    let mine = waiting(&s, "a").unwrap();
    live(&s, "a").unwrap();
    live(&s, "a").unwrap();
    assert!(s.get(&mine.id, "a").is_err());
    assert!(live(&s, "a").is_err(), "two live tasks: the share is held");
}

#[test]
fn a_waiting_task_is_never_dropped_for_its_own_continuation() {
    // an owner at its byte share sends the data part its waiting task asked
    // for: the task is not given up for its own message (that would answer
    // "not found"); the owner is told to retry
    let s = Store::new(StoreLimits { max_bytes_per_caller: 3000, ..StoreLimits::default() });
    let w = waiting(&s, "a").unwrap();
    let e = s.continue_task(&w.id, "a", msg(&"x".repeat(4000)), TaskState::Working).unwrap_err();
    assert!(matches!(e, Error::Exhausted { .. }), "{e:?}");
    assert!(s.get(&w.id, "a").is_ok(), "the waiting task was dropped for its own continuation");
    // another waiting task of the owner still gives way for it
    let s = Store::new(StoreLimits { max_bytes_per_caller: 5000, ..StoreLimits::default() });
    let old = waiting(&s, "a").unwrap();
    let w = waiting(&s, "a").unwrap();
    s.continue_task(&w.id, "a", msg(&"x".repeat(3000)), TaskState::Working).unwrap();
    assert!(s.get(&old.id, "a").is_err() && s.get(&w.id, "a").is_ok());
}
