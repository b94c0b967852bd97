//! # scd-dev
//!
//! SCD's developer tools, kept out of the product binary `scd`: the
//! `scd-dev` binary's library. They measure and tune what `scd` ships;
//! users never run them (docs/evaluation.md and docs/testing.md say how
//! to reach them).
//!
//! | module | `scd-dev` command |
//! |---|---|
//! | [`eval`] (with `eval_adaptive`, `eval_agent`) | `eval`: evidence recall vs reduction against baselines |
//! | [`tune`] | `tune`: scoring settings by cross-validation |
//! | [`plot`] | the SVG line plots of `eval --plot` |
//!
//! This crate depends on `scd-service`'s library (model flags, telemetry,
//! the shared CLI pieces such as `scd_service::cli::compress::budget_tokenizer`);
//! `scd-service` never depends on it.
//!
//! ```
//! // the nearest-rank percentile the reports print
//! let mut ms = vec![3.0, 1.0, 2.0, 10.0];
//! assert_eq!(scd_dev::percentile(&mut ms, 0.5), 3.0);
//! ```
#![warn(missing_docs)]

pub mod eval;
mod eval_adaptive;
mod eval_agent;
pub mod plot;
pub mod tune;

/// The `p` quantile (0..=1) of `xs` by nearest rank; sorts `xs`; 0 when empty.
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}
