//! Model manifests: what a model folder says about itself.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::context::FieldKind;
use crate::{Error, Result};

/// `manifest.json` written by `models/convert.py` (or by hand for an
/// external export such as Hugging Face's `intfloat/e5-large-v2`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// Model name, e.g. `e5-small`.
    pub name: String,
    /// Embedding dimension.
    pub dim: usize,
    /// Longest input the model accepts, special tokens included.
    pub max_tokens: usize,
    /// Pooling; only `mean` is supported.
    #[serde(default = "default_pooling")]
    pub pooling: String,
    /// Whether embeddings are L2-normalized.
    #[serde(default = "default_true")]
    pub normalize: bool,
    /// Prefix for queries (E5: `query: `).
    #[serde(default)]
    pub query_prefix: String,
    /// Prefix for passages (E5: `passage: `).
    #[serde(default)]
    pub passage_prefix: String,
    /// Where the weights came from.
    #[serde(default)]
    pub source: serde_json::Value,
    /// Weight and activation precision (`fp32`, `fp16`, `int8`).
    #[serde(default = "default_precision")]
    pub precision: String,
    /// What the model is for (`default`, `speed measurement only`, ...).
    #[serde(default)]
    pub purpose: String,
    /// sha256 of each output file.
    #[serde(default)]
    pub files: std::collections::BTreeMap<String, String>,
    /// ONNX file name inside the folder.
    #[serde(default = "default_onnx")]
    pub onnx: String,
    /// ONNX Runtime session config entries the model is meant to run with
    /// (`e5-small-int8`: one graph fusion that is slower on its int8 graph
    /// turned off). Applied by [`OrtEncoder::load`](super::OrtEncoder::load).
    #[serde(default)]
    pub session_config: std::collections::BTreeMap<String, String>,
    /// The cosine of a question with a text below which the question is not
    /// about it, measured for this model ([`Encoder::relevance_floor`](super::Encoder::relevance_floor)).
    #[serde(default)]
    pub relevance_floor: Option<f32>,
    /// The same for the fields of a kind (`"markdown": 0.84`), where it was
    /// measured apart: in place of `relevance_floor` for that kind.
    #[serde(default)]
    pub relevance_floor_by_kind: std::collections::HashMap<FieldKind, f32>,
}

fn default_pooling() -> String {
    "mean".into()
}
fn default_precision() -> String {
    "fp32".into()
}
fn default_true() -> bool {
    true
}
fn default_onnx() -> String {
    "model.onnx".into()
}

impl Manifest {
    /// The model's stable id: its name and the first 12 hex digits of its
    /// ONNX file's hash (`e5-small@ea07969944bd`), the embedding cache key.
    pub fn model_id(&self) -> String {
        let digest = self.files.get(&self.onnx).map(|h| h.chars().take(12).collect::<String>()).unwrap_or_default();
        if digest.is_empty() {
            self.name.clone()
        } else {
            format!("{}@{digest}", self.name)
        }
    }

    /// Reads `dir/manifest.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let m: Manifest =
            serde_json::from_str(&text).map_err(|source| Error::Manifest { path: path.clone(), source })?;
        if m.pooling != "mean" {
            return Err(Error::invalid(
                "manifest.pooling",
                format!("{:?} is not supported (only \"mean\")", m.pooling),
            ));
        }
        if m.dim == 0 || m.max_tokens < 3 {
            return Err(Error::invalid("manifest.dim/max_tokens", "must be positive (max_tokens >= 3)"));
        }
        let cosine = |f: &f32| (-1.0..=1.0).contains(f);
        if let Some(f) = m.relevance_floor.filter(|f| !cosine(f)) {
            return Err(Error::invalid("manifest.relevance_floor", format!("must be a cosine in [-1, 1], got {f}")));
        }
        if let Some((k, f)) = m.relevance_floor_by_kind.iter().find(|(_, f)| !cosine(f)) {
            let field = format!("manifest.relevance_floor_by_kind.{}", k.as_str());
            return Err(Error::invalid(field, format!("must be a cosine in [-1, 1], got {f}")));
        }
        Ok(m)
    }

    /// The floor for a field of `kind`: its own, else the model's.
    pub fn relevance_floor_for(&self, kind: FieldKind) -> Option<f32> {
        self.relevance_floor_by_kind.get(&kind).copied().or(self.relevance_floor)
    }
}

/// One model folder found under a models directory.
#[derive(Debug, Clone)]
pub struct ModelEntry {
    /// The folder.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// Resolves `name` to a model folder: a path to a folder with a manifest, or
/// a name under `models_dir`.
pub fn resolve_model(models_dir: &Path, name: &str) -> Result<PathBuf> {
    let direct = Path::new(name);
    if direct.join("manifest.json").is_file() {
        return Ok(direct.to_path_buf());
    }
    let dir = models_dir.join(name);
    if dir.join("manifest.json").is_file() {
        return Ok(dir);
    }
    Err(Error::ModelNotFound { name: name.to_string(), dir: models_dir.to_path_buf() })
}

/// Lists the models under `models_dir`, sorted by name. Folders without a
/// readable manifest are skipped.
pub fn list_models(models_dir: &Path) -> Result<Vec<ModelEntry>> {
    let rd = match std::fs::read_dir(models_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(models_dir, e)),
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let dir = entry.path();
        if let Ok(manifest) = Manifest::load(&dir) {
            out.push(ModelEntry { dir, manifest });
        }
    }
    out.sort_by(|a, b| a.manifest.name.cmp(&b.manifest.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest whose `relevance_floor` is no cosine is refused, naming
    /// the field; one in [-1, 1] loads.
    #[test]
    fn a_relevance_floor_outside_a_cosine_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let write = |floor: &str| {
            let m = format!(r#"{{"name": "m", "dim": 4, "max_tokens": 8, "relevance_floor": {floor}}}"#);
            std::fs::write(dir.path().join("manifest.json"), m).unwrap();
            Manifest::load(dir.path())
        };
        assert_eq!(write("0.8").unwrap().relevance_floor, Some(0.8));
        for bad in ["1.5", "-2"] {
            let err = write(bad).unwrap_err().to_string();
            assert!(err.starts_with("manifest.relevance_floor: must be a cosine in [-1, 1], got "), "{bad}: {err}");
        }
    }

    /// A kind's floor stands in for the model's for that kind only; one
    /// outside [-1, 1] is refused naming the kind, as is an unknown kind.
    #[test]
    fn a_kind_has_its_own_floor_or_the_models() {
        let dir = tempfile::tempdir().unwrap();
        let write = |by_kind: &str| {
            let m = format!(
                r#"{{"name": "m", "dim": 4, "max_tokens": 8, "relevance_floor": 0.8, "relevance_floor_by_kind": {by_kind}}}"#
            );
            std::fs::write(dir.path().join("manifest.json"), m).unwrap();
            Manifest::load(dir.path())
        };
        let m = write(r#"{"markdown": 0.84, "json": 0.82}"#).unwrap();
        assert_eq!(m.relevance_floor_for(FieldKind::Markdown), Some(0.84));
        assert_eq!(m.relevance_floor_for(FieldKind::Json), Some(0.82));
        assert_eq!(m.relevance_floor_for(FieldKind::Prose), Some(0.8));
        let err = write(r#"{"json": 0.82, "chat": 1.5}"#).unwrap_err().to_string();
        assert_eq!(err, "manifest.relevance_floor_by_kind.chat: must be a cosine in [-1, 1], got 1.5");
        let err = write(r#"{"prosody": 0.5}"#).unwrap_err().to_string();
        assert!(err.contains("unknown variant `prosody`"), "{err}");
    }
}
