//! What the two backends answer alike: embeddings as the `embed` tool shows
//! them, and a failed call as a tool error's text.

/// Embeddings as the `embed` tool shows them.
pub struct Embeddings {
    /// The model's id.
    pub model: String,
    /// One row per text: the vector, its tokens and its windows.
    pub rows: Vec<(Vec<f32>, u32, u32)>,
}

/// The text of a failed call's tool error, by its kind's name (gRPC's code
/// name): an argument problem as the server said it (naming the MCP
/// argument), overload as "busy", the rest with its kind.
pub(super) fn kind_text(kind: &str, msg: String) -> String {
    match kind {
        "InvalidArgument" => msg,
        "ResourceExhausted" => format!("busy: {msg}"),
        "NotFound" => format!("not found: {msg}"),
        "Unavailable" => format!("unavailable: {msg}; retry later"),
        c => format!("{c}: {msg}"),
    }
}
