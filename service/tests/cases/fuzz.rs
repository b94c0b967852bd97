//! The fuzz target bodies (`scd_service::fuzz`) on seeded random and
//! adversarial inputs, so the invariants the fuzzer checks also run in
//! `cargo test`. No model needed.

use prost::Message;
use rand::{Rng, SeedableRng};
use scd_service::fuzz::{grpc_convert, grpc_convert_stage, jsonl, Stage, MAX_FIELDS};
use scd_service::grpc::pb;

fn bytes(rng: &mut impl Rng, max_len: usize) -> Vec<u8> {
    let n = rng.random_range(0..max_len);
    (0..n).map(|_| rng.random()).collect()
}

const WORDS: &[&str] = &[
    "Dr.",
    "Go.",
    "on",
    "ERROR",
    "  at x",
    "user:",
    "where?",
    "fn a() {",
    "}",
    "{\"k\": [1]}",
    "CREATE TABLE t (",
    ");",
    "\n",
    "\n\n",
    "# Head",
    "é",
    "日本",
    "\u{a0}",
    "\0",
    "",
];

fn text(rng: &mut impl Rng, max_words: usize) -> String {
    (0..rng.random_range(0..max_words)).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect::<Vec<_>>().join(" ")
}

/// A JSONL line of one of the shapes the readers meet, sometimes broken.
fn line(rng: &mut impl Rng) -> String {
    let t = text(rng, 8);
    let l = match rng.random_range(0..8) {
        0 => serde_json::json!({ "text": t }).to_string(),
        1 => serde_json::json!({ "text": rng.random::<u32>() }).to_string(),
        2 => serde_json::json!({
            "task": t,
            "context": {"fields": [{"name": "a", "kind": "log", "content": text(rng, 8)}]},
            "budget": rng.random_range(0..100),
        })
        .to_string(),
        3 => {
            serde_json::json!({ "task": t, "context": {"fields": [{"name": "a", "confidental": true}]}, "budget": -1 })
                .to_string()
        }
        4 => serde_json::json!([t]).to_string(),
        5 => format!("{{\"text\": \"{t}"),
        6 => "   ".into(),
        _ => t,
    };
    if rng.random_bool(0.1) {
        let cut = rng.random_range(0..=l.len());
        return String::from_utf8_lossy(&l.as_bytes()[..cut]).into_owned();
    }
    l
}

#[test]
fn jsonl_readers_hold_on_random_and_adversarial_inputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..2000 {
        let doc: Vec<String> = (0..rng.random_range(0..6)).map(|_| line(&mut rng)).collect();
        jsonl(doc.join("\n").as_bytes());
        jsonl(&bytes(&mut rng, 120));
    }
    let big = "Go on. ".repeat(150_000);
    jsonl(serde_json::json!({ "text": big, "task": big, "budget": 3 }).to_string().as_bytes());
    jsonl(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).as_bytes());
    jsonl(format!("{{\"text\": {}1{}}}", "{\"a\":".repeat(10_000), "}".repeat(10_000)).as_bytes());
    jsonl("{\"text\": \"a\"}\n".repeat(100_000).as_bytes());
    jsonl(b"{\"text\": \"a\\u0000b\"}\n\0\0\0\n{\"text\": \"\xff\xfe\"}\n");
    let batch = serde_json::json!({
        "task": "t",
        "context": {"fields": (0..100_000).map(|i| serde_json::json!({"name": format!("f{i}"), "content": "{}"})).collect::<Vec<_>>()},
        "budget": u64::MAX,
    });
    jsonl(batch.to_string().as_bytes());
}

/// A field; `valid` ones have unique names and a known kind.
fn field(rng: &mut impl Rng, i: usize, valid: bool) -> pb::Field {
    pb::Field {
        name: if valid { format!("f{i}") } else { ["f0", "f1", "", " "][rng.random_range(0..4)].into() },
        kind: if valid { rng.random_range(1..7) } else { rng.random_range(-1..8) },
        content: text(rng, 30),
        confidential: rng.random_bool(0.3),
    }
}

/// A request, well-formed more often than not (so the deep stages are
/// reached), otherwise with wrong kinds, names, numbers or parts missing.
fn compress_request(rng: &mut impl Rng) -> pb::CompressRequest {
    let valid = rng.random_bool(0.6);
    let n = rng.random_range(0..5);
    let names = |rng: &mut dyn rand::RngCore| -> Vec<String> {
        (0..rng.random_range(0..2)).map(|_| ["f0", "f1", "z"][rng.random_range(0..3)].to_string()).collect()
    };
    pb::CompressRequest {
        task: (valid || rng.random_bool(0.8)).then(|| pb::Task {
            description: if valid { "why ERROR at x".into() } else { text(rng, 6) },
            constraints: (0..rng.random_range(0..3)).map(|_| text(rng, 3)).collect(),
            output_schema: text(rng, 2),
        }),
        fields: (0..n).map(|i| field(rng, i, valid)).collect(),
        requirement: (valid || rng.random_bool(0.8)).then(|| pb::ContextRequirement {
            required_fields: if valid { vec![] } else { names(rng) },
            optional_fields: if valid { vec![] } else { names(rng) },
            max_context_tokens: if valid {
                rng.random_range(1..200)
            } else {
                [0, 1, 5, 1000, u32::MAX][rng.random_range(0..5)]
            },
            relevance_threshold: rng.random_bool(0.2).then(|| [-2.0, -1.0, 0.0, 0.5, f32::NAN][rng.random_range(0..5)]),
            min_relative_score: rng.random_bool(0.2).then(|| [-1.0, 0.0, f32::INFINITY][rng.random_range(0..3)]),
        }),
        session_id: ["", "s1"][rng.random_range(0..2)].into(),
        session_token: String::new(),
        render: 0,
        budget_tokenizer: ["", "o200k", "cl100k", "e5", "nope", "/etc/passwd"][rng.random_range(0..6)].into(),
        explain: rng.random_bool(0.3),
        session_max_total_tokens: [0, 0, 1, 50, u32::MAX][rng.random_range(0..5)],
        reserve_tokens: [0, 0, 0, 10, u32::MAX][rng.random_range(0..5)],
    }
}

fn with_tag(tag: u8, msg: &impl Message) -> Vec<u8> {
    let mut out = vec![tag];
    msg.encode(&mut out).unwrap();
    out
}

#[test]
fn grpc_convert_holds_on_random_and_adversarial_inputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut stages = std::collections::HashMap::new();
    for _ in 0..1500 {
        let mut data = with_tag(0, &compress_request(&mut rng));
        let stage = match grpc_convert_stage(&data) {
            Stage::Compressed(n) => Stage::Compressed(n.min(1)),
            s => s,
        };
        *stages.entry(stage).or_insert(0) += 1;
        // the same bytes flipped or cut short
        if !data.is_empty() {
            let i = rng.random_range(1..data.len().max(2));
            if i < data.len() {
                data[i] ^= 1 << rng.random_range(0..8);
            }
            grpc_convert(&data);
            grpc_convert(&data[..rng.random_range(0..=data.len())]);
        }
        let embed = pb::EmbedRequest {
            texts: (0..rng.random_range(0..4)).map(|_| text(&mut rng, 4)).collect(),
            kind: rng.random_range(-1..4),
            windows: rng.random_bool(0.5),
        };
        *stages.entry(grpc_convert_stage(&with_tag(1, &embed))).or_insert(0) += 1;
        grpc_convert(&bytes(&mut rng, 200));
    }
    // the generated requests reach every stage, and some send chunks
    for stage in [Stage::Rejected, Stage::Embed, Stage::Compressed(0), Stage::Compressed(1)] {
        assert!(stages.get(&stage).copied().unwrap_or(0) >= 20, "{stage:?} reached too rarely: {stages:?}");
    }
    // over the field limit, one huge field, many texts, 10k nested groups
    let many = pb::CompressRequest {
        fields: (0..=MAX_FIELDS).map(|i| pb::Field { name: format!("f{i}"), kind: 6, ..Default::default() }).collect(),
        ..compress_request(&mut rng)
    };
    assert_eq!(grpc_convert_stage(&with_tag(0, &many)), Stage::Rejected);
    let huge = pb::CompressRequest {
        fields: vec![pb::Field { name: "a".into(), kind: 6, content: "Go. ".repeat(1 << 18), confidential: false }],
        ..compress_request(&mut rng)
    };
    assert_eq!(grpc_convert_stage(&with_tag(0, &huge)), Stage::Chunked);
    let texts = pb::EmbedRequest { texts: vec!["x".into(); 100_000], kind: 1, windows: false };
    assert_eq!(grpc_convert_stage(&with_tag(1, &texts)), Stage::Rejected);
    let mut groups = vec![0u8];
    groups.extend(std::iter::repeat_n(0x7b, 10_000)); // field 15, start group
    assert_eq!(grpc_convert_stage(&groups), Stage::Undecoded);
}

/// A request the fuzzer's pipeline stage accepts: a confidential field is
/// never sent, the budget is kept, and the span is the text.
#[test]
fn grpc_convert_pipeline_keeps_budget_and_confidentiality() {
    let r = pb::CompressRequest {
        task: Some(pb::Task { description: "why did the payment time out".into(), ..Default::default() }),
        fields: vec![
            pb::Field {
                name: "logs".into(),
                kind: pb::FieldKind::Log as i32,
                content: "INFO ok\nERROR payment timeout\n  at pay".into(),
                confidential: false,
            },
            pb::Field {
                name: "keys".into(),
                kind: pb::FieldKind::Prose as i32,
                content: "The payment key is k. It timed out.".into(),
                confidential: true,
            },
        ],
        requirement: Some(pb::ContextRequirement { max_context_tokens: 6, ..Default::default() }),
        ..Default::default()
    };
    assert_eq!(grpc_convert_stage(&with_tag(0, &r)), Stage::Compressed(1));
}

/// The committed seed corpora (and any crash inputs kept beside them) pass
/// every body; the fixture request goes through the whole pipeline.
#[test]
fn seed_corpora_pass_their_bodies() {
    let seeds = crate::root().join("service/fuzz/seeds");
    type Body = fn(&[u8]);
    let bodies: [(&str, Body); 4] = [
        ("chunkers", scd_engine::fuzz::chunkers),
        ("context_json", scd_engine::fuzz::context_json),
        ("jsonl", jsonl),
        ("grpc_convert", grpc_convert),
    ];
    for (target, body) in bodies {
        let dir = seeds.join(target);
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).collect();
        assert!(files.len() >= 3, "{}: {} seeds", dir.display(), files.len());
        for f in files {
            body(&std::fs::read(f.unwrap().path()).unwrap());
        }
    }
    let fixture = std::fs::read(seeds.join("grpc_convert/compress_fixture")).unwrap();
    assert!(matches!(grpc_convert_stage(&fixture), Stage::Compressed(n) if n > 0));
    let unset = std::fs::read(seeds.join("grpc_convert/compress_unset_kind")).unwrap();
    assert_eq!(grpc_convert_stage(&unset), Stage::Rejected);
}
