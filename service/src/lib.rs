//! # scd-service
//!
//! The `scd` binary's library: CLI subcommands ([`cli`]), configuration
//! ([`config`]), the gRPC server and its client types ([`grpc`]), and the
//! process's tracing subscriber ([`telemetry`]), TLS ([`tls`]), and the MCP
//! tool server ([`mcp`]).
#![warn(missing_docs)]

pub mod a2a;
pub mod cli;
pub mod client;
pub mod config;
#[doc(hidden)]
pub mod fuzz;
pub mod grpc;
pub mod input;
pub mod mcp;
pub mod server;
pub mod telemetry;
pub mod tls;
