//! A2A tasks and contexts in a real `redis-server` (`scd serve --state`):
//! two stores on one Redis stand for two replicas. What one creates,
//! continues, cancels or binds to an SCD session the other serves; a
//! subscriber on one hears the other's updates; the bounds, the owner
//! isolation and the refusals are those of the in-memory store.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use scd_service::a2a::store::{Event, ListFilter, Page, Session, Store, StoreLimits};
use scd_service::a2a::types::{uuid_v4, Artifact, Message, Part, Task, TaskState};
use scd_service::a2a::Error;
use scd_service::redis::tasks::RedisTasks;

use crate::replicas::{have, RedisServer};
use crate::scratch;

fn msg(text: &str) -> Message {
    serde_json::from_value(serde_json::json!({"messageId": uuid_v4(), "role": "ROLE_USER",
        "parts": [{"text": text}]}))
    .unwrap()
}

/// Two replicas' stores on `redis`, with `limits`, each listening.
fn replicas(redis: &RedisServer, limits: StoreLimits) -> (Store, Store) {
    let open = || Store::shared(limits, Arc::new(RedisTasks::open(&redis.url()).unwrap()));
    let (a, b) = (open(), open());
    let t = Instant::now();
    while !(a.listening() && b.listening()) {
        assert!(t.elapsed() < Duration::from_secs(10), "the stores never subscribed to the task events");
        std::thread::sleep(Duration::from_millis(20));
    }
    (a, b)
}

fn limits(max_tasks: usize, share: usize, ttl: Duration) -> StoreLimits {
    StoreLimits { max_tasks, max_tasks_per_caller: share, ttl, max_history: 4, ..StoreLimits::default() }
}

fn live(s: &Store, owner: &str) -> Result<Task, Error> {
    s.create(None, owner, msg("q"), TaskState::Working)
}

fn done(s: &Store, owner: &str) -> Task {
    let t = live(s, owner).unwrap();
    s.update(&t.id, TaskState::Completed, None, None).unwrap()
}

fn not_found(r: Result<Task, Error>) {
    assert!(matches!(r, Err(Error::TaskNotFound(_))), "{r:?}");
}

/// Waits (5 s at most) for the channel to close, with no event before.
fn closes(rx: &mut tokio::sync::broadcast::Receiver<Event>) {
    use tokio::sync::broadcast::error::TryRecvError;
    let t = Instant::now();
    loop {
        match rx.try_recv() {
            Err(TryRecvError::Closed) => return,
            Err(TryRecvError::Empty) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            other => panic!("the channel did not close after the terminal status: {other:?}"),
        }
    }
}

/// The next event within 5 s.
fn next(rx: &mut tokio::sync::broadcast::Receiver<Event>) -> Option<Event> {
    let t = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(e) => return Some(e),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(_) => return None,
        }
    }
}

#[test]
fn a2a_tasks_and_contexts_on_one_replica_are_served_by_another() {
    if !have("redis-server") {
        return;
    }
    let dir = scratch("a2a-shared");
    let redis = RedisServer::start(&dir, false);
    let (a, b) = replicas(&redis, limits(100, 10, Duration::from_secs(3600)));

    // created on a, read and continued on b, seen on a
    let t = a.create(Some("ctx-1".into()), "did:wba:x", msg("first"), TaskState::InputRequired).unwrap();
    assert_eq!(b.get(&t.id, "did:wba:x").unwrap(), t);
    let t2 = b.continue_task(&t.id, "did:wba:x", msg("second"), TaskState::Working).unwrap();
    assert_eq!(t2.history.len(), 2);
    assert_eq!(t2.history[1].context_id.as_deref(), Some("ctx-1"));
    assert_eq!(a.get(&t.id, "did:wba:x").unwrap(), t2);
    // another owner: not found on any replica, whatever it does
    not_found(b.get(&t.id, "did:wba:y"));
    not_found(a.cancel(&t.id, "did:wba:y"));
    not_found(b.continue_task(&t.id, "did:wba:y", msg("c"), TaskState::Working));
    assert!(matches!(b.subscribe(&t.id, "did:wba:y"), Err(Error::TaskNotFound(_))));
    let all = Page { offset: 0, size: 10, history: 0, artifacts: false };
    assert_eq!(b.list(&ListFilter::default(), "did:wba:y", all).unwrap(), (0, vec![]));
    // the context's SCD session, set on a, is b's too, and only its owner's
    let s1 = Session { id: "s-1".into(), token: "tok-1".into() };
    assert_eq!(a.set_session("did:wba:x", "ctx-1", s1.clone()).unwrap(), None);
    assert_eq!(b.session("did:wba:x", "ctx-1").unwrap(), Some(s1.clone()));
    assert_eq!(b.session("did:wba:y", "ctx-1").unwrap(), None);
    // y naming x's contextId gets a context of its own
    let y = b.create(Some("ctx-1".into()), "did:wba:y", msg("y"), TaskState::Working).unwrap();
    assert_eq!(a.session("did:wba:y", "ctx-1").unwrap(), None);
    let s2 = Session { id: "s-2".into(), token: "tok-2".into() };
    assert_eq!(b.set_session("did:wba:x", "ctx-1", s2.clone()).unwrap(), Some(s1), "the replaced one is answered");
    a.clear_session("did:wba:x", "ctx-1", "s-1");
    assert_eq!(a.session("did:wba:x", "ctx-1").unwrap(), Some(s2), "a newer session stays");
    b.clear_session("did:wba:x", "ctx-1", "s-2");
    assert_eq!(a.session("did:wba:x", "ctx-1").unwrap(), None);

    a_subscriber_on_one_replica_hears_the_other_until_the_end(&a, &b, &t);

    // the history limit and the context check
    let h = b.create(None, "did:wba:x", msg("h1"), TaskState::InputRequired).unwrap();
    let mut other = msg("elsewhere");
    other.context_id = Some("elsewhere".into());
    let e = a.continue_task(&h.id, "did:wba:x", other, TaskState::InputRequired).unwrap_err();
    assert!(e.to_string().contains("belongs to context"), "{e}");
    a.continue_task(&h.id, "did:wba:x", msg("h2"), TaskState::InputRequired).unwrap();
    b.continue_task(&h.id, "did:wba:x", msg("h3"), TaskState::InputRequired).unwrap();
    let e = b.continue_task(&h.id, "did:wba:x", msg("h4"), TaskState::InputRequired).unwrap_err();
    assert!(e.to_string().contains("history limit is 4"), "{e}");

    // taken back: a continued task returns to its status without the message, a new one goes
    let before = a.get(&h.id, "did:wba:x").unwrap();
    let grown = a.continue_task(&h.id, "did:wba:x", msg("k"), TaskState::Working);
    assert!(grown.is_err(), "at its history limit");
    let k = a.create(None, "did:wba:x", msg("k1"), TaskState::InputRequired).unwrap();
    let k2 = b.continue_task(&k.id, "did:wba:x", msg("k2"), TaskState::Working).unwrap();
    assert_eq!(k2.history.len(), 2);
    b.take_back(&k.id, Some(k.status.clone()));
    let back = a.get(&k.id, "did:wba:x").unwrap();
    assert_eq!((back.status, back.history.len()), (k.status, 1));
    assert_eq!(before, a.get(&h.id, "did:wba:x").unwrap());
    b.take_back(&y.id, None);
    not_found(a.get(&y.id, "did:wba:y"));

    listing_is_recent_first_filtered_and_paged(&a, &b, &t);

    // a subscription refused leaves no channel behind: nothing to hear, nothing held
    assert!(matches!(a.subscribe("no-such-task", "did:wba:x"), Err(Error::TaskNotFound(_))));

    contexts_give_way_at_the_owners_share(&redis);
}

/// A subscriber on `b` hears `a`'s updates of `t`, in order, until the task
/// ends; a terminal task is immutable on either replica; a task canceled on
/// `b` is heard by `a`'s subscriber.
fn a_subscriber_on_one_replica_hears_the_other_until_the_end(a: &Store, b: &Store, t: &Task) {
    let (seen, mut rx) = b.subscribe(&t.id, "did:wba:x").unwrap();
    assert_eq!(seen.status.state, TaskState::Working);
    let art =
        Artifact { artifact_id: "a-1".into(), name: "n".into(), description: "d".into(), parts: vec![Part::text("x")] };
    let reply = Message::agent(&t.id, "ctx-1", vec![Part::text("done")]);
    let end = a.update(&t.id, TaskState::Completed, Some(reply.clone()), Some(art.clone())).unwrap();
    assert!(matches!(next(&mut rx), Some(Event::Artifact(x)) if x == art));
    match next(&mut rx) {
        Some(Event::Status(s)) => {
            assert_eq!((s.state, s.message.as_ref()), (TaskState::Completed, Some(&reply)));
            assert_eq!(s, end.status);
        }
        e => panic!("not the terminal status: {e:?}"),
    }
    closes(&mut rx);
    assert_eq!(end.history.last(), Some(&reply));
    assert_eq!(end.artifacts, [art]);
    // terminal is immutable, on either replica
    assert_eq!(b.update(&t.id, TaskState::Failed, None, None).unwrap_err().code(), -32004);
    assert!(matches!(a.cancel(&t.id, "did:wba:x"), Err(Error::NotCancelable { .. })));
    assert!(matches!(b.continue_task(&t.id, "did:wba:x", msg("d"), TaskState::Working), Err(Error::Terminal { .. })));
    assert!(matches!(a.subscribe(&t.id, "did:wba:x"), Err(Error::Unsupported(_))));

    // canceled on b, a's subscriber hears it
    let c = a.create(None, "did:wba:x", msg("to cancel"), TaskState::Working).unwrap();
    let (_, mut rx) = a.subscribe(&c.id, "did:wba:x").unwrap();
    assert_eq!(b.cancel(&c.id, "did:wba:x").unwrap().status.state, TaskState::Canceled);
    assert!(matches!(next(&mut rx), Some(Event::Status(s)) if s.state == TaskState::Canceled));
}

/// Listing: most recently updated first, filtered, paged, with history
/// trimmed; `t` is the one completed task (with an artifact).
fn listing_is_recent_first_filtered_and_paged(a: &Store, b: &Store, t: &Task) {
    let all = Page { offset: 0, size: 10, history: 0, artifacts: false };
    let after = SystemTime::now();
    std::thread::sleep(Duration::from_millis(5));
    let newest = a.create(Some("ctx-1".into()), "did:wba:x", msg("n"), TaskState::Working).unwrap();
    let (n, page) =
        b.list(&ListFilter::default(), "did:wba:x", Page { offset: 0, size: 2, history: 1, artifacts: false }).unwrap();
    assert_eq!(n, 5);
    assert_eq!(page[0].id, newest.id);
    assert!(page.iter().all(|t| t.history.len() <= 1 && t.artifacts.is_empty()));
    let since = ListFilter { updated_after: Some(after), ..Default::default() };
    assert_eq!(b.list(&since, "did:wba:x", all).unwrap().0, 1);
    let done_only = ListFilter { state: Some(TaskState::Completed), ..Default::default() };
    let with_art = Page { artifacts: true, ..all };
    let (_, completed) = b.list(&done_only, "did:wba:x", with_art).unwrap();
    assert_eq!(completed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [t.id.as_str()]);
    assert_eq!(completed[0].artifacts.len(), 1);
    let in_ctx = ListFilter { context_id: Some("ctx-1".into()), ..Default::default() };
    assert_eq!(b.list(&in_ctx, "did:wba:x", all).unwrap().0, 2);
    assert_eq!(a.list(&ListFilter::default(), "did:wba:x", Page { offset: 9, ..all }).unwrap().1, vec![]);
}

/// An owner's contexts are bounded by its share: an idle one gives way,
/// with its session.
fn contexts_give_way_at_the_owners_share(redis: &RedisServer) {
    redis.cli(&["FLUSHDB"]);
    let (a, b) = replicas(redis, limits(100, 2, Duration::from_secs(3600)));
    let t1 = a.create(Some("c1".into()), "o", msg("1"), TaskState::Working).unwrap();
    a.set_session("o", "c1", Session { id: "s-c1".into(), token: "tok-c1".into() }).unwrap();
    b.take_back(&t1.id, None);
    assert!(b.session("o", "c1").unwrap().is_some(), "a context outlives its tasks");
    let t2 = b.create(Some("c2".into()), "o", msg("2"), TaskState::Working).unwrap();
    a.update(&t2.id, TaskState::Completed, None, None).unwrap();
    a.create(Some("c3".into()), "o", msg("3"), TaskState::Working).unwrap();
    assert_eq!(a.session("o", "c1").unwrap(), None, "the idle context gave way at the owner's share");
    assert_eq!(redis.cli(&["ZSCORE", "scd:v1:a2a:ocs", "o"]), "2");
}

/// A task waiting for its context: working, with the agent's request.
fn waiting(s: &Store, owner: &str) -> Task {
    let t = live(s, owner).unwrap();
    let ask = serde_json::from_value(serde_json::json!({"messageId": uuid_v4(), "role": "ROLE_AGENT",
        "parts": [{"text": "waiting for the context"}]}))
    .unwrap();
    s.update(&t.id, TaskState::Working, Some(ask), None).unwrap()
}

/// Issue 43, Medium 6 with `--state`: as in the in-memory store, a task
/// waiting for its context (a text sent alone) gives way before any
/// terminal task, and is dropped after the waiting TTL, not the hour.
#[test]
fn in_the_shared_store_waiting_tasks_give_way_first_and_go_after_the_waiting_ttl() {
    if !have("redis-server") {
        return;
    }
    let dir = scratch("a2a-shared-waiting");
    let redis = RedisServer::start(&dir, false);
    let (a, b) = replicas(&redis, limits(4, 4, Duration::from_secs(3600)));
    let w: Vec<_> = (0..2).map(|_| waiting(&a, "a")).collect();
    let done_a = done(&b, "a");
    live(&a, "b").unwrap();
    // full: a (holding the most) gives up its oldest waiting task first
    live(&b, "c").unwrap();
    not_found(a.get(&w[0].id, "a"));
    assert!(b.get(&done_a.id, "a").is_ok() && b.get(&w[1].id, "a").is_ok());
    live(&a, "c").unwrap();
    not_found(b.get(&w[1].id, "a"));
    assert!(a.get(&done_a.id, "a").is_ok());
    live(&b, "c").unwrap();
    not_found(a.get(&done_a.id, "a"));
    // only live work: refused until the first task expires
    assert_eq!(live(&a, "d").unwrap_err().retry_after_ms(), Some(3_600_000));
    redis.cli(&["FLUSHDB"]);

    // an owner at its share gives up its own waiting task
    let (a, b) = replicas(&redis, limits(10, 2, Duration::from_secs(3600)));
    let mine = waiting(&a, "a");
    live(&b, "a").unwrap();
    live(&a, "a").unwrap();
    not_found(b.get(&mine.id, "a"));
    assert!(live(&a, "a").is_err(), "two live tasks: the share is held");
    redis.cli(&["FLUSHDB"]);

    // a waiting task lives the waiting TTL, a live one the whole TTL
    let short = StoreLimits { waiting_ttl: Duration::from_millis(1500), ..limits(10, 5, Duration::from_secs(3600)) };
    let (a, b) = replicas(&redis, short);
    let idle = waiting(&a, "a");
    let busy = live(&b, "b").unwrap();
    assert_eq!(a.count().unwrap().0, 2);
    std::thread::sleep(Duration::from_millis(1700));
    not_found(b.get(&idle.id, "a"));
    assert!(a.get(&busy.id, "b").is_ok(), "a live task outlives the waiting TTL");
    assert_eq!(a.count().unwrap().0, 1);
    redis.cli(&["FLUSHDB"]);

    // at its byte share, the data a waiting task asked for never drops that
    // task (it would answer "not found"): the owner is told to retry
    let tight = StoreLimits { max_bytes_per_caller: 3000, ..limits(10, 5, Duration::from_secs(3600)) };
    let (a, b) = replicas(&redis, tight);
    let w = waiting(&a, "a");
    let e = b.continue_task(&w.id, "a", msg(&"x".repeat(4000)), TaskState::Working).unwrap_err();
    assert!(e.retry_after_ms().is_some(), "{e}");
    assert!(a.get(&w.id, "a").is_ok(), "the waiting task was dropped for its own continuation");
}

#[test]
fn the_shared_a2a_store_is_bounded_says_when_to_retry_and_names_itself_when_down() {
    if !have("redis-server") {
        return;
    }
    let dir = scratch("a2a-shared-bounds");
    let mut redis = RedisServer::start(&dir, false);

    // an owner at its share is refused with the in-memory store's words; another is not
    let (a, b) = replicas(&redis, limits(10, 3, Duration::from_secs(3600)));
    for _ in 0..3 {
        live(&a, "a").unwrap();
    }
    let e = live(&b, "a").unwrap_err();
    assert_eq!(e.code(), -32000);
    assert_eq!(
        e.to_string(),
        "resource exhausted: this caller's share of the task store holds 3 tasks (the limit, --a2a-max-tasks-per-caller); retry after 3600 s"
    );
    assert_eq!(e.retry_after_ms(), Some(3_600_000));
    for _ in 0..3 {
        live(&b, "b").unwrap();
    }
    assert_eq!(a.count().unwrap().0, 6);
    redis.cli(&["FLUSHDB"]);

    // terminal tasks give way: the owner's oldest at its share, the largest owner's in a full store
    let old = done(&a, "a");
    let newer = done(&b, "a");
    let running = live(&a, "a").unwrap();
    live(&b, "a").unwrap();
    not_found(a.get(&old.id, "a"));
    assert!(b.get(&newer.id, "a").is_ok() && b.get(&running.id, "a").is_ok());
    redis.cli(&["FLUSHDB"]);
    let (a, b) = replicas(&redis, limits(4, 3, Duration::from_secs(3600)));
    let a_done = done(&a, "a");
    done(&b, "a");
    let b_done = done(&a, "b");
    live(&b, "a").unwrap();
    live(&a, "c").unwrap();
    not_found(b.get(&a_done.id, "a"));
    assert!(b.get(&b_done.id, "b").is_ok(), "b holds fewer: its task stays");
    assert_eq!(a.count().unwrap().0, 4);
    // terminal tasks give way, then a store full of live tasks refuses
    live(&a, "c").unwrap();
    live(&b, "d").unwrap();
    let full = live(&a, "e").unwrap_err();
    assert!(full.to_string().contains("task store holds 4 tasks (the limit, --a2a-max-tasks)"), "{full}");
    redis.cli(&["FLUSHDB"]);

    the_retry_hint_is_the_first_expiry_and_expired_tasks_go(&redis);

    // many expired tasks are all swept before a refusal: an owner whose tasks all expired is served
    // every create within the TTL (3 s), so that none is swept before the wait
    let (a, b) = replicas(&redis, limits(200, 70, Duration::from_millis(3000)));
    let made = Instant::now();
    for _ in 0..70 {
        live(&a, "old").unwrap();
    }
    // every "old" task older than every "mine" one: the 64 a call sweeps
    // first are then all "old" (tasks of one millisecond sort by id), and
    // "mine" is still at its share, so only a sweep of all serves it
    std::thread::sleep(Duration::from_millis(5));
    for _ in 0..70 {
        live(&b, "mine").unwrap();
    }
    assert!(made.elapsed() < Duration::from_millis(3000), "140 creates took {:?}", made.elapsed());
    std::thread::sleep(Duration::from_millis(3100));
    live(&a, "mine").unwrap();
    assert_eq!(b.count().unwrap().0, 1);
    redis.cli(&["FLUSHDB"]);

    // bytes: counted as a running sum in Redis, the bound refuses, taking back frees
    let small =
        StoreLimits { max_bytes: 6000, max_bytes_per_caller: 6000, ..limits(100, 100, Duration::from_secs(3600)) };
    let (a, b) = replicas(&redis, small);
    let t = a.create(None, "a", msg(&"x".repeat(1500)), TaskState::Working).unwrap();
    let one = a.count().unwrap().1;
    assert!(one > 1500 && one < 3000, "{one}");
    b.create(None, "a", msg(&"y".repeat(1500)), TaskState::Working).unwrap();
    let e = a.create(None, "a", msg(&"z".repeat(1500)), TaskState::Working).unwrap_err();
    assert!(e.to_string().contains("bytes (the limit, --a2a-max-bytes"), "{e}");
    let e = b.continue_task(&t.id, "a", msg(&"w".repeat(4000)), TaskState::Working).unwrap_err();
    assert_eq!(e.code(), -32000, "{e}");
    let two = b.count().unwrap().1;
    b.take_back(&t.id, None);
    assert!(a.count().unwrap().1 < two - 1500, "a removed task's bytes are freed");

    redis_down_is_named_and_served_again_when_back(&mut redis, &a, &b, &t);
}

/// The retry hint is the time until the first task expires, and expired
/// tasks go, leaving only the byte sum and the order counter.
fn the_retry_hint_is_the_first_expiry_and_expired_tasks_go(redis: &RedisServer) {
    let (a, b) = replicas(redis, limits(2, 1, Duration::from_millis(3000)));
    let first = live(&a, "a").unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let e = live(&b, "a").unwrap_err();
    assert_eq!(e.retry_after_ms(), Some(2000), "{e}");
    live(&b, "b").unwrap();
    let e = live(&a, "c").unwrap_err();
    assert!(e.to_string().contains("task store holds 2 tasks (the limit, --a2a-max-tasks)"), "{e}");
    assert_eq!(e.retry_after_ms(), Some(2000), "{e}");
    std::thread::sleep(Duration::from_millis(1900));
    not_found(b.get(&first.id, "a"));
    live(&a, "c").unwrap();
    // once everything expired, nothing is left but the byte sum (0) and the order counter
    std::thread::sleep(Duration::from_millis(3100));
    assert_eq!(a.count().unwrap(), (0, 0));
    let mut keys: Vec<String> =
        redis.cli(&["--scan", "--pattern", "scd:v1:a2a:*"]).lines().map(str::to_string).collect();
    keys.sort();
    assert_eq!(keys, ["scd:v1:a2a:bytes", "scd:v1:a2a:seq"], "bookkeeping left behind");
    redis.cli(&["FLUSHDB"]);
}

/// Redis down: an error naming the store, 503, a retry hint, nothing
/// echoed. Back: served again, and the subscriptions are made again.
fn redis_down_is_named_and_served_again_when_back(redis: &mut RedisServer, a: &Store, b: &Store, t: &Task) {
    let url = redis.url();
    redis.stop();
    let e = a.create(None, "a", msg("secret-content-123"), TaskState::Working).unwrap_err();
    assert!(matches!(e, Error::StoreUnavailable { .. }), "{e:?}");
    assert!(e.to_string().contains(&url), "{e}");
    assert!(!e.to_string().contains("secret-content-123"));
    assert_eq!((e.code(), e.http_status().as_u16(), e.retry_after_ms()), (-32603, 503, Some(1000)));
    assert!(matches!(b.get(&t.id, "a"), Err(Error::StoreUnavailable { .. })));
    assert!(matches!(b.session("a", "c"), Err(Error::StoreUnavailable { .. })));
    // back: served again, and the subscriptions are made again
    redis.spawn();
    let t = a.create(None, "a", msg("again"), TaskState::Working).unwrap();
    let (_, mut rx) = b.subscribe(&t.id, "a").unwrap();
    let deadline = Instant::now();
    a.update(&t.id, TaskState::Completed, None, None).unwrap();
    let mut heard = false;
    while let Some(ev) = next(&mut rx) {
        match ev {
            Event::Status(s) if s.state == TaskState::Completed => {
                heard = true;
                break;
            }
            // the resubscription tells every stream to read its task again
            Event::Resync => heard = b.get(&t.id, "a").unwrap().status.state == TaskState::Completed,
            _ => {}
        }
        if heard || deadline.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    assert!(heard, "b's subscriber never learned that the task completed");
}

/// Issue 43, Medium 6 with `--state`: the Redis session store keeps the
/// in-memory store's shares. Ten addresses of one /24 (300 sessions into
/// 50) cannot evict another /24's session nor their own network's smallest
/// holder; an IPv6 /64 is one caller; the sessions a /24 gives up are
/// tombstoned as such.
#[test]
fn redis_sessions_keep_a_share_per_caller_and_per_network() {
    use scd_engine::session::SessionLimits;
    use scd_engine::shared::{Loaded, SharedState};
    use scd_service::redis::sessions::RedisSessions;
    if !have("redis-server") {
        return;
    }
    let dir = scratch("redis-session-shares");
    let redis = RedisServer::start(&dir, false);
    let store = RedisSessions::open(&redis.url()).unwrap();
    let limits = SessionLimits { ttl: Duration::from_secs(600), max_sessions: 50, max_bytes: 1 << 20 };
    let mut n = 0;
    let mut open = |scope: &str| {
        n += 1;
        let key = format!("s-{n:032x}");
        store.open(&key, Some(scope), 10, b"record", ("digest", b"blob"), &limits).unwrap();
        key
    };
    let victim = open("ip:10.0.1.1");
    let near = open("ip:10.0.0.200");
    let crowd: Vec<_> = (0..300).map(|i| open(&format!("ip:10.0.0.{}", 2 + i % 10))).collect();
    let live = |k: &str| matches!(store.load(k, &limits).unwrap(), Loaded::Live { .. });
    assert!(live(&victim), "another /24's session went");
    assert!(live(&near), "the /24's smallest holder lost its session");
    assert_eq!(store.stats(&limits).unwrap().live, 50);
    let causes: std::collections::HashSet<_> = crowd[..100]
        .iter()
        .filter_map(|k| match store.load(k, &limits).unwrap() {
            Loaded::Gone(c) => Some(c),
            _ => None,
        })
        .collect();
    assert!(causes.contains("network_gave_way"), "{causes:?}");
    // the other /24 takes its share from the one past its own
    let held: Vec<_> = (0..5).map(|_| open("ip:10.0.1.1")).collect();
    assert!(held.iter().all(|k| live(k)));
    redis.cli(&["FLUSHDB"]);

    // ten networks of one address each: each at its share, none takes the victim's
    let victim = open("ip:10.0.1.1");
    for i in 0..300 {
        open(&format!("ip:10.{}.0.1", 2 + i % 10));
    }
    assert!(live(&victim), "a caller within its share lost its session");
    redis.cli(&["FLUSHDB"]);

    // an IPv6 /64 is one caller: its 300 addresses give up their own
    // sessions once the store is full, not the other caller's
    let victim = open("ip:10.0.1.1");
    let v6: Vec<_> = (0..300).map(|i| open(&format!("ip:2001:db8::{:x}", i + 1))).collect();
    assert!(live(&victim));
    assert_eq!(v6.iter().filter(|k| live(k)).count(), 49);
}
