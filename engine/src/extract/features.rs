//! What a learned scorer sees of each chunk, and the learned scorer itself:
//! linear weights over these features, fitted offline on the datasets'
//! train samples for what packing gets (`models/fit_scorer.py`) and shipped
//! as `scorer.json` beside this file.
//!
//! The features are the parts the hand-weighted sum already computes, kept
//! apart (dense z and raw cosine, BM25 z, the group's best, each kind of
//! link, the second hop) and the chunk's place (lead, position and size of
//! its group, the group's rank, its tokens). `title_lead` (a title link on
//! a lead) and `title_shared` (a title link, by the log of how many fields
//! share that title) are derived from them.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Deserialize;

use super::parts::{Link, Scores};
use super::prepare::PreparedContext;

/// The features, in the order of every vector and of `scorer.json`.
pub const FEATURES: [&str; 18] = [
    "dense_z",
    "dense",
    "lexical_z",
    "group_best",
    "link_title",
    "link_defined",
    "link_mention",
    "link_owner",
    "hop_z",
    "hop_on",
    "lead",
    "position",
    "group_size",
    "group_rank",
    "dense_rank",
    "tokens",
    "title_lead",
    "title_shared",
];

/// One chunk's features, in [`FEATURES`]' order.
pub type Features = [f32; FEATURES.len()];

fn ln1p(x: usize) -> f32 {
    (x as f32).ln_1p()
}

/// Ranks (0 = best) of `v`, ties in index order.
fn ranks(v: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    let mut r = vec![0; v.len()];
    for (k, &i) in order.iter().enumerate() {
        r[i] = k;
    }
    r
}

/// Every chunk's features, from its scoring parts.
pub(super) fn features(ctx: &PreparedContext, parts: &Scores) -> Vec<Features> {
    let chunks = &ctx.chunks;
    let n = chunks.len();
    let mut members: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    // each chunk's place in its group, found as the groups are built (one
    // group may hold a whole unbroken field's sentences)
    let mut position = vec![0; n];
    for (i, c) in chunks.iter().enumerate() {
        let m = members.entry(c.group).or_default();
        position[i] = m.len();
        m.push(i);
    }
    // a group's rank among groups, by its best chunk
    // every member of a group carries the group's best
    let mut groups: Vec<((usize, usize), f32)> = members.iter().map(|(g, m)| (*g, parts.group_best[m[0]])).collect();
    groups.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let group_rank: HashMap<(usize, usize), usize> = groups.iter().enumerate().map(|(r, (g, _))| (*g, r)).collect();
    let dense_rank = ranks(&parts.dense_z);
    // how many fields carry each document title: a named title that many
    // paragraphs share (MuSiQue's distractors) says less about each
    let mut titled: HashMap<&str, usize> = HashMap::new();
    for k in ctx.field_keys.iter().flatten() {
        *titled.entry(k.as_str()).or_default() += 1;
    }
    let shared = |field: usize| ctx.field_keys[field].as_deref().map_or(1, |k| titled[k]);
    let hop_on = !parts.hop_z.is_empty();
    (0..n)
        .map(|i| {
            let c = &chunks[i];
            let m = &members[&c.group];
            let link = parts.link.get(i).copied().unwrap_or_default();
            [
                parts.dense_z[i],
                parts.dense[i],
                parts.lexical_z[i],
                parts.group_best[i],
                f32::from(link == Link::Title),
                f32::from(link == Link::Defined),
                f32::from(link == Link::Mention),
                f32::from(link == Link::Owner),
                parts.hop_z.get(i).copied().unwrap_or(0.0),
                f32::from(hop_on && ctx.is_prose(c.field)),
                f32::from(c.lead),
                ln1p(position[i]),
                ln1p(m.len()),
                ln1p(group_rank[&c.group]),
                ln1p(dense_rank[i]),
                ln1p(c.tokens),
                f32::from(link == Link::Title && c.lead),
                if link == Link::Title { (shared(c.field) as f32).ln() } else { 0.0 },
            ]
        })
        .collect()
}

/// The features a learned scorer may weigh, besides `dense_z` at 1: those
/// an explanation's parts show (`score = dense_z + lexical_weight·lexical_z`
/// plus `group_lift`, `link_lift` and `hop_lift`), so that a learned score
/// still adds up from its parts. The chunk's place and the raw cosine are
/// features for fitting (`models/fit_scorer.py` tries them), not for
/// shipping: by leave-one-set-out they did not carry to a set they were not
/// fitted on. The second hop keeps its setting's weight
/// (`ScoringConfig::second_hop_weight`, which `scd serve` exposes), so `hop_z`
/// is not weighed here either.
const WEIGHABLE: [&str; 8] = [
    "lexical_z",
    "group_best",
    "link_title",
    "link_defined",
    "link_mention",
    "link_owner",
    "title_lead",
    "title_shared",
];

/// A linear scorer over [`FEATURES`] (standardized by `mean` and `std`).
#[derive(Debug, Clone, Deserialize)]
pub struct LearnedScorer {
    /// The feature names it was fitted on (must be [`FEATURES`]).
    pub features: Vec<String>,
    /// Each feature's mean and standard deviation on the training rows.
    pub mean: Vec<f32>,
    /// See `mean`.
    pub std: Vec<f32>,
    /// One weight per feature.
    pub weights: Vec<f32>,
    /// The intercept.
    pub bias: f32,
}

impl LearnedScorer {
    /// The score of a chunk with features `x`.
    pub fn logit(&self, x: &Features) -> f32 {
        let parts = x.iter().zip(&self.weights).zip(self.mean.iter().zip(&self.std));
        parts.fold(self.bias, |s, ((x, w), (m, sd))| s + w * (x - m) / sd)
    }

    /// The weight of the feature `name` (0 for a name it does not know).
    pub fn weight(&self, name: &str) -> f32 {
        FEATURES.iter().position(|f| *f == name).map_or(0.0, |k| self.weights[k])
    }

    /// Why `self` cannot be shipped: it was fitted on other features, or it
    /// weighs what an explanation cannot show (see [`WEIGHABLE`]).
    pub fn unshippable(&self) -> Option<String> {
        if self.features != FEATURES || [self.mean.len(), self.std.len(), self.weights.len()] != [FEATURES.len(); 3] {
            return Some(format!("fitted on other features: {:?}", self.features));
        }
        if self.bias != 0.0 || self.mean.iter().any(|m| *m != 0.0) || self.std.iter().any(|s| *s != 1.0) {
            return Some("standardized or biased: a shipped scorer weighs the features as they are".into());
        }
        if self.weight("dense_z") != 1.0 {
            return Some(format!("dense_z weighs {}: it sets the scale and must weigh 1", self.weight("dense_z")));
        }
        FEATURES
            .iter()
            .zip(&self.weights)
            .find(|(f, w)| **f != "dense_z" && !WEIGHABLE.contains(f) && **w != 0.0)
            .map(|(f, w)| format!("{f} weighs {w}: only {WEIGHABLE:?} may"))
    }

    /// The scorer shipped with the engine (`scorer.json`).
    pub fn shipped() -> &'static LearnedScorer {
        static SHIPPED: OnceLock<LearnedScorer> = OnceLock::new();
        SHIPPED.get_or_init(|| {
            let s: LearnedScorer = serde_json::from_str(include_str!("scorer.json"))
                .unwrap_or_else(|e| panic!("engine/src/extract/scorer.json does not parse: {e}"));
            if let Some(why) = s.unshippable() {
                panic!("engine/src/extract/scorer.json: {why}");
            }
            s
        })
    }
}

/// Scores every chunk with `scorer`, rewriting `parts` as its
/// contributions: `fused = dense_z + w·lexical_z + group_lift + link_lift +
/// hop_lift`, with `group_lift` the group's best by its weight and
/// `link_lift` the links' (title, title on a lead, shared title, at least
/// 0 together; definitions); `hop_lift` stays the second hop's, at its
/// setting's weight. The explanation's lexical weight is `scorer.weight("lexical_z")`.
pub(super) fn learned(ctx: &PreparedContext, parts: &mut Scores, scorer: &LearnedScorer) {
    let at = |name: &str| FEATURES.iter().position(|f| *f == name).expect("a known feature");
    let weigh = |names: &[&str]| -> Vec<(usize, f32)> { names.iter().map(|f| (at(f), scorer.weight(f))).collect() };
    // a named document's link never turns into a penalty, however many
    // fields share its title (the fit saw up to a few)
    let title = weigh(&["link_title", "title_lead", "title_shared"]);
    let code = weigh(&["link_defined", "link_mention", "link_owner"]);
    let (lexical, group, group_at) = (scorer.weight("lexical_z"), scorer.weight("group_best"), at("group_best"));
    for (i, x) in features(ctx, parts).iter().enumerate() {
        parts.group_lift[i] = group * x[group_at];
        let sum = |ws: &[(usize, f32)]| ws.iter().map(|&(k, w)| w * x[k]).sum::<f32>();
        parts.link_lift[i] = sum(&title).max(0.0) + sum(&code);
        let hop_lift = parts.hop_lift.get(i).copied().unwrap_or(0.0);
        parts.fused[i] =
            parts.dense_z[i] + lexical * parts.lexical_z[i] + parts.group_lift[i] + parts.link_lift[i] + hop_lift;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_scorer_matches_the_features_and_weighs_only_what_an_explanation_shows() {
        let s = LearnedScorer::shipped();
        assert_eq!(s.unshippable(), None);
        assert!(s.weights.iter().all(|v| v.is_finite()));
        // being named by the task, or matching it, is evidence, all else equal
        let at = |name: &str| FEATURES.iter().position(|f| *f == name).unwrap();
        let x = [0.0; FEATURES.len()];
        for (name, v) in [("dense_z", 2.0), ("lexical_z", 2.0), ("link_title", 1.0), ("group_best", 2.0)] {
            let mut y = x;
            y[at(name)] = v;
            assert!(s.logit(&y) > s.logit(&x), "{name}");
        }
        // what would not add up is refused, naming the feature
        let mut bad = s.clone();
        bad.weights[at("tokens")] = 0.5;
        assert!(bad.unshippable().unwrap().starts_with("tokens weighs 0.5"), "{:?}", bad.unshippable());
        let mut bad = s.clone();
        bad.weights[at("dense_z")] = 0.8;
        assert!(bad.unshippable().unwrap().starts_with("dense_z weighs 0.8"));
        let mut bad = s.clone();
        bad.features.pop();
        assert!(bad.unshippable().unwrap().starts_with("fitted on other features"));
    }

    #[test]
    fn every_chunk_has_its_features_and_the_learned_scorer_packs_within_the_budget() {
        use std::sync::Arc;

        use crate::cancel::Cancel;
        use crate::context::{Context, ContextRequirement, Field, FieldKind, Task};
        use crate::encoder::HashEncoder;
        use crate::extract::{CompressRequest, Scd, ScdConfig, Scorer, ScoringConfig};

        let field = |name: &str, content: &str| Field {
            name: name.into(),
            kind: FieldKind::Prose,
            confidential: false,
            content: content.into(),
        };
        let context = Context {
            fields: vec![
                field("Paris", "Paris is the capital of France. It lies on the Seine. The Louvre is there."),
                field("trip notes", "Lunch is at noon. We visited Paris in May. The train was late."),
                field("secret", "do not send"),
            ],
        };
        let mut req = CompressRequest {
            task: Task::new("what river runs through paris"),
            context,
            requirement: ContextRequirement::with_budget(12),
            session: None,
        };
        req.context.fields[2].confidential = true;
        let hand = Scd::new(Arc::new(HashEncoder::new(64, 512)), ScdConfig::default());
        let rows = hand.chunk_features(&req, &Cancel::new()).unwrap();
        assert_eq!(rows.len(), 6, "two prose fields of three sentences; the confidential field is not scored");
        for r in &rows {
            let text = &req.context.fields[r.field].content[r.span.0..r.span.1];
            assert!(!text.is_empty() && r.tokens > 0);
            assert!(r.features.iter().all(|v| v.is_finite()), "{:?}", r.features);
        }
        // the task names the document "Paris": its chunks, and only they, carry the title link
        let title = FEATURES.iter().position(|f| *f == "link_title").unwrap();
        assert!(rows.iter().all(|r| (r.features[title] == 1.0) == (r.field == 0)));
        // leads: each field's first sentence
        let lead = FEATURES.iter().position(|f| *f == "lead").unwrap();
        assert_eq!(rows.iter().filter(|r| r.features[lead] == 1.0).count(), 2);
        // the header a piece opens, `[name]` and its line break, in the encoder's tokens
        let enc = HashEncoder::new(64, 512);
        for r in &rows {
            let name = &req.context.fields[r.field].name;
            assert_eq!(r.header, crate::encoder::Encoder::count_tokens(&enc, &format!("[{name}]\n")).unwrap());
        }
        assert_ne!(rows[0].header, rows[3].header, "'[Paris]' and '[trip notes]' are told apart");

        let learned = Scd::new(
            Arc::new(HashEncoder::new(64, 512)),
            ScdConfig {
                scoring: ScoringConfig { scorer: Scorer::Learned, ..Default::default() },
                ..ScdConfig::default()
            },
        );
        let out = learned.compress(&req).unwrap();
        assert!(out.totals.sent_tokens <= 12 && !out.chunks.is_empty());
        assert!(out.chunks.iter().all(|c| !c.text.contains("do not send")));
    }

    #[test]
    fn a_title_many_fields_share_lifts_less_but_never_below_nothing() {
        use std::sync::Arc;

        use crate::cancel::Cancel;
        use crate::context::{Field, FieldKind};
        use crate::encoder::{HashEncoder, InputKind};
        use crate::extract::{Scd, ScdConfig};

        let s = LearnedScorer::shipped();
        assert!(s.weight("title_shared") < 0.0, "the fit found shared titles worth less");
        let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), ScdConfig::default());
        // "notes (1)" .. "notes (k)" all carry the title "notes", which the task names
        let fields = |k: usize| -> Vec<Field> {
            (1..=k)
                .map(|n| Field {
                    name: format!("notes ({n})"),
                    kind: FieldKind::Prose,
                    confidential: false,
                    content: format!("Entry {n} opens here. Lunch moved to room {n}. The printer is out of paper."),
                })
                .chain(std::iter::once(Field {
                    name: "weather".into(),
                    kind: FieldKind::Prose,
                    confidential: false,
                    content: "Rain until noon. Sun after.".into(),
                }))
                .collect()
        };
        let query = "what do the notes say about lunch";
        let lifts = |k: usize| {
            let fs = fields(k);
            let refs: Vec<&Field> = fs.iter().collect();
            let ctx = scd.prepare(&refs, &Cancel::new()).unwrap();
            let qv = scd.embed_cached(&[query], InputKind::Query).unwrap().remove(0);
            let mut parts = scd.score(&ctx, &qv, query);
            learned(&ctx, &mut parts, s);
            let lead = |want: bool| {
                (0..ctx.chunks.len())
                    .filter(|&i| ctx.chunks[i].field < k && ctx.chunks[i].lead == want)
                    .map(|i| parts.link_lift[i])
                    .fold(f32::NAN, f32::max)
            };
            for i in 0..ctx.chunks.len() {
                let sum = parts.dense_z[i]
                    + s.weight("lexical_z") * parts.lexical_z[i]
                    + parts.group_lift[i]
                    + parts.link_lift[i]
                    + parts.hop_lift.get(i).copied().unwrap_or(0.0);
                assert!((sum - parts.fused[i]).abs() < 1e-5, "the parts add up");
                assert!(parts.link_lift[i] >= 0.0, "a named title is never a penalty: {}", parts.link_lift[i]);
            }
            (lead(true), lead(false))
        };
        let (lead1, rest1) = lifts(1);
        let (lead2, rest2) = lifts(2);
        let (lead8, rest8) = lifts(8);
        assert!(lead1 > lead2 && lead2 > lead8 && lead8 > 0.0, "{lead1} {lead2} {lead8}");
        assert!(rest1 > rest2 && rest2 > 0.0, "{rest1} {rest2}");
        assert_eq!(rest8, 0.0, "shared by 8: the sentence keeps no lift, and loses none");
    }

    #[test]
    fn ranks_are_zero_for_the_best() {
        assert_eq!(ranks(&[0.1, 0.9, 0.5]), [2, 0, 1]);
    }
}
