//! Layer 1b: an append-only RFC 6962 Merkle log of interaction proofs.
//!
//! Leaf hash = SHA-256(0x00 ‖ leaf bytes), node hash = SHA-256(0x01 ‖ left ‖
//! right), the tree of n leaves splits at the largest power of two below n
//! (RFC 6962 §2.1). A leaf's bytes are the [`pb::InteractionProof`]'s
//! deterministic encoding *with both signatures set*, so the log commits to
//! the signatures too.
//!
//! A third party needs only the root: [`verify_inclusion`] recomputes it from
//! a leaf hash and its audit path (RFC 9162 §2.1.3.2). An inclusion proof
//! names the tree size it was made for, so it verifies against the root *of
//! that size*: after more appends the old proof still verifies against the
//! old root and not against the new one (ask for a fresh proof, or a
//! consistency proof, which this module does not implement).
//!
//! Appends, roots and proofs are O(log n): the log keeps the hash of every
//! complete aligned subtree.
//!
//! ```
//! use scd_atp::merkle::{leaf_hash, verify_inclusion, MerkleLog};
//!
//! let mut log = MerkleLog::new();
//! for i in 0..5u8 {
//!     log.append(&[i]);
//! }
//! let root = log.root();
//! let proof = log.inclusion_proof(3).unwrap();
//! assert_eq!(proof.leaf_hash, leaf_hash(&[3]));
//! assert!(verify_inclusion(&proof, &root));
//! ```

use prost::Message;
use sha2::{Digest, Sha256};

use crate::pb;

/// A SHA-256 hash.
pub type Hash = [u8; 32];

/// RFC 6962 leaf hash: SHA-256(0x00 ‖ bytes).
pub fn leaf_hash(bytes: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(bytes);
    h.finalize().into()
}

/// RFC 6962 interior node hash: SHA-256(0x01 ‖ left ‖ right).
pub fn node_hash(left: &[u8], right: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree: SHA-256 of nothing.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// The leaf bytes of an interaction proof: its encoding with both signatures.
pub fn proof_leaf_bytes(proof: &pb::InteractionProof) -> Vec<u8> {
    proof.encode_to_vec()
}

/// An append-only Merkle log (leaf hashes only; the caller keeps the data).
#[derive(Debug, Clone, Default)]
pub struct MerkleLog {
    /// `levels[k][i]` = hash of the complete subtree of 2^k leaves starting at leaf i·2^k.
    levels: Vec<Vec<Hash>>,
}

impl MerkleLog {
    /// An empty log.
    pub fn new() -> MerkleLog {
        MerkleLog { levels: vec![Vec::new()] }
    }

    /// Appends a leaf (its bytes, hashed here); returns its index.
    pub fn append(&mut self, leaf_bytes: &[u8]) -> u64 {
        self.append_hash(leaf_hash(leaf_bytes))
    }

    /// Appends an already hashed leaf; returns its index.
    pub fn append_hash(&mut self, leaf: Hash) -> u64 {
        if self.levels.is_empty() {
            self.levels.push(Vec::new());
        }
        let index = self.levels[0].len();
        self.levels[0].push(leaf);
        // Complete every subtree this leaf closes.
        let mut level = 0;
        let mut i = index;
        while i % 2 == 1 {
            let parent = node_hash(&self.levels[level][i - 1], &self.levels[level][i]);
            if self.levels.len() == level + 1 {
                self.levels.push(Vec::new());
            }
            self.levels[level + 1].push(parent);
            level += 1;
            i /= 2;
        }
        index as u64
    }

    /// How many leaves.
    pub fn len(&self) -> u64 {
        self.levels.first().map_or(0, |l| l.len() as u64)
    }

    /// Whether the log has no leaf.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The leaf hash at `index`.
    pub fn leaf(&self, index: u64) -> Option<Hash> {
        self.levels.first()?.get(usize::try_from(index).ok()?).copied()
    }

    /// The root of the whole log (RFC 6962 MTH; SHA-256("") when empty).
    pub fn root(&self) -> Hash {
        self.root_at(self.len()).expect("the current size exists")
    }

    /// The root the log had when it held `size` leaves.
    pub fn root_at(&self, size: u64) -> Option<Hash> {
        if size > self.len() {
            return None;
        }
        if size == 0 {
            return Some(empty_root());
        }
        Some(self.subtree(0, size as usize))
    }

    /// MTH of leaves [start, end), end > start.
    fn subtree(&self, start: usize, end: usize) -> Hash {
        let n = end - start;
        if n.is_power_of_two() && start.is_multiple_of(n) {
            return self.levels[n.trailing_zeros() as usize][start / n];
        }
        let k = split(n);
        node_hash(&self.subtree(start, start + k), &self.subtree(start + k, end))
    }

    /// The inclusion proof of leaf `index` in the tree of the current size.
    pub fn inclusion_proof(&self, index: u64) -> Option<pb::InclusionProof> {
        self.inclusion_proof_at(index, self.len())
    }

    /// The inclusion proof of leaf `index` in the tree of `size` leaves.
    pub fn inclusion_proof_at(&self, index: u64, size: u64) -> Option<pb::InclusionProof> {
        if index >= size || size > self.len() {
            return None;
        }
        let mut path = Vec::new();
        self.path(index as usize, 0, size as usize, &mut path);
        Some(pb::InclusionProof {
            leaf_index: index,
            tree_size: size,
            leaf_hash: self.leaf(index)?.to_vec(),
            path: path.into_iter().map(|h| h.to_vec()).collect(),
        })
    }

    /// RFC 6962 PATH(m, D[start:end]), leaf-to-root order.
    fn path(&self, m: usize, start: usize, end: usize, out: &mut Vec<Hash>) {
        let n = end - start;
        if n <= 1 {
            return;
        }
        let k = split(n);
        if m < k {
            self.path(m, start, start + k, out);
            out.push(self.subtree(start + k, end));
        } else {
            self.path(m - k, start + k, end, out);
            out.push(self.subtree(start, start + k));
        }
    }
}

/// The largest power of two strictly below n (n ≥ 2).
fn split(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// Whether `proof` shows its leaf at its index in the tree of its size whose
/// root is `root` (RFC 9162 §2.1.3.2). Needs nothing but the root.
pub fn verify_inclusion(proof: &pb::InclusionProof, root: &[u8]) -> bool {
    if proof.leaf_index >= proof.tree_size || proof.leaf_hash.len() != 32 || root.len() != 32 {
        return false;
    }
    let (mut f, mut s) = (proof.leaf_index, proof.tree_size - 1);
    let mut r: Hash = proof.leaf_hash.as_slice().try_into().expect("length checked");
    for p in &proof.path {
        if p.len() != 32 || s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    s == 0 && r.as_slice() == root
}

/// Whether `proof` (an interaction proof) is the leaf `inclusion` proves
/// under `root`: its leaf hash matches and the path verifies.
pub fn verify_proof_included(proof: &pb::InteractionProof, inclusion: &pb::InclusionProof, root: &[u8]) -> bool {
    inclusion.leaf_hash.as_slice() == leaf_hash(&proof_leaf_bytes(proof)) && verify_inclusion(inclusion, root)
}

/// Whether every proof of a [`pb::TrustEvidence`] is included, at the
/// evidence's log size, under its Merkle root. (Signatures are checked by
/// [`crate::identity::check_proof`], not here.)
pub fn verify_evidence(evidence: &pb::TrustEvidence) -> bool {
    // checked first: each proof costs two signature checks and a path
    evidence.proofs.len() <= MAX_EVIDENCE_PROOFS
        && evidence.proofs.len() == evidence.inclusion.len()
        && evidence.proofs.iter().zip(&evidence.inclusion).all(|(proof, inclusion)| {
            inclusion.tree_size == evidence.log_size && verify_proof_included(proof, inclusion, &evidence.merkle_root)
        })
}

/// The most proofs an offer's evidence may show (agents show 8): more is
/// refused unread, since each costs its verifier two signature checks.
pub const MAX_EVIDENCE_PROOFS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6962 MTH computed directly from the definition.
    fn reference_root(leaves: &[Vec<u8>]) -> Hash {
        match leaves.len() {
            0 => empty_root(),
            1 => leaf_hash(&leaves[0]),
            n => {
                let k = split(n);
                node_hash(&reference_root(&leaves[..k]), &reference_root(&leaves[k..]))
            }
        }
    }

    fn leaves(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("leaf {i}").into_bytes()).collect()
    }

    #[test]
    fn root_matches_the_rfc_6962_definition() {
        let data = leaves(40);
        let mut log = MerkleLog::new();
        assert_eq!(log.root(), empty_root());
        for (i, leaf) in data.iter().enumerate() {
            assert_eq!(log.append(leaf), i as u64);
            assert_eq!(log.root(), reference_root(&data[..=i]), "size {}", i + 1);
        }
        for size in 0..=40u64 {
            assert_eq!(log.root_at(size).unwrap(), reference_root(&data[..size as usize]));
        }
        assert_eq!(log.root_at(41), None);
    }

    #[test]
    fn known_answer_for_the_empty_and_single_leaf_trees() {
        // RFC 6962 test vectors (certificate-transparency-go merkle tests).
        let hex = |h: Hash| h.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(empty_root()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(leaf_hash(b"")), "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d");
    }

    #[test]
    fn every_inclusion_proof_verifies_against_the_root_alone_for_sizes_1_to_40() {
        for n in 1..=40usize {
            let data = leaves(n);
            let mut log = MerkleLog::new();
            data.iter().for_each(|l| {
                log.append(l);
            });
            let root = log.root();
            let other_root = reference_root(&leaves(n + 1));
            for i in 0..n as u64 {
                let proof = log.inclusion_proof(i).unwrap();
                assert!(verify_inclusion(&proof, &root), "n={n} i={i}");
                // A changed leaf.
                let mut changed = proof.clone();
                changed.leaf_hash = leaf_hash(b"changed").to_vec();
                assert!(!verify_inclusion(&changed, &root), "changed leaf n={n} i={i}");
                // A wrong index (any other in range, and out of range).
                for j in (0..n as u64).filter(|&j| j != i) {
                    let mut wrong = proof.clone();
                    wrong.leaf_index = j;
                    assert!(!verify_inclusion(&wrong, &root), "wrong index {j} n={n} i={i}");
                }
                let mut out = proof.clone();
                out.leaf_index = n as u64;
                assert!(!verify_inclusion(&out, &root));
                // A different root.
                assert!(!verify_inclusion(&proof, &other_root), "other root n={n} i={i}");
                // A tampered path element, a dropped or an extra one.
                if !proof.path.is_empty() {
                    let mut tampered = proof.clone();
                    tampered.path[0][0] ^= 1;
                    assert!(!verify_inclusion(&tampered, &root));
                    let mut short = proof.clone();
                    short.path.pop();
                    assert!(!verify_inclusion(&short, &root));
                }
                let mut long = proof.clone();
                long.path.push(root.to_vec());
                assert!(!verify_inclusion(&long, &root));
            }
            assert!(log.inclusion_proof(n as u64).is_none());
        }
    }

    #[test]
    fn an_old_proof_verifies_only_against_the_old_root() {
        let mut log = MerkleLog::new();
        for l in leaves(13) {
            log.append(&l);
        }
        let old_root = log.root();
        let old: Vec<_> = (0..13).map(|i| log.inclusion_proof(i).unwrap()).collect();
        for l in leaves(30).into_iter().skip(13) {
            log.append(&l);
        }
        let new_root = log.root();
        for (i, proof) in old.iter().enumerate() {
            assert!(verify_inclusion(proof, &old_root), "{i}");
            assert!(!verify_inclusion(proof, &new_root), "{i}");
            // The log can still produce the old proof, and a fresh one for the new root.
            assert_eq!(&log.inclusion_proof_at(i as u64, 13).unwrap(), proof);
            assert!(verify_inclusion(&log.inclusion_proof(i as u64).unwrap(), &new_root));
        }
    }

    #[test]
    fn evidence_verifies_only_with_the_included_proofs() {
        let mut log = MerkleLog::new();
        let proofs: Vec<pb::InteractionProof> = (0..6)
            .map(|i| pb::InteractionProof {
                task_id: format!("t{i}"),
                quality_score: 0.5 + i as f64 / 20.0,
                signature: vec![i as u8; 64],
                responder_signature: vec![9; 64],
                ..Default::default()
            })
            .collect();
        for p in &proofs {
            log.append(&proof_leaf_bytes(p));
        }
        let evidence = pb::TrustEvidence {
            merkle_root: log.root().to_vec(),
            log_size: log.len(),
            proofs: vec![proofs[1].clone(), proofs[4].clone()],
            inclusion: vec![log.inclusion_proof(1).unwrap(), log.inclusion_proof(4).unwrap()],
        };
        assert!(verify_evidence(&evidence));
        let mut inflated = evidence.clone();
        inflated.proofs[0].quality_score = 1.0;
        assert!(!verify_evidence(&inflated));
        let mut unsigned = evidence.clone();
        unsigned.proofs[1].responder_signature.clear();
        assert!(!verify_evidence(&unsigned), "the leaf commits to the signatures");
        let mut unmatched = evidence.clone();
        unmatched.inclusion.pop();
        assert!(!verify_evidence(&unmatched));
        // every proof valid, but more than an offer may show: refused unread
        let mut log = MerkleLog::new();
        let many: Vec<pb::InteractionProof> = (0..MAX_EVIDENCE_PROOFS + 1)
            .map(|i| pb::InteractionProof { task_id: format!("m{i}"), ..Default::default() })
            .collect();
        for p in &many {
            log.append(&proof_leaf_bytes(p));
        }
        let inclusion: Vec<pb::InclusionProof> =
            (0..many.len()).map(|i| log.inclusion_proof(i as u64).unwrap()).collect();
        let mut flood =
            pb::TrustEvidence { merkle_root: log.root().to_vec(), log_size: log.len(), proofs: many, inclusion };
        assert!(!verify_evidence(&flood));
        flood.proofs.pop();
        flood.inclusion.pop();
        assert!(verify_evidence(&flood), "at the cap it verifies");
    }
}
