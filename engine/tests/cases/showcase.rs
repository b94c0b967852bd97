//! The fixture showcase (README, docs/compress.md): with the real model,
//! what a receiver pastes at 150 cl100k tokens answers "why are charges
//! failing", says where each piece came from, and fits the budget.

use std::sync::Arc;

use scd_engine::budget::builtin;
use scd_engine::cancel::Cancel;
use scd_engine::context::{Context, ContextRequirement, FieldKind, Task};
use scd_engine::encoder::Encoder;
use scd_engine::extract::{CompressOptions, CompressRequest, ContextRequest, Scd, ScdConfig, SessionRequest};

use super::{load, root};

fn showcase(budget: usize) -> Option<String> {
    let (enc, _) = load("e5-small")?;
    let scd = Scd::new(Arc::new(enc), ScdConfig::default());
    let ctx: Context =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap();
    let req = CompressRequest {
        task: Task::new("Why are customer charges failing at checkout?"),
        context: ctx,
        requirement: ContextRequirement::with_budget(budget),
        session: None,
    };
    let opts = CompressOptions { budget_tokenizer: Some(builtin("cl100k").unwrap()), ..CompressOptions::default() };
    let out = scd.compress_opts(&req, &opts, &Cancel::new()).unwrap();
    let n = builtin("cl100k").unwrap().count(&out.text).unwrap();
    assert!(n <= budget && n == out.totals.sent_tokens, "{n} of {budget}:\n{}", out.text);
    Some(out.text)
}

#[test]
fn the_showcase_keeps_the_root_cause_at_150_cl100k_with_its_source() {
    let Some(text) = showcase(150) else { return };
    // the error entry, not the INFO lines beside it, with the line it sits on
    assert!(
        text.contains("[error_logs:3]\n2026-11-30T00:12:03Z ERROR payments::db: connection pool exhausted"),
        "{text}"
    );
    assert!(!text.contains("health check ok") && !text.contains("newsletter: sent weekly digest"), "{text}");
    // the code that acquires the connection, indented as written
    assert!(
        text.contains(
            "fn charge_card(pool: &Pool, order: &Order) -> Result<Receipt> {\n    let conn = pool.acquire()?;"
        ),
        "{text}"
    );
    // every piece opens with its header line; the confidential field never appears
    assert!(text.starts_with('['), "{text}");
    assert!(!text.contains("sk_live") && !text.contains("api_keys"), "{text}");
}

/// A follow-up over prose notes that nothing in them answers gets nothing
/// and says why, at e5-small's floor from its manifest; one about a
/// paragraph the receiver lacks gets it. (Over the fixture's SQL and code,
/// e5's cosine with any question runs higher: an off-topic question clears
/// the floor there, docs/compress.md.)
#[test]
fn a_follow_up_the_notes_cannot_answer_gets_nothing_and_says_why() {
    let Some((enc, _)) = load("e5-small") else { return };
    assert_eq!(enc.relevance_floor(FieldKind::Prose), Some(0.8), "e5-small's manifest carries its floor");
    let kinds = [FieldKind::Markdown, FieldKind::Json, FieldKind::Log].map(|k| enc.relevance_floor(k));
    assert_eq!(kinds, [Some(0.84), Some(0.8), Some(0.8)], "and Markdown's apart");
    let scd = Scd::new(Arc::new(enc), ScdConfig::default());
    let notes = [
        ("incident", "Checkout failed for twenty minutes on Monday. The payment service could not get a database connection, so every charge timed out."),
        ("fix", "We raised the connection pool from 32 to 64 and added an alert when fewer than four connections are free."),
        ("review", "The postmortem is on Thursday. Bring the timeline of the outage and the graphs of the pool."),
    ];
    let fields = notes.iter().map(|(name, text)| serde_json::json!({"name": name, "kind": "prose", "content": text}));
    let ctx: Context = serde_json::from_value(serde_json::json!({ "fields": fields.collect::<Vec<_>>() })).unwrap();
    let req = CompressRequest {
        task: Task::new("Why did checkout fail on Monday?"),
        context: ctx,
        requirement: ContextRequirement::with_budget(40),
        session: Some(SessionRequest::default()),
    };
    let opts = CompressOptions { budget_tokenizer: Some(builtin("cl100k").unwrap()), ..CompressOptions::default() };
    let out = scd.compress_opts(&req, &opts, &Cancel::new()).unwrap();
    assert!(out.text.contains("could not get a database connection") && !out.text.contains("64"), "{}", out.text);
    let grant = out.session.unwrap();
    let ask = |question: &str| {
        scd.request_more(&ContextRequest {
            session_id: grant.id.clone(),
            session_token: grant.token.clone(),
            specific_question: question.into(),
            current_confidence: 0.3,
            max_tokens: Some(60),
            ..Default::default()
        })
        .unwrap()
    };
    let chess = ask("Who won the chess tournament in Oslo last year?");
    assert!(chess.chunks.is_empty() && chess.sent_tokens == 0, "{}", chess.text);
    let why = chess.reason.unwrap();
    assert!(why.starts_with("nothing unsent is about the question") && why.contains("below its floor 0.8"), "{why}");
    let fix = ask("How was the connection pool changed after the outage?");
    assert!(fix.text.contains("from 32 to 64"), "{}", fix.text);
}

/// A log error repeated with only its timestamp changed: the first of the
/// repeats is sent (when the trouble began), the later ones are
/// near-duplicates of it, and a DNS record's `NOERROR` is no error line.
#[test]
fn a_repeated_log_error_is_sent_at_its_first_occurrence() {
    let Some((enc, _)) = load("e5-small") else { return };
    let scd = Scd::new(Arc::new(enc), ScdConfig::default());
    let mut log = String::new();
    for i in 0..30 {
        log.push_str(&format!("2015-04-22 01:45:{i:02}.100 [exec-{i}] INFO  cart: item {i} added for session {i}\n"));
        log.push_str(&format!(
            "1379288690.{i:02}\tC{i}\t192.168.33.10\t53\tudp\thost{i}.example.com\tA\t0\tNOERROR\tF\n"
        ));
    }
    for ms in [151, 152, 155, 157] {
        log.push_str(&format!(
            "2015-04-22 01:46:25.{ms} [exec-7] ERROR org.apache.velocity.runtime.log.Log4JLogChute session 7 experience 5 left side of the '>' operation has null value at logTag line 1 column 373\n"
        ));
    }
    let ctx: Context = serde_json::from_value(serde_json::json!({
        "fields": [{"name": "app.log", "kind": "log", "content": log}]
    }))
    .unwrap();
    let req = CompressRequest {
        task: Task::new("The web application logged errors at 01:46. What failed?"),
        context: ctx,
        requirement: ContextRequirement::with_budget(90),
        session: None,
    };
    let opts = CompressOptions { budget_tokenizer: Some(builtin("cl100k").unwrap()), ..CompressOptions::default() };
    let out = scd.compress_opts(&req, &opts, &Cancel::new()).unwrap();
    assert!(
        out.text.contains("[app.log:61]\n2015-04-22 01:46:25.151 [exec-7] ERROR org.apache.velocity"),
        "{}",
        out.text
    );
    assert!(!out.text.contains("01:46:25.152") && !out.text.contains("NOERROR"), "{}", out.text);
}
