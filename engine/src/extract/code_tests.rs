//! Cut functions in packing (`long_function_bytes`): one that fits the
//! budget is sent whole or not at all (`function_whole_share`), one longer
//! than that share of the budget may be trimmed to its signature and best
//! pieces; near copies of sent code wait behind code that repeats nothing
//! (`near_duplicate_penalty`).

use super::tests::{compress_within, follow_up, hash_scd, opts, prose};
use super::*;
use crate::context::{Field, FieldKind};

/// A Python module: a long `process_events` (about 2.5 KB, cut at 512
/// bytes) whose lines here and there speak of delivery retries, and a short
/// `retry_backoff` that answers.
fn module() -> Context {
    let mut body = String::new();
    for i in 0..24 {
        body.push_str(&format!("    item_{i} = queue.pop(options.batch_{i})  # event window {i}\n"));
        if i % 6 == 5 {
            body.push_str(&format!(
                "    deliver(item_{i}, retry=True)  # retry the delivery when the broker refuses\n"
            ));
        }
    }
    let code = format!(
        "import math\n\n\ndef process_events(queue, options):\n    \"\"\"Drain the queue in batches.\"\"\"\n{body}    return queue\n\n\n\
         def retry_backoff(attempt):\n    \"\"\"Retry delivery with exponential backoff when the broker refuses.\"\"\"\n    return min(60, 2 ** attempt)\n"
    );
    Context { fields: vec![Field { kind: FieldKind::Code, ..prose("events.py", &code) }] }
}

fn cut_at_512(share: f32) -> Scd {
    let mut cfg = ScdConfig::default();
    cfg.prepare.chunk.long_function_bytes = 512;
    cfg.scoring.function_whole_share = share;
    hash_scd(cfg)
}

const TASK: &str = "How is a delivery retried with exponential backoff when the broker refuses?";

/// `process_events`' tokens in cl100k.
fn process_events_tokens() -> usize {
    let code = &module().fields[0].content;
    let start = code.find("def process_events").unwrap();
    let end = code.find("\n\n\ndef retry_backoff").unwrap();
    crate::budget::builtin("cl100k").unwrap().count(&code[start..end]).unwrap()
}

/// `process_events`' body lines in `text` (indentation aside: an envelope
/// gets each chunk's text from its first word), and all of them.
fn body_lines_in(text: &str) -> (usize, usize) {
    let ctx = module();
    let code = &ctx.fields[0].content;
    let body: Vec<&str> = code.lines().filter(|l| l.contains("item_")).map(str::trim).collect();
    (body.iter().filter(|l| text.contains(*l)).count(), body.len())
}

/// With a budget that holds the whole long function but not with the
/// answer sent before it, share 1 (the default) sends none of it, and all
/// of it once the budget holds both; at share 0 its pieces fill the room
/// piecemeal, `…` marking the gaps.
#[test]
fn a_cut_function_that_fits_the_budget_is_sent_whole_or_not_at_all() {
    let budget = process_events_tokens() + 30;
    let piecemeal = compress_within(&cut_at_512(0.0), TASK, module(), budget);
    let (sent, all) = body_lines_in(&piecemeal.text);
    assert!(sent > 0 && sent < all, "share 0: {sent} of {all} body lines\n{}", piecemeal.text);
    assert!(piecemeal.text.contains('…'), "{}", piecemeal.text);
    // the answer goes first; the function then no longer fits and none of it is sent
    let whole = compress_within(&cut_at_512(1.0), TASK, module(), budget);
    assert_eq!(body_lines_in(&whole.text).0, 0, "share 1\n{}", whole.text);
    assert!(whole.text.contains("return min(60, 2 ** attempt)"), "{}", whole.text);
    // with room for both, all of it is
    let roomy = compress_within(&cut_at_512(1.0), TASK, module(), budget + 60);
    let (sent, all) = body_lines_in(&roomy.text);
    assert_eq!(sent, all, "share 1, more room\n{}", roomy.text);
}

/// A function longer than its share of the budget is still trimmed: its
/// signature and the pieces that fit, rather than nothing.
#[test]
fn a_cut_function_longer_than_its_share_of_the_budget_is_trimmed() {
    let out = compress_within(&cut_at_512(1.0), TASK, module(), 300);
    let (sent, all) = body_lines_in(&out.text);
    assert!(sent > 0 && sent < all, "{sent} of {all} body lines\n{}", out.text);
    assert!(out.text.contains("def process_events(queue, options):"), "{}", out.text);
}

/// An envelope that frames each chunk on lines of its own, which packing
/// does not price (it counts no headers under an envelope): the final fit
/// has to drop chunks, and drops a function sent whole as a whole.
fn framed() -> CompressOptions {
    let frame = |chunks: &[SelectedChunk]| {
        let framed: Vec<String> = chunks
            .iter()
            .map(|c| format!("<chunk id=\"{}\" chunker=\"{}\">\n{}\n</chunk>", c.id, c.chunker, c.text))
            .collect();
        framed.join("\n")
    };
    CompressOptions { envelope: Some(Envelope(Arc::new(frame))), ..opts("cl100k", false) }
}

/// The fit drops a function sent whole as one, at its best chunk's worth:
/// never its closing line or a weak piece alone.
#[test]
fn the_fit_drops_a_function_sent_whole_as_a_whole() {
    let whole_fn = process_events_tokens();
    for extra in [40, 80, 120, 160] {
        let req = CompressRequest {
            task: Task::new(TASK),
            context: module(),
            requirement: ContextRequirement::with_budget(whole_fn + extra),
            session: None,
        };
        let out = cut_at_512(1.0).compress_opts(&req, &framed(), &Cancel::new()).unwrap();
        assert!(out.totals.sent_tokens <= whole_fn + extra, "{:?}", out.totals);
        let (sent, all) = body_lines_in(&out.text);
        assert!(sent == 0 || sent == all, "+{extra}: {sent} of {all} body lines\n{}", out.text);
    }
}

/// A follow-up with room for the rest of a function the first answer sent
/// trimmed brings all the rest, together.
#[test]
fn a_follow_up_brings_the_rest_of_a_trimmed_function_whole() {
    let scd = cut_at_512(1.0);
    let req = CompressRequest {
        task: Task::new(TASK),
        context: module(),
        requirement: ContextRequirement::with_budget(300),
        session: Some(SessionRequest::default()),
    };
    let first = scd.compress_opts(&req, &opts("cl100k", false), &Cancel::new()).unwrap();
    let (sent, all) = body_lines_in(&first.text);
    assert!(sent > 0 && sent < all, "first: {sent} of {all}\n{}", first.text);
    let question = "show the whole process_events loop that pops the queue";
    let more = scd.request_more(&follow_up(&first.session.unwrap(), question, Some(process_events_tokens()))).unwrap();
    let (more_sent, _) = body_lines_in(&more.text);
    assert_eq!(sent + more_sent, all, "the rest, whole\n{}", more.text);
}

/// A cut function's signature is embedded with the whole function, so its
/// cosine to the task is the uncut function's, and its group's best is its
/// own score: its pieces do not lift it above what the uncut function scores.
#[test]
fn a_cut_functions_signature_scores_as_the_function_uncut() {
    let req = CompressRequest {
        task: Task::new(TASK),
        context: module(),
        requirement: ContextRequirement::with_budget(1000),
        session: None,
    };
    let start = module().fields[0].content.find("def process_events").unwrap();
    let feature = |name: &str| features::FEATURES.iter().position(|f| *f == name).unwrap();
    let (dense, group_best, dense_z, lexical_z) =
        (feature("dense"), feature("group_best"), feature("dense_z"), feature("lexical_z"));
    let mut whole_cfg = ScdConfig::default();
    whole_cfg.prepare.chunk.long_function_bytes = 0;
    let whole = hash_scd(whole_cfg).chunk_features(&req, &Cancel::new()).unwrap();
    let cut = cut_at_512(1.0).chunk_features(&req, &Cancel::new()).unwrap();
    let uncut = whole.iter().find(|c| c.span.0 == start).expect("the uncut function");
    let signature = cut.iter().find(|c| c.span.0 == start).expect("the signature");
    assert!(signature.span.1 < uncut.span.1, "cut: {:?} against {:?}", signature.span, uncut.span);
    assert_eq!(signature.features[dense], uncut.features[dense]);
    let pieces: Vec<_> = cut.iter().filter(|c| c.group == signature.group && c.span.0 != start).collect();
    assert!(pieces.len() >= 2, "{pieces:?}");
    let w = ScdConfig::default().scoring.lexical_weight;
    let base = |c: &ChunkFeatures| c.features[dense_z] + w * c.features[lexical_z];
    for c in pieces.iter().copied().chain([signature]) {
        assert_eq!(c.features[group_best], base(signature), "{:?}", c.span);
    }
}

/// Three methods: `pad_le` and `pad_be` are near copies (one word apart,
/// each with the task's words in its doc comment), `pad_len128` scores
/// lower (no doc comment) but repeats neither.
fn padding() -> Context {
    let twin = |end: &str| {
        format!(
            "    /// Pad the message with 0x80, zeros and the 64-bit message length in {end}-endian byte order.\n    \
             pub fn pad_{end}(&mut self, data_len: u64) {{\n        let suffix = data_len.to_{end}_bytes();\n        \
             self.digest_pad(0x80, &suffix, |block| self.compress(block));\n        self.reset();\n    }}\n\n"
        )
    };
    let code = format!(
        "impl Buffer {{\n{}{}    pub fn pad_len128(&mut self, data_len: u128) {{\n        \
         self.digest_pad(0x80, &data_len.to_be_bytes(), |b| self.compress(b));\n    }}\n}}\n",
        twin("le"),
        twin("be")
    );
    Context { fields: vec![Field { kind: FieldKind::Code, ..prose("buffer.rs", &code) }] }
}

/// The hash encoder's cosine of the two copies is about 0.95 (e5's is
/// over 0.985, the default): the threshold here makes them near copies.
const REDUNDANCY: f32 = 0.9;

fn sent_fns(out: &Compressed) -> Vec<&str> {
    ["fn pad_le(", "fn pad_be(", "fn pad_len128("].into_iter().filter(|f| out.text.contains(f)).collect()
}

const PAD_TASK: &str = "Pad the message with 0x80, zeros and the 64-bit message length in little-endian byte order";

/// An engine on the hash encoder whose near copies wait at their score less `penalty`.
fn deferring(penalty: f32) -> Scd {
    let mut cfg = ScdConfig::default();
    cfg.scoring.near_duplicate_penalty = penalty;
    cfg.scoring.redundancy_cosine = REDUNDANCY;
    hash_scd(cfg)
}

/// A near copy of a sent chunk that differs from it is never dropped as a
/// duplicate: at penalty 0 it is packed at its score, before a lower-scored
/// chunk that repeats nothing; with the default penalty that chunk goes
/// first, and the near copy still comes once the budget holds all three
/// (sending all three as they read, one budget token over their text).
#[test]
fn a_near_copy_waits_behind_a_chunk_that_repeats_nothing_and_comes_when_there_is_room() {
    let penalty = ScoringConfig::default().near_duplicate_penalty;
    let whole = compress_within(&deferring(0.0), PAD_TASK, padding(), 100_000);
    assert_eq!(sent_fns(&whole), ["fn pad_le(", "fn pad_be(", "fn pad_len128("]);
    // both copies score above the short method, which packing by score alone
    // would leave out first
    let ex = whole.explanation.as_ref().unwrap();
    let score = |f: &str| {
        let c = whole.chunks.iter().find(|c| c.text.contains(f)).unwrap();
        ex.selected.iter().find(|w| w.id == c.id).unwrap().score
    };
    let best_copy = if score("fn pad_le(") >= score("fn pad_be(") { "fn pad_le(" } else { "fn pad_be(" };
    assert!(score("fn pad_le(").min(score("fn pad_be(")) > score("fn pad_len128("), "{ex:?}");
    // a budget for the first method, the short one and a little more
    let tight = whole.totals.sent_tokens - 20;
    let off = compress_within(&deferring(0.0), PAD_TASK, padding(), tight);
    assert_eq!(sent_fns(&off), ["fn pad_le(", "fn pad_be("], "{}", off.text);
    // the better scored copy and the method that repeats nothing
    let on = compress_within(&deferring(penalty), PAD_TASK, padding(), tight);
    assert_eq!(sent_fns(&on), [best_copy, "fn pad_len128("], "{}", on.text);
    let room = compress_within(&deferring(penalty), PAD_TASK, padding(), whole.totals.sent_tokens + 1);
    assert_eq!(room.text, whole.text);
}

/// Only code waits: the same methods in a prose field, near copies there
/// too, are packed at their scores whatever the penalty.
#[test]
fn prose_near_copies_are_packed_at_their_scores() {
    let text = padding().fields[0].content.clone();
    let ctx = || Context { fields: vec![prose("buffer.txt", &text)] };
    let whole = compress_within(&deferring(0.0), PAD_TASK, ctx(), 100_000);
    let tight = whole.totals.sent_tokens - 20;
    let off = compress_within(&deferring(0.0), PAD_TASK, ctx(), tight);
    let on = compress_within(&deferring(10.0), PAD_TASK, ctx(), tight);
    assert!(off.text.len() < whole.text.len(), "the budget leaves something out");
    assert_eq!(on.text, off.text);
}
