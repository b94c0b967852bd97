//! The tools' own arguments (those of `compress_context` and
//! `request_more_context` are the JSON API's, [`crate::app::json`]) and the
//! results that are theirs alone (those of `compress_context` and
//! `request_more_context` are [`crate::view`]'s). Each doc comment's first
//! paragraph is what a model reads in `tools/list` ([`super::schema`]); the
//! rest is for rustdoc and the REST API's OpenAPI document, which shares
//! these types.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of `count_tokens`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CountTokensArgs {
    /// Counted as it is: no prefix, no special tokens.
    pub text: String,
    /// o200k, cl100k, e5 (default) or a registered name.
    pub tokenizer: Option<String>,
}

/// Arguments of `embed`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbedArgs {
    /// Texts to embed, each non-empty.
    pub texts: Vec<String>,
    /// Embed as queries (questions, tasks), not passages.
    #[serde(default)]
    pub query: bool,
    /// Add the vectors to the structured result.
    ///
    /// By default each embedding is its dimensions, tokens and a digest,
    /// which is what fits a model's context.
    #[serde(default)]
    pub vectors: bool,
}

/// Result of `count_tokens`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TokensOutput {
    /// Tokens in `tokenizer`.
    pub tokens: u32,
    /// The tokenizer that counted.
    pub tokenizer: String,
}

/// One embedding.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EmbeddingOut {
    /// With `vectors`: the L2-normalized vector of `dim` floats.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<f32>,
    /// SHA-256 of the vector's little-endian f32 bytes, 16 hex digits: equal
    /// digests, equal vectors.
    pub digest: String,
    /// Tokens fed to the model.
    pub tokens: u32,
    /// Windows averaged (1 unless the text was over the model's length).
    pub windows: u32,
}

/// Result of `embed`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EmbedOutput {
    /// The model's id.
    pub model: String,
    /// Vector length.
    pub dim: u32,
    /// One per text, in order.
    pub embeddings: Vec<EmbeddingOut>,
}
