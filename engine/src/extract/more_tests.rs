//! Follow-ups the context cannot answer: nothing unnamed below the floor.

use super::tests::{follow_up, hash_scd, opts, prose};
use super::*;
use crate::cancel::Cancel;
use crate::context::{Field, FieldKind};

/// The first answer to "why did the payment service time out" (it holds
/// the payment sentence, 12 cl100k tokens), then a follow-up asking
/// `question` on an engine whose follow-up floor is `floor`.
fn ask(floor: Option<f32>, question: &str) -> MoreContext {
    ask_for(floor, question, &[])
}

/// [`ask`], the follow-up naming `ids` too.
fn ask_for(floor: Option<f32>, question: &str, ids: &[&str]) -> MoreContext {
    let sessions = SessionConfig { more_min_relevance: floor, ..Default::default() };
    let scd = hash_scd(ScdConfig { sessions, ..Default::default() });
    let fields = vec![
        prose("database", "The database pool was exhausted at noon. Its size is ten connections."),
        prose("office", "The office plants need water on Mondays. The ficus is by the window."),
    ];
    let chunk_ids = ids.iter().map(|id| id.to_string()).collect();
    let grant = payments_answered(&scd, fields);
    scd.request_more(&ContextRequest { chunk_ids, ..follow_up(&grant, question, Some(40)) }).unwrap()
}

/// The session of the first answer to "why did the payment service time
/// out" over a payments sentence and `fields` (it holds the payments
/// sentence, 12 cl100k tokens).
fn payments_answered(scd: &Scd, fields: Vec<Field>) -> crate::session::SessionGrant {
    let mut all = vec![prose("payments", "The payment service timed out at checkout.")];
    all.extend(fields);
    let req = CompressRequest {
        task: Task::new("Why did the payment service time out at checkout?"),
        context: Context { fields: all },
        requirement: ContextRequirement::with_budget(12),
        session: Some(SessionRequest::default()),
    };
    let out = scd.compress_opts(&req, &opts("cl100k", false), &Cancel::new()).unwrap();
    let first: Vec<&str> = out.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(first, ["payments#0"], "{}", out.text);
    out.session.unwrap()
}

/// Below the floor nothing unnamed is sent, and `reason` says so, naming
/// the closest chunk when the receiver already holds it; above it, the
/// chunk the question is about is sent; with the floor off, the same
/// questions get filler.
#[test]
fn a_follow_up_the_context_cannot_answer_gets_nothing_and_says_why() {
    let off_topic = "Who won the chess tournament in Oslo last year?";
    let nothing = ask(Some(0.5), off_topic);
    assert!(nothing.chunks.is_empty() && nothing.text.is_empty() && nothing.sent_tokens == 0, "{nothing:?}");
    let why = nothing.reason.unwrap();
    let nearest = "nothing unsent is about the question: the unsent chunk nearest its floor has relevance ";
    assert!(why.starts_with(nearest), "{why}");
    assert!(why.ends_with("below its floor 0.5"), "no held chunk is named: the question is not about one: {why}");
    // the question is about what the receiver holds: it is told so
    let held = ask(Some(0.5), "Why did the payment service time out at checkout?");
    assert!(held.chunks.is_empty(), "{held:?}");
    let why = held.reason.unwrap();
    assert!(why.contains("; it is about payments#0 (relevance ") && why.ends_with("), sent earlier"), "{why}");
    // a question about an unsent paragraph gets it, the sentence the
    // question shares no word with included
    let pool = ask(Some(0.5), "When was the database pool exhausted?");
    let ids: Vec<&str> = pool.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["database#0", "database#1"], "{}", pool.text);
    assert_eq!(pool.reason, None);
    // the floor is what withholds: off, both get above-average filler
    for question in [off_topic, "Why did the payment service time out at checkout?"] {
        let filler = ask(Some(-1.0), question);
        assert!(!filler.chunks.is_empty(), "{question}: {filler:?}");
    }
    // the hash encoder measured no floor: none applies by default
    assert!(!ask(None, off_topic).chunks.is_empty());
    // a chunk named by id is sent whatever the floor (with its paragraph)
    let named = ask_for(Some(0.5), off_topic, &["office#1"]);
    let ids: Vec<&str> = named.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["office#0", "office#1"], "{}", named.text);
}

/// A kind's floor applies to that kind's fields only: the same question
/// about the same notes gets them as prose and nothing as Markdown (the
/// reason gives Markdown's floor); `more_min_relevance` stands in for every
/// kind's.
#[test]
fn a_kind_with_its_own_floor_withholds_what_another_kind_sends() {
    let ask = |kind: FieldKind, floor: Option<f32>| {
        let sessions = SessionConfig { more_min_relevance: floor, ..Default::default() };
        // the hash encoder with a floor for Markdown fields only, as
        // e5-small's manifest has one apart from the model's
        let enc = crate::encoder::HashEncoder::new(128, 512).with_relevance_floor(FieldKind::Markdown, 0.99);
        let scd = Scd::new(std::sync::Arc::new(enc), ScdConfig { sessions, ..Default::default() });
        let office = "The office plants need water on Mondays. The ficus is by the window.";
        let notes = Field { name: "office".into(), kind, confidential: false, content: office.into() };
        let grant = payments_answered(&scd, vec![notes]);
        scd.request_more(&follow_up(&grant, "When do the office plants need water?", Some(40))).unwrap()
    };
    let ids = |m: &MoreContext| m.chunks.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    let prose_notes = ask(FieldKind::Prose, None);
    assert_eq!(ids(&prose_notes), ["office#0", "office#1"], "{prose_notes:?}");
    let markdown = ask(FieldKind::Markdown, None);
    assert!(markdown.chunks.is_empty(), "{markdown:?}");
    // the held payments chunk is prose, which has no floor here: the
    // question is not said to be about it
    assert!(markdown.reason.as_deref().unwrap().ends_with("below its floor 0.99"), "{markdown:?}");
    assert!(!ask(FieldKind::Markdown, Some(0.5)).chunks.is_empty(), "the session's floor stands in for the kind's");
}

/// In a context of two kinds, whether anything is about the question is
/// measured against each chunk's own kind's floor: a prose note above its
/// floor (none here) is a candidate although the Markdown note the
/// question is closer to is under Markdown's, so a reply too small for it
/// says it did not fit, not that nothing is about the question.
#[test]
fn a_mixed_context_measures_each_chunk_against_its_own_kinds_floor() {
    let enc = crate::encoder::HashEncoder::new(128, 512).with_relevance_floor(FieldKind::Markdown, 0.99);
    let scd = Scd::new(std::sync::Arc::new(enc), ScdConfig::default());
    let markdown = "The office plants need water on Mondays.";
    let fields = vec![
        Field { name: "plants.md".into(), kind: FieldKind::Markdown, confidential: false, content: markdown.into() },
        prose("notes", "The office ficus stands by the window."),
        prose("payroll", "Salaries are paid on the last Friday of the month."),
        prose("parking", "Visitors park in the north lot after six."),
    ];
    let grant = payments_answered(&scd, fields);
    let more = scd.request_more(&follow_up(&grant, "When do the office plants need water?", Some(2))).unwrap();
    assert!(more.chunks.is_empty(), "{more:?}");
    let why = more.reason.unwrap();
    assert_eq!(why, "no unseen chunk above the context's average relevance fits the reply's 2 tokens");
}

/// The floor applies to a chunk's group: a paragraph's sentence that
/// shares no word with the question is about it as its paragraph is.
#[test]
fn a_sentence_is_as_relevant_as_its_paragraph() {
    let scd = hash_scd(ScdConfig::default());
    let field = prose("database", "The database pool was exhausted at noon. Its size is ten connections.");
    let ctx = scd.prepare(&[&field], &Cancel::new()).unwrap();
    let q = scd.embed_cached(&["When was the database pool exhausted?"], crate::encoder::InputKind::Query).unwrap();
    let about = super::more::about(&ctx, &q[0], &|_| 0.0);
    assert_eq!(ctx.chunks.len(), 2, "two sentences");
    assert!(about.own[1] < about.own[0], "{:?}", about.own);
    assert_eq!(about.group, [about.own[0], about.own[0]]);
}

/// A follow-up with nothing about its question sends nothing, not even the
/// cheap line between two pieces the receiver holds (a bridge).
#[test]
fn a_follow_up_about_nothing_fills_no_gap_between_held_pieces() {
    let sessions = SessionConfig { more_min_relevance: Some(0.5), ..Default::default() };
    let scd = hash_scd(ScdConfig { sessions, ..Default::default() });
    let log = "2024-05-01 10:00:01 ERROR payments: charge timed out for order 17\n\
               2024-05-01 10:00:02 INFO ok\n\
               2024-05-01 10:00:03 ERROR db: connection pool exhausted during the payments charge\n";
    let field = Field {
        name: "services/payments/worker-7/app.log".into(),
        kind: FieldKind::Log,
        confidential: false,
        content: log.into(),
    };
    let req = CompressRequest {
        task: Task::new("Why did the payments charge time out?"),
        context: Context { fields: vec![field] },
        requirement: ContextRequirement::with_budget(74),
        session: Some(SessionRequest::default()),
    };
    let out = scd.compress_opts(&req, &opts("cl100k", true), &Cancel::new()).unwrap();
    let first: Vec<&str> = out.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        first,
        ["services/payments/worker-7/app.log#0", "services/payments/worker-7/app.log#2"],
        "{}\n{:?}",
        out.text,
        out.dropped
    );
    let more = scd.request_more(&follow_up(&out.session.unwrap(), "Who won the chess tournament in Oslo?", Some(40)));
    let more = more.unwrap();
    assert!(more.chunks.is_empty(), "{}", more.text);
    assert!(more.reason.unwrap().starts_with("nothing unsent is about the question"));
}
