//! The fuzz target bodies (`scd_engine::fuzz`) on seeded random and
//! adversarial inputs, so the invariants the fuzzer checks also run in
//! `cargo test`; and a linearity check of the chunkers on bad shapes.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use scd_engine::chunk::ChunkConfig;
use scd_engine::fuzz::{check_chunks, chunkers, context_json, handoff, KINDS};

/// Pieces that steer the chunkers into their branches.
const PIECES: &[&str] = &[
    ". ",
    ".",
    "!",
    "?",
    " ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "# ",
    "## Head",
    "Dr.",
    "e.g.",
    "A",
    "b",
    "7",
    "\"",
    "'",
    ")",
    "”",
    "“",
    "(",
    "。",
    "！",
    "\u{a0}",
    "\u{2003}",
    "é",
    "日本",
    "fn charge(",
    "pub async fn x",
    "def y",
    "class Z",
    "    ",
    "}",
    "{",
    "[",
    "]",
    ",",
    ":",
    "\\",
    "\"k\": ",
    "user: ",
    "agent:",
    "where?",
    "ERROR ",
    "panic",
    "  at ",
    "File \"",
    "Caused by",
    "...",
    "CREATE TABLE ",
    "if not exists",
    "users",
    "\0",
    "\u{feff}",
    "\u{200b}",
    "\u{1f600}",
];

fn structured(rng: &mut impl Rng, max_pieces: usize) -> Vec<u8> {
    let n = rng.random_range(0..max_pieces);
    let mut out = vec![rng.random::<u8>()];
    for _ in 0..n {
        out.extend_from_slice(PIECES[rng.random_range(0..PIECES.len())].as_bytes());
    }
    out
}

fn bytes(rng: &mut impl Rng, max_len: usize) -> Vec<u8> {
    let n = rng.random_range(0..max_len);
    (0..n).map(|_| rng.random()).collect()
}

#[test]
fn chunkers_keep_span_invariants_on_random_inputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..3000 {
        chunkers(&structured(&mut rng, 80));
        chunkers(&bytes(&mut rng, 200));
    }
}

/// Adversarial shapes of about `n` bytes: a long line, deep nesting, runs of `.` with
/// no spaces, NUL bytes, invalid UTF-8, a huge heading over many
/// sentences, many tiny lines.
fn shapes(n: usize) -> Vec<(&'static str, String)> {
    vec![
        ("one long line", "word ".repeat(n / 5)),
        ("dots without spaces", ".".repeat(n)),
        ("dot-letter without spaces", "a.".repeat(n / 2)),
        ("dot-space runs", ". ".repeat(n / 2)),
        ("sentences", "Go on. ".repeat(n / 7)),
        ("abbreviations", "Dr. e.g. A. ".repeat(n / 12)),
        ("nested arrays", "[".repeat(n / 2) + &"]".repeat(n / 2)),
        ("nested objects", "{\"a\":".repeat(n / 5)),
        ("wide object", format!("{{{}\"z\":0}}", (0..n / 12).map(|i| format!("\"k{i}\":[1],")).collect::<String>())),
        ("blank lines", "\n".repeat(n)),
        ("tiny lines", "x\n".repeat(n / 2)),
        ("frames", format!("ERROR x\n{}", "  at y\n".repeat(n / 7))),
        ("errors", "ERROR x\n".repeat(n / 8)),
        ("speakers", "user: where?\n".repeat(n / 13)),
        ("definitions", "fn a() {}\n".repeat(n / 10)),
        ("tables", "CREATE TABLE t (x int);\n".repeat(n / 24)),
        ("huge heading then sentences", format!("# {}\n{}", "h".repeat(n / 2), "Go. ".repeat(n / 8))),
        ("NUL bytes", "\0".repeat(n)),
        ("quotes after dots", ".\"".repeat(n / 2)),
        ("wide whitespace", "A.\u{2003}".repeat(n / 5)),
    ]
}

#[test]
fn chunkers_keep_span_invariants_on_adversarial_shapes() {
    let mut all = shapes(1 << 18);
    all.push(("megabyte line", "Go on".repeat(1 << 18)));
    for (name, text) in all {
        let t = Instant::now();
        for kind in KINDS {
            check_chunks(&text, kind, ChunkConfig::default());
        }
        eprintln!("{name}: {} bytes, six chunkers in {:?}", text.len(), t.elapsed());
    }
    let mut invalid = vec![0u8];
    invalid.extend(std::iter::repeat_n([0xff, b'.', 0xc3, b' ', 0xe6, 0x97, b'A'], 50_000).flatten());
    chunkers(&invalid);
}

/// Best of three timings of all six chunkers over `text`.
fn time(text: &str) -> Duration {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for kind in KINDS {
                check_chunks(text, kind, ChunkConfig::default());
            }
            t.elapsed()
        })
        .min()
        .unwrap()
}

/// Chunking 8x the bytes must take about 8x the time, not 64x: the
/// ratio must stay under 24 for every shape (linear ones measure 7-10).
/// A ratio over it is measured again, up to three times, so a busy
/// machine does not fail the test; a quadratic chunker fails every time
/// (the uncapped prose heading measured over 30).
#[test]
fn chunkers_are_near_linear_on_bad_shapes() {
    let n = 1 << 15;
    let (small, large) = (shapes(n), shapes(8 * n));
    for ((name, a), (_, b)) in small.iter().zip(&large) {
        let ratio = || {
            let (ta, tb) = (time(a), time(b));
            (tb.as_secs_f64() / ta.as_secs_f64().max(1e-4), ta, tb)
        };
        let (r, ta, tb) = (0..3).map(|_| ratio()).find(|r| r.0 < 24.0).unwrap_or_else(ratio);
        eprintln!("{name}: {} bytes {ta:?}, {} bytes {tb:?}, ratio {r:.1}", a.len(), b.len());
        assert!(r < 24.0, "{name}: {} bytes {ta:?}, {} bytes {tb:?}, ratio {r:.1}", a.len(), b.len());
    }
}

#[test]
fn context_json_holds_on_random_and_adversarial_inputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let kinds = ["prose", "code", "log", "json", "chat", "table", "Prose", ""];
    for _ in 0..2000 {
        let fields: Vec<String> = (0..rng.random_range(0..5))
            .map(|i| {
                let content = String::from_utf8_lossy(&structured(&mut rng, 30)).into_owned();
                let mut f = serde_json::json!({"name": format!("f{}", i % 3), "content": content});
                if rng.random_bool(0.8) {
                    f["kind"] = kinds[rng.random_range(0..kinds.len())].into();
                }
                if rng.random_bool(0.3) {
                    f["confidential"] = rng.random_bool(0.5).into();
                }
                if rng.random_bool(0.05) {
                    f["confidental"] = true.into();
                }
                f.to_string()
            })
            .collect();
        let doc = format!("{{\"fields\": [{}]}}", fields.join(","));
        context_json(doc.as_bytes());
        // cut short or flipped, the same text must still not panic
        let cut = rng.random_range(0..=doc.len());
        context_json(&doc.as_bytes()[..cut]);
        context_json(&bytes(&mut rng, 100));
    }
    let deep = format!("{{\"fields\": {}{}}}", "[".repeat(10_000), "]".repeat(10_000));
    context_json(deep.as_bytes());
    let tiny: Vec<String> =
        (0..100_000).map(|i| format!("{{\"name\":\"f{i}\",\"kind\":\"json\",\"content\":\"{{}}\"}}")).collect();
    context_json(format!("{{\"fields\": [{}]}}", tiny.join(",")).as_bytes());
    let big = format!("{{\"fields\": [{{\"name\": \"a\", \"content\": \"{}\"}}]}}", "Go. ".repeat(1 << 18));
    context_json(big.as_bytes());
    context_json(b"{\"fields\": [{\"name\": \"a\", \"content\": \"x\\u0000y\"}]}");
    context_json(b"{\"fields\": [{\"name\": \"a\", \"content\": \"\xff\"}]}");
}

/// Pieces that steer the hand-off parsers into their branches.
const HANDOFF_PIECES: &[&str] = &[
    "[STATUS]\n",
    "[SUMMARY]\n",
    "[EVIDENCE_OR_TESTS]\n",
    "[CONFIDENCE]\n",
    "[NEXT]\n",
    "[ANSWER_CANDIDATE]\n",
    "[PAYLOAD]\n",
    "[TESTS]\n",
    "[X] y\n",
    "[",
    "]",
    "completed",
    "in_progress",
    "high, ",
    "low",
    "Medium.",
    "JSON_REPORT:\n",
    "END_JSON_REPORT\n",
    "{\"status\": \"completed\", \"summary\": \"s\", \"confidence\": \"high\", \"next\": \"n\", ",
    "\"payload\": {",
    "\"payload\": [",
    "\"answer_candidate\": \"a\"",
    "\"evidence\": 1",
    "}",
    "{",
    "\"",
    ",",
    ":",
    "null",
    "\n",
    "\r\n",
    " ",
    "\t",
    "Answer:",
    "Answer: x\n",
    "\nAnswer: ",
    "é",
    "\u{1f600}",
    "\u{a0}",
    "\0",
    "\\",
];

/// The seed page's three reports (`fixtures/handoff/`).
const SEED_REPORTS: [&str; 3] = [
    include_str!("../../../fixtures/handoff/freeform.txt"),
    include_str!("../../../fixtures/handoff/semi_structured.txt"),
    include_str!("../../../fixtures/handoff/structured_soft.txt"),
];

#[test]
fn handoff_holds_on_random_inputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut parsed = [0usize; 3];
    for _ in 0..4000 {
        let n = rng.random_range(0..40);
        let mut data = vec![rng.random_range(0..4u8)];
        let pieces = (0..n).map(|_| HANDOFF_PIECES[rng.random_range(0..HANDOFF_PIECES.len())]).collect::<Vec<_>>();
        if rng.random_bool(0.5) {
            // a valid report with a few pieces put in at line starts
            let seed = [SEED_REPORTS[0], SEED_REPORTS[1], SEED_REPORTS[2]][rng.random_range(0..3)];
            let mut lines: Vec<&str> = seed.split_inclusive('\n').collect();
            for piece in pieces.iter().take(rng.random_range(0..3)) {
                lines.insert(rng.random_range(0..=lines.len()), piece);
            }
            data.extend_from_slice(lines.concat().as_bytes());
        } else {
            data.extend_from_slice(pieces.concat().as_bytes());
        }
        let p = handoff(&data);
        if p.parsed {
            parsed[(p.format as usize).min(2)] += 1;
        }
        let cut = rng.random_range(0..=data.len());
        handoff(&data[..cut]);
        handoff(&bytes(&mut rng, 200));
    }
    // the pieces reach every parser's success branch, not just degradation
    assert!(parsed.iter().all(|&n| n > 0), "parsed per format: {parsed:?}");
}

/// Adversarial hand-offs complete, and every body check holds on them
/// (render size linear in the input among them).
#[test]
fn handoff_holds_on_adversarial_inputs() {
    let n = 100_000;
    let structured = |inner: &str| format!("JSON_REPORT:\n{inner}\nEND_JSON_REPORT\nAnswer: x\n");
    let cases: Vec<(&str, String)> = vec![
        ("megabyte line", "a".repeat(1 << 20)),
        ("megabyte line of brackets", "[".repeat(1 << 20)),
        ("megabyte tag-like line", format!("[{}]", "A".repeat(1 << 20))),
        ("megabyte answer", format!("body\nAnswer: {}", "z".repeat(1 << 20))),
        ("nested braces", structured(&"{".repeat(n))),
        ("nested arrays in the payload", structured(&format!("{{\"payload\": {}", "[".repeat(n)))),
        ("closed nesting", structured(&("{\"a\":".repeat(n) + "1" + &"}".repeat(n)))),
        ("many standard tags", "[STATUS]\n".repeat(n)),
        ("many distinct tags", (0..n).map(|i| format!("[T{i}]\nx\n")).collect()),
        (
            "many tags after a full report",
            format!(
                "[STATUS]\ncompleted\n[SUMMARY]\n[EVIDENCE_OR_TESTS]\n[CONFIDENCE]\nlow\n[NEXT]\n[ANSWER_CANDIDATE]\n{}",
                (0..n).map(|i| format!("[T{i}]\nx\n")).collect::<String>()
            ),
        ),
        ("deep [PAYLOAD]", format!("[PAYLOAD]\n{}", "[".repeat(n))),
        ("many markers", "JSON_REPORT:\n".repeat(n)),
        ("many markers and ends", "JSON_REPORT:\nEND_JSON_REPORT\n".repeat(n)),
        ("many answer lines", "Answer: x\n".repeat(n)),
        ("many escaped-looking lines", " [A]\n".repeat(n)),
        ("control characters", "\u{1}".repeat(1 << 18)),
    ];
    for (name, text) in cases {
        for format in 0..4u8 {
            let mut data = vec![format];
            data.extend_from_slice(text.as_bytes());
            let p = handoff(&data);
            eprintln!("{name} as {format}: parsed {} {:?}", p.parsed, p.why_not.map(|w| w.to_string()));
        }
    }
}

// Findings of the fuzzing work, each failing before its fix: trailing
// characters (Deserializer::end), identical chunks (one entry per distinct
// embedding), long field names (capped at 256 bytes).

/// Found by the `context_json` fuzz target in 3 s (minimized input in
/// `service/fuzz/seeds/context_json/trailing-characters`).
#[test]
fn context_json_rejects_trailing_characters() {
    assert!(scd_engine::context::Context::from_json("{\"fields\":[]}x").is_err());
    context_json(b"{\"fields\":[]}x");
}

/// Best-of-two wall time of `Scd::compress` (hash encoder) on one
/// field; None when the request is refused as invalid.
fn compress_time(name: &str, kind: scd_engine::context::FieldKind, content: String) -> Option<Duration> {
    use scd_engine::context::{Context, ContextRequirement, Field, Task};
    use scd_engine::encoder::HashEncoder;
    use scd_engine::extract::{CompressRequest, Scd, ScdConfig};
    let req = CompressRequest {
        task: Task::new("why did it fail"),
        context: Context { fields: vec![Field { name: name.into(), kind, content, confidential: false }] },
        requirement: ContextRequirement::with_budget(100),
        session: None,
    };
    // the best of five: a loaded machine (a whole suite beside it) slows
    // single runs, not the best one
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let scd = Scd::new(std::sync::Arc::new(HashEncoder::new(384, 512)), ScdConfig::default());
        let t = Instant::now();
        match scd.compress(&req) {
            Ok(_) => best = best.min(t.elapsed()),
            Err(scd_engine::Error::InvalidArgument { .. }) => return None,
            Err(e) => panic!("{e}"),
        }
    }
    Some(best)
}

/// Identical log lines: 4x the lines must take under 8x the time.
/// Measured in release: 2,500 / 5,000 / 10,000 lines took 0.7 / 3.4 /
/// 14.1 s (110 KB of input, 500 MB peak): every chunk is a near
/// duplicate of every other, and `near_duplicates` keeps all n² pairs.
#[test]
fn compress_is_near_linear_in_repeated_lines() {
    let t = |n| compress_time("logs", scd_engine::context::FieldKind::Log, "ERROR same\n".repeat(n));
    let (a, b) = (t(1000).unwrap(), t(4000).unwrap());
    assert!(b.as_secs_f64() < 8.0 * a.as_secs_f64(), "1000 lines {a:?}, 4000 lines {b:?}");
}

/// A long field name once made compress quadratic: the name is copied
/// into every chunk's id and embedded text, so name bytes × chunks grew
/// with the request (measured in release with 4,000 chunks: a 1 KB name
/// took 4.6 s, an 8 KB name 14.7 s). The fix is a limit on name length.
/// Checked without timing: one byte over the limit is refused, naming the
/// field and the limit, and the longest name allowed adds at most its own
/// bytes once to each text the encoder sees.
#[test]
fn a_long_field_name_is_refused_and_costs_at_most_its_bytes_per_chunk() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task, MAX_FIELD_NAME_BYTES};
    use scd_engine::encoder::{EncodeOptions, Encoded, Encoder, HashEncoder};
    use scd_engine::extract::{CompressRequest, Scd, ScdConfig};

    /// Counts the texts and bytes given to `encode`.
    struct Counting(HashEncoder, AtomicUsize, AtomicUsize);
    impl Encoder for Counting {
        fn model_id(&self) -> &str {
            self.0.model_id()
        }
        fn dim(&self) -> usize {
            self.0.dim()
        }
        fn max_tokens(&self) -> usize {
            self.0.max_tokens()
        }
        fn count_tokens(&self, text: &str) -> scd_engine::Result<usize> {
            self.0.count_tokens(text)
        }
        fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> scd_engine::Result<Encoded> {
            self.1.fetch_add(texts.len(), Ordering::Relaxed);
            self.2.fetch_add(texts.iter().map(|t| t.len()).sum(), Ordering::Relaxed);
            self.0.encode(texts, opts)
        }
        fn provider(&self) -> &str {
            "counting"
        }
    }
    let content: String = (0..1000).map(|i| format!("ERROR e{i} in the payment worker\n")).collect();
    let run = |name: &str| {
        let enc = Arc::new(Counting(HashEncoder::new(384, 512), AtomicUsize::new(0), AtomicUsize::new(0)));
        let scd = Scd::new(enc.clone(), ScdConfig::default());
        let field = Field { name: name.into(), kind: FieldKind::Log, content: content.clone(), confidential: false };
        let req = CompressRequest {
            task: Task::new("why did the payment worker fail"),
            context: Context { fields: vec![field] },
            requirement: ContextRequirement::with_budget(100),
            session: None,
        };
        scd.compress(&req).map(|_| (enc.1.load(Ordering::Relaxed), enc.2.load(Ordering::Relaxed)))
    };
    let err = run(&"n".repeat(MAX_FIELD_NAME_BYTES + 1)).unwrap_err().to_string();
    assert!(err.starts_with("context.fields[0].name:") && err.contains(&MAX_FIELD_NAME_BYTES.to_string()), "{err}");
    let (texts, short) = run("n").unwrap();
    let (texts_long, long) = run(&"n".repeat(MAX_FIELD_NAME_BYTES)).unwrap();
    assert!(texts > 100, "{texts} texts embedded: too few to see a per-chunk cost");
    assert_eq!(texts, texts_long, "the name changed what was embedded");
    assert!(long > short, "the name is not in the embedded text at all: {long} vs {short} bytes");
    let per_text = (long - short) as f64 / texts as f64;
    assert!(
        per_text <= (MAX_FIELD_NAME_BYTES - 1) as f64,
        "{per_text:.0} extra bytes per text for a 255-byte longer name"
    );
}
