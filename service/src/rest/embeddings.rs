//! OpenAI's embeddings API: `POST /v1/embeddings` and `GET /v1/models`, so
//! an OpenAI client pointed at this server's `base_url` embeds with the
//! loaded E5 model. `input_type` (`query` or `passage`, default `passage`)
//! picks E5's prefix; `usage` counts the tokens fed to the model.

use std::borrow::Cow;
use std::sync::Arc;

use aide::transform::TransformOperation;
use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use scd_engine::encoder::{EncodeOptions, InputKind};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::body::{Body, RestBody};
use super::ApiError;
use crate::app::{AppError, Core};
use crate::http::Caller;

/// `POST /v1/embeddings`'s body (OpenAI's, strict).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsBody {
    /// The model: the id `GET /v1/models` lists (`e5-small@<digest>`), or
    /// its name before the `@`.
    pub model: String,
    /// A text, or a list of texts (each non-empty; at most the server's
    /// `--max-texts`); or, as OpenAI's clients send by default, one text's
    /// cl100k token ids or a list of them (decoded to text here).
    #[serde(default)]
    pub input: Input,
    /// `float` (default) or `base64` (little-endian f32, as OpenAI's clients ask).
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    /// If given, the model's own dimensions (vectors are not cut).
    pub dimensions: Option<u32>,
    /// An end-user id (accepted for compatibility; not used).
    pub user: Option<String>,
    /// E5's prefix: `passage` (default) for documents, `query` for questions and tasks.
    #[serde(default)]
    pub input_type: InputType,
}

/// The texts of an embeddings request: a string, a list of strings, or (as
/// OpenAI accepts, and as OpenAI's clients send by default) one text's
/// cl100k token ids or a list of them, decoded here to text.
#[derive(Debug, Default)]
pub struct Input(pub Vec<String>);

/// Most bytes one text given as token ids may decode to (a cl100k token is
/// up to 128 bytes, written in as few as 2: without a cap a 16 MiB body
/// could decode to a third of a GiB). Texts over `--max-text-bytes` are
/// refused later as any text is.
pub const MAX_DECODED_BYTES: usize = 1 << 20;

/// One text given as cl100k token ids, decoded (a multi-byte character cut
/// at the list's ends is replaced by U+FFFD, as OpenAI's clients cut
/// long texts at token boundaries).
fn decode_tokens(ids: &[Value]) -> Result<String, String> {
    let bpe = tiktoken_rs::cl100k_base_singleton();
    let mut bytes = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let rank = id.as_u64().and_then(|n| u32::try_from(n).ok());
        let piece = rank.and_then(|r| bpe.decode_bytes(&[r]).ok());
        bytes.extend(piece.ok_or_else(|| format!("token {i}: not a cl100k token id"))?);
        if bytes.len() > MAX_DECODED_BYTES {
            return Err(format!("token {i}: the text decodes to over {MAX_DECODED_BYTES} bytes"));
        }
    }
    Ok(String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let shape = "a string, a list of strings, a list of cl100k token ids, or a list of such lists";
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Input(vec![s])),
            Value::Array(items) if items.first().is_some_and(Value::is_number) => {
                decode_tokens(&items).map(|t| Input(vec![t])).map_err(D::Error::custom)
            }
            Value::Array(items) => {
                let tokens = items.first().is_some_and(Value::is_array);
                let mut texts = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    match item {
                        Value::String(s) if !tokens => texts.push(s),
                        Value::Array(ids) if tokens && ids.first().is_none_or(Value::is_number) => {
                            texts.push(decode_tokens(&ids).map_err(|e| D::Error::custom(format!("item {i}, {e}")))?)
                        }
                        _ => return Err(D::Error::custom(format!("item {i}: {shape}; the items all of one kind"))),
                    }
                }
                Ok(Input(texts))
            }
            _ => Err(D::Error::custom(shape)),
        }
    }
}

impl JsonSchema for Input {
    fn schema_name() -> Cow<'static, str> {
        "EmbeddingsInput".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": {"type": "integer", "minimum": 0}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}}
            ]
        })
    }
}

/// How vectors are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    /// JSON numbers.
    #[default]
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

/// E5's prefix.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputType {
    /// `passage: ` (documents).
    #[default]
    Passage,
    /// `query: ` (questions, tasks).
    Query,
}

impl RestBody for EmbeddingsBody {
    fn parse(body: Map<String, Value>) -> Result<Self, String> {
        let b: EmbeddingsBody = crate::app::json::Args::from_map(body).parse()?;
        if b.input.0.is_empty() {
            return Err("input: must hold at least one text".into());
        }
        Ok(b)
    }
}

/// `POST /v1/embeddings`'s answer (OpenAI's).
#[derive(Debug, Serialize, JsonSchema)]
pub struct EmbeddingsReply {
    /// Always `list`.
    pub object: &'static str,
    /// One embedding per input, in order.
    pub data: Vec<EmbeddingData>,
    /// The model that embedded.
    pub model: String,
    /// Tokens fed to the model.
    pub usage: Usage,
}

/// One embedding.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EmbeddingData {
    /// Always `embedding`.
    pub object: &'static str,
    /// Its input's position.
    pub index: u32,
    /// The L2-normalized vector.
    pub embedding: Vector,
}

/// A vector, as `encoding_format` asked.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Vector {
    /// JSON numbers.
    Float(Vec<f32>),
    /// Base64 of the little-endian f32 bytes.
    Base64(String),
}

/// Tokens counted.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Usage {
    /// Tokens fed to the model (E5's prefix and special tokens included).
    pub prompt_tokens: u64,
    /// The same (nothing is generated).
    pub total_tokens: u64,
}

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(svc): State<Arc<Core>>,
    who: Caller,
    Body(b): Body<EmbeddingsBody>,
) -> Result<Json<EmbeddingsReply>, ApiError> {
    let (model, dim) = {
        let e = svc.scd.encoder();
        (e.model_id().to_string(), e.dim())
    };
    // the id `GET /v1/models` lists (`e5-small@<digest>`), or its name alone
    if b.model != model && model.split_once('@').is_none_or(|(name, _)| b.model != name) {
        return Err(AppError::NotFound {
            message: "model: not a model this server has loaded (GET /v1/models lists it)".into(),
        }
        .into());
    }
    if b.dimensions.is_some_and(|d| d as usize != dim) {
        return Err(ApiError::invalid(format!("dimensions: this model's vectors have {dim} dimensions")));
    }
    let kind = match b.input_type {
        InputType::Passage => InputKind::Passage,
        InputType::Query => InputKind::Query,
    };
    let texts = b.input.0;
    let limits = svc.limits();
    // the core names the texts `texts`; here they are `input`
    let input_named =
        |e: AppError| e.map_message(|m| m.strip_prefix("texts").map_or(m.clone(), |r| format!("input{r}")));
    crate::app::check_embed_texts(&texts, limits.max_texts, limits.max_text_bytes).map_err(input_named)?;
    let call = who.call("REST", "Embed");
    let r = svc.embed(&call, texts, EncodeOptions::new(kind).with_windows()).await.map_err(input_named)?;
    let enc = r.encoded;
    let tokens: u64 = enc.tokens.iter().map(|&t| u64::from(t as u32)).sum();
    let data = (0..enc.len())
        .map(|index| {
            let values = enc.row(index);
            EmbeddingData {
                object: "embedding",
                index: index as u32,
                embedding: match b.encoding_format {
                    EncodingFormat::Float => Vector::Float(values.to_vec()),
                    EncodingFormat::Base64 => {
                        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                        Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                    }
                },
            }
        })
        .collect();
    Ok(Json(EmbeddingsReply {
        object: "list",
        data,
        model: r.model,
        usage: Usage { prompt_tokens: tokens, total_tokens: tokens },
    }))
}

pub(super) fn docs(op: TransformOperation) -> TransformOperation {
    op.id("embeddings").summary("Embed texts (OpenAI-compatible)").description(
        "OpenAI's embeddings API over the loaded E5 model: L2-normalized vectors, `passage: ` prefixed unless \
         `input_type` is `query`. Texts over the model's window are embedded as the token-weighted mean of \
         windows.",
    )
}

/// `GET /v1/models`'s answer (OpenAI's).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The loaded model.
    pub data: Vec<Model>,
}

/// A loaded model.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Model {
    /// The name `POST /v1/embeddings` takes as `model`.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Always 0 (unknown).
    pub created: u64,
    /// Always `scd`.
    pub owned_by: &'static str,
}

/// `GET /v1/models`.
pub(super) async fn models(State(svc): State<Arc<Core>>) -> Json<ModelList> {
    let id = svc.scd.encoder().model_id().to_string();
    Json(ModelList { object: "list", data: vec![Model { id, object: "model", created: 0, owned_by: "scd" }] })
}

pub(super) fn models_docs(op: TransformOperation) -> TransformOperation {
    op.id("models").summary("The loaded embedding model (OpenAI-compatible)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<Value> {
        tiktoken_rs::cl100k_base_singleton().encode_ordinary(text).into_iter().map(Value::from).collect()
    }

    #[test]
    fn token_ids_decode_to_their_text_and_bad_ids_are_named_by_place() {
        let text = "naïve café — fn main() { println!(\"東京\"); }";
        assert_eq!(decode_tokens(&ids(text)).unwrap(), text);
        let mut bad = ids(text);
        bad.insert(2, Value::from(4_000_000_000u64));
        assert_eq!(decode_tokens(&bad).unwrap_err(), "token 2: not a cl100k token id");
        assert!(decode_tokens(&[Value::from(-1)]).is_err() && decode_tokens(&[Value::from("7")]).is_err());
    }

    #[test]
    fn token_ids_may_not_decode_past_the_cap() {
        let one = ids(&"Several words of ordinary English prose. ".repeat(64));
        let many: Vec<Value> = one.iter().cycle().take(one.len() * 500).cloned().collect();
        let err = decode_tokens(&many).unwrap_err();
        assert!(err.ends_with(&format!("the text decodes to over {MAX_DECODED_BYTES} bytes")), "{err}");
    }
}
