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
    rate: Option<f64>,
    required: Option<Vec<String>>,
    optional: Option<Vec<String>>,
    threshold: Option<f32>,
    min_relative_score: Option<f32>,
    budget_tokenizer: Option<String>,
    render: Option<String>,
    explain: Option<bool>,
    list_dropped: Option<bool>,
}

/// A `--batch` line's own output options; `None`: the flag's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineOptions {
    /// `budget_tokenizer`: a name or a tokenizer.json path, as the flag.
    pub budget_tokenizer: Option<String>,
    /// `render`: `freeform`, `semi_structured` or `structured_soft`.
    pub render: Option<scd_engine::handoff::Format>,
    /// `explain`.
    pub explain: Option<bool>,
    /// `list_dropped`.
    pub list_dropped: Option<bool>,
    /// The line's `rate` (or `--rate`'s, for a line with neither budget nor
    /// rate), checked: the request's budget is a placeholder until the
    /// caller counts the context ([`scd_engine::extract::Scd::rate_budget`]).
    pub rate: Option<f64>,
}

/// What `--batch` lines leave out, from the flags.
#[derive(Debug, Clone, Default)]
pub struct BatchDefaults {
    /// `--budget`.
    pub budget: Option<u64>,
    /// `--rate`.
    pub rate: Option<f64>,
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
    parse_batch_line_with(raw, defaults).map(|(req, _)| req)
}

/// [`parse_batch_line`], and the line's own output options (every option
/// the flags have: `budget_tokenizer`, `render`, `explain`, `list_dropped`).
pub fn parse_batch_line_with(raw: &str, defaults: &BatchDefaults) -> anyhow::Result<(CompressRequest, LineOptions)> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(raw) {
        if let Some(hint) = v.get("context").and_then(Context::mistaken_shape) {
            anyhow::bail!("context: {hint}");
        }
    }
    let de = &mut serde_json::Deserializer::from_str(raw);
    let line: BatchLine = serde_path_to_error::deserialize(de).map_err(json_path_error)?;
    let render = match line.render.as_deref() {
        None => None,
        Some(f) => Some(
            f.parse::<scd_engine::handoff::Format>()
                .map_err(|_| anyhow::anyhow!("render: expected freeform, semi_structured or structured_soft"))?,
        ),
    };
    // the line's budget or rate, else the flags'
    let (budget, rate) = match (line.budget, line.rate) {
        (Some(_), Some(_)) => anyhow::bail!("rate: give budget or rate, not both"),
        (None, None) => (defaults.budget, defaults.rate),
        given => given,
    };
    let rate = rate.map(|r| scd_engine::budget::check_rate("rate", r)).transpose()?;
    let budget = match (budget, rate) {
        (_, Some(_)) => 1,
        (b, None) => b.context("budget: missing (give budget or rate on the line, or --budget or --rate)")?,
    };
    anyhow::ensure!(budget >= 1, "budget: must be at least 1");
    let opts = LineOptions {
        budget_tokenizer: line.budget_tokenizer.clone(),
        render,
        explain: line.explain,
        list_dropped: line.list_dropped,
        rate,
    };
    let requirement = ContextRequirement {
        required_fields: line.required.unwrap_or_else(|| defaults.required.clone()),
        optional_fields: line.optional.unwrap_or_else(|| defaults.optional.clone()),
        max_context_tokens: usize::try_from(budget).unwrap_or(usize::MAX),
        relevance_threshold: line.threshold.or(defaults.threshold),
        min_relative_score: line.min_relative_score.or(defaults.min_relative_score),
    };
    Ok((CompressRequest { task: Task::new(line.task), context: line.context, requirement, session: None }, opts))
}

/// Texts of JSONL `raw`, read from option `flag` (`scd-dev bench-encode` and `scd-dev bench-load` read their `--input` through it; `scd embed` reads line by line with [`jsonl_text`]).
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

/// A client's key as an error may name it: itself when a plain word of at
/// most [`scd_engine::context::MAX_ECHOED_KEY_BYTES`] bytes, else its size
/// (`<100-byte key>`; a key is a name, yet a careless client may put
/// anything there, control characters included).
pub fn echoed_key(key: &str) -> String {
    scd_engine::context::shown_key(key).into_owned()
}

/// A path into a request (`context.fields[2].kind`) as an error may show
/// it: each key as [`echoed_key`] shows it (an unknown key is on the path
/// of its own error), indices as they are.
pub fn shown_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&echoed_key(key));
            }
            Segment::Unknown => out.push_str(if out.is_empty() { "?" } else { ".?" }),
        }
    }
    if out.is_empty() {
        ".".into()
    } else {
        out
    }
}

/// A serde_json error message with every value the client sent taken out,
/// for the network surfaces (MCP, A2A): an error may name the path, the
/// expected type and the limit, never quote a value that could be content.
/// `invalid type: string "<secret>", expected struct Context` becomes
/// `invalid type: a string, expected struct Context`; `unknown variant
/// `<secret>`, expected one of …` becomes `unknown variant, expected one of
/// …`; numbers, characters and byte strings go the same way; an unknown
/// key is kept when a plain word of at most 40 bytes (it names the typo),
/// else named by its size ([`echoed_key`]).
pub fn redact_json_error(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    loop {
        let next = [("string \"", Quote::Double, "a string"), ("character `", Quote::Back, "a character")]
            .into_iter()
            .chain([
                ("unknown variant `", Quote::Back, "unknown variant"),
                ("integer `", Quote::Back, "an integer"),
                ("floating point `", Quote::Back, "a number"),
                ("byte array", Quote::None, "a byte array"),
            ])
            .filter_map(|(p, q, r)| rest.find(p).map(|at| (at, p, q, r)))
            .chain(rest.find("unknown field `").map(|at| (at, "unknown field `", Quote::Key, "")))
            .min_by_key(|(at, ..)| *at);
        let Some((at, prefix, quote, replacement)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at]);
        let after = &rest[at + prefix.len()..];
        let end = match quote {
            Quote::None => 0,
            Quote::Double => closing_quote(after).map_or(after.len(), |e| e + 1),
            // serde writes `value`, then `, expected` or the end
            Quote::Back | Quote::Key => {
                after.rfind("`, expected").or_else(|| after.rfind('`')).map_or(after.len(), |e| e + 1)
            }
        };
        if let Quote::Key = quote {
            out.push_str("unknown field `");
            out.push_str(&echoed_key(&after[..end.saturating_sub(1)]));
            out.push('`');
        } else {
            out.push_str(replacement);
        }
        rest = &after[end..];
    }
}

#[derive(Clone, Copy)]
enum Quote {
    None,
    Double,
    Back,
    Key,
}

/// The byte offset of the `"` closing a Rust-escaped string literal.
fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_line_gives_a_budget_or_a_rate_else_the_flags_do() {
        let ctx = r#"{"fields": [{"name": "a", "content": "b"}]}"#;
        let parse = |keys: &str, defaults: &BatchDefaults| {
            parse_batch_line_with(&format!(r#"{{"task": "t", "context": {ctx}{keys}}}"#), defaults)
                .map(|(req, o)| (req.requirement.max_context_tokens, o.rate))
                .map_err(|e| e.to_string())
        };
        let none = BatchDefaults::default();
        let by_rate = BatchDefaults { rate: Some(0.5), ..BatchDefaults::default() };
        let by_budget = BatchDefaults { budget: Some(40), ..BatchDefaults::default() };
        assert_eq!(parse(r#", "rate": 0.25"#, &none), Ok((1, Some(0.25))));
        assert_eq!(parse(r#", "budget": 9"#, &by_rate), Ok((9, None)));
        assert_eq!(parse(r#", "rate": 0.25"#, &by_budget), Ok((1, Some(0.25))));
        assert_eq!(parse("", &by_rate), Ok((1, Some(0.5))));
        assert_eq!(parse("", &by_budget), Ok((40, None)));
        let range = format!("rate: {}", scd_engine::budget::RATE_RANGE);
        for bad in ["0", "1.5", "-1"] {
            assert_eq!(parse(&format!(r#", "rate": {bad}"#), &none), Err(range.clone()), "{bad}");
        }
        assert_eq!(parse(r#", "budget": 9, "rate": 0.5"#, &none), Err("rate: give budget or rate, not both".into()));
        assert!(parse("", &none).unwrap_err().starts_with("budget: missing"));
    }

    #[test]
    fn a_batch_line_takes_every_option_the_flags_do() {
        let ctx = r#"{"fields": [{"name": "a", "content": "b"}]}"#;
        let line = format!(
            r#"{{"task": "t", "context": {ctx}, "budget": 9, "budget_tokenizer": "o200k", "render": "semi_structured", "explain": true, "list_dropped": false}}"#
        );
        let (req, o) = parse_batch_line_with(&line, &BatchDefaults::default()).unwrap();
        assert_eq!(req.requirement.max_context_tokens, 9);
        assert_eq!(
            o,
            LineOptions {
                budget_tokenizer: Some("o200k".into()),
                render: Some(scd_engine::handoff::Format::SemiStructured),
                explain: Some(true),
                list_dropped: Some(false),
                rate: None,
            }
        );
        let (_, none) = parse_batch_line_with(
            &format!(r#"{{"task": "t", "context": {ctx}, "budget": 9}}"#),
            &BatchDefaults::default(),
        )
        .unwrap();
        assert_eq!(none, LineOptions::default());
        let bad = format!(r#"{{"task": "t", "context": {ctx}, "budget": 9, "render": "poem"}}"#);
        let e = parse_batch_line_with(&bad, &BatchDefaults::default()).unwrap_err().to_string();
        assert_eq!(e, "render: expected freeform, semi_structured or structured_soft");
        let bare = r#"{"task": "t", "context": [{"name": "a", "content": "SECRET"}], "budget": 9}"#;
        let e = parse_batch_line_with(bare, &BatchDefaults::default()).unwrap_err().to_string();
        assert!(e.starts_with("context: a bare array of 1 fields") && !e.contains("SECRET"), "{e}");
    }

    #[test]
    fn json_errors_lose_every_value_the_client_sent() {
        let secret = "sk_live_SECRET_4242 \\\"quoted\\\" `tick`";
        let cases = [
            (
                format!("invalid type: string \"{secret}\", expected struct Context"),
                "invalid type: a string, expected struct Context",
            ),
            (
                format!("unknown variant `{secret}`, expected one of `prose`, `code`"),
                "unknown variant, expected one of `prose`, `code`",
            ),
            ("invalid value: integer `-1`, expected u32".to_string(), "invalid value: an integer, expected u32"),
            ("invalid type: floating point `0.5`, expected u32".to_string(), "invalid type: a number, expected u32"),
            ("missing field `texts`".to_string(), "missing field `texts`"),
        ];
        for (raw, want) in cases {
            assert_eq!(redact_json_error(&raw), want, "{raw}");
        }
        let long = format!("unknown field `{}`, expected `task`", "k".repeat(100));
        assert_eq!(redact_json_error(&long), "unknown field `<100-byte key>`, expected `task`");
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Strict {
            #[serde(rename = "fields")]
            _fields: Vec<std::collections::BTreeMap<String, u32>>,
        }
        let key = "k".repeat(100);
        let text = format!(r#"{{"fields": [{{"{key}": "x"}}]}}"#);
        let e =
            serde_path_to_error::deserialize::<_, Strict>(&mut serde_json::Deserializer::from_str(&text)).unwrap_err();
        assert_eq!(shown_path(e.path()), "fields[0].<100-byte key>");
        let e =
            serde_path_to_error::deserialize::<_, Strict>(&mut serde_json::Deserializer::from_str("7")).unwrap_err();
        assert_eq!((shown_path(e.path()), e.path().to_string()), (".".into(), ".".into()));
        let odd = "unknown field `a\u{1b}[2Jb`, expected `task`";
        assert_eq!(redact_json_error(odd), "unknown field `<6-byte key>`, expected `task`", "a control character");
        assert_eq!(
            redact_json_error("unknown field `budgte`, expected one of `task`"),
            "unknown field `budgte`, expected one of `task`"
        );
        // what serde_json really writes, with a secret in a string where a context belongs
        let e = serde_json::from_str::<Context>(&format!("{:?}", format!("{{\"fields\": [{secret}]}}"))).unwrap_err();
        let redacted = redact_json_error(&e.to_string());
        assert!(!redacted.contains("SECRET") && redacted.starts_with("invalid type: a string, expected"), "{redacted}");
        let e = serde_json::from_str::<scd_engine::context::Field>(
            r#"{"name": "a", "content": "b", "kind": "The gateway key is sk_live_9"}"#,
        )
        .unwrap_err();
        let redacted = redact_json_error(&e.to_string());
        assert!(
            !redacted.contains("sk_live") && redacted.starts_with("unknown variant, expected one of"),
            "{redacted}"
        );
    }

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
