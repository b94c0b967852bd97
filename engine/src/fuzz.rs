//! Fuzz target bodies, shared by the cargo-fuzz driver (`service/fuzz`) and
//! the seeded tests (`engine/tests/tests.rs`, `mod fuzz_bodies`).
//!
//! Each body takes arbitrary bytes and checks its invariants with `assert!`:
//! a panic is a finding. Not part of the API.
//!
//! ```
//! scd_engine::fuzz::chunkers(b"\x00Dr. Who. He left.\n\n# h\nfn x() {}\n");
//! scd_engine::fuzz::context_json(br#"{"fields": [{"name": "a", "kind": "log", "content": "ERROR x"}]}"#);
//! ```

use crate::chunk::{chunk_field, ChunkConfig, RawChunk};
use crate::context::{Context, ContextLimits, Field, FieldKind};

/// Every field kind, in the order the chunker body runs them.
pub const KINDS: [FieldKind; 6] =
    [FieldKind::Prose, FieldKind::Code, FieldKind::Log, FieldKind::Json, FieldKind::Chat, FieldKind::Table];

/// Chunks `text` as `kind` and asserts the span invariants: every chunk is
/// non-empty, inside the text, on char boundaries, trimmed, and the chunks
/// are in order without overlap. Returns the chunks.
pub fn check_chunks(text: &str, kind: FieldKind, cfg: ChunkConfig) -> Vec<RawChunk> {
    let field = Field { name: "f".into(), kind, content: text.into(), confidential: false };
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
