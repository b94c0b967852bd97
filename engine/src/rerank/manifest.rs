//! A cross-encoder's `manifest.json`: what the reranker needs to know of
//! the model (its kind, the token limits, the passage template) and the
//! sha256 of its files, checked before the files are used.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The one `kind` the reranker loads.
pub const CROSS_ENCODER: &str = "cross-encoder";

/// The files a reranker folder must hold, each with its sha256 in the manifest.
pub const FILES: [&str; 2] = ["model.onnx", "tokenizer.json"];

/// `manifest.json` of a reranker folder (written by the export beside the
/// weights).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RerankManifest {
    /// Model name, e.g. `rerank`.
    pub name: String,
    /// Must be `cross-encoder`: the model reads a query and a passage together.
    pub kind: String,
    /// Longest input, special tokens included (`[CLS] q [SEP] p [SEP]`).
    pub max_tokens: usize,
    /// The query's tokens at most (specials not counted).
    pub query_max_tokens: usize,
    /// How a chunk becomes the passage: `{field}` (the field's name or path)
    /// and `{text}` (the chunk) are replaced; a chunk without a field name
    /// is its text alone.
    pub passage_template: String,
    /// sha256 (hex) of each file, [`FILES`] at least.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Where the weights came from.
    #[serde(default)]
    pub source: serde_json::Value,
    /// ONNX Runtime session config entries the model is meant to run with.
    #[serde(default)]
    pub session_config: BTreeMap<String, String>,
}

impl RerankManifest {
    /// Reads and checks `dir/manifest.json` (kind, limits, template), then
    /// checks each of [`FILES`] against its sha256. Errors name the field.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let m: RerankManifest =
            serde_json::from_str(&text).map_err(|source| Error::Manifest { path: path.clone(), source })?;
        m.check(&path)?;
        for file in FILES {
            verify_file(&path, dir, file, &m.files)?;
        }
        Ok(m)
    }

    /// The fields' own checks (no file read).
    pub fn check(&self, path: &Path) -> Result<()> {
        let bad = |field: &str, reason: String| Error::ModelManifest {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        if self.kind != CROSS_ENCODER {
            return Err(bad("kind", format!("{:?}, expected {CROSS_ENCODER:?}", self.kind)));
        }
        if self.max_tokens < 5 {
            return Err(bad("max_tokens", format!("{}: at least 5 ([CLS] q [SEP] p [SEP])", self.max_tokens)));
        }
        if self.query_max_tokens == 0 || self.query_max_tokens + 4 > self.max_tokens {
            return Err(bad(
                "query_max_tokens",
                format!(
                    "{}: from 1 to max_tokens - 4 ({}), leaving a passage room",
                    self.query_max_tokens,
                    self.max_tokens - 4
                ),
            ));
        }
        if !self.passage_template.contains("{text}") {
            return Err(bad("passage_template", format!("{:?} has no {{text}}", self.passage_template)));
        }
        Ok(())
    }

    /// The passage of a chunk of field `field` (the template; the text alone
    /// when the field has no name).
    pub fn passage(&self, field: &str, text: &str) -> String {
        if field.is_empty() {
            return text.to_string();
        }
        self.passage_template.replace("{field}", field).replace("{text}", text)
    }

    /// The model's stable id: its name and the first 12 hex digits of its
    /// ONNX file's hash.
    pub fn model_id(&self) -> String {
        let digest: String = self.files.get(FILES[0]).map(|h| h.chars().take(12).collect()).unwrap_or_default();
        format!("{}@{digest}", self.name)
    }
}

/// Checks `dir/file` against `files[file]` (hex sha256, any case).
fn verify_file(manifest: &Path, dir: &Path, file: &str, files: &BTreeMap<String, String>) -> Result<()> {
    let field = format!("files.{file}");
    let bad = |reason: String| Error::ModelManifest { path: manifest.to_path_buf(), field: field.clone(), reason };
    let want = files.get(file).ok_or_else(|| bad("missing: the file's sha256 is required".into()))?;
    let got = sha256_file(&dir.join(file))?;
    if !want.eq_ignore_ascii_case(&got) {
        return Err(bad(format!("sha256 {want} does not match the file's {got}")));
    }
    Ok(())
}

/// Hex sha256 of a file, read in blocks.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The folder of a reranker named by a flag: `None` for `none`; a folder
/// given by name must hold a manifest (else an error naming it); with no
/// name, `default` when it holds one, else `None`.
pub fn resolve_reranker(named: Option<&str>, default: &Path) -> Result<Option<PathBuf>> {
    match named.map(str::trim) {
        Some("none") => Ok(None),
        Some(dir) => {
            let manifest = Path::new(dir).join("manifest.json");
            std::fs::metadata(&manifest).map_err(|e| Error::io(&manifest, e))?;
            Ok(Some(PathBuf::from(dir)))
        }
        None => Ok(default.join("manifest.json").is_file().then(|| default.to_path_buf())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(kind: &str, sha_of_model: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.onnx"), b"not really a model").unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), b"{}").unwrap();
        let model_sha = sha256_file(&dir.path().join("model.onnx")).unwrap();
        let tok_sha = sha256_file(&dir.path().join("tokenizer.json")).unwrap();
        let m = serde_json::json!({
            "name": "rerank", "kind": kind, "max_tokens": 256, "query_max_tokens": 64,
            "passage_template": "{field}\n{text}",
            "files": {"model.onnx": sha_of_model.unwrap_or(&model_sha), "tokenizer.json": tok_sha},
        });
        std::fs::write(dir.path().join("manifest.json"), m.to_string()).unwrap();
        dir
    }

    #[test]
    fn a_good_manifest_loads_and_fills_its_template() {
        let dir = folder("cross-encoder", None);
        let m = RerankManifest::load(dir.path()).unwrap();
        assert_eq!((m.max_tokens, m.query_max_tokens), (256, 64));
        assert_eq!(m.passage("src/lib.rs", "fn main() {}"), "src/lib.rs\nfn main() {}");
        assert_eq!(m.passage("", "plain"), "plain");
        assert!(m.model_id().starts_with("rerank@") && m.model_id().len() == "rerank@".len() + 12);
    }

    #[test]
    fn a_wrong_sha_or_kind_is_refused_naming_the_field() {
        let dir = folder("cross-encoder", Some(&"0".repeat(64)));
        let e = RerankManifest::load(dir.path()).unwrap_err();
        assert!(matches!(&e, Error::ModelManifest { field, .. } if field == "files.model.onnx"), "{e:?}");
        let shown = e.to_string();
        assert!(shown.contains("manifest.json: files.model.onnx: sha256 0000"), "{shown}");
        let dir = folder("bi-encoder", None);
        let e = RerankManifest::load(dir.path()).unwrap_err();
        assert!(matches!(&e, Error::ModelManifest { field, .. } if field == "kind"), "{e:?}");
        assert!(e.to_string().ends_with("kind: \"bi-encoder\", expected \"cross-encoder\""), "{e}");
        // a file without its sha256
        let dir = folder("cross-encoder", None);
        let text = std::fs::read_to_string(dir.path().join("manifest.json")).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["files"].as_object_mut().unwrap().remove("tokenizer.json");
        std::fs::write(dir.path().join("manifest.json"), v.to_string()).unwrap();
        let e = RerankManifest::load(dir.path()).unwrap_err();
        assert!(matches!(&e, Error::ModelManifest { field, .. } if field == "files.tokenizer.json"), "{e:?}");
    }

    #[test]
    fn limits_and_template_are_checked_by_name() {
        let m = RerankManifest {
            name: "r".into(),
            kind: CROSS_ENCODER.into(),
            max_tokens: 256,
            query_max_tokens: 253,
            passage_template: "{field}\n{text}".into(),
            files: BTreeMap::new(),
            source: serde_json::Value::Null,
            session_config: BTreeMap::new(),
        };
        let field = |m: &RerankManifest| match m.check(Path::new("m.json")) {
            Err(Error::ModelManifest { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(&m), "query_max_tokens");
        assert_eq!(field(&RerankManifest { max_tokens: 4, ..m.clone() }), "max_tokens");
        let ok = RerankManifest { query_max_tokens: 64, ..m.clone() };
        ok.check(Path::new("m.json")).unwrap();
        assert_eq!(field(&RerankManifest { passage_template: "{field}".into(), ..ok }), "passage_template");
    }

    #[test]
    fn a_missing_default_is_none_and_a_missing_named_folder_an_error() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(resolve_reranker(None, &empty.path().join("rerank")).unwrap(), None);
        assert_eq!(resolve_reranker(Some("none"), Path::new("/nowhere")).unwrap(), None);
        let missing = empty.path().join("absent");
        let e = resolve_reranker(Some(missing.to_str().unwrap()), Path::new("/nowhere")).unwrap_err();
        assert!(matches!(&e, Error::Io { path, .. } if path == &missing.join("manifest.json")), "{e:?}");
        let dir = folder("cross-encoder", None);
        assert_eq!(resolve_reranker(None, dir.path()).unwrap().as_deref(), Some(dir.path()));
        assert_eq!(resolve_reranker(Some(dir.path().to_str().unwrap()), Path::new("/x")).unwrap().unwrap(), dir.path());
    }
}
