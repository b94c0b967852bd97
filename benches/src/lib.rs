//! Shared helpers for SCD's benches: where the models, ONNX Runtime and the
//! evaluation data live, and loaders for real text.

use std::path::PathBuf;

use scd_engine::encoder::{OrtConfig, OrtEncoder};

/// Repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `$SCD_ORT_LIB` or `.tools/ort/libonnxruntime.so`.
pub fn ort_lib() -> PathBuf {
    std::env::var_os("SCD_ORT_LIB").map(PathBuf::from).unwrap_or_else(|| root().join(".tools/ort/libonnxruntime.so"))
}

/// `$SCD_MODELS_DIR` or `models/out`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("SCD_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("models/out"))
}

/// Loads a model with default CPU settings, or None with a note when it is not built.
pub fn load_model(name: &str) -> Option<OrtEncoder> {
    let dir = models_dir().join(name);
    if !dir.join("manifest.json").exists() {
        eprintln!("skipping {name}: not built (models/setup.sh {name})");
        return None;
    }
    Some(OrtEncoder::load(&dir, &OrtConfig::new(ort_lib())).expect("model loads"))
}

/// Titled paragraphs (title, text).
pub type Paragraphs = Vec<(String, String)>;

/// HotpotQA paragraphs and questions from ../shared/evaldata, or None when
/// the folder is absent.
pub fn hotpot_paragraphs() -> Option<(Paragraphs, Vec<String>)> {
    let path = root().join("../shared/evaldata/hotpotqa/hotpot_hf_schema.jsonl");
    let text = std::fs::read_to_string(&path).ok()?;
    let mut paras = Vec::new();
    let mut questions = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        questions.push(v["question"].as_str()?.to_string());
        let titles = v["context"]["title"].as_array()?;
        let sents = v["context"]["sentences"].as_array()?;
        for (t, s) in titles.iter().zip(sents) {
            let body: String = s.as_array()?.iter().filter_map(|x| x.as_str()).collect();
            paras.push((t.as_str()?.to_string(), body.trim().to_string()));
        }
    }
    Some((paras, questions))
}
