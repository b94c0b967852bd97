//! Approximate nearest-neighbour search over chunk embeddings with HNSW
//! (`hnsw_rs`), using the same SIMD dot product as exact scoring.
//! Candidates it returns are re-scored exactly by the caller.
//!
//! ```
//! use scd_engine::index::{HnswIndex, HnswParams};
//! let v: Vec<Vec<f32>> = (0..50).map(|i| { let a = i as f32 / 10.0; vec![a.cos(), a.sin()] }).collect();
//! let idx = HnswIndex::build(&v.iter().map(Vec::as_slice).collect::<Vec<_>>(), HnswParams::default());
//! let hits = idx.search(&[1.0, 0.0], 3);
//! assert_eq!(hits[0], 0);
//! ```

use hnsw_rs::anndists::dist::Distance;
use hnsw_rs::hnsw::Hnsw;

use crate::score::dot;

/// 1 − dot product: the cosine distance of unit vectors.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimdDot;

impl Distance<f32> for SimdDot {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).max(0.0)
    }
}

/// HNSW parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HnswParams {
    /// Links per node (M).
    pub max_connections: usize,
    /// Candidate list size while building.
    pub ef_construction: usize,
    /// Candidate list size while searching (at least k).
    pub ef_search: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        Self { max_connections: 24, ef_construction: 200, ef_search: 128 }
    }
}

/// An HNSW index over a fixed set of unit vectors, ids are their positions.
pub struct HnswIndex {
    hnsw: Hnsw<'static, f32, SimdDot>,
    len: usize,
    ef_search: usize,
}

impl std::fmt::Debug for HnswIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HnswIndex").field("len", &self.len).finish()
    }
}

impl HnswIndex {
    /// Builds the index (insertion runs on the rayon pool).
    pub fn build(vectors: &[&[f32]], params: HnswParams) -> Self {
        let n = vectors.len().max(1);
        let layers = 16usize.min(((n as f32).ln().ceil() as usize).max(1));
        let hnsw = Hnsw::new(params.max_connections, n, layers, params.ef_construction, SimdDot);
        let data: Vec<(&[f32], usize)> = vectors.iter().enumerate().map(|(i, v)| (*v, i)).collect();
        hnsw.parallel_insert_slice(&data);
        Self { hnsw, len: vectors.len(), ef_search: params.ef_search }
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ids of (approximately) the `k` nearest vectors, nearest first.
    pub fn search(&self, query: &[f32], k: usize) -> Vec<usize> {
        if self.len == 0 || k == 0 {
            return Vec::new();
        }
        let k = k.min(self.len);
        self.hnsw.search(query, k, self.ef_search.max(k)).into_iter().map(|n| n.d_id).collect()
    }
}

/// Exact top-`k` ids by dot product (the reference HNSW is measured against).
pub fn brute_force(vectors: &[&[f32]], query: &[f32], k: usize) -> Vec<usize> {
    let mut s: Vec<(f32, usize)> = vectors.iter().enumerate().map(|(i, v)| (dot(query, v), i)).collect();
    let k = k.min(s.len());
    if k == 0 {
        return Vec::new();
    }
    s.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
    s.truncate(k);
    s.sort_by(|a, b| b.0.total_cmp(&a.0));
    s.into_iter().map(|(_, i)| i).collect()
}

/// recall@k of `approx` against `exact`.
pub fn recall_at_k(approx: &[usize], exact: &[usize]) -> f32 {
    if exact.is_empty() {
        return 1.0;
    }
    let set: std::collections::HashSet<_> = exact.iter().collect();
    approx.iter().filter(|i| set.contains(i)).count() as f32 / exact.len() as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn hnsw_agrees_with_brute_force_on_random_unit_vectors() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let vecs: Vec<Vec<f32>> = (0..2000)
            .map(|_| {
                let mut v: Vec<f32> = (0..32).map(|_| rng.random_range(-1.0..1.0)).collect();
                crate::encoder::l2_normalize(&mut v);
                v
            })
            .collect();
        let refs: Vec<&[f32]> = vecs.iter().map(Vec::as_slice).collect();
        let idx = HnswIndex::build(&refs, HnswParams::default());
        let mut total = 0.0;
        for q in vecs.iter().take(50) {
            total += recall_at_k(&idx.search(q, 10), &brute_force(&refs, q, 10));
        }
        assert!(total / 50.0 >= 0.95, "recall@10 {}", total / 50.0);
    }
}
