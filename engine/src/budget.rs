//! Budget tokenizers: the receiving LLM's tokens, in which a budget, the
//! totals and the dropped manifest are counted.
//!
//! E5's own tokenizer (the encoder's) is the default; `o200k` and `cl100k`
//! are built in (their BPE ranks ship inside the `tiktoken-rs` crate, no
//! download at run time); any HuggingFace `tokenizer.json` (Llama, Qwen,
//! Mistral, ...) can be registered under a name. A server registers files at
//! start and requests only ever name a tokenizer ([`TokenizerRegistry::resolve`]),
//! never a path.
//!
//! ```
//! use scd_engine::budget::TokenizerRegistry;
//!
//! let reg = TokenizerRegistry::new();
//! let o200k = reg.resolve("o200k").unwrap().expect("built in");
//! assert_eq!(o200k.name(), "o200k");
//! assert_eq!(o200k.count("Hello world").unwrap(), 2);
//! assert!(reg.resolve("e5").unwrap().is_none()); // the encoder's own
//! let err = reg.resolve("/etc/passwd").unwrap_err().to_string();
//! assert!(err.starts_with("budget_tokenizer: unknown tokenizer"), "{err}");
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Error, Result};

/// Counts tokens the way the receiving LLM does.
pub trait TokenCounter: Send + Sync + std::fmt::Debug {
    /// The name replies report (`o200k`, `cl100k`, a registered name or a path).
    fn name(&self) -> &str;
    /// Tokens of `text`, without special tokens (BOS, chat template).
    fn count(&self, text: &str) -> Result<usize>;
}

/// A budget tokenizer, shared by requests and the sessions they open.
pub type BudgetTokenizer = Arc<dyn TokenCounter>;

/// What the receiver's text puts between two selected chunks: chunks are
/// sent in reading order joined by it (see [`crate::extract::Compressed::sent_text`]).
pub const CHUNK_SEPARATOR: &str = "\n";

/// The name of the encoder's own tokenizer (the default).
pub const E5: &str = "e5";

/// The built-in names, besides [`E5`].
pub const BUILTIN: [&str; 2] = ["o200k", "cl100k"];

/// What a `rate` must be: LLMLingua's `rate`, the share of a context's
/// tokens to keep. Every surface's error about it says this after the name
/// of its own field (`rate`, `--rate`, `message.parts[0].data.rate`).
pub const RATE_RANGE: &str = "must be a number in (0, 1], the share of the context's tokens to keep";

/// `rate` checked: finite and in (0, 1] ([`RATE_RANGE`]); the error names `field`.
///
/// ```
/// use scd_engine::budget::{check_rate, rate_budget};
///
/// assert_eq!(check_rate("rate", 0.3).unwrap(), 0.3);
/// let e = check_rate("--rate", 1.5).unwrap_err().to_string();
/// assert_eq!(e, "--rate: must be a number in (0, 1], the share of the context's tokens to keep");
/// assert_eq!(rate_budget(1000, 0.3), 300);
/// assert_eq!(rate_budget(3, 0.1), 1); // never 0
/// ```
pub fn check_rate(field: &str, rate: f64) -> Result<f64> {
    if rate.is_finite() && rate > 0.0 && rate <= 1.0 {
        Ok(rate)
    } else {
        Err(Error::invalid(field, RATE_RANGE))
    }
}

/// The budget `rate` (checked by [`check_rate`]) keeps of a context of
/// `context_tokens`: that share, rounded down, and at least 1.
pub fn rate_budget(context_tokens: usize, rate: f64) -> usize {
    ((context_tokens as f64) * rate).floor().max(1.0) as usize
}

/// An OpenAI BPE from `tiktoken-rs` (`o200k_base`, `cl100k_base`).
pub struct Tiktoken {
    name: &'static str,
    bpe: &'static tiktoken_rs::CoreBPE,
}

impl std::fmt::Debug for Tiktoken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiktoken").field("name", &self.name).finish()
    }
}

impl TokenCounter for Tiktoken {
    fn name(&self) -> &str {
        self.name
    }

    fn count(&self, text: &str) -> Result<usize> {
        // special-token text in a context is ordinary text to an API
        Ok(self.bpe.encode_ordinary(text).len())
    }
}

/// A HuggingFace `tokenizer.json`.
pub struct HfTokenizer {
    name: String,
    path: PathBuf,
    tokenizer: tokenizers::Tokenizer,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer").field("name", &self.name).field("path", &self.path).finish()
    }
}

impl HfTokenizer {
    /// Loads `path` (a `tokenizer.json`), reported as `name`.
    pub fn load(name: impl Into<String>, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if !path.is_file() {
            return Err(Error::io(&path, std::io::Error::new(std::io::ErrorKind::NotFound, "no tokenizer.json here")));
        }
        let tokenizer = tokenizers::Tokenizer::from_file(&path)
            .map_err(|source| Error::Tokenizer { path: path.clone(), source })?;
        Ok(Self { name: name.into(), path, tokenizer })
    }
}

impl TokenCounter for HfTokenizer {
    fn name(&self) -> &str {
        &self.name
    }

    fn count(&self, text: &str) -> Result<usize> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|source| Error::Tokenizer { path: self.path.clone(), source })?;
        Ok(enc.len())
    }
}

/// A built-in tokenizer by name: `o200k` or `cl100k`, tiktoken's encoding
/// names (`o200k_base`, `cl100k_base`), or an OpenAI model name as tiktoken
/// maps it (`gpt-4o`, `gpt-4.1-mini`, `o3`, `gpt-5` → o200k; `gpt-4`,
/// `gpt-3.5-turbo`, `text-embedding-3-small` → cl100k); any case. It reports
/// itself as `o200k` or `cl100k`.
pub fn builtin(name: &str) -> Option<BudgetTokenizer> {
    use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
    let name = name.to_ascii_lowercase();
    let o200k = match name.as_str() {
        "o200k" | "o200k_base" => true,
        "cl100k" | "cl100k_base" => false,
        model => match get_tokenizer(model)? {
            // gpt-oss's encoding is o200k's with more special tokens, which text never holds
            Tokenizer::O200kBase | Tokenizer::O200kHarmony => true,
            Tokenizer::Cl100kBase => false,
            _ => return None,
        },
    };
    Some(if o200k {
        Arc::new(Tiktoken { name: "o200k", bpe: tiktoken_rs::o200k_base_singleton() })
    } else {
        Arc::new(Tiktoken { name: "cl100k", bpe: tiktoken_rs::cl100k_base_singleton() })
    })
}

/// The tokenizers requests may name: `e5` (the default, also the empty
/// name), the built-ins and files registered at start.
#[derive(Debug, Clone, Default)]
pub struct TokenizerRegistry {
    registered: BTreeMap<String, BudgetTokenizer>,
}

impl TokenizerRegistry {
    /// The built-ins only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the `tokenizer.json` at `path` under `name` (letters,
    /// digits, `.`, `_`, `-`; not a built-in name). Errors name `what` (the
    /// flag), the name and the path.
    pub fn register(&mut self, name: &str, path: impl AsRef<Path>, what: &str) -> Result<()> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(Error::invalid(
                what,
                format!("tokenizer name {name:?} must be 1 to 64 letters, digits, '.', '_' or '-'"),
            ));
        }
        if name == E5 || BUILTIN.contains(&name) || self.registered.contains_key(name) {
            return Err(Error::invalid(what, format!("tokenizer name {name:?} is already taken")));
        }
        let t = HfTokenizer::load(name, path.as_ref())
            .map_err(|e| Error::invalid(what, format!("{name}={}: {e}", path.as_ref().display())))?;
        self.registered.insert(name.to_string(), Arc::new(t));
        Ok(())
    }

    /// Every name a request may give, the default first.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::iter::once(E5).chain(BUILTIN).map(String::from).collect();
        names.extend(self.registered.keys().cloned());
        names
    }

    /// The tokenizer a request names: `None` for the encoder's own (`e5` or
    /// empty); an unknown name is [`Error::InvalidArgument`] on
    /// `budget_tokenizer`, listing the choices. Never reads a file.
    pub fn resolve(&self, name: &str) -> Result<Option<BudgetTokenizer>> {
        let name = name.trim();
        if name.is_empty() || name == E5 {
            return Ok(None);
        }
        if let Some(t) = self.registered.get(name).cloned().or_else(|| builtin(name)) {
            return Ok(Some(t));
        }
        Err(Error::invalid(
            "budget_tokenizer",
            format!(
                "unknown tokenizer {}; choose one of: {}",
                crate::context::shown_name(name),
                self.names().join(", ")
            ),
        ))
    }

    /// For local tools (the CLI): [`resolve`](Self::resolve), or else a
    /// path to a `tokenizer.json`, reported under its path.
    pub fn resolve_or_load(&self, name_or_path: &str) -> Result<Option<BudgetTokenizer>> {
        match self.resolve(name_or_path) {
            Err(e) if Path::new(name_or_path).is_file() => {
                drop(e);
                Ok(Some(Arc::new(HfTokenizer::load(name_or_path, name_or_path)?)))
            }
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_people_type_reach_the_right_encoding() {
        let reg = TokenizerRegistry::new();
        let text = "naïve café, 東京 — fn main() { println!(\"hi\"); }";
        let o200k = reg.resolve("o200k").unwrap().unwrap().count(text).unwrap();
        let cl100k = reg.resolve("cl100k").unwrap().unwrap().count(text).unwrap();
        assert_ne!(o200k, cl100k, "the text tells the encodings apart");
        for (name, canonical, n) in [
            ("o200k_base", "o200k", o200k),
            ("gpt-4o", "o200k", o200k),
            ("GPT-4o-mini", "o200k", o200k),
            ("gpt-4.1", "o200k", o200k),
            ("o3-mini", "o200k", o200k),
            ("gpt-5", "o200k", o200k),
            ("cl100k_base", "cl100k", cl100k),
            ("gpt-4", "cl100k", cl100k),
            ("gpt-3.5-turbo", "cl100k", cl100k),
            ("text-embedding-3-small", "cl100k", cl100k),
        ] {
            let t = reg.resolve(name).unwrap().unwrap_or_else(|| panic!("{name}"));
            assert_eq!((t.name(), t.count(text).unwrap()), (canonical, n), "{name}");
        }
        // encodings SCD does not count in, and models tiktoken does not know
        for name in ["gpt2", "text-davinci-003", "claude-3-5-sonnet"] {
            assert!(reg.resolve(name).is_err(), "{name}");
        }
    }

    #[test]
    fn rates_outside_zero_to_one_are_refused_naming_the_field() {
        for bad in [0.0, -0.1, 1.000001, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = check_rate("rate", bad).unwrap_err().to_string();
            assert_eq!(e, format!("rate: {RATE_RANGE}"), "{bad}");
        }
        for ok in [f64::MIN_POSITIVE, 0.25, 1.0] {
            assert_eq!(check_rate("rate", ok).unwrap(), ok);
        }
        assert_eq!((rate_budget(400, 0.25), rate_budget(401, 0.25), rate_budget(7, 1.0)), (100, 100, 7));
        assert_eq!((rate_budget(0, 0.5), rate_budget(9, 0.01)), (1, 1));
    }

    #[test]
    fn builtins_count_like_tiktoken() {
        let reg = TokenizerRegistry::new();
        let o = reg.resolve("o200k").unwrap().unwrap();
        let c = reg.resolve("cl100k").unwrap().unwrap();
        // "<|endoftext|>" in a context is text, not a special token
        assert!(o.count("<|endoftext|>").unwrap() > 1);
        assert_eq!(o.count("").unwrap(), 0);
        assert_eq!(c.count("hello world").unwrap(), 2);
        assert_eq!(o.count(CHUNK_SEPARATOR).unwrap(), 1);
    }

    #[test]
    fn unknown_names_are_rejected_naming_the_field_and_the_choices() {
        let reg = TokenizerRegistry::new();
        let e = reg.resolve("llama-3").unwrap_err().to_string();
        assert_eq!(e, "budget_tokenizer: unknown tokenizer \"llama-3\"; choose one of: e5, o200k, cl100k");
        // a long name (content sent by mistake) is named by its size only
        let e = reg.resolve(&"sk_live_SECRET_".repeat(400)).unwrap_err().to_string();
        assert!(e.starts_with("budget_tokenizer: unknown tokenizer <a 6000-byte name>; choose"), "{e}");
        // a request never names a path, not even one that exists
        assert!(reg.resolve("/etc/hostname").is_err());
        assert!(reg.resolve("").unwrap().is_none() && reg.resolve("e5").unwrap().is_none());
    }

    #[test]
    fn registering_checks_the_name_and_the_file_naming_the_flag() {
        let mut reg = TokenizerRegistry::new();
        let e = reg.register("o200k", "x.json", "--budget-tokenizer").unwrap_err().to_string();
        assert_eq!(e, "--budget-tokenizer: tokenizer name \"o200k\" is already taken");
        let e = reg.register("a/b", "x.json", "--budget-tokenizer").unwrap_err().to_string();
        assert!(e.starts_with("--budget-tokenizer: tokenizer name \"a/b\" must be"), "{e}");
        let e = reg.register("llama", "/nonexistent/tokenizer.json", "--budget-tokenizer").unwrap_err().to_string();
        assert!(e.starts_with("--budget-tokenizer: llama=/nonexistent/tokenizer.json: "), "{e}");
        assert_eq!(reg.names(), ["e5", "o200k", "cl100k"]);
    }
}
