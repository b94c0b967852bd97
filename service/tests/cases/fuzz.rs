//! The fuzz target bodies (`scd_service::fuzz`) on seeded random and
//! adversarial inputs, so the invariants the fuzzer checks also run in
//! `cargo test`. No model needed.

use prost::Message;
use rand::{Rng, SeedableRng};
use scd_service::fuzz::{grpc_convert, grpc_convert_stage, jsonl, tool_input, tool_input_rejection, Stage, MAX_FIELDS};
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
        rate: rng.random_bool(0.15).then(|| [0.0, 0.3, 1.0, 1.5, f64::NAN][rng.random_range(0..5)]),
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
    // (a request that passes the wire checks, whatever the generator drew)
    let huge = pb::CompressRequest {
        task: Some(pb::Task { description: "why".into(), ..Default::default() }),
        fields: vec![pb::Field { name: "a".into(), kind: 6, content: "Go. ".repeat(1 << 18), confidential: false }],
        requirement: Some(pb::ContextRequirement { max_context_tokens: 50, ..Default::default() }),
        ..Default::default()
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
    let bodies: [(&str, Body); 5] = [
        ("chunkers", scd_engine::fuzz::chunkers),
        ("context_json", scd_engine::fuzz::context_json),
        ("jsonl", jsonl),
        ("grpc_convert", grpc_convert),
        ("tool_input", tool_input),
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
    // the tool-call seeds: the well-formed ones pass, every other is refused
    for f in std::fs::read_dir(seeds.join("tool_input")).unwrap() {
        let path = f.unwrap().path();
        let rejection = tool_input_rejection(&std::fs::read(&path).unwrap());
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(rejection.is_none(), name.ends_with("_ok"), "{name}: {rejection:?}");
    }
}

/// A secret as a careless client puts it where a name or a kind belongs.
const SECRET: &str = "The production payment gateway key is sk_live_51Hx9";

/// A well-formed tool call: MCP `compress_context` arguments (`a2a`
/// false) or A2A `SendMessage` params.
fn tool_call(rng: &mut impl Rng, a2a: bool) -> serde_json::Value {
    let fields: Vec<serde_json::Value> = (0..rng.random_range(1..4))
        .map(|i| {
            let kind = ["prose", "code", "log", "json", "chat", "markdown"][rng.random_range(0..6)];
            serde_json::json!({"name": format!("f{i}"), "kind": kind, "content": SECRET, "confidential": i == 0})
        })
        .collect();
    let args =
        serde_json::json!({"task": text(rng, 5), "context": {"fields": fields}, "budget": rng.random_range(1..500)});
    if !a2a {
        return args;
    }
    let mut m = serde_json::json!({"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": args}]});
    if rng.random_bool(0.3) {
        m["contextId"] = serde_json::json!("ctx-1");
    }
    serde_json::json!({"message": m})
}

/// Every place in `v` (a JSON pointer), the root first.
fn places(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        serde_json::Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| places(x, format!("{at}/{i}"), out)),
        serde_json::Value::Object(o) => o.iter().for_each(|(k, x)| places(x, format!("{at}/{k}"), out)),
        _ => {}
    }
}

/// The mistakes the probe made: a node replaced by the secret, by itself
/// as a JSON string (a context sent as a string), by a number or an array
/// holding the secret, or a huge id.
fn mistake(rng: &mut impl Rng, v: &mut serde_json::Value) {
    let mut at = Vec::new();
    places(v, String::new(), &mut at);
    let p = at[rng.random_range(1..at.len())].clone();
    let node = v.pointer_mut(&p).unwrap();
    *node = match rng.random_range(0..5) {
        0 => serde_json::json!(SECRET),
        1 => serde_json::json!(node.to_string()),
        2 => serde_json::json!([SECRET]),
        3 => serde_json::json!({SECRET: SECRET}),
        _ => serde_json::json!("x".repeat(rng.random_range(257..200_000))),
    };
}

/// The finding: a context sent as a JSON string, content in an enum field
/// (`kind`, `role`, `render`), a huge contextId. The errors of MCP's
/// `compress_context` and A2A's `SendMessage` name the path and the limit
/// and never quote the content.
#[test]
fn tool_call_errors_name_the_path_and_never_quote_the_content() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(22);
    let mut refused = [0usize; 2];
    for i in 0..3000 {
        let a2a = i % 2 == 1;
        let mut v = tool_call(&mut rng, a2a);
        for _ in 0..rng.random_range(1..3) {
            mistake(&mut rng, &mut v);
        }
        let data = [vec![u8::from(a2a)], serde_json::to_vec(&v).unwrap()].concat();
        tool_input(&data);
        refused[usize::from(a2a)] += usize::from(tool_input_rejection(&data).is_some());
    }
    // the mistakes reach the checks: most calls are refused on each surface
    assert!(refused.iter().all(|&n| n > 1000), "refused {refused:?} of 1500 each");
    let fields =
        serde_json::json!({"fields": [{"name": "key", "kind": "prose", "content": SECRET, "confidential": true}]});
    let cases = [
        (0, serde_json::json!({"task": "t", "context": fields.to_string(), "budget": 9}), "context: "),
        (
            0,
            serde_json::json!({"task": "t", "context": {"fields": [{"name": "k", "kind": SECRET, "content": "x"}]}, "budget": 9}),
            "context.fields[0].kind: unknown variant",
        ),
        (
            1,
            serde_json::json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {"task": "t", "context": fields.to_string(), "budget": 9}}]}}),
            "invalid params: message.parts[0].data.context: ",
        ),
        (
            1,
            serde_json::json!({"message": {"messageId": "m", "role": SECRET, "parts": [{"text": "more"}]}}),
            "invalid params: params.message.role: unknown variant",
        ),
        (
            1,
            serde_json::json!({"message": {"messageId": "m", "contextId": "c".repeat(1 << 20), "role": "ROLE_USER", "parts": [{"text": "more"}]}}),
            "invalid params: message.contextId: 1048576 bytes, the limit is 256",
        ),
        (
            1,
            serde_json::json!({"tenant": SECRET, "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "more"}]}}),
            "invalid params: tenant: ",
        ),
    ];
    for (which, v, starts) in cases {
        let data = [vec![which], serde_json::to_vec(&v).unwrap()].concat();
        let e = tool_input_rejection(&data).unwrap_or_else(|| panic!("accepted: {starts}"));
        assert!(e.starts_with(starts), "{e}");
        assert!(!e.contains("sk_live") && !e.contains("ccccccccc") && e.len() < 1024, "{e}");
        tool_input(&data);
    }
}
