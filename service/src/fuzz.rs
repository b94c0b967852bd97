//! Fuzz target bodies of the service's parsers, shared by the cargo-fuzz
//! driver (`service/fuzz`) and the seeded tests (`tests/cases/fuzz.rs`).
//!
//! Each body takes arbitrary bytes and checks its invariants with `assert!`:
//! a panic is a finding. Not part of the API.
//!
//! ```
//! scd_service::fuzz::jsonl(b"{\"text\": \"a\"}\n{\"task\": \"t\", \"context\": {\"fields\": []}, \"budget\": 5}\n");
//! scd_service::fuzz::grpc_convert(b"\x01\x0a\x01a\x10\x01");
//! ```

use std::sync::Arc;

use prost::Message;
use scd_engine::chunk::ChunkConfig;
use scd_engine::context::ContextLimits;
use scd_engine::encoder::{HashEncoder, InputKind};
use scd_engine::extract::{PrepareConfig, Scd, ScdConfig};
use tonic::Code;

use crate::grpc::{convert, pb};
use crate::input::{jsonl_text, parse_batch_line, parse_jsonl_texts, BatchDefaults};

/// Fields a fuzzed compress request may hold (the server's limit is a flag).
pub const MAX_FIELDS: usize = 256;
/// Texts a fuzzed embed request may hold.
pub const MAX_TEXTS: usize = 64;
/// Contents up to this many bytes in all also go through the whole engine
/// pipeline (with the hash encoder); larger ones stop after the checks.
pub const PIPELINE_BYTES: usize = 16 << 10;

/// The CLI's JSONL readers: `--jsonl`/`--queries` texts (`parse_jsonl_texts`),
/// `embed --input` lines (`jsonl_text`) and `compress --batch` lines
/// (`parse_batch_line`), each line of the input through each parser. Errors
/// must name the option and the line.
pub fn jsonl(data: &[u8]) {
    let raw = String::from_utf8_lossy(data);
    match parse_jsonl_texts(&raw, "--jsonl") {
        Ok(texts) => assert_eq!(texts.len(), raw.lines().filter(|l| !l.trim().is_empty()).count()),
        Err(e) => assert!(e.to_string().starts_with("--jsonl"), "error does not name the option: {e}"),
    }
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        match jsonl_text(n, line) {
            Ok((text, v)) => assert_eq!(v["text"].as_str(), Some(text.as_str())),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with(&format!("--input line {n}: ")), "error does not name the line: {msg}");
            }
        }
        // the line number goes into the {"line", "error"} object beside the message
        match parse_batch_line(line, &BatchDefaults::default()) {
            Ok(req) => {
                let v: serde_json::Value = serde_json::from_str(line).expect("parsed once already");
                assert_eq!(v["task"].as_str(), Some(req.task.description.as_str()));
                assert_eq!(v["budget"].as_u64(), Some(req.requirement.max_context_tokens as u64));
                let known = ["task", "context", "budget", "required", "optional", "threshold", "min_relative_score"];
                assert!(v.as_object().is_some_and(|o| o.keys().all(|k| known.contains(&k.as_str()))), "strict keys");
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

/// The gRPC request conversion: the first byte picks the message (even:
/// `CompressRequest`, odd: `EmbedRequest`), the rest is decoded with prost
/// and converted as the server does. A rejection must be INVALID_ARGUMENT;
/// an accepted compress request goes on through the engine's checks, the
/// chunkers and (when small) the whole pipeline with the hash encoder,
/// whose answer must respect the budget, the spans and confidentiality.
pub fn grpc_convert(data: &[u8]) {
    grpc_convert_stage(data);
}

/// How far a [`grpc_convert`] input got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Not a message.
    Undecoded,
    /// Refused by the conversion, the limits or the engine (INVALID_ARGUMENT).
    Rejected,
    /// An embed request accepted.
    Embed,
    /// Converted and chunked, too large for the pipeline stage.
    Chunked,
    /// Compressed by the whole pipeline; this many chunks sent.
    Compressed(usize),
}

/// [`grpc_convert`], saying how far the input got (for tests that check
/// their inputs reach the deep stages).
pub fn grpc_convert_stage(data: &[u8]) -> Stage {
    let Some((&which, rest)) = data.split_first() else { return Stage::Undecoded };
    if which % 2 == 1 {
        let Ok(r) = pb::EmbedRequest::decode(rest) else { return Stage::Undecoded };
        let kind = r.kind;
        match convert::embed_request(r.clone(), MAX_TEXTS, 1 << 20) {
            Ok((texts, opts)) => {
                assert!(!texts.is_empty() && texts.len() <= MAX_TEXTS && texts == r.texts);
                assert!(texts.iter().all(|t| !t.trim().is_empty()));
                let want = if kind == pb::InputKind::Query as i32 { InputKind::Query } else { InputKind::Passage };
                assert_eq!(opts.kind, want, "input kind {kind} mapped wrongly");
            }
            Err(s) => {
                assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
                return Stage::Rejected;
            }
        }
        return Stage::Embed;
    }
    let Ok(mut r) = pb::CompressRequest::decode(rest) else { return Stage::Undecoded };
    let n_fields = r.fields.len();
    let checked = convert::rate(&mut r).and_then(|rate| Ok((rate, convert::compress_request(r, MAX_FIELDS, None)?)));
    let (rate, mut req) = match checked {
        Ok(checked) => checked,
        Err(s) => {
            assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
            return Stage::Rejected;
        }
    };
    assert_eq!(req.context.fields.len(), n_fields);
    let ctx = &req.context;
    if ctx.validate_within(&ContextLimits::default()).is_err() {
        return Stage::Rejected;
    }
    for f in &ctx.fields {
        scd_engine::fuzz::check_chunks(&f.content, f.kind, ChunkConfig::default());
    }
    let total: usize = ctx.fields.iter().map(|f| f.content.len() + f.name.len()).sum();
    if total > PIPELINE_BYTES {
        return Stage::Chunked;
    }
    let scd = Scd::new(
        Arc::new(HashEncoder::new(32, 128)),
        ScdConfig {
            prepare: PrepareConfig { cache_bytes: 1 << 20, prepared_cache_bytes: 0, ..Default::default() },
            ..ScdConfig::default()
        },
    );
    // as the server does: a rate's budget is that share of the context, at least 1
    if let Some(rate) = rate {
        req.requirement.max_context_tokens = scd.rate_budget(&req.context, None, rate).expect("hash tokens");
    }
    let out = match scd.compress(&req) {
        Ok(out) => out,
        Err(e) => {
            let s = convert::status(e);
            assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
            return Stage::Rejected;
        }
    };
    let budget = req.requirement.max_context_tokens;
    assert!(out.totals.sent_tokens <= budget, "sent {} tokens over the budget {budget}", out.totals.sent_tokens);
    // the pasted text is counted whole: the chunks and their header lines
    assert_eq!(scd.encoder().count_tokens(&out.text).expect("hash tokens"), out.totals.sent_tokens);
    assert!(out.chunks.iter().map(|c| c.tokens).sum::<usize>() <= out.totals.sent_tokens);
    for c in &out.chunks {
        let f = ctx.fields.iter().find(|f| f.name == c.field).expect("a chunk names its field");
        assert!(!f.confidential, "chunk {} of confidential field {:?} sent", c.id, f.name);
        assert_eq!(f.content.get(c.span.0..c.span.1), Some(c.text.as_str()), "chunk {} text is not its span", c.id);
    }
    for d in &out.dropped {
        let f = ctx.fields.iter().find(|f| f.name == d.field).expect("a dropped chunk names its field");
        assert!(!f.confidential, "dropped chunk {} of confidential field {:?} listed", d.id, f.name);
    }
    Stage::Compressed(out.chunks.len())
}

/// Input strings at least this long must not appear in an error (shorter
/// ones meet the error's own words by chance).
pub const MIN_QUOTED_BYTES: usize = 8;
/// The longest error a tool call may get back: a huge id, key or value is
/// never echoed.
pub const MAX_TOOL_ERROR_BYTES: usize = 1024;

/// The network surfaces' parsers of a tool call, before any work: first
/// byte even: MCP `compress_context` arguments
/// ([`crate::mcp::compress_arguments`]), odd: the params of A2A's
/// `SendMessage` (parsed, the tenant checked, the message classified as
/// the agent does); the rest is JSON. Each rejection names where it is
/// (`context`, `params.message`, `message.contextId`, …), stays within
/// [`MAX_TOOL_ERROR_BYTES`], and quotes no string value of the input: a
/// context sent as a string, content put in an enum field or a huge id
/// comes back as the path, the expected type and the limit.
pub fn tool_input(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else { return };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(rest) else { return };
    let Some(err) = tool_input_error(which, v.clone()) else { return };
    check_tool_error(which, &v, &err);
}

/// [`tool_input`]'s parser on `data`: the error it gives, if any (`None`
/// also when `data` is not JSON).
pub fn tool_input_rejection(data: &[u8]) -> Option<String> {
    let (&which, rest) = data.split_first()?;
    tool_input_error(which, serde_json::from_slice(rest).ok()?)
}

fn check_tool_error(which: u8, v: &serde_json::Value, err: &str) {
    assert!(err.len() <= MAX_TOOL_ERROR_BYTES, "a {}-byte error: {}", err.len(), &err[..err.floor_char_boundary(200)]);
    assert!(names_a_place(which, err), "the error does not say where: {err}");
    let mut strings = Vec::new();
    collect_strings(v, &mut strings);
    for s in strings.iter().filter(|s| s.len() >= MIN_QUOTED_BYTES) {
        if err.contains(s.as_str()) {
            // the error's own words, not an echo: it says them without s too
            let masked = replace_strings(v, s, &"\u{1}".repeat(s.chars().count()));
            let again = tool_input_error(which, masked).unwrap_or_default();
            assert!(again.contains(s.as_str()), "the error quotes an input value: {err}");
        }
    }
}

/// Whether an error starts by naming where it is: `arguments` or an
/// argument of `compress_context` (MCP), `params`, `message`, `tenant` or
/// `configuration` after the JSON-RPC error's kind (A2A).
fn names_a_place(which: u8, err: &str) -> bool {
    let roots: &[&str] = if which.is_multiple_of(2) {
        &[
            "arguments",
            "task",
            "context",
            "budget",
            "required",
            "optional",
            "session",
            "threshold",
            "min_relative_score",
            "render",
            "budget_tokenizer",
            "explain",
            "reserve",
            "list_dropped",
        ]
    } else {
        &["params", "message", "tenant", "configuration"]
    };
    let rest =
        ["invalid params: ", "content type not supported: "].iter().find_map(|k| err.strip_prefix(k)).unwrap_or(err);
    let name = rest.split([':', '.', '[', ' ']).next().unwrap_or("");
    roots.contains(&name) || err.starts_with("push notifications are not supported")
}

/// The error [`tool_input`]'s parser gives `v`, if any.
fn tool_input_error(which: u8, v: serde_json::Value) -> Option<String> {
    if which.is_multiple_of(2) {
        let args: crate::mcp::Args<crate::mcp::CompressContextArgs> = match serde_json::from_value(v) {
            Ok(a) => a,
            // rmcp refuses arguments that are not an object before the tool runs
            Err(_) => return None,
        };
        return crate::mcp::compress_arguments(args).err();
    }
    let req: crate::a2a::types::SendMessageRequest = match crate::a2a::jsonrpc::params(v) {
        Ok(r) => r,
        Err(e) => return Some(e.to_string()),
    };
    crate::a2a::Agent::check_tenant(&req.tenant)
        .and_then(|()| crate::a2a::classify(&req.message))
        .err()
        .map(|e| e.to_string())
}

fn collect_strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

fn replace_strings(v: &serde_json::Value, from: &str, to: &str) -> serde_json::Value {
    match v {
        serde_json::Value::String(s) if s == from => serde_json::Value::String(to.to_string()),
        serde_json::Value::Array(a) => a.iter().map(|x| replace_strings(x, from, to)).collect(),
        serde_json::Value::Object(o) => o.iter().map(|(k, x)| (k.clone(), replace_strings(x, from, to))).collect(),
        x => x.clone(),
    }
}
