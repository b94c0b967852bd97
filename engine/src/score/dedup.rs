//! Near-duplicate pairs among a context's chunk embeddings (cosine at least
//! a threshold), found once per context in near-linear time.
//!
//! Up to [`BRUTE_FORCE_MAX`] chunks every pair is compared. Above it,
//! random-hyperplane LSH (SimHash) over the *centred* embeddings (E5's
//! vectors sit in a narrow cone; hyperplanes through the origin would put
//! them all in one bucket) proposes candidates: [`TABLES`] tables of
//! [`BITS`] bits, each bucket compared in full when small and by a sliding
//! window of [`WINDOW`] along a random projection when large, so the work is
//! O(n · TABLES · (BITS + WINDOW) · dim) whatever the data. Every candidate
//! is confirmed by the exact dot product, so a reported pair is always a
//! true near-duplicate; a true pair is missed with small probability
//! (measured against brute force in the tests).

use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::dot;

/// At or below this many vectors, every pair is compared.
pub const BRUTE_FORCE_MAX: usize = 2048;
/// LSH tables.
pub const TABLES: usize = 8;
/// Hyperplanes per table.
pub const BITS: usize = 12;
/// Neighbours compared per vector inside an oversized bucket.
pub const WINDOW: usize = 32;

/// For each vector, the others whose dot product with it is at least
/// `threshold` (vectors are unit length). Deterministic for given input.
pub fn near_duplicates(vectors: &[&[f32]], threshold: f32) -> Vec<Vec<u32>> {
    use rayon::prelude::*;
    let n = vectors.len();
    if n <= BRUTE_FORCE_MAX {
        return (0..n)
            .into_par_iter()
            .map(|i| (0..n).filter(|&j| j != i && dot(vectors[i], vectors[j]) >= threshold).map(|j| j as u32).collect())
            .collect();
    }
    let dim = vectors[0].len();
    let mut mean = vec![0f32; dim];
    for v in vectors {
        mean.iter_mut().zip(v.iter()).for_each(|(m, x)| *m += x);
    }
    mean.iter_mut().for_each(|m| *m /= n as f32);
    let centred: Vec<Vec<f32>> = vectors.iter().map(|v| v.iter().zip(&mean).map(|(x, m)| x - m).collect()).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5cd_d0d0);
    let mut gauss = |k: usize| -> Vec<Vec<f32>> {
        (0..k).map(|_| (0..dim).map(|_| -> f32 { rng.sample(StandardNormal) }).collect()).collect()
    };
    let planes: Vec<Vec<Vec<f32>>> = (0..TABLES).map(|_| gauss(BITS)).collect();
    let orders: Vec<Vec<f32>> = gauss(TABLES);
    let pairs: Vec<(u32, u32)> = (0..TABLES)
        .into_par_iter()
        .flat_map_iter(|t| {
            let mut keyed: Vec<(u16, f32, u32)> = centred
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let sig =
                        planes[t].iter().enumerate().fold(0u16, |s, (b, p)| s | (u16::from(dot(v, p) > 0.0) << b));
                    (sig, dot(v, &orders[t]), i as u32)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            let mut out = Vec::new();
            let mut start = 0;
            while start < keyed.len() {
                let mut end = start;
                while end < keyed.len() && keyed[end].0 == keyed[start].0 {
                    end += 1;
                }
                let bucket = &keyed[start..end];
                for a in 0..bucket.len() {
                    for b in bucket.iter().skip(a + 1).take(WINDOW) {
                        let (i, j) = (bucket[a].2, b.2);
                        if dot(vectors[i as usize], vectors[j as usize]) >= threshold {
                            out.push((i.min(j), i.max(j)));
                        }
                    }
                }
                start = end;
            }
            out
        })
        .collect();
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, j) in pairs {
        lists[i as usize].push(j);
        lists[j as usize].push(i);
    }
    for l in &mut lists {
        l.sort_unstable();
        l.dedup();
    }
    lists
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    /// Vectors in a narrow cone (like E5's), with planted near-duplicates.
    fn cone(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let axis: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut out: Vec<Vec<f32>> = Vec::with_capacity(n);
        for i in 0..n {
            let v = if i % 10 == 9 {
                // a near-copy of the previous vector
                out[i - 1].iter().map(|x| x + rng.random_range(-0.004..0.004)).collect()
            } else {
                axis.iter().map(|a| a * 1.5 + rng.random_range(-1.0..1.0)).collect()
            };
            out.push(unit(v));
        }
        out
    }

    #[test]
    fn lsh_finds_what_brute_force_finds_and_nothing_else() {
        let vs = cone(6000, 64, 1);
        let refs: Vec<&[f32]> = vs.iter().map(Vec::as_slice).collect();
        let t = 0.985;
        let fast = near_duplicates(&refs, t);
        let (mut truth, mut found) = (0usize, 0usize);
        for i in 0..refs.len() {
            let exact: Vec<u32> =
                (0..refs.len()).filter(|&j| j != i && dot(refs[i], refs[j]) >= t).map(|j| j as u32).collect();
            assert!(fast[i].iter().all(|j| exact.contains(j)), "only true pairs are reported");
            truth += exact.len();
            found += fast[i].len();
        }
        assert!(truth >= 1000, "the data has planted pairs: {truth}");
        let recall = found as f64 / truth as f64;
        assert!(recall >= 0.98, "recall {recall:.4} of {truth}");
    }

    #[test]
    fn small_inputs_are_exact() {
        let vs = cone(300, 16, 2);
        let refs: Vec<&[f32]> = vs.iter().map(Vec::as_slice).collect();
        let got = near_duplicates(&refs, 0.985);
        for (i, l) in got.iter().enumerate() {
            let exact: Vec<u32> =
                (0..refs.len()).filter(|&j| j != i && dot(refs[i], refs[j]) >= 0.985).map(|j| j as u32).collect();
            assert_eq!(l, &exact);
        }
    }
}
