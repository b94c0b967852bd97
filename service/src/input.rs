//! Strict parsing of what the CLI's line-oriented inputs carry: one
//! `scd compress --batch` line, JSONL texts for `scd embed`, and the JSON
//! path errors they share. Every error names the key or the line, never
//! the value; the fuzz targets drive these same functions.
//!
//! ```
//! use scd_service::input::{parse_batch_line, BatchDefaults};
//!
//! let line = r#"{"task": "why?", "context": {"fields": [{"name": "a", "content": "b"}]}, "budget": 50}"#;
//! let req = parse_batch_line(line, &BatchDefaults::default()).unwrap();
//! assert_eq!(req.requirement.max_context_tokens, 50);
//! let err = parse_batch_line(r#"{"task": "why?", "context": {"fields": []}}"#, &BatchDefaults::default());
//! assert!(err.unwrap_err().to_string().starts_with("budget: missing"));
//! ```

use anyhow::Context as _;
use scd_engine::context::{Context, ContextRequirement, Task};
use scd_engine::extract::CompressRequest;
use serde::Deserialize;

/// A strict-JSON error naming the key it is about (`budget: invalid type…`),
/// or just the error when it is about the whole document.
pub fn json_path_error(e: serde_path_to_error::Error<serde_json::Error>) -> anyhow::Error {
    let path = e.path().to_string();
    if path == "." || path == "?" {
        anyhow::anyhow!("{}", e.into_inner())
    } else {
        anyhow::anyhow!("{path}: {}", e.into_inner())
    }
}

/// One line of `--batch`, parsed strictly (unknown keys are errors).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchLine {
    task: String,
    context: Context,
    budget: Option<u64>,
    required: Option<Vec<String>>,
    optional: Option<Vec<String>>,
    threshold: Option<f32>,
    min_relative_score: Option<f32>,
}

/// What `--batch` lines leave out, from the flags.
#[derive(Debug, Clone, Default)]
pub struct BatchDefaults {
    /// `--budget`.
    pub budget: Option<u64>,
    /// `--required`.
    pub required: Vec<String>,
    /// `--optional`.
    pub optional: Vec<String>,
    /// `--threshold`.
    pub threshold: Option<f32>,
    /// `--min-relative-score`.
    pub min_relative_score: Option<f32>,
}

/// Parses one line of `--batch` into a request, `defaults` giving what the
/// line leaves out. Errors name the key.
pub fn parse_batch_line(raw: &str, defaults: &BatchDefaults) -> anyhow::Result<CompressRequest> {
    let de = &mut serde_json::Deserializer::from_str(raw);
    let line: BatchLine = serde_path_to_error::deserialize(de).map_err(json_path_error)?;
    let budget = line.budget.or(defaults.budget).context("budget: missing (give it on the line or with --budget)")?;
    anyhow::ensure!(budget >= 1, "budget: must be at least 1");
    let requirement = ContextRequirement {
        required_fields: line.required.unwrap_or_else(|| defaults.required.clone()),
        optional_fields: line.optional.unwrap_or_else(|| defaults.optional.clone()),
        max_context_tokens: usize::try_from(budget).unwrap_or(usize::MAX),
        relevance_threshold: line.threshold.or(defaults.threshold),
        min_relative_score: line.min_relative_score.or(defaults.min_relative_score),
    };
    Ok(CompressRequest { task: Task::new(line.task), context: line.context, requirement, session: None })
}

/// Texts of JSONL `raw`, read from option `flag` (`scd bench-encode` and `scd bench-load` read their `--input` through it; `scd embed` reads line by line with [`jsonl_text`]).
pub fn parse_jsonl_texts(raw: &str, flag: &str) -> anyhow::Result<Vec<String>> {
    let texts: Vec<String> = raw
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            let v: serde_json::Value = serde_json::from_str(l)
                .map_err(|_| anyhow::anyhow!("{flag}: text {}: expected JSONL with a \"text\" field", i + 1))?;
            v.get("text").and_then(|t| t.as_str()).map(str::to_string).ok_or_else(|| {
                anyhow::anyhow!(
                    "{flag}: text {}: no string field \"text\" (expected JSONL with a \"text\" field)",
                    i + 1
                )
            })
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!texts.is_empty(), "{flag}: no texts");
    Ok(texts)
}

/// The string field `"text"` of JSONL line `line` (1-based) of `--input`,
/// and the whole object.
pub fn jsonl_text(line: usize, raw: &str) -> anyhow::Result<(String, serde_json::Value)> {
    let v: serde_json::Value = serde_json::from_str(raw).with_context(|| format!("--input line {line}: not JSON"))?;
    let text = v
        .get("text")
        .and_then(|t| t.as_str())
        .with_context(|| format!("--input line {line}: no string field \"text\""))?
        .to_string();
    Ok((text, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_texts_without_a_text_are_refused_by_line() {
        assert_eq!(parse_jsonl_texts("{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n", "--input").unwrap(), ["a", "b"]);
        let err = parse_jsonl_texts("{\"text\": \"a\"}\n{\"txt\": \"secret\"}\n", "--input").unwrap_err().to_string();
        assert!(err.starts_with("--input: text 2: no string field \"text\""), "{err}");
        assert!(!err.contains("secret"), "{err}");
        let err = parse_jsonl_texts("{\"text\": 7}", "--input").unwrap_err().to_string();
        assert!(err.starts_with("--input: text 1: no string field"), "{err}");
        assert!(parse_jsonl_texts("not json", "--input")
            .unwrap_err()
            .to_string()
            .starts_with("--input: text 1: expected JSONL"));
        assert_eq!(parse_jsonl_texts("\n", "--input").unwrap_err().to_string(), "--input: no texts");
    }
}
