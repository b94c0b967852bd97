//! Extraction (paper §6): budgets, required/optional, confidentiality,
//! sessions, cache.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use scd_engine::cancel::Cancel;
use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
use scd_engine::encoder::{Encoder, HashEncoder};
use scd_engine::extract::{
    CompressOptions, CompressRequest, ContextRequest, Scd, ScdConfig, ScoringConfig, SessionConfig, SessionRequest,
};
use scd_engine::session::SessionGrant;
use scd_engine::Error;
use serde_json::Value;

use super::root;

fn fixture() -> (Context, Value) {
    let ctx =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap();
    let gold = serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context_gold.json")).unwrap())
        .unwrap();
    (ctx, gold)
}

fn hash_scd() -> Scd {
    Scd::new(Arc::new(HashEncoder::new(256, 512)), ScdConfig::default())
}

pub(super) fn req(task: &str, context: Context, budget: usize) -> CompressRequest {
    CompressRequest {
        task: Task::new(task),
        context,
        requirement: ContextRequirement::with_budget(budget),
        session: None,
    }
}

/// `r` opening a session under `id`.
fn with_session(mut r: CompressRequest, id: &str) -> CompressRequest {
    r.session = Some(SessionRequest { id: Some(id.into()), ..Default::default() });
    r
}

fn more(g: &SessionGrant, question: &str, confidence: f32) -> ContextRequest {
    ContextRequest {
        session_id: g.id.clone(),
        session_token: g.token.clone(),
        specific_question: question.into(),
        current_confidence: confidence,
        ..Default::default()
    }
}

#[test]
fn budget_is_never_exceeded_on_random_contexts() {
    let scd = hash_scd();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let words = ["agent", "budget", "error", "pool", "charge", "user", "table", "log", "the", "retry", "timeout"];
    let kinds = [FieldKind::Prose, FieldKind::Code, FieldKind::Log, FieldKind::Chat, FieldKind::Table, FieldKind::Json];
    for case in 0..60 {
        let fields = (0..rng.random_range(1..5))
            .map(|f| {
                let kind = kinds[rng.random_range(0..kinds.len())];
                let lines: Vec<String> = (0..rng.random_range(1..12))
                    .map(|_| {
                        let n = rng.random_range(1..14);
                        let s: Vec<&str> = (0..n).map(|_| words[rng.random_range(0..words.len())]).collect();
                        format!("{}.", s.join(" "))
                    })
                    .collect();
                Field { name: format!("f{f}"), kind, content: lines.join("\n"), confidential: rng.random_bool(0.2) }
            })
            .collect();
        let budget = rng.random_range(1..120);
        let out = scd.compress(&req("why did the charge time out", Context { fields }, budget)).unwrap();
        assert!(out.totals.sent_tokens <= budget, "case {case}: {} > {budget}", out.totals.sent_tokens);
        // the text is counted whole, its headers included
        assert_eq!(out.totals.sent_tokens, scd.encoder().count_tokens(&out.text).unwrap());
        assert!(out.totals.sent_tokens >= out.chunks.iter().map(|c| c.tokens).sum::<usize>());
        let mut ids: Vec<&str> = out.chunks.iter().map(|c| c.id.as_str()).collect();
        ids.dedup();
        assert_eq!(ids.len(), out.chunks.len(), "no chunk twice");
    }
}

#[test]
fn confidential_fields_never_leave() {
    let (ctx, gold) = fixture();
    let marker = gold["confidential_marker"].as_str().unwrap();
    let scd = hash_scd();
    let out = scd.compress(&req("what is the payment gateway key", ctx.clone(), 10_000)).unwrap();
    let json = serde_json::to_string(&(&out.chunks, &out.dropped, &out.warnings)).unwrap();
    assert!(!json.contains(marker) && !json.contains("api_keys"), "confidential text or field leaked");
    let mut r = req("x", ctx.clone(), 1000);
    r.requirement.required_fields = vec!["api_keys".into()];
    let err = scd.compress(&r).unwrap_err().to_string();
    assert!(!err.contains(marker), "{err}");
    // not even through an adaptive request naming its chunk id
    let g = scd.compress(&with_session(req("payment key", ctx, 50), "s-conf")).unwrap().session.unwrap();
    let more_ctx = scd.request_more(&more(&g, "what is the gateway key", 0.1));
    let text = format!("{more_ctx:?}");
    assert!(!text.contains(marker));
    let err = scd.request_more(&ContextRequest { chunk_ids: vec!["api_keys#0".into()], ..more(&g, "key", 0.1) });
    assert!(matches!(err, Err(Error::InvalidArgument { .. })));
    // an unknown id is named by its place, not quoted (it may be anything)
    let pasted = "the gateway key is sk_live_pasted";
    let err = scd
        .request_more(&ContextRequest { chunk_ids: vec!["error_logs#0".into(), pasted.into()], ..more(&g, "key", 0.1) })
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chunk_ids[1]: not a chunk of the session's context") && !err.contains("sk_live"), "{err}");
}

#[test]
fn required_fields_come_first_and_must_fit() {
    let (ctx, _) = fixture();
    let scd = hash_scd();
    let mut r = req("why do charges fail", ctx.clone(), 1000);
    r.requirement.required_fields = vec!["db_schema".into()];
    r.requirement.optional_fields = vec!["error_logs".into()];
    let out = scd.compress(&r).unwrap();
    let schema_chunks = out.chunks.iter().filter(|c| c.field == "db_schema").count();
    assert_eq!(schema_chunks, 3, "required field sent whole");
    assert!(out.chunks.iter().all(|c| c.field == "db_schema" || c.field == "error_logs"), "only requested fields");
    r.requirement.max_context_tokens = 5;
    match scd.compress(&r).unwrap_err() {
        Error::BudgetTooSmall { needed, budget } => {
            assert_eq!(budget, 5);
            assert!(needed > 5);
        }
        other => panic!("expected BudgetTooSmall, got {other}"),
    }
    r.requirement.required_fields = vec!["nope".into()];
    let err = scd.compress(&r).unwrap_err().to_string();
    assert_eq!(err, "required_fields: unknown field \"nope\"");
    r.requirement.required_fields = vec![];
    r.requirement.max_context_tokens = 0;
    assert_eq!(scd.compress(&r).unwrap_err().to_string(), "max_context_tokens: must be at least 1");
    r.requirement.max_context_tokens = 10;
    r.requirement.relevance_threshold = Some(f32::NAN);
    assert!(scd.compress(&r).unwrap_err().to_string().starts_with("relevance_threshold: must be a cosine in [-1, 1]"));
}

#[test]
fn adaptive_requests_never_resend_and_respect_confidence() {
    let (ctx, _) = fixture();
    let scd = hash_scd();
    let first = scd.compress(&with_session(req("why do charges fail at checkout", ctx, 40), "task-1")).unwrap();
    let g = first.session.clone().unwrap();
    assert_eq!(g.id, "task-1");
    let mut seen: std::collections::HashSet<String> = first.chunks.iter().map(|c| c.id.clone()).collect();
    let confident = scd.request_more(&more(&g, "which table", 0.9)).unwrap();
    assert!(confident.chunks.is_empty() && confident.reason.unwrap().contains("threshold"));
    // each follow-up has its own budget (by default the first answer's);
    // the session keeps the total
    let mut total = first.totals.sent_tokens;
    for q in ["which table stores charges", "what code acquires the connection", "what did the user report"] {
        let more = scd.request_more(&more(&g, q, 0.3)).unwrap();
        // counted whole, as pasted: the chunks and their headers
        let used = scd.encoder().count_tokens(&more.text).unwrap();
        assert!(used <= 40 && used == more.sent_tokens, "{used} {more:?}");
        assert!(used >= more.chunks.iter().map(|c| c.tokens).sum::<usize>());
        total += used;
        assert_eq!((more.budget, more.session_sent_tokens, more.remaining_tokens), (40, total, 40));
        for c in more.chunks {
            assert!(seen.insert(c.id.clone()), "chunk {} resent", c.id);
        }
    }
    let unknown = scd.request_more(&ContextRequest { session_id: "nope".into(), ..more(&g, "x", 0.1) });
    assert!(matches!(unknown, Err(Error::UnknownSession { .. })));
}

#[test]
fn sessions_expire() {
    let (ctx, _) = fixture();
    let cfg = ScdConfig {
        sessions: SessionConfig { session_ttl: std::time::Duration::from_millis(50), ..Default::default() },
        ..ScdConfig::default()
    };
    let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), cfg);
    let g = scd.compress(&with_session(req("charges", ctx, 30), "short")).unwrap().session.unwrap();
    assert_eq!(scd.session_stats().live, 1);
    std::thread::sleep(std::time::Duration::from_millis(80));
    let err = scd.request_more(&more(&g, "x", 0.1));
    assert!(matches!(err, Err(Error::UnknownSession { .. } | Error::SessionGone { .. })), "{err:?}");
    assert_eq!(scd.session_stats().live, 0);
}

#[test]
fn grown_context_embeds_only_new_chunks() {
    let (mut ctx, _) = fixture();
    let scd = hash_scd();
    scd.compress(&req("charges failing", ctx.clone(), 50)).unwrap();
    let before = scd.cache_stats();
    let log = ctx.fields.iter_mut().find(|f| f.name == "error_logs").unwrap();
    log.content.push_str("\n2026-11-30T00:14:00Z ERROR payments::db: pool exhausted again");
    scd.compress(&req("charges failing", ctx, 50)).unwrap();
    let after = scd.cache_stats();
    assert_eq!(after.misses - before.misses, 1, "only the new log chunk is embedded");
    assert!(after.hits - before.hits >= 10, "{before:?} -> {after:?}");
}

#[test]
fn real_model_finds_the_evidence_in_the_fixture() {
    let Some((enc, _)) = super::e5() else { return };
    // a second encoder instance is not needed: wrap a fresh load through the same runtime
    let dir = super::model_dir("e5-small").unwrap();
    let mut cfg = scd_engine::encoder::OrtConfig::new(super::ort_lib());
    cfg.intra_threads = 2;
    let enc2 = scd_engine::encoder::OrtEncoder::load(&dir, &cfg).unwrap();
    assert_eq!(enc2.model_id(), enc.model_id());
    let scd = Scd::new(Arc::new(enc2), ScdConfig::default());
    let (ctx, gold) = fixture();
    let total: usize =
        ctx.fields.iter().filter(|f| !f.confidential).map(|f| scd.encoder().count_tokens(&f.content).unwrap()).sum();
    // 55 % of the context for the gold chunks, and room for the header
    // line each piece of the text opens (five pieces, about 7 e5 tokens each)
    let budget = total * 55 / 100 + 35;
    let out = scd.compress(&req(gold["task"].as_str().unwrap(), ctx, budget)).unwrap();
    let sent: String = out.chunks.iter().map(|c| c.text.as_str()).collect::<Vec<_>>().join("\n");
    for g in gold["gold_substrings"].as_array().unwrap() {
        assert!(sent.contains(g.as_str().unwrap()), "missing {g} in:\n{sent}");
    }
    assert!(out.totals.sent_tokens <= budget);
    assert_eq!(out.task_embedding.len(), 384);
}

fn prose(name: &str, content: &str) -> Field {
    Field { name: name.into(), kind: FieldKind::Prose, content: content.into(), confidential: false }
}

#[test]
fn a_second_hop_brings_the_fact_only_the_bridge_entity_connects() {
    // names that no chunk mentions, so links cannot do the hop
    let ctx = Context {
        fields: vec![
            prose("doc1", "Zorblax is a film directed by Quentin Marlowe."),
            prose("doc2", "Quentin Marlowe was raised in Tulsa."),
            prose("doc3", "Alice Brown was born in Paris."),
            prose("doc4", "Bob Stone was born in Rome."),
            prose("doc5", "Carol King was born in Oslo."),
        ],
    };
    let sent = |w: f32| {
        let cfg = ScdConfig {
            scoring: ScoringConfig { second_hop_weight: w, second_hop_sources: 1, ..Default::default() },
            ..ScdConfig::default()
        };
        let scd = Scd::new(Arc::new(HashEncoder::new(256, 512)), cfg);
        // 14 for the two sentences, and a header line for each field
        let out = scd.compress(&req("where was the director of Zorblax born", ctx.clone(), 18)).unwrap();
        assert!(out.totals.sent_tokens <= 18);
        out.chunks.iter().map(|c| c.field.clone()).collect::<Vec<_>>()
    };
    let (off, on) = (sent(0.0), sent(3.0));
    assert!(off.contains(&"doc1".to_string()) && !off.contains(&"doc2".to_string()), "{off:?}");
    assert_eq!(on, ["doc1", "doc2"]);
}

#[test]
fn group_closure_sends_a_short_paragraph_whole_or_not_at_all() {
    let ctx = Context {
        fields: vec![prose(
            "notes",
            "The gateway timed out at noon. Engineers restarted it. The logs were kept.\n\nLunch was pizza. The office is cold.",
        )],
    };
    // no limit by the budget's share here (the next test has it)
    let scoring = ScoringConfig { group_closure_tokens: 50, group_closure_share: 1.0, ..Default::default() };
    let scd = Scd::new(Arc::new(HashEncoder::new(256, 512)), ScdConfig { scoring, ..ScdConfig::default() });
    let task = "why did the gateway time out";
    // 13 words, and 2 for the header line ([notes:1])
    let out = scd.compress(&req(task, ctx.clone(), 15)).unwrap();
    let texts: Vec<&str> = out.chunks.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(texts, ["The gateway timed out at noon.", "Engineers restarted it.", "The logs were kept."]);
    // when the paragraph cannot fit whole, packing goes on chunk by chunk under the budget
    let out = scd.compress(&req(task, ctx, 11)).unwrap();
    assert!(out.totals.sent_tokens <= 11);
    assert_eq!(out.chunks[0].text, "The gateway timed out at noon.");
    assert!(out.chunks.len() < 4);
}

/// Issue 45: the rest of a paragraph comes along only when the whole
/// paragraph costs at most `group_closure_share` of the budget; over it,
/// its other sentences are packed by their own scores, as any chunk.
#[test]
fn a_paragraph_over_its_share_of_the_budget_is_not_brought_whole() {
    let ctx = Context {
        fields: vec![
            prose("notes", "The gateway timed out at noon. Engineers restarted it. The logs were kept."),
            prose("other", "Lunch was pizza. The office is cold. The gateway is new."),
        ],
    };
    let brought = |share: f32| {
        let scoring = ScoringConfig { group_closure_tokens: 50, group_closure_share: share, ..Default::default() };
        let scd = Scd::new(Arc::new(HashEncoder::new(256, 512)), ScdConfig { scoring, ..ScdConfig::default() });
        let opts = CompressOptions { explain: true, ..Default::default() };
        let out = scd.compress_opts(&req("why did the gateway time out", ctx.clone(), 20), &opts, &Cancel::new());
        let out = out.unwrap();
        assert!(out.totals.sent_tokens <= 20, "{:?}", out.totals);
        let why = out.explanation.unwrap().selected;
        why.iter().filter(|w| w.by_closure && !w.lead).map(|w| w.id.clone()).collect::<Vec<_>>()
    };
    // the paragraph (13 tokens) is within the budget but over half of it
    assert_eq!(brought(1.0), ["notes#1", "notes#2"]);
    assert_eq!(brought(0.7), ["notes#1", "notes#2"]);
    assert!(brought(0.5).is_empty(), "{:?}", brought(0.5));
    assert!(brought(0.0).is_empty());
}

/// A follow-up asks for its answer's paragraph: the share of the budget
/// does not limit it (measured on MuSiQue's follow-ups, BENCHMARKS.md).
#[test]
fn a_follow_up_brings_its_paragraph_whatever_the_share() {
    let ctx = Context {
        fields: vec![
            prose("notes", "The gateway timed out at noon. Engineers restarted it. The logs were kept."),
            prose("other", "Lunch was pizza. The office is cold."),
        ],
    };
    let followed = |tokens: usize, share: f32| {
        let scoring = ScoringConfig { group_closure_tokens: tokens, group_closure_share: share, ..Default::default() };
        let scd = Scd::new(Arc::new(HashEncoder::new(256, 512)), ScdConfig { scoring, ..ScdConfig::default() });
        let first = scd.compress(&with_session(req("what was for lunch", ctx.clone(), 6), "s-share")).unwrap();
        assert!(first.chunks.iter().all(|c| !c.id.starts_with("notes")), "{:?}", first.chunks);
        let g = first.session.unwrap();
        let next = ContextRequest { max_tokens: Some(20), ..more(&g, "why did the gateway time out", 0.2) };
        let out = scd.request_more(&next).unwrap();
        assert!(out.sent_tokens <= 20);
        out.chunks.iter().map(|c| c.id.clone()).filter(|id| id.starts_with("notes")).collect::<Vec<_>>()
    };
    // the paragraph (13 tokens) is over 0.5 of the follow-up's budget
    assert_eq!(followed(50, 0.5), ["notes#0", "notes#1", "notes#2"]);
    assert_eq!(followed(50, 0.5), followed(50, 1.0));
    // "Engineers restarted it." comes by closure: without closure it is not sent
    assert!(!followed(0, 1.0).contains(&"notes#1".to_string()), "{:?}", followed(0, 1.0));
}

/// Issue 45: a markdown section (a how-to from its heading to its last
/// step) comes whole once one of its chunks is sent, when it has at most
/// `section_closure_tokens` and fits; with the limit at 0 only its heading
/// rides along and the budget goes chunk by chunk (e5-small scores).
#[test]
fn a_short_markdown_section_is_sent_whole_once_one_chunk_is() {
    let Some(_) = super::e5() else { return };
    let dir = super::model_dir("e5-small").unwrap();
    let enc: Arc<dyn Encoder> = Arc::new(scd_engine::encoder::OrtEncoder::load(&dir, &ort_cfg()).unwrap());
    let how_to = "## Keeping sessions across replicas\n\nRun every replica with the same state store. \
                  Any replica then serves any session.\n\n```sh\nscd serve --state redis://127.0.0.1:6379\n```\n\n\
                  Check the counters page afterwards.";
    let doc = format!(
        "# Operations\n\n## Metrics\n\nCounters are exported on port nine thousand. \
         Grafana plots them.\n\n## Sessions\n\nA session lasts an hour after its last call. \
         Closing a session frees what it holds.\n\n{how_to}\n\n## Logging\n\nLogs go to standard error as JSON lines. \
         The level comes from the environment.\n"
    );
    let ctx = Context {
        fields: vec![Field { name: "ops.md".into(), kind: FieldKind::Markdown, content: doc, confidential: false }],
    };
    let task = "How do I keep sessions alive across several replicas?";
    // the section and its header line ([ops.md:11-19 Keeping sessions across replicas])
    let budget = enc.count_tokens(how_to).unwrap() + 16;
    let run = |limit: usize| {
        let scoring = ScoringConfig { section_closure_tokens: limit, ..Default::default() };
        let scd = Scd::new(enc.clone(), ScdConfig { scoring, ..ScdConfig::default() });
        scd.compress(&req(task, ctx.clone(), budget)).unwrap()
    };
    let whole = run(ScdConfig::default().scoring.section_closure_tokens);
    assert!(whole.totals.sent_tokens <= budget);
    for line in how_to.lines().filter(|l| !l.trim().is_empty()) {
        assert!(whole.text.contains(line), "{line:?} missing from {}", whole.text);
    }
    let by_chunks = run(0);
    assert!(by_chunks.totals.sent_tokens <= budget);
    assert!(how_to.lines().any(|l| !l.trim().is_empty() && !by_chunks.text.contains(l)), "{}", by_chunks.text);
}

/// Issue 45: with `long_function_bytes` set, a long function is trimmed
/// rather than dropped whole: with a budget short of it, its signature and
/// the body piece that answers are sent, `…` marking the rest; with room for
/// it (at most `function_closure_tokens`), it comes whole (e5-small scores).
#[test]
fn a_long_function_is_sent_trimmed_when_short_of_room_and_whole_with_room() {
    let Some(_) = super::e5() else { return };
    let dir = super::model_dir("e5-small").unwrap();
    let enc: Arc<dyn Encoder> = Arc::new(scd_engine::encoder::OrtEncoder::load(&dir, &ort_cfg()).unwrap());
    let filler = |tag: &str| -> String {
        (0..7).map(|i| format!("    const {tag}{i} = this.options.{tag}[{i}] || defaults.{tag}{i}\n")).collect()
    };
    let answer = "    // strip build metadata before the range is parsed\n    range = range.replace(re[t.BUILD], '')\n";
    let body = format!(
        "{}\n{answer}{}\n{}\n{}    return comparators\n",
        filler("memo"),
        filler("build_opts"),
        filler("hyphen"),
        filler("split")
    );
    let code = format!(
        "class Range {{\n  parseRange (range) {{\n{body}  }}\n\n  format () {{\n    return this.range\n  }}\n}}\n\n\
         const isSatisfiable = (comparators, options) => {{\n  return comparators.length > 0\n}}\n"
    );
    assert!(body.len() > 1024);
    let ctx = Context {
        fields: vec![Field {
            name: "classes/range.js".into(),
            kind: FieldKind::Code,
            content: code,
            confidential: false,
        }],
    };
    let task = "Build metadata like +build.5 bleeds into a parsed range; it should be stripped first. Where?";
    let mut cfg = ScdConfig::default();
    cfg.prepare.chunk.long_function_bytes = 1024;
    let scd = Scd::new(enc.clone(), cfg);
    let tokens = |s: &str| enc.count_tokens(s).unwrap();
    // room for the signature, the answering piece and two headers, not for the whole function
    let short = tokens(&filler("build_opts")) + tokens(answer) + 40;
    assert!(short < tokens(&body));
    let out = scd.compress(&req(task, ctx.clone(), short)).unwrap();
    assert!(out.totals.sent_tokens <= short);
    assert!(out.text.contains("  parseRange (range) {"), "{}", out.text);
    assert!(out.text.contains("range = range.replace(re[t.BUILD], '')"), "{}", out.text);
    assert!(out.text.contains('…') && !out.text.contains("const split6"), "{}", out.text);
    // with functions whole (this one is far under the default's 8 KiB), it does not fit and none of it is sent
    let whole = Scd::new(enc.clone(), ScdConfig::default()).compress(&req(task, ctx.clone(), short)).unwrap();
    assert!(!whole.text.contains("re[t.BUILD]"), "{}", whole.text);
    // with room, the whole function comes
    let room = tokens(&body) + 60;
    assert!(room <= ScdConfig::default().scoring.function_closure_tokens);
    let out = scd.compress(&req(task, ctx, room)).unwrap();
    assert!(out.totals.sent_tokens <= room);
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        assert!(out.text.contains(line), "{line:?} missing from {}", out.text);
    }
}

fn ort_cfg() -> scd_engine::encoder::OrtConfig {
    let mut cfg = scd_engine::encoder::OrtConfig::new(super::ort_lib());
    cfg.intra_threads = 2;
    cfg
}

/// Issue 45: a field of one line (a paragraph) is named alone in its
/// header (`[doc7]`, no line range), and the room the fit to the budget
/// frees is refilled: after a compress, no field left out would still fit
/// whole with its header (counted in o200k, whose merges across line
/// breaks packing's per-chunk estimate cannot see).
#[test]
fn one_line_fields_have_short_headers_and_no_room_is_left_that_a_field_fits() {
    use scd_engine::budget::builtin;
    use scd_engine::cancel::Cancel;
    use scd_engine::extract::CompressOptions;
    let fields: Vec<Field> = (0..30)
        .map(|i| {
            let text = format!("Item {i} was made in town {} by maker {} in {}.", i * 7 % 13, i * 3 % 11, 1900 + i);
            prose(&format!("doc{i}"), &text)
        })
        .collect();
    let ctx = Context { fields };
    let scd = hash_scd();
    let o200k = builtin("o200k").unwrap();
    let opts = CompressOptions { budget_tokenizer: Some(o200k.clone()), ..Default::default() };
    let count = |t: &str| o200k.count(t).unwrap();
    let mut spare = 0;
    for budget in [30, 45, 60, 80, 120, 160] {
        let out = scd.compress_opts(&req("where was item 7 made", ctx.clone(), budget), &opts, &Cancel::new()).unwrap();
        assert_eq!(out.totals.sent_tokens, count(&out.text));
        assert!(out.totals.sent_tokens <= budget);
        spare += budget - out.totals.sent_tokens;
        let headers: Vec<&str> = out.text.lines().filter(|l| l.starts_with('[')).collect();
        assert_eq!(headers.len(), out.chunks.len(), "{}", out.text);
        assert!(headers.iter().all(|h| h.starts_with("[doc") && !h.contains(':')), "{headers:?}");
        let sent: std::collections::HashSet<&str> = out.chunks.iter().map(|c| c.field.as_str()).collect();
        for f in ctx.fields.iter().filter(|f| !sent.contains(f.name.as_str())) {
            let with = format!("{}\n[{}]\n{}", out.text, f.name, f.content);
            assert!(count(&with) > budget, "budget {budget}: {} still fits beside\n{}", f.name, out.text);
        }
    }
    println!("tokens left unused over six budgets: {spare}");
}
