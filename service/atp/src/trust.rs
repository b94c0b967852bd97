//! Layer 1c: trust scores from countersigned interaction proofs (the ATP
//! paper's Definition 3, §4.3–§4.4, §11.2).
//!
//! For subject a and its counted proofs IP_i (quality q_i at time t_i, task
//! type c_i):
//!
//! ```text
//! T(a) = Σ q_i · w_i · γ(c_i) / Σ w_i · γ(c_i),   w_i = e^(−λ · (now − t_i) in days)
//! ```
//!
//! per task type (only that type's proofs; γ cancels) or aggregated over all
//! types (γ-weighted: complex tasks weigh more). Defaults ([`TrustParams`]):
//! λ = 0.01/day (a proof 300 days old weighs e^−3 of a fresh one), γ =
//! code_generation 1.5, analysis 1.2, data_processing 1.0, creative_writing
//! 0.8 (our choice: the paper says only "complex tasks contribute more").
//!
//! **What counts.** A proof counts only if both parties signed it (the
//! evaluator's `signature` and the subject's `responder_signature`, checked
//! on [`TrustBook::add`]), its evaluator is not its subject, and its
//! evaluator is *established*: a trust anchor (the book's owner, whose own
//! observations it believes), or an agent with at least `min_interactions`
//! counted proofs from established evaluators, at most `max_depth` such
//! steps from an anchor. A subject with fewer than `min_interactions`
//! counted proofs (in the asked category) scores the cold-start prior (0.5).
//! So a ring of fresh Sybil agents that rate one another, however often,
//! never counts: none of them is established, and each stays at the prior.
//!
//! **Transitive trust** (Property 2): `T(a via b) = T(a) + α · T(b) ·
//! T_att(b→a)`, clamped to [0, 1], α = 0.5, where `T_att(b→a)` is Definition
//! 3 over b's proofs about a (0 if b is not established or rated a fewer
//! than `min_interactions` times).
//! [`TrustBook::transitive`] takes the best such referral, recursively up to
//! `max_depth` hops (each hop damped by α again). As the paper writes it, the
//! referral term is added to a `T(a)` that already counts b's proofs, so it
//! only ever raises a score.
//!
//! ```
//! use scd_atp::identity::{Identity, SignMessages};
//! use scd_atp::pb;
//! use scd_atp::trust::{TrustBook, TrustParams};
//!
//! let (me, worker) = (Identity::generate(), Identity::generate());
//! let mut book = TrustBook::new(TrustParams::default(), me.did());
//! for i in 0..3 {
//!     let mut proof = pb::InteractionProof {
//!         evaluator: Some(me.agent_id()),
//!         subject: Some(worker.agent_id()),
//!         task_id: format!("t{i}"),
//!         task_type: pb::TaskType::CodeGeneration as i32,
//!         quality_score: 0.9,
//!         ..Default::default()
//!     };
//!     me.stamp_and_sign(&mut proof);
//!     worker.countersign(&mut proof);
//!     book.add(&proof).unwrap();
//! }
//! let now = scd_atp::identity::now_s();
//! let t = book.trust(worker.did(), Some(pb::TaskType::CodeGeneration), now);
//! assert!((t.score - 0.9).abs() < 1e-6 && t.samples == 3);
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::identity::{check_proof, AuthFailure, DidResolver, Resolver, Signed};
use crate::pb;

/// Seconds in a day (λ is per day).
pub const SECONDS_PER_DAY: f64 = 86_400.0;

/// γ: how much a task type's interactions weigh in the aggregate score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gamma {
    /// `TASK_TYPE_CODE_GENERATION`.
    pub code_generation: f64,
    /// `TASK_TYPE_ANALYSIS`.
    pub analysis: f64,
    /// `TASK_TYPE_DATA_PROCESSING`.
    pub data_processing: f64,
    /// `TASK_TYPE_CREATIVE_WRITING`.
    pub creative_writing: f64,
    /// `TASK_TYPE_UNSPECIFIED` (and unknown values).
    pub unspecified: f64,
}

impl Default for Gamma {
    fn default() -> Gamma {
        Gamma { code_generation: 1.5, analysis: 1.2, data_processing: 1.0, creative_writing: 0.8, unspecified: 1.0 }
    }
}

impl Gamma {
    /// γ of a task type.
    pub fn of(&self, task_type: pb::TaskType) -> f64 {
        match task_type {
            pb::TaskType::CodeGeneration => self.code_generation,
            pb::TaskType::Analysis => self.analysis,
            pb::TaskType::DataProcessing => self.data_processing,
            pb::TaskType::CreativeWriting => self.creative_writing,
            pb::TaskType::Unspecified => self.unspecified,
        }
    }
}

/// The trust model's constants (defaults from the paper, see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct TrustParams {
    /// λ, decay per day.
    pub lambda_per_day: f64,
    /// α, the damping of a transitive referral.
    pub alpha: f64,
    /// How many hops transitive trust and establishment reach.
    pub max_depth: usize,
    /// Counted proofs needed before a score leaves the prior (and before an
    /// agent's own ratings count).
    pub min_interactions: usize,
    /// The score of an agent without enough counted proofs.
    pub cold_start: f64,
    /// γ per task type.
    pub gamma: Gamma,
}

impl Default for TrustParams {
    fn default() -> TrustParams {
        TrustParams {
            lambda_per_day: 0.01,
            alpha: 0.5,
            max_depth: 2,
            min_interactions: 3,
            cold_start: 0.5,
            gamma: Gamma::default(),
        }
    }
}

impl TrustParams {
    /// w(age) = e^(−λ · age in days); a proof from the future weighs 1.
    pub fn decay(&self, age_s: i64) -> f64 {
        (-self.lambda_per_day * age_s.max(0) as f64 / SECONDS_PER_DAY).exp()
    }
}

/// A trust score and how many counted proofs it rests on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrustScore {
    /// In [0, 1].
    pub score: f64,
    /// Counted proofs (below `min_interactions` the score is the prior).
    pub samples: u32,
}

impl TrustScore {
    /// The wire form.
    pub fn to_pb(&self, agent: &str, task_type: Option<pb::TaskType>, now_s: i64) -> pb::TrustScore {
        pb::TrustScore {
            agent: Some(pb::AgentId { uuid: agent.to_string() }),
            task_type: task_type.unwrap_or(pb::TaskType::Unspecified) as i32,
            score: self.score,
            sample_count: self.samples,
            last_updated: Some(pb::Timestamp { seconds: now_s, nanos: 0 }),
        }
    }
}

/// One proof as the trust model sees it.
#[derive(Debug, Clone)]
struct Rating {
    evaluator: String,
    task_type: pb::TaskType,
    quality: f64,
    at_s: i64,
    /// Signed by its subject too (an owner's own observation may not be).
    countersigned: bool,
}

impl Rating {
    /// A proof as a rating (its signatures and ranges checked by the caller).
    fn of(proof: &pb::InteractionProof) -> Rating {
        Rating {
            evaluator: proof.sender().to_string(),
            task_type: pb::TaskType::try_from(proof.task_type).unwrap_or(pb::TaskType::Unspecified),
            quality: proof.quality_score,
            at_s: proof.timestamp.map_or(0, |t| t.seconds),
            countersigned: !proof.responder_signature.is_empty(),
        }
    }
}

/// Proofs in memory and the scores they give.
pub struct TrustBook {
    params: TrustParams,
    resolver: Arc<dyn Resolver>,
    owner: String,
    anchors: HashSet<String>,
    /// Subject → its ratings.
    ratings: HashMap<String, Vec<Rating>>,
    /// (evaluator, nonce) of every proof added: a proof counts once.
    seen: HashSet<(String, u64)>,
    /// Established evaluators → their depth (anchors 0); `None` when stale.
    established: Mutex<Option<Arc<HashMap<String, usize>>>>,
}

impl std::fmt::Debug for TrustBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustBook")
            .field("params", &self.params)
            .field("anchors", &self.anchors)
            .field("proofs", &self.seen.len())
            .finish_non_exhaustive()
    }
}

impl TrustBook {
    /// An empty book whose owner (a trust anchor) is `owner_did`; proof
    /// signatures resolve as did:key.
    pub fn new(params: TrustParams, owner_did: &str) -> TrustBook {
        TrustBook::with_resolver(params, owner_did, Arc::new(DidResolver::new()))
    }

    /// An empty book resolving proof signers with `resolver`.
    pub fn with_resolver(params: TrustParams, owner_did: &str, resolver: Arc<dyn Resolver>) -> TrustBook {
        TrustBook {
            params,
            resolver,
            owner: owner_did.to_string(),
            anchors: HashSet::from([owner_did.to_string()]),
            ratings: HashMap::new(),
            seen: HashSet::new(),
            established: Mutex::new(None),
        }
    }

    /// The parameters.
    pub fn params(&self) -> &TrustParams {
        &self.params
    }

    /// Also believes `did`'s own ratings (as it believes the owner's).
    pub fn add_anchor(&mut self, did: &str) {
        self.anchors.insert(did.to_string());
        self.invalidate();
    }

    /// How many proofs were added.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Adds a proof after checking it: both signatures verify, the evaluator
    /// is not the subject, the quality is in [0, 1], it has a timestamp, and
    /// the (evaluator, nonce) pair is new.
    pub fn add(&mut self, proof: &pb::InteractionProof) -> Result<()> {
        check_proof(self.resolver.as_ref(), proof)?;
        self.add_checked(proof)
    }

    /// Adds a simulated proof (`scd-dev atp bench`) without the signature
    /// checks: the simulator's agents have no keys. Only with the
    /// `simulation` feature, which no agent needs; a peer's proof always
    /// goes through [`TrustBook::add`].
    #[cfg(feature = "simulation")]
    pub fn add_simulated(&mut self, proof: &pb::InteractionProof) -> Result<()> {
        self.add_checked(proof)
    }

    /// [`TrustBook::add`] without the signature checks, for proofs checked
    /// before they were stored.
    pub(crate) fn add_checked(&mut self, proof: &pb::InteractionProof) -> Result<()> {
        validate_proof(proof)?;
        let evaluator = proof.sender().to_string();
        if !self.seen.insert((evaluator.clone(), proof.nonce)) {
            return Err(AuthFailure::Replayed { did: evaluator, nonce: proof.nonce }.into());
        }
        let subject = proof.subject.as_ref().map(|s| s.uuid.clone()).unwrap_or_default();
        self.ratings.entry(subject).or_default().push(Rating::of(proof));
        self.invalidate();
        Ok(())
    }

    fn invalidate(&self) {
        *self.established.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Established evaluators and their depth (anchors 0): an agent is
    /// established at depth d if it has at least `min_interactions` proofs
    /// from evaluators established below d.
    fn established(&self) -> Arc<HashMap<String, usize>> {
        let mut cache = self.established.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(map) = cache.as_ref() {
            return map.clone();
        }
        let mut depth: HashMap<String, usize> = self.anchors.iter().map(|a| (a.clone(), 0)).collect();
        for d in 1..=self.params.max_depth {
            let newly: Vec<String> = self
                .ratings
                .iter()
                .filter(|(subject, _)| !depth.contains_key(*subject))
                .filter(|(subject, ratings)| {
                    ratings
                        .iter()
                        .filter(|r| depth.get(&r.evaluator).is_some_and(|&e| e < d) && &r.evaluator != *subject)
                        .count()
                        >= self.params.min_interactions
                })
                .map(|(subject, _)| subject.clone())
                .collect();
            if newly.is_empty() {
                break;
            }
            depth.extend(newly.into_iter().map(|s| (s, d)));
        }
        let map = Arc::new(depth);
        *cache = Some(map.clone());
        map
    }

    /// Whether `did`'s ratings count (an anchor, or established within `max_depth`).
    pub fn is_established(&self, did: &str) -> bool {
        self.established().contains_key(did)
    }

    /// Definition 3's numerator, denominator and count over `ratings` (γ-weighted, decayed).
    fn definition_3<'r>(&self, ratings: impl Iterator<Item = &'r Rating>, now_s: i64) -> (f64, f64, u32) {
        let (mut num, mut den, mut n) = (0.0, 0.0, 0u32);
        for r in ratings {
            let w = self.params.decay(now_s - r.at_s) * self.params.gamma.of(r.task_type);
            num += r.quality * w;
            den += w;
            n += 1;
        }
        (num, den, n)
    }

    fn counted<'a>(
        &'a self,
        subject: &'a str,
        task_type: Option<pb::TaskType>,
        established: &'a HashMap<String, usize>,
    ) -> impl Iterator<Item = &'a Rating> + 'a {
        self.ratings.get(subject).into_iter().flatten().filter(move |r| {
            r.evaluator != subject
                && established.contains_key(&r.evaluator)
                && task_type.is_none_or(|t| t == r.task_type)
        })
    }

    /// T(subject) per task type (`Some`) or aggregated over all (`None`), at `now_s`.
    pub fn trust(&self, subject: &str, task_type: Option<pb::TaskType>, now_s: i64) -> TrustScore {
        let established = self.established();
        self.score(self.definition_3(self.counted(subject, task_type, &established), now_s))
    }

    /// Definition 3's sums as a score: the prior below `min_interactions`.
    fn score(&self, (num, den, samples): (f64, f64, u32)) -> TrustScore {
        let score = if (samples as usize) < self.params.min_interactions || den <= f64::MIN_POSITIVE {
            self.params.cold_start
        } else {
            (num / den).clamp(0.0, 1.0)
        };
        TrustScore { score, samples }
    }

    /// The owner's record as its log shows it to others: Definition 3 over
    /// the countersigned proofs about the owner from any other evaluator of
    /// `task_type` (or all types), the cold-start prior below
    /// `min_interactions`. What an agent offers as its trust; not what a
    /// requester believes ([`TrustBook::trust`] counts only evaluators
    /// established in *its* book, and the owner's evaluators are not
    /// established in the owner's own).
    pub fn own_record(&self, task_type: Option<pb::TaskType>, now_s: i64) -> TrustScore {
        let ratings = self
            .ratings
            .get(&self.owner)
            .into_iter()
            .flatten()
            .filter(|r| r.countersigned && r.evaluator != self.owner && task_type.is_none_or(|t| t == r.task_type));
        self.score(self.definition_3(ratings, now_s))
    }

    /// T_att(by → subject): Definition 3 over `by`'s proofs about `subject`;
    /// 0 if `by` is not established or rated `subject` fewer than
    /// `min_interactions` times (a referral needs to know its subject).
    pub fn attestation(&self, by: &str, subject: &str, task_type: Option<pb::TaskType>, now_s: i64) -> f64 {
        let established = self.established();
        if by == subject || !established.contains_key(by) {
            return 0.0;
        }
        let ratings = self.counted(subject, task_type, &established).filter(|r| r.evaluator == by);
        let (num, den, n) = self.definition_3(ratings, now_s);
        if (n as usize) < self.params.min_interactions || den <= f64::MIN_POSITIVE {
            0.0
        } else {
            (num / den).clamp(0.0, 1.0)
        }
    }

    /// The paper's one-hop formula: T(a via b) = T(a) + α · T(b) · T_att(b→a), clamped to [0, 1].
    pub fn transitive_via(&self, subject: &str, via: &str, task_type: Option<pb::TaskType>, now_s: i64) -> f64 {
        let direct = self.trust(subject, task_type, now_s).score;
        let via_trust = self.trust(via, task_type, now_s).score;
        let referral = self.params.alpha * via_trust * self.attestation(via, subject, task_type, now_s);
        (direct + referral).clamp(0.0, 1.0)
    }

    /// Transitive trust: T(a) plus the best referral α · T(b) · T_att(b→a)
    /// over a's established attestors b, where T(b) is itself transitive,
    /// up to `max_depth` hops (no agent twice on a path); clamped to [0, 1].
    pub fn transitive(&self, subject: &str, task_type: Option<pb::TaskType>, now_s: i64) -> f64 {
        let mut path = vec![subject.to_string()];
        self.transitive_rec(subject, task_type, now_s, self.params.max_depth, &mut path)
    }

    /// Trust in `subject` with the referrals its offer shows (Property 2
    /// over a peer's evidence): the larger of [`TrustBook::transitive`] and
    /// T(a) + the best α · T(b) · T_att(b→a), where T_att is Definition 3
    /// over the `evidence` proofs about `subject` by one evaluator b and
    /// T(b) is b's direct score here, capped at max(T(a), T(b)) (a
    /// recommendation lifts no one above its recommender). Only an
    /// evaluator established in *this* book counts, with at least
    /// `min_interactions` ratings of its own here (of `task_type`, when
    /// given), never the subject or the owner (whose own proofs are in the
    /// book already), and only with at least `min_interactions` proofs not
    /// already in the book. The evidence must have been verified (both
    /// signatures, inclusion in the offered root): this does not check
    /// signatures. A Sybil's evidence (evaluators nobody here rated) adds
    /// nothing; clamped to [0, 1].
    pub fn with_evidence(
        &self,
        subject: &str,
        task_type: Option<pb::TaskType>,
        now_s: i64,
        evidence: &[pb::InteractionProof],
    ) -> f64 {
        let base = self.transitive(subject, task_type, now_s);
        let established = self.established();
        let mut by: HashMap<&str, Vec<Rating>> = HashMap::new();
        let mut nonces = HashSet::new();
        for p in evidence {
            let evaluator = p.sender();
            let tt = pb::TaskType::try_from(p.task_type).unwrap_or(pb::TaskType::Unspecified);
            let counts = p.subject.as_ref().is_some_and(|s| s.uuid == subject)
                && evaluator != subject
                && evaluator != self.owner
                && established.contains_key(evaluator)
                && task_type.is_none_or(|t| t == tt)
                && (0.0..=1.0).contains(&p.quality_score)
                && !self.seen.contains(&(evaluator.to_string(), p.nonce))
                && nonces.insert((evaluator, p.nonce));
            if counts {
                by.entry(evaluator).or_default().push(Rating::of(p));
            }
        }
        let direct = self.trust(subject, task_type, now_s).score;
        let mut best = direct;
        for (b, ratings) in &by {
            let (num, den, n) = self.definition_3(ratings.iter(), now_s);
            // b's own record here, of this task type: a recommender this
            // side has not rated for it (the prior) vouches for nothing
            let tb = self.trust(b, task_type, now_s);
            let enough = |k: u32| (k as usize) >= self.params.min_interactions;
            if !enough(n) || !enough(tb.samples) || den <= f64::MIN_POSITIVE {
                continue;
            }
            let attestation = (num / den).clamp(0.0, 1.0);
            // a recommendation lifts no one above its recommender
            let via = (direct + self.params.alpha * tb.score * attestation).min(direct.max(tb.score));
            best = best.max(via);
        }
        base.max(best.clamp(0.0, 1.0))
    }

    fn transitive_rec(
        &self,
        subject: &str,
        task_type: Option<pb::TaskType>,
        now_s: i64,
        hops_left: usize,
        path: &mut Vec<String>,
    ) -> f64 {
        let direct = self.trust(subject, task_type, now_s).score;
        if hops_left == 0 {
            return direct;
        }
        let established = self.established();
        let attestors: HashSet<&str> = self
            .counted(subject, task_type, &established)
            .map(|r| r.evaluator.as_str())
            .filter(|e| !path.iter().any(|p| p == e))
            .collect();
        let mut best: f64 = 0.0;
        for b in attestors {
            path.push(b.to_string());
            let via = self.transitive_rec(b, task_type, now_s, hops_left - 1, path);
            path.pop();
            best = best.max(self.params.alpha * via * self.attestation(b, subject, task_type, now_s));
        }
        (direct + best).clamp(0.0, 1.0)
    }
}

/// The non-signature checks of a proof.
fn validate_proof(proof: &pb::InteractionProof) -> Result<()> {
    let invalid = |field: &str, reason: String| Error::Invalid { field: field.into(), reason };
    let evaluator = proof.sender();
    let subject = proof.subject.as_ref().map_or("", |s| s.uuid.as_str());
    if subject.is_empty() {
        return Err(invalid("proof.subject", "missing".into()));
    }
    if subject == evaluator {
        return Err(invalid("proof.subject", format!("{subject} rates itself (evaluator = subject)")));
    }
    if !(0.0..=1.0).contains(&proof.quality_score) {
        return Err(invalid("proof.quality_score", format!("{} is outside [0, 1]", proof.quality_score)));
    }
    if proof.timestamp.is_none() {
        return Err(invalid("proof.timestamp", "missing".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::identity::SignMessages as _;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::identity::Identity;

    const NOW: i64 = 1_750_000_000;
    const DAY: i64 = 86_400;
    const CODE: pb::TaskType = pb::TaskType::CodeGeneration;
    const ANALYSIS: pb::TaskType = pb::TaskType::Analysis;

    fn proof(eval: &Identity, subj: &Identity, tt: pb::TaskType, q: f64, at: i64) -> pb::InteractionProof {
        let mut p = pb::InteractionProof {
            evaluator: Some(eval.agent_id()),
            subject: Some(subj.agent_id()),
            task_id: format!("t-{}", crate::identity::fresh_nonce()),
            task_type: tt as i32,
            quality_score: q,
            nonce: crate::identity::fresh_nonce(),
            timestamp: Some(pb::Timestamp { seconds: at, nanos: 0 }),
            ..Default::default()
        };
        eval.sign(&mut p);
        subj.countersign(&mut p);
        p
    }

    fn rate(book: &mut TrustBook, eval: &Identity, subj: &Identity, tt: pb::TaskType, q: f64, at: i64) {
        book.add(&proof(eval, subj, tt, q, at)).unwrap();
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn converges_to_a_consistent_quality_whatever_the_start() {
        // Property 1: five terrible first interactions, then quality 0.8 ± 0.05.
        let (me, w) = (Identity::generate(), Identity::generate());
        let mut book = TrustBook::new(TrustParams::default(), me.did());
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let start = NOW - 400 * DAY;
        for i in 0..5 {
            rate(&mut book, &me, &w, CODE, 0.0, start + i);
        }
        let mut errors = Vec::new();
        for i in 0..400i64 {
            let q = 0.8 + rng.random_range(-0.05..0.05);
            rate(&mut book, &me, &w, CODE, q, start + i * DAY);
            errors.push((book.trust(w.did(), Some(CODE), start + i * DAY).score - 0.8).abs());
        }
        let t = book.trust(w.did(), Some(CODE), NOW);
        assert!((t.score - 0.8).abs() < 0.01, "{t:?}");
        assert_eq!(t.samples, 405);
        // The error shrinks as interactions accumulate.
        assert!(errors[10] > errors[399], "{} vs {}", errors[10], errors[399]);
    }

    #[test]
    fn a_bad_interaction_300_days_ago_weighs_e_minus_3() {
        let p = TrustParams::default();
        assert!(close(p.decay(300 * DAY), (-3.0f64).exp()));
        assert!(close(p.decay(0), 1.0));
        assert!(close(p.decay(-5 * DAY), 1.0), "a proof from the future is not boosted");
        let (me, w) = (Identity::generate(), Identity::generate());
        let mut book = TrustBook::new(p, me.did());
        rate(&mut book, &me, &w, CODE, 1.0, NOW);
        rate(&mut book, &me, &w, CODE, 1.0, NOW);
        rate(&mut book, &me, &w, CODE, 0.0, NOW - 300 * DAY);
        let t = book.trust(w.did(), Some(CODE), NOW);
        assert!(close(t.score, 2.0 / (2.0 + (-3.0f64).exp())), "{t:?}");
        // Fresh, the bad one weighs fully.
        let (me2, w2) = (Identity::generate(), Identity::generate());
        let mut fresh = TrustBook::new(TrustParams::default(), me2.did());
        for q in [1.0, 1.0, 0.0] {
            rate(&mut fresh, &me2, &w2, CODE, q, NOW);
        }
        assert!(close(fresh.trust(w2.did(), Some(CODE), NOW).score, 2.0 / 3.0));
    }

    #[test]
    fn categories_are_separate_and_the_aggregate_is_gamma_weighted() {
        let (me, w) = (Identity::generate(), Identity::generate());
        let mut book = TrustBook::new(TrustParams::default(), me.did());
        for _ in 0..3 {
            rate(&mut book, &me, &w, CODE, 0.95, NOW);
            rate(&mut book, &me, &w, ANALYSIS, 0.3, NOW);
        }
        let code = book.trust(w.did(), Some(CODE), NOW);
        let analysis = book.trust(w.did(), Some(ANALYSIS), NOW);
        assert!(close(code.score, 0.95) && code.samples == 3, "{code:?}");
        assert!(close(analysis.score, 0.3) && analysis.samples == 3, "{analysis:?}");
        let all = book.trust(w.did(), None, NOW);
        let expected = (3.0 * 0.95 * 1.5 + 3.0 * 0.3 * 1.2) / (3.0 * 1.5 + 3.0 * 1.2);
        assert!(close(all.score, expected), "{} vs {expected}", all.score);
        assert_eq!(all.samples, 6);
        // Unweighted, the aggregate would be the plain mean; γ moves it toward code.
        assert!(all.score > (0.95 + 0.3) / 2.0);
        assert_eq!(book.trust(w.did(), Some(pb::TaskType::CreativeWriting), NOW).score, 0.5);
    }

    #[test]
    fn cold_start_until_min_interactions() {
        let (me, w) = (Identity::generate(), Identity::generate());
        let mut book = TrustBook::new(TrustParams::default(), me.did());
        assert_eq!(book.trust(w.did(), None, NOW), TrustScore { score: 0.5, samples: 0 });
        rate(&mut book, &me, &w, CODE, 1.0, NOW);
        rate(&mut book, &me, &w, CODE, 1.0, NOW);
        assert_eq!(book.trust(w.did(), None, NOW), TrustScore { score: 0.5, samples: 2 });
        rate(&mut book, &me, &w, CODE, 1.0, NOW);
        assert_eq!(book.trust(w.did(), None, NOW), TrustScore { score: 1.0, samples: 3 });
    }

    #[test]
    fn a_sybil_ring_gains_no_trust_above_the_prior() {
        let me = Identity::generate();
        let ring: Vec<Identity> = (0..5).map(|_| Identity::generate()).collect();
        let mut book = TrustBook::new(TrustParams::default(), me.did());
        for a in &ring {
            for b in ring.iter().filter(|b| b.did() != a.did()) {
                for _ in 0..10 {
                    rate(&mut book, a, b, CODE, 1.0, NOW);
                }
            }
        }
        // Two honest interactions with one member do not establish it either.
        rate(&mut book, &me, &ring[0], CODE, 1.0, NOW);
        rate(&mut book, &me, &ring[0], CODE, 1.0, NOW);
        for member in &ring {
            assert!(!book.is_established(member.did()));
            let t = book.trust(member.did(), Some(CODE), NOW);
            assert!(t.score <= 0.5, "{t:?}");
            assert!(book.transitive(member.did(), Some(CODE), NOW) <= 0.5);
            for other in &ring {
                assert!(book.transitive_via(member.did(), other.did(), Some(CODE), NOW) <= 0.5);
            }
        }
        // A self-rating is refused outright.
        let err = book.add(&proof(&ring[1], &ring[1], CODE, 1.0, NOW)).unwrap_err();
        assert!(err.to_string().contains("rates itself"), "{err}");
    }

    #[test]
    fn transitive_trust_is_damped_clamped_and_depth_bounded() {
        // me → c → b → a, three proofs each.
        let (me, c, b, a) = (Identity::generate(), Identity::generate(), Identity::generate(), Identity::generate());
        let (tc, tb, ta) = (0.5, 0.4, 0.6);
        let chain = |params: TrustParams| {
            let mut book = TrustBook::new(params, me.did());
            for _ in 0..3 {
                rate(&mut book, &me, &c, CODE, tc, NOW);
                rate(&mut book, &c, &b, CODE, tb, NOW);
                rate(&mut book, &b, &a, CODE, ta, NOW);
            }
            book
        };
        let book = chain(TrustParams::default());
        assert!(close(book.trust(a.did(), Some(CODE), NOW).score, ta));
        assert!(close(book.attestation(b.did(), a.did(), Some(CODE), NOW), ta));
        // The paper's formula, one hop: T(a) + α·T(b)·T_att(b→a).
        assert!(close(book.transitive_via(a.did(), b.did(), Some(CODE), NOW), ta + 0.5 * tb * ta));
        // Two hops: b's own score is itself raised by c's referral.
        let tb_1 = tb + 0.5 * tc * tb;
        assert!(close(book.transitive(a.did(), Some(CODE), NOW), ta + 0.5 * tb_1 * ta));

        // Clamped to 1.
        let (me2, x, y) = (Identity::generate(), Identity::generate(), Identity::generate());
        let mut high = TrustBook::new(TrustParams::default(), me2.did());
        for _ in 0..3 {
            rate(&mut high, &me2, &x, CODE, 1.0, NOW);
            rate(&mut high, &x, &y, CODE, 0.95, NOW);
        }
        assert_eq!(high.transitive_via(y.did(), x.did(), Some(CODE), NOW), 1.0);

        // Depth 1: b is two steps from the anchor, so b is not established,
        // its ratings of a do not count, and a stays at the prior.
        let book1 = chain(TrustParams { max_depth: 1, ..TrustParams::default() });
        assert!(book1.is_established(c.did()) && !book1.is_established(b.did()));
        assert_eq!(book1.trust(a.did(), Some(CODE), NOW).score, 0.5);
        assert_eq!(book1.transitive(a.did(), Some(CODE), NOW), 0.5);
        assert!(close(book1.transitive(b.did(), Some(CODE), NOW), tb + 0.5 * tc * tb));
        // Depth 0: transitive is direct.
        let flat = TrustBook::new(TrustParams { max_depth: 0, ..TrustParams::default() }, me.did());
        assert_eq!(flat.transitive(a.did(), None, NOW), flat.trust(a.did(), None, NOW).score);
    }

    #[test]
    fn proofs_without_both_valid_signatures_do_not_count() {
        let (me, w, mallory) = (Identity::generate(), Identity::generate(), Identity::generate());
        let mut book = TrustBook::new(TrustParams::default(), me.did());
        let good = proof(&me, &w, CODE, 0.9, NOW);
        let mut no_counter = good.clone();
        no_counter.responder_signature.clear();
        no_counter.nonce += 1;
        let mut no_sig = good.clone();
        no_sig.signature.clear();
        let mut forged_counter = proof(&me, &w, CODE, 0.9, NOW);
        mallory.countersign(&mut forged_counter);
        let mut inflated = proof(&me, &w, CODE, 0.2, NOW);
        inflated.quality_score = 1.0;
        for bad in [&no_counter, &no_sig, &forged_counter, &inflated] {
            assert!(matches!(book.add(bad), Err(Error::Auth(_))), "{bad:?}");
        }
        assert!(book.is_empty());
        // The same proof twice counts once.
        book.add(&good).unwrap();
        assert!(matches!(book.add(&good), Err(Error::Auth(AuthFailure::Replayed { .. }))));
        assert_eq!(book.trust(w.did(), None, NOW).samples, 1);
        // Quality outside [0, 1] is refused even when signed.
        let bad_q = proof(&me, &w, CODE, 1.5, NOW);
        assert!(book.add(&bad_q).unwrap_err().to_string().contains("outside [0, 1]"));
    }

    #[test]
    fn randomized_scores_stay_in_range() {
        let ids: Vec<Identity> = (0..6).map(|_| Identity::generate()).collect();
        let mut book = TrustBook::new(TrustParams::default(), ids[0].did());
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..200 {
            let e = rng.random_range(0..ids.len());
            let s = (e + rng.random_range(1..ids.len())) % ids.len();
            let q = rng.random_range(0.0..=1.0);
            rate(&mut book, &ids[e], &ids[s], CODE, q, NOW - rng.random_range(0..500) * DAY);
        }
        for id in &ids {
            for tt in [None, Some(CODE), Some(ANALYSIS)] {
                let t = book.trust(id.did(), tt, NOW).score;
                let tr = book.transitive(id.did(), tt, NOW);
                assert!((0.0..=1.0).contains(&t) && (0.0..=1.0).contains(&tr) && tr >= t);
            }
        }
    }

    #[test]
    fn an_agent_offers_its_record_from_others_not_the_prior() {
        // The owner's own book never establishes its evaluators, so
        // `trust(owner)` stays the prior; `own_record` is what its log shows.
        let (me, a, b) = (Identity::generate(), Identity::generate(), Identity::generate());
        let mut book = TrustBook::new(TrustParams::default(), me.did());
        rate(&mut book, &a, &me, CODE, 0.9, NOW);
        rate(&mut book, &b, &me, CODE, 0.7, NOW);
        assert_eq!(book.own_record(Some(CODE), NOW).score, 0.5, "two proofs: below min_interactions");
        rate(&mut book, &a, &me, CODE, 0.8, NOW);
        rate(&mut book, &a, &me, ANALYSIS, 0.0, NOW);
        let t = book.own_record(Some(CODE), NOW);
        assert!(close(t.score, 0.8) && t.samples == 3, "{t:?}");
        assert_eq!(book.trust(me.did(), Some(CODE), NOW).score, 0.5, "the requester-side view is unchanged");
        // A proof its subject did not countersign is not part of the record.
        let mut unsigned = proof(&a, &me, CODE, 0.0, NOW);
        unsigned.responder_signature.clear();
        book.add_checked(&unsigned).unwrap();
        assert_eq!(book.own_record(Some(CODE), NOW).samples, 3);
    }

    #[test]
    fn an_offers_evidence_counts_only_from_evaluators_established_here() {
        let (me, b, sybil, a) =
            (Identity::generate(), Identity::generate(), Identity::generate(), Identity::generate());
        let mut book = TrustBook::new(TrustParams::default(), me.did());
        // b is established here: three of my own ratings of it, 0.8 on average
        for q in [0.8, 0.7, 0.9] {
            rate(&mut book, &me, &b, CODE, q, NOW);
        }
        let by = |e: &Identity, n: usize, q: f64| (0..n).map(|_| proof(e, &a, CODE, q, NOW)).collect::<Vec<_>>();
        // a, whom I never rated: the prior plus α · T(b) · T_att(b→a) =
        // 0.5 + 0.5 · 0.8 · 0.9 = 0.86, capped at T(b) = 0.8
        let t = book.with_evidence(a.did(), Some(CODE), NOW, &by(&b, 3, 0.9));
        assert!(close(t, 0.8), "{t}");
        // b, rated here for code generation only, vouches for nothing in analysis
        let analysis: Vec<_> = (0..3).map(|_| proof(&b, &a, ANALYSIS, 0.9, NOW)).collect();
        assert_eq!(book.with_evidence(a.did(), Some(ANALYSIS), NOW, &analysis), 0.5);
        // too few of b's proofs, another task type's, a stranger's, a's own, mine
        assert_eq!(book.with_evidence(a.did(), Some(CODE), NOW, &by(&b, 2, 0.9)), 0.5);
        assert_eq!(book.with_evidence(a.did(), Some(ANALYSIS), NOW, &by(&b, 3, 0.9)), 0.5);
        assert_eq!(book.with_evidence(a.did(), Some(CODE), NOW, &by(&sybil, 50, 1.0)), 0.5);
        let own: Vec<_> = (0..3).map(|_| proof(&a, &b, CODE, 1.0, NOW)).collect();
        assert_eq!(book.with_evidence(a.did(), Some(CODE), NOW, &own), 0.5, "proofs about another subject");
        assert_eq!(book.with_evidence(a.did(), Some(CODE), NOW, &by(&me, 3, 1.0)), 0.5, "the owner's: not a referral");
        // one proof shown three times is one proof
        let one = proof(&b, &a, CODE, 0.9, NOW);
        assert_eq!(book.with_evidence(a.did(), Some(CODE), NOW, &[one.clone(), one.clone(), one]), 0.5);
        // my own bad observations weigh: three quality-0 ratings leave only the referral
        for _ in 0..3 {
            rate(&mut book, &me, &a, CODE, 0.0, NOW);
        }
        let t = book.with_evidence(a.did(), Some(CODE), NOW, &by(&b, 3, 0.9));
        assert!(close(t, 0.5 * 0.8 * 0.9), "{t}");
        assert!(t < 0.5, "below the prior: a min_trust of 0.5 prunes it");
    }
}
