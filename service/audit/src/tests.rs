//! The audit trail's tests across its modules.

use std::sync::Arc;

use super::*;

fn open(dir: &tempfile::TempDir, level: AuditLevel, retention: Retention) -> AuditLog {
    AuditLog::open(&dir.path().join("audit.redb"), level, retention).unwrap()
}

fn rec(session: &str, caller: &str) -> AuditRecord {
    let mut r = AuditRecord::new("Compress");
    r.session_id = Some(session.into());
    r.caller = Some(caller.into());
    r.chunks = vec![AuditChunk { id: "c1".into(), field: "code".into(), score: 0.5, tokens: 12 }];
    r.chunk_count = 1;
    r.withheld = vec!["secrets".into()];
    r
}

#[test]
fn levels_decide_what_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let off = open(&dir, AuditLevel::Off, Retention::default());
    assert!(off.append(vec![rec("s", "a")]).unwrap().is_empty());
    assert_eq!(off.stats().unwrap().0, 0, "off writes nothing");
    drop(off);
    let summary = open(&dir, AuditLevel::Summary, Retention::default());
    summary.append(vec![rec("s", "a")]).unwrap();
    drop(summary);
    let chunks = open(&dir, AuditLevel::Chunks, Retention::default());
    chunks.append(vec![rec("s", "a")]).unwrap();
    let all = chunks.query(&AuditFilter::default()).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!((all[0].level, all[0].chunks.len(), all[0].chunk_count), (AuditLevel::Summary, 0, 1));
    assert_eq!(all[0].withheld, ["secrets"], "summary keeps the withheld names");
    assert_eq!((all[1].level, all[1].chunks[0].id.as_str()), (AuditLevel::Chunks, "c1"));
    assert_eq!("chunks".parse::<AuditLevel>().unwrap(), AuditLevel::Chunks);
    assert_eq!(AuditLevel::Summary.to_string(), "summary");
    let err = "loud".parse::<AuditLevel>().unwrap_err();
    assert_eq!(err.to_string(), "audit level: \"loud\": expected off, summary or chunks");
}

#[test]
fn task_is_cut_and_digested() {
    let mut r = AuditRecord::new("Compress");
    let long = "é".repeat(TASK_CHARS + 5);
    r.set_task(&long);
    assert_eq!(r.task.as_ref().unwrap().chars().count(), TASK_CHARS);
    assert!(r.task_truncated);
    let digest = r.task_digest.clone().unwrap();
    assert_eq!(digest.len(), 16);
    r.set_task("short");
    assert_eq!((r.task.as_deref(), r.task_truncated), (Some("short"), false));
    assert_ne!(r.task_digest.unwrap(), digest);
}

#[test]
fn retention_by_size_removes_the_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let one = serde_json::to_vec(&{
        let mut r = rec("s0", "a");
        r.level = AuditLevel::Summary;
        r.chunks.clear();
        r.at_ms = now_ms();
        r
    })
    .unwrap()
    .len() as u64;
    // room for 3 records (all of the same size: one-digit seqs and sessions)
    let log = open(&dir, AuditLevel::Summary, Retention { max_age: None, max_bytes: Some(3 * one + 2) });
    for i in 0..10 {
        log.append(vec![rec(&format!("s{i}"), "a")]).unwrap();
    }
    let kept = log.query(&AuditFilter::default()).unwrap();
    let sessions: Vec<_> = kept.iter().map(|r| r.session_id.clone().unwrap()).collect();
    assert_eq!(sessions, ["s7", "s8", "s9"], "the newest are kept");
    let (count, bytes) = log.stats().unwrap();
    assert_eq!(count, 3);
    assert!(bytes <= 3 * one + 2, "{bytes} bytes kept");
    assert_eq!(kept[0].seq, 7, "seqs are not reused");
}

#[test]
fn retention_by_age_removes_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(&dir, AuditLevel::Summary, Retention::default());
    log.append(vec![rec("old1", "a"), rec("old2", "a")]).unwrap();
    let later = now_ms() + 60_000;
    // a minute later, with a 30 s limit: both go
    let removed = log.prune(Retention { max_age: Some(Duration::from_secs(30)), max_bytes: None }, later).unwrap();
    assert_eq!(removed, 2);
    log.append(vec![rec("new", "a")]).unwrap();
    // an hour's limit keeps the new one
    assert_eq!(log.prune(Retention { max_age: Some(Duration::from_secs(3600)), max_bytes: None }, later).unwrap(), 0);
    let kept = log.query(&AuditFilter::default()).unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].session_id.as_deref(), Some("new"));
    assert!(log.stats().unwrap().1 > 0);
    // a zero max_age on the writer prunes everything older than the commit
    drop(log);
    let log = open(&dir, AuditLevel::Summary, Retention { max_age: Some(Duration::ZERO), max_bytes: None });
    std::thread::sleep(Duration::from_millis(5));
    log.append(vec![rec("newest", "a")]).unwrap();
    let kept = log.query(&AuditFilter::default()).unwrap();
    assert_eq!(kept.iter().map(|r| r.session_id.clone().unwrap()).collect::<Vec<_>>(), ["newest"]);
}

#[test]
fn filters_by_session_caller_time_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(&dir, AuditLevel::Summary, Retention::default());
    log.append(vec![rec("s1", "did:a"), rec("s2", "did:b")]).unwrap();
    let t1 = log.query(&AuditFilter::default()).unwrap()[0].at_ms;
    std::thread::sleep(Duration::from_millis(3));
    log.append(vec![rec("s1", "did:b")]).unwrap();
    let t2 = log.query(&AuditFilter { after_seq: Some(1), ..Default::default() }).unwrap()[0].at_ms;
    assert!(t2 > t1);
    let q = |f: AuditFilter| log.query(&f).unwrap().iter().map(|r| r.seq).collect::<Vec<_>>();
    assert_eq!(q(AuditFilter { session: Some("s1".into()), ..Default::default() }), [0, 2]);
    assert_eq!(q(AuditFilter { caller: Some("did:b".into()), ..Default::default() }), [1, 2]);
    assert_eq!(q(AuditFilter { since_ms: Some(t2), ..Default::default() }), [2]);
    assert_eq!(q(AuditFilter { until_ms: Some(t1), ..Default::default() }), [0, 1]);
    assert_eq!(q(AuditFilter { limit: Some(1), caller: Some("did:b".into()), ..Default::default() }), [1]);
    assert_eq!(q(AuditFilter { session: Some("s1".into()), caller: Some("did:a".into()), ..Default::default() }), [0]);
    let err = log.query(&AuditFilter { since_ms: Some(t2), until_ms: Some(t1), ..Default::default() }).unwrap_err();
    assert_eq!(err.to_string(), format!("since_ms: {t2} is after until_ms {t1}"));
}

#[test]
fn concurrent_writers_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(&dir, AuditLevel::Chunks, Retention::default()));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..200).flat_map(|i| log.append(vec![rec(&format!("t{t}-{i}"), "a")]).unwrap()).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 1600, "distinct seqs");
    let all = log.query(&AuditFilter::default()).unwrap();
    assert_eq!(all.len(), 1600);
    assert!(all.windows(2).all(|w| w[0].seq + 1 == w[1].seq && w[0].at_ms <= w[1].at_ms));
    let mut sessions: Vec<_> = all.iter().map(|r| r.session_id.clone().unwrap()).collect();
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), 1600, "every record is a different append");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_appends_and_reopen_keep_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(&dir, AuditLevel::Summary, Retention::default()));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let log = log.clone();
            tokio::spawn(async move { log.append_async(vec![rec(&format!("s{i}"), "a")]).await.unwrap() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().len(), 1);
    }
    drop(Arc::try_unwrap(log).unwrap());
    let log = open(&dir, AuditLevel::Summary, Retention::default());
    assert_eq!(log.query(&AuditFilter::default()).unwrap().len(), 16);
    assert_eq!(log.append_async(vec![rec("after", "a")]).await.unwrap(), [16], "seqs continue after a reopen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_appends_are_visible_at_once_and_durable_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(&dir, AuditLevel::Summary, Retention::default());
    log.append_async(vec![rec("first", "a")]).await.unwrap();
    assert_eq!(log.durable_commits(), 1);
    // 50 kinds (callers): each its own record (one caller's distinct
    // sessions would share records past MERGE_SESSIONS)
    for i in 0..50 {
        let seqs = log.append_deferred(vec![rec(&format!("refused-{i}"), &format!("a{i}"))]).await.unwrap();
        assert_eq!(seqs, [i + 1]);
    }
    assert_eq!(log.query(&AuditFilter::default()).unwrap().len(), 51, "readers see deferred records at once");
    let fsyncs = log.durable_commits();
    assert!(fsyncs <= 2, "50 deferred appends made {} durable commits", fsyncs - 1);
    // with no other commit, the writer makes one within the window
    tokio::time::sleep(DEFER_MAX + Duration::from_millis(300)).await;
    assert_eq!(log.durable_commits(), fsyncs + 1, "one flush for the window");
    tokio::time::sleep(DEFER_MAX + Duration::from_millis(100)).await;
    assert_eq!(log.durable_commits(), fsyncs + 1, "nothing deferred, no more flushes");
    // deferred records are flushed when the log closes, too
    log.append_deferred(vec![rec("last", "a")]).await.unwrap();
    drop(log);
    let log = open(&dir, AuditLevel::Summary, Retention::default());
    let all = log.query(&AuditFilter::default()).unwrap();
    assert_eq!(all.len(), 52);
    assert_eq!(all[51].session_id.as_deref(), Some("last"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_deferred_records_merge_into_one_per_window() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(&dir, AuditLevel::Summary, Retention::default());
    let refused = |session: &str, outcome: &str| {
        let mut r = rec(session, "a");
        r.outcome = outcome.into();
        r
    };
    // one call (merged within its commit), then a few more calls (merged
    // across commits, and across a durable one): all in one window
    let first = log.append_deferred((0..96).map(|_| refused("s", "PermissionDenied")).collect()).await.unwrap();
    assert!(first.iter().all(|&s| s == first[0]), "{first:?}");
    for _ in 0..2 {
        assert_eq!(log.append_deferred(vec![refused("s", "PermissionDenied")]).await.unwrap(), [first[0]]);
    }
    log.append_async(vec![rec("durable", "a")]).await.unwrap();
    let again = log.append_deferred(vec![refused("s", "PermissionDenied"), refused("s", "PermissionDenied")]);
    assert_eq!(again.await.unwrap(), [first[0], first[0]], "a durable commit does not end the window");
    let first = vec![first[0]];
    // another kind (outcome, session) is its own record; a durable
    // record is never merged
    let other = log.append_deferred(vec![refused("s", "InvalidArgument")]).await.unwrap();
    let third = log.append_deferred(vec![refused("t", "PermissionDenied")]).await.unwrap();
    assert_ne!(other, first);
    assert_ne!(third, other);
    let durable = log.append_async(vec![refused("s", "PermissionDenied")]).await.unwrap();
    assert!(durable[0] > third[0], "a durable record of a merged kind is its own: {durable:?}");
    let all = log.query(&AuditFilter::default()).unwrap();
    let counts: Vec<_> = all.iter().map(|r| (r.outcome.as_str(), r.count)).collect();
    let want = [
        ("PermissionDenied", 100),
        ("ok", 1),
        ("InvalidArgument", 1),
        ("PermissionDenied", 1),
        ("PermissionDenied", 1),
    ];
    assert_eq!(counts, want);
    let (n, bytes) = log.stats().unwrap();
    let json: u64 = all.iter().map(|r| serde_json::to_vec(r).unwrap().len() as u64).sum();
    assert_eq!((n, bytes), (5, json), "the byte count follows the grown record");
    // the next window starts a new record of the kind
    tokio::time::sleep(DEFER_MAX + Duration::from_millis(300)).await;
    let next = log.append_deferred(vec![refused("s", "PermissionDenied")]).await.unwrap();
    assert_ne!(next, first);
    let ok = log.append_async(vec![rec("s", "a")]).await.unwrap();
    assert_ne!(ok, next);
    // old records (no count) read as one call
    let mut old = serde_json::to_value(rec("old", "a")).unwrap();
    old.as_object_mut().unwrap().remove("count");
    assert_eq!(serde_json::from_value::<AuditRecord>(old).unwrap().count, 1);
}

#[test]
fn a_second_opener_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let _log = open(&dir, AuditLevel::Summary, Retention::default());
    let path = dir.path().join("audit.redb");
    let err = AuditLog::open(&path, AuditLevel::Summary, Retention::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: the audit database is open in another process (a running server holds its lock; query it with --server)",
            path.display()
        )
    );
}

#[test]
fn every_string_a_caller_chooses_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(&dir, AuditLevel::Chunks, Retention::default());
    let huge = "x".repeat(1 << 20);
    let mut r = rec(&huge, &huge);
    r.peer = Some(format!("{huge}:1"));
    r.model = Some(huge.clone());
    r.outcome = huge.clone();
    r.task = Some(huge.clone());
    r.task_digest = Some(huge.clone());
    r.chunks = vec![AuditChunk { id: huge.clone(), field: huge.clone(), score: 0.1, tokens: 1 }; MAX_LIST + 5];
    r.withheld = vec![huge.clone(); MAX_LIST + 5];
    log.append(vec![r, rec("line\nbreak", "a")]).unwrap();
    let (n, bytes) = log.stats().unwrap();
    assert_eq!(n, 2);
    // each id at most sha256: + 64 hex digits, the lists cut
    assert!(bytes < 2 * (MAX_LIST as u64 + 8) * 160 + 4096, "{bytes} bytes for two records");
    let got = log.query(&AuditFilter { session: Some(huge.clone()), ..Default::default() }).unwrap();
    assert_eq!(got.len(), 1, "a query by the long id finds its digest");
    let kept = &got[0];
    assert_eq!(kept.session_id.as_deref(), Some(bounded_id(&huge).as_str()));
    assert!(kept.session_id.as_ref().unwrap().starts_with("sha256:") && kept.session_id.as_ref().unwrap().len() == 71);
    for s in [&kept.caller, &kept.peer, &kept.model, &kept.task_digest] {
        assert!(s.as_ref().unwrap().len() <= MAX_ID_BYTES, "{s:?}");
    }
    assert!(kept.outcome.len() <= MAX_ID_BYTES);
    assert_eq!((kept.task.as_ref().unwrap().chars().count(), kept.task_truncated), (TASK_CHARS, true));
    assert_eq!((kept.chunks.len(), kept.withheld.len()), (MAX_LIST, MAX_LIST));
    assert!(kept.chunks.iter().all(|c| c.id.len() <= MAX_ID_BYTES && c.field.len() <= MAX_ID_BYTES));
    assert!(kept.withheld.iter().all(|w| w.len() <= MAX_ID_BYTES));
    // a control character is digested too; a short plain id is kept
    let q = |s: &str| log.query(&AuditFilter { session: Some(s.into()), ..Default::default() }).unwrap();
    assert_eq!(q("line\nbreak")[0].session_id, Some(bounded_id("line\nbreak")));
    assert_ne!(bounded_id("line\nbreak"), "line\nbreak");
    assert_eq!(bounded_id("s-1"), "s-1");
}

fn refused(session: &str, caller: &str, peer: &str) -> AuditRecord {
    let mut r = rec(session, caller);
    r.peer = Some(peer.into());
    r.outcome = "InvalidArgument".into();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_never_evict_successful_calls_records() {
    let dir = tempfile::tempdir().unwrap();
    let max = 40_000;
    let log = open(&dir, AuditLevel::Summary, Retention { max_age: None, max_bytes: Some(max) });
    let mut ok = Vec::new();
    for i in 0..3 {
        ok.extend(log.append_async(vec![rec(&format!("ok-{i}"), "a")]).await.unwrap());
    }
    // distinct callers and sessions: no merging at all
    for i in 0..600 {
        let id = format!("{i}-{}", "z".repeat(100));
        log.append_deferred(vec![refused(&id, &format!("did:key:{i}"), "10.0.0.1:1")]).await.unwrap();
    }
    let all = log.query(&AuditFilter::default()).unwrap();
    let kept: Vec<u64> = all.iter().filter(|r| r.outcome == "ok").map(|r| r.seq).collect();
    assert_eq!(kept, ok, "every successful call's record is kept");
    let (n, bytes) = log.stats().unwrap();
    let (rn, rbytes) = log.refused_stats().unwrap();
    assert!(rbytes <= max / REFUSED_PARTS && rbytes > 0, "{rbytes} bytes of refused records");
    assert_eq!((n, rn), (all.len() as u64, all.len() as u64 - 3));
    assert!(bytes <= max);
    let json: u64 = all.iter().filter(|r| r.outcome != "ok").map(|r| serde_json::to_vec(r).unwrap().len() as u64).sum();
    assert_eq!(json, rbytes, "the refused byte count follows the records");
    // the newest refused records are the ones kept
    assert!(all.last().unwrap().session_id.as_ref().unwrap().starts_with("599-"));
    // successful calls take the whole cap: refused records go first
    for i in 0..200 {
        log.append_async(vec![rec(&format!("later-{i}"), "a")]).await.unwrap();
    }
    assert_eq!(log.refused_stats().unwrap(), (0, 0), "refused records gave way to successful ones");
    assert!(log.stats().unwrap().1 <= max);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_sessions_and_ports_do_not_defeat_merging() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(&dir, AuditLevel::Summary, Retention::default());
    for i in 0..100 {
        let (session, peer) = (format!("s{i}"), format!("127.0.0.9:{}", 1000 + i));
        log.append_deferred(vec![refused(&session, "", &peer)]).await.unwrap();
    }
    let all = log.query(&AuditFilter::default()).unwrap();
    assert_eq!(all.len(), MERGE_SESSIONS + 1, "{:?}", all.iter().map(|r| (&r.session_id, r.count)).collect::<Vec<_>>());
    assert_eq!(all.iter().map(|r| r.count).sum::<u32>(), 100);
    assert!(all[..MERGE_SESSIONS].iter().all(|r| r.count == 1 && r.session_id.is_some()));
    let others = &all[MERGE_SESSIONS];
    assert_eq!((others.session_id.as_deref(), others.count), (None, 100 - MERGE_SESSIONS as u32));
    // another address is another kind
    log.append_deferred(vec![refused("s0", "", "127.0.0.10:1")]).await.unwrap();
    assert_eq!(log.query(&AuditFilter::default()).unwrap().len(), MERGE_SESSIONS + 2);
}
