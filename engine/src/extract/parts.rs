//! The parts of a chunk's score: what scoring computes (`score.rs`) and
//! what the learned scorer reads as features (`features.rs`), kept below
//! both so that neither module depends on the other.

/// Which link lifted a chunk (the first rule that matched, as in scoring).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Link {
    /// None.
    #[default]
    None,
    /// Its document's title is named by the task or a top chunk.
    Title,
    /// It defines a name the task or a top chunk mentions.
    Defined,
    /// It mentions a name a top chunk defines.
    Mention,
    /// A member of a type a top chunk defines (code).
    Owner,
}

/// Every chunk's score and its parts, index-aligned with the prepared
/// chunks: `fused = dense_z + lexical_weight·lexical_z + group_lift +
/// link_lift (+ hop_lift when the second hop is on) (+ rerank_lift when the
/// second stage is)`, summed in that order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Scores {
    /// The fused, calibrated score packing ranks by.
    pub(super) fused: Vec<f32>,
    /// z-score of the dense (cosine) similarity to the query.
    pub(super) dense_z: Vec<f32>,
    /// z-score of the BM25 score (before `lexical_weight`).
    pub(super) lexical_z: Vec<f32>,
    /// `field_weight` × the best base score in the chunk's group, plus what
    /// the chunk's kind and text add after scoring (a log line's severity,
    /// `line_lexical_weight`, a lexical score that stands out).
    pub(super) group_lift: Vec<f32>,
    /// What links (a named document, a defined name) added.
    pub(super) link_lift: Vec<f32>,
    /// What the second hop added (`second_hop_weight` × its z-score; empty
    /// when the hop is off).
    pub(super) hop_lift: Vec<f32>,
    /// The raw cosine similarity to the query (learned scoring's input).
    pub(super) dense: Vec<f32>,
    /// The best base score (dense and lexical) in the chunk's group.
    pub(super) group_best: Vec<f32>,
    /// Which link lifted the chunk.
    pub(super) link: Vec<Link>,
    /// The second hop's z-score (before its weight; empty when off).
    pub(super) hop_z: Vec<f32>,
    /// What the second stage (the cross-encoder) added (`rerank_weight` ×
    /// its z-score among the candidates; empty when off).
    pub(super) rerank_lift: Vec<f32>,
}

impl Scores {
    /// Adds `lift` to chunk `i`'s score as what its kind and text add,
    /// shown in `group_lift`, so the parts still sum to the score.
    pub(super) fn lift_group(&mut self, i: usize, lift: f32) {
        self.fused[i] += lift;
        self.group_lift[i] += lift;
    }
}
