//! # scd-service
//!
//! The `scd` binary's library:
//!
//! | module | what it holds |
//! |---|---|
//! | [`app`] | the application core every surface calls: limits, shares, batcher, metrics, audit, cancellation, one [`app::AppError`] |
//! | [`grpc`] | the `scd.v1` service over the core: pb conversion, the Audit stream, reflection |
//! | [`http`], [`auth`] | the shared HTTP listener (caps, probe reserve, time limits) and DID-WBA auth of every listener |
//! | [`server`] | the composition of gRPC, the HTTP listener and A2A, with health, reflection, TLS and drain |
//! | [`a2a`] | SCD as an A2A v1.0 agent on the HTTP listener |
//! | [`mcp`] | the MCP tool server |
//! | [`rest`] | REST on the HTTP listener: compress, sessions, OpenAI's embeddings, the OpenAPI document |
//! | [`client`] | the retrying, signing gRPC client |
//! | [`input`] | strict parsing of the CLI's line inputs |
//! | [`cli`] | one module per subcommand: flags and printing |
//! | [`config`], [`tls`], [`telemetry`] | model flags, TLS files, the one tracing subscriber |
#![warn(missing_docs)]

pub mod a2a;
pub mod app;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
#[doc(hidden)]
pub mod fuzz;
pub mod grpc;
pub mod http;
pub mod input;
pub mod mcp;
pub mod redis;
pub mod rest;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod view;
