//! The second stage: the first stage's best chunks read with the task (or
//! a follow-up's question) by the cross-encoder ([`crate::rerank`]), its
//! logits z-scored among them and added, weighted, to their scores.
//!
//! It reads chunks of the kinds its model learned from (questions over
//! prose, a doc comment's sentence over code: `models/rerank/SOURCE.md`):
//! prose, Markdown and code. Log lines, JSON, chat turns and tables keep
//! their first-stage scores.

use super::parts::Scores;
use super::prepare::PreparedContext;
use super::Scd;
use crate::cancel::Cancel;
use crate::context::FieldKind;
use crate::score::zscores;
use crate::{Error, Result};

impl Scd {
    /// Adds the second stage to `parts`: of the chunks `eligible` admits,
    /// the `rerank_top` best by `parts.fused` gain `rerank_weight` × the
    /// z-score of their logits among them, recorded in `rerank_lift`. A
    /// candidate never falls to or below the best chunk outside them, so
    /// the stage reorders the top and nothing else. Nothing happens (every
    /// score stays as it was, bit for bit) without a reranker, with a
    /// weight of 0 or `rerank_top` 0.
    pub(super) fn rerank(
        &self,
        ctx: &PreparedContext,
        query: &str,
        parts: &mut Scores,
        eligible: &dyn Fn(usize) -> bool,
        cancel: &Cancel,
    ) -> Result<()> {
        let (w, top) = (self.cfg.scoring.rerank_weight, self.cfg.scoring.rerank_top);
        let Some(model) = self.reranker.as_ref() else { return Ok(()) };
        if w == 0.0 || top == 0 || parts.fused.is_empty() {
            return Ok(());
        }
        let scores = &parts.fused;
        let mut order: Vec<usize> = (0..scores.len()).filter(|&i| eligible(i)).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let mut readable = order.into_iter().filter(|&i| reads_kind(ctx.field_kinds[ctx.chunks[i].field]));
        let cand: Vec<usize> = readable.by_ref().take(top).collect();
        if cand.is_empty() {
            return Ok(());
        }
        // the best chunk it could have read outside the candidates (the next
        // readable one in score order): a kind it does not read may outscore
        // them and is no floor (the clamp below would lift every candidate
        // over it)
        let floor = readable.next().map_or(f32::NEG_INFINITY, |i| scores[i]);
        let passages: Vec<String> =
            cand.iter().map(|&i| model.passage(&ctx.field_names[ctx.chunks[i].field], &ctx.chunks[i].text)).collect();
        let pairs: Vec<(&str, &str)> = passages.iter().map(|p| (query, p.as_str())).collect();
        cancel.check("rerank")?;
        let logits = model.score(&pairs, cancel)?;
        if logits.len() != pairs.len() {
            let reason = format!("{} scores for {} pairs", logits.len(), pairs.len());
            return Err(Error::ModelShape { path: model.model_id().into(), reason });
        }
        if logits.iter().any(|x| !x.is_finite()) {
            tracing::warn!(model = model.model_id(), "the reranker gave a non-finite score; second stage skipped");
            return Ok(());
        }
        parts.rerank_lift = vec![0.0; parts.fused.len()];
        for (&i, z) in cand.iter().zip(zscores(&logits)) {
            let old = parts.fused[i];
            let mut lift = w * z;
            if old + lift <= floor {
                lift = floor - old;
                while old + lift <= floor {
                    lift = lift.next_up();
                }
            }
            parts.fused[i] = old + lift;
            parts.rerank_lift[i] = lift;
        }
        Ok(())
    }
}

/// Whether the second stage reads chunks of fields of `kind`: the kinds
/// its model was trained on.
fn reads_kind(kind: FieldKind) -> bool {
    matches!(kind, FieldKind::Prose | FieldKind::Markdown | FieldKind::Code)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use crate::cancel::Cancel;
    use crate::context::{Context, ContextRequirement, Field, FieldKind, Task};
    use crate::encoder::{HashEncoder, InputKind};
    use crate::extract::parts::Scores;
    use crate::extract::prepare::PreparedContext;
    use crate::extract::{CompressOptions, CompressRequest, Scd, ScdConfig, ScoringConfig};
    use crate::rerank::CrossEncoder;
    use crate::Result;

    /// Prefers short passages (the logit is minus the length), whatever the
    /// query: the opposite of what the first stage does here.
    #[derive(Debug, Default)]
    struct Short {
        pairs: AtomicUsize,
        /// Every pair read, in order.
        seen: std::sync::Mutex<Vec<(String, String)>>,
    }

    impl CrossEncoder for Short {
        fn model_id(&self) -> &str {
            "short"
        }
        fn passage(&self, field: &str, text: &str) -> String {
            format!("{field}\n{text}")
        }
        fn score(&self, pairs: &[(&str, &str)], _: &Cancel) -> Result<Vec<f32>> {
            self.pairs.fetch_add(pairs.len(), Ordering::Relaxed);
            let mut seen = self.seen.lock().unwrap();
            seen.extend(pairs.iter().map(|(q, p)| (q.to_string(), p.to_string())));
            Ok(pairs.iter().map(|(_, p)| -(p.len() as f32)).collect())
        }
    }

    const QUERY: &str = "why did the payment service time out at checkout";

    fn fields() -> Vec<Field> {
        let mut text = String::new();
        for i in 0..30 {
            let pad = "and the checkout payment retried ".repeat(i % 5);
            text.push_str(&format!("The payment service {pad}timed out at checkout number {i}.\n\n"));
        }
        let other = "The office plants need water. The ficus is by the window. Lunch is at noon.";
        vec![
            Field { name: "log".into(), kind: FieldKind::Prose, confidential: false, content: text },
            Field { name: "plants".into(), kind: FieldKind::Prose, confidential: false, content: other.into() },
        ]
    }

    fn engine(weight: f32, top: usize, model: Option<Arc<Short>>) -> Scd {
        let scoring = ScoringConfig { rerank_weight: weight, rerank_top: top, ..Default::default() };
        let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), ScdConfig { scoring, ..Default::default() });
        scd.with_reranker(model.map(|m| m as Arc<dyn CrossEncoder>))
    }

    /// `fields` prepared, then the first stage's parts and the second
    /// stage's, for `QUERY`.
    fn both_stages(
        scd: &Scd,
        fields: &[Field],
        eligible: &dyn Fn(usize) -> bool,
    ) -> (Arc<PreparedContext>, Scores, Scores) {
        let refs: Vec<&Field> = fields.iter().collect();
        let ctx = scd.prepare(&refs, &Cancel::new()).unwrap();
        let qv = scd.embed_cached(&[QUERY], InputKind::Query).unwrap().remove(0);
        let mut first = scd.score(&ctx, &qv, QUERY);
        scd.rescore(&ctx, QUERY, &mut first);
        let mut second = first.clone();
        scd.rerank(&ctx, QUERY, &mut second, eligible, &Cancel::new()).unwrap();
        (ctx, first, second)
    }

    fn ranking(s: &[f32]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..s.len()).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
        order
    }

    #[test]
    fn the_second_stage_reorders_the_top_and_nothing_else() {
        let model = Arc::new(Short::default());
        let top = 6;
        let scd = engine(3.0, top, Some(model.clone()));
        let (_, first, second) = both_stages(&scd, &fields(), &|_| true);
        assert_eq!(model.pairs.load(Ordering::Relaxed), top, "only the top pairs are read");
        let (before, after) = (ranking(&first.fused), ranking(&second.fused));
        assert!(before.len() > 2 * top);
        let set = |r: &[usize]| {
            let mut v = r[..top].to_vec();
            v.sort_unstable();
            v
        };
        assert_eq!(set(&before), set(&after), "the same chunks make the top");
        assert_ne!(before[..top], after[..top], "and they are in another order");
        assert_eq!(before[top..], after[top..], "the rest keep their order");
        for i in 0..first.fused.len() {
            let lift = second.rerank_lift[i];
            assert_eq!(second.fused[i], first.fused[i] + lift, "chunk {i}: the lift is what was added");
            assert_eq!(lift != 0.0, before[..top].contains(&i), "chunk {i}: only candidates are lifted");
        }
    }

    #[test]
    fn log_json_and_chat_chunks_keep_their_first_stage_score() {
        let model = Arc::new(Short::default());
        let scd = engine(3.0, 6, Some(model.clone()));
        let mut fields = fields();
        let log: String = (0..20).map(|i| format!("ERROR payment service timed out at checkout {i}\n")).collect();
        let chat: String = (0..10).map(|i| format!("ana: did the checkout payment time out {i}?\n")).collect();
        fields.push(Field { name: "app.log".into(), kind: FieldKind::Log, confidential: false, content: log });
        fields.push(Field { name: "thread".into(), kind: FieldKind::Chat, confidential: false, content: chat });
        let json = r#"{"payment": {"status": "timeout", "at": "checkout"}}"#.to_string();
        fields.push(Field { name: "p.json".into(), kind: FieldKind::Json, confidential: false, content: json });
        let (ctx, first, second) = both_stages(&scd, &fields, &|_| true);
        let kinds: Vec<FieldKind> = ctx.chunks.iter().map(|c| fields[c.field].kind).collect();
        assert!(kinds.contains(&FieldKind::Log) && kinds.contains(&FieldKind::Chat));
        let mut read = 0;
        for (i, k) in kinds.iter().enumerate() {
            if matches!(k, FieldKind::Log | FieldKind::Chat | FieldKind::Json) {
                assert_eq!(second.fused[i], first.fused[i], "chunk {i} ({k:?}) is not read");
                assert_eq!(second.rerank_lift[i], 0.0);
            } else if second.rerank_lift[i] != 0.0 {
                read += 1;
            }
        }
        assert_eq!(read, 6, "the top prose chunks are read instead");
        assert_eq!(model.pairs.load(Ordering::Relaxed), 6);
        // a small weight moves a read chunk past an unread one only by its
        // small lift, never by the floor's clamp
        let small = engine(0.01, 6, Some(Arc::new(Short::default())));
        let mut low = first.clone();
        small.rerank(&ctx, QUERY, &mut low, &|_| true, &Cancel::new()).unwrap();
        for (i, ki) in kinds.iter().enumerate() {
            for (j, kj) in kinds.iter().enumerate() {
                let unread = matches!(kj, FieldKind::Log | FieldKind::Chat | FieldKind::Json);
                if matches!(ki, FieldKind::Prose) && unread && first.fused[j] - first.fused[i] > 0.1 {
                    assert!(low.fused[i] < low.fused[j], "chunk {i} jumped over the unread chunk {j}");
                }
            }
        }
    }

    #[test]
    fn a_weight_of_zero_leaves_every_score_as_without_a_reranker() {
        let model = Arc::new(Short::default());
        let (_, plain, _) = both_stages(&engine(0.0, 24, None), &fields(), &|_| true);
        let (_, first, second) = both_stages(&engine(0.0, 24, Some(model.clone())), &fields(), &|_| true);
        assert_eq!(model.pairs.load(Ordering::Relaxed), 0, "the model is not called");
        let bits = |s: &Scores| s.fused.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&plain), bits(&second));
        assert_eq!(first, second);
        assert!(second.rerank_lift.is_empty());
        // and through a whole compression, explanation included
        let req = CompressRequest {
            task: Task::new(QUERY),
            context: Context { fields: fields() },
            requirement: ContextRequirement::with_budget(60),
            session: None,
        };
        let opts = CompressOptions { explain: true, ..Default::default() };
        let a = engine(0.0, 24, None).compress_opts(&req, &opts, &Cancel::new()).unwrap();
        let b = engine(0.0, 24, Some(model)).compress_opts(&req, &opts, &Cancel::new()).unwrap();
        assert_eq!((a.chunks, a.explanation), (b.chunks, b.explanation));
    }

    #[test]
    fn a_compression_shows_the_lift_and_a_follow_up_skips_what_was_sent() {
        let model = Arc::new(Short::default());
        let scd = engine(2.0, 4, Some(model.clone()));
        // an ineligible chunk (a follow-up's already sent one) keeps its score
        let (_, first, second) = both_stages(&scd, &fields(), &|i| i != 0);
        assert_eq!(second.fused[0], first.fused[0]);
        assert_eq!(second.rerank_lift[0], 0.0);
        assert_eq!(second.rerank_lift.iter().filter(|l| **l != 0.0).count(), 4);
        let req = CompressRequest {
            task: Task::new(QUERY),
            context: Context { fields: fields() },
            requirement: ContextRequirement::with_budget(60),
            session: None,
        };
        let opts = CompressOptions { explain: true, ..Default::default() };
        let out = scd.compress_opts(&req, &opts, &Cancel::new()).unwrap();
        let ex = out.explanation.unwrap();
        assert!(ex.selected.iter().any(|w| w.rerank_lift != 0.0), "{:?}", ex.selected);
        for w in &ex.selected {
            let sum = w.dense_z + ex.lexical_weight * w.lexical_z + w.group_lift + w.link_lift + w.hop_lift;
            assert!((sum + w.rerank_lift - w.score).abs() < 1e-4, "{}: the parts add up", w.id);
        }
    }

    #[test]
    fn a_follow_up_reads_its_question_with_chunks_not_yet_sent() {
        let model = Arc::new(Short::default());
        let scd = engine(2.0, 4, Some(model.clone()));
        let req = CompressRequest {
            task: Task::new(QUERY),
            context: Context { fields: fields() },
            requirement: ContextRequirement::with_budget(40),
            session: Some(crate::extract::SessionRequest::default()),
        };
        let out = scd.compress(&req).unwrap();
        let grant = out.session.unwrap();
        let opened = model.seen.lock().unwrap().len();
        assert_eq!(opened, 4);
        let question = "what about the office plants";
        let more = scd
            .request_more(&crate::extract::ContextRequest {
                session_id: grant.id.clone(),
                session_token: grant.token.clone(),
                specific_question: question.into(),
                current_confidence: 0.2,
                ..Default::default()
            })
            .unwrap();
        let seen = model.seen.lock().unwrap()[opened..].to_vec();
        assert_eq!(seen.len(), 4, "the follow-up reranks too");
        let sent: Vec<String> = out.chunks.iter().map(|c| format!("{}\n{}", c.field, c.text)).collect();
        for (q, p) in &seen {
            assert_eq!(q, question);
            assert!(!sent.contains(p), "{p:?} was sent already");
        }
        assert!(!more.chunks.is_empty());
    }
}
