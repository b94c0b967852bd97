//! Integration tests of the engine against the real models.
//!
//! They need `models/setup.sh` to have run (the README's test command does).
//! Without the models they print a skip message, unless
//! `SCD_REQUIRE_MODELS=1` (set by the test command and CI) makes that a failure.
//!
//! This file holds the shared helpers; each area's tests are a file under
//! `cases/`, declared at the end (one test binary, ripgrep's layout).

use std::path::PathBuf;
use std::sync::OnceLock;

use scd_engine::encoder::{OrtConfig, OrtEncoder};
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

#[path = "cases/encoder.rs"]
mod encoder;

#[path = "cases/extraction.rs"]
mod extraction;

#[path = "cases/hardening.rs"]
mod hardening;

#[path = "cases/hnsw_path.rs"]
mod hnsw_path;

#[path = "cases/agent.rs"]
mod agent_data;

#[path = "cases/showcase.rs"]
mod showcase;

#[path = "cases/loaders.rs"]
mod loaders;

#[path = "cases/fuzz_bodies.rs"]
mod fuzz_bodies;

#[path = "cases/budget_tokenizer.rs"]
mod budget_tokenizer;

#[path = "cases/whole_functions.rs"]
mod whole_functions;
