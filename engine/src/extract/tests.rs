//! Budget tokenizers and explanations across prepare, score, pack and assemble.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::budget::{builtin, TokenizerRegistry};
use crate::context::{Field, FieldKind};
use crate::encoder::HashEncoder;
use crate::session::SessionGrant;

fn scd() -> Scd {
    Scd::new(Arc::new(HashEncoder::new(128, 512)), ScdConfig::default())
}

/// An engine on the hash encoder with `cfg`.
pub(super) fn hash_scd(cfg: ScdConfig) -> Scd {
    Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg)
}

/// An engine on the hash encoder with `scoring`.
pub(super) fn scd_scoring(scoring: ScoringConfig) -> Scd {
    hash_scd(ScdConfig { scoring, ..ScdConfig::default() })
}

/// `task` over `context` under `budget` (no session), explained, counted
/// in cl100k; the text is within the budget.
pub(super) fn compress_within(scd: &Scd, task: &str, context: Context, budget: usize) -> Compressed {
    let req = CompressRequest {
        task: Task::new(task),
        context,
        requirement: ContextRequirement::with_budget(budget),
        session: None,
    };
    let out = scd.compress_opts(&req, &opts("cl100k", true), &Cancel::new()).unwrap();
    assert!(out.totals.sent_tokens <= budget, "{:?}", out.totals);
    out
}

pub(super) fn prose(name: &str, content: &str) -> Field {
    Field { name: name.into(), kind: FieldKind::Prose, confidential: false, content: content.into() }
}

fn context() -> Context {
    Context {
        fields: vec![
            prose(
                "payments",
                "The payment service timed out at checkout. Charges failed because the database pool was \
                 exhausted. The pool size is 10 connections. Retries made the outage worse.\n\nThe payment service \
                 timed out at checkout.",
            ),
            prose("plants", "The office plants need water. The ficus is by the window. Nobody waters the cactus."),
            prose("copy", "The payment service timed out at checkout. Lunch is at noon on Fridays."),
            Field {
                name: "api_keys".into(),
                kind: FieldKind::Prose,
                confidential: true,
                content: "sk_live_SECRET_4242".into(),
            },
        ],
    }
}

fn request(task: &str, budget: usize) -> CompressRequest {
    CompressRequest {
        task: Task::new(task),
        context: context(),
        requirement: ContextRequirement::with_budget(budget),
        session: None,
    }
}

pub(super) fn opts(tokenizer: &str, explain: bool) -> CompressOptions {
    CompressOptions { budget_tokenizer: TokenizerRegistry::new().resolve(tokenizer).unwrap(), explain, envelope: None }
}

/// A rate's budget is that share of the shareable fields' tokens (the
/// confidential one counts for nothing), in the tokenizer named or the
/// encoder's own; the compression it asks for reports 1 / rate.
#[test]
fn a_rate_keeps_that_share_of_the_shareable_tokens() {
    let scd = scd();
    let shareable = |count: &dyn Fn(&str) -> usize| -> usize {
        context().fields.iter().filter(|f| !f.confidential).map(|f| count(&f.content)).sum()
    };
    let cl100k = builtin("cl100k").unwrap();
    let c = shareable(&|t| cl100k.count(t).unwrap());
    let e5 = shareable(&|t| scd.encoder().count_tokens(t).unwrap());
    assert!(c > 20 && e5 > 20, "{c} {e5}");
    assert_eq!(scd.rate_budget(&context(), Some(&cl100k), 0.25).unwrap(), c / 4);
    assert_eq!(scd.rate_budget(&context(), None, 0.5).unwrap(), e5 / 2);
    assert_eq!(scd.rate_budget(&context(), Some(&cl100k), 1.0).unwrap(), c);
    assert_eq!(scd.rate_budget(&context(), Some(&cl100k), 1e-9).unwrap(), 1);
    let budget = scd.rate_budget(&context(), Some(&cl100k), 0.25).unwrap();
    let out =
        scd.compress_opts(&request("why did charges fail at checkout", budget), &opts("cl100k", false), &Cancel::new());
    let out = out.unwrap();
    assert!((out.totals.requested_ratio - c as f32 / budget as f32).abs() < 1e-4, "{:?}", out.totals);
    assert!(out.totals.sent_tokens <= budget && out.totals.sent_tokens > 0, "{:?}", out.totals);
    // never more than the server's largest budget
    let small = Scd::new(
        Arc::new(HashEncoder::new(128, 512)),
        ScdConfig { limits: RequestLimits { max_budget_tokens: 5, ..Default::default() }, ..ScdConfig::default() },
    );
    assert_eq!(small.rate_budget(&context(), Some(&cl100k), 1.0).unwrap(), 5);
}

#[test]
fn the_sent_text_never_counts_more_than_the_budget_in_the_chosen_tokenizer() {
    let scd = scd();
    for name in ["o200k", "cl100k"] {
        let t = builtin(name).unwrap();
        for budget in [1, 3, 8, 12, 20, 33, 50, 80, 400] {
            let out = scd.compress_opts(
                &request("why did charges fail at checkout", budget),
                &opts(name, false),
                &Cancel::new(),
            );
            let out = out.unwrap();
            let n = t.count(&out.sent_text()).unwrap();
            assert!(n <= budget, "{name} budget {budget}: sent {n}");
            assert_eq!(out.totals.sent_tokens, n);
            assert_eq!(out.totals.tokenizer, name);
            let context: usize =
                context().fields.iter().filter(|f| !f.confidential).map(|f| t.count(&f.content).unwrap()).sum();
            assert_eq!(out.totals.context_tokens, context);
            assert!((out.totals.requested_ratio - context as f32 / budget as f32).abs() < 1e-4);
            if n > 0 {
                assert!((out.totals.reduction_ratio - context as f32 / n as f32).abs() < 1e-4);
            }
            for c in out.chunks.iter() {
                assert_eq!(c.tokens, t.count(&c.text).unwrap(), "{}", c.id);
            }
            for d in &out.dropped {
                assert_ne!(d.field, "api_keys");
            }
        }
    }
    // the default counts in the encoder's tokenizer, the text whole (its
    // headers too)
    let out = scd.compress(&request("why did charges fail", 20)).unwrap();
    assert_eq!(out.totals.tokenizer, "e5");
    assert_eq!(out.totals.sent_tokens, scd.encoder().count_tokens(&out.text).unwrap());
    assert!(out.totals.sent_tokens <= 20 && out.text.starts_with('['), "{}", out.text);
    assert!(out.explanation.is_none());
}

#[test]
fn required_fields_over_the_budget_in_the_chosen_tokenizer_are_refused() {
    let mut req = request("why did charges fail", 5);
    req.requirement.required_fields = vec!["payments".into()];
    let e = scd().compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap_err().to_string();
    assert!(e.starts_with("required fields need ") && e.ends_with("over the budget of 5"), "{e}");
}

pub(super) fn follow_up(grant: &SessionGrant, question: &str, max_tokens: Option<usize>) -> ContextRequest {
    ContextRequest {
        session_id: grant.id.clone(),
        session_token: grant.token.clone(),
        specific_question: question.into(),
        current_confidence: 0.2,
        max_tokens,
        ..Default::default()
    }
}

#[test]
fn a_session_total_bounds_every_reply_counted_in_the_sessions_tokenizer() {
    let scd = scd();
    let t = builtin("o200k").unwrap();
    let mut req = request("why did charges fail at checkout", 20);
    req.session = Some(SessionRequest { max_total_tokens: Some(20), ..Default::default() });
    let out = scd.compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap();
    let grant = out.session.clone().unwrap();
    let first = out.totals.sent_tokens;
    let more = scd.request_more(&follow_up(&grant, "what about the office plants", None)).unwrap();
    for c in &more.chunks {
        assert_eq!(c.tokens, t.count(&c.text).unwrap());
    }
    let added = t.count(&more.text).unwrap();
    assert_eq!(more.sent_tokens, added);
    assert!(first + added <= 20, "{first} + {added}");
    assert_eq!(more.budget, 20 - first);
    assert_eq!((more.session_sent_tokens, more.remaining_tokens), (first + added, 20 - first - added));
}

#[test]
fn a_retry_naming_the_same_request_id_gets_the_same_reply_and_spends_nothing() {
    let scd = scd();
    let mut req = request("why did charges fail at checkout", 12);
    req.session = Some(SessionRequest::default());
    let grant = scd.compress(&req).unwrap().session.unwrap();
    let ask = |id: &str, q: &str| {
        let mut r = follow_up(&grant, q, Some(12));
        r.request_id = Some(id.into());
        scd.request_more(&r).unwrap()
    };
    let first = ask("r-1", "what about the office plants");
    assert!(!first.chunks.is_empty());
    let again = ask("r-1", "a retry sends the same question; this text is not read");
    assert_eq!(again.text, first.text);
    assert_eq!(
        again.chunks.iter().map(|c| &c.id).collect::<Vec<_>>(),
        first.chunks.iter().map(|c| &c.id).collect::<Vec<_>>()
    );
    assert_eq!((again.sent_tokens, again.session_sent_tokens), (first.sent_tokens, first.session_sent_tokens));
    // a new id is a new request: new chunks, counted
    let next = ask("r-2", "what about the office plants");
    assert!(next.chunks.iter().all(|c| first.chunks.iter().all(|f| f.id != c.id)));
    assert_eq!(next.session_sent_tokens, first.session_sent_tokens + next.sent_tokens);
    let mut bad = follow_up(&grant, "x", None);
    bad.request_id = Some("has a space".into());
    let e = scd.request_more(&bad).unwrap_err().to_string();
    assert!(e.starts_with("request_id: "), "{e}");
}

#[test]
fn a_follow_up_has_its_own_budget_and_is_scored_on_its_own_question() {
    let scd = scd();
    let t = builtin("o200k").unwrap();
    let mut req = request("why did charges fail at checkout", 20);
    req.session = Some(SessionRequest::default());
    let out = scd.compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap();
    let grant = out.session.clone().unwrap();
    let first = out.totals.sent_tokens;
    assert!(first > 12, "the first answer used most of its budget: {first}");
    assert!(!out.text.contains("plants"), "{}", out.text);
    // the first answer took the budget; the follow-up still gets its own
    let more = scd.request_more(&follow_up(&grant, "which office plants need water", Some(12))).unwrap();
    assert!(more.text.contains("plants need water"), "the next hop, not the task again: {:?}", more.text);
    assert!(t.count(&more.text).unwrap() <= 12 && more.sent_tokens <= 12, "{more:?}");
    assert_eq!(more.budget, 12);
    assert_eq!(more.session_sent_tokens, first + more.sent_tokens);
    // by default a follow-up's budget is the opening answer's
    assert_eq!(more.remaining_tokens, 20);
    let again = scd.request_more(&follow_up(&grant, "which office plants need water", None)).unwrap();
    let before: Vec<&str> = out.chunks.iter().chain(&more.chunks).map(|c| c.id.as_str()).collect();
    assert!(again.chunks.iter().all(|c| !before.contains(&c.id.as_str())), "resent: {again:?}");
    let e = scd.request_more(&follow_up(&grant, "x", Some(0))).unwrap_err().to_string();
    assert!(e.starts_with("max_tokens: must be at least 1"), "{e}");
    let over = scd.config().limits.max_budget_tokens + 1;
    let e = scd.request_more(&follow_up(&grant, "x", Some(over))).unwrap_err().to_string();
    assert_eq!(e, format!("max_tokens: {over} is over the limit {} of one budget", over - 1));
}

#[test]
fn a_later_compress_in_the_session_never_resends_and_a_reserve_holds_headroom() {
    let scd = scd();
    let mut req = request("why did charges fail at checkout", 40);
    req.session = Some(SessionRequest { reserve_tokens: 25, ..Default::default() });
    let out = scd.compress(&req).unwrap();
    assert!(out.totals.sent_tokens <= 15, "the reserve is held back: {:?}", out.totals);
    let grant = out.session.clone().unwrap();
    // the session's total is the budget: a bigger follow-up compress gets what the reserve left
    req.session =
        Some(SessionRequest { id: Some(grant.id.clone()), token: Some(grant.token.clone()), ..Default::default() });
    req.requirement = ContextRequirement::with_budget(400);
    let later = scd.compress(&req).unwrap();
    let first: Vec<&str> = out.chunks.iter().map(|c| c.id.as_str()).collect();
    assert!(!later.chunks.is_empty());
    assert!(later.chunks.iter().all(|c| !first.contains(&c.id.as_str())), "resent: {first:?} {:?}", later.chunks);
    assert!(later.dropped.iter().all(|d| !first.contains(&d.id.as_str())), "sent chunks listed as dropped");
    assert!(out.totals.sent_tokens + later.totals.sent_tokens <= 40, "{:?} {:?}", out.totals, later.totals);
    assert!(later.warnings.iter().any(|w| w.contains("session's total leaves")), "{:?}", later.warnings);
    // an opening answer never sends more than the session's total
    req.session = Some(SessionRequest { max_total_tokens: Some(9), ..Default::default() });
    let capped = scd.compress(&req).unwrap();
    assert!(capped.totals.sent_tokens <= 9, "{:?}", capped.totals);
    req.session = Some(SessionRequest { reserve_tokens: 400, ..Default::default() });
    let e = scd.compress(&req.clone()).map(|_| ()).unwrap_err().to_string();
    assert!(e.starts_with("reserve_tokens: 400 is not below the budget 400"), "{e}");
}

#[test]
fn the_explanation_adds_up_and_follows_the_packing() {
    // closure of whole paragraphs and the second hop off: closure brings only
    // leads, and the copy ranks after the sentence it copies
    let cfg = ScdConfig {
        scoring: ScoringConfig { group_closure_tokens: 0, second_hop_weight: 0.0, ..Default::default() },
        ..ScdConfig::default()
    };
    let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg);
    let mut req = request("why did the payment service time out at checkout", 30);
    req.requirement.optional_fields = vec!["payments".into(), "copy".into()];
    let out = scd.compress_opts(&req, &opts("", true), &Cancel::new()).unwrap();
    let ex = out.explanation.as_ref().unwrap();
    assert_eq!(ex.selected.len(), out.chunks.len());
    for (w, c) in ex.selected.iter().zip(&out.chunks) {
        assert_eq!(w.id, c.id);
        assert_eq!(w.score, c.score);
        let sum = w.dense_z + ex.lexical_weight * w.lexical_z + w.group_lift + w.link_lift + w.hop_lift;
        assert_eq!(sum, w.score, "{}", w.id);
        assert_eq!(w.chunker.as_deref(), Some("prose"), "{}: the chunker that cut it", w.id);
    }
    // orders are 1..=n; by score except leads brought by closure
    let mut by_order: Vec<&ChunkWhy> = ex.selected.iter().collect();
    by_order.sort_by_key(|w| w.order);
    assert!(by_order.iter().enumerate().all(|(k, w)| w.order == k + 1));
    let ranked: Vec<&&ChunkWhy> = by_order.iter().filter(|w| !w.by_closure && !w.required).collect();
    assert!(ranked.windows(2).all(|p| p[0].score >= p[1].score), "{ranked:?}");
    assert!(by_order.iter().filter(|w| w.by_closure).all(|w| w.lead));
    // the copied sentence names the chunk it duplicates; plants are not eligible
    let dup = ex.dropped.iter().find(|d| d.id == "payments#4").expect("payments#4 dropped");
    assert_eq!(dup.reason, DropReason::NearDuplicate { of: "payments#0".into() });
    assert!(out.chunks.iter().any(|c| c.id == "payments#0"));
    assert!(ex.dropped.iter().filter(|d| d.id.starts_with("plants#")).all(|d| d.reason == DropReason::NotEligible));
    assert!(ex.dropped.iter().any(|d| d.reason == DropReason::OutOfBudget), "{:?}", ex.dropped);
    assert!(ex.dropped.windows(2).all(|p| p[0].score >= p[1].score));
    assert!(!ex.dropped.iter().any(|d| d.id.starts_with("api_keys")));
}

#[test]
fn thresholds_are_named_in_the_drop_reason() {
    let scd = scd();
    let mut req = request("why did the payment service time out", 400);
    req.requirement.min_relative_score = Some(0.5);
    let out = scd.compress_opts(&req, &opts("o200k", true), &Cancel::new()).unwrap();
    let ex = out.explanation.unwrap();
    let below: Vec<&DropWhy> = ex
        .dropped
        .iter()
        .filter(|d| matches!(d.reason, DropReason::BelowThreshold { threshold: "min_relative_score", .. }))
        .collect();
    assert!(!below.is_empty(), "{:?}", ex.dropped);
    let json = serde_json::to_value(below[0]).unwrap();
    assert_eq!(json["reason"], "below_threshold");
    assert_eq!(json["threshold"], "min_relative_score");
    req.requirement.min_relative_score = None;
    req.requirement.relevance_threshold = Some(0.99);
    let ex = scd.compress_opts(&req, &opts("", true), &Cancel::new()).unwrap().explanation.unwrap();
    assert!(ex
        .dropped
        .iter()
        .all(|d| matches!(d.reason, DropReason::BelowThreshold { threshold: "relevance_threshold", .. })));
}

#[test]
fn a_container_header_is_sent_only_with_one_of_its_methods() {
    let scd = scd();
    let code = "use std::fmt;\n\n/// A ledger of rows.\npub struct Ledger {\n    rows: Vec<u64>,\n}\n\nimpl Ledger {\n    \
                /// Sums the rows.\n    pub fn total(&self) -> u64 {\n        self.rows.iter().sum()\n    }\n\n    \
                /// Prints the ledger in padded columns.\n    pub fn print_columns(&self) {\n        for r in &self.rows \
                {\n            println!(\"{r:>12}\");\n        }\n    }\n}\n";
    let field = Field { name: "ledger.rs".into(), kind: FieldKind::Code, confidential: false, content: code.into() };
    let mut seen_alone_dropped = false;
    let mut seen_with_member = false;
    for budget in 1..=80 {
        let req = CompressRequest {
            // names the type, so its impl header gets a definition link
            task: Task::new("the Ledger total"),
            context: Context { fields: vec![field.clone()] },
            requirement: ContextRequirement::with_budget(budget),
            session: None,
        };
        let out = match scd.compress_opts(&req, &opts("", true), &Cancel::new()) {
            Ok(out) => out,
            Err(Error::BudgetTooSmall { .. }) => continue,
            Err(e) => panic!("budget {budget}: {e}"),
        };
        let texts: Vec<&str> = out.chunks.iter().map(|c| c.text.as_str()).collect();
        let header = texts.iter().any(|t| t.starts_with("impl Ledger"));
        let closing = texts.contains(&"}");
        let member = texts.iter().any(|t| t.contains("pub fn total") || t.contains("pub fn print_columns"));
        assert!(!(header || closing) || member, "budget {budget}: structure sent alone: {texts:?}");
        seen_with_member |= header && member;
        let ex = out.explanation.unwrap();
        let dropped_header = ex.dropped.iter().find(|d| d.tokens > 0 && d.id == "ledger.rs#2");
        if let Some(d) = dropped_header {
            if d.reason == DropReason::StructureOnly {
                seen_alone_dropped = true;
            }
        }
    }
    assert!(seen_with_member, "the header never came with its method");
    assert!(seen_alone_dropped, "no budget dropped the header as structure only");
}

/// A shared store in memory: two engines on it are two replicas. `race`
/// makes the next commits lose to a concurrent one (another replica's
/// write landing first), as many times as it holds.
#[derive(Debug, Default)]
struct MemStore {
    sessions: std::sync::Mutex<HashMap<String, (Vec<u8>, u64)>>,
    contexts: std::sync::Mutex<HashMap<String, Vec<u8>>>,
    race: std::sync::atomic::AtomicUsize,
}

impl crate::shared::SharedState for MemStore {
    fn name(&self) -> &str {
        "memory"
    }
    fn open(
        &self,
        key: &str,
        _scope: Option<&str>,
        _weight: u64,
        record: &[u8],
        context: (&str, &[u8]),
        _limits: &SessionLimits,
    ) -> std::result::Result<crate::shared::Opened, crate::shared::StoreError> {
        self.contexts.lock().unwrap().entry(context.0.into()).or_insert_with(|| context.1.to_vec());
        let mut s = self.sessions.lock().unwrap();
        if s.contains_key(key) {
            return Ok(crate::shared::Opened::Taken);
        }
        s.insert(key.into(), (record.to_vec(), 1));
        Ok(crate::shared::Opened::Fresh)
    }
    fn load(
        &self,
        key: &str,
        _: &SessionLimits,
    ) -> std::result::Result<crate::shared::Loaded, crate::shared::StoreError> {
        Ok(match self.sessions.lock().unwrap().get(key) {
            Some((r, v)) => crate::shared::Loaded::Live { record: r.clone(), version: *v },
            None => crate::shared::Loaded::Unknown,
        })
    }
    fn commit(
        &self,
        key: &str,
        version: u64,
        record: &[u8],
        _: &SessionLimits,
    ) -> std::result::Result<crate::shared::Committed, crate::shared::StoreError> {
        let mut s = self.sessions.lock().unwrap();
        let Some(entry) = s.get_mut(key) else { return Ok(crate::shared::Committed::Gone(None)) };
        if self.race.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            self.race.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            entry.1 += 1;
            return Ok(crate::shared::Committed::Conflict);
        }
        if entry.1 != version {
            return Ok(crate::shared::Committed::Conflict);
        }
        *entry = (record.to_vec(), version + 1);
        Ok(crate::shared::Committed::Done)
    }
    fn close(&self, key: &str, _: &SessionLimits) -> std::result::Result<bool, crate::shared::StoreError> {
        Ok(self.sessions.lock().unwrap().remove(key).is_some())
    }
    fn context(&self, digest: &str) -> std::result::Result<Option<Vec<u8>>, crate::shared::StoreError> {
        Ok(self.contexts.lock().unwrap().get(digest).cloned())
    }
    fn stats(&self, _: &SessionLimits) -> std::result::Result<SessionStats, crate::shared::StoreError> {
        Ok(SessionStats { live: self.sessions.lock().unwrap().len() as u64, ..Default::default() })
    }
    fn ping(&self) -> std::result::Result<(), crate::shared::StoreError> {
        Ok(())
    }
}

use crate::session::{SessionLimits, SessionStats};

#[test]
fn a_replica_continues_another_replicas_session_from_the_store_and_redoes_a_lost_race() {
    let store = Arc::new(MemStore::default());
    let a = scd().with_shared_state(store.clone(), TokenizerRegistry::new());
    let b = scd().with_shared_state(store.clone(), TokenizerRegistry::new());
    let mut req = request("why did charges fail at checkout", 12);
    req.session = Some(SessionRequest { max_total_tokens: Some(60), ..Default::default() });
    let first = a.compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap();
    let grant = first.session.clone().unwrap();
    // the token is stored only as its hash
    let stored = store.sessions.lock().unwrap().values().next().unwrap().0.clone();
    assert!(!String::from_utf8_lossy(&stored).contains(&grant.token));
    // b never saw the context: it rebuilds it from the store, in o200k
    // (the session's tokenizer), and sends nothing a already sent
    let more = b.request_more(&follow_up(&grant, "what about the office plants", Some(12))).unwrap();
    assert!(!more.chunks.is_empty());
    let sent_first: Vec<&str> = first.chunks.iter().map(|c| c.id.as_str()).collect();
    assert!(more.chunks.iter().all(|c| !sent_first.contains(&c.id.as_str())), "resent across replicas");
    let o200k = builtin("o200k").unwrap();
    assert_eq!(more.sent_tokens, o200k.count(&more.text).unwrap());
    assert_eq!(more.session_sent_tokens, first.totals.sent_tokens + more.sent_tokens);
    // another replica commits first, twice: the request is redone on the
    // new ledger and still sends nothing twice
    store.race.store(2, std::sync::atomic::Ordering::SeqCst);
    let again = a.request_more(&follow_up(&grant, "what about the office plants", Some(12))).unwrap();
    assert_eq!(store.race.load(std::sync::atomic::Ordering::SeqCst), 0);
    let before: Vec<&str> = sent_first.iter().copied().chain(more.chunks.iter().map(|c| c.id.as_str())).collect();
    assert!(again.chunks.iter().all(|c| !before.contains(&c.id.as_str())));
    // losing every time ends in SessionContended, not a silent resend
    store.race.store(100, std::sync::atomic::Ordering::SeqCst);
    let e = b.request_more(&follow_up(&grant, "the cactus", Some(12))).unwrap_err();
    assert!(matches!(e, Error::SessionContended { .. }), "{e}");
    // wrong token on the other replica: refused as in memory
    let mut wrong = follow_up(&grant, "x", None);
    wrong.session_token = "guess".into();
    assert!(matches!(b.request_more(&wrong).unwrap_err(), Error::SessionForbidden { .. }));
}

/// The store's blob for the one context in `store`, decoded.
fn stored_blob(store: &MemStore) -> (String, crate::shared::ContextBlob) {
    let contexts = store.contexts.lock().unwrap();
    let (digest, bytes) = contexts.iter().next().unwrap();
    (digest.clone(), crate::shared::ContextBlob::decode(bytes).unwrap())
}

#[test]
fn a_hostile_context_blob_puts_nothing_in_any_cache_of_the_replica_that_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache/embeddings.redb");
    let store = Arc::new(MemStore::default());
    let a = scd().with_shared_state(store.clone(), TokenizerRegistry::new());
    let cfg = ScdConfig {
        prepare: PrepareConfig { embedding_store: Some(path.clone()), ..Default::default() },
        ..ScdConfig::default()
    };
    let b =
        Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg).with_shared_state(store.clone(), TokenizerRegistry::new());
    let mut req = request("why did charges fail at checkout", 12);
    req.session = Some(SessionRequest::default());
    let grant = a.compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap().session.unwrap();
    // the store's blob: every vector replaced by one chosen unit vector, one
    // of them non-finite, and one more planted under the key of a text any
    // other context may hold
    let (digest, mut blob) = stored_blob(&store);
    let mut chosen = vec![0f32; 128];
    chosen[0] = 1.0;
    let planted = EmbeddingCache::key(b.encoder.model_id(), 0, "weather: It is sunny today.");
    for (_, v) in &mut blob.embeddings {
        v.clone_from(&chosen);
    }
    blob.embeddings[0].1[1] = f32::NAN;
    blob.embeddings.push((planted, chosen.clone()));
    let keys: Vec<[u8; 32]> = blob.embeddings.iter().map(|(k, _)| *k).collect();
    store.contexts.lock().unwrap().insert(digest, blob.encode());
    // b restores the context from the blob, and answers
    b.request_more(&follow_up(&grant, "what about the office plants", Some(12))).unwrap();
    // but neither its memory nor its disk holds a vector of the blob
    let held = b.cache.get_many(&keys);
    assert!(held.iter().all(|v| v.as_deref() != Some(&chosen[..])), "a store vector was cached");
    assert!(held.last().unwrap().is_none(), "the planted key was cached");
    let disk = crate::cache::DiskTier::new(&path, 1 << 30).get_many(&keys);
    assert!(disk.iter().all(|v| v.as_deref() != Some(&chosen[..])), "a store vector reached the disk");
}

#[test]
fn a_session_record_naming_a_chunk_out_of_range_is_refused_not_a_panic() {
    let store = Arc::new(MemStore::default());
    let a = scd().with_shared_state(store.clone(), TokenizerRegistry::new());
    let mut req = request("why did charges fail at checkout", 12);
    req.session = Some(SessionRequest::default());
    let grant = a.compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap().session.unwrap();
    for (field, value) in [
        ("sent", serde_json::json!([0, 1_000_000])),
        (
            "last",
            serde_json::json!({"request_id": "r", "chunks": [[77, 0.5]], "sent_tokens": 1, "budget": 9, "reason": null}),
        ),
    ] {
        {
            let mut sessions = store.sessions.lock().unwrap();
            let (record, _) = sessions.values_mut().next().unwrap();
            let mut v: serde_json::Value = serde_json::from_slice(record).unwrap();
            v["sent"] = serde_json::json!([]);
            v[field] = value;
            *record = serde_json::to_vec(&v).unwrap();
        }
        let mut ask = follow_up(&grant, "what about the office plants", Some(12));
        ask.request_id = Some("r".into());
        let e = a.request_more(&ask).unwrap_err();
        assert!(matches!(e, Error::StateUnavailable { .. }), "{field}: {e}");
        assert!(e.to_string().contains("a session record names chunk") && e.to_string().contains("chunks"), "{e}");
    }
}

#[test]
fn a_compress_goes_on_over_a_corrupted_cache_file_and_a_held_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("embeddings.redb");
    let engine = || {
        let cfg = ScdConfig {
            prepare: PrepareConfig { embedding_store: Some(path.clone()), ..Default::default() },
            ..ScdConfig::default()
        };
        Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg)
    };
    let req = request("why did charges fail at checkout", 40);
    let first = engine().compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap();
    let ids = |c: &Compressed| c.chunks.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    // held by another opener: the compress waits a moment, not seconds
    let held = redb::Database::create(&path).unwrap();
    let start = std::time::Instant::now();
    let out = engine().compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap();
    assert!(start.elapsed() < std::time::Duration::from_millis(1500), "took {:?}", start.elapsed());
    assert_eq!(ids(&out), ids(&first));
    drop(held);
    // corrupted, however: the same answer, and no panic
    for seed in 0..8 {
        crate::cache::tests::flip(&path, seed, 4);
        let out = engine().compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap();
        assert_eq!(ids(&out), ids(&first), "seed {seed}");
        if !path.exists() {
            engine().compress_opts(&req, &opts("o200k", false), &Cancel::new()).unwrap();
        }
    }
}

/// Each field's last line is found once, when the context is prepared, and
/// the headers rendered from it name a one-line field alone and give a
/// longer field's lines.
#[test]
fn headers_name_lines_from_each_fields_last_line_found_at_prepare_time() {
    let s = scd();
    let log = "INFO service started\nWARN disk at 91%\nERROR write failed: no space left on device\n";
    let fields =
        [prose("note", "The disk filled up overnight."), Field { kind: FieldKind::Log, ..prose("app.log", log) }];
    let refs: Vec<&Field> = fields.iter().collect();
    let ctx = s.prepare(&refs, &crate::cancel::Cancel::new()).unwrap();
    for f in 0..fields.len() {
        let max = ctx.chunks.iter().filter(|c| c.field == f).map(|c| c.lines.1).max().unwrap();
        assert_eq!(ctx.last_lines[f], max, "field {f}");
    }
    assert_eq!(ctx.last_lines, [1, 3]);
    let all: Vec<usize> = (0..ctx.chunks.len()).collect();
    let text = render::render(&ctx, &all, &Default::default(), 1);
    let headers: Vec<&str> = text.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(headers.first(), Some(&"[note]"), "{text}");
    assert!(headers[1..].iter().all(|h| h.starts_with("[app.log:")), "{text}");
    let last = ctx.chunks.iter().rposition(|c| c.field == 1).unwrap();
    let text = render::render(&ctx, &[last], &Default::default(), 1);
    assert_eq!(text.lines().next(), Some("[app.log:3]"), "{text}");
}

/// `line_lexical_weight` adds its share of the BM25 z-score to log and chat
/// chunks only, shown in `group_lift` so the explanation still adds up, and
/// lifts the log line that holds the task's words.
#[test]
fn line_lexical_weight_lifts_log_and_chat_lines_by_their_bm25_score() {
    let log = "INFO service started\nINFO cache warmed\nINFO disk quota for volume data reached\nINFO health ok\n";
    let fields = vec![
        Field { kind: FieldKind::Log, ..prose("app.log", log) },
        Field { kind: FieldKind::Chat, ..prose("chat", "ana: the volume data quota is full\nbo: ok\n") },
        prose("notes", "The data volume has a quota. The quota was raised last year."),
    ];
    let run = |w: f32| {
        let cfg = ScdConfig {
            scoring: ScoringConfig { line_lexical_weight: w, ..Default::default() },
            prepare: PrepareConfig {
                chunk: crate::chunk::ChunkConfig { log_run_lines: 1, ..Default::default() },
                ..Default::default()
            },
            ..ScdConfig::default()
        };
        let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg);
        let req = CompressRequest {
            task: Task::new("which volume reached its disk quota"),
            context: Context { fields: fields.clone() },
            requirement: ContextRequirement::with_budget(10_000),
            session: None,
        };
        scd.compress_opts(&req, &opts("", true), &Cancel::new()).unwrap().explanation.unwrap()
    };
    let (off, on) = (run(0.0), run(1.0));
    assert_eq!(off.selected.len(), on.selected.len());
    for (a, b) in off.selected.iter().zip(&on.selected) {
        assert_eq!(a.id, b.id);
        let sum = b.dense_z + on.lexical_weight * b.lexical_z + b.group_lift + b.link_lift + b.hop_lift;
        assert!((sum - b.score).abs() < 1e-5, "{}: the explanation adds up", b.id);
        let lift = if b.id.starts_with("notes") { 0.0 } else { b.lexical_z };
        assert!((b.score - a.score - lift).abs() < 1e-5, "{}: {} → {}", b.id, a.score, b.score);
    }
    let quota = on.selected.iter().find(|w| w.id == "app.log#2").unwrap();
    assert!(quota.lexical_z > 0.0, "the line with the task's words has the best BM25");
}

/// `lexical_excess_weight` lifts a chunk by its BM25 z-score's excess over
/// `lexical_excess_from` (the one sentence holding the task's words), and
/// no other; the lift shows in `group_lift`, so the explanation adds up.
#[test]
fn lexical_excess_lifts_only_the_chunk_whose_bm25_score_stands_out() {
    let notes: String =
        (0..12).map(|i| format!("Note {i}: the cache is warmed at start and health checks pass.\n\n")).collect();
    let text = format!("{notes}On AWS Lambda the runtime freezes, so write logs synchronously or they are lost.\n");
    let run = |w: f32, from: f32| {
        let scd =
            scd_scoring(ScoringConfig { lexical_excess_weight: w, lexical_excess_from: from, ..Default::default() });
        let req = CompressRequest {
            task: Task::new("lambda logs lost"),
            context: Context { fields: vec![prose("notes", &text)] },
            requirement: ContextRequirement::with_budget(10_000),
            session: None,
        };
        scd.compress_opts(&req, &opts("", true), &Cancel::new()).unwrap().explanation.unwrap()
    };
    let (off, on) = (run(0.0, 1.0), run(0.5, 1.0));
    assert_eq!(off.selected.len(), on.selected.len());
    let mut lifted = Vec::new();
    for b in &on.selected {
        let a = off.selected.iter().find(|a| a.id == b.id).unwrap();
        let sum = b.dense_z + on.lexical_weight * b.lexical_z + b.group_lift + b.link_lift + b.hop_lift;
        assert!((sum - b.score).abs() < 1e-5, "{}: the explanation adds up", b.id);
        let lift = 0.5 * (b.lexical_z - 1.0).max(0.0);
        assert!((b.score - a.score - lift).abs() < 1e-5, "{}: {} → {}", b.id, a.score, b.score);
        if lift > 0.0 {
            lifted.push(b.id.as_str());
        }
    }
    assert_eq!(lifted, ["notes#12"], "only the Lambda sentence stands out");
    // its z-score (one in 13 sentences: √12) is under the default threshold
    let z = on.selected.iter().find(|b| b.id == "notes#12").unwrap().lexical_z;
    assert!(z > 3.0 && z < 4.0, "{z}");
    let d = ScoringConfig::default();
    let scores = |e: &Explanation| e.selected.iter().map(|b| (b.id.clone(), b.score)).collect::<Vec<_>>();
    assert_eq!(scores(&run(d.lexical_excess_weight, d.lexical_excess_from)), scores(&off));
}

/// A pod list whose pods are each cut into several chunks (each over the
/// JSON unit); pod 3 was OOM-killed.
fn pod_list() -> (Context, serde_json::Value) {
    let items: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            serde_json::json!({
                "metadata": {"name": format!("pod-{i}"), "namespace": "shop",
                             "annotations": {"note": "scheduled by the default scheduler on a general purpose node pool"}},
                "spec": {"containers": [{"name": "app", "image": "web:1.2", "args": ["--port", "8080", "--workers", "4"],
                                         "resources": {"limits": {"memory": "256Mi", "cpu": "500m"}},
                                         "env": (0..12).map(|k| serde_json::json!({"name": format!("FEATURE_{k}"), "value": "on"}))
                                             .collect::<Vec<_>>()}]},
                "status": {"phase": if i == 3 { "Failed" } else { "Running" }, "restartCount": i * 7,
                           "lastState": {"terminated": {"exitCode": if i == 3 { 137 } else { 0 },
                                         "reason": if i == 3 { "OOMKilled" } else { "Completed" },
                                         "startedAt": "2026-01-01T00:00:00Z"}}}
            })
        })
        .collect();
    let doc = serde_json::json!({"kind": "List", "apiVersion": "v1", "items": items});
    let field = Field {
        name: "pods.json".into(),
        kind: FieldKind::Json,
        confidential: false,
        content: serde_json::to_string_pretty(&doc).unwrap(),
    };
    (Context { fields: vec![field] }, doc)
}

/// The text's pieces: each header line and the JSON its body parses as.
fn json_pieces(text: &str) -> Vec<(String, serde_json::Value)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        match out.last_mut() {
            Some(p) if !line.starts_with("[pods.json") => {
                p.1.push_str(line);
                p.1.push('\n');
            }
            _ => out.push((line.to_string(), String::new())),
        }
    }
    out.into_iter()
        .map(|(h, body)| {
            let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{h} does not parse ({e}):\n{body}"));
            (h, v)
        })
        .collect()
}

fn compress_pods(whole_tokens: usize, budget: usize) -> (Compressed, serde_json::Value) {
    let (context, doc) = pod_list();
    let cfg = ScdConfig {
        scoring: ScoringConfig { json_whole_tokens: whole_tokens, ..Default::default() },
        ..ScdConfig::default()
    };
    let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg);
    let rq = CompressRequest {
        task: Task::new("Which pod was OOMKilled, and with which exit code?"),
        context,
        requirement: ContextRequirement::with_budget(budget),
        session: None,
    };
    let out = scd.compress_opts(&rq, &opts("cl100k", false), &Cancel::new()).unwrap();
    assert!(out.totals.sent_tokens <= budget, "{:?}", out.totals);
    (out, doc)
}

/// The element that answers was cut into chunks (each pod is over the JSON
/// unit) and only some of them were sent; now, once one is sent, the whole
/// element comes, as one subtree that parses, under its path.
#[test]
fn a_json_element_sent_in_part_comes_whole_as_one_subtree_under_its_path() {
    let budget = 600;
    let (out, doc) = compress_pods(1000, budget);
    let pieces = json_pieces(&out.text);
    let whole = pieces.iter().find(|(_, v)| *v == doc["items"][3]);
    let (header, _) = whole.unwrap_or_else(|| panic!("pod 3 is not sent whole:\n{}", out.text));
    assert!(header.ends_with(" items[3]]"), "{header}");
    // indented from the margin: the element's members two spaces in
    let body: Vec<&str> = out.text.lines().skip_while(|l| l != header).skip(1).take(2).collect();
    assert!(body[0] == "{" && body[1].starts_with("  \"") && !body[1].starts_with("   "), "{body:?}");
    // without it, the element comes in fragments (the budget is the same)
    let (before, _) = compress_pods(0, budget);
    let pieces = json_pieces(&before.text);
    assert!(pieces.iter().all(|(_, v)| *v != doc["items"][3]), "{}", before.text);
    assert!(before.text.contains("OOMKilled") && pieces.len() > 1, "{}", before.text);
}

/// An element over the cap, or one whose rest does not fit, is trimmed to
/// the chunks that answer (each a subtree under its path), not dropped.
#[test]
fn a_json_element_too_big_to_send_whole_is_trimmed_not_dropped() {
    let (context, _) = pod_list();
    let cl100k = builtin("cl100k").unwrap();
    let pod_tokens = cl100k.count(&context.fields[0].content).unwrap() / 8;
    for (whole_tokens, budget) in [(pod_tokens / 4, 600), (1000, pod_tokens * 2 / 3)] {
        let (out, doc) = compress_pods(whole_tokens, budget);
        let pieces = json_pieces(&out.text);
        assert!(pieces.iter().all(|(_, v)| *v != doc["items"][3]), "{}", out.text);
        let answer = pieces.iter().find(|(_, v)| v.to_string().contains("OOMKilled"));
        let (header, _) = answer.unwrap_or_else(|| panic!("the answer was dropped:\n{}", out.text));
        assert!(header.contains(" items[3]"), "{header}");
    }
}

/// A long list item cut by sentences (`item_sentence_bytes`) is rendered
/// with its lead: a sentence sent alone from the middle of the item shows
/// the item's bold lead, a gap line for the sentences left out, and its own
/// continuation lines as the field indents them.
#[test]
fn a_sentence_of_a_long_list_item_is_rendered_under_its_lead_with_a_gap() {
    let doc = "## Under load\n\n- **One queue, fair across callers.** Embed requests\n  share one bounded queue. It \
               takes one request of each caller in turn. A full\n  queue answers RESOURCE_EXHAUSTED with a hint.\n\
               - **Short.** Stays whole.\n";
    let cfg = ScdConfig {
        prepare: PrepareConfig {
            chunk: crate::chunk::ChunkConfig { item_sentence_bytes: 60, ..Default::default() },
            ..Default::default()
        },
        ..ScdConfig::default()
    };
    let s = Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg);
    let field = Field { kind: FieldKind::Markdown, ..prose("ops.md", doc) };
    let ctx = s.prepare(&[&field], &crate::cancel::Cancel::new()).unwrap();
    let at = |p: &str| ctx.chunks.iter().position(|c| c.text.starts_with(p)).unwrap();
    let (lead, full, embed) = (at("- **One queue"), at("A full"), at("Embed requests"));
    assert_eq!(ctx.chunks[lead].text, "- **One queue, fair across callers.**");
    assert!(ctx.chunks[full].group == ctx.chunks[lead].group && ctx.chunks[lead].rides);
    let text = render::render(&ctx, &[full, lead], &Default::default(), 1);
    assert_eq!(
        text,
        "[ops.md:3-5 Under load]\n- **One queue, fair across callers.**\n…\nA full\n  queue answers \
         RESOURCE_EXHAUSTED with a hint."
    );
    // the sentence right after the lead reads on from it with no gap line
    let text = render::render(&ctx, &[lead, embed], &Default::default(), 1);
    assert_eq!(
        text,
        "[ops.md:3-4 Under load]\n- **One queue, fair across callers.** Embed requests\n  share one bounded queue."
    );
}

/// A follow-up whose question points at a paragraph the first answer sent
/// in part brings the rest of that paragraph before other paragraphs the
/// question also matches; the same text as a Markdown field is not lifted.
#[test]
fn a_follow_up_completes_the_paragraph_its_question_points_at() {
    let scd = scd();
    let notes = prose(
        "notes",
        "The Rio Grande is a river of Jamaica in the parish of Portland. It was named by the Spanish settlers who \
         came in the sixteenth century. Today it is known for bamboo rafting trips.",
    );
    let follow = |notes: Field| {
        let atlas = "Where is the Black River of Jamaica? The Black River of Jamaica is in Saint Elizabeth. Where \
                     is the Rio Cobre river of Jamaica? It is in Saint Catherine.";
        let ferry = "A ferry crosses the harbour of Kingston every hour from the pier near the market.";
        let req = CompressRequest {
            task: Task::new("Which river of Jamaica is in the parish of Portland?"),
            context: Context { fields: vec![notes, prose("atlas", atlas), prose("ferry", ferry)] },
            requirement: ContextRequirement::with_budget(22),
            session: Some(SessionRequest::default()),
        };
        let out = scd.compress_opts(&req, &opts("cl100k", false), &Cancel::new()).unwrap();
        let first: Vec<String> = out.chunks.iter().map(|c| c.id.clone()).collect();
        assert_eq!(first, ["notes#0"], "the first answer holds the paragraph's first sentence: {}", out.text);
        let grant = out.session.clone().unwrap();
        scd.request_more(&follow_up(&grant, "Where is the Rio Grande river of Jamaica?", Some(32))).unwrap()
    };
    let more = follow(notes.clone());
    let ids: Vec<&str> = more.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["notes#1", "notes#2"], "the rest of the paragraph, not another river: {}", more.text);
    assert!(more.text.starts_with("[notes]\n"), "{}", more.text);
    // each chunk keeps its own score: the paragraph's rest ranks higher, it does not score higher
    assert!(more.chunks.iter().all(|c| c.score < 0.0), "{:?}", more.chunks);
    let markdown = follow(Field { kind: FieldKind::Markdown, ..notes.clone() });
    assert!(!markdown.chunks.is_empty(), "the follow-up sends other chunks: {markdown:?}");
    assert!(markdown.chunks.iter().all(|c| c.field != "notes"), "a section is not lifted: {}", markdown.text);
    // the rest ranks nearest first, just under the held sentence's score
    let ctx = scd.prepare(&[&notes], &Cancel::new()).unwrap();
    assert_eq!(ctx.chunks.len(), 3, "three sentences");
    let rank = more::completing(&ctx, &[0].into_iter().collect(), &[5.0, -1.0, -1.0]);
    assert!(5.0 > rank[1] && rank[1] > rank[2] && rank[2] > 4.9, "{rank:?}");
}
