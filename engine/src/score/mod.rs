//! Scoring: SIMD dot products (with a scalar reference beside them), BM25,
//! and z-score calibration so dense and lexical scores can be fused.
//!
//! ```
//! use scd_engine::score::{dot, dot_scalar};
//! let a = [0.6f32, 0.8, 0.0];
//! let b = [0.8f32, 0.6, 0.0];
//! assert!((dot(&a, &b) - dot_scalar(&a, &b)).abs() < 1e-6);
//! ```

mod bm25;
pub mod dedup;

pub use bm25::{terms, Bm25};

use simsimd::SpatialSimilarity;

/// Dot product (the cosine of two unit vectors), SIMD-dispatched by simsimd.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    match f32::dot(a, b) {
        Some(d) => d as f32,
        None => dot_scalar(a, b),
    }
}

/// Scalar reference for [`dot`], kept for property tests.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Scores standardized within their own distribution (mean 0, sd 1);
/// all zeros when the scores are (nearly) constant.
pub fn zscores(xs: &[f32]) -> Vec<f32> {
    if xs.is_empty() {
        return Vec::new();
    }
    let n = xs.len() as f32;
    let mean = xs.iter().sum::<f32>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n;
    let sd = var.sqrt();
    if sd < 1e-6 {
        return vec![0.0; xs.len()];
    }
    xs.iter().map(|x| (x - mean) / sd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn simd_dot_matches_scalar_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for len in [1usize, 3, 16, 31, 384, 1024, 1025] {
            let a: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            let (fast, slow) = (dot(&a, &b), dot_scalar(&a, &b));
            assert!((fast - slow).abs() <= 1e-4 * (1.0 + slow.abs()), "len {len}: {fast} vs {slow}");
        }
    }

    #[test]
    fn zscores_center_and_scale() {
        let z = zscores(&[1.0, 2.0, 3.0]);
        assert!((z.iter().sum::<f32>()).abs() < 1e-6);
        assert!(z[2] > 1.2 && z[0] < -1.2);
        assert_eq!(zscores(&[0.5, 0.5]), vec![0.0, 0.0]);
    }
}
