//! Fuzz target bodies, shared by the cargo-fuzz driver (`service/fuzz`) and
//! the seeded tests (`engine/tests/tests.rs`, `mod fuzz_bodies`).
//!
//! Each body takes arbitrary bytes and checks its invariants with `assert!`:
//! a panic is a finding. Not part of the API.
//!
//! ```
//! scd_engine::fuzz::chunkers(b"\x00Dr. Who. He left.\n\n# h\nfn x() {}\n");
//! scd_engine::fuzz::context_json(br#"{"fields": [{"name": "a", "kind": "log", "content": "ERROR x"}]}"#);
//! scd_engine::fuzz::handoff(b"\x01[STATUS]\ndone\nJSON_REPORT:\n{\nAnswer: x");
//! ```

use crate::chunk::{chunk_field, ChunkConfig, RawChunk};
use crate::context::{Context, ContextLimits, Field, FieldKind};
use crate::handoff::{self, Format, ParseRate};

/// Every field kind, in the order the chunker body runs them.
pub const KINDS: [FieldKind; 7] = FieldKind::ALL;

/// Chunks `text` as `kind` and asserts the span invariants: every chunk is
/// non-empty, inside the text, on char boundaries, trimmed, and the chunks
/// are in order without overlap. Returns the chunks.
pub fn check_chunks(text: &str, kind: FieldKind, cfg: ChunkConfig) -> Vec<RawChunk> {
    check_named_chunks(text, "f", kind, cfg)
}

/// [`check_chunks`] for a field called `name` (a code field named like a
/// file goes to its language's parser).
pub fn check_named_chunks(text: &str, name: &str, kind: FieldKind, cfg: ChunkConfig) -> Vec<RawChunk> {
    let field = Field { name: name.into(), kind, content: text.into(), confidential: false };
    let chunks = chunk_field(&field, cfg);
    let mut prev_end = 0;
    for (i, c) in chunks.iter().enumerate() {
        assert!(c.start < c.end, "{kind:?} chunk {i}: empty span {}..{}", c.start, c.end);
        assert!(c.end <= text.len(), "{kind:?} chunk {i}: {}..{} past the end {}", c.start, c.end, text.len());
        assert!(
            text.is_char_boundary(c.start) && text.is_char_boundary(c.end),
            "{kind:?} chunk {i}: {}..{} not on char boundaries",
            c.start,
            c.end
        );
        assert!(c.start >= prev_end, "{kind:?} chunk {i}: starts at {} before the last end {prev_end}", c.start);
        let s = &text[c.start..c.end];
        assert_eq!(s, s.trim(), "{kind:?} chunk {i}: not trimmed");
        prev_end = c.end;
    }
    chunks
}

/// Every chunker over the bytes: the first byte picks the prose grouping
/// target (0 = one sentence a chunk), the rest is the text (invalid UTF-8
/// replaced, so every input reaches the chunkers).
pub fn chunkers(data: &[u8]) {
    let (cfg, rest) = match data.split_first() {
        Some((&b, rest)) => (ChunkConfig { target_bytes: usize::from(b) * 4, ..ChunkConfig::default() }, rest),
        None => (ChunkConfig::default(), data),
    };
    let text = String::from_utf8_lossy(rest);
    for kind in KINDS {
        check_chunks(&text, kind, cfg);
    }
    // one language's parser per input (picked by the first byte): all nine
    // per input would make the seeded runs nine times slower
    let names = ["f.rs", "f.py", "f.js", "f.ts", "f.tsx", "f.go", "f.java", "f.c", "f.cpp"];
    let pick = data.first().map_or(0, |&b| usize::from(b) % names.len());
    check_named_chunks(&text, names[pick], FieldKind::Code, cfg);
}

/// The context JSON parser: strict parse, limits and name checks, then, for
/// a context that passes, the chunkers on each field, a JSON round trip and
/// the redaction of `Debug` (it must not change when contents change).
pub fn context_json(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let strict = Context::from_json(s);
    let plain = serde_json::from_str::<Context>(s);
    assert_eq!(strict.is_ok(), plain.is_ok(), "from_json and serde_json disagree");
    let Ok(ctx) = strict else { return };
    let valid = ctx.validate_within(&ContextLimits::default()).is_ok();
    if valid {
        assert!(ctx.validate().is_ok(), "validate_within passed but validate failed");
    }
    let back = serde_json::to_string(&ctx).expect("a parsed context serializes");
    assert_eq!(Context::from_json(&back).expect("a serialized context parses"), ctx, "round trip changed it");
    let mut masked = ctx.clone();
    for f in &mut masked.fields {
        f.content = "x".repeat(f.content.len());
    }
    assert_eq!(format!("{ctx:?}"), format!("{masked:?}"), "Debug shows content");
    if valid {
        for f in &ctx.fields {
            check_chunks(&f.content, f.kind, ChunkConfig::default());
        }
    }
}

/// Bytes a rendered report may take per byte of the report it was parsed
/// from (JSON escapes a control character as six), plus a constant: the
/// work a hand-off does stays linear in its input.
pub const HANDOFF_RENDER_FACTOR: usize = 8;

/// The hand-off parsers over the bytes: the first byte picks the format
/// (0 freeform, 1 semi-structured, 2 structured, else detected), the rest
/// is the report (invalid UTF-8 replaced). Checks: a report that does not
/// parse is freeform with a reason, one that does has none; the answer is
/// one line; rendering the report in the same format parses back with the
/// same answer, in size linear in the input; the report's fields are valid
/// context fields when the text is NUL-free. Returns the parse.
pub fn handoff(data: &[u8]) -> handoff::Parsed {
    let (format, rest) = match data.split_first() {
        Some((&b, rest)) => (Format::ALL.get(usize::from(b)).copied(), rest),
        None => (None, data),
    };
    let text = String::from_utf8_lossy(rest);
    let format = format.unwrap_or_else(|| Format::detect(&text));
    let p = handoff::parse(&text, format);
    if p.parsed {
        assert!(p.why_not.is_none() && p.format == format, "parsed but {:?} as {}", p.why_not, p.format);
    } else {
        assert!(p.why_not.is_some() && p.format == Format::Freeform, "not parsed, yet no reason or not freeform");
    }
    if let Some(a) = &p.answer {
        assert!(!a.contains('\n'), "the answer spans lines");
    }
    let rendered = handoff::render(&p.report, format, p.answer.as_deref());
    assert!(
        rendered.len() <= HANDOFF_RENDER_FACTOR * text.len() + 512,
        "{} bytes rendered from {}",
        rendered.len(),
        text.len()
    );
    let back = handoff::parse(&rendered, format);
    assert!(back.parsed, "a rendered {format} report does not parse: {:?}", back.why_not);
    assert_eq!(back.answer, p.answer, "the answer changed in the round trip");
    if format != Format::Freeform {
        assert_eq!(handoff::render(&back.report, format, back.answer.as_deref()), rendered, "render is not stable");
    }
    let mut rate = ParseRate::default();
    rate.add(&text, Some(format));
    assert_eq!(rate.render_parse_rate(), 1.0);
    if !text.contains('\0') {
        let ctx = Context { fields: handoff::to_fields(&p.report) };
        assert!(ctx.validate().is_ok(), "report fields are not a valid context");
    }
    p
}
