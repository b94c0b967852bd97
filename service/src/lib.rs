//! # scd-service
//!
//! The `scd` binary's library: CLI subcommands ([`cli`]), configuration
//! ([`config`]), the gRPC server and its client types ([`grpc`]), and the
//! process's tracing subscriber ([`telemetry`]), and TLS ([`tls`]).
#![warn(missing_docs)]

pub mod a2a;
pub mod cli;
pub mod config;
#[doc(hidden)]
pub mod fuzz;
pub mod grpc;
pub mod telemetry;
pub mod tls;
