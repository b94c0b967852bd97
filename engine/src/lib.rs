//! # scd-engine
//!
//! Semantic Context Differentials (ATP paper §6): given a task and an agent's
//! context, return the minimal sufficient context that fits the receiver's
//! token budget, and the next chunks when the receiver asks for more.
//!
//! This crate is a plain library: no network, no async runtime. The service
//! crate (`scd-service`) wraps it in gRPC and a CLI.
//!
//! * [`encoder`] — the [`Encoder`](encoder::Encoder) trait, the ONNX Runtime
//!   encoder and a deterministic hash encoder for tests.
//! * [`context`] — fields, tasks and the receiver's [`ContextRequirement`](context::ContextRequirement).
//! * [`chunk`] — structure-aware chunking by field kind.
//! * [`score`] — SIMD cosine, BM25, calibration.
//! * [`cache`] — the content-addressed embedding cache.
//! * [`cancel`] — cooperative cancellation and deadlines between stages.
//! * [`eval`] — dataset loaders and evidence coverage for `scd-dev eval`.
//! * [`extract`] — [`Scd`](extract::Scd): compression and adaptive requests.
//! * [`rerank`] — the second stage: a cross-encoder rescoring the best chunks.
//! * [`session`] — bounded, unguessable sessions bound to their creators.
//! * [`shared`] — sessions kept in a store shared by replicas (the service's Redis).
//! * [`handoff`] — hand-off report formats: parse, render, report → fields.
//!
//! ```
//! use scd_engine::encoder::{Encoder, EncodeOptions, HashEncoder, InputKind};
//! let enc = HashEncoder::new(128, 512);
//! let task = enc.encode(&["why did the payment service time out"], &EncodeOptions::new(InputKind::Query)).unwrap();
//! assert_eq!(task.row(0).len(), 128);
//! ```
#![warn(missing_docs)]

pub mod budget;
pub mod cache;
pub mod cancel;
pub mod chunk;
pub mod context;
pub mod encoder;
mod error;
pub mod eval;
pub mod extract;
#[doc(hidden)]
pub mod fuzz;
pub mod handoff;
pub mod index;
pub mod rerank;
pub mod score;
pub mod session;
pub mod shared;

pub use error::{Error, Param, Result};
