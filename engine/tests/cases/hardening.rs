//! Confidential handling, strict parsing, redaction, sessions and limits.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rand::{Rng, SeedableRng};
use scd_engine::context::{Context, Field, FieldKind};
use scd_engine::encoder::{EncodeOptions, Encoded, Encoder, HashEncoder};
use scd_engine::extract::{
    CompressRequest, ContextRequest, RequestLimits, Scd, ScdConfig, ScoringConfig, SessionConfig, SessionRequest,
};
use scd_engine::Error;

use super::extraction::req;

/// Records every text the engine asks it to embed or count (`seen`), and
/// the embedded ones alone (`embedded`).
struct Spy {
    inner: HashEncoder,
    seen: Mutex<Vec<String>>,
    embedded: Mutex<Vec<String>>,
}

impl Spy {
    fn new(inner: HashEncoder) -> Self {
        Self { inner, seen: Mutex::new(Vec::new()), embedded: Mutex::new(Vec::new()) }
    }
}

impl Encoder for Spy {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }
    fn count_tokens(&self, text: &str) -> scd_engine::Result<usize> {
        self.seen.lock().unwrap().push(text.to_string());
        self.inner.count_tokens(text)
    }
    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> scd_engine::Result<Encoded> {
        self.seen.lock().unwrap().extend(texts.iter().map(|t| t.to_string()));
        self.embedded.lock().unwrap().extend(texts.iter().map(|t| t.to_string()));
        self.inner.encode(texts, opts)
    }
    fn provider(&self) -> &str {
        "spy"
    }
}

#[test]
fn the_second_hop_query_is_cut_at_its_token_cap() {
    let long =
        format!("Zorblax is a film directed by Quentin Marlowe, {}.", "who wrote scripts about rivers ".repeat(40));
    let prose = |name: &str, content: &str| Field {
        name: name.into(),
        kind: FieldKind::Prose,
        content: content.into(),
        confidential: false,
    };
    let ctx =
        Context { fields: vec![prose("doc1", long.trim()), prose("doc2", "Quentin Marlowe was raised in Tulsa.")] };
    let task = "where was the director of Zorblax born";
    let hop_queries = |cap: usize| {
        let spy = Arc::new(Spy::new(HashEncoder::new(128, 4096)));
        // both chunks join the hop query, the long one among them
        let cfg = ScdConfig {
            scoring: ScoringConfig { second_hop_max_tokens: cap, second_hop_sources: 2, ..Default::default() },
            ..ScdConfig::default()
        };
        Scd::new(spy.clone(), cfg).compress(&req(task, ctx.clone(), 400)).unwrap();
        let hops: Vec<String> =
            spy.embedded.lock().unwrap().iter().filter(|t| t.starts_with(&format!("{task} "))).cloned().collect();
        hops
    };
    let words = |t: &str| t.split_whitespace().count();
    let whole = hop_queries(10_000);
    assert_eq!(whole.len(), 1, "{whole:?}");
    assert!(words(&whole[0]) > 200, "uncapped, the hop carries the whole best chunk: {:?}", whole[0]);
    let cut = hop_queries(20);
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert!((8..=20).contains(&words(&cut[0])), "{:?}", cut[0]);
    assert!(whole[0].starts_with(&cut[0]), "cut at a word boundary of the same query");
    // the task alone fills the cap: no hop at all
    assert!(hop_queries(7).is_empty());
}

const WORDS: [&str; 14] = [
    "agent", "budget", "error", "pool", "charge", "user", "table", "log", "retry", "timeout", "Paris", "river",
    "invoice", "cache",
];

fn random_field(rng: &mut rand::rngs::StdRng, name: String, confidential: bool) -> Field {
    let kinds = [FieldKind::Prose, FieldKind::Code, FieldKind::Log, FieldKind::Chat, FieldKind::Table];
    let lines: Vec<String> = (0..rng.random_range(1..8))
        .map(|_| {
            let s: Vec<&str> = (0..rng.random_range(2..12)).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect();
            format!("{}.", s.join(" "))
        })
        .collect();
    Field { name, kind: kinds[rng.random_range(0..kinds.len())], content: lines.join("\n"), confidential }
}

#[test]
fn a_confidential_field_changes_nothing_for_the_others() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for case in 0..40 {
        let n = rng.random_range(1..6);
        let fields: Vec<Field> = (0..n).map(|i| random_field(&mut rng, format!("f{i}"), false)).collect();
        let budget = rng.random_range(5..150);
        let task = "why did the charge retry time out";
        // a fresh engine per run, so no cache can make the runs agree
        let run = |fields: Vec<Field>| {
            let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), ScdConfig::default());
            scd.compress(&req(task, Context { fields }, budget)).unwrap()
        };
        let base = run(fields.clone());
        // add a confidential field somewhere, then change its content
        let at = rng.random_range(0..=fields.len());
        for variant in 0..2 {
            let mut with = fields.clone();
            let mut secret = random_field(&mut rng, "secret".into(), true);
            if variant == 1 {
                secret.content = format!("{} timeout charge retry pool SECRET-{case}", secret.content);
            }
            with.insert(at, secret);
            let out = run(with);
            assert_eq!(out.chunks, base.chunks, "case {case}: selection and scores");
            assert_eq!(out.dropped, base.dropped, "case {case}: stubs");
            assert_eq!(out.totals, base.totals, "case {case}");
            assert_eq!(out.withheld, vec!["secret".to_string()]);
        }
    }
}

#[test]
fn confidential_text_never_reaches_the_encoder() {
    let spy = Arc::new(Spy::new(HashEncoder::new(64, 512)));
    let scd = Scd::new(spy.clone(), ScdConfig::default());
    let ctx = Context {
        fields: vec![
            Field {
                name: "notes".into(),
                kind: FieldKind::Prose,
                content: "The pool timed out.".into(),
                confidential: false,
            },
            Field {
                name: "keys".into(),
                kind: FieldKind::Prose,
                content: "sk_live_XYZZY pool".into(),
                confidential: true,
            },
        ],
    };
    let g = scd
        .compress(&CompressRequest {
            session: Some(SessionRequest::default()),
            ..req("what is the pool key sk_live", ctx, 50)
        })
        .unwrap()
        .session
        .unwrap();
    scd.request_more(&ContextRequest {
        session_id: g.id,
        session_token: g.token,
        specific_question: "the key".into(),
        current_confidence: 0.1,
        ..Default::default()
    })
    .unwrap();
    let seen = spy.seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|t| !t.contains("sk_live_XYZZY")), "{seen:?}");
}

#[test]
fn context_json_is_strict() {
    let typo = r#"{"fields": [{"name": "k", "kind": "prose", "content": "secret", "confidental": true}]}"#;
    let err = Context::from_json(typo).unwrap_err().to_string();
    assert!(err.starts_with("context.fields[0].confidental: unknown field `confidental`"), "{err}");
    let string_bool = r#"{"fields": [{"name": "k", "content": "secret", "confidential": "true"}]}"#;
    let err = Context::from_json(string_bool).unwrap_err().to_string();
    assert!(
        err.starts_with("context.fields[0].confidential: invalid type: string \"true\", expected a boolean"),
        "{err}"
    );
    let top = r#"{"fields": [], "extra": 1}"#;
    assert!(Context::from_json(top).unwrap_err().to_string().starts_with("context.extra: unknown field `extra`"));
    let kind = r#"{"fields": [{"name": "k", "kind": "poem", "content": "x"}]}"#;
    assert!(Context::from_json(kind)
        .unwrap_err()
        .to_string()
        .starts_with("context.fields[0].kind: unknown variant `poem`"));
    let trailing = r#"{"fields": []} {"fields": []}"#;
    assert!(Context::from_json(trailing).unwrap_err().to_string().starts_with("context: trailing characters"));
    let ok = Context::from_json(r#"{"fields": [{"name": "k", "content": "x", "confidential": true}]}"#).unwrap();
    assert!(ok.fields[0].confidential && ok.fields[0].kind == FieldKind::Prose);
}

#[test]
fn debug_output_redacts_content() {
    let ctx =
        Context::from_json(r#"{"fields": [{"name": "keys", "content": "sk_live_SECRET_1", "confidential": true}]}"#)
            .unwrap();
    let mut r = req("the task text TASK_SECRET", ctx, 10);
    r.session = Some(SessionRequest { id: None, token: Some("TOKEN_SECRET".into()), ..Default::default() });
    let q = ContextRequest {
        session_id: "s".into(),
        session_token: "TOKEN_SECRET".into(),
        specific_question: "QUESTION_SECRET".into(),
        reasoning: "REASON_SECRET".into(),
        ..Default::default()
    };
    let logged = format!("{r:?} {r:#?} {q:?}");
    for secret in ["sk_live_SECRET_1", "TASK_SECRET", "TOKEN_SECRET", "QUESTION_SECRET", "REASON_SECRET"] {
        assert!(!logged.contains(secret), "{secret} in {logged}");
    }
    assert!(logged.contains("<16 bytes>") && logged.contains("keys"), "sizes and names stay: {logged}");
}

#[test]
fn concurrent_adaptive_requests_never_resend_a_chunk() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let fields: Vec<Field> = (0..12).map(|i| random_field(&mut rng, format!("f{i}"), false)).collect();
    let scd = Arc::new(Scd::new(Arc::new(HashEncoder::new(64, 512)), ScdConfig::default()));
    let mut first = req("charge timeout", Context { fields }, 2_000);
    first.session = Some(SessionRequest::default());
    // send only the clearly relevant chunks, so the session keeps budget
    first.requirement.min_relative_score = Some(1.5);
    let out = scd.compress(&first).unwrap();
    let g = out.session.clone().unwrap();
    let sent: Mutex<Vec<String>> = Mutex::new(out.chunks.iter().map(|c| c.id.clone()).collect());
    std::thread::scope(|s| {
        for t in 0..8 {
            let (scd, g, sent) = (scd.clone(), g.clone(), &sent);
            s.spawn(move || {
                for q in 0..6 {
                    let more = scd
                        .request_more(&ContextRequest {
                            session_id: g.id.clone(),
                            session_token: g.token.clone(),
                            specific_question: format!("{} {}", WORDS[(t + q) % WORDS.len()], WORDS[q]),
                            current_confidence: 0.2,
                            ..Default::default()
                        })
                        .unwrap();
                    sent.lock().unwrap().extend(more.chunks.into_iter().map(|c| c.id));
                }
            });
        }
    });
    let sent = sent.into_inner().unwrap();
    let unique: HashSet<&String> = sent.iter().collect();
    assert!(sent.len() > out.chunks.len(), "the requests sent something");
    assert_eq!(unique.len(), sent.len(), "a chunk was sent twice");
}

#[test]
fn sessions_are_bound_to_their_token_caller_and_context() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let ctx = Context { fields: (0..3).map(|i| random_field(&mut rng, format!("f{i}"), false)).collect() };
    let other = Context { fields: vec![random_field(&mut rng, "g".into(), false)] };
    let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), ScdConfig::default());
    let open = |id: Option<&str>, token: Option<&str>, caller: Option<&str>, ctx: &Context| {
        scd.compress(&CompressRequest {
            session: Some(SessionRequest {
                id: id.map(String::from),
                token: token.map(String::from),
                caller: caller.map(String::from),
                ..Default::default()
            }),
            ..req("charge retry", ctx.clone(), 20)
        })
    };
    let g = open(Some("shared-name"), None, Some("alice"), &ctx).unwrap().session.unwrap();
    // another client naming the same id cannot take it over or read it
    assert!(matches!(open(Some("shared-name"), None, Some("bob"), &ctx), Err(Error::SessionForbidden { .. })));
    assert!(matches!(
        open(Some("shared-name"), Some(&g.token), Some("bob"), &ctx),
        Err(Error::SessionForbidden { .. })
    ));
    let ask = |token: &str, caller: Option<&str>| {
        scd.request_more(&ContextRequest {
            session_id: g.id.clone(),
            session_token: token.into(),
            caller: caller.map(String::from),
            specific_question: "retry".into(),
            current_confidence: 0.1,
            ..Default::default()
        })
    };
    assert!(matches!(ask("0123", Some("alice")), Err(Error::SessionForbidden { .. })));
    assert!(matches!(ask(&g.token, Some("bob")), Err(Error::SessionForbidden { .. })));
    assert!(ask(&g.token, Some("alice")).is_ok());
    let many = scd.request_more(&ContextRequest {
        session_id: g.id.clone(),
        session_token: g.token.clone(),
        caller: Some("alice".into()),
        chunk_ids: vec!["f0#0".into(); 1025],
        current_confidence: 0.1,
        ..Default::default()
    });
    assert_eq!(many.unwrap_err().to_string(), "chunk_ids: 1025 ids, over the limit 1024");
    assert!(matches!(scd.close_session(&g.id, &g.token, Some("bob"), None), Err(Error::SessionForbidden { .. })));
    // the owner continues it on the same context, not on another
    assert!(open(Some("shared-name"), Some(&g.token), Some("alice"), &ctx).is_ok());
    let err = open(Some("shared-name"), Some(&g.token), Some("alice"), &other).unwrap_err();
    assert!(matches!(err, Error::SessionContextMismatch { .. }), "{err}");
    assert!(scd.close_session(&g.id, &g.token, Some("alice"), None).unwrap());
    // no id given: 128 random bits
    let a = open(None, None, None, &ctx).unwrap().session.unwrap();
    let b = open(None, None, None, &ctx).unwrap().session.unwrap();
    assert!(a.id != b.id && a.id.len() == 34);
}

#[test]
fn session_memory_is_bounded_and_eviction_is_reported() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let cfg =
        ScdConfig { sessions: SessionConfig { session_bytes: 64 << 10, ..Default::default() }, ..ScdConfig::default() };
    let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), cfg);
    let mut grants = Vec::new();
    for i in 0..40 {
        let ctx = Context { fields: (0..6).map(|j| random_field(&mut rng, format!("f{i}-{j}"), false)).collect() };
        let out = scd
            .compress(&CompressRequest { session: Some(SessionRequest::default()), ..req("charge", ctx, 30) })
            .unwrap();
        grants.push(out.session.unwrap());
    }
    let st = scd.session_stats();
    assert!(st.bytes <= 64 << 10, "{st:?}");
    assert!(st.evicted > 0 && st.live < 40, "{st:?}");
    let first = &grants[0];
    let err = scd
        .request_more(&ContextRequest {
            session_id: first.id.clone(),
            session_token: first.token.clone(),
            specific_question: "charge".into(),
            current_confidence: 0.1,
            ..Default::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("is gone: evicted to keep sessions under"), "{err}");
}

/// A context within its token limit whose embedding would cost more
/// encoder tokens than a request may spend (the prose neighbours and
/// labels about double it) is refused before the encoder runs, naming
/// the spend and the limit; the same context once cached costs nothing.
#[test]
fn a_context_whose_embedding_would_spend_too_many_encoder_tokens_is_refused_unrun() {
    let hash = HashEncoder::new(64, 512);
    let prose = (0..200).map(|i| format!("Sentence {i} says w{i} happened.")).collect::<Vec<_>>().join(" ");
    // one line of code longer than the encoder's window: two specials per window
    let code = format!("fn long() {{ let v = [{}]; }}", (0..700).map(|i| i.to_string()).collect::<Vec<_>>().join(", "));
    let field = Field { name: "notes".into(), kind: FieldKind::Prose, content: prose, confidential: false };
    let src = Field { name: "notes_src".into(), kind: FieldKind::Code, content: code, confidential: false };
    let ctx = Context { fields: vec![field, src] };
    let tokens: usize = ctx.fields.iter().map(|f| hash.count_tokens(&f.content).unwrap()).sum();
    let spent = |spy: &Spy| -> usize {
        let embedded = spy.embedded.lock().unwrap();
        let windows = |n: usize| n.div_ceil(510).max(1);
        embedded
            .iter()
            .filter(|t| t.starts_with("notes"))
            .map(|t| hash.count_tokens(t).unwrap())
            .map(|n| n + 2 * windows(n))
            .sum()
    };
    let spy = Arc::new(Spy::new(HashEncoder::new(64, 512)));
    Scd::new(spy.clone(), ScdConfig::default()).compress(&req("what happened", ctx.clone(), 50)).unwrap();
    let full = spent(&spy);
    assert!(full > tokens, "neighbours and labels cost {full} tokens for a {tokens}-token context");
    let long = spy
        .embedded
        .lock()
        .unwrap()
        .iter()
        .filter(|t| t.starts_with("notes_src"))
        .map(|t| hash.count_tokens(t).unwrap())
        .max();
    assert!(long.is_some_and(|n| n > 510), "no chunk spans two windows: {long:?}");
    let limit = full - full / 4;
    let spy = Arc::new(Spy::new(HashEncoder::new(64, 512)));
    let cfg = ScdConfig {
        limits: RequestLimits { max_context_tokens: tokens + 10, max_encoder_tokens: limit, ..Default::default() },
        ..ScdConfig::default()
    };
    let err = Scd::new(spy.clone(), cfg).compress(&req("what happened", ctx.clone(), 50)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("context: embedding its ")
            && msg.contains(&format!("would spend {full} encoder tokens"))
            && msg.ends_with(&format!("over the limit of {limit} per request")),
        "{msg}"
    );
    assert!(
        spy.embedded.lock().unwrap().iter().all(|t| !t.starts_with("notes")),
        "the encoder ran for a refused request"
    );
    // at the limit it runs
    let cfg =
        ScdConfig { limits: RequestLimits { max_encoder_tokens: full, ..Default::default() }, ..ScdConfig::default() };
    Scd::new(spy.clone(), cfg).compress(&req("what happened", ctx, 50)).unwrap();
    assert_eq!(spent(&spy), full);
}

#[test]
fn oversized_and_binary_input_is_refused_with_field_and_limit() {
    let scd = Scd::new(
        Arc::new(HashEncoder::new(64, 512)),
        ScdConfig {
            limits: RequestLimits {
                context_limits: scd_engine::context::ContextLimits {
                    max_fields: 3,
                    max_field_bytes: 100,
                    max_context_bytes: 150,
                },
                max_context_tokens: 40,
                max_constraints: 2,
                max_task_bytes: 200,
                max_task_tokens: 20,
                ..Default::default()
            },
            ..ScdConfig::default()
        },
    );
    let f =
        |name: &str, content: String| Field { name: name.into(), kind: FieldKind::Prose, content, confidential: false };
    let cases: Vec<(CompressRequest, &str)> = vec![
        (req("t", Context { fields: vec![f("a", "x".into()); 4] }, 10), "context.fields: 4 fields, over the limit 3"),
        (
            req("t", Context { fields: vec![f("a", "x".repeat(101))] }, 10),
            "context.fields[0].content: 101 bytes, over the limit 100",
        ),
        (
            req("t", Context { fields: vec![f("a", "x".repeat(90)), f("b", "y".repeat(90))] }, 10),
            "context: 180 bytes of content, over the limit 150",
        ),
        (
            req("t", Context { fields: vec![f("a", "ok\0no".into())] }, 10),
            "context.fields[0].content: contains a NUL byte at offset 2",
        ),
        (
            req("t", Context { fields: vec![f(&"n".repeat(257), "x".into())] }, 10),
            "context.fields[0].name: 257 bytes, over the limit 256",
        ),
        (
            req("t", Context { fields: vec![f("a", "w ".repeat(45))] }, 10),
            "context: 45 tokens of non-confidential content, over the limit 40",
        ),
        (
            req("t\0", Context { fields: vec![f("a", "x".into())] }, 10),
            "task.description: contains a NUL byte at offset 1",
        ),
        (req(&"w ".repeat(30), Context { fields: vec![f("a", "x".into())] }, 10), "task: 30 tokens, over the limit 20"),
        (req("t", Context { fields: vec![f("a", "x".into())] }, 0), "max_context_tokens: must be at least 1"),
        (
            req("t", Context { fields: vec![f("a", "x".into())] }, usize::MAX),
            "max_context_tokens: 18446744073709551615 is over the limit",
        ),
    ];
    for (r, want) in cases {
        let err = scd.compress(&r).unwrap_err().to_string();
        assert!(err.starts_with(want), "{err:?} does not start with {want:?}");
    }
    let mut r = req("t", Context { fields: vec![f("a", "x".into())] }, 10);
    r.task.constraints = vec!["a".into(); 3];
    assert_eq!(scd.compress(&r).unwrap_err().to_string(), "task.constraints: 3 constraints, over the limit 2");
}
